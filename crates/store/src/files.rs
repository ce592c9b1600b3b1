//! The log's open segment files: a bounded LRU of file handles for sealed segments.
//!
//! A broker under steady load seals a segment every `segment_bytes_max` bytes and keeps it for
//! the retention period (7 days by default), so keeping one open handle per segment makes the
//! open files grow with the log itself: about one a second at 64 MiB segments and 64 MiB/s,
//! until the process's open-files limit is reached and accepts and new segments fail. Here the
//! number of open segment files is bounded instead:
//!
//! - the **active** segment (the last one, the only one written) keeps its handle for as long
//!   as it is active: the storage thread writes and fsyncs through it and readers of the tail
//!   read through it ([`crate::segment::Segment`] holds it);
//! - the segment **sealed last** keeps its handle until the next roll: the records a roll
//!   makes readable are read right after it by the readers that follow the tail (stream
//!   indexer, lanes), which would otherwise reopen every segment once and fill the cache with
//!   segments nobody reads again;
//! - an **older** segment is opened on demand, read-only, by the first read that needs it,
//!   and its handle kept in this cache, which holds at most `open_segments_max` handles and
//!   closes the least recently used one when it needs room. Recovery at open closes each
//!   segment once it is checked, so a broker that reads only near the tail holds two segment
//!   files open, and opening a log of 20,000 segments holds at most two at a time;
//! - a read of a segment whose handle was closed reopens it transparently (by path; the file
//!   of a sealed segment never changes);
//! - retention closes the handle of a segment it deletes: the segment is marked deleted
//!   first, its file removed, then its handle unpinned and evicted. A read that then misses the cache
//!   cannot reopen the file, and the log reports `OffsetOutOfRange` (the record is gone),
//!   never an I/O error.
//!
//! # Invariants
//!
//! - the cache holds at most `max` handles (checked by `debug_assert!` after every insert);
//! - files open for the log at any moment ≤ 2 (the active segment and the one sealed last) +
//!   `max` + one per read in progress on a segment evicted meanwhile: a cursor borrows a handle for one `pread` only
//!   (it asks the segment for its file at every buffer fill), never across calls, so a reader
//!   parked on an old offset pins no file;
//! - [`SegmentFiles::open_files`] counts the sealed-segment handles alive (cached or
//!   borrowed): it goes up when the cache opens a file and down when the last clone of that
//!   handle is dropped, so tests can check the bound against what the process really holds;
//! - misses are opened under the cache's lock: two readers missing the same segment open it
//!   once. Opening a file costs microseconds, and every caller is a blocking thread already
//!   (reads are blocking I/O, `docs/durability.md#threads`).

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::fs::{Fs, LogFile};

/// Default of `StoreOptions::open_segments_max`.
pub const OPEN_SEGMENTS_MAX_DEFAULT: usize = 64;

/// Handles of sealed segments, by first offset, at most `max` of them (module doc).
#[derive(Debug)]
pub struct SegmentFiles {
    fs: Arc<dyn Fs>,
    max: usize,
    lru: Mutex<Lru>,
    /// Sealed-segment handles alive (cached or borrowed by a read in progress).
    open: Arc<AtomicUsize>,
    /// Files opened on a miss since the store opened.
    opened: AtomicU64,
}

#[derive(Debug, Default)]
struct Lru {
    /// Bumped at every use; the smallest tick is the least recently used.
    tick: u64,
    /// first offset → (handle, tick of its last use)
    by_first: HashMap<u64, (Arc<dyn LogFile>, u64)>,
    /// tick → first offset
    by_tick: BTreeMap<u64, u64>,
}

impl Lru {
    fn touch(&mut self, first: u64) -> Option<Arc<dyn LogFile>> {
        self.tick += 1;
        let tick = self.tick;
        let (file, t) = self.by_first.get_mut(&first)?;
        self.by_tick.remove(t);
        *t = tick;
        self.by_tick.insert(tick, first);
        Some(file.clone())
    }

    fn insert(&mut self, first: u64, file: Arc<dyn LogFile>, max: usize) {
        self.tick += 1;
        let tick = self.tick;
        if let Some((_, old)) = self.by_first.insert(first, (file, tick)) {
            self.by_tick.remove(&old);
        }
        self.by_tick.insert(tick, first);
        while self.by_first.len() > max {
            let Some((_, victim)) = self.by_tick.pop_first() else {
                break;
            };
            // Dropping the cache's clone closes the file unless a read still borrows it.
            self.by_first.remove(&victim);
        }
        debug_assert!(self.by_first.len() <= max && self.by_tick.len() == self.by_first.len());
    }

    fn remove(&mut self, first: u64) {
        if let Some((_, t)) = self.by_first.remove(&first) {
            self.by_tick.remove(&t);
        }
    }
}

/// A sealed segment's handle, counted in [`SegmentFiles::open_files`] until dropped.
#[derive(Debug)]
struct Counted {
    file: Arc<dyn LogFile>,
    open: Arc<AtomicUsize>,
}

impl Counted {
    fn wrap(file: Arc<dyn LogFile>, open: &Arc<AtomicUsize>) -> Arc<dyn LogFile> {
        open.fetch_add(1, Ordering::Relaxed);
        Arc::new(Counted {
            file,
            open: open.clone(),
        })
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl LogFile for Counted {
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, pos)
    }
    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        self.file.write_all_at(buf, pos)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
    fn size(&self) -> io::Result<u64> {
        self.file.size()
    }
}

impl SegmentFiles {
    /// An empty cache of at most `max` (≥ 1) handles opened through `fs`.
    pub fn new(fs: Arc<dyn Fs>, max: usize) -> SegmentFiles {
        SegmentFiles {
            fs,
            max: max.max(1),
            lru: Mutex::new(Lru::default()),
            open: Arc::new(AtomicUsize::new(0)),
            opened: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Lru> {
        self.lru.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The handle of the sealed segment starting at `first`, opened (read-only) from `path`
    /// on a miss; the least recently used handle is closed if that makes one too many.
    pub fn get(&self, first: u64, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        let mut lru = self.lock();
        if let Some(f) = lru.touch(first) {
            return Ok(f);
        }
        let file = Counted::wrap(self.fs.open_read(path)?, &self.open);
        self.opened.fetch_add(1, Ordering::Relaxed);
        lru.insert(first, file.clone(), self.max);
        Ok(file)
    }

    /// Closes the handle of `first` (its segment was deleted), unless a read in progress
    /// still borrows it; then it closes when that read ends.
    pub fn evict(&self, first: u64) {
        self.lock().remove(first);
    }

    /// Handles in the cache.
    #[cfg(test)]
    pub fn cached(&self) -> usize {
        self.lock().by_first.len()
    }

    /// Sealed-segment handles alive: in the cache or borrowed by a read in progress.
    pub fn open_files(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Files opened on a miss since the store opened.
    pub fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::fs::MemFs;
    use std::path::PathBuf;

    fn setup(n: u64) -> (MemFs, Vec<PathBuf>) {
        let fs = MemFs::new();
        let dir = PathBuf::from("/d");
        fs.create_dir_all(&dir).unwrap();
        let paths = (0..n)
            .map(|i| {
                let p = dir.join(format!("{i}.seg"));
                fs.open(&p, true)
                    .unwrap()
                    .write_all_at(&[i as u8], 0)
                    .unwrap();
                p
            })
            .collect();
        (fs, paths)
    }

    #[test]
    fn least_recently_used_handle_is_closed_first() {
        let (fs, paths) = setup(4);
        let c = SegmentFiles::new(Arc::new(fs), 2);
        c.get(0, &paths[0]).unwrap();
        c.get(1, &paths[1]).unwrap();
        c.get(0, &paths[0]).unwrap(); // 0 is now the most recent
        c.get(2, &paths[2]).unwrap(); // evicts 1
        assert_eq!((c.cached(), c.open_files(), c.opened()), (2, 2, 3));
        c.get(0, &paths[0]).unwrap();
        assert_eq!(c.opened(), 3, "0 stayed open");
        c.get(1, &paths[1]).unwrap();
        assert_eq!(c.opened(), 4, "1 was closed and is reopened");
        let mut b = [0u8];
        c.get(1, &paths[1])
            .unwrap()
            .read_exact_at(&mut b, 0)
            .unwrap();
        assert_eq!(b, [1]);
    }

    #[test]
    fn a_borrowed_handle_stays_open_until_its_read_ends() {
        let (fs, paths) = setup(3);
        let c = SegmentFiles::new(Arc::new(fs), 1);
        let held = c.get(0, &paths[0]).unwrap();
        c.get(1, &paths[1]).unwrap();
        assert_eq!((c.cached(), c.open_files()), (1, 2));
        drop(held);
        assert_eq!(c.open_files(), 1);
        c.evict(1);
        assert_eq!((c.cached(), c.open_files()), (0, 0));
        c.get(2, &paths[2]).unwrap();
        assert_eq!((c.cached(), c.open_files()), (1, 1));
    }
}
