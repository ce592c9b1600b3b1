//! Offline check of the lane index against the log, read-only (`lanemq log verify`).
//!
//! Owns nothing at run time: it opens the lane entry files, the lane table journal and the log
//! for reading and changes nothing, so it can run next to a stopped broker.
//!
//! What it checks:
//! - every lane entry below the journaled end belongs to a log record that carries the same
//!   lane hint (lane id and offset), and entries come in log order;
//! - every lane's chain is whole: an entry's `prev` names the lane's entry with the offset
//!   before (or nothing, or an entry in a file already dropped by retention);
//! - every lane of the journal names, as its newest entry, an entry of that lane with the
//!   offset before its next offset.
//!
//! What it reports without calling it a problem: entries past the journaled end (cut and
//! indexed again at the next start), lane hints of records after the watermark (indexed at
//! the next start), lane hints without an entry (the lane was removed before its message was
//! indexed).

use crate::entries::{LaneEntry, ENTRY_BYTES, NONE, SEG_ENTRIES};
use crate::journal::{self, Rec};
use lanemq_store::{IndexHint, Walked};
use std::collections::HashMap;
use std::io::{self, Read};
use std::path::Path;

/// The result of [`verify`].
#[derive(Debug, Default)]
pub struct Report {
    /// False when the data directory has no lane index (nothing to check).
    pub present: bool,
    /// Lanes in the journal's table.
    pub lanes: u64,
    /// Entries in the files (below the journaled end).
    pub entries: u64,
    /// Entries matched with their record's lane hint.
    pub matched: u64,
    /// Entries past the journaled end.
    pub past_end: u64,
    /// Entries whose records the log no longer holds (retention; their file goes at the next
    /// checkpoint).
    pub of_deleted_records: u64,
    /// Lane hints of records after the watermark.
    pub not_indexed_yet: u64,
    /// Lane hints below the watermark without an entry.
    pub hints_without_entry: u64,
    pub problems: Vec<String>,
}

impl Report {
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

const PROBLEMS_MAX: usize = 20;

impl Report {
    fn problem(&mut self, p: String) {
        if self.problems.len() < PROBLEMS_MAX {
            self.problems.push(p);
        } else if self.problems.len() == PROBLEMS_MAX {
            self.problems.push("… more problems not listed".into());
        }
    }
}

/// The entries of the files in `dir`, in index order: `(index, entry)`.
struct EntryStream {
    files: Vec<(u64, std::path::PathBuf)>,
    next_file: usize,
    reader: Option<(u64, io::BufReader<std::fs::File>)>,
    end: u64,
}

impl EntryStream {
    fn open(dir: &Path, end: u64) -> io::Result<EntryStream> {
        let mut files = Vec::new();
        for de in std::fs::read_dir(dir)? {
            let de = de?;
            let name = de.file_name();
            let Some(first) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".lxe"))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            files.push((first, de.path()));
        }
        files.sort();
        Ok(EntryStream {
            files,
            next_file: 0,
            reader: None,
            end,
        })
    }

    fn head(&self) -> u64 {
        self.files.first().map_or(self.end, |f| f.0)
    }

    /// The next entry; entries at or past `end` count as absent.
    fn next(&mut self) -> io::Result<Option<(u64, LaneEntry)>> {
        loop {
            if let Some((i, r)) = &mut self.reader {
                if *i >= self.end {
                    return Ok(None);
                }
                let mut b = [0u8; ENTRY_BYTES as usize];
                match r.read_exact(&mut b) {
                    Ok(()) => {
                        let at = *i;
                        *i += 1;
                        if let Some(e) = LaneEntry::decode(&b) {
                            return Ok(Some((at, e)));
                        }
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => self.reader = None,
                    Err(e) => return Err(e),
                }
            }
            let Some((first, path)) = self.files.get(self.next_file) else {
                return Ok(None);
            };
            self.next_file += 1;
            let f = std::fs::File::open(path)?;
            self.reader = Some((*first, io::BufReader::with_capacity(1 << 20, f)));
        }
    }
}

/// Check the lane index of `data_dir` against its log (see the module doc).
pub fn verify(data_dir: &Path) -> io::Result<Report> {
    let dir = data_dir.join("lanes");
    let mut rep = Report::default();
    if !dir.is_dir() {
        return Ok(rep);
    }
    rep.present = true;
    let mut lanes: HashMap<u64, (u64, u64)> = HashMap::new(); // id -> newest entry, next
    let cp = journal::read_only(&dir, |r| match r {
        Rec::Lane(l) => {
            lanes.insert(l.id, (l.last_entry, l.next));
        }
        Rec::Gone(id) => {
            lanes.remove(&id);
        }
        _ => {}
    })?
    .unwrap_or_default();
    rep.lanes = lanes.len() as u64;
    // Count what lies past the journaled end.
    let mut all = EntryStream::open(&dir, u64::MAX)?;
    let head = all.head();
    let mut on_disk_end = head;
    for (first, path) in &all.files {
        on_disk_end = first + std::fs::metadata(path)?.len() / ENTRY_BYTES;
    }
    rep.past_end = on_disk_end.saturating_sub(cp.entries_end);
    if on_disk_end < cp.entries_end {
        rep.problem(format!(
            "the entry files end at {on_disk_end}, the journal counts {}",
            cp.entries_end
        ));
    }
    all.end = cp.entries_end;
    let mut entries = all;

    // Entries against the log, in log order; chains as they go.
    let mut chain: HashMap<u64, (u64, u64)> = HashMap::new(); // lane -> last index, last seq
    let mut pending = entries.next()?;
    let mut first_record = None;
    let mut failed: Option<io::Error> = None;
    let walked = lanemq_store::walk_records(data_dir, 0, &mut |w| {
        let Walked::Record(r, _) = w else {
            return true;
        };
        first_record.get_or_insert(r.offset);
        for h in r
            .index_hints
            .iter()
            .filter(|h| h.kind == IndexHint::KIND_LANE)
        {
            if r.offset >= cp.watermark {
                rep.not_indexed_yet += 1;
                continue;
            }
            // Entries of records before this one that no hint claimed.
            loop {
                match pending {
                    Some((i, e)) if e.pos < r.offset => {
                        if first_record.is_some_and(|f| e.pos < f) {
                            rep.of_deleted_records += 1;
                        } else {
                            rep.problem(format!(
                                "entry {i} (lane {} offset {}) points at log record {} which \
                                 carries no such lane hint",
                                e.lane, e.seq, e.pos
                            ));
                        }
                        check_chain(&mut rep, &mut chain, head, i, &e);
                    }
                    _ => break,
                }
                pending = match entries.next() {
                    Ok(p) => p,
                    Err(e) => {
                        failed = Some(e);
                        return false;
                    }
                };
            }
            match pending {
                Some((i, e)) if e.pos == r.offset && e.lane == h.id && e.seq == h.seq => {
                    rep.matched += 1;
                    check_chain(&mut rep, &mut chain, head, i, &e);
                    pending = match entries.next() {
                        Ok(p) => p,
                        Err(e) => {
                            failed = Some(e);
                            return false;
                        }
                    };
                }
                _ => rep.hints_without_entry += 1,
            }
        }
        true
    });
    if let Some(e) = failed {
        return Err(e);
    }
    walked.map_err(|e| io::Error::other(e.to_string()))?;
    // Entries after the last record with a hint.
    while let Some((i, e)) = pending {
        if first_record.is_some_and(|f| e.pos < f) {
            rep.of_deleted_records += 1;
        } else {
            rep.problem(format!(
                "entry {i} (lane {} offset {}) points at log position {} past the records \
                 with lane hints",
                e.lane, e.seq, e.pos
            ));
        }
        check_chain(&mut rep, &mut chain, head, i, &e);
        pending = entries.next()?;
    }
    rep.entries = cp.entries_end.saturating_sub(head);

    // The journal's newest entry of each lane.
    let mut files: HashMap<u64, std::fs::File> = HashMap::new();
    for (id, (last, next)) in &lanes {
        if *last == NONE || *last < head || *last >= cp.entries_end {
            continue;
        }
        let no = last / SEG_ENTRIES;
        let f = match files.entry(no) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(std::fs::File::open(
                dir.join(format!("{:020}.lxe", no * SEG_ENTRIES)),
            )?),
        };
        let mut b = [0u8; ENTRY_BYTES as usize];
        use std::os::unix::fs::FileExt;
        f.read_exact_at(&mut b, (last % SEG_ENTRIES) * ENTRY_BYTES)?;
        match LaneEntry::decode(&b) {
            Some(e) if e.lane == *id && e.seq + 1 == *next => {}
            other => rep.problem(format!(
                "lane {id}: the journal names entry {last} (next offset {next}) as its newest, \
                 the file holds {other:?}"
            )),
        }
    }
    Ok(rep)
}

fn check_chain(
    rep: &mut Report,
    chain: &mut HashMap<u64, (u64, u64)>,
    head: u64,
    i: u64,
    e: &LaneEntry,
) {
    match chain.get(&e.lane) {
        Some(&(last, seq)) if e.prev != last || e.seq != seq + 1 => rep.problem(format!(
            "entry {i} (lane {} offset {}): previous entry {} offset {seq}, but it names {}",
            e.lane, e.seq, last, e.prev
        )),
        None if e.prev != NONE && e.prev >= head => rep.problem(format!(
            "entry {i} (lane {} offset {}) names entry {} that is not of its lane",
            e.lane, e.seq, e.prev
        )),
        _ => {}
    }
    chain.insert(e.lane, (i, e.seq));
}
