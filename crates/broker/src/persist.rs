//! Durability: the shared log (`lanemq-store`) and the broker's trees in the sled index.
//!
//! Every accepted PUBLISH is appended to the log once; its PUBACK/PUBREC is sent when the
//! store reports the record durable (see `docs/durability.md`). Derived state lives in sled:
//!
//! | tree | key | value |
//! |---|---|---|
//! | `b_sessions` | client id | expiry_s u32, protocol u8, disconnected_at_us u64, will_delay_s u32 |
//! | `b_subs` | client id, 0x00, filter | qos u8, flags u8 (bit 0 no local, bit 1 retain as published, bits 2–3 retain handling, bit 4 a private one-lane replay with `lane-offset`: restored as a replay from its stored position, not into the router), sub id u32 (0 = none) |
//! | `b_carried` | client id, 0x00, seq u64 | offset u64, the message (`RecordIn` encoding) of a carried queue entry |
//! | `b_retained` | topic | offset u64, [the message: `RecordIn` encoding] |
//! | `b_inbound` | client id, 0x00, packet id u16 | offset u64 of the PUBLISH, state u8 (1 received, 0 released) |
//! | `b_wills` | client id | the will as a log record body (`RecordIn` encoding) |
//!
//! Session queues and outbound inflight state are not in sled: queue entries (client, seq →
//! offset, QoS, retain) and inflight records (client, packet id → seq, stage) are records of
//! the queue journal ([`crate::queue_journal`], `<data_dir>/queues/`), written sequentially,
//! nothing per queued message in memory here. (`b_queue` and `b_inflight`, the old
//! one-entry-per-message trees, are moved into the journal once at open.)
//!
//! A queued or retained message whose log segment retention is about to delete is *carried*:
//! its record is copied into `b_carried` / its `b_retained` value (see `crate::retention`), and
//! from then on read from there. Messages are carried only when retention needs their
//! segment, so a broker whose log holds them copies nothing. A `b_carried` entry whose queue
//! entry is gone is removed at the next start.
//!
//! Client ids and topics never contain U+0000 (the codec rejects it), so `0x00` separates
//! key parts. Integers are big-endian.
//!
//! Ops are applied by one index thread in submission order and flushed in batches (group
//! commit for sled). In each batch the queue journal's records are written (and fsynced,
//! unless `fsync = "never"`) before the batch's sled changes, so a `b_routed` marker or a
//! watermark is never durable before the queue entries it stands for. A caller that must not act before its op is durable (an outbound QoS 2
//! PUBLISH or PUBREL, a PUBCOMP, a SUBACK of a persistent session) takes the op's ticket and
//! waits until [`Persist::flushed`] reaches it.
//!
//! The watermark (first log offset whose effects are not all in sled) is
//! `min(store.committed_offset(), every connection's first unrouted offset)`, read before a
//! batch is taken; on start the log is replayed from it ([`replay`]), so losing sled's
//! unflushed tail loses nothing that was acknowledged.

use crate::config::{FsyncMode, StorageConfig};
use crate::queue_journal::{Inflights, QueueJournal, Queues};
use bytes::Bytes;

use lanemq_store::{
    Index, IndexHint, Properties, Record, RecordIn, Store, StoreError, StoreOptions,
};
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;
use tracing::{error, info, warn};

/// Index hint kind: the MQTT packet identifier of an inbound QoS 2 PUBLISH.
pub const HINT_PACKET_ID: u8 = 0x10;
/// Ops queued for the index thread beyond which submitters wait.
const OPS_QUEUE_MAX: usize = 262_144;
/// The index thread wakes at least this often to advance the watermark.
const INDEX_TICK_MS: u64 = 50;

/// One change to the broker's sled trees.
#[derive(Debug)]
pub enum Op {
    SessionPut {
        client: Arc<str>,
        meta: SessionMeta,
    },
    SessionRemove {
        client: Arc<str>,
    },
    SubPut {
        client: Arc<str>,
        filter: String,
        value: [u8; 6],
    },
    SubRemove {
        client: Arc<str>,
        filter: String,
    },
    QueuePush {
        client: Arc<str>,
        seq: u64,
        offset: u64,
        qos: u8,
        retain: bool,
        /// The message itself when its record is below the carry floor.
        carried: Option<Box<RecordIn>>,
    },
    /// Keep a copy of the message of queue entry `seq` (if it still refers to `offset`).
    QueueCarry {
        client: Arc<str>,
        seq: u64,
        offset: u64,
        record: Box<RecordIn>,
    },
    QueueRemove {
        client: Arc<str>,
        seq: u64,
    },
    InflightPut {
        client: Arc<str>,
        pid: u16,
        seq: u64,
        stage: u8,
    },
    InflightRemove {
        client: Arc<str>,
        pid: u16,
    },
    Retain {
        topic: Arc<str>,
        offset: Option<u64>,
    },
    /// Keep a copy of the retained message of `topic` (if it is still the one at `offset`).
    RetainCarry {
        topic: Arc<str>,
        offset: u64,
        record: Box<RecordIn>,
    },
    InboundAdd {
        client: Arc<str>,
        pid: u16,
        offset: u64,
    },
    InboundRelease {
        client: Arc<str>,
        pid: u16,
    },
    WillPut {
        client: Arc<str>,
        record: Box<RecordIn>,
    },
    WillRemove {
        client: Arc<str>,
    },
    /// Every effect of the record at this offset has been submitted (see [`Persist::is_routed`]).
    Routed {
        offset: u64,
    },
    /// A stream subscription and its acknowledged position
    /// ([`crate::stream_sub::StoredStreamSub`]).
    StreamSubPut {
        client: Arc<str>,
        filter: String,
        value: Vec<u8>,
    },
    StreamSubRemove {
        client: Arc<str>,
        filter: String,
    },
    /// Wake this notifier once everything before it is flushed.
    Wake(Arc<crate::waker::ConnWaker>),
}

/// Move the entries of the old `b_queue` tree (one sled entry per queued message) into the
/// journal, once: journal first (committed, fsynced), then the tree is cleared. A crash in
/// between only writes the same entries again.
fn migrate_sled_queue(
    t: &Trees,
    j: &mut QueueJournal,
    queues: &mut Queues,
) -> Result<(), PersistError> {
    if t.queue.is_empty() {
        return Ok(());
    }
    let mut moved = 0u64;
    for kv in t.queue.iter() {
        let (k, v) = kv?;
        let Some(cut) = k.iter().position(|&b| b == 0) else {
            continue;
        };
        let client =
            String::from_utf8(k[..cut].to_vec()).map_err(|_| PersistError::Corrupt("queue"))?;
        let seq = be_u64(&k[cut + 1..]).ok_or(PersistError::Corrupt("queue"))?;
        let offset = be_u64(&v).ok_or(PersistError::Corrupt("queue"))?;
        let qos = *v.get(8).ok_or(PersistError::Corrupt("queue"))?;
        let retain = v.get(9).copied().unwrap_or(0) != 0;
        if let Some(b) = v.get(10..).filter(|b| !b.is_empty()) {
            let mut c = offset.to_be_bytes().to_vec();
            c.extend_from_slice(b);
            t.carried.insert(&k[..], c)?;
        }
        let arc: Arc<str> = client.as_str().into();
        j.push(&arc, seq, offset, qos, retain)
            .map_err(PersistError::Journal)?;
        let q = queues.entry(client).or_default();
        if !q.iter().any(|e| e.seq == seq) {
            q.push(crate::queue_journal::JournalEntry {
                seq,
                offset,
                qos,
                retain,
            });
        }
        moved += 1;
    }
    for q in queues.values_mut() {
        q.sort_by_key(|e| e.seq);
    }
    j.commit().map_err(PersistError::Journal)?;
    j.compact().map_err(PersistError::Journal)?;
    t.carried.flush()?;
    t.queue.clear()?;
    t.queue.flush()?;
    info!(
        entries = moved,
        "session queues moved from sled into the queue journal"
    );
    Ok(())
}

/// Move the entries of the old `b_inflight` tree into the journal, once (as
/// [`migrate_sled_queue`]).
fn migrate_sled_inflight(
    t: &Trees,
    j: &mut QueueJournal,
    inflights: &mut Inflights,
) -> Result<(), PersistError> {
    if t.inflight.is_empty() {
        return Ok(());
    }
    let mut moved = 0u64;
    for kv in t.inflight.iter() {
        let (k, v) = kv?;
        let Some(cut) = k.iter().position(|&b| b == 0) else {
            continue;
        };
        let client =
            String::from_utf8(k[..cut].to_vec()).map_err(|_| PersistError::Corrupt("inflight"))?;
        let pid = be_u16(&k[cut + 1..]).ok_or(PersistError::Corrupt("inflight"))?;
        let seq = be_u64(&v).ok_or(PersistError::Corrupt("inflight"))?;
        let stage = *v.get(8).ok_or(PersistError::Corrupt("inflight"))?;
        let arc: Arc<str> = client.as_str().into();
        j.inflight_put(&arc, pid, seq, stage)
            .map_err(PersistError::Journal)?;
        let f = inflights.entry(client).or_default();
        f.retain(|e| e.0 != pid);
        f.push((pid, seq, stage));
        moved += 1;
    }
    for f in inflights.values_mut() {
        f.sort_by_key(|e| e.0);
    }
    j.commit().map_err(PersistError::Journal)?;
    t.inflight.clear()?;
    t.inflight.flush()?;
    info!(
        entries = moved,
        "inflight records moved from sled into the queue journal"
    );
    Ok(())
}

/// One persisted queue entry (see [`Persist::load_queue`]).
#[derive(Debug, Clone)]
pub struct QueuedRow {
    pub seq: u64,
    pub offset: u64,
    pub qos: u8,
    pub retain: bool,
    /// The message, kept here once retention carried it out of the log.
    pub carried: Option<RecordIn>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionMeta {
    pub expiry_s: u32,
    pub protocol: u8,
    /// 0 while connected.
    pub disconnected_at_us: u64,
    pub will_delay_s: u32,
}

impl SessionMeta {
    fn encode(&self) -> [u8; 17] {
        let mut v = [0u8; 17];
        v[0..4].copy_from_slice(&self.expiry_s.to_be_bytes());
        v[4] = self.protocol;
        v[5..13].copy_from_slice(&self.disconnected_at_us.to_be_bytes());
        v[13..17].copy_from_slice(&self.will_delay_s.to_be_bytes());
        v
    }
    fn decode(v: &[u8]) -> Option<SessionMeta> {
        if v.len() != 17 {
            return None;
        }
        Some(SessionMeta {
            expiry_s: u32::from_be_bytes(v[0..4].try_into().ok()?),
            protocol: v[4],
            disconnected_at_us: u64::from_be_bytes(v[5..13].try_into().ok()?),
            will_delay_s: u32::from_be_bytes(v[13..17].try_into().ok()?),
        })
    }
}

struct Trees {
    carried: sled::Tree,
    sessions: sled::Tree,
    subs: sled::Tree,
    queue: sled::Tree,
    inflight: sled::Tree,
    retained: sled::Tree,
    inbound: sled::Tree,
    wills: sled::Tree,
    routed: sled::Tree,
    stream_subs: sled::Tree,
}

struct OpQueue {
    ops: VecDeque<Op>,
    /// Tickets handed out so far (the ticket of an op is its position, 1-based).
    submitted: u64,
    closed: bool,
}

pub struct Persist {
    pub store: Store,
    pub index: Index,
    trees: Trees,
    queue: Mutex<OpQueue>,
    ready: Condvar,
    space: Condvar,
    flushed: AtomicU64,
    failed: AtomicBool,
    /// First unrouted log offset of every connection (u64::MAX when none).
    lows: Mutex<Vec<Weak<AtomicU64>>>,
    /// Persisted session queues (used by the index thread; the lock is uncontended).
    journal: Mutex<QueueJournal>,
    /// Live queue entries found at open, taken by [`Persist::load_queue`] during restore.
    queues_at_open: Mutex<Queues>,
    /// Inflight records found at open, taken by [`Persist::load_inflight`] during restore.
    inflight_at_open: Mutex<Inflights>,
    /// `b_carried` keys (only written by the index thread): a removal needs a sled write
    /// only for these.
    carried_keys: Mutex<std::collections::HashSet<Vec<u8>>>,
    /// Records below this offset may be deleted by retention soon: what references one from
    /// now on keeps a copy of the message (see `crate::retention`).
    carry_floor: AtomicU64,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

fn key(client: &str, suffix: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(client.len() + 1 + suffix.len());
    k.extend_from_slice(client.as_bytes());
    k.push(0);
    k.extend_from_slice(suffix);
    k
}

fn prefix(client: &str) -> Vec<u8> {
    key(client, &[])
}

fn be_u16(v: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(v.get(0..2)?.try_into().ok()?))
}

fn be_u64(v: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(v.get(0..8)?.try_into().ok()?))
}

/// Errors of the persistence layer, as text for logs and start-up failures.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("index: {0}")]
    Sled(#[from] sled::Error),
    #[error("index: corrupt entry in {0}")]
    Corrupt(&'static str),
    #[error("session queue journal: {0}")]
    Journal(std::io::Error),
}

impl Persist {
    /// Open the log and the index under `data_dir` (blocking; call from a blocking thread).
    pub fn open(data_dir: &Path, cfg: &StorageConfig) -> Result<Arc<Persist>, PersistError> {
        Persist::open_at(data_dir, cfg, 0)
    }

    /// [`Persist::open`]; a log with no segment yet starts at `base_offset` (cluster mode).
    pub fn open_at(
        data_dir: &Path,
        cfg: &StorageConfig,
        base_offset: u64,
    ) -> Result<Arc<Persist>, PersistError> {
        let mut opts = StoreOptions::new(data_dir);
        opts.base_offset = base_offset;
        opts.fsync = match cfg.fsync {
            FsyncMode::Always => lanemq_store::FsyncPolicy::Always,
            FsyncMode::Interval => {
                lanemq_store::FsyncPolicy::Interval(Duration::from_millis(cfg.fsync_interval_ms))
            }
            FsyncMode::Never => lanemq_store::FsyncPolicy::Never,
        };
        opts.segment_bytes_max = cfg.segment_bytes_max;
        opts.truncate_corrupt = cfg.truncate_corrupt;
        opts.retention_max_age =
            (cfg.retention_max_age_s > 0).then(|| Duration::from_secs(cfg.retention_max_age_s));
        opts.retention_max_bytes = (cfg.retention_max_bytes > 0).then_some(cfg.retention_max_bytes);
        opts.open_segments_max = cfg.open_segments_max;
        let (store, report) = Store::open(opts)?;
        if let Some(cut) = &report.torn_tail {
            warn!(
                segment = %cut.segment.display(),
                position = cut.position,
                bytes_cut = cut.bytes_cut,
                reason = %cut.reason,
                "log recovery: torn tail truncated"
            );
        }
        if let Some(cut) = &report.corruption_cut {
            warn!(
                segment = %cut.segment.display(),
                position = cut.position,
                bytes_cut = cut.bytes_cut,
                reason = %cut.reason,
                "log recovery: corruption truncated (storage.truncate_corrupt = true)"
            );
        }
        info!(
            segments = report.segments,
            first_offset = report.first_offset,
            next_offset = report.next_offset,
            scanned_bytes = report.scanned_bytes,
            "log opened"
        );
        let index = Index::open_with_cache(&data_dir.join("index"), cfg.index_cache_bytes)?;
        let t = |name: &str| index.tree(name);
        let trees = Trees {
            carried: t("b_carried")?,
            sessions: t("b_sessions")?,
            subs: t("b_subs")?,
            queue: t("b_queue")?,
            inflight: t("b_inflight")?,
            retained: t("b_retained")?,
            inbound: t("b_inbound")?,
            wills: t("b_wills")?,
            routed: t("b_routed")?,
            stream_subs: t("b_stream_subs")?,
        };
        let (mut journal, mut queues, mut inflights) = QueueJournal::open(
            &data_dir.join("queues"),
            !matches!(cfg.fsync, FsyncMode::Never),
        )
        .map_err(PersistError::Journal)?;
        migrate_sled_queue(&trees, &mut journal, &mut queues)?;
        migrate_sled_inflight(&trees, &mut journal, &mut inflights)?;
        let mut carried_keys = std::collections::HashSet::new();
        for k in trees.carried.iter().keys() {
            carried_keys.insert(k?.to_vec());
        }
        let p = Arc::new(Persist {
            store,
            index,
            trees,
            journal: Mutex::new(journal),
            queues_at_open: Mutex::new(queues),
            inflight_at_open: Mutex::new(inflights),
            carried_keys: Mutex::new(carried_keys),
            queue: Mutex::new(OpQueue {
                ops: VecDeque::new(),
                submitted: 0,
                closed: false,
            }),
            ready: Condvar::new(),
            space: Condvar::new(),
            flushed: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            lows: Mutex::new(Vec::new()),
            carry_floor: AtomicU64::new(0),
            thread: Mutex::new(None),
        });
        Ok(p)
    }

    /// Start the index thread (after [`replay`]).
    pub fn start(self: &Arc<Self>) {
        let me = self.clone();
        let handle = std::thread::Builder::new()
            .name("lanemq-index".into())
            .spawn(move || me.index_loop())
            .ok();
        if handle.is_none() {
            error!("cannot start the index thread");
            self.failed.store(true, Ordering::SeqCst);
        }
        *self.thread.lock().unwrap_or_else(|e| e.into_inner()) = handle;
    }

    /// Has the store or the index failed (fail-stop)?
    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed) || self.store.failure().is_some()
    }

    /// Queue an op; returns its ticket.
    pub fn submit(&self, op: Op) -> u64 {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        while q.ops.len() >= OPS_QUEUE_MAX && !q.closed {
            q = self.space.wait(q).unwrap_or_else(|e| e.into_inner());
        }
        q.ops.push_back(op);
        q.submitted += 1;
        let ticket = q.submitted;
        drop(q);
        self.ready.notify_one();
        ticket
    }

    /// Offsets below this are carried when referenced (see `crate::retention`).
    pub fn carry_floor(&self) -> u64 {
        self.carry_floor.load(Ordering::SeqCst)
    }

    /// Raise the carry floor (never lowers it).
    pub fn raise_carry_floor(&self, to: u64) {
        self.carry_floor.fetch_max(to, Ordering::SeqCst);
    }

    /// Ticket up to which every op is applied and flushed.
    pub fn flushed(&self) -> u64 {
        self.flushed.load(Ordering::Acquire)
    }

    /// Register a connection's "first unrouted offset" cell.
    pub fn register_low(&self) -> Arc<AtomicU64> {
        let cell = Arc::new(AtomicU64::new(u64::MAX));
        let mut lows = self.lows.lock().unwrap_or_else(|e| e.into_inner());
        // Drop cells of closed connections now and then (amortised O(1) per registration).
        if lows.len() >= 64 && lows.len().is_power_of_two() {
            lows.retain(|w| w.strong_count() > 0);
        }
        lows.push(Arc::downgrade(&cell));
        cell
    }

    fn low_watermark(&self) -> u64 {
        let committed = self.store.committed_offset();
        let lows = self.lows.lock().unwrap_or_else(|e| e.into_inner());
        lows.iter()
            .filter_map(|w| w.upgrade())
            .map(|c| c.load(Ordering::SeqCst))
            .fold(committed, u64::min)
    }

    /// Stop the index thread after it has applied and flushed everything, then close the
    /// store (flush + fsync). Blocking.
    pub fn close(&self) {
        {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            q.closed = true;
        }
        self.ready.notify_all();
        self.space.notify_all();
        let handle = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
        if let Err(e) = self.store.close() {
            error!(error = %e, "closing the log failed");
        }
        if let Err(e) = self.index.flush() {
            error!(error = %e, "flushing the index failed");
        }
    }

    fn index_loop(&self) {
        loop {
            let watermark = self.low_watermark();
            let (batch, last_ticket, closed) = {
                let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
                if q.ops.is_empty() && !q.closed {
                    let (g, _) = self
                        .ready
                        .wait_timeout(q, Duration::from_millis(INDEX_TICK_MS))
                        .unwrap_or_else(|e| e.into_inner());
                    q = g;
                }
                let batch = std::mem::take(&mut q.ops);
                (batch, q.submitted, q.closed)
            };
            self.space.notify_all();
            let mut wakes = Vec::new();
            // Queue journal first (see the module doc).
            let mut result = self.apply_journal(batch.iter());
            for op in batch {
                if let Op::Wake(n) = op {
                    wakes.push(n);
                } else if result.is_ok() {
                    result = self.apply(op);
                }
            }
            // Only advance the watermark past records whose effects were submitted before
            // this batch was taken (see the module doc).
            let result = result
                .and_then(|()| self.prune_routed(watermark))
                .and_then(|()| {
                    self.index
                        .set_watermark(watermark)
                        .map_err(PersistError::from)
                })
                .and_then(|()| self.index.flush().map_err(PersistError::from));
            match result {
                Ok(()) => {
                    self.flushed.store(last_ticket, Ordering::Release);
                }
                Err(e) => {
                    if !self.failed.swap(true, Ordering::SeqCst) {
                        error!(error = %e, "index write failed: the broker stops acknowledging");
                    }
                }
            }
            for w in wakes {
                w.notify_one();
            }
            if closed {
                let q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
                if q.ops.is_empty() {
                    return;
                }
            }
        }
    }

    /// Routed markers below the watermark are no longer needed by replay.
    fn prune_routed(&self, watermark: u64) -> Result<(), PersistError> {
        let end = watermark.to_be_bytes();
        for k in self.trees.routed.range(..&end[..]).keys() {
            self.trees.routed.remove(k?)?;
        }
        Ok(())
    }

    /// Were the effects of this record already applied before a restart?
    pub fn is_routed(&self, offset: u64) -> Result<bool, PersistError> {
        Ok(self.trees.routed.contains_key(offset.to_be_bytes())?)
    }

    /// Write the batch's queue journal records and commit them (see the module doc).
    fn apply_journal<'a>(&self, batch: impl Iterator<Item = &'a Op>) -> Result<(), PersistError> {
        let mut j = self.journal.lock().unwrap_or_else(|e| e.into_inner());
        for op in batch {
            match op {
                Op::QueuePush {
                    client,
                    seq,
                    offset,
                    qos,
                    retain,
                    ..
                } => j.push(client, *seq, *offset, *qos, *retain),
                Op::QueueRemove { client, seq } => j.remove(client, *seq),
                Op::SessionRemove { client } => j.drop_session(client),
                Op::InflightPut {
                    client,
                    pid,
                    seq,
                    stage,
                } => j.inflight_put(client, *pid, *seq, *stage),
                Op::InflightRemove { client, pid } => j.inflight_free(client, *pid),
                _ => Ok(()),
            }
            .map_err(PersistError::Journal)?;
        }
        j.commit().map_err(PersistError::Journal)?;
        if let Err(e) = j.maybe_compact() {
            return Err(PersistError::Journal(e));
        }
        Ok(())
    }

    /// Forget the `b_carried` keys under a client prefix (the sled entries go with it).
    fn forget_carried(&self, prefix: &[u8]) {
        self.carried_keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k| !k.starts_with(prefix));
    }

    fn apply(&self, op: Op) -> Result<(), PersistError> {
        let t = &self.trees;
        match op {
            Op::SessionPut { client, meta } => {
                t.sessions.insert(client.as_bytes(), &meta.encode()[..])?;
            }
            Op::SessionRemove { client } => {
                t.sessions.remove(client.as_bytes())?;
                t.wills.remove(client.as_bytes())?;
                let p = prefix(&client);
                self.forget_carried(&p);
                for tree in [&t.subs, &t.carried, &t.inbound, &t.stream_subs] {
                    for k in tree.scan_prefix(&p).keys() {
                        tree.remove(k?)?;
                    }
                }
            }
            Op::SubPut {
                client,
                filter,
                value,
            } => {
                t.subs.insert(key(&client, filter.as_bytes()), &value[..])?;
            }
            Op::SubRemove { client, filter } => {
                t.subs.remove(key(&client, filter.as_bytes()))?;
            }
            // The queue entry itself is in the journal (`apply_journal`).
            Op::QueuePush {
                client,
                seq,
                offset,
                carried: Some(record),
                ..
            }
            | Op::QueueCarry {
                client,
                seq,
                offset,
                record,
            } => {
                let k = key(&client, &seq.to_be_bytes());
                let mut v = Vec::with_capacity(8 + record.payload.len() + 64);
                v.extend_from_slice(&offset.to_be_bytes());
                v.extend_from_slice(&encode_record_in(&record));
                t.carried.insert(&k[..], v)?;
                self.carried_keys
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(k);
            }
            Op::QueuePush { carried: None, .. } => {}
            Op::QueueRemove { client, seq } => {
                let k = key(&client, &seq.to_be_bytes());
                let had = self
                    .carried_keys
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&k);
                if had {
                    t.carried.remove(k)?;
                }
            }
            // In the journal (`apply_journal`).
            Op::InflightPut { .. } | Op::InflightRemove { .. } => {}
            Op::Retain {
                topic,
                offset: Some(o),
            } => {
                t.retained.insert(topic.as_bytes(), &o.to_be_bytes()[..])?;
            }
            Op::Retain {
                topic,
                offset: None,
            } => {
                t.retained.remove(topic.as_bytes())?;
            }
            Op::RetainCarry {
                topic,
                offset,
                record,
            } => {
                if let Some(old) = t.retained.get(topic.as_bytes())? {
                    if old.len() == 8 && be_u64(&old) == Some(offset) {
                        let mut v = old.to_vec();
                        v.extend_from_slice(&encode_record_in(&record));
                        t.retained.insert(topic.as_bytes(), v)?;
                    }
                }
            }
            Op::InboundAdd {
                client,
                pid,
                offset,
            } => {
                let mut v = [0u8; 9];
                v[0..8].copy_from_slice(&offset.to_be_bytes());
                v[8] = 1;
                t.inbound.insert(key(&client, &pid.to_be_bytes()), &v[..])?;
            }
            Op::InboundRelease { client, pid } => {
                let k = key(&client, &pid.to_be_bytes());
                if let Some(old) = t.inbound.get(&k)? {
                    let mut v = [0u8; 9];
                    v[0..8].copy_from_slice(old.get(0..8).unwrap_or(&[0; 8]));
                    v[8] = 0;
                    t.inbound.insert(k, &v[..])?;
                }
            }
            Op::WillPut { client, record } => {
                t.wills
                    .insert(client.as_bytes(), encode_record_in(&record))?;
            }
            Op::WillRemove { client } => {
                t.wills.remove(client.as_bytes())?;
            }
            Op::Routed { offset } => {
                t.routed.insert(offset.to_be_bytes(), &[][..])?;
            }
            Op::StreamSubPut {
                client,
                filter,
                value,
            } => {
                t.stream_subs
                    .insert(key(&client, filter.as_bytes()), value)?;
            }
            Op::StreamSubRemove { client, filter } => {
                t.stream_subs.remove(key(&client, filter.as_bytes()))?;
            }
            Op::Wake(_) => {}
        }
        Ok(())
    }

    // ---- reads used at start-up (blocking) ----

    pub fn load_sessions(&self) -> Result<Vec<(String, SessionMeta)>, PersistError> {
        let mut out = Vec::new();
        for kv in self.trees.sessions.iter() {
            let (k, v) = kv?;
            let client =
                String::from_utf8(k.to_vec()).map_err(|_| PersistError::Corrupt("sessions"))?;
            let meta = SessionMeta::decode(&v).ok_or(PersistError::Corrupt("sessions"))?;
            out.push((client, meta));
        }
        Ok(out)
    }

    pub fn load_subs(&self, client: &str) -> Result<Vec<(String, [u8; 6])>, PersistError> {
        let p = prefix(client);
        let mut out = Vec::new();
        for kv in self.trees.subs.scan_prefix(&p) {
            let (k, v) = kv?;
            let filter = String::from_utf8(k[p.len()..].to_vec())
                .map_err(|_| PersistError::Corrupt("subs"))?;
            let value: [u8; 6] = v
                .as_ref()
                .try_into()
                .map_err(|_| PersistError::Corrupt("subs"))?;
            out.push((filter, value));
        }
        Ok(out)
    }

    /// Queued messages of a session, in seq order (taken from what the journal held at
    /// open: call once per session, during restore). Carried copies that no longer belong
    /// to an entry are removed.
    pub fn load_queue(&self, client: &str) -> Result<Vec<QueuedRow>, PersistError> {
        let entries = self
            .queues_at_open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(client)
            .unwrap_or_default();
        let p = prefix(client);
        let mut carried: HashMap<u64, (u64, RecordIn)> = HashMap::new();
        for kv in self.trees.carried.scan_prefix(&p) {
            let (k, v) = kv?;
            let seq = be_u64(&k[p.len()..]).ok_or(PersistError::Corrupt("carried"))?;
            let offset = be_u64(&v).ok_or(PersistError::Corrupt("carried"))?;
            let r = decode_record_in(&v[8..]).ok_or(PersistError::Corrupt("carried"))?;
            carried.insert(seq, (offset, r));
        }
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            let c = match carried.remove(&e.seq) {
                Some((o, r)) if o == e.offset => Some(r),
                Some(_) => {
                    carried.insert(e.seq, (u64::MAX, RecordIn::default()));
                    None
                }
                None => None,
            };
            out.push(QueuedRow {
                seq: e.seq,
                offset: e.offset,
                qos: e.qos,
                retain: e.retain,
                carried: c,
            });
        }
        for seq in carried.keys() {
            let k = key(client, &seq.to_be_bytes());
            self.trees.carried.remove(&k[..])?;
            self.carried_keys
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&k);
        }
        Ok(out)
    }

    /// The carried copy of queue entry `seq` of `client`, if it refers to `offset` and was
    /// carried (see `crate::retention`).
    pub fn carried_queued(
        &self,
        client: &str,
        seq: u64,
        offset: u64,
    ) -> Result<Option<RecordIn>, PersistError> {
        let Some(v) = self.trees.carried.get(key(client, &seq.to_be_bytes()))? else {
            return Ok(None);
        };
        if be_u64(&v) != Some(offset) {
            return Ok(None);
        }
        Ok(Some(
            decode_record_in(&v[8..]).ok_or(PersistError::Corrupt("carried"))?,
        ))
    }

    /// Inflight state of a session found at open: (packet id, seq, stage). Taken: a second
    /// call for the same client returns nothing.
    pub fn load_inflight(&self, client: &str) -> Result<Vec<(u16, u64, u8)>, PersistError> {
        Ok(self
            .inflight_at_open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(client)
            .unwrap_or_default())
    }

    /// Inbound QoS 2 packet ids received and not released: (pid, offset).
    pub fn load_inbound(&self, client: &str) -> Result<Vec<(u16, u64, bool)>, PersistError> {
        let p = prefix(client);
        let mut out = Vec::new();
        for kv in self.trees.inbound.scan_prefix(&p) {
            let (k, v) = kv?;
            let pid = be_u16(&k[p.len()..]).ok_or(PersistError::Corrupt("inbound"))?;
            let offset = be_u64(&v).ok_or(PersistError::Corrupt("inbound"))?;
            out.push((pid, offset, v.get(8).copied().unwrap_or(0) == 1));
        }
        Ok(out)
    }

    /// A session's stream subscriptions (full filter, stored value).
    pub fn load_stream_subs(
        &self,
        client: &str,
    ) -> Result<Vec<(String, crate::stream_sub::StoredStreamSub)>, PersistError> {
        let p = prefix(client);
        let mut out = Vec::new();
        for kv in self.trees.stream_subs.scan_prefix(&p) {
            let (k, v) = kv?;
            let filter = String::from_utf8(k[p.len()..].to_vec())
                .map_err(|_| PersistError::Corrupt("stream_subs"))?;
            let s = crate::stream_sub::StoredStreamSub::decode(&v)
                .ok_or(PersistError::Corrupt("stream_subs"))?;
            out.push((filter, s));
        }
        Ok(out)
    }

    /// Retained messages: topic, log offset, and the message itself once carried.
    #[allow(clippy::type_complexity)]
    pub fn load_retained(&self) -> Result<Vec<(String, u64, Option<RecordIn>)>, PersistError> {
        let mut out = Vec::new();
        for kv in self.trees.retained.iter() {
            let (k, v) = kv?;
            let topic =
                String::from_utf8(k.to_vec()).map_err(|_| PersistError::Corrupt("retained"))?;
            let offset = be_u64(&v).ok_or(PersistError::Corrupt("retained"))?;
            let carried = match v.get(8..) {
                Some(b) if !b.is_empty() => {
                    Some(decode_record_in(b).ok_or(PersistError::Corrupt("retained"))?)
                }
                _ => None,
            };
            out.push((topic, offset, carried));
        }
        Ok(out)
    }

    pub fn load_wills(&self) -> Result<Vec<(String, RecordIn)>, PersistError> {
        let mut out = Vec::new();
        for kv in self.trees.wills.iter() {
            let (k, v) = kv?;
            let client =
                String::from_utf8(k.to_vec()).map_err(|_| PersistError::Corrupt("wills"))?;
            let rec = decode_record_in(&v).ok_or(PersistError::Corrupt("wills"))?;
            out.push((client, rec));
        }
        Ok(out)
    }

    /// Sessions that must be deleted at start (expired while the broker was down).
    pub fn remove_session_now(&self, client: &str) -> Result<(), PersistError> {
        let op = Op::SessionRemove {
            client: client.into(),
        };
        self.apply_journal(std::iter::once(&op))?;
        self.apply(op)
    }
}

// ---- conversions between broker messages and log records ----

/// The record of a PUBLISH; `pid` is the inbound QoS 2 packet id (kept for de-duplication).
pub fn record_in(msg: &crate::message::Message, pid: Option<u16>) -> RecordIn {
    RecordIn {
        timestamp_us: Some(msg.timestamp_us),
        qos: msg.qos.as_u8(),
        retain: msg.retain,
        topic: msg.topic.clone(),
        client_id: msg.publisher.clone(),
        properties: Properties {
            username: msg.username.as_deref().map(str::to_string),
            ..crate::message::to_store_properties(&msg.properties)
        },
        index_hints: pid
            .map(|p| {
                vec![IndexHint {
                    kind: HINT_PACKET_ID,
                    id: u64::from(p),
                    seq: 0,
                }]
            })
            .unwrap_or_default(),
        payload: msg.payload.clone(),
    }
}

/// The message of a carried copy (`offset` is where it was in the log).
pub fn carried_message(r: &RecordIn, offset: u64) -> crate::message::Message {
    let rec = Record {
        offset,
        timestamp_us: r.timestamp_us.unwrap_or(0),
        qos: r.qos,
        retain: r.retain,
        topic: r.topic.to_string(),
        client_id: r.client_id.to_string(),
        properties: r.properties.clone(),
        index_hints: Vec::new(),
        payload: r.payload.clone(),
    };
    crate::message::Message::from_record(&rec)
}

/// The inbound QoS 2 packet id stored in a record, if any.
pub fn record_pid(r: &Record) -> Option<u16> {
    r.index_hints
        .iter()
        .find(|h| h.kind == HINT_PACKET_ID)
        .and_then(|h| u16::try_from(h.id).ok())
}

/// Will records are kept in sled with this small self-describing encoding (JSON-free to stay
/// dependency-light): a version byte, then length-prefixed fields.
fn encode_record_in(r: &RecordIn) -> Vec<u8> {
    fn put_str(out: &mut Vec<u8>, s: &[u8]) {
        out.extend_from_slice(&(s.len() as u32).to_be_bytes());
        out.extend_from_slice(s);
    }
    fn put_opt(out: &mut Vec<u8>, s: Option<&[u8]>) {
        match s {
            Some(s) => {
                out.push(1);
                put_str(out, s);
            }
            None => out.push(0),
        }
    }
    let p = &r.properties;
    let mut out = vec![1u8, r.qos, u8::from(r.retain)];
    out.extend_from_slice(&r.timestamp_us.unwrap_or(0).to_be_bytes());
    put_str(&mut out, r.topic.as_bytes());
    put_str(&mut out, r.client_id.as_bytes());
    put_opt(
        &mut out,
        p.payload_format_indicator
            .map(|v| [v])
            .as_ref()
            .map(|a| &a[..]),
    );
    put_opt(
        &mut out,
        p.message_expiry_interval
            .map(|v| v.to_be_bytes())
            .as_ref()
            .map(|a| &a[..]),
    );
    put_opt(&mut out, p.content_type.as_deref().map(str::as_bytes));
    put_opt(&mut out, p.response_topic.as_deref().map(str::as_bytes));
    put_opt(&mut out, p.correlation_data.as_deref());
    out.extend_from_slice(&(p.user_properties.len() as u32).to_be_bytes());
    for (k, v) in &p.user_properties {
        put_str(&mut out, k.as_bytes());
        put_str(&mut out, v.as_bytes());
    }
    put_str(&mut out, &r.payload);
    out
}

fn decode_record_in(v: &[u8]) -> Option<RecordIn> {
    struct Rd<'a>(&'a [u8]);
    impl<'a> Rd<'a> {
        fn take(&mut self, n: usize) -> Option<&'a [u8]> {
            if self.0.len() < n {
                return None;
            }
            let (a, b) = self.0.split_at(n);
            self.0 = b;
            Some(a)
        }
        fn u8(&mut self) -> Option<u8> {
            self.take(1).map(|b| b[0])
        }
        fn u32(&mut self) -> Option<u32> {
            Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
        }
        fn bytes(&mut self) -> Option<&'a [u8]> {
            let n = self.u32()? as usize;
            self.take(n)
        }
        fn string(&mut self) -> Option<String> {
            String::from_utf8(self.bytes()?.to_vec()).ok()
        }
        fn opt(&mut self) -> Option<Option<&'a [u8]>> {
            match self.u8()? {
                0 => Some(None),
                _ => Some(Some(self.bytes()?)),
            }
        }
    }
    let mut r = Rd(v);
    if r.u8()? != 1 {
        return None;
    }
    let qos = r.u8()?;
    let retain = r.u8()? != 0;
    let ts = u64::from_be_bytes(r.take(8)?.try_into().ok()?);
    let topic = r.string()?;
    let client_id = r.string()?;
    let pfi = r.opt()?.and_then(|b| b.first().copied());
    let mei = match r.opt()? {
        Some(b) => Some(u32::from_be_bytes(b.try_into().ok()?)),
        None => None,
    };
    let ct = match r.opt()? {
        Some(b) => Some(String::from_utf8(b.to_vec()).ok()?),
        None => None,
    };
    let rt = match r.opt()? {
        Some(b) => Some(String::from_utf8(b.to_vec()).ok()?),
        None => None,
    };
    let cd = r.opt()?.map(Bytes::copy_from_slice);
    let n = r.u32()? as usize;
    let mut user_properties = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        user_properties.push((r.string()?, r.string()?));
    }
    let payload = Bytes::copy_from_slice(r.bytes()?);
    Some(RecordIn {
        timestamp_us: Some(ts),
        qos,
        retain,
        topic: topic.into(),
        client_id: client_id.into(),
        properties: Properties {
            payload_format_indicator: pfi,
            message_expiry_interval: mei,
            content_type: ct,
            response_topic: rt,
            correlation_data: cd,
            user_properties,
            username: None,
        },
        index_hints: Vec::new(),
        payload,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Open again right after a close: sled's background flusher may hold the file lock for
    /// a moment.
    fn reopen(dir: &Path, cfg: &StorageConfig) -> Arc<Persist> {
        for _ in 0..100 {
            match Persist::open(dir, cfg) {
                Ok(p) => return p,
                Err(e) if e.to_string().contains("could not acquire lock") => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("open: {e}"),
            }
        }
        panic!("the index stayed locked");
    }

    /// Queue entries of the old one-sled-entry-per-message tree move into the journal once;
    /// carried copies and removals then survive a reopen.
    #[test]
    fn sled_queue_moves_into_the_journal() {
        let dir = std::env::temp_dir().join(format!("lanemq-persist-mig-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cfg = StorageConfig::default();
        {
            let p = reopen(&dir, &cfg);
            for seq in 1..=3u64 {
                let mut v = (100 + seq).to_be_bytes().to_vec();
                v.extend_from_slice(&[1, u8::from(seq == 2)]);
                p.trees
                    .queue
                    .insert(key("c1", &seq.to_be_bytes()), v)
                    .unwrap();
            }
            p.index.flush().unwrap();
            p.store.close().unwrap();
        }
        {
            let p = reopen(&dir, &cfg);
            assert!(p.trees.queue.is_empty());
            let q = p.load_queue("c1").unwrap();
            let got: Vec<(u64, u64, bool)> =
                q.iter().map(|r| (r.seq, r.offset, r.retain)).collect();
            assert_eq!(got, vec![(1, 101, false), (2, 102, true), (3, 103, false)]);
            // Remove one, carry one, through the index thread.
            p.start();
            let c: Arc<str> = "c1".into();
            p.submit(Op::QueueRemove {
                client: c.clone(),
                seq: 1,
            });
            p.submit(Op::QueueCarry {
                client: c.clone(),
                seq: 3,
                offset: 103,
                record: Box::new(RecordIn {
                    topic: "t".into(),
                    payload: Bytes::from_static(b"kept"),
                    ..Default::default()
                }),
            });
            p.close();
        }
        let p = reopen(&dir, &cfg);
        let q = p.load_queue("c1").unwrap();
        assert_eq!(q.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![2, 3]);
        assert!(q[0].carried.is_none());
        assert_eq!(
            q[1].carried.as_ref().unwrap().payload,
            Bytes::from_static(b"kept")
        );
        assert!(p.carried_queued("c1", 3, 103).unwrap().is_some());
        p.store.close().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn will_record_round_trip() {
        let r = RecordIn {
            timestamp_us: Some(7),
            qos: 2,
            retain: true,
            topic: "a/b".into(),
            client_id: "c".into(),
            properties: Properties {
                payload_format_indicator: Some(1),
                message_expiry_interval: Some(9),
                content_type: Some("t".into()),
                response_topic: None,
                correlation_data: Some(Bytes::from_static(b"x")),
                user_properties: vec![("k".into(), "v".into()), ("k".into(), "w".into())],
                username: None,
            },
            index_hints: vec![],
            payload: Bytes::from_static(b"bye"),
        };
        assert_eq!(decode_record_in(&encode_record_in(&r)).unwrap(), r);
        assert!(decode_record_in(&[1, 2]).is_none());
    }

    #[test]
    fn session_meta_round_trip() {
        let m = SessionMeta {
            expiry_s: 5,
            protocol: 5,
            disconnected_at_us: 99,
            will_delay_s: 3,
        };
        assert_eq!(SessionMeta::decode(&m.encode()), Some(m));
    }
}
