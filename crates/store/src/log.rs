//! The shared log: a handle ([`Store`]) that callers use from any thread, and one dedicated
//! storage thread that owns all writes.
//!
//! # Write path (group commit)
//!
//! `append` encodes the record on the caller's thread (the payload copy happens there),
//! then, under the submission lock, assigns the next dense offset and a non-decreasing
//! timestamp, lets the caller add index hints (`append_with`), finishes length and CRC, and
//! queues the bytes with the callback. The storage thread takes *everything* queued at once,
//! writes it with one `write_all_at`, issues one `fdatasync` (policy `Always`), publishes
//! the new readable end, then fires the callbacks in offset order. Under load the queue
//! fills while the previous fsync runs, so one fsync covers many records.
//!
//! # Bounds and back-pressure
//!
//! The queue holds at most `queue_records_max` records and `queue_bytes_max` bytes
//! (a single record larger than that is admitted alone). `append` blocks the calling thread
//! while the queue is full; `try_append` never blocks and hands the record back
//! ([`TryAppendError::Full`]). While the storage thread writes one batch, the next one
//! queues, so at most twice the queue limits are in memory.
//!
//! # Invariants
//!
//! - offsets are dense and assigned in submission-lock order, which is also file order;
//! - a callback reports `Ok(offset)` only once the record meets the fsync policy, and
//!   `committed_offset()` already covers it when the callback runs;
//! - the first write or fsync error is sticky (fail-stop): queued and later records fail
//!   with [`StoreError::Failed`]; nothing is reported durable after it;
//! - only the last segment is written; sealed segments are fsynced and have a `.idx`;
//! - only the last segment and the one sealed last hold their files open; older ones are
//!   opened by the reads that need them, through a cache of at most `open_segments_max`
//!   handles (`files.rs`); a read that finds the file of a segment retention deleted gone
//!   reports `OffsetOutOfRange`, as for any deleted record.
//!
//! Callbacks run on the storage thread: they must be quick and must not block (send on a
//! channel, complete a oneshot). A panicking callback is caught and logged.

use std::collections::BTreeMap;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::error::{StoreError, TryAppendError};
use crate::files::{SegmentFiles, OPEN_SEGMENTS_MAX_DEFAULT};
use crate::fs::{Fs, LogFile, StdFs};
use crate::record::{self, IndexHint, PartialRecord, Record, RecordIn};
use crate::segment::{self, Cursor, HeaderState, SegState, Segment, SEGMENT_HEADER_LEN};
use crate::stats::LogStats;

/// Completion of an append: `Ok(offset)` once the record meets the fsync policy, or the
/// error that prevented it. Runs on the storage thread; must not block.
pub type Callback = Box<dyn FnOnce(Result<u64, StoreError>) + Send + 'static>;

/// Under [`FsyncPolicy::Always`], how long a record nobody waits for (appended without a
/// callback: a QoS 0 publish) may stay written but not fsynced, waiting for a record someone
/// waits for to share the fsync. A stream of QoS 0 messages alone costs at most one fsync per
/// this period instead of one per write.
pub const QUIET_SYNC_MAX: Duration = Duration::from_millis(10);

/// When a record counts as durable (see `docs/durability.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FsyncPolicy {
    /// Callbacks fire after an `fdatasync` that covers the record (group commit).
    #[default]
    Always,
    /// Callbacks fire after the write (page cache); the file is fsynced at most this long
    /// after a write.
    Interval(Duration),
    /// Callbacks fire after the write; fsync only at segment roll, `sync()` and close.
    Never,
}

/// Options of [`Store::open`]. `StoreOptions::new(dir)` gives the defaults.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Data directory; the log lives in `<data_dir>/log`.
    pub data_dir: PathBuf,
    /// File system (real by default; tests pass a [`crate::MemFs`]).
    pub fs: Arc<dyn Fs>,
    /// Durability policy. Default `Always`.
    pub fsync: FsyncPolicy,
    /// A segment is rolled before it would exceed this size. Default 64 MiB.
    pub segment_bytes_max: u64,
    /// Largest encoded record accepted. Default 16 MiB.
    pub record_bytes_max: usize,
    /// Most records waiting for the storage thread. Default 16384.
    pub queue_records_max: usize,
    /// Most bytes waiting for the storage thread. Default 64 MiB.
    pub queue_bytes_max: usize,
    /// One sparse index entry per this many bytes of records. Default 4 KiB.
    pub index_interval_bytes: u64,
    /// Read buffer of a [`LogReader`] / `read`. Default 64 KiB.
    pub read_buffer_bytes: usize,
    /// On corruption before the tail, truncate there (dropping everything after, including
    /// later segments) instead of refusing to open. Default false.
    pub truncate_corrupt: bool,
    /// Retention: delete front segments whose newest record is older than this.
    pub retention_max_age: Option<Duration>,
    /// Retention: delete front segments while the log is larger than this.
    pub retention_max_bytes: Option<u64>,
    /// First offset of a log that has no segment yet (cluster mode: a node joining a
    /// cluster whose log no longer starts at 0). Ignored when segments exist. Default 0.
    pub base_offset: u64,
    /// Sealed segments whose files are kept open for reads, at most (least recently used
    /// closed first; the active segment and the one sealed last are open on top of these).
    /// Default 64.
    pub open_segments_max: usize,
}

impl StoreOptions {
    /// Defaults for a data directory on the real file system.
    pub fn new(data_dir: impl Into<PathBuf>) -> StoreOptions {
        StoreOptions {
            data_dir: data_dir.into(),
            fs: Arc::new(StdFs),
            fsync: FsyncPolicy::Always,
            segment_bytes_max: 64 << 20,
            record_bytes_max: 16 << 20,
            queue_records_max: 16_384,
            queue_bytes_max: 64 << 20,
            index_interval_bytes: 4096,
            read_buffer_bytes: 64 << 10,
            truncate_corrupt: false,
            retention_max_age: None,
            retention_max_bytes: None,
            base_offset: 0,
            open_segments_max: OPEN_SEGMENTS_MAX_DEFAULT,
        }
    }

    fn validate(&self) -> Result<(), StoreError> {
        let bad = |m: &str| Err(StoreError::InvalidOptions(m.to_owned()));
        if self.segment_bytes_max < 512 {
            return bad("segment_bytes_max must be at least 512");
        }
        if self.record_bytes_max < record::RECORD_HEADER_LEN + record::RECORD_BODY_MIN
            || self.record_bytes_max > record::RECORD_BODY_HARD_MAX
        {
            return bad("record_bytes_max out of range");
        }
        if self.queue_records_max == 0 || self.queue_bytes_max == 0 {
            return bad("queue_records_max and queue_bytes_max must be positive");
        }
        if self.index_interval_bytes == 0 || self.read_buffer_bytes < 512 {
            return bad("index_interval_bytes must be positive and read_buffer_bytes >= 512");
        }
        if self.open_segments_max == 0 {
            return bad("open_segments_max must be at least 1");
        }
        if let FsyncPolicy::Interval(d) = self.fsync {
            if d.is_zero() {
                return bad("fsync interval must be positive (use Always)");
            }
        }
        Ok(())
    }
}

/// A cut made at open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    /// Segment file.
    pub segment: PathBuf,
    /// Byte position of the cut (the new file length).
    pub position: u64,
    /// Bytes removed from that file.
    pub bytes_cut: u64,
    /// Why the bytes there were not a valid record.
    pub reason: String,
}

/// What [`Store::open`] found and did.
#[derive(Debug, Clone, Default)]
pub struct RecoveryReport {
    /// Segments after recovery.
    pub segments: usize,
    /// First offset stored.
    pub first_offset: u64,
    /// Next offset to be assigned (= number of records ever appended and kept).
    pub next_offset: u64,
    /// Segments read record by record (the last one, and sealed ones without a valid `.idx`).
    pub scanned_segments: usize,
    /// Bytes read by those scans.
    pub scanned_bytes: u64,
    /// A torn tail cut at the end of the last segment.
    pub torn_tail: Option<Cut>,
    /// Corruption before the tail cut because `truncate_corrupt` was set.
    pub corruption_cut: Option<Cut>,
    /// Segment files removed because they followed the corruption cut.
    pub segments_removed: Vec<PathBuf>,
    /// `.idx` files rewritten because they were missing or did not match.
    pub rebuilt_indexes: Vec<PathBuf>,
    /// Wall time of the recovery.
    pub elapsed: Duration,
}

/// What [`Store::apply_retention`] deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// Deleted segment files.
    pub deleted: Vec<PathBuf>,
    /// Records in them.
    pub records_deleted: u64,
    /// Bytes freed.
    pub bytes_freed: u64,
    /// First offset after retention.
    pub first_offset: u64,
    /// True when retention wanted to delete more but the pinned offset stopped it.
    pub blocked_by_pin: bool,
}

enum Item {
    Record {
        offset: u64,
        ts: u64,
        bytes: Vec<u8>,
        cb: Option<Callback>,
    },
    Sync(Callback),
}

#[derive(Default)]
struct Queue {
    items: Vec<Item>,
    records: usize,
    bytes: usize,
    next_offset: u64,
    last_ts: u64,
    failed: Option<StoreError>,
    closing: bool,
    /// The storage thread waits on `not_empty`: an appender must wake it. (A condition
    /// variable's notify is a system call even with nobody waiting; at hundreds of thousands
    /// of appends a second it was one of the largest costs of a QoS 0 publish.)
    writer_waiting: bool,
    /// Appenders blocked on `not_full`.
    full_waiters: usize,
}

#[derive(Debug, Clone, Copy)]
struct Limits {
    fsync: FsyncPolicy,
    segment_bytes_max: u64,
    record_bytes_max: usize,
    queue_records_max: usize,
    queue_bytes_max: usize,
    index_interval_bytes: u64,
    read_buffer_bytes: usize,
    retention_max_age: Option<Duration>,
    retention_max_bytes: Option<u64>,
}

struct Shared {
    fs: Arc<dyn Fs>,
    log_dir: PathBuf,
    limits: Limits,
    q: Mutex<Queue>,
    not_empty: Condvar,
    not_full: Condvar,
    segments: RwLock<Vec<Arc<Segment>>>,
    /// Open handles of sealed segments (bounded LRU).
    files: Arc<SegmentFiles>,
    /// Exclusive end of the records that met the fsync policy (readable).
    committed: AtomicU64,
    retention: Mutex<()>,
    stats: LogStats,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// µs since the Unix epoch.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Shared {
    fn segments(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<Segment>>> {
        self.segments.read().unwrap_or_else(|p| p.into_inner())
    }

    fn first_offset(&self) -> u64 {
        self.segments().first().map_or(0, |s| s.first_offset)
    }

    fn segment_for(&self, offset: u64) -> Result<Arc<Segment>, StoreError> {
        let committed = self.committed.load(Ordering::Acquire);
        let segs = self.segments();
        let first = segs.first().map_or(0, |s| s.first_offset);
        if offset < first || offset >= committed {
            return Err(StoreError::OffsetOutOfRange {
                offset,
                first,
                next: committed,
            });
        }
        let i = segs.partition_point(|s| s.first_offset <= offset);
        // i >= 1 because offset >= first.
        Ok(segs[i.saturating_sub(1)].clone())
    }

    /// `e`, a failed read of `offset` in `seg`, as the caller should see it: once retention
    /// deleted the segment, its file may be closed and gone, and the record is out of range
    /// like any other deleted one.
    fn read_error(&self, seg: &Segment, offset: u64, e: StoreError) -> StoreError {
        if seg.is_deleted() {
            StoreError::OffsetOutOfRange {
                offset,
                first: self.first_offset(),
                next: self.committed.load(Ordering::Acquire),
            }
        } else {
            e
        }
    }
}

struct Inner {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = close_inner(&self.shared, &self.thread);
    }
}

/// Handle to the shared log. Cheap to clone; every clone talks to the same storage thread.
/// Dropping the last clone closes the store (flush, fsync, join).
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("log_dir", &self.inner.shared.log_dir)
            .field("committed", &self.committed_offset())
            .finish_non_exhaustive()
    }
}

fn close_inner(shared: &Shared, thread: &Mutex<Option<JoinHandle<()>>>) -> Result<(), StoreError> {
    {
        let mut q = lock(&shared.q);
        q.closing = true;
    }
    shared.not_empty.notify_all();
    shared.not_full.notify_all();
    let handle = lock(thread).take();
    if let Some(h) = handle {
        if h.thread().id() == std::thread::current().id() {
            // The last handle was dropped inside a completion callback: the storage thread
            // exits by itself after this batch (closing is set); it cannot join itself.
            return Ok(());
        }
        if h.join().is_err() {
            return Err(StoreError::Failed(Box::new(StoreError::InvalidOptions(
                "storage thread panicked".into(),
            ))));
        }
    }
    match &lock(&shared.q).failed {
        Some(e) => Err(StoreError::Failed(Box::new(e.clone()))),
        None => Ok(()),
    }
}

impl Store {
    /// Opens (or creates) the log in `<data_dir>/log`, recovers it and starts the storage
    /// thread.
    pub fn open(opts: StoreOptions) -> Result<(Store, RecoveryReport), StoreError> {
        opts.validate()?;
        let started = Instant::now();
        let log_dir = opts.data_dir.join("log");
        let files = Arc::new(SegmentFiles::new(opts.fs.clone(), opts.open_segments_max));
        let (segments, mut report, last_ts) = recover(&*opts.fs, &log_dir, &opts, &files)?;
        report.elapsed = started.elapsed();
        let tail = segments
            .last()
            .cloned()
            .ok_or_else(|| StoreError::InvalidOptions("recovery produced no segment".into()))?;
        let tail_state = tail.state();
        let tail_file = tail.file()?;
        let next = tail_state.next_offset;
        let limits = Limits {
            fsync: opts.fsync,
            segment_bytes_max: opts.segment_bytes_max,
            record_bytes_max: opts.record_bytes_max,
            queue_records_max: opts.queue_records_max,
            queue_bytes_max: opts.queue_bytes_max,
            index_interval_bytes: opts.index_interval_bytes,
            read_buffer_bytes: opts.read_buffer_bytes,
            retention_max_age: opts.retention_max_age,
            retention_max_bytes: opts.retention_max_bytes,
        };
        let shared = Arc::new(Shared {
            fs: opts.fs.clone(),
            log_dir,
            limits,
            q: Mutex::new(Queue {
                next_offset: next,
                last_ts,
                ..Queue::default()
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
            segments: RwLock::new(segments),
            files,
            committed: AtomicU64::new(next),
            retention: Mutex::new(()),
            stats: LogStats::default(),
        });
        let writer = Writer {
            shared: shared.clone(),
            write_pos: tail_state.len,
            tail,
            tail_file,
            sealed_last: None,
            pending: Vec::new(),
            buf: Vec::new(),
            dirty: false,
            last_sync: Instant::now(),
        };
        let thread = std::thread::Builder::new()
            .name("lanemq-store".into())
            .spawn(move || writer.run())
            .map_err(|e| StoreError::io("spawn storage thread", &opts.data_dir, e))?;
        if let Some(c) = &report.torn_tail {
            tracing::warn!(segment = %c.segment.display(), position = c.position, bytes_cut = c.bytes_cut,
                reason = %c.reason, "log recovery truncated a torn tail");
        }
        if let Some(c) = &report.corruption_cut {
            tracing::error!(segment = %c.segment.display(), position = c.position, bytes_cut = c.bytes_cut,
                reason = %c.reason, removed = report.segments_removed.len(),
                "log recovery truncated at corruption (truncate_corrupt)");
        }
        tracing::info!(
            segments = report.segments,
            first = report.first_offset,
            next = report.next_offset,
            elapsed_ms = report.elapsed.as_millis() as u64,
            "log opened"
        );
        Ok((
            Store {
                inner: Arc::new(Inner {
                    shared,
                    thread: Mutex::new(Some(thread)),
                }),
            },
            report,
        ))
    }

    fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    /// Appends a record; returns its offset at once. `on_durable` fires once it meets the
    /// fsync policy (or with the error that prevented it). Blocks the calling thread only
    /// while the submission queue is full. On `Err`, the callback is dropped uncalled.
    pub fn append(&self, rec: RecordIn, on_durable: Callback) -> Result<u64, StoreError> {
        self.append_with(rec, |_, _| {}, on_durable)
    }

    /// Like [`Store::append`] but never blocks: a full queue returns
    /// [`TryAppendError::Full`] with the record and callback handed back. Without a callback
    /// nobody waits for the record: under `FsyncPolicy::Always` its fsync may wait up to
    /// [`QUIET_SYNC_MAX`] for a record someone waits for (it is readable only once fsynced,
    /// like every record under that policy).
    pub fn try_append(
        &self,
        rec: RecordIn,
        on_durable: Option<Callback>,
    ) -> Result<u64, TryAppendError> {
        self.submit(rec, |_, _| {}, on_durable, false)
    }

    /// [`Store::try_append`] with an `assign` closure as in [`Store::append_with`].
    pub fn try_append_with(
        &self,
        rec: RecordIn,
        assign: impl FnOnce(u64, &mut Vec<IndexHint>),
        on_durable: Option<Callback>,
    ) -> Result<u64, TryAppendError> {
        self.submit(rec, assign, on_durable, false)
    }

    /// Like [`Store::append`], and `assign(offset, hints)` runs under the append lock with
    /// the offset being assigned, so a caller can hand out per-lane sequence numbers in log
    /// order and store them in the record. `assign` must be quick and must not call the store.
    pub fn append_with(
        &self,
        rec: RecordIn,
        assign: impl FnOnce(u64, &mut Vec<IndexHint>),
        on_durable: Callback,
    ) -> Result<u64, StoreError> {
        self.append_blocking(rec, assign, Some(on_durable))
    }

    /// [`Store::append_with`] where nobody may wait (`on_durable` `None`), as in
    /// [`Store::try_append`].
    pub fn append_blocking(
        &self,
        rec: RecordIn,
        assign: impl FnOnce(u64, &mut Vec<IndexHint>),
        on_durable: Option<Callback>,
    ) -> Result<u64, StoreError> {
        match self.submit(rec, assign, on_durable, true) {
            Ok(o) => Ok(o),
            Err(TryAppendError::Store(e)) => Err(e),
            // Unreachable with block = true; map defensively.
            Err(TryAppendError::Full(..)) => Err(StoreError::Closed),
        }
    }

    fn submit(
        &self,
        rec: RecordIn,
        assign: impl FnOnce(u64, &mut Vec<IndexHint>),
        cb: Option<Callback>,
        block: bool,
    ) -> Result<u64, TryAppendError> {
        let sh = self.shared();
        let lim = sh.limits;
        let est = rec.encoded_len();
        if est > lim.record_bytes_max {
            return Err(TryAppendError::Store(StoreError::RecordTooLarge {
                len: est,
                max: lim.record_bytes_max,
            }));
        }
        // Encode outside the lock (the payload copy is the expensive part). Should the queue
        // turn out to be full, a non-blocking caller gets the record back and this is lost
        // work; one lock per append matters more (the appenders of every connection and the
        // storage thread share it).
        let ts_in = rec.timestamp_us;
        let partial = PartialRecord::encode(&rec);
        let mut q = lock(&sh.q);
        loop {
            if let Some(e) = &q.failed {
                return Err(TryAppendError::Store(StoreError::Failed(Box::new(
                    e.clone(),
                ))));
            }
            if q.closing {
                return Err(TryAppendError::Store(StoreError::Closed));
            }
            let recs = q.records;
            if recs < lim.queue_records_max && (recs == 0 || q.bytes + est <= lim.queue_bytes_max) {
                break;
            }
            sh.stats.append_waits.fetch_add(1, Ordering::Relaxed);
            if !block {
                return Err(TryAppendError::Full(Box::new(rec), cb));
            }
            q.full_waiters += 1;
            q = sh.not_full.wait(q).unwrap_or_else(|p| p.into_inner());
            q.full_waiters -= 1;
        }
        let refuse = |q: MutexGuard<'_, Queue>, e: StoreError| {
            drop(q);
            Err(TryAppendError::Store(e))
        };
        let mut partial = match partial {
            Ok(p) => p,
            Err(why) => return refuse(q, StoreError::InvalidRecord(why)),
        };
        let offset = q.next_offset;
        assign(offset, partial.hints_mut());
        let len = partial.finished_len(0);
        if len > lim.record_bytes_max {
            let max = lim.record_bytes_max;
            return refuse(q, StoreError::RecordTooLarge { len, max });
        }
        let ts = ts_in.unwrap_or_else(now_us).max(q.last_ts);
        let bytes = match partial.finish(offset, ts) {
            Ok(b) => b,
            Err(why) => return refuse(q, StoreError::InvalidRecord(why)),
        };
        q.next_offset = offset + 1;
        q.last_ts = ts;
        q.records += 1;
        q.bytes += bytes.len();
        q.items.push(Item::Record {
            offset,
            ts,
            bytes,
            cb,
        });
        let wake = q.writer_waiting;
        drop(q);
        if wake {
            sh.not_empty.notify_one();
        }
        drop(rec);
        Ok(offset)
    }

    /// Appends several records with consecutive offsets; `on_durable` fires once for the
    /// whole batch with the last offset. Returns the offsets. Blocks while the queue is full.
    pub fn append_batch(
        &self,
        recs: Vec<RecordIn>,
        on_durable: Callback,
    ) -> Result<Range<u64>, StoreError> {
        self.batch(&recs, &mut Some(on_durable), true)?
            .ok_or(StoreError::Closed)
    }

    /// Appends several records with consecutive offsets under one lock; `on_durable` (if
    /// any) fires once for them all, with the last offset. Never blocks: `Ok(None)` when the
    /// queue has no room for them (nothing was appended, and `on_durable` is left in place).
    pub fn try_append_records(
        &self,
        recs: &[RecordIn],
        on_durable: &mut Option<Callback>,
    ) -> Result<Option<Range<u64>>, StoreError> {
        self.batch(recs, on_durable, false)
    }

    /// [`Store::try_append_records`], waiting while the queue is full.
    pub fn append_records(
        &self,
        recs: &[RecordIn],
        on_durable: Option<Callback>,
    ) -> Result<Range<u64>, StoreError> {
        self.batch(recs, &mut { on_durable }, true)?
            .ok_or(StoreError::Closed)
    }

    /// Appends several records nobody waits for (as [`Store::try_append`] without a
    /// callback) with consecutive offsets, under one lock. Never blocks: `Ok(None)` when the
    /// queue has no room for them (nothing was appended).
    pub fn try_append_quiet_batch(
        &self,
        recs: &[RecordIn],
    ) -> Result<Option<Range<u64>>, StoreError> {
        self.batch(recs, &mut None, false)
    }

    /// [`Store::try_append_quiet_batch`], waiting while the queue is full.
    pub fn append_quiet_batch(&self, recs: &[RecordIn]) -> Result<Range<u64>, StoreError> {
        self.batch(recs, &mut None, true)?.ok_or(StoreError::Closed)
    }

    fn batch(
        &self,
        recs: &[RecordIn],
        on_durable: &mut Option<Callback>,
        block: bool,
    ) -> Result<Option<Range<u64>>, StoreError> {
        let sh = self.shared();
        let lim = sh.limits;
        if recs.is_empty() {
            return Err(StoreError::InvalidRecord("empty batch"));
        }
        let mut parts = Vec::with_capacity(recs.len());
        let mut total = 0usize;
        for r in recs {
            let est = r.encoded_len();
            if est > lim.record_bytes_max {
                return Err(StoreError::RecordTooLarge {
                    len: est,
                    max: lim.record_bytes_max,
                });
            }
            total += est;
            let ts = r.timestamp_us;
            parts.push((
                ts,
                PartialRecord::encode(r).map_err(StoreError::InvalidRecord)?,
            ));
        }
        let n = parts.len();
        let mut q = lock(&sh.q);
        loop {
            if let Some(e) = &q.failed {
                return Err(StoreError::Failed(Box::new(e.clone())));
            }
            if q.closing {
                return Err(StoreError::Closed);
            }
            let recs = q.records;
            let bytes = q.bytes;
            if recs == 0
                || (recs + n <= lim.queue_records_max && bytes + total <= lim.queue_bytes_max)
            {
                break;
            }
            sh.stats.append_waits.fetch_add(1, Ordering::Relaxed);
            if !block {
                return Ok(None);
            }
            q.full_waiters += 1;
            q = sh.not_full.wait(q).unwrap_or_else(|p| p.into_inner());
            q.full_waiters -= 1;
        }
        let first = q.next_offset;
        let mut cb = on_durable.take();
        let mut items = Vec::with_capacity(n);
        let mut last_ts = q.last_ts;
        let mut bytes_total = 0;
        // One clock read for the records of the batch that have no timestamp of their own.
        let mut now = None;
        for (i, (ts_in, p)) in parts.into_iter().enumerate() {
            let offset = first + i as u64;
            let ts = ts_in
                .unwrap_or_else(|| *now.get_or_insert_with(now_us))
                .max(last_ts);
            // Nothing is queued unless every record of the batch is.
            let bytes = p.finish(offset, ts).map_err(StoreError::InvalidRecord)?;
            last_ts = ts;
            bytes_total += bytes.len();
            items.push(Item::Record {
                offset,
                ts,
                bytes,
                cb: if i + 1 == n { cb.take() } else { None },
            });
        }
        q.last_ts = last_ts;
        q.records += n;
        q.bytes += bytes_total;
        q.items.append(&mut items);
        q.next_offset = first + n as u64;
        let wake = q.writer_waiting;
        drop(q);
        if wake {
            sh.not_empty.notify_one();
        }
        Ok(Some(first..first + n as u64))
    }

    /// Reads one record (CRC-checked). Only offsets in `first_offset()..committed_offset()`.
    pub fn read(&self, offset: u64) -> Result<Record, StoreError> {
        let sh = self.shared();
        let seg = sh.segment_for(offset)?;
        let path = seg.path.clone();
        let raw = Cursor::seek(
            seg.clone(),
            offset,
            sh.limits.index_interval_bytes as usize + 4096,
        )
        .and_then(|mut c| Ok((c.pos, c.next_raw()?)));
        let (pos, raw) = raw.map_err(|e| sh.read_error(&seg, offset, e))?;
        match raw {
            Some(raw) => {
                record::decode_record(raw).map_err(|why| StoreError::corrupt(path, pos, why))
            }
            None => Err(StoreError::OffsetOutOfRange {
                offset,
                first: sh.first_offset(),
                next: sh.committed.load(Ordering::Acquire),
            }),
        }
    }

    /// A reader from `from_offset` (clamped up to `first_offset()`), iterating in batches
    /// with a bounded buffer. It stops at the committed end and resumes from there when
    /// called again (it follows the tail).
    pub fn reader(&self, from_offset: u64) -> LogReader {
        LogReader {
            shared: self.inner.shared.clone(),
            next: from_offset.max(self.first_offset()),
            cursor: None,
        }
    }

    /// First offset whose timestamp is `>= ts_us` (or `committed_offset()` if none): where a
    /// stream replay "from a time" starts. Timestamps are non-decreasing along the log.
    pub fn seek_timestamp(&self, ts_us: u64) -> Result<u64, StoreError> {
        let sh = self.shared();
        let segs: Vec<Arc<Segment>> = sh.segments().clone();
        for seg in segs {
            let st = seg.state();
            if st.next_offset == seg.first_offset || st.max_ts < ts_us {
                continue;
            }
            let found = Cursor::seek_time(seg.clone(), ts_us, sh.limits.read_buffer_bytes)
                .and_then(|mut c| Ok(c.next_raw()?.map(|_| c.offset - 1)));
            match found {
                Ok(Some(o)) => return Ok(o),
                Ok(None) => {}
                // Deleted by retention meanwhile: the answer is in a later segment.
                Err(_) if seg.is_deleted() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(sh.committed.load(Ordering::Acquire))
    }

    /// The log's directory (`<data_dir>/log`).
    pub fn log_dir(&self) -> &Path {
        &self.inner.shared.log_dir
    }

    /// First offset still stored.
    pub fn first_offset(&self) -> u64 {
        self.shared().first_offset()
    }

    /// Next offset to be assigned.
    pub fn next_offset(&self) -> u64 {
        lock(&self.shared().q).next_offset
    }

    /// Exclusive end of the records that met the fsync policy; they are readable.
    pub fn committed_offset(&self) -> u64 {
        self.shared().committed.load(Ordering::Acquire)
    }

    /// Records waiting for the storage thread.
    pub fn queued_records(&self) -> usize {
        lock(&self.shared().q).records
    }

    /// The sticky error, if the store has failed.
    pub fn failure(&self) -> Option<StoreError> {
        lock(&self.shared().q).failed.clone()
    }

    /// Total bytes of all segments (readable part).
    pub fn size_bytes(&self) -> u64 {
        self.shared().segments().iter().map(|s| s.bounds().1).sum()
    }

    /// What the storage thread did since open: appends, batches, fsyncs and their latency.
    pub fn stats(&self) -> &LogStats {
        &self.shared().stats
    }

    /// Number of segment files.
    pub fn segment_count(&self) -> usize {
        self.shared().segments().len()
    }

    /// Sealed segments whose files were opened for reads and are open now (in the cache of at
    /// most `open_segments_max`, or borrowed by a read in progress). The active segment's file
    /// and the one sealed last are open on top of these.
    pub fn open_segment_files(&self) -> usize {
        self.shared().files.open_files()
    }

    /// Sealed segment files opened by reads since the store opened (cache misses).
    pub fn segment_files_opened(&self) -> u64 {
        self.shared().files.opened()
    }

    /// Blocks until everything appended before the call is written and fsynced, whatever
    /// the policy.
    pub fn sync(&self) -> Result<(), StoreError> {
        let sh = self.shared();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        {
            let mut q = lock(&sh.q);
            if let Some(e) = &q.failed {
                return Err(StoreError::Failed(Box::new(e.clone())));
            }
            if q.closing {
                return Err(StoreError::Closed);
            }
            q.items.push(Item::Sync(Box::new(move |r| {
                let _ = tx.send(r);
            })));
        }
        sh.not_empty.notify_one();
        match rx.recv() {
            Ok(r) => r.map(|_| ()),
            Err(_) => Err(StoreError::Closed),
        }
    }

    /// Stops accepting appends, writes and fsyncs everything queued, joins the storage
    /// thread. Returns the sticky error if the store had failed. Idempotent.
    pub fn close(&self) -> Result<(), StoreError> {
        close_inner(&self.inner.shared, &self.inner.thread)
    }

    /// The offset below which [`Store::apply_retention`] would delete the log now if nothing
    /// pinned it: the end of the last segment the limits ask to delete, or the first offset
    /// when they ask for nothing. Callers move what still references records below it
    /// elsewhere before they let retention go that far.
    pub fn retention_cut(&self, now_us: u64) -> u64 {
        let (victims, _) = self.retention_victims(now_us, u64::MAX);
        victims
            .last()
            .map_or_else(|| self.shared().first_offset(), |s| s.state().next_offset)
    }

    /// The segments the limits ask to delete, front first, stopping at the first one that
    /// holds a record at or above `pinned_min_offset` (then `true`). Never the last segment.
    fn retention_victims(&self, now_us: u64, pinned_min_offset: u64) -> (Vec<Arc<Segment>>, bool) {
        let sh = self.shared();
        let lim = sh.limits;
        let segs = sh.segments();
        let mut total: u64 = segs.iter().map(|s| s.bounds().1).sum();
        let mut v = Vec::new();
        for s in segs.iter().take(segs.len().saturating_sub(1)) {
            let st = s.state();
            let too_old = lim
                .retention_max_age
                .is_some_and(|a| st.max_ts.saturating_add(a.as_micros() as u64) < now_us);
            let too_big = lim.retention_max_bytes.is_some_and(|m| total > m);
            if !(too_old || too_big) {
                break;
            }
            if st.next_offset > pinned_min_offset {
                return (v, true);
            }
            total -= st.len;
            v.push(s.clone());
        }
        (v, false)
    }

    /// Deletes whole segments from the front of the log while the retention limits
    /// (`retention_max_age`, `retention_max_bytes`) ask for it and every record in the
    /// segment is below `pinned_min_offset` (the lowest offset anything still references:
    /// streams, lanes, sessions, retained messages, the index watermark). The last segment
    /// is never deleted. Safe to call from any thread; blocking I/O.
    pub fn apply_retention(
        &self,
        now_us: u64,
        pinned_min_offset: u64,
    ) -> Result<RetentionReport, StoreError> {
        let sh = self.shared();
        let _one = lock(&sh.retention);
        let mut report = RetentionReport::default();
        let (victims, blocked) = self.retention_victims(now_us, pinned_min_offset);
        report.blocked_by_pin = blocked;
        for s in victims {
            let st = s.state();
            // Marked first: a read that misses the cache from now on reports the record gone.
            s.set_deleted(true);
            if let Err(e) = sh.fs.remove(&s.path) {
                s.set_deleted(false);
                return Err(StoreError::io("remove segment", &s.path, e));
            }
            // Close its handle (a read in progress keeps its own until it ends).
            s.unpin();
            sh.files.evict(s.first_offset);
            {
                let mut segs = sh.segments.write().unwrap_or_else(|p| p.into_inner());
                debug_assert!(segs.first().is_some_and(|f| Arc::ptr_eq(f, &s)));
                segs.remove(0);
            }
            let idx = sh.log_dir.join(segment::idx_file_name(s.first_offset));
            let _ = sh.fs.remove(&idx);
            // One directory fsync per segment: a crash must never leave a later segment
            // deleted and an earlier one back (that would be a gap at the next open).
            sh.fs
                .sync_dir(&sh.log_dir)
                .map_err(|e| StoreError::io("fsync directory", &sh.log_dir, e))?;
            report.records_deleted += st.next_offset - s.first_offset;
            report.bytes_freed += st.len;
            report.deleted.push(s.path.clone());
        }
        report.first_offset = sh.first_offset();
        Ok(report)
    }
}

// ---------------------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------------------

/// Iterates records from an offset, in order, across segments, holding at most one read
/// buffer (`read_buffer_bytes`, or one record if larger).
pub struct LogReader {
    shared: Arc<Shared>,
    next: u64,
    cursor: Option<Cursor>,
}

impl std::fmt::Debug for LogReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogReader")
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl LogReader {
    /// Offset of the next record this reader returns.
    pub fn next_offset(&self) -> u64 {
        self.next
    }

    /// The next record, or `None` when caught up with the committed end. Fails with
    /// `OffsetOutOfRange` if retention deleted the reader's position.
    pub fn next_record(&mut self) -> Result<Option<Record>, StoreError> {
        let committed = self.shared.committed.load(Ordering::Acquire);
        if self.next >= committed {
            return Ok(None);
        }
        loop {
            if self.cursor.is_none() {
                let seg = self.shared.segment_for(self.next)?;
                let c = Cursor::seek(seg.clone(), self.next, self.shared.limits.read_buffer_bytes)
                    .map_err(|e| self.shared.read_error(&seg, self.next, e))?;
                self.cursor = Some(c);
            }
            let Some(c) = self.cursor.as_mut() else {
                continue;
            };
            debug_assert_eq!(c.offset, self.next);
            let pos = c.pos;
            let raw = match c.next_raw() {
                Ok(raw) => raw,
                Err(e) => {
                    let e = self.shared.read_error(&c.seg, self.next, e);
                    self.cursor = None;
                    return Err(e);
                }
            };
            match raw {
                Some(raw) => {
                    let path = &c.seg.path;
                    let rec = record::decode_record(raw)
                        .map_err(|why| StoreError::corrupt(path, pos, why))?;
                    self.next += 1;
                    return Ok(Some(rec));
                }
                None => {
                    // End of this segment's readable part.
                    let seg_next = c.seg.bounds().0;
                    if self.next < seg_next {
                        continue; // more became readable in this segment
                    }
                    let committed = self.shared.committed.load(Ordering::Acquire);
                    if self.next >= committed {
                        return Ok(None); // caught up; keep the cursor for the tail
                    }
                    self.cursor = None; // the rest is in a later segment
                }
            }
        }
    }

    /// Up to `max_records` records and about `max_bytes` of payload (at least one record
    /// if any is available). Empty when caught up.
    pub fn next_batch(
        &mut self,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        while out.len() < max_records && (out.is_empty() || bytes < max_bytes) {
            match self.next_record()? {
                Some(r) => {
                    bytes += r.payload.len() + r.topic.len();
                    out.push(r);
                }
                None => break,
            }
        }
        Ok(out)
    }
}

impl Iterator for LogReader {
    type Item = Result<Record, StoreError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}

// ---------------------------------------------------------------------------------------
// Storage thread
// ---------------------------------------------------------------------------------------

struct Writer {
    shared: Arc<Shared>,
    tail: Arc<Segment>,
    /// The tail's handle (the segment holds a clone for readers).
    tail_file: Arc<dyn LogFile>,
    /// The segment sealed last: it keeps its handle until the next roll.
    sealed_last: Option<Arc<Segment>>,
    /// Bytes written to the tail file (>= its readable length).
    write_pos: u64,
    /// Records written but not yet readable: (offset, position, len, ts).
    pending: Vec<(u64, u64, u64, u64)>,
    buf: Vec<u8>,
    dirty: bool,
    last_sync: Instant,
}

type Done = Vec<(Callback, u64)>;

fn fire(cb: Callback, r: Result<u64, StoreError>) {
    if catch_unwind(AssertUnwindSafe(move || cb(r))).is_err() {
        tracing::error!("store completion callback panicked");
    }
}

impl Writer {
    fn run(mut self) {
        loop {
            let (items, closing, failed, blocked) = {
                let mut q = lock(&self.shared.q);
                loop {
                    if !q.items.is_empty() || q.closing {
                        break;
                    }
                    match self.sync_deadline() {
                        Some(deadline) => {
                            let now = Instant::now();
                            if now >= deadline {
                                break;
                            }
                            q.writer_waiting = true;
                            q = self
                                .shared
                                .not_empty
                                .wait_timeout(q, deadline - now)
                                .map(|(g, _)| g)
                                .unwrap_or_else(|p| p.into_inner().0);
                            q.writer_waiting = false;
                        }
                        None => {
                            q.writer_waiting = true;
                            q = self
                                .shared
                                .not_empty
                                .wait(q)
                                .unwrap_or_else(|p| p.into_inner());
                            q.writer_waiting = false;
                        }
                    }
                }
                let items = std::mem::take(&mut q.items);
                q.records = 0;
                q.bytes = 0;
                (items, q.closing, q.failed.clone(), q.full_waiters > 0)
            };
            if blocked {
                self.shared.not_full.notify_all();
            }
            if let Some(e) = failed {
                fail_items(items, &e);
            } else if !items.is_empty() {
                self.process(items);
            } else if self.sync_deadline().is_some_and(|d| Instant::now() >= d) {
                match self.sync_tail() {
                    // Quiet records under `Always` become readable now.
                    Ok(()) => self.publish(),
                    Err(e) => self.set_failed(e),
                }
            }
            if closing {
                if self.dirty && lock(&self.shared.q).failed.is_none() {
                    if let Err(e) = self.sync_tail() {
                        self.set_failed(e);
                    }
                }
                return;
            }
        }
    }

    fn sync_deadline(&self) -> Option<Instant> {
        match self.shared.limits.fsync {
            FsyncPolicy::Interval(d) if self.dirty => Some(self.last_sync + d),
            // Quiet records written and not fsynced yet.
            FsyncPolicy::Always if self.dirty => Some(self.last_sync + QUIET_SYNC_MAX),
            _ => None,
        }
    }

    fn sync_tail(&mut self) -> Result<(), StoreError> {
        let t0 = Instant::now();
        self.tail_file
            .sync_data()
            .map_err(|e| StoreError::io("fsync", &self.tail.path, e))?;
        self.shared.stats.fsynced(t0.elapsed());
        self.dirty = false;
        self.last_sync = Instant::now();
        Ok(())
    }

    fn set_failed(&self, e: StoreError) {
        tracing::error!(error = %e, "storage failure: the log refuses writes from now on (fail-stop)");
        {
            let mut q = lock(&self.shared.q);
            if q.failed.is_none() {
                q.failed = Some(e);
            }
        }
        self.shared.not_full.notify_all();
    }

    fn process(&mut self, items: Vec<Item>) {
        let mut done: Done = Vec::with_capacity(items.len());
        let mut syncs: Vec<Callback> = Vec::new();
        let mut last_offset = None;
        let res = self.write_batch(items, &mut done, &mut syncs, &mut last_offset);
        match res {
            Ok(()) => {
                let committed = self.shared.committed.load(Ordering::Acquire);
                for (cb, off) in done {
                    debug_assert!(off < committed);
                    fire(cb, Ok(off));
                }
                for cb in syncs {
                    fire(cb, Ok(committed));
                }
            }
            Err(e) => {
                self.pending.clear();
                self.set_failed(e.clone());
                let f = StoreError::Failed(Box::new(e));
                for (cb, _) in done {
                    fire(cb, Err(f.clone()));
                }
                for cb in syncs {
                    fire(cb, Err(f.clone()));
                }
            }
        }
        if self.buf.capacity() > 8 << 20 {
            self.buf = Vec::new();
        }
    }

    fn write_batch(
        &mut self,
        items: Vec<Item>,
        done: &mut Done,
        syncs: &mut Vec<Callback>,
        last_offset: &mut Option<u64>,
    ) -> Result<(), StoreError> {
        let lim = self.shared.limits;
        let mut force_sync = false;
        // Callbacks are collected first so that on any error every one of them is failed.
        let mut records = Vec::with_capacity(items.len());
        for it in items {
            match it {
                Item::Record {
                    offset,
                    ts,
                    bytes,
                    cb,
                } => {
                    if let Some(cb) = cb {
                        done.push((cb, offset));
                    }
                    records.push((offset, ts, bytes));
                }
                Item::Sync(cb) => {
                    force_sync = true;
                    syncs.push(cb);
                }
            }
        }
        self.buf.clear();
        if !records.is_empty() {
            let bytes: usize = records.iter().map(|r| r.2.len()).sum();
            self.shared.stats.batch(records.len() as u64, bytes as u64);
        }
        for (offset, ts, bytes) in records {
            let len = bytes.len() as u64;
            let used = self.write_pos + self.buf.len() as u64;
            if used + len > lim.segment_bytes_max && used > SEGMENT_HEADER_LEN {
                self.flush_buf()?;
                self.roll()?;
            }
            let pos = self.write_pos + self.buf.len() as u64;
            self.pending.push((offset, pos, len, ts));
            self.buf.extend_from_slice(&bytes);
            *last_offset = Some(offset);
        }
        self.flush_buf()?;
        let sync_now = match lim.fsync {
            // Someone waits, or a quiet record has waited long enough.
            FsyncPolicy::Always => {
                force_sync || !done.is_empty() || self.last_sync.elapsed() >= QUIET_SYNC_MAX
            }
            FsyncPolicy::Interval(d) => force_sync || self.last_sync.elapsed() >= d,
            FsyncPolicy::Never => force_sync,
        };
        if sync_now && self.dirty {
            self.sync_tail()?;
        }
        if lim.fsync != FsyncPolicy::Always || !self.dirty {
            // Under `Always` a record is readable once fsynced (quiet ones wait here).
            self.publish();
        }
        Ok(())
    }

    fn flush_buf(&mut self) -> Result<(), StoreError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        debug_assert!(self.write_pos >= SEGMENT_HEADER_LEN);
        debug_assert!(
            matches!(
                record::check_header(&self.buf),
                record::Peek::Complete { .. }
            ),
            "a batch starts with a whole, CRC-valid record"
        );
        debug_assert!(
            self.write_pos + self.buf.len() as u64 <= self.shared.limits.segment_bytes_max
                || self.write_pos == SEGMENT_HEADER_LEN,
            "segment_bytes_max is respected unless a record is alone in its segment"
        );
        self.tail_file
            .write_all_at(&self.buf, self.write_pos)
            .map_err(|e| StoreError::io("write", &self.tail.path, e))?;
        self.write_pos += self.buf.len() as u64;
        self.buf.clear();
        self.dirty = true;
        Ok(())
    }

    /// Makes pending records of the tail readable.
    fn publish(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let interval = self.shared.limits.index_interval_bytes;
        let mut last = 0;
        {
            let mut st = self.tail.state.write().unwrap_or_else(|p| p.into_inner());
            for &(off, pos, len, ts) in &self.pending {
                st.push(off, pos, len, ts, interval);
                last = off;
            }
            debug_assert_eq!(st.len, self.write_pos);
        }
        self.pending.clear();
        self.shared.committed.store(last + 1, Ordering::Release);
    }

    /// Seals the tail (fsync, `.idx`) and starts the next segment.
    fn roll(&mut self) -> Result<(), StoreError> {
        self.sync_tail()?;
        self.shared
            .stats
            .segments_rolled
            .fetch_add(1, Ordering::Relaxed);
        self.publish();
        let st = self.tail.state();
        let dir = &self.shared.log_dir;
        let fs = &*self.shared.fs;
        let idx_path = dir.join(segment::idx_file_name(self.tail.first_offset));
        segment::write_atomically(
            fs,
            dir,
            &idx_path,
            &segment::encode_idx(self.tail.first_offset, &st),
        )?;
        let first = st.next_offset;
        let (seg, file) = create_segment(fs, dir, first, &self.shared.files)?;
        self.shared
            .segments
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(seg.clone());
        // The segment sealed before this one closes its file (reads reopen it through the
        // cache); this one keeps it until the next roll, for the readers of the tail.
        let sealed = std::mem::replace(&mut self.tail, seg);
        if let Some(older) = self.sealed_last.replace(sealed) {
            older.unpin();
        }
        self.tail_file = file;
        self.write_pos = SEGMENT_HEADER_LEN;
        tracing::debug!(first, "log segment rolled");
        Ok(())
    }
}

fn fail_items(items: Vec<Item>, e: &StoreError) {
    let f = StoreError::Failed(Box::new(e.clone()));
    for it in items {
        match it {
            Item::Record { cb: Some(cb), .. } | Item::Sync(cb) => fire(cb, Err(f.clone())),
            Item::Record { cb: None, .. } => {}
        }
    }
}

/// Creates a segment file with its header, durably (file fsync + directory fsync); returns
/// the (active) segment and its handle.
fn create_segment(
    fs: &dyn Fs,
    dir: &Path,
    first: u64,
    files: &Arc<SegmentFiles>,
) -> Result<(Arc<Segment>, Arc<dyn LogFile>), StoreError> {
    let path = dir.join(segment::segment_file_name(first));
    let file = fs
        .open(&path, true)
        .map_err(|e| StoreError::io("create", &path, e))?;
    file.set_len(0)
        .map_err(|e| StoreError::io("truncate", &path, e))?;
    file.write_all_at(&segment::encode_header(first), 0)
        .map_err(|e| StoreError::io("write", &path, e))?;
    file.sync_data()
        .map_err(|e| StoreError::io("fsync", &path, e))?;
    fs.sync_dir(dir)
        .map_err(|e| StoreError::io("fsync directory", dir, e))?;
    let seg = Segment::active(
        first,
        path,
        file.clone(),
        SegState {
            next_offset: first,
            len: SEGMENT_HEADER_LEN,
            ..SegState::default()
        },
        Some(files.clone()),
    );
    Ok((Arc::new(seg), file))
}

// ---------------------------------------------------------------------------------------
// Recovery
// ---------------------------------------------------------------------------------------

/// Segment and index files of a log directory, by first offset.
pub(crate) struct DirListing {
    pub segs: BTreeMap<u64, PathBuf>,
    pub idxs: BTreeMap<u64, PathBuf>,
    pub tmps: Vec<PathBuf>,
}

pub(crate) fn list_dir(fs: &dyn Fs, dir: &Path) -> Result<DirListing, StoreError> {
    let names = fs.list(dir).map_err(|e| StoreError::io("list", dir, e))?;
    let mut l = DirListing {
        segs: BTreeMap::new(),
        idxs: BTreeMap::new(),
        tmps: Vec::new(),
    };
    for n in names {
        if let Some(o) = segment::parse_file_name(&n, "seg") {
            l.segs.insert(o, dir.join(&n));
        } else if let Some(o) = segment::parse_file_name(&n, "idx") {
            l.idxs.insert(o, dir.join(&n));
        } else if n.ends_with(".tmp") {
            l.tmps.push(dir.join(&n));
        }
    }
    Ok(l)
}

fn file_len(f: &dyn LogFile, path: &Path) -> Result<u64, StoreError> {
    f.size().map_err(|e| StoreError::io("stat", path, e))
}

fn truncate(f: &dyn LogFile, path: &Path, len: u64) -> Result<(), StoreError> {
    f.set_len(len)
        .map_err(|e| StoreError::io("truncate", path, e))?;
    f.sync_data().map_err(|e| StoreError::io("fsync", path, e))
}

fn remove(fs: &dyn Fs, path: &Path) -> Result<(), StoreError> {
    fs.remove(path)
        .map_err(|e| StoreError::io("remove", path, e))
}

/// Tries the `.idx` of a sealed segment; `None` if it must be scanned instead.
fn trusted_state(fs: &dyn Fs, idx: Option<&PathBuf>, first: u64, len: u64) -> Option<SegState> {
    let path = idx?;
    let f = fs.open_read(path).ok()?;
    let n = f.size().ok()?;
    let mut b = vec![0u8; usize::try_from(n).ok()?];
    f.read_exact_at(&mut b, 0).ok()?;
    match segment::decode_idx(&b, first) {
        Ok(st) if st.len == len => Some(st),
        Ok(_) => {
            tracing::warn!(idx = %path.display(), "segment length differs from its .idx; rescanning");
            None
        }
        Err(why) => {
            tracing::warn!(idx = %path.display(), why, "unusable .idx; rescanning");
            None
        }
    }
}

/// Checks the segments of `dir` in order. Each one's handle is closed as soon as the next one
/// is checked, so at most two files are open however long the log is; the last segment keeps
/// its handle (it is the active one).
fn recover(
    fs: &dyn Fs,
    dir: &Path,
    opts: &StoreOptions,
    files: &Arc<SegmentFiles>,
) -> Result<(Vec<Arc<Segment>>, RecoveryReport, u64), StoreError> {
    fs.create_dir_all(dir)
        .map_err(|e| StoreError::io("create directory", dir, e))?;
    let listing = list_dir(fs, dir)?;
    let mut report = RecoveryReport::default();
    for t in &listing.tmps {
        remove(fs, t)?;
    }
    let firsts: Vec<u64> = listing.segs.keys().copied().collect();
    let mut segments: Vec<Arc<Segment>> = Vec::new();
    let mut cut_rest_from: Option<usize> = None;
    for (i, &first) in firsts.iter().enumerate() {
        let path = listing.segs[&first].clone();
        let is_last = i + 1 == firsts.len();
        // Continuity with the previous segment.
        if let Some(prev) = segments.last() {
            let prev_next = prev.bounds().0;
            if prev_next != first {
                let reason = format!(
                    "segment starts at offset {first} but the previous one ends at {prev_next}"
                );
                if !opts.truncate_corrupt {
                    return Err(StoreError::corrupt(path, 0, reason));
                }
                report.corruption_cut = Some(Cut {
                    segment: path.clone(),
                    position: 0,
                    bytes_cut: 0,
                    reason,
                });
                cut_rest_from = Some(i);
                break;
            }
        }
        let file = fs
            .open(&path, false)
            .map_err(|e| StoreError::io("open", &path, e))?;
        let len = file_len(&*file, &path)?;
        match segment::check_header(&*file, &path, len, first)? {
            HeaderState::Ok => {}
            HeaderState::Torn if is_last => {
                // Creation of the newest segment was torn: start it again.
                file.set_len(0)
                    .map_err(|e| StoreError::io("truncate", &path, e))?;
                file.write_all_at(&segment::encode_header(first), 0)
                    .map_err(|e| StoreError::io("write", &path, e))?;
                file.sync_data()
                    .map_err(|e| StoreError::io("fsync", &path, e))?;
                report.torn_tail = Some(Cut {
                    segment: path.clone(),
                    position: 0,
                    bytes_cut: len,
                    reason: "segment header torn".into(),
                });
            }
            bad => {
                let reason = match bad {
                    HeaderState::Bad(r) => r,
                    _ => "segment header torn in a sealed segment",
                };
                if !opts.truncate_corrupt {
                    return Err(StoreError::corrupt(path, 0, reason));
                }
                report.corruption_cut = Some(Cut {
                    segment: path.clone(),
                    position: 0,
                    bytes_cut: len,
                    reason: reason.into(),
                });
                if segments.is_empty() {
                    // The only/first segment is unreadable: start it again.
                    file.set_len(0)
                        .map_err(|e| StoreError::io("truncate", &path, e))?;
                    file.write_all_at(&segment::encode_header(first), 0)
                        .map_err(|e| StoreError::io("write", &path, e))?;
                    file.sync_data()
                        .map_err(|e| StoreError::io("fsync", &path, e))?;
                    segments.push(Arc::new(Segment::active(
                        first,
                        path,
                        file,
                        SegState {
                            next_offset: first,
                            len: SEGMENT_HEADER_LEN,
                            ..SegState::default()
                        },
                        Some(files.clone()),
                    )));
                    cut_rest_from = Some(i + 1);
                } else {
                    cut_rest_from = Some(i);
                }
                break;
            }
        }
        let len = file_len(&*file, &path)?;
        let trusted = if is_last {
            None
        } else {
            trusted_state(fs, listing.idxs.get(&first), first, len)
        };
        let state = match trusted {
            Some(st) => st,
            None => {
                report.scanned_segments += 1;
                report.scanned_bytes += len;
                let scan = segment::scan(
                    &*file,
                    &path,
                    first,
                    len,
                    opts.index_interval_bytes,
                    false,
                    is_last,
                )?;
                let mut stop_here = false;
                if let Some(stop) = &scan.stop {
                    let torn = is_last && stop.valid_after.is_none();
                    let cut = Cut {
                        segment: path.clone(),
                        position: stop.position,
                        bytes_cut: len - stop.position,
                        reason: stop.reason.into(),
                    };
                    if torn {
                        truncate(&*file, &path, stop.position)?;
                        report.torn_tail = Some(cut);
                    } else if opts.truncate_corrupt {
                        truncate(&*file, &path, stop.position)?;
                        report.corruption_cut = Some(cut);
                        stop_here = true;
                    } else {
                        let reason = match stop.valid_after {
                            Some(p) => {
                                format!("{} (a valid record follows at byte {p})", stop.reason)
                            }
                            None => format!("{} (in a sealed segment)", stop.reason),
                        };
                        return Err(StoreError::corrupt(path, stop.position, reason));
                    }
                }
                if !is_last && !stop_here {
                    let idx_path = dir.join(segment::idx_file_name(first));
                    segment::write_atomically(
                        fs,
                        dir,
                        &idx_path,
                        &segment::encode_idx(first, &scan.state),
                    )?;
                    report.rebuilt_indexes.push(idx_path);
                }
                if stop_here {
                    cut_rest_from = Some(i + 1);
                }
                scan.state
            }
        };
        if let Some(prev) = segments.last() {
            prev.unpin();
        }
        segments.push(Arc::new(Segment::active(
            first,
            path,
            file,
            state,
            Some(files.clone()),
        )));
        if cut_rest_from.is_some() {
            break;
        }
    }
    if let Some(from) = cut_rest_from {
        for &first in &firsts[from..] {
            let p = &listing.segs[&first];
            remove(fs, p)?;
            report.segments_removed.push(p.clone());
        }
        fs.sync_dir(dir)
            .map_err(|e| StoreError::io("fsync directory", dir, e))?;
    }
    if segments.is_empty() {
        segments.push(create_segment(fs, dir, opts.base_offset, files)?.0);
    }
    // The last segment is written to again: its .idx (if a crash left one) is stale. Also
    // drop .idx files of segments that no longer exist.
    let last_first = segments.last().map_or(0, |s| s.first_offset);
    let mut removed_idx = false;
    for (first, p) in &listing.idxs {
        let live = segments.iter().any(|s| s.first_offset == *first);
        if !live || *first == last_first {
            remove(fs, p)?;
            removed_idx = true;
        }
    }
    if removed_idx {
        fs.sync_dir(dir)
            .map_err(|e| StoreError::io("fsync directory", dir, e))?;
    }
    let last_ts = segments
        .iter()
        .rev()
        .map(|s| s.state().max_ts)
        .find(|&t| t > 0)
        .unwrap_or(0);
    report.segments = segments.len();
    report.first_offset = segments.first().map_or(0, |s| s.first_offset);
    report.next_offset = segments.last().map_or(0, |s| s.bounds().0);
    Ok((segments, report, last_ts))
}
