//! The parent registry, the lane table and the lane index.
//!
//! Storage:
//!
//! - the lane index: the shared lane entry files `<data_dir>/lanes/*.lxe`
//!   ([`crate::entries`]), one 40-byte entry per message, each lane a chain of its entries;
//! - the lane table as of the last checkpoint: `<data_dir>/lanes/table.lj`
//!   ([`crate::journal`]);
//! - the group offsets, in memory, journaled in the same file ([`Engine::flush`]);
//! - sled, tree `l_lite` (big-endian keys), for what is small and rarely written:
//!
//! ```text
//! 'G' | parent u32 | group              -> group start policy (written when the group is new)
//! ```
//! Parents live in tree `l_parents` (name -> JSON `{id, def}`). Older versions kept one sled
//! entry per message (`'i' | lane | offset`, watermark `'w'`) and the group offsets in sled
//! (`'g' | lane | group`): [`Engine::open`] moves them into the entry files and the journal
//! once.
//!
//! The lane table is in memory: key -> lane id per parent (ordered, for pagination) and, per
//! lane, its next offset, last publish time and newest entry. A lane's offset is assigned by
//! [`Engine::assign`] under the log's append lock; its entry is appended once the record is
//! durable ([`Engine::index_durable`]). Every [`CHECKPOINT_MS`] [`Engine::checkpoint`] fsyncs
//! the entry files and journals the lanes that changed with the synced end and the log
//! watermark. After a crash, [`Engine::open`] loads the journal, cuts the entry files to the
//! journaled end and indexes the log after the watermark again: the restart reads the table
//! and the log tail, never the index.
//!
//! Invariants: a lane's newest-entry word only ever names an entry of that lane that is in
//! the files; entries of records below the watermark are all in the files below `end`; the
//! index lock (`idx`) is taken before the table lock, never after.

use crate::entries::{LaneEntries, LaneEntry, NONE};
use crate::journal::{
    encode_commit, encode_group, encode_lane, encode_run, Checkpoint, Journal, LaneRecordRef, Rec,
    RunMark,
};
use crate::model::{LaneSel, ParentDef, Pattern, ValidationError};
use lanemq_store::{IndexHint, Store};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// Errors of the registry API (REST maps them to 400 / 404 / 409 / 500).
#[derive(Debug, thiserror::Error)]
pub enum LiteError {
    #[error("invalid lite parent: {}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<ValidationError>),
    #[error("lite parent {0:?} not found")]
    NotFound(String),
    #[error("lite parent {0:?} already exists")]
    Exists(String),
    #[error("{0}")]
    Conflict(String),
    #[error("storage error: {0}")]
    Storage(String),
}

impl From<sled::Error> for LiteError {
    fn from(e: sled::Error) -> Self {
        LiteError::Storage(e.to_string())
    }
}

impl From<std::io::Error> for LiteError {
    fn from(e: std::io::Error) -> Self {
        LiteError::Storage(format!("lane index files: {e}"))
    }
}

impl From<lanemq_store::StoreError> for LiteError {
    fn from(e: lanemq_store::StoreError) -> Self {
        LiteError::Storage(e.to_string())
    }
}

/// A parent in force (immutable; an update swaps it for a new one with the same id).
#[derive(Debug)]
pub struct Parent {
    pub id: u32,
    pub def: ParentDef,
    pub pattern: Pattern,
}

/// A parent with its lane count, for the REST API.
#[derive(Debug, Clone, Serialize)]
pub struct ParentInfo {
    #[serde(flatten)]
    pub def: ParentDef,
    pub lanes: u64,
}

/// One lane, for the REST API.
#[derive(Debug, Clone, Serialize)]
pub struct LaneInfo {
    pub lane: String,
    pub id: u64,
    pub next_offset: u64,
    pub first_offset: u64,
    pub last_publish_us: u64,
    pub expires_at_us: u64,
}

pub use crate::table::Lane;
use crate::table::LaneTable;

/// A lane entry assigned but not yet written to sled.
#[derive(Debug, Clone, Copy)]
pub struct Pending {
    pub lane: u64,
    pub seq: u64,
    pub pos: u64,
    pub ts_us: u64,
    pub new: bool,
}

/// An expired lane.
#[derive(Debug, Clone)]
pub struct Expired {
    pub lane: u64,
    pub parent: u32,
    pub key: Box<str>,
}

/// What a publish's topic means to the lite layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Classified {
    /// No parent matches.
    Plain,
    /// Goes into the lane `key` of `parent`.
    Lane { parent: u32, key: String },
    /// Refused with this reason code (0x90 key too long, 0x97 quota exceeded).
    Refused { code: u8, why: String },
}

/// Counters (Prometheus names in `docs/lanes.md`).
#[derive(Debug, Default)]
pub struct Counters {
    pub lanes_created: AtomicU64,
    pub lanes_expired: AtomicU64,
    pub publish_refused: AtomicU64,
    pub indexed: AtomicU64,
    pub suspended: AtomicU64,
    pub retried: AtomicU64,
    pub redelivered: AtomicU64,
    /// Lane batches not fully acknowledged within their parent's `ack_timeout_ms`.
    pub ack_timeouts: AtomicU64,
    pub dead_lettered: AtomicU64,
    pub committed: AtomicU64,
}

#[derive(Default)]
struct Table {
    lanes: LaneTable,
    next_id: u64,
    pending: Vec<Pending>,
    /// When to look at a lane's TTL again: second (Unix time) -> lanes. A lane is in it once
    /// (ids of removed lanes are skipped when they come up), at the earliest second it can
    /// expire, so a sweep touches only the lanes that are due, not every lane.
    expiry: BTreeMap<u64, Vec<u64>>,
    /// Lanes a record found past their TTL (log time, [`Engine::use_log_time`]): removed
    /// from `lanes` already, their data goes at the next sweep.
    expired_early: Vec<Expired>,
}

impl Table {
    fn schedule(&mut self, lane: u64, at_s: u64) {
        self.expiry.entry(at_s).or_default().push(lane);
    }
}

/// The lane index: entry files, journal, and what the next checkpoint writes.
struct Idx {
    entries: LaneEntries,
    /// Lanes indexed since the last checkpoint.
    dirty: std::collections::HashSet<u64>,
    /// Lanes removed since the last checkpoint.
    gone: Vec<u64>,
    /// Every lane hint of a record below it is in `entries`.
    watermark: u64,
    /// The watermark of the last checkpoint in the journal.
    journaled_watermark: u64,
    last_checkpoint: Instant,
    /// Per lane read deep into its past: offset -> entry index, every [`MARK_EVERY`] entries.
    marks: HashMap<u64, BTreeMap<u64, u64>>,
}

/// Group offsets, in memory and journaled ([`Engine::flush`]).
#[derive(Default)]
struct Commits {
    /// Group name -> small id (journaled `Group` records).
    ids: HashMap<Box<str>, u32>,
    /// (lane, group id) -> committed offset (first unacknowledged).
    map: HashMap<(u64, u32), u64>,
    /// (lane, group id) -> what the group did past its committed offset (journaled `Run`
    /// records): only lanes with something delivered and not yet committed.
    runs: HashMap<(u64, u32), RunMark>,
    /// Framed records not yet in the journal.
    unjournaled: Vec<u8>,
}

impl Commits {
    fn id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.ids.len() as u32;
        self.ids.insert(name.into(), id);
        encode_group(&mut self.unjournaled, id, name);
        id
    }
}

/// Period of [`Engine::checkpoint_if_due`].
pub const CHECKPOINT_MS: u64 = 1000;
/// A chain walk longer than this leaves marks behind, one per this many entries.
const MARK_EVERY: u64 = 1024;

/// The lite layer's registry and index.
pub struct Engine {
    store: Store,
    idx: Mutex<Idx>,
    /// The lane table journal; its fsyncs never happen under `idx` or the table lock.
    journal: Mutex<Journal>,
    /// Serialises checkpoints.
    checkpointing: Mutex<()>,
    commits: Mutex<Commits>,
    tree: sled::Tree,
    parents_tree: sled::Tree,
    parents: RwLock<Arc<Vec<Arc<Parent>>>>,
    any: AtomicBool,
    table: Mutex<Table>,
    pub counters: Counters,
    /// Set whenever lanes are created, expired or parents change (listing caches, tests).
    pub generation: AtomicU64,
    /// Cluster mode: lane times are the log's time ([`Engine::use_log_time`]).
    log_time: AtomicBool,
    /// The log's time: the newest record timestamp appended, µs.
    clock: AtomicU64,
}

#[derive(Serialize, Deserialize)]
struct StoredParent {
    id: u32,
    def: ParentDef,
}

/// Most lane entries written to sled in one batch.
pub const INDEX_BATCH_MAX: usize = 4096;

/// Key of the next parent id in `l_parents` (names cannot contain NUL).
const NEXT_ID_KEY: &[u8] = b"\0next_id";

fn be64(v: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = v.len().min(8);
    b[..n].copy_from_slice(&v[..n]);
    u64::from_be_bytes(b)
}

pub use lanemq_store::now_us;

impl Engine {
    /// Open the registry and rebuild the lane table; parents of the config file are created
    /// (or updated) first. Replays the log after the watermark. Blocking.
    pub fn open(
        store: Store,
        index: &lanemq_store::Index,
        config_parents: &[ParentDef],
    ) -> Result<Arc<Engine>, LiteError> {
        let tree = index.tree("l_lite")?;
        let parents_tree = index.tree("l_parents")?;
        let dir = lanes_dir(&store);
        // The journal's records go straight into the lane table and the group offsets.
        let mut lanes = LaneTable::default();
        let mut commits = Commits::default();
        let (journal, loaded) = Journal::open(&dir, |r| match r {
            Rec::Lane(l) => {
                lanes.insert_unindexed(
                    l.id,
                    Lane {
                        parent: l.parent,
                        key: l.key,
                        next: l.next,
                        last_pub_us: l.last_pub_us,
                        last_entry: l.last_entry,
                    },
                );
            }
            Rec::Gone(id) => {
                lanes.remove_unindexed(id);
                for gid in commits.ids.values() {
                    commits.map.remove(&(id, *gid));
                    commits.runs.remove(&(id, *gid));
                }
            }
            Rec::Run(lane, gid, mark) => {
                if mark.is_empty() {
                    commits.runs.remove(&(lane, gid));
                } else {
                    commits.runs.insert((lane, gid), mark);
                }
            }
            Rec::Group(gid, name) => {
                commits.ids.insert(name, gid);
            }
            Rec::Commit(lane, gid, off) => {
                commits.map.insert((lane, gid), off);
            }
            Rec::Expect(n) => lanes.reserve(usize::try_from(n).unwrap_or(0)),
            Rec::Checkpoint(_) => {}
        })?;
        if loaded.cut > 0 {
            warn!(
                bytes = loaded.cut,
                "lane table journal: a torn checkpoint was cut"
            );
        }
        let cp = loaded.checkpoint.unwrap_or_default();
        let (entries, report) = LaneEntries::open(&dir, cp.entries_end)?;
        let idx = Idx {
            entries,
            dirty: Default::default(),
            gone: Vec::new(),
            watermark: cp.watermark,
            journaled_watermark: cp.watermark,
            last_checkpoint: Instant::now(),
            marks: HashMap::new(),
        };
        let e = Engine {
            store,
            idx: Mutex::new(idx),
            journal: Mutex::new(journal),
            checkpointing: Mutex::new(()),
            commits: Mutex::new(commits),
            tree,
            parents_tree,
            parents: RwLock::new(Arc::new(Vec::new())),
            any: AtomicBool::new(false),
            table: Mutex::new(Table {
                lanes,
                next_id: cp.next_id,
                ..Table::default()
            }),
            counters: Counters::default(),
            generation: AtomicU64::new(0),
            log_time: AtomicBool::new(false),
            clock: AtomicU64::new(0),
        };
        let mut list = Vec::new();
        for kv in e.parents_tree.iter() {
            let (k, v) = kv?;
            if &*k == NEXT_ID_KEY {
                continue;
            }
            let sp: StoredParent = serde_json::from_slice(&v)
                .map_err(|x| LiteError::Storage(format!("bad stored parent: {x}")))?;
            let pattern = Pattern::compile(&sp.def.pattern, sp.def.key_levels)
                .map_err(|x| LiteError::Storage(format!("stored parent pattern: {x}")))?;
            list.push(Arc::new(Parent {
                id: sp.id,
                def: sp.def,
                pattern,
            }));
        }
        list.sort_by_key(|p| p.id);
        e.set_parents(list);
        for def in config_parents {
            match e.parent(&def.name) {
                None => {
                    e.create_parent(def.clone())?;
                }
                Some(p) if p.def != *def => {
                    e.update_parent(&def.name, def.clone())?;
                }
                Some(_) => {}
            }
        }
        e.recover(loaded, report)?;
        Ok(Arc::new(e))
    }

    fn set_parents(&self, list: Vec<Arc<Parent>>) {
        self.any.store(!list.is_empty(), Ordering::Release);
        *self.parents.write().unwrap_or_else(|x| x.into_inner()) = Arc::new(list);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|x| x.into_inner())
    }

    /// The parents in force, in creation order.
    pub fn parents(&self) -> Arc<Vec<Arc<Parent>>> {
        self.parents
            .read()
            .unwrap_or_else(|x| x.into_inner())
            .clone()
    }

    pub fn parent(&self, name: &str) -> Option<Arc<Parent>> {
        self.parents().iter().find(|p| p.def.name == name).cloned()
    }

    pub fn parent_by_id(&self, id: u32) -> Option<Arc<Parent>> {
        self.parents().iter().find(|p| p.id == id).cloned()
    }

    /// Is any parent configured (a cheap check for the publish path)?
    pub fn active(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    fn lock_idx(&self) -> MutexGuard<'_, Idx> {
        self.idx.lock().unwrap_or_else(|x| x.into_inner())
    }

    /// Build the lane table from the journal, move an older version's sled entries into the
    /// entry files, index the log after the watermark, and checkpoint.
    fn recover(
        &self,
        loaded: crate::journal::Loaded,
        report: crate::entries::OpenReport,
    ) -> Result<(), LiteError> {
        let started = Instant::now();
        let mut idx_guard = self.lock_idx();
        let idx = &mut *idx_guard;
        let legacy = self.tree.scan_prefix([b'i']).next().is_some();
        let journaled = loaded.checkpoint.is_some();
        let mut orphans = Vec::new();
        if report.short_by > 0 {
            warn!(
                missing = report.short_by,
                "lane entry files are shorter than the journal says: the lane index is rebuilt \
                 from the log"
            );
            idx.entries.reset(0)?;
            idx.watermark = 0;
            let mut t = self.lock();
            t.next_id = t.next_id.max(t.lanes.max_id().map_or(0, |m| m + 1));
            t.lanes.clear();
        } else {
            if report.cut > 0 {
                info!(
                    entries = report.cut,
                    "lane entries after the last checkpoint cut (indexed again from the log)"
                );
            }
            // The key index, built once the journal has said which lanes are live.
            let parents: std::collections::HashSet<u32> =
                self.parents().iter().map(|p| p.id).collect();
            let mut t = self.lock();
            let max_id = t.lanes.max_id().map_or(0, |m| m + 1);
            t.next_id = t.next_id.max(max_id);
            orphans = t.lanes.index_keys(&parents);
        }
        if legacy && !journaled {
            self.migrate_legacy(idx, &mut orphans)?;
        }
        for lane in orphans {
            self.remove_lane_data(idx, lane)?;
        }
        // The log after the watermark: records durable before the stop whose entries were
        // not in a checkpoint.
        let from = idx.watermark.max(self.store.first_offset());
        let end = self.store.committed_offset();
        let mut reader = self.store.reader(from);
        let mut replayed = 0u64;
        'log: loop {
            let batch = reader.next_batch(1024, 4 << 20)?;
            if batch.is_empty() {
                break;
            }
            let mut add: Vec<LaneEntry> = Vec::new();
            let base = idx.entries.end();
            {
                let mut t = self.lock();
                for r in &batch {
                    if r.offset >= end {
                        break;
                    }
                    for h in &r.index_hints {
                        if h.kind != IndexHint::KIND_LANE {
                            continue;
                        }
                        if !t.lanes.contains(h.id) {
                            let Some((parent, key)) = self.match_parent(&r.topic) else {
                                continue;
                            };
                            let key: Box<str> = key.into();
                            t.lanes.insert(
                                h.id,
                                Lane {
                                    parent,
                                    key,
                                    next: 0,
                                    last_pub_us: r.timestamp_us,
                                    last_entry: NONE,
                                },
                            );
                            t.next_id = t.next_id.max(h.id + 1);
                        }
                        let Some(l) = t.lanes.get_mut(h.id) else {
                            continue;
                        };
                        if h.seq < l.next {
                            // In the files already (the lane's offsets come in order).
                            continue;
                        }
                        l.next = l.next.max(h.seq + 1);
                        l.last_pub_us = l.last_pub_us.max(r.timestamp_us);
                        let i = base + add.len() as u64;
                        add.push(LaneEntry {
                            lane: h.id,
                            seq: h.seq,
                            pos: r.offset,
                            ts_us: r.timestamp_us,
                            prev: l.last_entry,
                        });
                        l.last_entry = i;
                        replayed += 1;
                    }
                }
            }
            idx.entries.append(&add)?;
            for e in &add {
                idx.dirty.insert(e.lane);
            }
            if batch.last().is_some_and(|r| r.offset >= end) {
                break 'log;
            }
        }
        idx.watermark = end;
        let entries = idx.entries.end() - idx.entries.head();
        drop(idx_guard);
        self.reschedule_all();
        let legacy_commits = self.import_legacy_commits()?;
        self.checkpoint_now(true)?;
        self.journal_commits()?;
        if legacy {
            self.drop_legacy()?;
        }
        if legacy_commits > 0 {
            self.drop_prefix(b'g')?;
            info!(
                commits = legacy_commits,
                "lane group offsets moved from sled into the lane table journal"
            );
        }
        let lanes = self.lock().lanes.len();
        info!(
            lanes,
            replayed,
            entries,
            ms = started.elapsed().as_millis() as u64,
            "lite lanes recovered"
        );
        Ok(())
    }

    /// Move the sled entries of an older version (`'i' | lane | offset`) into the entry files,
    /// in log order; the lanes are found from them, the key from each lane's newest record.
    fn migrate_legacy(&self, idx: &mut Idx, orphans: &mut Vec<u64>) -> Result<(), LiteError> {
        let mut all: Vec<(u64, u64, u64, u64)> = Vec::new(); // lane, seq, pos, ts
        for kv in self.tree.scan_prefix([b'i']) {
            let (k, v) = kv?;
            if k.len() < 17 {
                continue;
            }
            all.push((
                be64(&k[1..9]),
                be64(&k[9..17]),
                be64(&v[..v.len().min(8)]),
                be64(v.get(8..16).unwrap_or(&[])),
            ));
        }
        all.sort_by_key(|e| (e.2, e.0, e.1));
        let base = idx.entries.end();
        let mut newest: HashMap<u64, (u64, u64, u64, u64)> = HashMap::new(); // index, seq, pos, ts
        let mut add = Vec::with_capacity(all.len());
        for (k, &(lane, seq, pos, ts)) in all.iter().enumerate() {
            let prev = newest.get(&lane).map_or(NONE, |n| n.0);
            add.push(LaneEntry {
                lane,
                seq,
                pos,
                ts_us: ts,
                prev,
            });
            newest.insert(lane, (base + k as u64, seq, pos, ts));
        }
        idx.entries.append(&add)?;
        let mut t = self.lock();
        for (lane, (i, seq, pos, ts)) in newest {
            t.next_id = t.next_id.max(lane + 1);
            let found = match self.store.read(pos) {
                Ok(r) => self.match_parent(&r.topic),
                Err(_) => None,
            };
            let Some((parent, key)) = found else {
                orphans.push(lane);
                continue;
            };
            let key: Box<str> = key.into();
            t.lanes.insert(
                lane,
                Lane {
                    parent,
                    key,
                    next: seq + 1,
                    last_pub_us: ts,
                    last_entry: i,
                },
            );
            idx.dirty.insert(lane);
        }
        idx.watermark = self.tree.get([b'w'])?.map_or(0, |v| be64(&v));
        info!(
            entries = add.len(),
            "lane index moved from sled into the lane entry files"
        );
        Ok(())
    }

    /// Group offsets an older version kept in sled (`'g' | lane | group`) into memory (the
    /// caller journals them). Returns how many.
    fn import_legacy_commits(&self) -> Result<usize, LiteError> {
        let mut c = self.lock_commits();
        let mut n = 0;
        for kv in self.tree.scan_prefix([b'g']) {
            let (k, v) = kv?;
            if k.len() < 9 {
                continue;
            }
            let lane = be64(&k[1..9]);
            let name = String::from_utf8_lossy(&k[9..]).into_owned();
            let gid = c.id(&name);
            let off = be64(&v);
            c.map.entry((lane, gid)).or_insert(off);
            encode_commit(&mut c.unjournaled, lane, gid, off);
            n += 1;
        }
        Ok(n)
    }

    /// Remove every sled key starting with `tag`, in bounded batches; flush.
    fn drop_prefix(&self, tag: u8) -> Result<(), LiteError> {
        loop {
            let mut b = sled::Batch::default();
            let mut n = 0;
            for kv in self.tree.scan_prefix([tag]).take(INDEX_BATCH_MAX) {
                let (k, _) = kv?;
                b.remove(k);
                n += 1;
            }
            if n == 0 {
                break;
            }
            self.tree.apply_batch(b)?;
        }
        self.tree.flush()?;
        Ok(())
    }

    /// Put every lane in the TTL queue at the second it can expire (at start, and when a
    /// parent's TTL changed).
    fn reschedule_all(&self) {
        let ttl: HashMap<u32, u64> = self.parents().iter().map(|p| (p.id, p.def.ttl_s)).collect();
        let mut t = self.lock();
        let t = &mut *t;
        t.expiry.clear();
        let mut q: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for (id, l) in t.lanes.iter() {
            let ttl_s = ttl.get(&l.parent).copied().unwrap_or(0);
            q.entry((l.last_pub_us / 1_000_000).saturating_add(ttl_s))
                .or_default()
                .push(id);
        }
        t.expiry = q;
    }

    fn lock_commits(&self) -> MutexGuard<'_, Commits> {
        self.commits.lock().unwrap_or_else(|x| x.into_inner())
    }

    /// Append the group offsets stored since the last call to the journal; fsync.
    fn journal_commits(&self) -> Result<(), LiteError> {
        let mut j = self.lock_journal();
        let bytes = std::mem::take(&mut self.lock_commits().unjournaled);
        if !bytes.is_empty() {
            j.append_commits(&bytes)?;
        }
        Ok(())
    }

    fn lock_journal(&self) -> MutexGuard<'_, Journal> {
        self.journal.lock().unwrap_or_else(|x| x.into_inner())
    }

    /// Remove an older version's per-message sled entries (after a checkpoint holds them).
    fn drop_legacy(&self) -> Result<(), LiteError> {
        self.tree.remove([b'w'])?;
        self.drop_prefix(b'i')
    }

    /// fsync the entry files and journal the lanes that changed, if [`CHECKPOINT_MS`] passed
    /// since the last checkpoint. Meant for a thread of its own: the fsyncs happen without
    /// the index or table lock, so publishing and dispatching go on meanwhile.
    pub fn checkpoint_if_due(&self) -> Result<(), LiteError> {
        if self.lock_idx().last_checkpoint.elapsed() < Duration::from_millis(CHECKPOINT_MS) {
            return Ok(());
        }
        self.checkpoint_now(false)
    }

    /// fsync the entry files and journal the lanes that changed (at shutdown, in tests).
    pub fn checkpoint(&self) -> Result<(), LiteError> {
        self.checkpoint_now(true)
    }

    fn checkpoint_now(&self, force: bool) -> Result<(), LiteError> {
        let _one = self.checkpointing.lock().unwrap_or_else(|x| x.into_inner());
        let journal_len = self.lock_journal().len();
        // 1. Under the locks, no I/O: what to sync and what to journal.
        let (files, new_file, dir, lanes, gone, cp, rewrite) = {
            let mut idx = self.lock_idx();
            let idx = &mut *idx;
            idx.last_checkpoint = Instant::now();
            let committed = self.store.committed_offset();
            let t = self.lock();
            // With no entry pending below it, every lane record under `committed` is in the
            // files (offsets are assigned under the append lock, before the commit): the
            // watermark moves on when only plain records came, so that a restart does not
            // read them again looking for lane hints.
            let wm = t
                .pending
                .first()
                .map_or(committed, |p| p.pos.min(committed));
            idx.watermark = idx.watermark.max(wm);
            if !force
                && idx.dirty.is_empty()
                && idx.gone.is_empty()
                && idx.watermark == idx.journaled_watermark
            {
                return Ok(());
            }
            let (files, new_file) = idx.entries.take_unsynced();
            // The table's next offset counts entries still pending; the journal keeps what is
            // in the files.
            let mut pending: HashMap<u64, u64> = HashMap::new();
            for p in &t.pending {
                *pending.entry(p.lane).or_default() += 1;
            }
            let live = t.lanes.len() as u64;
            let rewrite = journal_len > (16 << 20).max(live * 128);
            let mut buf = Vec::new();
            let mut put = |id: u64, l: &Lane| {
                if l.last_entry == NONE {
                    return;
                }
                encode_lane(
                    &mut buf,
                    &LaneRecordRef {
                        id,
                        parent: l.parent,
                        last_entry: l.last_entry,
                        next: l.next - pending.get(&id).copied().unwrap_or(0),
                        last_pub_us: l.last_pub_us,
                        key: &l.key,
                    },
                );
            };
            if rewrite {
                for (id, l) in t.lanes.iter() {
                    put(id, l);
                }
                let c = self.lock_commits();
                for (name, gid) in &c.ids {
                    encode_group(&mut buf, *gid, name);
                }
                for ((lane, gid), off) in &c.map {
                    encode_commit(&mut buf, *lane, *gid, *off);
                }
                for ((lane, gid), m) in &c.runs {
                    encode_run(&mut buf, *lane, *gid, m);
                }
            } else {
                for id in &idx.dirty {
                    if let Some(l) = t.lanes.get(*id) {
                        put(*id, l);
                    }
                }
            }
            let cp = Checkpoint {
                entries_end: idx.entries.end(),
                watermark: idx.watermark,
                next_id: t.next_id,
                lanes: t.lanes.len() as u64,
            };
            idx.dirty.clear();
            let gone = std::mem::take(&mut idx.gone);
            (
                files,
                new_file,
                idx.entries.dir().to_path_buf(),
                buf,
                gone,
                cp,
                rewrite,
            )
        };
        // 2. The entries below the journaled end are on disk before the journal says so.
        for f in &files {
            f.sync_data()?;
        }
        if new_file {
            std::fs::File::open(&dir)?.sync_all()?;
        }
        // 3. The journal.
        {
            let mut j = self.lock_journal();
            if rewrite {
                j.rewrite(lanes, &cp)?;
            } else {
                j.append(lanes, &gone, &cp)?;
            }
        }
        // 4. Entries whose records left the log go with whole files.
        let first = self.store.first_offset();
        let mut idx = self.lock_idx();
        idx.journaled_watermark = idx.journaled_watermark.max(cp.watermark);
        let below = idx.entries.seek_pos(first)?.min(cp.entries_end);
        if idx.entries.drop_files_below(below)? > 0 {
            let head = idx.entries.head();
            for m in idx.marks.values_mut() {
                m.retain(|_, i| *i >= head);
            }
        }
        Ok(())
    }

    /// The first parent whose pattern matches `topic`, and the key (no limits applied).
    fn match_parent(&self, topic: &str) -> Option<(u32, String)> {
        self.parents()
            .iter()
            .find_map(|p| p.pattern.key_of(topic).map(|k| (p.id, k.to_string())))
    }

    /// Classify a publish's topic: plain, a lane, or refused (key too long, quota).
    pub fn classify(&self, topic: &str) -> Classified {
        if !self.active() {
            return Classified::Plain;
        }
        let t = self.lock();
        self.classify_with(&t, topic)
    }

    fn classify_with(&self, t: &Table, topic: &str) -> Classified {
        for p in self.parents().iter() {
            let Some(key) = p.pattern.key_of(topic) else {
                continue;
            };
            if key.len() > p.def.max_key_bytes as usize {
                return Classified::Refused {
                    code: 0x90,
                    why: format!(
                        "lane key of {} bytes exceeds max_key_bytes {} of lite parent {:?}",
                        key.len(),
                        p.def.max_key_bytes,
                        p.def.name
                    ),
                };
            }
            let exists = t.lanes.find(p.id, key).is_some();
            let count = t.lanes.count_of(p.id) as u64;
            if !exists && count >= p.def.max_lanes {
                return Classified::Refused {
                    code: 0x97,
                    why: format!(
                        "lite parent {:?} holds max_lanes {} lanes",
                        p.def.name, p.def.max_lanes
                    ),
                };
            }
            return Classified::Lane {
                parent: p.id,
                key: key.to_string(),
            };
        }
        Classified::Plain
    }

    /// Cluster mode: lane times (last publish, TTL) are the log's time, advanced by
    /// [`Engine::advance_clock`] with every record appended, not this machine's clock. Every
    /// node then decides alike whether a record continues a lane or starts it again after
    /// its TTL (so lane offsets are the same on every node). A lane past its TTL is expired
    /// by the record that finds it so, even before a sweep.
    pub fn use_log_time(&self) {
        self.log_time.store(true, Ordering::Release);
    }

    /// The log's time is at least `ts_us` (a record's timestamp, before it is appended).
    pub fn advance_clock(&self, ts_us: u64) {
        self.clock.fetch_max(ts_us, Ordering::AcqRel);
    }

    /// Now, for lane times: the log's time in cluster mode, this machine's clock otherwise.
    pub fn clock_us(&self) -> u64 {
        if self.log_time.load(Ordering::Acquire) {
            self.clock.load(Ordering::Acquire)
        } else {
            now_us()
        }
    }

    /// Assign the next offset of the lane `key` of `parent` to the record at log position
    /// `pos` (creating the lane); called under the log's append lock. Returns the hint.
    pub fn assign(&self, parent: u32, key: &str, pos: u64) -> IndexHint {
        let now = self.clock_us();
        let log_time = self.log_time.load(Ordering::Acquire);
        let ttl_us = self
            .parent_by_id(parent)
            .map_or(0, |p| p.def.ttl_s.saturating_mul(1_000_000));
        let mut t = self.lock();
        let t = &mut *t;
        if log_time && ttl_us > 0 {
            // Past its TTL in the log's time: expired now, whether or not a sweep came by.
            let stale = t.lanes.find(parent, key).filter(|id| {
                t.lanes
                    .get(*id)
                    .is_some_and(|l| now.saturating_sub(l.last_pub_us) >= ttl_us)
                    && !t.pending.iter().any(|p| p.lane == *id)
            });
            if let Some(id) = stale {
                if let Some(l) = t.lanes.remove(id) {
                    t.expired_early.push(Expired {
                        lane: id,
                        parent: l.parent,
                        key: l.key,
                    });
                }
            }
        }
        let mut new = false;
        let existing = t.lanes.find(parent, key).and_then(|id| {
            let l = t.lanes.get_mut(id)?;
            let seq = l.next;
            l.next += 1;
            l.last_pub_us = now;
            Some((id, seq))
        });
        let (lane, seq) = match existing {
            Some(x) => x,
            None => {
                let id = t.next_id;
                t.next_id += 1;
                let ttl_s = self.parent_by_id(parent).map_or(0, |p| p.def.ttl_s);
                t.schedule(id, (now / 1_000_000).saturating_add(ttl_s));
                t.lanes.insert(
                    id,
                    Lane {
                        parent,
                        key: key.into(),
                        next: 1,
                        last_pub_us: now,
                        last_entry: NONE,
                    },
                );
                new = true;
                (id, 0)
            }
        };
        t.pending.push(Pending {
            lane,
            seq,
            pos,
            ts_us: now,
            new,
        });
        if new {
            self.counters.lanes_created.fetch_add(1, Ordering::Relaxed);
        }
        IndexHint {
            kind: IndexHint::KIND_LANE,
            id: lane,
            seq,
        }
    }

    /// Are entries waiting for their record to become durable?
    pub fn has_pending(&self) -> bool {
        !self.lock().pending.is_empty()
    }

    /// Append the entries whose records are durable to the entry files; returns them (the
    /// lanes that have new messages). They are durable at the next checkpoint.
    pub fn index_durable(&self) -> Result<Vec<Pending>, LiteError> {
        let committed = self.store.committed_offset();
        let mut idx = self.lock_idx();
        let idx = &mut *idx;
        let (done, watermark, add) = {
            let mut t = self.lock();
            let n = t
                .pending
                .partition_point(|p| p.pos < committed)
                .min(INDEX_BATCH_MAX);
            let done: Vec<Pending> = t.pending.drain(..n).collect();
            let watermark = t
                .pending
                .first()
                .map_or(committed, |p| p.pos.min(committed));
            let base = idx.entries.end();
            let mut add = Vec::with_capacity(done.len());
            for p in &done {
                let Some(l) = t.lanes.get_mut(p.lane) else {
                    continue;
                };
                let i = base + add.len() as u64;
                add.push(LaneEntry {
                    lane: p.lane,
                    seq: p.seq,
                    pos: p.pos,
                    ts_us: p.ts_us,
                    prev: l.last_entry,
                });
                l.last_entry = i;
            }
            (done, watermark, add)
        };
        idx.watermark = idx.watermark.max(watermark);
        if done.is_empty() {
            return Ok(done);
        }
        idx.entries.append(&add)?;
        for e in &add {
            idx.dirty.insert(e.lane);
        }
        self.counters
            .indexed
            .fetch_add(done.len() as u64, Ordering::Relaxed);
        Ok(done)
    }

    /// Up to `max` entries of `lane` from offset `from`: `(offset, log position, time µs)`.
    pub fn read_lane(
        &self,
        lane: u64,
        from: u64,
        max: usize,
    ) -> Result<Vec<(u64, u64, u64)>, LiteError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let mut idx = self.lock_idx();
        let Some(last) = self.lock().lanes.get(lane).map(|l| l.last_entry) else {
            return Ok(Vec::new());
        };
        let target = from.saturating_add(max as u64 - 1);
        let start = idx
            .marks
            .get(&lane)
            .and_then(|m| m.range(target..).next().map(|(_, &i)| i))
            .unwrap_or(last);
        let mut out = Vec::new();
        walk(&mut idx, lane, start, from, |e| {
            if e.seq <= target {
                out.push((e.seq, e.pos, e.ts_us));
            }
        })?;
        out.reverse();
        out.truncate(max);
        Ok(out)
    }

    /// The oldest offset of `lane` still in the index (`next` if none).
    fn first_seq(&self, lane: u64, next: u64) -> u64 {
        let mut idx = self.lock_idx();
        let Some(last) = self.lock().lanes.get(lane).map(|l| l.last_entry) else {
            return next;
        };
        let start = idx
            .marks
            .get(&lane)
            .and_then(|m| m.first_key_value().map(|(_, &i)| i))
            .unwrap_or(last);
        let mut first = next;
        if walk(&mut idx, lane, start, 0, |e| first = first.min(e.seq)).is_err() {
            return next;
        }
        first
    }

    /// The lane's next offset, its parent and key (None if it does not exist).
    pub fn lane(&self, lane: u64) -> Option<(u32, Box<str>, u64, u64)> {
        let t = self.lock();
        t.lanes
            .get(lane)
            .map(|l| (l.parent, l.key.clone(), l.next, l.last_pub_us))
    }

    /// The lane id of `key` in `parent`.
    pub fn lane_id(&self, parent: u32, key: &str) -> Option<u64> {
        self.lock().lanes.find(parent, key)
    }

    /// Next offset of a lane (0 if unknown).
    pub fn next_offset(&self, lane: u64) -> u64 {
        self.lock().lanes.get(lane).map_or(0, |l| l.next)
    }

    /// Lanes of `parent` (all, or one by key) with messages that `group` has not committed:
    /// its stored offset, else `default` (the start policy's). With `since` (a log position:
    /// the group takes only messages stored at or after it), lanes whose newest indexed entry
    /// is older are left out without reading anything. One pass under the locks, no
    /// allocation per lane that is not returned.
    pub fn lanes_behind(
        &self,
        parent: u32,
        sel: &LaneSel,
        group: Option<&str>,
        default: u64,
        since: Option<u64>,
    ) -> Result<Vec<u64>, LiteError> {
        let idx = self.lock_idx();
        let first_new = match since {
            Some(pos) => Some(idx.entries.seek_pos(pos)?),
            None => None,
        };
        let t = self.lock();
        let c = self.lock_commits();
        let gid = group.and_then(|g| c.ids.get(g).copied());
        let behind = |id: &u64| -> bool {
            let Some(l) = t.lanes.get(*id) else {
                return false;
            };
            if first_new.is_some_and(|e| l.last_entry == NONE || l.last_entry < e) {
                return false;
            }
            let committed = gid
                .and_then(|g| c.map.get(&(*id, g)).copied())
                .unwrap_or(default);
            l.next > committed
        };
        // Oldest lanes first (ids are given in creation order).
        let mut out: Vec<u64> = match sel {
            LaneSel::All => t.lanes.ids_of(parent).filter(|id| behind(id)).collect(),
            LaneSel::One(k) => t
                .lanes
                .find(parent, k)
                .filter(|id| behind(id))
                .into_iter()
                .collect(),
        };
        out.sort_unstable();
        Ok(out)
    }

    /// For each `(group, default, since)`: `(lanes, messages)` the group has not committed on
    /// the lanes of `parent` (for metrics). A lane without a stored offset counts from
    /// `default`; with `since` (a log position), such lanes whose newest entry is older are
    /// left out and the rest count from `default` (an upper bound: entries before `since`
    /// count too). Lock holds stay short whatever the lane count: one sequential pass over
    /// the lane table copies the parent's `(lane, next, newest entry)`, one pass over the
    /// stored offsets copies those of the groups; the sums are made without a lock (1 M
    /// lanes: about 10 ms under each lock, measured in `docs/metrics.md`).
    pub fn group_backlogs(
        &self,
        parent: u32,
        groups: &[(String, u64, Option<u64>)],
    ) -> Result<Vec<(u64, u64)>, LiteError> {
        if groups.is_empty() {
            return Ok(Vec::new());
        }
        let mut first_new = Vec::with_capacity(groups.len());
        {
            let idx = self.lock_idx();
            for (_, _, since) in groups {
                first_new.push(match since {
                    Some(pos) => Some(idx.entries.seek_pos(*pos)?),
                    None => None,
                });
            }
        }
        // Allocated (and its pages touched) before the lock is taken.
        let mut lanes: Vec<(u64, u64, u64)> = vec![(0, 0, 0); self.lane_count()];
        lanes.clear();
        {
            let t = self.lock();
            lanes.extend(
                t.lanes
                    .iter()
                    .filter(|(_, l)| l.parent == parent)
                    .map(|(id, l)| (id, l.next, l.last_entry)),
            );
        }
        // Group slot -> (lane -> stored offset).
        let mut stored: Vec<HashMap<u64, u64>> = vec![HashMap::new(); groups.len()];
        {
            let c = self.lock_commits();
            let slots: HashMap<u32, usize> = groups
                .iter()
                .enumerate()
                .filter_map(|(i, (g, _, _))| c.ids.get(g.as_str()).map(|id| (*id, i)))
                .collect();
            if !slots.is_empty() {
                for (&(lane, gid), &off) in &c.map {
                    if let Some(&i) = slots.get(&gid) {
                        stored[i].insert(lane, off);
                    }
                }
            }
        }
        let mut out = Vec::with_capacity(groups.len());
        for (i, (_, default, _)) in groups.iter().enumerate() {
            let (mut n_lanes, mut messages) = (0u64, 0u64);
            for &(id, next, last_entry) in &lanes {
                let own = stored[i].get(&id).copied();
                if own.is_none()
                    && first_new[i].is_some_and(|e| last_entry == NONE || last_entry < e)
                {
                    continue;
                }
                let committed = own.unwrap_or(*default);
                if next > committed {
                    n_lanes += 1;
                    messages += next - committed;
                }
            }
            out.push((n_lanes, messages));
        }
        Ok(out)
    }

    /// Lanes of `parent` (all, or one by key) that hold messages: `(lane id, next offset)`.
    pub fn lanes_of(&self, parent: u32, sel: &LaneSel) -> Vec<(u64, u64)> {
        let t = self.lock();
        let next = |id: u64| t.lanes.get(id).map_or(0, |l| l.next);
        let mut out: Vec<(u64, u64)> = match sel {
            LaneSel::All => t.lanes.ids_of(parent).map(|id| (id, next(id))).collect(),
            LaneSel::One(k) => t
                .lanes
                .find(parent, k)
                .map(|id| (id, next(id)))
                .into_iter()
                .collect(),
        };
        out.sort_unstable();
        out
    }

    /// Number of lanes in the table.
    pub fn lane_count(&self) -> usize {
        self.lock().lanes.len()
    }

    /// The stored committed offset of `group` on `lane`.
    pub fn load_commit(&self, lane: u64, group: &str) -> Result<Option<u64>, LiteError> {
        let c = self.lock_commits();
        Ok(c.ids
            .get(group)
            .and_then(|gid| c.map.get(&(lane, *gid)))
            .copied())
    }

    /// Store committed offsets `(lane, group, offset)`; durable at the next [`Engine::flush`].
    pub fn put_commits(&self, commits: &[(u64, Arc<str>, u64)]) -> Result<(), LiteError> {
        let mut c = self.lock_commits();
        for (lane, group, off) in commits {
            let gid = c.id(group);
            c.map.insert((*lane, gid), *off);
            encode_commit(&mut c.unjournaled, *lane, gid, *off);
        }
        Ok(())
    }

    /// Are group records (offsets, run marks) waiting for [`Engine::flush`]?
    pub fn has_unjournaled(&self) -> bool {
        !self.lock_commits().unjournaled.is_empty()
    }

    /// What `group` had done with `lane` past its committed offset before a restart (or since
    /// the last [`Engine::put_run_mark`]).
    pub fn run_mark(&self, lane: u64, group: &str) -> Option<RunMark> {
        let c = self.lock_commits();
        let gid = c.ids.get(group)?;
        c.runs.get(&(lane, *gid)).cloned()
    }

    /// Store what `group` did with `lane` past its committed offset (an empty mark clears
    /// it); durable at the next [`Engine::flush`], like the commits.
    pub fn put_run_mark(&self, lane: u64, group: &str, mark: RunMark) {
        let mut c = self.lock_commits();
        let gid = c.id(group);
        if mark.is_empty() {
            if c.runs.remove(&(lane, gid)).is_none() {
                return;
            }
        } else if c.runs.get(&(lane, gid)) == Some(&mark) {
            return;
        } else {
            c.runs.insert((lane, gid), mark.clone());
        }
        let Commits { unjournaled, .. } = &mut *c;
        encode_run(unjournaled, lane, gid, &mark);
    }

    /// The stored start policy of a group (None: the group is new).
    pub fn group_meta(&self, parent: u32, group: &str) -> Result<Option<Vec<u8>>, LiteError> {
        let mut k = vec![b'G'];
        k.extend_from_slice(&parent.to_be_bytes());
        k.extend_from_slice(group.as_bytes());
        Ok(self.tree.get(k)?.map(|v| v.to_vec()))
    }

    pub fn put_group_meta(&self, parent: u32, group: &str, v: &[u8]) -> Result<(), LiteError> {
        let mut k = vec![b'G'];
        k.extend_from_slice(&parent.to_be_bytes());
        k.extend_from_slice(group.as_bytes());
        self.tree.insert(k, v)?;
        Ok(())
    }

    /// Forget the stored start policy of a group (a private replay that ended).
    pub fn remove_group_meta(&self, parent: u32, group: &str) -> Result<(), LiteError> {
        let mut k = vec![b'G'];
        k.extend_from_slice(&parent.to_be_bytes());
        k.extend_from_slice(group.as_bytes());
        self.tree.remove(k)?;
        Ok(())
    }

    /// Groups with a stored start policy on `parent`.
    pub fn groups_of(&self, parent: u32) -> Result<Vec<String>, LiteError> {
        let mut p = vec![b'G'];
        p.extend_from_slice(&parent.to_be_bytes());
        let mut out = Vec::new();
        for kv in self.tree.scan_prefix(&p) {
            let (k, _) = kv?;
            out.push(String::from_utf8_lossy(&k[5..]).into_owned());
        }
        Ok(out)
    }

    /// Make sled durable (group offsets, index).
    pub fn flush(&self) -> Result<(), LiteError> {
        self.tree.flush()?;
        self.journal_commits()
    }

    /// Remove a lane's group offsets; its entries become garbage (reclaimed with their file).
    fn remove_lane_data(&self, idx: &mut Idx, lane: u64) -> Result<(), LiteError> {
        {
            let mut c = self.lock_commits();
            let gids: Vec<u32> = c.ids.values().copied().collect();
            for gid in gids {
                c.map.remove(&(lane, gid));
                c.runs.remove(&(lane, gid));
            }
        }
        idx.marks.remove(&lane);
        idx.dirty.remove(&lane);
        idx.gone.push(lane);
        Ok(())
    }

    /// Expire the lanes without a publish for their parent's TTL (and those of `only`, a
    /// deleted parent, when given). Removes them from the table and sled.
    pub fn sweep(&self, now_us: u64) -> Result<Vec<Expired>, LiteError> {
        let parents = self.parents();
        let ttl: HashMap<u32, u64> = parents
            .iter()
            .map(|p| (p.id, p.def.ttl_s.saturating_mul(1_000_000)))
            .collect();
        let mut idx = self.lock_idx();
        let now_s = now_us / 1_000_000;
        let expired: Vec<Expired> = {
            let mut t = self.lock();
            let t = &mut *t;
            let later = t.expiry.split_off(&now_s.saturating_add(1));
            let due = std::mem::replace(&mut t.expiry, later);
            let early = std::mem::take(&mut t.expired_early);
            if due.is_empty() && early.is_empty() {
                return Ok(Vec::new());
            }
            let pending: std::collections::HashSet<u64> =
                t.pending.iter().map(|p| p.lane).collect();
            let mut ids = Vec::new();
            for lane in due.into_values().flatten() {
                let Some(l) = t.lanes.get(lane) else {
                    continue;
                };
                let at_s = match ttl.get(&l.parent) {
                    _ if pending.contains(&lane) => now_s + 1,
                    Some(&ttl) if now_us.saturating_sub(l.last_pub_us) < ttl => {
                        l.last_pub_us.saturating_add(ttl) / 1_000_000 + 1
                    }
                    _ => {
                        ids.push(lane);
                        continue;
                    }
                };
                t.schedule(lane, at_s);
            }
            ids.into_iter()
                .filter_map(|id| {
                    let l = t.lanes.remove(id)?;
                    Some(Expired {
                        lane: id,
                        parent: l.parent,
                        key: l.key,
                    })
                })
                .chain(early)
                .collect()
        };
        for e in &expired {
            self.remove_lane_data(&mut idx, e.lane)?;
        }
        if !expired.is_empty() {
            self.counters
                .lanes_expired
                .fetch_add(expired.len() as u64, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        Ok(expired)
    }

    fn store_parent(&self, p: &Parent) -> Result<(), LiteError> {
        let v = serde_json::to_vec(&StoredParent {
            id: p.id,
            def: p.def.clone(),
        })
        .map_err(|e| LiteError::Storage(e.to_string()))?;
        self.parents_tree.insert(p.def.name.as_bytes(), v)?;
        self.parents_tree.flush()?;
        Ok(())
    }

    fn info(&self, p: &Parent) -> ParentInfo {
        let lanes = self.lock().lanes.count_of(p.id) as u64;
        ParentInfo {
            def: p.def.clone(),
            lanes,
        }
    }

    pub fn list_parents(&self) -> Vec<ParentInfo> {
        self.parents().iter().map(|p| self.info(p)).collect()
    }

    pub fn get_parent(&self, name: &str) -> Result<ParentInfo, LiteError> {
        let p = self
            .parent(name)
            .ok_or_else(|| LiteError::NotFound(name.into()))?;
        Ok(self.info(&p))
    }

    pub fn create_parent(&self, def: ParentDef) -> Result<ParentInfo, LiteError> {
        let errs = def.validate();
        if !errs.is_empty() {
            return Err(LiteError::Invalid(errs));
        }
        let list = self.parents();
        if list.iter().any(|p| p.def.name == def.name) {
            return Err(LiteError::Exists(def.name));
        }
        if let Some(o) = list.iter().find(|p| p.def.pattern == def.pattern) {
            return Err(LiteError::Conflict(format!(
                "pattern {:?} already belongs to lite parent {:?}",
                def.pattern, o.def.name
            )));
        }
        let pattern = Pattern::compile(&def.pattern, def.key_levels).map_err(|m| {
            LiteError::Invalid(vec![ValidationError {
                field: "pattern".into(),
                message: m,
            }])
        })?;
        // Ids are never reused (a deleted parent's state must not pass to a new one).
        let stored_next = self
            .parents_tree
            .get(NEXT_ID_KEY)?
            .map_or(1, |v| be64(&v) as u32);
        let id = list
            .iter()
            .map(|p| p.id + 1)
            .max()
            .unwrap_or(1)
            .max(stored_next);
        self.parents_tree
            .insert(NEXT_ID_KEY, &u64::from(id + 1).to_be_bytes())?;
        let p = Arc::new(Parent { id, def, pattern });
        self.store_parent(&p)?;
        let mut v: Vec<Arc<Parent>> = list.iter().cloned().collect();
        v.push(p.clone());
        self.set_parents(v);
        info!(parent = %p.def.name, pattern = %p.def.pattern, "lite parent created");
        Ok(self.info(&p))
    }

    /// Update a parent. The pattern and key levels cannot change while it has lanes.
    pub fn update_parent(&self, name: &str, mut def: ParentDef) -> Result<ParentInfo, LiteError> {
        if def.name.is_empty() {
            def.name = name.into();
        }
        if def.name != name {
            return Err(LiteError::Invalid(vec![ValidationError {
                field: "name".into(),
                message: format!("does not match the parent in the path ({name:?})"),
            }]));
        }
        let errs = def.validate();
        if !errs.is_empty() {
            return Err(LiteError::Invalid(errs));
        }
        let list = self.parents();
        let old = list
            .iter()
            .find(|p| p.def.name == name)
            .cloned()
            .ok_or_else(|| LiteError::NotFound(name.into()))?;
        if (old.def.pattern != def.pattern || old.def.key_levels != def.key_levels)
            && self.info(&old).lanes > 0
        {
            return Err(LiteError::Conflict(format!(
                "lite parent {name:?} has lanes: its pattern and key_levels cannot change \
                 (delete and create it again)"
            )));
        }
        let pattern = Pattern::compile(&def.pattern, def.key_levels).map_err(|m| {
            LiteError::Invalid(vec![ValidationError {
                field: "pattern".into(),
                message: m,
            }])
        })?;
        let p = Arc::new(Parent {
            id: old.id,
            def,
            pattern,
        });
        self.store_parent(&p)?;
        let v: Vec<Arc<Parent>> = list
            .iter()
            .map(|x| if x.id == p.id { p.clone() } else { x.clone() })
            .collect();
        self.set_parents(v);
        self.reschedule_all();
        Ok(self.info(&p))
    }

    /// Delete a parent and all its lanes; returns the removed lane ids.
    pub fn delete_parent(&self, name: &str) -> Result<Vec<u64>, LiteError> {
        let list = self.parents();
        let old = list
            .iter()
            .find(|p| p.def.name == name)
            .cloned()
            .ok_or_else(|| LiteError::NotFound(name.into()))?;
        self.set_parents(list.iter().filter(|p| p.id != old.id).cloned().collect());
        self.parents_tree.remove(name.as_bytes())?;
        self.parents_tree.flush()?;
        let ids: Vec<u64> = {
            let mut t = self.lock();
            let ids = t.lanes.remove_parent(old.id);
            let gone: std::collections::HashSet<u64> = ids.iter().copied().collect();
            t.pending.retain(|p| !gone.contains(&p.lane));
            ids
        };
        {
            let mut idx = self.lock_idx();
            for id in &ids {
                self.remove_lane_data(&mut idx, *id)?;
            }
        }
        let mut p = vec![b'G'];
        p.extend_from_slice(&old.id.to_be_bytes());
        for kv in self.tree.scan_prefix(&p) {
            let (k, _) = kv?;
            self.tree.remove(k)?;
        }
        info!(parent = %name, lanes = ids.len(), "lite parent deleted");
        Ok(ids)
    }

    fn lane_info(&self, p: &Parent, id: u64, l: &Lane) -> LaneInfo {
        let first = self.first_seq(id, l.next);
        LaneInfo {
            lane: l.key.to_string(),
            id,
            next_offset: l.next,
            first_offset: first,
            last_publish_us: l.last_pub_us,
            expires_at_us: l
                .last_pub_us
                .saturating_add(p.def.ttl_s.saturating_mul(1_000_000)),
        }
    }

    /// Up to `limit` lanes of `parent` by key, strictly after `after`; and whether more follow.
    pub fn list_lanes(
        &self,
        parent: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<LaneInfo>, bool), LiteError> {
        let p = self
            .parent(parent)
            .ok_or_else(|| LiteError::NotFound(parent.into()))?;
        let rows: Vec<(u64, Box<str>, u64, u64)> = {
            let t = self.lock();
            t.lanes
                .page(p.id, after, limit.saturating_add(1))
                .into_iter()
                .filter_map(|id| {
                    t.lanes
                        .get(id)
                        .map(|l| (id, l.key.clone(), l.next, l.last_pub_us))
                })
                .collect()
        };
        let more = rows.len() > limit;
        let out = rows
            .into_iter()
            .take(limit)
            .map(|(id, key, next, last)| {
                let l = Lane {
                    parent: p.id,
                    key,
                    next,
                    last_pub_us: last,
                    last_entry: NONE,
                };
                self.lane_info(&p, id, &l)
            })
            .collect();
        Ok((out, more))
    }

    /// One lane of `parent` by key.
    pub fn get_lane(&self, parent: &str, key: &str) -> Result<Option<LaneInfo>, LiteError> {
        let p = self
            .parent(parent)
            .ok_or_else(|| LiteError::NotFound(parent.into()))?;
        let row = {
            let t = self.lock();
            t.lanes.find(p.id, key).and_then(|id| {
                t.lanes
                    .get(id)
                    .map(|l| (id, l.key.clone(), l.next, l.last_pub_us))
            })
        };
        Ok(row.map(|(id, key, next, last)| {
            let l = Lane {
                parent: p.id,
                key,
                next,
                last_pub_us: last,
                last_entry: NONE,
            };
            self.lane_info(&p, id, &l)
        }))
    }

    /// Warn about parents whose patterns overlap (the first one wins).
    pub fn warn_overlaps(&self) {
        let list = self.parents();
        for (i, a) in list.iter().enumerate() {
            for b in list.iter().skip(i + 1) {
                if a.pattern
                    .lane_sel(&b.def.pattern.replace("{lane}", "+"))
                    .is_some()
                {
                    warn!(first = %a.def.name, second = %b.def.name,
                        "lite parents overlap: a topic matching both goes to the first");
                }
            }
        }
    }
}

/// `<data_dir>/lanes`, next to the log.
fn lanes_dir(store: &Store) -> PathBuf {
    let log = store.log_dir();
    log.parent().unwrap_or(log).join("lanes")
}

/// Walk `lane`'s chain down from entry `i` to offset `from` (newest first), calling `f` on
/// each entry; leaves a mark every [`MARK_EVERY`] entries of a long walk. The walk ends at the
/// chain's start, at removed entries, and at anything that is not the lane's previous offset.
fn walk(
    idx: &mut Idx,
    lane: u64,
    mut i: u64,
    from: u64,
    mut f: impl FnMut(&LaneEntry),
) -> Result<(), LiteError> {
    let mut steps = 0u64;
    let mut expect: Option<u64> = None;
    let mut marks = Vec::new();
    while i != NONE {
        let Some(e) = idx.entries.get(i)? else {
            break;
        };
        if e.lane != lane || e.seq < from || expect.is_some_and(|x| x != e.seq) {
            break;
        }
        f(&e);
        steps += 1;
        if steps % MARK_EVERY == 0 {
            marks.push((e.seq, i));
        }
        if e.seq == from || e.seq == 0 {
            break;
        }
        expect = Some(e.seq - 1);
        i = e.prev;
    }
    if !marks.is_empty() {
        idx.marks.entry(lane).or_default().extend(marks);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use lanemq_store::{Index, RecordIn, StoreOptions};

    struct TempDir(PathBuf);

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    struct Fixture {
        dir: TempDir,
        store: Store,
        index: Index,
    }

    impl Fixture {
        fn new(tag: &str) -> Fixture {
            let dir = std::env::temp_dir().join(format!(
                "lanemq-lite-{tag}-{}-{}",
                std::process::id(),
                now_us()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let (store, _) = Store::open(StoreOptions::new(&dir)).unwrap();
            let index = Index::open(&dir.join("index")).unwrap();
            Fixture {
                dir: TempDir(dir),
                store,
                index,
            }
        }

        fn engine(&self) -> Arc<Engine> {
            let def = ParentDef {
                name: "agents".into(),
                pattern: "agents/{lane}/#".into(),
                ..ParentDef::default()
            };
            Engine::open(self.store.clone(), &self.index, &[def]).unwrap()
        }

        /// Publish to `agents/<key>/x` through the engine's assign, durably.
        fn publish(&self, e: &Engine, key: &str) -> u64 {
            let rec = RecordIn {
                qos: 1,
                topic: format!("agents/{key}/x").into(),
                client_id: "c".into(),
                ..RecordIn::default()
            };
            let Classified::Lane { parent, key } = e.classify(&rec.topic.clone()) else {
                panic!("not a lane");
            };
            let off = self
                .store
                .append_with(
                    rec,
                    |pos, hints| hints.push(e.assign(parent, &key, pos)),
                    Box::new(|_| {}),
                )
                .unwrap();
            self.store.sync().unwrap();
            off
        }

        /// Stop without a checkpoint (a crash of the lane index), reopen store and index.
        fn reopen(self) -> Fixture {
            let Fixture { dir, store, index } = self;
            store.close().unwrap();
            index.flush().unwrap();
            drop(store);
            drop(index);
            let (store, _) = Store::open(StoreOptions::new(&dir.0)).unwrap();
            let index = Index::open(&dir.0.join("index")).unwrap();
            Fixture { dir, store, index }
        }
    }

    fn index_all(e: &Engine) {
        while e.has_pending() {
            e.index_durable().unwrap();
        }
    }

    fn offsets(e: &Engine, key: &str, from: u64, max: usize) -> Vec<u64> {
        let lane = e.lane_id(e.parent("agents").unwrap().id, key).unwrap();
        e.read_lane(lane, from, max)
            .unwrap()
            .into_iter()
            .map(|x| x.0)
            .collect()
    }

    #[test]
    fn lanes_read_back_from_their_chains_and_survive_a_crash_after_a_checkpoint() {
        let f = Fixture::new("chain");
        let e = f.engine();
        let mut pos_b = Vec::new();
        for i in 0..3000u64 {
            f.publish(&e, "a");
            if i % 3 == 0 {
                pos_b.push(f.publish(&e, "b"));
            }
        }
        index_all(&e);
        assert_eq!(offsets(&e, "b", 0, 5), [0, 1, 2, 3, 4]);
        // A deep read leaves marks; reads below and above them are exact.
        assert_eq!(offsets(&e, "a", 10, 3), [10, 11, 12]);
        assert_eq!(offsets(&e, "a", 2998, 10), [2998, 2999]);
        assert_eq!(offsets(&e, "a", 1500, 2), [1500, 1501]);
        assert_eq!(offsets(&e, "a", 3000, 2), Vec::<u64>::new());
        let lane_b = e.lane_id(e.parent("agents").unwrap().id, "b").unwrap();
        let got: Vec<u64> = e
            .read_lane(lane_b, 0, 10_000)
            .unwrap()
            .into_iter()
            .map(|x| x.1)
            .collect();
        assert_eq!(got, pos_b);
        e.checkpoint().unwrap();
        // After the checkpoint: 5 more messages in `a`, a new lane `c`, indexed, not
        // checkpointed; then the process dies.
        for _ in 0..5 {
            f.publish(&e, "a");
        }
        f.publish(&e, "c");
        index_all(&e);
        drop(e);
        let f = f.reopen();
        let e = f.engine();
        assert_eq!(e.lane_count(), 3);
        assert_eq!(
            e.next_offset(e.lane_id(e.parent("agents").unwrap().id, "a").unwrap()),
            3005
        );
        assert_eq!(
            offsets(&e, "a", 2999, 10),
            [2999, 3000, 3001, 3002, 3003, 3004]
        );
        assert_eq!(offsets(&e, "a", 0, 2), [0, 1]);
        assert_eq!(offsets(&e, "c", 0, 2), [0]);
        assert_eq!(offsets(&e, "b", 999, 5), [999]);
        // New offsets continue after the recovered ones.
        f.publish(&e, "a");
        index_all(&e);
        assert_eq!(offsets(&e, "a", 3005, 2), [3005]);
        let (info, _) = e.list_lanes("agents", None, 10).unwrap();
        let a = info.iter().find(|l| l.lane == "a").unwrap();
        assert_eq!((a.first_offset, a.next_offset), (0, 3006));
    }

    #[test]
    fn the_watermark_moves_past_plain_records_without_lane_changes() {
        let f = Fixture::new("wm");
        let e = f.engine();
        f.publish(&e, "a");
        index_all(&e);
        e.checkpoint().unwrap();
        let before = e.lock_idx().journaled_watermark;
        for _ in 0..100 {
            let rec = RecordIn {
                qos: 1,
                topic: "plain/x".into(),
                client_id: "c".into(),
                ..RecordIn::default()
            };
            f.store
                .append_with(rec, |_, _| {}, Box::new(|_| {}))
                .unwrap();
        }
        f.store.sync().unwrap();
        // No lane changed, yet the checkpoint journals the new watermark...
        e.checkpoint_now(false).unwrap();
        let after = e.lock_idx().journaled_watermark;
        assert_eq!(after, f.store.committed_offset());
        assert!(after >= before + 100, "{before} -> {after}");
        // ...once: with nothing new, nothing is written.
        let len = e.lock_journal().len();
        e.checkpoint_now(false).unwrap();
        assert_eq!(e.lock_journal().len(), len);
        // After a crash the journal holds it, so a restart reads none of the plain records.
        drop(e);
        let f = f.reopen();
        let (_, loaded) = Journal::open(&lanes_dir(&f.store), |_| {}).unwrap();
        assert_eq!(loaded.checkpoint.unwrap().watermark, after);
        let e = f.engine();
        assert_eq!(offsets(&e, "a", 0, 5), [0]);
        f.publish(&e, "a");
        index_all(&e);
        assert_eq!(offsets(&e, "a", 0, 5), [0, 1]);
    }

    #[test]
    fn an_older_versions_sled_entries_move_into_the_entry_files() {
        let f = Fixture::new("legacy");
        let e = f.engine();
        let mut pos = Vec::new();
        for _ in 0..4 {
            pos.push(f.publish(&e, "k"));
        }
        drop(e);
        // What an older version stored: one sled entry per message, and the watermark.
        let tree = f.index.tree("l_lite").unwrap();
        for (seq, p) in pos.iter().enumerate() {
            let mut k = vec![b'i'];
            k.extend_from_slice(&0u64.to_be_bytes());
            k.extend_from_slice(&(seq as u64).to_be_bytes());
            let mut v = p.to_be_bytes().to_vec();
            v.extend_from_slice(&7u64.to_be_bytes());
            tree.insert(k, v).unwrap();
        }
        tree.insert([b'w'], &(pos[3] + 1).to_be_bytes()).unwrap();
        let mut g = vec![b'g'];
        g.extend_from_slice(&0u64.to_be_bytes());
        g.extend_from_slice(b"workers");
        tree.insert(g, &2u64.to_be_bytes()).unwrap();
        let dir = lanes_dir(&f.store);
        std::fs::remove_dir_all(&dir).unwrap();
        let e = f.engine();
        let lane = e.lane_id(e.parent("agents").unwrap().id, "k").unwrap();
        let got: Vec<(u64, u64)> = e
            .read_lane(lane, 0, 10)
            .unwrap()
            .into_iter()
            .map(|x| (x.0, x.1))
            .collect();
        assert_eq!(got, (0..4).zip(pos.iter().copied()).collect::<Vec<_>>());
        assert!(tree.scan_prefix([b'i']).next().is_none());
        assert!(tree.get([b'w']).unwrap().is_none());
        assert_eq!(e.next_offset(lane), 4);
        assert_eq!(e.load_commit(lane, "workers").unwrap(), Some(2));
        assert!(tree.scan_prefix([b'g']).next().is_none());
    }

    #[test]
    fn the_offline_check_matches_entries_with_the_log_and_finds_a_broken_chain() {
        let f = Fixture::new("verify");
        let e = f.engine();
        for i in 0..50 {
            f.publish(&e, if i % 3 == 0 { "a" } else { "b" });
        }
        index_all(&e);
        e.checkpoint().unwrap();
        f.publish(&e, "c");
        index_all(&e); // indexed, not checkpointed: past the journaled end
        let r = crate::verify::verify(&f.dir.0).unwrap();
        assert!(r.is_ok(), "{:?}", r.problems);
        assert_eq!(
            (r.present, r.lanes, r.entries, r.matched),
            (true, 2, 50, 50)
        );
        assert_eq!(r.past_end, 1);
        drop(e);
        // Entry 10 now claims another lane's offset: its record and the chains disagree.
        let file = lanes_dir(&f.store).join(format!("{:020}.lxe", 0));
        let mut bytes = std::fs::read(&file).unwrap();
        let at = 10 * crate::entries::ENTRY_BYTES as usize;
        bytes[at..at + 8].copy_from_slice(&999u64.to_be_bytes());
        std::fs::write(&file, bytes).unwrap();
        let r = crate::verify::verify(&f.dir.0).unwrap();
        assert!(!r.is_ok());
        assert!(
            r.problems.iter().any(|p| p.contains("entry 10")),
            "{:?}",
            r.problems
        );
    }

    #[test]
    fn group_offsets_are_durable_after_a_flush_and_go_with_their_lane() {
        let f = Fixture::new("commits");
        let e = f.engine();
        f.publish(&e, "a");
        f.publish(&e, "b");
        index_all(&e);
        let (a, b) = (
            e.lane_id(e.parent("agents").unwrap().id, "a").unwrap(),
            e.lane_id(e.parent("agents").unwrap().id, "b").unwrap(),
        );
        let g: Arc<str> = "workers".into();
        e.put_commits(&[(a, g.clone(), 1), (b, g.clone(), 1)])
            .unwrap();
        e.flush().unwrap();
        e.put_commits(&[(a, g.clone(), 7)]).unwrap(); // not flushed: lost in the crash
        drop(e);
        let f = f.reopen();
        let e = f.engine();
        assert_eq!(e.load_commit(a, "workers").unwrap(), Some(1));
        assert_eq!(e.load_commit(b, "workers").unwrap(), Some(1));
        assert_eq!(e.load_commit(a, "other").unwrap(), None);
        // A lane that expires takes its offsets with it, also across a restart.
        let expired = e.sweep(now_us() + 10_000 * 1_000_000).unwrap();
        assert_eq!(expired.len(), 2);
        assert_eq!(e.load_commit(a, "workers").unwrap(), None);
        e.checkpoint().unwrap();
        drop(e);
        let f = f.reopen();
        let e = f.engine();
        assert_eq!(e.lane_count(), 0);
        assert_eq!(e.load_commit(a, "workers").unwrap(), None);
    }

    #[test]
    fn in_log_time_a_record_past_the_ttl_starts_its_lane_again() {
        let f = Fixture::new("logtime");
        let e = f.engine();
        e.use_log_time();
        let pid = e.parent("agents").unwrap().id;
        let ttl = e.parent("agents").unwrap().def.ttl_s * 1_000_000;
        let t0 = 1_000_000;
        e.advance_clock(t0);
        f.publish(&e, "a");
        f.publish(&e, "a");
        index_all(&e);
        let first = e.lane_id(pid, "a").unwrap();
        assert_eq!(e.next_offset(first), 2);
        // This machine's clock is far ahead; the log's time is not: nothing expires.
        assert!(e.sweep(e.clock_us()).unwrap().is_empty());
        e.advance_clock(t0 + ttl - 1);
        f.publish(&e, "a");
        index_all(&e);
        assert_eq!(e.lane_id(pid, "a"), Some(first));
        assert_eq!(e.next_offset(first), 3);
        // One TTL after the last publish, in the log's time: the record starts the lane again
        // (no sweep ran), and the next sweep reports the old lane expired.
        e.advance_clock(t0 + 2 * ttl - 1);
        f.publish(&e, "a");
        index_all(&e);
        let second = e.lane_id(pid, "a").unwrap();
        assert_ne!(first, second);
        assert_eq!(e.next_offset(second), 1);
        let expired = e.sweep(e.clock_us()).unwrap();
        assert_eq!(expired.len(), 1);
        assert_eq!(expired[0].lane, first);
        assert_eq!(e.lane_count(), 1);
    }
}
