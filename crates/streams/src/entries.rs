//! Entry files: the index of one regular stream, kept next to the log instead of in sled.
//!
//! A regular stream is a dense, ordered run of log positions, so its index is a run of
//! fixed-size entries (24 bytes: log offset, arrival time, size, flags) appended to files of
//! its own, `<data_dir>/streams/<id>/<first index>.sxe`, [`SEG_ENTRIES`] entries per file.
//! An entry's *index* (0, 1, 2, … over the stream's whole life, never reused) says where it
//! lives: file `index / SEG_ENTRIES`, byte `(index % SEG_ENTRIES) * 24`. Nothing per entry is
//! held in memory; a stream costs one open file per segment and a few words.
//!
//! # Invariants
//!
//! - Entries are appended by one writer (the stream indexer) in strictly increasing log
//!   offset, and arrival times never decrease, so both can be binary-searched.
//! - `head <= end`: entries below `head` are removed (retention) and never read again;
//!   whole files below `head` are deleted only by [`Entries::drop_files_below`], which the
//!   engine calls after the head it passes is durable in sled (a crash never leaves a
//!   persisted head pointing into a deleted file).
//! - Readers see `[head, end)` only; `end` is published after the bytes are written, so a
//!   reader never sees a half-written entry.
//! - Durability: [`Entries::sync`] fsyncs what was appended. The engine syncs before it
//!   stores the `end` it will trust after a crash; at open, bytes past that `end` (appended
//!   after the last checkpoint) are cut and indexed again from the log.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Bytes of one entry.
pub const ENTRY_BYTES: u64 = 24;
/// Entries per file (24 MiB files).
pub const SEG_ENTRIES: u64 = 1 << 20;
/// Entries read per `pread` when scanning.
const READ_CHUNK: usize = 1024;
const SUFFIX: &str = ".sxe";

/// Flag: the stream's key expression found a key in this message.
pub const FLAG_HAS_KEY: u8 = 1;

/// One entry: where a captured message is in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawEntry {
    /// Log offset of the message.
    pub offset: u64,
    /// Arrival time, µs since the epoch.
    pub ts_us: u64,
    /// Topic plus payload bytes (counted against `max_message_bytes`).
    pub size: u32,
    /// [`FLAG_HAS_KEY`].
    pub flags: u8,
}

impl RawEntry {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.offset.to_be_bytes());
        out.extend_from_slice(&self.ts_us.to_be_bytes());
        out.extend_from_slice(&self.size.to_be_bytes());
        out.push(self.flags);
        out.extend_from_slice(&[0, 0, 0]);
    }

    pub(crate) fn decode(b: &[u8]) -> Option<RawEntry> {
        Some(RawEntry {
            offset: u64::from_be_bytes(b.get(0..8)?.try_into().ok()?),
            ts_us: u64::from_be_bytes(b.get(8..16)?.try_into().ok()?),
            size: u32::from_be_bytes(b.get(16..20)?.try_into().ok()?),
            flags: *b.get(20)?,
        })
    }

    /// Does the message have a key?
    pub fn has_key(&self) -> bool {
        self.flags & FLAG_HAS_KEY != 0
    }
}

struct Files {
    /// File number -> file.
    files: BTreeMap<u64, Arc<File>>,
    /// File numbers written since the last sync.
    dirty: Vec<u64>,
}

/// The entry files of one stream.
pub struct Entries {
    dir: PathBuf,
    files: Mutex<Files>,
    /// Exclusive end index (published after the write).
    end: AtomicU64,
    /// First live index.
    head: AtomicU64,
}

impl std::fmt::Debug for Entries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entries")
            .field("dir", &self.dir)
            .field("head", &self.head())
            .field("end", &self.end())
            .finish()
    }
}

fn file_name(no: u64) -> String {
    format!("{:020}{SUFFIX}", no * SEG_ENTRIES)
}

fn corrupt(dir: &Path, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("stream entry files in {}: {what}", dir.display()),
    )
}

/// What [`Entries::open`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenReport {
    /// Entries cut beyond the checkpointed end (appended after the last checkpoint).
    pub cut: u64,
    /// The files held fewer entries than the checkpoint said (lost on power failure or
    /// deleted by hand); `end` was lowered to what is there.
    pub short_by: u64,
}

impl Entries {
    /// Open (or create) the entry files in `dir`. `end` is the checkpointed end (entries past
    /// it are cut), `head` the checkpointed head (clamped to the first file present).
    pub fn open(dir: &Path, head: u64, end: u64) -> io::Result<(Entries, OpenReport)> {
        std::fs::create_dir_all(dir)?;
        let mut files = BTreeMap::new();
        for de in std::fs::read_dir(dir)? {
            let de = de?;
            let name = de.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(stem) = name.strip_suffix(SUFFIX) else {
                continue;
            };
            let first: u64 = stem
                .parse()
                .map_err(|_| corrupt(dir, format!("unexpected file {name}")))?;
            if first % SEG_ENTRIES != 0 {
                return Err(corrupt(dir, format!("unexpected file {name}")));
            }
            let f = OpenOptions::new().read(true).write(true).open(de.path())?;
            files.insert(first / SEG_ENTRIES, Arc::new(f));
        }
        let mut report = OpenReport::default();
        // Files past the end's file hold only entries to cut.
        let end_no = end / SEG_ENTRIES;
        let extra: Vec<u64> = files.range(end_no + 1..).map(|(n, _)| *n).collect();
        for no in extra {
            if let Some(f) = files.remove(&no) {
                report.cut += f.metadata()?.len() / ENTRY_BYTES;
            }
            std::fs::remove_file(dir.join(file_name(no)))?;
        }
        // What the files really hold, from the last one.
        let found_end = match files.iter().next_back() {
            Some((no, f)) => no * SEG_ENTRIES + f.metadata()?.len() / ENTRY_BYTES,
            None => head.max(end),
        };
        let mut real_end = end;
        if found_end > end {
            report.cut += found_end - end;
        } else if found_end < end {
            report.short_by = end - found_end;
            real_end = found_end;
        }
        if let Some((no, f)) = files.iter().next_back() {
            let len = (real_end - no * SEG_ENTRIES).min(SEG_ENTRIES) * ENTRY_BYTES;
            if f.metadata()?.len() != len {
                f.set_len(len)?;
                f.sync_data()?;
            }
        }
        let first_present = files.keys().next().map_or(real_end, |n| n * SEG_ENTRIES);
        let head = head.max(first_present).min(real_end);
        let e = Entries {
            dir: dir.to_path_buf(),
            files: Mutex::new(Files {
                files,
                dirty: Vec::new(),
            }),
            end: AtomicU64::new(real_end),
            head: AtomicU64::new(head),
        };
        Ok((e, report))
    }

    fn lock(&self) -> MutexGuard<'_, Files> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// First live index.
    pub fn head(&self) -> u64 {
        self.head.load(Ordering::Acquire)
    }

    /// Exclusive end index.
    pub fn end(&self) -> u64 {
        self.end.load(Ordering::Acquire)
    }

    /// Live entries.
    pub fn len(&self) -> u64 {
        self.end().saturating_sub(self.head())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Append entries (one writer only; offsets above every entry appended before).
    pub fn append(&self, entries: &[RawEntry]) -> io::Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut end = self.end();
        let mut buf = Vec::with_capacity(entries.len() * ENTRY_BYTES as usize);
        let mut rest = entries;
        let mut g = self.lock();
        while !rest.is_empty() {
            let no = end / SEG_ENTRIES;
            let room = (SEG_ENTRIES - end % SEG_ENTRIES) as usize;
            let (now, later) = rest.split_at(room.min(rest.len()));
            let f = match g.files.get(&no) {
                Some(f) => f.clone(),
                None => {
                    let f = Arc::new(
                        OpenOptions::new()
                            .read(true)
                            .write(true)
                            .create(true)
                            .truncate(true)
                            .open(self.dir.join(file_name(no)))?,
                    );
                    g.files.insert(no, f.clone());
                    f
                }
            };
            buf.clear();
            for e in now {
                e.encode(&mut buf);
            }
            f.write_all_at(&buf, (end % SEG_ENTRIES) * ENTRY_BYTES)?;
            if g.dirty.last() != Some(&no) {
                g.dirty.push(no);
            }
            end += now.len() as u64;
            rest = later;
        }
        drop(g);
        self.end.store(end, Ordering::Release);
        Ok(())
    }

    /// Make every appended entry durable (and new files' directory entries).
    pub fn sync(&self) -> io::Result<()> {
        let (files, new_dir) = {
            let mut g = self.lock();
            let dirty = std::mem::take(&mut g.dirty);
            let files: Vec<Arc<File>> = dirty
                .iter()
                .filter_map(|no| g.files.get(no).cloned())
                .collect();
            (files, !dirty.is_empty())
        };
        for f in files {
            f.sync_data()?;
        }
        if new_dir {
            File::open(&self.dir)?.sync_all()?;
        }
        Ok(())
    }

    /// Up to `max` live entries from index `from` (clamped to the head).
    pub fn read(&self, from: u64, max: usize) -> io::Result<Vec<RawEntry>> {
        Ok(self.read_from(from, max)?.1)
    }

    /// Up to `max` live entries from index `from` (clamped to the head), and the index of
    /// the first one.
    pub fn read_from(&self, from: u64, max: usize) -> io::Result<(u64, Vec<RawEntry>)> {
        let from = from.max(self.head());
        let end = self.end();
        let mut out = Vec::new();
        let mut i = from;
        while i < end && out.len() < max {
            let no = i / SEG_ENTRIES;
            let in_file = (SEG_ENTRIES - i % SEG_ENTRIES).min(end - i);
            let n = (max - out.len()).min(in_file as usize).min(READ_CHUNK * 16);
            let Some(f) = self.lock().files.get(&no).cloned() else {
                // Removed under us by retention: skip to the next file.
                i = (no + 1) * SEG_ENTRIES;
                continue;
            };
            let mut buf = vec![0u8; n * ENTRY_BYTES as usize];
            f.read_exact_at(&mut buf, (i % SEG_ENTRIES) * ENTRY_BYTES)?;
            for c in buf.chunks_exact(ENTRY_BYTES as usize) {
                out.push(RawEntry::decode(c).ok_or_else(|| corrupt(&self.dir, "short entry"))?);
            }
            i += n as u64;
        }
        Ok((from, out))
    }

    /// The live entry at `i`.
    pub fn get(&self, i: u64) -> io::Result<Option<RawEntry>> {
        if i < self.head() || i >= self.end() {
            return Ok(None);
        }
        Ok(self.read(i, 1)?.into_iter().next())
    }

    /// First live index whose entry satisfies `!before(entry)` (`before` must be monotone:
    /// true for a prefix of the entries, false after); `end` if none.
    fn partition(&self, before: impl Fn(&RawEntry) -> bool) -> io::Result<u64> {
        let (mut lo, mut hi) = (self.head(), self.end());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.get(mid)? {
                Some(e) if before(&e) => lo = mid + 1,
                Some(_) => hi = mid,
                // Trimmed meanwhile: everything below the new head is gone.
                None => lo = lo.max(self.head()).min(hi),
            }
        }
        Ok(lo)
    }

    /// First live index whose log offset is `>= offset`.
    pub fn seek_offset(&self, offset: u64) -> io::Result<u64> {
        self.partition(|e| e.offset < offset)
    }

    /// First live index whose arrival time is `>= ts_us`.
    pub fn seek_ts(&self, ts_us: u64) -> io::Result<u64> {
        self.partition(|e| e.ts_us < ts_us)
    }

    /// Move the head forward to `head` (retention); files are deleted later by
    /// [`Entries::drop_files_below`].
    pub fn set_head(&self, head: u64) {
        self.head.fetch_max(head.min(self.end()), Ordering::AcqRel);
    }

    /// Delete the files whose entries are all below `durable_head` (a head already stored).
    pub fn drop_files_below(&self, durable_head: u64) -> io::Result<u64> {
        let below = durable_head / SEG_ENTRIES;
        let nos: Vec<u64> = {
            let mut g = self.lock();
            let nos: Vec<u64> = g.files.range(..below).map(|(n, _)| *n).collect();
            for n in &nos {
                g.files.remove(n);
                g.dirty.retain(|d| d != n);
            }
            nos
        };
        for no in &nos {
            match std::fs::remove_file(self.dir.join(file_name(*no))) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(nos.len() as u64)
    }

    /// Bytes on disk.
    pub fn disk_bytes(&self) -> u64 {
        let files: Vec<Arc<File>> = self.lock().files.values().cloned().collect();
        files
            .iter()
            .filter_map(|f| f.metadata().ok())
            .map(|m| m.len())
            .sum()
    }

    /// Remove every file and the directory (a deleted stream).
    pub fn destroy(dir: &Path) -> io::Result<()> {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "lanemq-entries-{tag}-{}-{}",
            std::process::id(),
            lanemq_store::now_us()
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn e(offset: u64) -> RawEntry {
        RawEntry {
            offset,
            ts_us: offset * 10,
            size: 7,
            flags: (offset % 2) as u8,
        }
    }

    #[test]
    fn append_read_seek_and_reopen_cut_past_the_checkpoint() {
        let d = dir("basic");
        let (x, r) = Entries::open(&d, 0, 0).unwrap();
        assert_eq!(r, OpenReport::default());
        let batch: Vec<RawEntry> = (0..1000).map(|i| e(i * 3 + 5)).collect();
        x.append(&batch).unwrap();
        assert_eq!(x.len(), 1000);
        assert_eq!(x.read(10, 3).unwrap(), vec![e(35), e(38), e(41)]);
        assert_eq!(x.seek_offset(0).unwrap(), 0);
        assert_eq!(x.seek_offset(36).unwrap(), 11);
        assert_eq!(x.seek_offset(38).unwrap(), 11);
        assert_eq!(x.seek_offset(1_000_000).unwrap(), 1000);
        assert_eq!(x.seek_ts(350).unwrap(), 10);
        assert_eq!(x.seek_ts(351).unwrap(), 11);
        x.sync().unwrap();
        drop(x);
        // The checkpoint said 600 entries: the 400 after it are cut.
        let (x, r) = Entries::open(&d, 0, 600).unwrap();
        assert_eq!(r.cut, 400);
        assert_eq!(x.end(), 600);
        assert_eq!(x.get(599).unwrap(), Some(e(599 * 3 + 5)));
        assert_eq!(x.get(600).unwrap(), None);
        // The checkpoint said more than the files hold.
        drop(x);
        let (x, r) = Entries::open(&d, 0, 700).unwrap();
        assert_eq!(r.short_by, 100);
        assert_eq!(x.end(), 600);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn files_roll_and_only_files_below_a_durable_head_are_deleted() {
        let d = dir("roll");
        let (x, _) = Entries::open(&d, 0, 0).unwrap();
        let n = SEG_ENTRIES * 2 + 10;
        let batch: Vec<RawEntry> = (0..n).map(e).collect();
        for c in batch.chunks(100_000) {
            x.append(c).unwrap();
        }
        x.sync().unwrap();
        assert_eq!(x.end(), n);
        assert_eq!(x.get(SEG_ENTRIES).unwrap(), Some(e(SEG_ENTRIES)));
        // Reads cross file boundaries.
        let r = x.read(SEG_ENTRIES - 2, 4).unwrap();
        assert_eq!(
            r.iter().map(|e| e.offset).collect::<Vec<_>>(),
            vec![
                SEG_ENTRIES - 2,
                SEG_ENTRIES - 1,
                SEG_ENTRIES,
                SEG_ENTRIES + 1
            ]
        );
        x.set_head(SEG_ENTRIES + 5);
        assert_eq!(x.get(SEG_ENTRIES).unwrap(), None);
        assert_eq!(x.read(0, 1).unwrap(), vec![e(SEG_ENTRIES + 5)]);
        assert_eq!(x.seek_offset(0).unwrap(), SEG_ENTRIES + 5);
        assert_eq!(x.drop_files_below(SEG_ENTRIES + 5).unwrap(), 1);
        assert!(!d.join(file_name(0)).exists());
        assert!(d.join(file_name(1)).exists());
        drop(x);
        // A stored head older than the deleted file is clamped to what is there.
        let (x, _) = Entries::open(&d, 3, n).unwrap();
        assert_eq!(x.head(), SEG_ENTRIES);
        assert_eq!(x.end(), n);
        Entries::destroy(&d).unwrap();
        assert!(!d.exists());
    }
}
