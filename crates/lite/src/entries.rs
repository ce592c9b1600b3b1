//! Lane entry files: the index of every lane, one shared dense file set next to the log.
//!
//! Every message that goes into a lane gets one fixed-size entry (40 bytes: lane id, lane
//! offset, log position, arrival time, and the index of the lane's previous entry), appended
//! to files shared by all lanes, `<data_dir>/lanes/<first index>.lxe`, [`SEG_ENTRIES`] entries
//! per file. An entry's *index* (0, 1, 2, … never reused) says where it lives: file
//! `index / SEG_ENTRIES`, byte `(index % SEG_ENTRIES) * 40`. A lane is the chain of its
//! entries through `prev`, so a lane costs nothing on disk besides its entries, and in memory
//! one word (the index of its newest entry, kept by the engine's lane table).
//!
//! # Invariants
//!
//! - One writer appends, in increasing log position (the order the records became durable),
//!   so the position of entries never decreases and can be binary-searched.
//! - `prev` of an entry is a smaller index or [`NONE`]; the entry it names belongs to the same
//!   lane with offset one less. Readers still check the lane id and offset of every entry they
//!   reach, so a chain that runs into removed or re-used space simply ends.
//! - `head <= end`: entries below `head` are gone (whole files, dropped once the log records
//!   they point to are gone); readers see `[head, end)`; `end` moves after the bytes are
//!   written.
//! - Durability: [`LaneEntries::sync`] fsyncs what was appended; the engine syncs before it
//!   journals the `end` it will trust after a crash, and at open bytes past that `end` are cut
//!   (they are indexed again from the log).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Bytes of one entry.
pub const ENTRY_BYTES: u64 = 40;
/// Entries per file (40 MiB files).
pub const SEG_ENTRIES: u64 = 1 << 20;
/// "No entry" in `prev` and in a lane's newest-entry word.
pub const NONE: u64 = u64::MAX;
const SUFFIX: &str = ".lxe";

/// One lane entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneEntry {
    pub lane: u64,
    /// The message's offset in its lane.
    pub seq: u64,
    /// Log position of the record.
    pub pos: u64,
    /// Arrival time, µs since the epoch.
    pub ts_us: u64,
    /// Index of the lane's previous entry, or [`NONE`].
    pub prev: u64,
}

impl LaneEntry {
    fn encode(&self, out: &mut Vec<u8>) {
        for v in [self.lane, self.seq, self.pos, self.ts_us, self.prev] {
            out.extend_from_slice(&v.to_be_bytes());
        }
    }

    pub(crate) fn decode(b: &[u8]) -> Option<LaneEntry> {
        let w = |i: usize| -> Option<u64> {
            Some(u64::from_be_bytes(
                b.get(i * 8..i * 8 + 8)?.try_into().ok()?,
            ))
        };
        Some(LaneEntry {
            lane: w(0)?,
            seq: w(1)?,
            pos: w(2)?,
            ts_us: w(3)?,
            prev: w(4)?,
        })
    }
}

/// What [`LaneEntries::open`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct OpenReport {
    /// Entries past the trusted end that were cut.
    pub cut: u64,
    /// Entries the trusted end counts that are not on disk.
    pub short_by: u64,
}

/// The shared lane entry files of one data directory.
pub struct LaneEntries {
    dir: PathBuf,
    files: BTreeMap<u64, Arc<File>>,
    head: u64,
    end: u64,
    /// First index appended since the last sync.
    unsynced_from: Option<u64>,
}

impl std::fmt::Debug for LaneEntries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaneEntries")
            .field("dir", &self.dir)
            .field("head", &self.head)
            .field("end", &self.end)
            .finish()
    }
}

fn file_name(no: u64) -> String {
    format!("{:020}{SUFFIX}", no * SEG_ENTRIES)
}

fn corrupt(dir: &Path, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("lane entry files in {}: {what}", dir.display()),
    )
}

impl LaneEntries {
    /// Open (creating `dir`) with `end` the last synced end; entries past it are cut.
    pub fn open(dir: &Path, end: u64) -> io::Result<(LaneEntries, OpenReport)> {
        std::fs::create_dir_all(dir)?;
        let mut nos = Vec::new();
        for de in std::fs::read_dir(dir)? {
            let de = de?;
            let name = de.file_name();
            let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(SUFFIX)) else {
                continue;
            };
            let first: u64 = stem
                .parse()
                .map_err(|_| corrupt(dir, format_args!("unexpected file {stem}{SUFFIX}")))?;
            if first % SEG_ENTRIES != 0 {
                return Err(corrupt(dir, format_args!("misaligned file {stem}{SUFFIX}")));
            }
            nos.push(first / SEG_ENTRIES);
        }
        nos.sort_unstable();
        let mut report = OpenReport::default();
        let mut files = BTreeMap::new();
        let mut on_disk_end = None;
        for (k, no) in nos.iter().enumerate() {
            if k > 0 && nos[k - 1] + 1 != *no {
                return Err(corrupt(
                    dir,
                    format_args!("file {} missing", file_name(*no - 1)),
                ));
            }
            let path = dir.join(file_name(*no));
            let first = no * SEG_ENTRIES;
            if first >= end {
                // Wholly past the trusted end.
                let len = std::fs::metadata(&path)?.len() / ENTRY_BYTES;
                report.cut += len;
                std::fs::remove_file(&path)?;
                continue;
            }
            let f = OpenOptions::new().read(true).write(true).open(&path)?;
            let len = f.metadata()?.len() / ENTRY_BYTES;
            let keep = (end - first).min(SEG_ENTRIES);
            if len > keep {
                report.cut += len - keep;
                f.set_len(keep * ENTRY_BYTES)?;
                f.sync_data()?;
            }
            on_disk_end = Some(first + len.min(keep));
            files.insert(*no, Arc::new(f));
        }
        let head = files.keys().next().map_or(end, |no| no * SEG_ENTRIES);
        let on_disk_end = on_disk_end.unwrap_or(end);
        if on_disk_end < end {
            report.short_by = end - on_disk_end;
        }
        let e = LaneEntries {
            dir: dir.to_path_buf(),
            files,
            head,
            end: on_disk_end.max(head),
            unsynced_from: None,
        };
        Ok((e, report))
    }

    pub fn head(&self) -> u64 {
        self.head
    }

    pub fn end(&self) -> u64 {
        self.end
    }

    fn file(&mut self, no: u64) -> io::Result<Arc<File>> {
        if let Some(f) = self.files.get(&no) {
            return Ok(f.clone());
        }
        let f = Arc::new(
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(self.dir.join(file_name(no)))?,
        );
        self.files.insert(no, f.clone());
        Ok(f)
    }

    /// Append `entries` at `end`; returns the index of the first.
    pub fn append(&mut self, entries: &[LaneEntry]) -> io::Result<u64> {
        let first = self.end;
        let mut i = first;
        let mut rest = entries;
        let mut buf = Vec::new();
        while !rest.is_empty() {
            let no = i / SEG_ENTRIES;
            let room = (SEG_ENTRIES - i % SEG_ENTRIES) as usize;
            let (now, later) = rest.split_at(room.min(rest.len()));
            buf.clear();
            for e in now {
                e.encode(&mut buf);
            }
            let f = self.file(no)?;
            f.write_all_at(&buf, (i % SEG_ENTRIES) * ENTRY_BYTES)?;
            i += now.len() as u64;
            rest = later;
        }
        if !entries.is_empty() && self.unsynced_from.is_none() {
            self.unsynced_from = Some(first);
        }
        self.end = i;
        Ok(first)
    }

    /// What [`LaneEntries::sync`] would fsync, to be synced by the caller without holding
    /// whatever guards `self`: the files appended to since the last call, and whether the
    /// directory needs a sync too (a new file). Marks them synced.
    pub fn take_unsynced(&mut self) -> (Vec<Arc<File>>, bool) {
        let Some(from) = self.unsynced_from.take() else {
            return (Vec::new(), false);
        };
        let last = self.end.saturating_sub(1) / SEG_ENTRIES;
        let files = (from / SEG_ENTRIES..=last)
            .filter_map(|no| self.files.get(&no).cloned())
            .collect();
        let new_file = from < self.end && (from % SEG_ENTRIES == 0 || last > from / SEG_ENTRIES);
        (files, new_file)
    }

    /// The directory of the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// fsync the files appended to since the last sync.
    pub fn sync(&mut self) -> io::Result<()> {
        let Some(from) = self.unsynced_from else {
            return Ok(());
        };
        let last = self.end.saturating_sub(1) / SEG_ENTRIES;
        for no in from / SEG_ENTRIES..=last {
            if let Some(f) = self.files.get(&no) {
                f.sync_data()?;
            }
        }
        if from < self.end && from % SEG_ENTRIES == 0 {
            // A new file: its directory entry too.
            File::open(&self.dir)?.sync_all()?;
        }
        self.unsynced_from = None;
        Ok(())
    }

    /// The entry at index `i` (None below `head` or at/after `end`).
    pub fn get(&self, i: u64) -> io::Result<Option<LaneEntry>> {
        if i < self.head || i >= self.end {
            return Ok(None);
        }
        let Some(f) = self.files.get(&(i / SEG_ENTRIES)) else {
            return Ok(None);
        };
        let mut b = [0u8; ENTRY_BYTES as usize];
        f.read_exact_at(&mut b, (i % SEG_ENTRIES) * ENTRY_BYTES)?;
        Ok(LaneEntry::decode(&b))
    }

    /// The first index whose log position is at least `pos` (`end` if none).
    pub fn seek_pos(&self, pos: u64) -> io::Result<u64> {
        let (mut lo, mut hi) = (self.head, self.end);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.get(mid)? {
                Some(e) if e.pos < pos => lo = mid + 1,
                _ => hi = mid,
            }
        }
        Ok(lo)
    }

    /// Delete the files whose every entry is below `below`; returns how many entries went.
    pub fn drop_files_below(&mut self, below: u64) -> io::Result<u64> {
        let below = below.min(self.end);
        let mut dropped = 0;
        while let Some((&no, _)) = self.files.first_key_value() {
            let file_end = (no + 1) * SEG_ENTRIES;
            if file_end > below {
                break;
            }
            self.files.remove(&no);
            std::fs::remove_file(self.dir.join(file_name(no)))?;
            dropped += file_end - self.head.max(no * SEG_ENTRIES);
            self.head = file_end;
        }
        Ok(dropped)
    }

    /// Bytes on disk.
    pub fn disk_bytes(&self) -> u64 {
        self.files
            .values()
            .filter_map(|f| f.metadata().ok())
            .map(|m| m.len())
            .sum()
    }

    /// Remove every file and start over at `end` = `head` = `at`.
    pub fn reset(&mut self, at: u64) -> io::Result<()> {
        for no in std::mem::take(&mut self.files).into_keys() {
            std::fs::remove_file(self.dir.join(file_name(no)))?;
        }
        self.head = at;
        self.end = at;
        self.unsynced_from = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "lanemq-lane-entries-{tag}-{}-{}",
            std::process::id(),
            lanemq_store::now_us()
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn e(lane: u64, seq: u64, pos: u64, prev: u64) -> LaneEntry {
        LaneEntry {
            lane,
            seq,
            pos,
            ts_us: pos * 10,
            prev,
        }
    }

    #[test]
    fn append_get_seek_and_reopen_cut_past_the_trusted_end() {
        let d = dir("cut");
        let (mut x, r) = LaneEntries::open(&d, 0).unwrap();
        assert_eq!(r, OpenReport::default());
        let first = x
            .append(&[e(1, 0, 10, NONE), e(2, 0, 11, NONE), e(1, 1, 12, 0)])
            .unwrap();
        assert_eq!(first, 0);
        x.sync().unwrap();
        x.append(&[e(2, 1, 13, 1)]).unwrap();
        assert_eq!(x.get(2).unwrap(), Some(e(1, 1, 12, 0)));
        assert_eq!(x.get(4).unwrap(), None);
        assert_eq!(x.seek_pos(12).unwrap(), 2);
        assert_eq!(x.seek_pos(99).unwrap(), 4);
        drop(x);
        // The trusted end is 3: the fourth entry is cut.
        let (x, r) = LaneEntries::open(&d, 3).unwrap();
        assert_eq!(
            r,
            OpenReport {
                cut: 1,
                short_by: 0
            }
        );
        assert_eq!((x.head(), x.end()), (0, 3));
        assert_eq!(x.get(3).unwrap(), None);
        drop(x);
        // A trusted end past what is on disk is reported short.
        let (x, r) = LaneEntries::open(&d, 5).unwrap();
        assert_eq!(
            r,
            OpenReport {
                cut: 0,
                short_by: 2
            }
        );
        assert_eq!(x.end(), 3);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn files_roll_and_whole_files_below_a_bound_are_dropped() {
        let d = dir("roll");
        let (mut x, _) = LaneEntries::open(&d, 0).unwrap();
        let n = SEG_ENTRIES + 10;
        let all: Vec<LaneEntry> = (0..n).map(|i| e(7, i, i, i.wrapping_sub(1))).collect();
        x.append(&all).unwrap();
        x.sync().unwrap();
        assert_eq!(
            x.get(SEG_ENTRIES + 3).unwrap().unwrap().seq,
            SEG_ENTRIES + 3
        );
        assert_eq!(x.drop_files_below(SEG_ENTRIES - 1).unwrap(), 0);
        assert_eq!(x.drop_files_below(SEG_ENTRIES + 5).unwrap(), SEG_ENTRIES);
        assert_eq!(x.get(3).unwrap(), None);
        assert_eq!(x.head(), SEG_ENTRIES);
        drop(x);
        let (x, r) = LaneEntries::open(&d, n).unwrap();
        assert_eq!(r, OpenReport::default());
        assert_eq!((x.head(), x.end()), (SEG_ENTRIES, n));
        assert_eq!(x.get(n - 1).unwrap().unwrap().seq, n - 1);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
