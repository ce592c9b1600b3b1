//! The parent registry, the lane table and the lane index.
//!
//! Storage (sled, tree `l_lite`, big-endian keys so ranges come out in order):
//!
//! ```text
//! 'w'                                   -> watermark u64: every lane hint of a record below it is indexed
//! 'i' | lane u64 | offset u64           -> log position u64 | store time µs u64
//! 'g' | lane u64 | group                -> committed offset u64 (first unacknowledged)
//! 'G' | parent u32 | group              -> group start policy (written when the group is new)
//! ```
//! Parents live in tree `l_parents` (name -> JSON `{id, def}`).
//!
//! The lane table is in memory: key -> lane id per parent (ordered, for pagination) and, per
//! lane, its next offset and last publish time. Nothing per lane is written besides its
//! entries: at start the lanes are found from their entries, the key from the topic of the
//! newest record of each. A lane's offset is assigned by
//! [`Engine::assign`] under the log's append lock; the entry reaches sled once the record is
//! durable ([`Engine::index_durable`]). After a crash, [`Engine::open`] rebuilds the table from
//! the metadata, the last index entry of every lane, and the log after the watermark.

use crate::model::{LaneSel, ParentDef, Pattern, ValidationError};
use lanemq_store::{IndexHint, Store};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
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

/// A lane in the table.
#[derive(Debug)]
pub struct Lane {
    pub parent: u32,
    pub key: Box<str>,
    pub next: u64,
    pub last_pub_us: u64,
}

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
    by_key: HashMap<u32, BTreeMap<Box<str>, u64>>,
    lanes: HashMap<u64, Lane>,
    next_id: u64,
    pending: Vec<Pending>,
}

/// The lite layer's registry and index.
pub struct Engine {
    store: Store,
    tree: sled::Tree,
    parents_tree: sled::Tree,
    parents: RwLock<Arc<Vec<Arc<Parent>>>>,
    any: AtomicBool,
    table: Mutex<Table>,
    pub counters: Counters,
    /// Set whenever lanes are created, expired or parents change (listing caches, tests).
    pub generation: AtomicU64,
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

fn lane_key(tag: u8, lane: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = tag;
    k[1..].copy_from_slice(&lane.to_be_bytes());
    k
}

fn entry_key(lane: u64, seq: u64) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[0] = b'i';
    k[1..9].copy_from_slice(&lane.to_be_bytes());
    k[9..].copy_from_slice(&seq.to_be_bytes());
    k
}

fn group_key(lane: u64, group: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + group.len());
    k.extend_from_slice(&lane_key(b'g', lane));
    k.extend_from_slice(group.as_bytes());
    k
}

fn be64(v: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = v.len().min(8);
    b[..n].copy_from_slice(&v[..n]);
    u64::from_be_bytes(b)
}

/// µs since the Unix epoch.
pub fn now_us() -> u64 {
    lanemq_store::now_us()
}

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
        let e = Engine {
            store,
            tree,
            parents_tree,
            parents: RwLock::new(Arc::new(Vec::new())),
            any: AtomicBool::new(false),
            table: Mutex::new(Table::default()),
            counters: Counters::default(),
            generation: AtomicU64::new(0),
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
        e.recover()?;
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

    fn recover(&self) -> Result<(), LiteError> {
        let mut t = self.lock();
        let mut max_id = 0u64;
        let mut orphans = Vec::new();
        // Lanes are found from their index entries (no per-lane metadata is written: it would
        // double the sled writes of lane creation). The key comes from the topic of the
        // lane's newest stored record.
        let mut last: Option<(u64, u64, u64, u64)> = None; // lane, last seq, last pos, last ts
        let mut found: Vec<(u64, u64, u64, u64)> = Vec::new();
        for kv in self.tree.scan_prefix([b'i']) {
            let (k, v) = kv?;
            if k.len() < 17 {
                continue;
            }
            let lane = be64(&k[1..9]);
            let seq = be64(&k[9..17]);
            let pos = be64(&v[..v.len().min(8)]);
            let ts = be64(v.get(8..16).unwrap_or(&[]));
            if let Some(l) = last.filter(|l| l.0 != lane) {
                found.push(l);
            }
            last = Some((lane, seq, pos, ts));
        }
        found.extend(last);
        for (lane, seq, pos, ts) in found {
            max_id = max_id.max(lane + 1);
            let found = match self.store.read(pos) {
                Ok(r) => self.match_parent(&r.topic),
                Err(_) => None,
            };
            let Some((parent, key)) = found else {
                // Its parent is gone, or its records are: the lane goes.
                orphans.push(lane);
                continue;
            };
            let key: Box<str> = key.into();
            t.by_key
                .entry(parent)
                .or_default()
                .insert(key.clone(), lane);
            t.lanes.insert(
                lane,
                Lane {
                    parent,
                    key,
                    next: seq + 1,
                    last_pub_us: ts,
                },
            );
        }
        t.next_id = max_id;
        drop(t);
        for lane in orphans {
            self.remove_lane_data(lane)?;
        }
        // The log after the watermark: entries whose record is durable but whose index write
        // did not happen before the stop.
        let from = self
            .tree
            .get([b'w'])?
            .map_or(0, |v| be64(&v))
            .max(self.store.first_offset());
        let end = self.store.committed_offset();
        let mut reader = self.store.reader(from);
        let mut replayed = 0u64;
        'log: loop {
            let batch = reader.next_batch(1024, 4 << 20)?;
            if batch.is_empty() {
                break;
            }
            let mut b = sled::Batch::default();
            for r in &batch {
                if r.offset >= end {
                    break 'log;
                }
                for h in &r.index_hints {
                    if h.kind != IndexHint::KIND_LANE {
                        continue;
                    }
                    let mut t = self.lock();
                    if !t.lanes.contains_key(&h.id) {
                        let Some((parent, key)) = self.match_parent(&r.topic) else {
                            continue;
                        };
                        let key: Box<str> = key.into();
                        t.by_key
                            .entry(parent)
                            .or_default()
                            .insert(key.clone(), h.id);
                        t.lanes.insert(
                            h.id,
                            Lane {
                                parent,
                                key,
                                next: 0,
                                last_pub_us: r.timestamp_us,
                            },
                        );
                        t.next_id = t.next_id.max(h.id + 1);
                    }
                    if let Some(l) = t.lanes.get_mut(&h.id) {
                        l.next = l.next.max(h.seq + 1);
                        l.last_pub_us = l.last_pub_us.max(r.timestamp_us);
                    }
                    let mut v = [0u8; 16];
                    v[..8].copy_from_slice(&r.offset.to_be_bytes());
                    v[8..].copy_from_slice(&r.timestamp_us.to_be_bytes());
                    b.insert(&entry_key(h.id, h.seq), &v[..]);
                    replayed += 1;
                }
            }
            self.tree.apply_batch(b)?;
        }
        self.tree.insert([b'w'], &end.to_be_bytes())?;
        let lanes = self.lock().lanes.len();
        info!(lanes, replayed, "lite lanes recovered");
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
            let lanes = t.by_key.get(&p.id);
            let exists = lanes.is_some_and(|m| m.contains_key(key));
            let count = lanes.map_or(0, |m| m.len() as u64);
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

    /// Assign the next offset of the lane `key` of `parent` to the record at log position
    /// `pos` (creating the lane); called under the log's append lock. Returns the hint.
    pub fn assign(&self, parent: u32, key: &str, pos: u64) -> IndexHint {
        let now = now_us();
        let mut t = self.lock();
        let t = &mut *t;
        let mut new = false;
        let lane = match t.by_key.get(&parent).and_then(|m| m.get(key)) {
            Some(&id) => id,
            None => {
                let id = t.next_id;
                t.next_id += 1;
                let key: Box<str> = key.into();
                t.by_key.entry(parent).or_default().insert(key.clone(), id);
                t.lanes.insert(
                    id,
                    Lane {
                        parent,
                        key,
                        next: 0,
                        last_pub_us: now,
                    },
                );
                new = true;
                id
            }
        };
        let l = t.lanes.entry(lane).or_insert_with(|| Lane {
            parent,
            key: key.into(),
            next: 0,
            last_pub_us: now,
        });
        let seq = l.next;
        l.next += 1;
        l.last_pub_us = now;
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

    /// Write the entries whose records are durable to sled (with the watermark); returns
    /// them (the lanes that have new messages).
    pub fn index_durable(&self) -> Result<Vec<Pending>, LiteError> {
        let committed = self.store.committed_offset();
        let (done, watermark) = {
            let mut t = self.lock();
            // Bounded sled batches: one huge batch makes sled hold its whole image in memory.
            let n = t
                .pending
                .partition_point(|p| p.pos < committed)
                .min(INDEX_BATCH_MAX);
            if n == 0 {
                return Ok(Vec::new());
            }
            let done: Vec<Pending> = t.pending.drain(..n).collect();
            let watermark = t
                .pending
                .first()
                .map_or(committed, |p| p.pos.min(committed));
            (done, watermark)
        };
        let mut b = sled::Batch::default();
        for p in &done {
            let mut v = [0u8; 16];
            v[..8].copy_from_slice(&p.pos.to_be_bytes());
            v[8..].copy_from_slice(&p.ts_us.to_be_bytes());
            b.insert(&entry_key(p.lane, p.seq), &v[..]);
        }
        b.insert(b"w", &watermark.to_be_bytes());
        self.tree.apply_batch(b)?;
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
        let mut out = Vec::new();
        for kv in self
            .tree
            .range(entry_key(lane, from)..=entry_key(lane, u64::MAX))
        {
            let (k, v) = kv?;
            out.push((
                be64(&k[9..]),
                be64(&v[..8]),
                be64(v.get(8..16).unwrap_or(&[])),
            ));
            if out.len() >= max {
                break;
            }
        }
        Ok(out)
    }

    /// The lane's next offset, its parent and key (None if it does not exist).
    pub fn lane(&self, lane: u64) -> Option<(u32, Box<str>, u64, u64)> {
        let t = self.lock();
        t.lanes
            .get(&lane)
            .map(|l| (l.parent, l.key.clone(), l.next, l.last_pub_us))
    }

    /// The lane id of `key` in `parent`.
    pub fn lane_id(&self, parent: u32, key: &str) -> Option<u64> {
        self.lock().by_key.get(&parent)?.get(key).copied()
    }

    /// Next offset of a lane (0 if unknown).
    pub fn next_offset(&self, lane: u64) -> u64 {
        self.lock().lanes.get(&lane).map_or(0, |l| l.next)
    }

    /// Lanes of `parent` (all, or one by key) that hold messages: `(lane id, next offset)`.
    pub fn lanes_of(&self, parent: u32, sel: &LaneSel) -> Vec<(u64, u64)> {
        let t = self.lock();
        let Some(m) = t.by_key.get(&parent) else {
            return Vec::new();
        };
        let next = |id: &u64| t.lanes.get(id).map_or(0, |l| l.next);
        match sel {
            LaneSel::All => m.values().map(|id| (*id, next(id))).collect(),
            LaneSel::One(k) => m
                .get(k.as_str())
                .map(|id| (*id, next(id)))
                .into_iter()
                .collect(),
        }
    }

    /// Number of lanes in the table.
    pub fn lane_count(&self) -> usize {
        self.lock().lanes.len()
    }

    /// The stored committed offset of `group` on `lane`.
    pub fn load_commit(&self, lane: u64, group: &str) -> Result<Option<u64>, LiteError> {
        Ok(self.tree.get(group_key(lane, group))?.map(|v| be64(&v)))
    }

    /// Store committed offsets `(lane, group, offset)`.
    pub fn put_commits(&self, commits: &[(u64, Arc<str>, u64)]) -> Result<(), LiteError> {
        if commits.is_empty() {
            return Ok(());
        }
        let mut b = sled::Batch::default();
        for (lane, group, off) in commits {
            b.insert(group_key(*lane, group), &off.to_be_bytes());
        }
        self.tree.apply_batch(b)?;
        Ok(())
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
        Ok(())
    }

    fn remove_lane_data(&self, lane: u64) -> Result<(), LiteError> {
        let mut b = sled::Batch::default();
        b.remove(&lane_key(b'm', lane));
        for prefix in [lane_key(b'i', lane), lane_key(b'g', lane)] {
            for kv in self.tree.scan_prefix(prefix) {
                let (k, _) = kv?;
                b.remove(k);
            }
        }
        self.tree.apply_batch(b)?;
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
        let expired: Vec<Expired> = {
            let mut t = self.lock();
            let pending: std::collections::HashSet<u64> =
                t.pending.iter().map(|p| p.lane).collect();
            let ids: Vec<u64> = t
                .lanes
                .iter()
                .filter(|(id, l)| {
                    !pending.contains(id)
                        && ttl
                            .get(&l.parent)
                            .is_none_or(|&ttl| now_us.saturating_sub(l.last_pub_us) >= ttl)
                })
                .map(|(id, _)| *id)
                .collect();
            ids.into_iter()
                .filter_map(|id| {
                    let l = t.lanes.remove(&id)?;
                    if let Some(m) = t.by_key.get_mut(&l.parent) {
                        m.remove(&l.key);
                    }
                    Some(Expired {
                        lane: id,
                        parent: l.parent,
                        key: l.key,
                    })
                })
                .collect()
        };
        for e in &expired {
            self.remove_lane_data(e.lane)?;
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
        let lanes = self.lock().by_key.get(&p.id).map_or(0, |m| m.len() as u64);
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
            let ids: Vec<u64> = t
                .by_key
                .remove(&old.id)
                .map(|m| m.into_values().collect())
                .unwrap_or_default();
            for id in &ids {
                t.lanes.remove(id);
            }
            let gone: std::collections::HashSet<u64> = ids.iter().copied().collect();
            t.pending.retain(|p| !gone.contains(&p.lane));
            ids
        };
        for id in &ids {
            self.remove_lane_data(*id)?;
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
        let first = self
            .tree
            .scan_prefix(lane_key(b'i', id))
            .next()
            .and_then(|r| r.ok())
            .map_or(l.next, |(k, _)| be64(&k[9..]));
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
            let Some(m) = t.by_key.get(&p.id) else {
                return Ok((Vec::new(), false));
            };
            let range: Box<dyn Iterator<Item = (&Box<str>, &u64)>> = match after {
                Some(a) => Box::new(
                    m.range::<str, _>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded)),
                ),
                None => Box::new(m.iter()),
            };
            range
                .take(limit + 1)
                .filter_map(|(_, id)| {
                    t.lanes
                        .get(id)
                        .map(|l| (*id, l.key.clone(), l.next, l.last_pub_us))
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
            t.by_key.get(&p.id).and_then(|m| m.get(key)).and_then(|id| {
                t.lanes
                    .get(id)
                    .map(|l| (*id, l.key.clone(), l.next, l.last_pub_us))
            })
        };
        Ok(row.map(|(id, key, next, last)| {
            let l = Lane {
                parent: p.id,
                key,
                next,
                last_pub_us: last,
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
