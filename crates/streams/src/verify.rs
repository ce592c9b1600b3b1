//! Offline check of the regular streams' entry files against the log (`lanemq log verify`).
//!
//! Owns nothing at run time. It reads the registry and the checkpoints from the sled index
//! (tree `s_streams`; opening sled needs the broker stopped), the entry files of every
//! regular stream and the log, and changes nothing of the streams' own files.
//!
//! What it checks, per regular stream, for the entries below the checkpointed end:
//! - entries come in strictly increasing log offset and never-decreasing time, none before
//!   the stream's creation offset;
//! - every entry whose record the log still holds names a record the stream's filter
//!   matches, with the entry's time and size (topic + payload bytes);
//! - no record is missing: every record the filter matches, from the first live entry's
//!   offset (or the creation offset) up to the checkpointed watermark, has an entry.
//!
//! What it reports without calling it a problem: entries past the checkpointed end (cut and
//! indexed again at the next start), entries whose records retention removed, matching
//! records after the watermark (indexed at the next start).

use crate::engine::RegistryEntry;
use crate::entries::{RawEntry, ENTRY_BYTES, SEG_ENTRIES};
use crate::filter_index::FilterIndex;
use lanemq_store::{StoreError, Walked};
use std::collections::BTreeMap;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// The result of [`verify`].
#[derive(Debug, Default)]
pub struct Report {
    /// Regular streams checked (last-value streams keep their entries in sled).
    pub streams: u64,
    /// Entries below the checkpointed ends.
    pub entries: u64,
    /// Entries matched with their records.
    pub matched: u64,
    /// Entries whose records the log no longer holds.
    pub of_deleted_records: u64,
    /// Entries past the checkpointed end (cut and indexed again at the next start).
    pub past_end: u64,
    /// Matching records after the watermark (indexed at the next start).
    pub not_indexed_yet: u64,
    pub problems: Vec<String>,
}

impl Report {
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }

    fn problem(&mut self, p: String) {
        if self.problems.len() < PROBLEMS_MAX {
            self.problems.push(p);
        } else if self.problems.len() == PROBLEMS_MAX {
            self.problems.push("… more problems not listed".into());
        }
    }
}

const PROBLEMS_MAX: usize = 20;

/// Why the check could not run.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("stream index files: {0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("sled index (is the broker still running?): {0}")]
    Sled(#[from] sled::Error),
    #[error("stream registry: {0}")]
    Registry(String),
}

/// The entries `[from, end)` of one stream's files, in index order.
struct EntryReader {
    files: Vec<(u64, PathBuf)>,
    next_file: usize,
    reader: Option<(u64, io::BufReader<std::fs::File>)>,
    pos: u64,
    end: u64,
}

impl EntryReader {
    fn open(dir: &Path, from: u64, end: u64) -> io::Result<EntryReader> {
        let mut files = Vec::new();
        if dir.exists() {
            for de in std::fs::read_dir(dir)? {
                let de = de?;
                let name = de.file_name();
                let Some(first) = name
                    .to_str()
                    .and_then(|n| n.strip_suffix(".sxe"))
                    .and_then(|n| n.parse::<u64>().ok())
                else {
                    continue;
                };
                files.push((first, de.path()));
            }
        }
        files.sort();
        let first_present = files.first().map_or(end, |f| f.0);
        Ok(EntryReader {
            files,
            next_file: 0,
            reader: None,
            pos: from.max(first_present),
            end,
        })
    }

    /// Entries in the files at or past `end` (what a restart cuts).
    fn past_end(&self) -> io::Result<u64> {
        let mut n = 0;
        for (first, path) in &self.files {
            let len = std::fs::metadata(path)?.len() / ENTRY_BYTES;
            let last = first + len;
            n += last.saturating_sub(self.end.max(*first));
        }
        Ok(n)
    }

    fn next(&mut self) -> io::Result<Option<(u64, RawEntry)>> {
        loop {
            if self.pos >= self.end {
                return Ok(None);
            }
            if let Some((i, r)) = &mut self.reader {
                let mut b = [0u8; ENTRY_BYTES as usize];
                match r.read_exact(&mut b) {
                    Ok(()) => {
                        let at = *i;
                        *i += 1;
                        if at < self.pos {
                            continue;
                        }
                        self.pos = at + 1;
                        return Ok(RawEntry::decode(&b).map(|e| (at, e)));
                    }
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => self.reader = None,
                    Err(e) => return Err(e),
                }
            }
            let Some((first, path)) = self.files.get(self.next_file) else {
                return Ok(None);
            };
            self.next_file += 1;
            if first + SEG_ENTRIES <= self.pos {
                continue;
            }
            let f = std::fs::File::open(path)?;
            self.reader = Some((*first, io::BufReader::with_capacity(1 << 16, f)));
        }
    }
}

/// One regular stream under check.
struct Checked {
    name: String,
    created_offset: u64,
    entries: EntryReader,
    /// The next entry not yet matched with a record.
    pending: Option<(u64, RawEntry)>,
    /// Offset of the first live entry: records before it may be gone by stream retention.
    from: u64,
    last: Option<RawEntry>,
}

impl Checked {
    fn advance(&mut self, report: &mut Report) -> io::Result<()> {
        self.pending = self.entries.next()?;
        if let Some((i, e)) = &self.pending {
            report.entries += 1;
            if e.offset < self.created_offset {
                report.problem(format!(
                    "stream {:?}: entry {i} names offset {} before the stream's creation at {}",
                    self.name, e.offset, self.created_offset
                ));
            }
            if let Some(l) = &self.last {
                if e.offset <= l.offset || e.ts_us < l.ts_us {
                    report.problem(format!(
                        "stream {:?}: entry {i} (offset {}, time {}) is not after the one before \
                         (offset {}, time {})",
                        self.name, e.offset, e.ts_us, l.offset, l.ts_us
                    ));
                }
            }
            self.last = Some(*e);
        }
        Ok(())
    }
}

fn be64(v: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(v.get(at..at + 8)?.try_into().ok()?))
}

/// Check the regular streams of the data directory against its log.
pub fn verify(data_dir: &Path) -> Result<Report, VerifyError> {
    let mut report = Report::default();
    let index_dir = data_dir.join("index");
    if !index_dir.exists() {
        return Ok(report);
    }
    let index = lanemq_store::Index::open(&index_dir)?;
    let tree = index.tree("s_streams")?;
    let watermark = tree.get(b"w")?.and_then(|v| be64(&v, 0)).unwrap_or(0);
    let mut checked: Vec<Checked> = Vec::new();
    let mut filters: FilterIndex<usize> = FilterIndex::new();
    for kv in tree.scan_prefix(b"r") {
        let (_, v) = kv?;
        let reg: RegistryEntry = serde_json::from_slice(&v)
            .map_err(|e| VerifyError::Registry(format!("bad registry entry: {e}")))?;
        let mut dk = [0u8; 9];
        dk[0] = b'd';
        dk[1..].copy_from_slice(&reg.id.to_be_bytes());
        if reg.def.is_lastvalue || tree.get(dk)?.is_some() {
            continue;
        }
        let mut nk = dk;
        nk[0] = b'n';
        let (head, end) = match tree.get(nk)? {
            Some(v) => (be64(&v, 0).unwrap_or(0), be64(&v, 8).unwrap_or(0)),
            None => (0, 0),
        };
        let dir = data_dir.join("streams").join(format!("{:020}", reg.id));
        let entries = EntryReader::open(&dir, head, end)?;
        report.past_end += entries.past_end()?;
        let mut c = Checked {
            name: reg.def.name.clone(),
            created_offset: reg.created_offset,
            entries,
            pending: None,
            from: reg.created_offset,
            last: None,
        };
        c.advance(&mut report)?;
        if let Some((_, e)) = &c.pending {
            c.from = e.offset;
        }
        filters.insert(&reg.def.topic_filter, checked.len());
        checked.push(c);
        report.streams += 1;
    }
    if checked.is_empty() {
        return Ok(report);
    }
    // Entries whose records retention removed come before the log's first record.
    let mut first_log: Option<u64> = None;
    lanemq_store::walk_records(data_dir, 0, &mut |w| {
        if let Walked::Record(r, _) = w {
            first_log = Some(r.offset);
        }
        false
    })?;
    let first_log = first_log.unwrap_or(u64::MAX);
    for c in &mut checked {
        while let Some((_, e)) = c.pending {
            if e.offset >= first_log {
                break;
            }
            report.of_deleted_records += 1;
            c.advance(&mut report)?;
        }
    }
    // Pending entries by the offset they name: offset -> streams.
    let mut due: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (i, c) in checked.iter().enumerate() {
        if let Some((_, e)) = c.pending {
            due.entry(e.offset).or_default().push(i);
        }
    }
    let start = checked
        .iter()
        .map(|c| c.pending.map_or(c.from, |(_, e)| e.offset.min(c.from)))
        .min()
        .unwrap_or(0)
        .max(first_log);
    let mut err: Option<io::Error> = None;
    let mut matching: Vec<usize> = Vec::new();
    let advance =
        |c: &mut Checked, i: usize, due: &mut BTreeMap<u64, Vec<usize>>, report: &mut Report| {
            c.advance(report)?;
            if let Some((_, e)) = c.pending {
                due.entry(e.offset).or_default().push(i);
            }
            Ok::<(), io::Error>(())
        };
    lanemq_store::walk_records(data_dir, start, &mut |w| {
        let Walked::Record(r, _) = w else {
            return true;
        };
        // Entries naming an offset the log went past without a record there.
        while let Some((&off, _)) = due.first_key_value() {
            if off >= r.offset {
                break;
            }
            let Some((_, list)) = due.pop_first() else {
                break;
            };
            for i in list {
                let c = &mut checked[i];
                report.problem(format!(
                    "stream {:?}: an entry names offset {off}, which is not in the log",
                    c.name
                ));
                if let Err(x) = advance(c, i, &mut due, &mut report) {
                    err = Some(x);
                    return false;
                }
            }
        }
        let here = due.remove(&r.offset).unwrap_or_default();
        matching.clear();
        filters.for_each_match(&r.topic, |i| matching.push(*i));
        matching.sort_unstable();
        matching.dedup();
        for &i in &matching {
            let c = &checked[i];
            if here.contains(&i) || r.offset < c.from || r.offset < c.created_offset {
                continue;
            }
            if r.offset >= watermark {
                report.not_indexed_yet += 1;
            } else {
                report.problem(format!(
                    "stream {:?}: the record at offset {} (topic {:?}) matches its filter but \
                     has no entry",
                    c.name, r.offset, r.topic
                ));
            }
        }
        for i in here {
            let c = &mut checked[i];
            let Some((idx, e)) = c.pending else { continue };
            let size = u32::try_from(r.topic.len() + r.payload.len()).unwrap_or(u32::MAX);
            if matching.binary_search(&i).is_err() {
                report.problem(format!(
                    "stream {:?}: entry {idx} names offset {}, whose topic {:?} its filter does \
                     not match",
                    c.name, r.offset, r.topic
                ));
            } else if e.ts_us != r.timestamp_us || e.size != size {
                report.problem(format!(
                    "stream {:?}: entry {idx} for offset {}: time {} size {}, the record has \
                     time {} size {size}",
                    c.name, r.offset, e.ts_us, e.size, r.timestamp_us
                ));
            } else {
                report.matched += 1;
            }
            if let Err(x) = advance(c, i, &mut due, &mut report) {
                err = Some(x);
                return false;
            }
        }
        true
    })?;
    if let Some(e) = err {
        return Err(e.into());
    }
    for (off, list) in due {
        for i in list {
            report.problem(format!(
                "stream {:?}: an entry names offset {off}, which is not in the log",
                checked[i].name
            ));
        }
    }
    Ok(report)
}
