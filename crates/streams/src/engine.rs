//! The stream engine: the registry, the indexer that follows the log, retention and readers.
//!
//! A stream never copies a regular message: the log holds the message once and each stream
//! that captures it holds an *entry* (the log offset, the arrival time, the size, whether it
//! has a key). A last-value stream also keeps a copy of the newest record of each key inside
//! its entry, so last values outlive the log segment that first held them.
//!
//! # Layout
//!
//! A **regular** stream's entries are a dense run in files of its own
//! (`<data_dir>/streams/<id>/`, 24 bytes an entry, [`crate::entries`]): nothing per message
//! in sled or in memory. A **last-value** stream's entries live in sled, one per key (plus its
//! keyless messages), in the tree `s_streams` (integers big-endian):
//!
//! | key | value |
//! |---|---|
//! | `r` name | registry entry (JSON: definition, id, created_at_us, created_offset) |
//! | `m` `next_id` | next stream id u64 |
//! | `m` `settings` | global settings (JSON), once changed at run time |
//! | `w` | checkpointed watermark: every record below it is in every stream's index u64 |
//! | `n` id u64 | regular stream checkpoint: head index u64, end index u64 |
//! | `x` id u64 | last-value stream: next log offset it indexed u64 (written with its entries) |
//! | `e` id u64, offset u64 | last-value entry: ts_us u64, size u32, flags u8, key_len u16, key, [record] |
//! | `k` id u64, key | offset u64 of the key's entry (last-value streams) |
//! | `c` id u64 | counts: messages u64, bytes u64, keyless u64 |
//! | `d` id u64 | stream deleted, entries not yet purged |
//!
//! # Invariants
//!
//! - The indexer reads only committed (durable) records, in log order. Every stream skips
//!   records below its own indexed position (the last entry's offset + 1 for a regular
//!   stream, `x` for a last-value one), so indexing a record again after a crash never adds
//!   an entry twice.
//! - Checkpoint (every [`CHECKPOINT_MS`] and at close): the entry files are fsynced, then the
//!   regular streams' head, end and counts and the watermark go to sled in one batch, and
//!   sled is flushed. After a crash, entries past the checkpointed end are cut and the log is
//!   indexed again from the checkpointed watermark (at most one checkpoint interval). Log
//!   retention never removes records at or above the checkpointed watermark.
//! - A last-value stream's entries, counts and `x` are written in one atomic sled batch.
//! - A stream captures only records at or after its `created_offset` (the log's next offset
//!   when it was created), so replaying the log after a crash indexes the same records again.
//! - Entries are ordered by log offset and the indexer only adds entries above every offset
//!   it indexed before: a reader that moves forward through the entries never misses one and
//!   never sees one twice (the history-to-live switch needs no special case).
//! - Expired entries (older than `data_retention_period`) are skipped by readers at once and
//!   removed by [`Engine::gc`]; count and byte limits are enforced after each indexer batch.
//! - Index writes (indexer batches, retention, checkpoints, deletion) are serialised by one
//!   lock, so counts are never updated from a stale copy.

use crate::entries::{Entries, RawEntry, FLAG_HAS_KEY as RAW_HAS_KEY};
use crate::filter_index::FilterIndex;
use crate::keyexpr::{KeyExpr, KeyInput};
use crate::model::{
    GlobalSettings, StreamDef, StreamError, StreamInfo, StreamStats, ValidationError,
};
use crate::subscribe::StartFrom;
use bytes::Bytes;
use lanemq_store::{record, LogReader, Record, Store, StoreError};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};
use tracing::{error, info, warn};

/// Records the indexer reads per batch.
const INDEX_BATCH_RECORDS_MAX: usize = 4096;
/// Payload bytes the indexer reads per batch.
const INDEX_BATCH_BYTES_MAX: usize = 8 << 20;
/// The indexer wakes at least this often even without a poke.
const INDEX_TICK_MS: u64 = 20;
/// Entries removed per sled batch by retention.
const GC_BATCH_MAX: usize = 10_000;
/// The indexer checkpoints (fsync of the entry files, then positions and counts to sled) at
/// least this often while it indexes.
pub const CHECKPOINT_MS: u64 = 1000;
/// Entries read per file read by retention.
const TRIM_CHUNK: usize = 4096;
/// A reader re-seeks the log instead of skipping forward over more records than this.
const READ_SKIP_MAX: u64 = 256;
/// Bytes of an entry value before the key.
const ENTRY_FIXED_LEN: usize = 8 + 4 + 1 + 2;
const FLAG_HAS_KEY: u8 = 1;
const FLAG_RECORD: u8 = 2;
/// Longest key kept (longer keys are cut at a character boundary).
pub const KEY_LEN_MAX: usize = 1024;

use lanemq_store::now_us;

fn be64(v: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(v.get(0..8)?.try_into().ok()?))
}

fn k_registry(name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + name.len());
    k.push(b'r');
    k.extend_from_slice(name.as_bytes());
    k
}
fn k_meta(what: &str) -> Vec<u8> {
    let mut k = vec![b'm'];
    k.extend_from_slice(what.as_bytes());
    k
}
const K_WATERMARK: &[u8] = b"w";
fn k_id(tag: u8, id: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = tag;
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}
fn k_entry(id: u64, offset: u64) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[0] = b'e';
    k[1..9].copy_from_slice(&id.to_be_bytes());
    k[9..].copy_from_slice(&offset.to_be_bytes());
    k
}
fn k_key(id: u64, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + key.len());
    k.extend_from_slice(&k_id(b'k', id));
    k.extend_from_slice(key.as_bytes());
    k
}

/// A decoded entry value.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    ts_us: u64,
    size: u32,
    key: Option<String>,
    record: Option<Bytes>,
}

impl Entry {
    fn encode(&self) -> Vec<u8> {
        let key = self.key.as_deref().unwrap_or("");
        let rec_len = self.record.as_ref().map_or(0, |r| r.len());
        let mut v = Vec::with_capacity(ENTRY_FIXED_LEN + key.len() + rec_len);
        v.extend_from_slice(&self.ts_us.to_be_bytes());
        v.extend_from_slice(&self.size.to_be_bytes());
        let mut flags = 0;
        if self.key.is_some() {
            flags |= FLAG_HAS_KEY;
        }
        if self.record.is_some() {
            flags |= FLAG_RECORD;
        }
        v.push(flags);
        // Keys are cut to KEY_LEN_MAX (< u16::MAX) when extracted.
        v.extend_from_slice(&(key.len().min(usize::from(u16::MAX)) as u16).to_be_bytes());
        v.extend_from_slice(key.as_bytes());
        if let Some(r) = &self.record {
            v.extend_from_slice(r);
        }
        v
    }

    fn decode(v: &[u8]) -> Option<Entry> {
        let ts_us = be64(v)?;
        let size = u32::from_be_bytes(v.get(8..12)?.try_into().ok()?);
        let flags = *v.get(12)?;
        let klen = usize::from(u16::from_be_bytes(v.get(13..15)?.try_into().ok()?));
        let kend = ENTRY_FIXED_LEN.checked_add(klen)?;
        let key = if flags & FLAG_HAS_KEY != 0 {
            Some(
                std::str::from_utf8(v.get(ENTRY_FIXED_LEN..kend)?)
                    .ok()?
                    .to_string(),
            )
        } else {
            None
        };
        let record = if flags & FLAG_RECORD != 0 {
            Some(Bytes::copy_from_slice(v.get(kend..)?))
        } else {
            None
        };
        Some(Entry {
            ts_us,
            size,
            key,
            record,
        })
    }
}

/// Persisted counts of one stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    messages: u64,
    bytes: u64,
    keyless: u64,
}

impl Counts {
    fn encode(&self) -> [u8; 24] {
        let mut v = [0u8; 24];
        v[..8].copy_from_slice(&self.messages.to_be_bytes());
        v[8..16].copy_from_slice(&self.bytes.to_be_bytes());
        v[16..].copy_from_slice(&self.keyless.to_be_bytes());
        v
    }
    fn decode(v: &[u8]) -> Counts {
        Counts {
            messages: be64(v).unwrap_or(0),
            bytes: v.get(8..).and_then(be64).unwrap_or(0),
            keyless: v.get(16..).and_then(be64).unwrap_or(0),
        }
    }
    fn add(&mut self, e: &Entry) {
        self.add_raw(e.size, e.key.is_some());
    }
    fn sub(&mut self, e: &Entry) {
        self.sub_raw(e.size, e.key.is_some());
    }
    fn add_raw(&mut self, size: u32, keyed: bool) {
        self.messages += 1;
        self.bytes += u64::from(size);
        if !keyed {
            self.keyless += 1;
        }
    }
    fn sub_raw(&mut self, size: u32, keyed: bool) {
        self.messages = self.messages.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(u64::from(size));
        if !keyed {
            self.keyless = self.keyless.saturating_sub(1);
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RegistryEntry {
    pub(crate) def: StreamDef,
    pub(crate) id: u64,
    pub(crate) created_at_us: u64,
    pub(crate) created_offset: u64,
}

/// The mutable part of a stream.
#[derive(Debug)]
struct HandleState {
    def: StreamDef,
    key: Option<KeyExpr>,
    counts: Counts,
}

/// One stream, shared by the registry, the indexer and every reader.
#[derive(Debug)]
pub struct StreamHandle {
    pub id: u64,
    pub name: String,
    pub created_at_us: u64,
    /// First log offset the stream may capture.
    pub created_offset: u64,
    state: RwLock<HandleState>,
    /// Signalled after the indexer added entries to this stream, and on deletion.
    pub notify: tokio::sync::Notify,
    deleted: AtomicBool,
    subscribers: AtomicU64,
    /// A regular stream's entry files (`None` for a last-value stream: sled).
    entries: Option<Entries>,
    /// Records below this log offset are indexed already (skipped when the log is indexed
    /// again after a crash).
    indexed_to: AtomicU64,
}

impl StreamHandle {
    pub fn def(&self) -> StreamDef {
        self.read().def.clone()
    }
    pub fn is_lastvalue(&self) -> bool {
        self.read().def.is_lastvalue
    }
    pub fn topic_filter(&self) -> String {
        self.read().def.topic_filter.clone()
    }
    /// The one check of the binding rule: a `$stream/<name>/<filter>` subscription binds
    /// only to a stream capturing exactly `<filter>` (the ACL authorized that filter, not
    /// whatever the stream captures). `None` when `embedded` may bind (or none was given),
    /// else the filter this stream captures.
    pub fn filter_mismatch(&self, embedded: Option<&str>) -> Option<String> {
        let st = self.read();
        match embedded {
            Some(f) if st.def.topic_filter != f => Some(st.def.topic_filter.clone()),
            _ => None,
        }
    }
    pub fn read_max_unacked(&self) -> u32 {
        self.read().def.read_max_unacked
    }
    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }
    /// A stream subscription started (`+1`) or ended (`-1`).
    pub fn subscriber_delta(&self, added: bool) {
        if added {
            self.subscribers.fetch_add(1, Ordering::Relaxed);
        } else {
            let _ = self
                .subscribers
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }
    fn read(&self) -> std::sync::RwLockReadGuard<'_, HandleState> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HandleState> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }
    fn retention_cutoff_us(&self) -> u64 {
        let ms = self.read().def.data_retention_period.as_millis();
        now_us().saturating_sub(ms.saturating_mul(1000))
    }
}

#[derive(Default)]
struct Registry {
    by_name: BTreeMap<String, Arc<StreamHandle>>,
    by_id: HashMap<u64, Arc<StreamHandle>>,
    filters: FilterIndex<u64>,
}

/// One message read from a stream.
#[derive(Debug, Clone)]
pub struct StreamMessage {
    /// Log offset: the stream position.
    pub offset: u64,
    pub record: Record,
    pub key: Option<String>,
}

/// Figures of the engine, for `$SYS` and `/api/v5/stats`.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct EngineStats {
    pub streams: u64,
    pub indexed_offset: u64,
    pub entries_indexed: u64,
    pub keyless_messages: u64,
    pub entries_expired: u64,
}

/// The stream engine. Blocking methods (sled, log reads) must run on blocking threads.
pub struct Engine {
    store: Store,
    tree: sled::Tree,
    /// `<data_dir>/streams`: one directory of entry files per regular stream.
    dir: PathBuf,
    /// Serialises index writes: indexer batches, retention, checkpoints, deletion.
    writer: Mutex<()>,
    /// Watermark stored by the last checkpoint (log retention must keep records above it).
    checkpointed: AtomicU64,
    reg: RwLock<Registry>,
    settings: RwLock<GlobalSettings>,
    /// Serialises registry changes (create/update/delete) against each other.
    admin: Mutex<()>,
    /// Next log offset to index.
    watermark: AtomicU64,
    wake: Mutex<bool>,
    wake_cv: Condvar,
    closed: AtomicBool,
    failed: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Signalled on every stream creation (pending subscriptions look again).
    pub registry_changed: tokio::sync::Notify,
    entries_indexed: AtomicU64,
    keyless: AtomicU64,
    expired: AtomicU64,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").finish_non_exhaustive()
    }
}

fn storage(e: impl std::fmt::Display) -> StreamError {
    StreamError::Storage(e.to_string())
}

/// Errors while opening the engine (reported before the broker starts).
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("stream index: {0}")]
    Sled(#[from] sled::Error),
    #[error("stream index: {0}")]
    Store(#[from] StoreError),
    #[error("stream index files: {0}")]
    Io(#[from] std::io::Error),
    #[error("stream index: corrupt registry entry {0:?}")]
    Corrupt(String),
    #[error("stream {name:?} in the config file: {error}")]
    Config { name: String, error: StreamError },
}

impl Engine {
    /// Open the registry from `index` (tree `s_streams`). `settings` and `defs` come from the
    /// config file: settings changed at run time (stored) win over `settings`; every stream of
    /// `defs` is created if missing and updated if its mutable fields differ.
    pub fn open(
        store: Store,
        index: &lanemq_store::Index,
        settings: GlobalSettings,
        defs: &[StreamDef],
    ) -> Result<Arc<Engine>, OpenError> {
        let tree = index.tree("s_streams")?;
        let stored_settings = match tree.get(k_meta("settings"))? {
            Some(v) => serde_json::from_slice::<GlobalSettings>(&v).ok(),
            None => None,
        };
        let mut watermark = match tree.get(K_WATERMARK)? {
            Some(v) => be64(&v).unwrap_or(0),
            // A new index: nothing before now belongs to any stream.
            None => store.next_offset(),
        };
        let dir = streams_dir(&store);
        let mut reg = Registry::default();
        for kv in tree.scan_prefix(b"r") {
            let (k, v) = kv?;
            let entry: RegistryEntry = serde_json::from_slice(&v)
                .map_err(|_| OpenError::Corrupt(String::from_utf8_lossy(&k[1..]).into()))?;
            let mut counts = tree
                .get(k_id(b'c', entry.id))?
                .map(|v| Counts::decode(&v))
                .unwrap_or_default();
            let id = entry.id;
            let (entries, indexed_to) = if entry.def.is_lastvalue {
                let x = tree
                    .get(k_id(b'x', id))?
                    .and_then(|v| be64(&v))
                    .unwrap_or(0);
                (None, x)
            } else {
                let (entries, short) = open_entries(&tree, &dir, id, &entry.def.name)?;
                if short {
                    counts = recount(&entries)?;
                }
                let to = match entries.end().checked_sub(1) {
                    Some(last) => entries.get(last)?.map_or(0, |e| e.offset + 1),
                    None => 0,
                };
                if short {
                    // Entries the checkpoint promised are gone: index the log again from
                    // after the last one that is there.
                    watermark = watermark.min(to.max(entry.created_offset));
                }
                (Some(entries), to)
            };
            let h = Self::make_handle(entry, counts, entries, indexed_to);
            reg.filters.insert(&h.topic_filter(), h.id);
            reg.by_id.insert(h.id, h.clone());
            reg.by_name.insert(h.name.clone(), h);
        }
        let engine = Arc::new(Engine {
            store,
            tree,
            dir,
            writer: Mutex::new(()),
            checkpointed: AtomicU64::new(watermark),
            reg: RwLock::new(reg),
            settings: RwLock::new(stored_settings.unwrap_or(settings)),
            admin: Mutex::new(()),
            watermark: AtomicU64::new(watermark),
            wake: Mutex::new(false),
            wake_cv: Condvar::new(),
            closed: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            thread: Mutex::new(None),
            registry_changed: tokio::sync::Notify::new(),
            entries_indexed: AtomicU64::new(0),
            keyless: AtomicU64::new(0),
            expired: AtomicU64::new(0),
        });
        engine.tree.insert(K_WATERMARK, &watermark.to_be_bytes())?;
        for def in defs {
            let r = match engine.get(&def.name) {
                Err(StreamError::NotFound(_)) => engine.create(def.clone()).map(|_| ()),
                Ok(cur) if cur.def != *def => engine.update(&def.name, def.clone()).map(|_| ()),
                Ok(_) => Ok(()),
                Err(e) => Err(e),
            };
            match r {
                // Settings stored through the REST API win over `[streams_config]`; a stream
                // they refuse is reported and skipped, it does not keep the broker down.
                Err(error @ (StreamError::Disabled | StreamError::MaxStreamCount(_))) => {
                    warn!(stream = %def.name, %error, "stream of the config file not created (settings stored through the REST API refuse it)");
                }
                r => r.map_err(|error| OpenError::Config {
                    name: def.name.clone(),
                    error,
                })?,
            }
        }
        info!(
            streams = engine.reg().by_name.len(),
            watermark, "stream registry opened"
        );
        Ok(engine)
    }

    fn make_handle(
        entry: RegistryEntry,
        counts: Counts,
        entries: Option<Entries>,
        indexed_to: u64,
    ) -> Arc<StreamHandle> {
        let key = KeyExpr::parse(&entry.def.key_expression).ok();
        Arc::new(StreamHandle {
            id: entry.id,
            name: entry.def.name.clone(),
            created_at_us: entry.created_at_us,
            created_offset: entry.created_offset,
            state: RwLock::new(HandleState {
                def: entry.def,
                key,
                counts,
            }),
            notify: tokio::sync::Notify::new(),
            deleted: AtomicBool::new(false),
            subscribers: AtomicU64::new(0),
            entries,
            indexed_to: AtomicU64::new(indexed_to),
        })
    }

    fn write_lock(&self) -> MutexGuard<'_, ()> {
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn reg(&self) -> std::sync::RwLockReadGuard<'_, Registry> {
        self.reg.read().unwrap_or_else(|e| e.into_inner())
    }
    fn reg_mut(&self) -> std::sync::RwLockWriteGuard<'_, Registry> {
        self.reg.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The shared log the engine reads.
    pub fn store(&self) -> &Store {
        &self.store
    }

    // --- registry ------------------------------------------------------------------------

    pub fn settings(&self) -> GlobalSettings {
        self.settings
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replace the global settings (validated) and store them.
    pub fn put_settings(&self, s: GlobalSettings) -> Result<(), StreamError> {
        let errs = s.validate();
        if !errs.is_empty() {
            return Err(StreamError::Invalid(errs));
        }
        let json = serde_json::to_vec(&s).map_err(storage)?;
        self.tree
            .insert(k_meta("settings"), json)
            .map_err(storage)?;
        self.tree.flush().map_err(storage)?;
        *self.settings.write().unwrap_or_else(|e| e.into_inner()) = s;
        Ok(())
    }

    pub fn is_enabled(&self) -> bool {
        self.settings
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .enable
    }

    pub fn stream_count(&self) -> usize {
        self.reg().by_name.len()
    }

    /// The live handle of a stream.
    pub fn lookup(&self, name: &str) -> Option<Arc<StreamHandle>> {
        self.reg().by_name.get(name).cloned()
    }

    fn info(&self, h: &StreamHandle) -> StreamInfo {
        let (def, counts) = {
            let st = h.read();
            (st.def.clone(), st.counts)
        };
        let (oldest, newest) = self.bounds(h);
        StreamInfo {
            def,
            created_at_us: h.created_at_us,
            stats: StreamStats {
                message_count: counts.messages,
                message_bytes: counts.bytes,
                oldest_timestamp_us: oldest,
                newest_timestamp_us: newest,
                subscribers: h.subscribers.load(Ordering::Relaxed),
                keyless_messages: counts.keyless,
            },
        }
    }

    /// Arrival times of the oldest and newest entry.
    fn bounds(&self, h: &StreamHandle) -> (Option<u64>, Option<u64>) {
        if let Some(entries) = &h.entries {
            let ts = |i: u64| entries.get(i).ok().flatten().map(|e| e.ts_us);
            let first = ts(entries.head());
            let last = entries.end().checked_sub(1).and_then(ts).or(first);
            return (first, last);
        }
        let id = h.id;
        let lo = k_entry(id, 0);
        let hi = k_entry(id, u64::MAX);
        let ts = |kv: Option<sled::Result<(sled::IVec, sled::IVec)>>| {
            kv.and_then(|r| r.ok())
                .and_then(|(_, v)| Entry::decode(&v))
                .map(|e| e.ts_us)
        };
        let mut range = self.tree.range(lo..=hi);
        let first = ts(range.next());
        let last = ts(range.next_back()).or(first);
        (first, last)
    }

    pub fn get(&self, name: &str) -> Result<StreamInfo, StreamError> {
        let h = self
            .lookup(name)
            .ok_or_else(|| StreamError::NotFound(name.to_string()))?;
        Ok(self.info(&h))
    }

    /// Streams sorted by name, after `after`; and whether more follow.
    pub fn list(&self, after: Option<&str>, limit: usize) -> (Vec<StreamInfo>, bool) {
        let handles: Vec<Arc<StreamHandle>> = {
            let reg = self.reg();
            let iter: Box<dyn Iterator<Item = &Arc<StreamHandle>>> = match after {
                Some(a) => Box::new(
                    reg.by_name
                        .range::<str, _>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded))
                        .map(|(_, h)| h),
                ),
                None => Box::new(reg.by_name.values()),
            };
            iter.take(limit.saturating_add(1)).cloned().collect()
        };
        let more = handles.len() > limit;
        (
            handles.iter().take(limit).map(|h| self.info(h)).collect(),
            more,
        )
    }

    /// Create a stream (validated). It captures messages appended from now on.
    pub fn create(&self, def: StreamDef) -> Result<StreamInfo, StreamError> {
        self.create_inner(def, true)
    }

    /// Create a stream whose name is internal (legacy `$s/` streams are named `/<filter>`).
    pub fn create_internal(&self, def: StreamDef) -> Result<StreamInfo, StreamError> {
        self.create_inner(def, false)
    }

    fn create_inner(&self, def: StreamDef, check_name: bool) -> Result<StreamInfo, StreamError> {
        let mut errs = def.validate();
        if !check_name {
            errs.retain(|e| e.field != "name");
        }
        if !errs.is_empty() {
            return Err(StreamError::Invalid(errs));
        }
        let settings = self.settings();
        if !settings.enable {
            return Err(StreamError::Disabled);
        }
        let _g = self.admin.lock().unwrap_or_else(|e| e.into_inner());
        if self.lookup(&def.name).is_some() {
            return Err(StreamError::AlreadyExists(def.name));
        }
        if self.stream_count() >= settings.max_stream_count as usize {
            return Err(StreamError::MaxStreamCount(settings.max_stream_count));
        }
        let id = self
            .tree
            .update_and_fetch(k_meta("next_id"), |old| {
                let n = old.and_then(be64).unwrap_or(0) + 1;
                Some(n.to_be_bytes().to_vec())
            })
            .map_err(storage)?
            .and_then(|v| be64(&v))
            .ok_or_else(|| storage("next stream id"))?;
        // Everything appended after this point may belong to the stream; a record appended
        // concurrently with the creation is captured or not, never half.
        let created_offset = self.store.next_offset();
        let entry = RegistryEntry {
            def,
            id,
            created_at_us: now_us(),
            created_offset,
        };
        let entries = if entry.def.is_lastvalue {
            None
        } else {
            let path = entries_dir(&self.dir, id);
            Entries::destroy(&path).map_err(storage)?;
            Some(Entries::open(&path, 0, 0).map_err(storage)?.0)
        };
        let json = serde_json::to_vec(&entry).map_err(storage)?;
        self.tree
            .insert(k_registry(&entry.def.name), json)
            .map_err(storage)?;
        self.tree.flush().map_err(storage)?;
        let h = Self::make_handle(entry, Counts::default(), entries, 0);
        {
            let mut reg = self.reg_mut();
            reg.filters.insert(&h.topic_filter(), h.id);
            reg.by_id.insert(h.id, h.clone());
            reg.by_name.insert(h.name.clone(), h.clone());
        }
        info!(stream = %h.name, id, filter = %h.topic_filter(), "stream created");
        self.registry_changed.notify_waiters();
        Ok(self.info(&h))
    }

    /// Replace the mutable fields of a stream (`topic_filter` and `is_lastvalue` are fixed).
    pub fn update(&self, name: &str, def: StreamDef) -> Result<StreamInfo, StreamError> {
        let mut errs = def.validate();
        if name.starts_with('/') {
            errs.retain(|e| e.field != "name");
        }
        if def.name != name {
            errs.push(ValidationError {
                field: "name".into(),
                message: format!(
                    "{:?} differs from the stream in the path ({name:?})",
                    def.name
                ),
            });
        }
        if !errs.is_empty() {
            return Err(StreamError::Invalid(errs));
        }
        let _g = self.admin.lock().unwrap_or_else(|e| e.into_inner());
        let h = self
            .lookup(name)
            .ok_or_else(|| StreamError::NotFound(name.to_string()))?;
        {
            let cur = h.read();
            if cur.def.topic_filter != def.topic_filter {
                return Err(StreamError::Immutable("topic_filter"));
            }
            if cur.def.is_lastvalue != def.is_lastvalue {
                return Err(StreamError::Immutable("is_lastvalue"));
            }
        }
        let entry = RegistryEntry {
            def: def.clone(),
            id: h.id,
            created_at_us: h.created_at_us,
            created_offset: h.created_offset,
        };
        let json = serde_json::to_vec(&entry).map_err(storage)?;
        self.tree.insert(k_registry(name), json).map_err(storage)?;
        self.tree.flush().map_err(storage)?;
        {
            let mut st = h.write();
            st.key = KeyExpr::parse(&def.key_expression).ok();
            st.def = def;
        }
        info!(stream = %name, "stream updated");
        // Limits may have shrunk.
        let w = self.write_lock();
        let r = self.enforce_limits(&h);
        drop(w);
        if let Err(e) = r {
            warn!(stream = %name, error = %e, "enforcing stream limits failed");
        }
        h.notify.notify_waiters();
        Ok(self.info(&h))
    }

    /// Delete a stream: its subscribers stop receiving at once; its entries are purged.
    pub fn delete(&self, name: &str) -> Result<(), StreamError> {
        let _g = self.admin.lock().unwrap_or_else(|e| e.into_inner());
        let h = self
            .lookup(name)
            .ok_or_else(|| StreamError::NotFound(name.to_string()))?;
        // No indexer batch or checkpoint runs while the stream goes.
        let _w = self.write_lock();
        let mut b = sled::Batch::default();
        b.remove(k_registry(name));
        b.insert(&k_id(b'd', h.id), &[]);
        self.tree.apply_batch(b).map_err(storage)?;
        self.tree.flush().map_err(storage)?;
        {
            let mut reg = self.reg_mut();
            reg.filters.remove(&h.topic_filter(), &h.id);
            reg.by_id.remove(&h.id);
            reg.by_name.remove(name);
        }
        h.deleted.store(true, Ordering::Release);
        h.notify.notify_waiters();
        info!(stream = %name, id = h.id, "stream deleted");
        if let Err(e) = self.purge(h.id) {
            warn!(stream = %name, error = %e, "purging a deleted stream failed; retried by gc");
        }
        Ok(())
    }

    fn purge(&self, id: u64) -> Result<(), sled::Error> {
        for tag in [b'e', b'k'] {
            loop {
                let keys: Vec<sled::IVec> = self
                    .tree
                    .scan_prefix(k_id(tag, id))
                    .keys()
                    .take(GC_BATCH_MAX)
                    .collect::<Result<_, _>>()?;
                if keys.is_empty() {
                    break;
                }
                let mut b = sled::Batch::default();
                for k in keys {
                    b.remove(k);
                }
                self.tree.apply_batch(b)?;
            }
        }
        if let Err(e) = Entries::destroy(&entries_dir(&self.dir, id)) {
            warn!(id, error = %e, "removing a deleted stream's entry files failed; retried by gc");
            return Ok(());
        }
        let mut b = sled::Batch::default();
        for tag in [b'c', b'n', b'x', b'd'] {
            b.remove(&k_id(tag, id));
        }
        self.tree.apply_batch(b)?;
        Ok(())
    }

    // --- indexer -------------------------------------------------------------------------

    /// Start the indexer thread.
    pub fn start(self: &Arc<Self>) -> std::io::Result<()> {
        let me = self.clone();
        let h = std::thread::Builder::new()
            .name("lanemq-streams".into())
            .spawn(move || me.index_loop())?;
        *self.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
        Ok(())
    }

    /// New records were committed: index them soon. Cheap; call after every durable append.
    pub fn poke(&self) {
        let mut w = self.wake.lock().unwrap_or_else(|e| e.into_inner());
        if !*w {
            *w = true;
            self.wake_cv.notify_one();
        }
    }

    /// Index what is committed, then stop the indexer and checkpoint. Blocking.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.poke();
        let h = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = h {
            let _ = h.join();
        }
        if let Err(e) = self.checkpoint() {
            error!(error = %e, "stream index checkpoint failed");
        }
        if let Err(e) = self.tree.flush() {
            error!(error = %e, "flushing the stream index failed");
        }
    }

    /// Next log offset to index (everything below is in the stream index).
    pub fn indexed_offset(&self) -> u64 {
        self.watermark.load(Ordering::Acquire)
    }

    /// The watermark of the last checkpoint: what a restart after a crash starts from.
    pub fn checkpointed_offset(&self) -> u64 {
        self.checkpointed.load(Ordering::Acquire)
    }

    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    fn index_loop(&self) {
        let mut reader = self.store.reader(self.indexed_offset());
        let mut last_checkpoint = Instant::now();
        loop {
            {
                let mut w = self.wake.lock().unwrap_or_else(|e| e.into_inner());
                if !*w && !self.closed.load(Ordering::Acquire) {
                    w = self
                        .wake_cv
                        .wait_timeout(w, Duration::from_millis(INDEX_TICK_MS))
                        .map(|(g, _)| g)
                        .unwrap_or_else(|e| e.into_inner().0);
                }
                *w = false;
            }
            loop {
                let res = self.index_once(&mut reader);
                if last_checkpoint.elapsed() >= Duration::from_millis(CHECKPOINT_MS)
                    && self.checkpointed_offset() < self.indexed_offset()
                {
                    last_checkpoint = Instant::now();
                    if let Err(e) = self.checkpoint() {
                        error!(error = %e, "stream index checkpoint failed; retrying");
                    }
                }
                match res {
                    Ok(true) => continue,
                    Ok(false) => break,
                    Err(e) => {
                        if !self.failed.swap(true, Ordering::SeqCst) {
                            error!(error = %e, "stream indexer failed; retrying");
                        }
                        std::thread::sleep(Duration::from_millis(500));
                        reader = self.store.reader(self.indexed_offset());
                        break;
                    }
                }
            }
            if self.closed.load(Ordering::Acquire) {
                return;
            }
        }
    }

    /// Make the regular streams' entries durable, then store their positions and counts and
    /// the watermark; then delete entry files retention emptied. Blocking.
    pub fn checkpoint(&self) -> Result<(), StoreError> {
        let _w = self.write_lock();
        let watermark = self.indexed_offset();
        let handles: Vec<Arc<StreamHandle>> = self.reg().by_id.values().cloned().collect();
        let mut b = sled::Batch::default();
        let mut heads = Vec::new();
        for h in &handles {
            let Some(entries) = &h.entries else { continue };
            entries
                .sync()
                .map_err(|e| files_err("fsync", &self.dir, e))?;
            let head = entries.head();
            b.insert(
                &k_id(b'n', h.id),
                &checkpoint_value(head, entries.end())[..],
            );
            b.insert(&k_id(b'c', h.id), &h.read().counts.encode());
            heads.push((h.clone(), head));
        }
        b.insert(K_WATERMARK, &watermark.to_be_bytes());
        self.tree.apply_batch(b).map_err(sled_err)?;
        self.tree.flush().map_err(sled_err)?;
        self.checkpointed.store(watermark, Ordering::Release);
        for (h, head) in heads {
            if let Some(entries) = &h.entries {
                if let Err(e) = entries.drop_files_below(head) {
                    warn!(stream = %h.name, error = %e, "removing old stream entry files failed");
                }
            }
        }
        Ok(())
    }

    /// Index one batch; `Ok(false)` when caught up.
    fn index_once(&self, reader: &mut LogReader) -> Result<bool, StoreError> {
        if self.stream_count() == 0 || !self.is_enabled() {
            // Nothing to capture: skip without reading.
            let end = self.store.committed_offset();
            if end > self.indexed_offset() {
                let _w = self.write_lock();
                self.tree
                    .insert(K_WATERMARK, &end.to_be_bytes())
                    .map_err(sled_err)?;
                self.watermark.store(end, Ordering::Release);
                self.checkpointed.store(end, Ordering::Release);
                *reader = self.store.reader(end);
            }
            return Ok(false);
        }
        let batch = match reader.next_batch(INDEX_BATCH_RECORDS_MAX, INDEX_BATCH_BYTES_MAX) {
            Ok(b) => b,
            Err(StoreError::OffsetOutOfRange { first, .. }) => {
                warn!(
                    from = reader.next_offset(),
                    first, "stream indexer: log retention removed records not yet indexed"
                );
                *reader = self.store.reader(first);
                return Ok(true);
            }
            Err(e) => return Err(e),
        };
        let Some(last) = batch.last() else {
            return Ok(false);
        };
        let next = last.offset + 1;
        let _w = self.write_lock();
        let mut b = sled::Batch::default();
        // Per stream: counts after this batch; last-value keys set in this batch.
        let mut touched: HashMap<u64, (Arc<StreamHandle>, Counts)> = HashMap::new();
        // Per regular stream: entries to append.
        let mut appends: HashMap<u64, Vec<RawEntry>> = HashMap::new();
        let mut lv_keys: HashMap<(u64, String), (u64, Entry)> = HashMap::new();
        let mut ids: Vec<u64> = Vec::new();
        let mut added = 0u64;
        let mut keyless = 0u64;
        {
            let reg = self.reg();
            for rec in &batch {
                ids.clear();
                reg.filters.for_each_match(&rec.topic, |id| ids.push(*id));
                if ids.is_empty() {
                    continue;
                }
                ids.sort_unstable();
                ids.dedup();
                for id in &ids {
                    let Some(h) = reg.by_id.get(id) else { continue };
                    if rec.offset < h.created_offset
                        || rec.offset < h.indexed_to.load(Ordering::Relaxed)
                    {
                        continue;
                    }
                    let (key, lv) = {
                        let st = h.read();
                        let key = st.key.as_ref().and_then(|k| k.eval(&key_input(rec)));
                        (key.map(|k| cut(k, KEY_LEN_MAX)), st.def.is_lastvalue)
                    };
                    let size =
                        u32::try_from(rec.payload.len() + rec.topic.len()).unwrap_or(u32::MAX);
                    let counts = &mut touched
                        .entry(h.id)
                        .or_insert_with(|| (h.clone(), h.read().counts))
                        .1;
                    if key.is_none() {
                        keyless += 1;
                    }
                    added += 1;
                    if !lv {
                        counts.add_raw(size, key.is_some());
                        appends.entry(h.id).or_default().push(RawEntry {
                            offset: rec.offset,
                            ts_us: rec.timestamp_us,
                            size,
                            flags: if key.is_some() { RAW_HAS_KEY } else { 0 },
                        });
                        continue;
                    }
                    let entry = Entry {
                        ts_us: rec.timestamp_us,
                        size,
                        record: if key.is_some() {
                            encode_copy(rec)
                        } else {
                            None
                        },
                        key,
                    };
                    if let Some(k) = &entry.key {
                        // Replace the key's previous entry.
                        let prev = match lv_keys.get(&(h.id, k.clone())) {
                            Some((o, e)) => Some((*o, e.clone())),
                            None => {
                                self.tree
                                    .get(k_key(h.id, k))
                                    .map_err(sled_err)?
                                    .and_then(|v| {
                                        let o = be64(&v)?;
                                        let e = self.tree.get(k_entry(h.id, o)).ok()??;
                                        Some((o, Entry::decode(&e)?))
                                    })
                            }
                        };
                        if let Some((old, old_entry)) = prev {
                            if old != rec.offset {
                                b.remove(&k_entry(h.id, old));
                                counts.sub(&old_entry);
                            }
                        }
                        b.insert(k_key(h.id, k), &rec.offset.to_be_bytes());
                        lv_keys.insert((h.id, k.clone()), (rec.offset, entry.clone()));
                    }
                    counts.add(&entry);
                    b.insert(&k_entry(h.id, rec.offset), entry.encode());
                }
            }
        }
        for (id, v) in &appends {
            if let Some(entries) = touched.get(id).and_then(|(h, _)| h.entries.as_ref()) {
                entries
                    .append(v)
                    .map_err(|e| files_err("write", &self.dir, e))?;
            }
        }
        let mut sled_writes = false;
        for (id, (h, c)) in &touched {
            if h.entries.is_none() {
                b.insert(&k_id(b'c', *id), &c.encode());
                b.insert(&k_id(b'x', *id), &next.to_be_bytes());
                sled_writes = true;
            }
        }
        if sled_writes {
            self.tree.apply_batch(b).map_err(sled_err)?;
        }
        self.watermark.store(next, Ordering::Release);
        self.entries_indexed.fetch_add(added, Ordering::Relaxed);
        self.keyless.fetch_add(keyless, Ordering::Relaxed);
        for (h, c) in touched.into_values() {
            h.write().counts = c;
            h.indexed_to.store(next, Ordering::Relaxed);
            if let Err(e) = self.enforce_limits(&h) {
                warn!(stream = %h.name, error = %e, "enforcing stream limits failed");
            }
            h.notify.notify_waiters();
        }
        Ok(true)
    }

    /// Remove the oldest entries beyond the count and byte limits (index write lock held).
    fn enforce_limits(&self, h: &StreamHandle) -> Result<(), StoreError> {
        let (max_n, max_b) = {
            let st = h.read();
            (
                st.def.limits.max_message_count.get(),
                st.def.limits.max_message_bytes.get(),
            )
        };
        if max_n.is_none() && max_b.is_none() {
            return Ok(());
        }
        self.trim(h, |c, _| {
            max_n.is_some_and(|m| c.messages > m) || max_b.is_some_and(|m| c.bytes > m)
        })
        .map(|_| ())
    }

    /// Remove entries from the oldest while `over(counts, arrival time)` holds; returns how
    /// many. The caller holds the index write lock.
    fn trim(
        &self,
        h: &StreamHandle,
        over: impl Fn(&Counts, u64) -> bool,
    ) -> Result<u64, StoreError> {
        if let Some(entries) = &h.entries {
            let mut counts = h.read().counts;
            let mut head = entries.head();
            let start = head;
            'chunks: loop {
                let chunk = entries
                    .read(head, TRIM_CHUNK)
                    .map_err(|e| files_err("read", &self.dir, e))?;
                if chunk.is_empty() {
                    break;
                }
                for e in &chunk {
                    if !over(&counts, e.ts_us) {
                        break 'chunks;
                    }
                    counts.sub_raw(e.size, e.has_key());
                    head += 1;
                }
            }
            if head > start {
                entries.set_head(head);
                h.write().counts = counts;
            }
            return Ok(head - start);
        }
        let mut removed = 0u64;
        loop {
            let mut counts = h.read().counts;
            let mut b = sled::Batch::default();
            let mut n = 0usize;
            let mut done = true;
            for kv in self.tree.scan_prefix(k_id(b'e', h.id)) {
                let (k, v) = kv.map_err(sled_err)?;
                let Some(e) = Entry::decode(&v) else {
                    b.remove(k);
                    continue;
                };
                if !over(&counts, e.ts_us) {
                    break;
                }
                b.remove(k.clone());
                if let Some(key) = &e.key {
                    // Drop the key only if it still points here.
                    let kk = k_key(h.id, key);
                    if let (Some(cur), Some(o)) = (
                        self.tree.get(&kk).map_err(sled_err)?,
                        k.get(9..17).and_then(be64),
                    ) {
                        if be64(&cur) == Some(o) {
                            b.remove(kk);
                        }
                    }
                }
                counts.sub(&e);
                n += 1;
                if n >= GC_BATCH_MAX {
                    done = false;
                    break;
                }
            }
            if n == 0 {
                return Ok(removed);
            }
            b.insert(&k_id(b'c', h.id), &counts.encode());
            self.tree.apply_batch(b).map_err(sled_err)?;
            h.write().counts = counts;
            removed += n as u64;
            if done {
                return Ok(removed);
            }
        }
    }

    /// Retention: remove expired entries of every stream, enforce limits, purge deleted
    /// streams. Blocking; run at `gc_interval`.
    pub fn gc(&self) -> u64 {
        let handles: Vec<Arc<StreamHandle>> = self.reg().by_name.values().cloned().collect();
        let mut removed = 0;
        for h in handles {
            let cutoff = h.retention_cutoff_us();
            let _w = self.write_lock();
            if h.is_deleted() {
                continue;
            }
            match self.trim(&h, |_, ts| ts < cutoff) {
                Ok(n) => removed += n,
                Err(e) => warn!(stream = %h.name, error = %e, "stream retention failed"),
            }
            if let Err(e) = self.enforce_limits(&h) {
                warn!(stream = %h.name, error = %e, "enforcing stream limits failed");
            }
        }
        let deleted: Vec<u64> = self
            .tree
            .scan_prefix(b"d")
            .keys()
            .filter_map(|k| k.ok().and_then(|k| k.get(1..9).and_then(be64)))
            .collect();
        for id in deleted {
            if let Err(e) = self.purge(id) {
                warn!(id, error = %e, "purging a deleted stream failed");
            }
        }
        self.expired.fetch_add(removed, Ordering::Relaxed);
        removed
    }

    /// Lowest log offset a stream still needs from the log (regular entries; last-value
    /// entries carry their record). Log retention must not remove it. Also never above the
    /// checkpointed watermark (records a restart would index again).
    pub fn min_referenced_offset(&self) -> u64 {
        let mut low = self.checkpointed_offset().min(self.indexed_offset());
        let handles: Vec<Arc<StreamHandle>> = self.reg().by_name.values().cloned().collect();
        for h in handles {
            if let Some(entries) = &h.entries {
                if let Ok(Some(e)) = entries.get(entries.head()) {
                    low = low.min(e.offset);
                }
                continue;
            }
            for kv in self.tree.scan_prefix(k_id(b'e', h.id)) {
                let Ok((k, v)) = kv else { break };
                let Some(e) = Entry::decode(&v) else { continue };
                if e.record.is_none() {
                    if let Some(o) = k.get(9..17).and_then(be64) {
                        low = low.min(o);
                    }
                    break;
                }
            }
        }
        low
    }

    pub fn stats(&self) -> EngineStats {
        EngineStats {
            streams: self.stream_count() as u64,
            indexed_offset: self.indexed_offset(),
            entries_indexed: self.entries_indexed.load(Ordering::Relaxed),
            keyless_messages: self.keyless.load(Ordering::Relaxed),
            entries_expired: self.expired.load(Ordering::Relaxed),
        }
    }

    // --- readers -------------------------------------------------------------------------

    /// The first position to read for a subscription starting at `start`.
    pub fn start_position(&self, h: &StreamHandle, start: StartFrom) -> Result<u64, StoreError> {
        Ok(match start {
            StartFrom::Earliest => 0,
            StartFrom::Latest => self.store.next_offset().max(h.created_offset),
            StartFrom::TimestampUs(t) => self.store.seek_timestamp(t)?,
            StartFrom::After(o) => o.saturating_add(1),
        })
    }

    /// Up to `max` messages of stream `h` at positions `>= reader.next`, skipping expired
    /// ones and ones whose record the log no longer holds. Advances the reader.
    pub fn read(
        &self,
        h: &StreamHandle,
        reader: &mut StreamReader,
        max: usize,
    ) -> Result<Vec<StreamMessage>, StreamError> {
        let mut out = Vec::new();
        if max == 0 || h.is_deleted() {
            return Ok(out);
        }
        let cutoff = h.retention_cutoff_us();
        if let Some(entries) = &h.entries {
            return self.read_entries(h, entries, reader, max, cutoff);
        }
        let lo = k_entry(h.id, reader.next);
        let hi = k_entry(h.id, u64::MAX);
        let started = Instant::now();
        for kv in self.tree.range(lo..=hi) {
            let (k, v) = kv.map_err(storage)?;
            let Some(offset) = k.get(9..17).and_then(be64) else {
                continue;
            };
            reader.next = offset.saturating_add(1);
            let Some(e) = Entry::decode(&v) else { continue };
            if e.ts_us < cutoff || e.ts_us < reader.min_ts_us {
                continue;
            }
            let record = match &e.record {
                Some(bytes) => match record::decode_record(bytes.clone()) {
                    Ok(r) => Some(r),
                    Err(why) => {
                        warn!(stream = %h.name, offset, why, "corrupt last-value copy skipped");
                        None
                    }
                },
                None => reader.log_read(&self.store, offset)?,
            };
            if let Some(record) = record {
                out.push(StreamMessage {
                    offset,
                    record,
                    key: e.key,
                });
                if out.len() >= max {
                    break;
                }
            }
            // Bound the time of one call even when most entries are skipped.
            if out.is_empty() && started.elapsed() > Duration::from_millis(50) {
                break;
            }
        }
        Ok(out)
    }
}

/// `<data_dir>/streams`, next to the log.
fn streams_dir(store: &Store) -> PathBuf {
    let log = store.log_dir();
    log.parent().unwrap_or(log).join("streams")
}

fn entries_dir(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:020}"))
}

/// Open a regular stream's entry files at its checkpoint; entries an older version kept in
/// sled move into them first. Returns whether entries the checkpoint counted are missing.
fn open_entries(
    tree: &sled::Tree,
    dir: &Path,
    id: u64,
    name: &str,
) -> Result<(Entries, bool), OpenError> {
    let path = entries_dir(dir, id);
    let (head, end) = match tree.get(k_id(b'n', id))? {
        Some(v) => (
            be64(&v).unwrap_or(0),
            v.get(8..).and_then(be64).unwrap_or(0),
        ),
        None => {
            // No checkpoint yet: a new stream, or entries of the sled format to move.
            let _ = Entries::destroy(&path);
            let (entries, _) = Entries::open(&path, 0, 0)?;
            let mut moved = 0u64;
            loop {
                let mut batch = Vec::new();
                let mut keys = Vec::new();
                for kv in tree.scan_prefix(k_id(b'e', id)).take(GC_BATCH_MAX) {
                    let (k, v) = kv?;
                    let (Some(offset), Some(e)) = (k.get(9..17).and_then(be64), Entry::decode(&v))
                    else {
                        keys.push(k);
                        continue;
                    };
                    batch.push(RawEntry {
                        offset,
                        ts_us: e.ts_us,
                        size: e.size,
                        flags: if e.key.is_some() { RAW_HAS_KEY } else { 0 },
                    });
                    keys.push(k);
                }
                if keys.is_empty() {
                    break;
                }
                entries.append(&batch)?;
                entries.sync()?;
                moved += batch.len() as u64;
                let mut b = sled::Batch::default();
                for k in keys {
                    b.remove(k);
                }
                b.insert(&k_id(b'n', id), &checkpoint_value(0, entries.end())[..]);
                tree.apply_batch(b)?;
            }
            if moved > 0 {
                tree.flush()?;
                info!(stream = %name, entries = moved, "stream entries moved from sled to entry files");
            }
            return Ok((entries, false));
        }
    };
    let (entries, report) = Entries::open(&path, head, end)?;
    if report.cut > 0 {
        info!(stream = %name, entries = report.cut, "stream entries after the last checkpoint cut (indexed again from the log)");
    }
    if report.short_by > 0 {
        warn!(stream = %name, missing = report.short_by, "stream entry files hold fewer entries than their checkpoint; indexing the log again");
    }
    Ok((entries, report.short_by > 0))
}

fn checkpoint_value(head: u64, end: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&head.to_be_bytes());
    v[8..].copy_from_slice(&end.to_be_bytes());
    v
}

/// Counts of every live entry (after entries were lost).
fn recount(entries: &Entries) -> std::io::Result<Counts> {
    let mut c = Counts::default();
    let mut i = entries.head();
    loop {
        let chunk = entries.read(i, TRIM_CHUNK)?;
        if chunk.is_empty() {
            return Ok(c);
        }
        for e in &chunk {
            c.add_raw(e.size, e.has_key());
        }
        i += chunk.len() as u64;
    }
}

impl Engine {
    /// [`Engine::read`] of a regular stream: entries from its files, records from the log.
    fn read_entries(
        &self,
        h: &StreamHandle,
        entries: &Entries,
        reader: &mut StreamReader,
        max: usize,
        cutoff: u64,
    ) -> Result<Vec<StreamMessage>, StreamError> {
        let mut out = Vec::new();
        let mut i = match reader.cursor {
            Some((next, i)) if next == reader.next => i,
            _ => entries.seek_offset(reader.next).map_err(storage)?,
        };
        let min_ts = cutoff.max(reader.min_ts_us);
        if i < entries.end() && min_ts > 0 {
            // Skip expired entries by search, not one by one (and not at all when the next
            // entry is live, the usual case).
            let next_live = entries
                .get(i)
                .map_err(storage)?
                .is_some_and(|e| e.ts_us >= min_ts);
            if !next_live {
                let first_live = entries.seek_ts(min_ts).map_err(storage)?;
                i = i.max(first_live);
            }
        }
        let started = Instant::now();
        while out.len() < max {
            let (first, chunk) = entries
                .read_from(i, (max - out.len()).clamp(16, 1024))
                .map_err(storage)?;
            if chunk.is_empty() {
                break;
            }
            i = first;
            for e in chunk {
                i += 1;
                reader.next = e.offset.saturating_add(1);
                if e.ts_us < min_ts {
                    continue;
                }
                let Some(record) = reader.log_read(&self.store, e.offset)? else {
                    continue;
                };
                let key = if e.has_key() {
                    let st = h.read();
                    st.key
                        .as_ref()
                        .and_then(|k| k.eval(&key_input(&record)))
                        .map(|k| cut(k, KEY_LEN_MAX))
                } else {
                    None
                };
                out.push(StreamMessage {
                    offset: e.offset,
                    record,
                    key,
                });
                if out.len() >= max {
                    break;
                }
            }
            if out.is_empty() && started.elapsed() > Duration::from_millis(50) {
                break;
            }
        }
        reader.cursor = Some((reader.next, i));
        Ok(out)
    }
}

fn files_err(op: &'static str, dir: &Path, e: std::io::Error) -> StoreError {
    StoreError::Io {
        op,
        path: dir.to_path_buf(),
        source: Arc::new(e),
    }
}

fn sled_err(e: sled::Error) -> StoreError {
    StoreError::from(e)
}

fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

fn key_input(rec: &Record) -> KeyInput<'_> {
    KeyInput {
        topic: &rec.topic,
        client_id: &rec.client_id,
        username: rec.properties.username.as_deref(),
        qos: rec.qos,
        user_properties: &rec.properties.user_properties,
        payload: &rec.payload,
    }
}

fn encode_copy(rec: &Record) -> Option<Bytes> {
    record::encode_record(rec.offset, rec.timestamp_us, rec.to_record_in())
        .ok()
        .map(Bytes::from)
}

/// A reader's position in one stream, and the log cursor it reuses for dense runs.
#[derive(Debug)]
pub struct StreamReader {
    /// Next position (log offset) to read.
    pub next: u64,
    /// Messages published before this time (µs) are skipped: a subscription that asked for
    /// `stream-offset=<timestamp>` gets only messages at or after it, live ones included.
    pub min_ts_us: u64,
    log: Option<LogReader>,
    /// Entry index of `next` in a regular stream's files, when known: (next, index).
    cursor: Option<(u64, u64)>,
}

impl StreamReader {
    pub fn new(from: u64) -> StreamReader {
        StreamReader {
            next: from,
            min_ts_us: 0,
            log: None,
            cursor: None,
        }
    }

    /// A reader at `from` that also skips messages older than what `start` asks for.
    pub fn for_start(from: u64, start: StartFrom) -> StreamReader {
        let mut r = StreamReader::new(from);
        if let StartFrom::TimestampUs(t) = start {
            r.min_ts_us = t;
        }
        r
    }

    /// The record at `offset`, or `None` if the log no longer holds it.
    fn log_read(&mut self, store: &Store, offset: u64) -> Result<Option<Record>, StreamError> {
        let reuse = self.log.as_ref().is_some_and(|l| {
            l.next_offset() <= offset && offset - l.next_offset() <= READ_SKIP_MAX
        });
        if !reuse {
            if offset < store.first_offset() {
                return Ok(None);
            }
            self.log = Some(store.reader(offset));
        }
        let Some(log) = self.log.as_mut() else {
            return Ok(None);
        };
        loop {
            match log.next_record() {
                Ok(Some(r)) if r.offset == offset => return Ok(Some(r)),
                Ok(Some(r)) if r.offset < offset => continue,
                Ok(_) => {
                    self.log = None;
                    return Ok(None);
                }
                Err(StoreError::OffsetOutOfRange { .. }) => {
                    self.log = None;
                    return Ok(None);
                }
                Err(e) => {
                    self.log = None;
                    return Err(storage(e));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::model::Limit;
    use lanemq_store::{Index, RecordIn, StoreOptions};
    use std::path::PathBuf;

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
                "lanemq-streams-{tag}-{}-{}",
                std::process::id(),
                now_us()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let (store, index) = Self::open_parts(&dir);
            Fixture {
                dir: TempDir(dir),
                store,
                index,
            }
        }
        fn open_parts(dir: &std::path::Path) -> (Store, Index) {
            let (store, _) = Store::open(StoreOptions::new(dir)).unwrap();
            // A reopen right after a drop: sled's background flusher may still hold the
            // database's file lock for a moment.
            let mut tries = 0;
            let index = loop {
                match Index::open(&dir.join("index")) {
                    Ok(i) => break i,
                    Err(e) if tries < 100 && e.to_string().contains("could not acquire lock") => {
                        tries += 1;
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                    Err(e) => panic!("open the index: {e}"),
                }
            };
            (store, index)
        }
        fn engine(&self, defs: &[StreamDef]) -> Arc<Engine> {
            let e = Engine::open(
                self.store.clone(),
                &self.index,
                GlobalSettings::default(),
                defs,
            )
            .unwrap();
            e.start().unwrap();
            e
        }
        /// Append and wait until the engine indexed it.
        fn publish(&self, e: &Engine, topic: &str, from: &str, payload: &str) -> u64 {
            let rec = RecordIn {
                qos: 1,
                topic: topic.into(),
                client_id: from.into(),
                payload: Bytes::copy_from_slice(payload.as_bytes()),
                ..RecordIn::default()
            };
            let off = self.store.append(rec, Box::new(|_| {})).unwrap();
            self.store.sync().unwrap();
            e.poke();
            wait_indexed(e, off + 1);
            off
        }
        fn restart(self, e: Arc<Engine>) -> Fixture {
            e.close();
            drop(e);
            let Fixture { dir, store, index } = self;
            store.close().unwrap();
            index.flush().unwrap();
            drop(store);
            drop(index);
            let (store, index) = Self::open_parts(&dir.0);
            Fixture { dir, store, index }
        }
    }

    /// `verify::verify` once sled's flusher has let go of the database lock.
    fn verify_when_unlocked(dir: &std::path::Path) -> crate::verify::Report {
        for _ in 0..100 {
            match crate::verify::verify(dir) {
                Err(e) if e.to_string().contains("could not acquire lock") => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                r => return r.unwrap(),
            }
        }
        panic!("the index stayed locked");
    }

    #[test]
    fn the_offline_check_matches_stream_entries_with_the_log() {
        let f = Fixture::new("verify");
        let e = f.engine(&[StreamDef::new("s", "a/#"), StreamDef::new("t", "b/+")]);
        for i in 0..50 {
            f.publish(&e, &format!("a/{i}"), "c", "x");
            if i % 5 == 0 {
                f.publish(&e, "b/x", "c", "y");
            }
            f.publish(&e, "z", "c", "n");
        }
        e.close();
        drop(e);
        let Fixture { dir, store, index } = f;
        store.close().unwrap();
        index.flush().unwrap();
        drop(store);
        drop(index);
        let r = verify_when_unlocked(&dir.0);
        assert!(r.is_ok(), "{:?}", r.problems);
        assert_eq!((r.streams, r.entries, r.matched), (2, 60, 60));
        // The first stream's files: damage the time of its entry 3.
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir.0.join("streams"))
            .unwrap()
            .map(|d| d.unwrap().path())
            .collect();
        dirs.sort();
        let file = std::fs::read_dir(&dirs[0])
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let mut bytes = std::fs::read(&file).unwrap();
        assert_eq!(bytes.len(), 50 * 24);
        bytes[3 * 24 + 15] ^= 1;
        std::fs::write(&file, &bytes).unwrap();
        let r = verify_when_unlocked(&dir.0);
        assert_eq!(r.problems.len(), 1, "{:?}", r.problems);
        assert!(r.problems[0].contains("entry 3"), "{:?}", r.problems);
        // Entries lost from the end of the file: each of their records is missing one.
        bytes[3 * 24 + 15] ^= 1;
        bytes.truncate(47 * 24);
        std::fs::write(&file, &bytes).unwrap();
        let r = verify_when_unlocked(&dir.0);
        assert_eq!(r.problems.len(), 3, "{:?}", r.problems);
        assert!(
            r.problems.iter().all(|p| p.contains("has no entry")),
            "{:?}",
            r.problems
        );
        assert_eq!(r.matched, 57);
    }

    fn wait_indexed(e: &Engine, upto: u64) {
        let t = Instant::now();
        while e.indexed_offset() < upto {
            assert!(t.elapsed() < Duration::from_secs(10), "indexer stuck");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn read_all(e: &Engine, name: &str, from: StartFrom) -> Vec<(u64, String, String)> {
        let h = e.lookup(name).unwrap();
        let mut r = StreamReader::for_start(e.start_position(&h, from).unwrap(), from);
        let mut out = Vec::new();
        loop {
            let batch = e.read(&h, &mut r, 7).unwrap();
            if batch.is_empty() {
                return out;
            }
            for m in batch {
                out.push((
                    m.offset,
                    m.record.topic.clone(),
                    String::from_utf8_lossy(&m.record.payload).into_owned(),
                ));
            }
        }
    }

    fn payloads(v: &[(u64, String, String)]) -> Vec<&str> {
        v.iter().map(|(_, _, p)| p.as_str()).collect()
    }

    #[test]
    fn stream_captures_only_matching_topics_published_after_creation() {
        let f = Fixture::new("capture");
        let e = f.engine(&[]);
        f.publish(&e, "t/1", "c", "before");
        e.create(StreamDef::new("events", "t/#")).unwrap();
        f.publish(&e, "t/1", "c", "a");
        f.publish(&e, "u/1", "c", "other");
        f.publish(&e, "t/2/x", "c", "b");
        let got = read_all(&e, "events", StartFrom::Earliest);
        assert_eq!(payloads(&got), ["a", "b"]);
        assert_eq!(got[1].1, "t/2/x", "original topic kept");
        let info = e.get("events").unwrap();
        assert_eq!(info.stats.message_count, 2);
        assert!(info.stats.oldest_timestamp_us.is_some());
        e.close();
    }

    #[test]
    fn message_matching_several_streams_is_stored_once() {
        let f = Fixture::new("once");
        let e = f.engine(&[]);
        for (n, flt) in [("a", "t/#"), ("b", "t/+"), ("c", "#")] {
            e.create(StreamDef::new(n, flt)).unwrap();
        }
        let before = f.store.next_offset();
        let off = f.publish(&e, "t/1", "c", "x");
        assert_eq!(f.store.next_offset(), before + 1);
        for n in ["a", "b", "c"] {
            let got = read_all(&e, n, StartFrom::Earliest);
            assert_eq!(got.len(), 1, "{n}");
            assert_eq!(got[0].0, off);
        }
        e.close();
    }

    #[test]
    fn future_timestamp_skips_messages_published_before_it() {
        let f = Fixture::new("future");
        let e = f.engine(&[StreamDef::new("s", "t/#")]);
        f.publish(&e, "t/1", "c", "old");
        let future = now_us() + 60_000_000;
        let h = e.lookup("s").unwrap();
        let from = StartFrom::TimestampUs(future);
        let mut r = StreamReader::for_start(e.start_position(&h, from).unwrap(), from);
        let upto = f.publish(&e, "t/1", "c", "now");
        wait_indexed(&e, upto + 1);
        assert!(e.read(&h, &mut r, 100).unwrap().is_empty());
        assert!(read_all(&e, "s", from).is_empty());
    }

    #[test]
    fn start_positions_latest_after_and_timestamp() {
        let f = Fixture::new("start");
        let e = f.engine(&[StreamDef::new("s", "t/#")]);
        let o1 = f.publish(&e, "t/1", "c", "1");
        std::thread::sleep(Duration::from_millis(3));
        let ts = now_us();
        f.publish(&e, "t/1", "c", "2");
        f.publish(&e, "t/1", "c", "3");
        assert!(read_all(&e, "s", StartFrom::Latest).is_empty());
        assert_eq!(
            payloads(&read_all(&e, "s", StartFrom::After(o1))),
            ["2", "3"]
        );
        assert_eq!(
            payloads(&read_all(&e, "s", StartFrom::TimestampUs(ts))),
            ["2", "3"]
        );
        assert_eq!(
            payloads(&read_all(&e, "s", StartFrom::TimestampUs(0))),
            ["1", "2", "3"]
        );
        e.close();
    }

    #[test]
    fn registry_entries_and_counts_survive_restart_without_double_counting() {
        let f = Fixture::new("restart");
        let e = f.engine(&[]);
        e.create(StreamDef::new("s", "t/#")).unwrap();
        for i in 0..10 {
            f.publish(&e, "t/x", "c", &i.to_string());
        }
        let f = f.restart(e);
        let e = f.engine(&[]);
        assert_eq!(e.get("s").unwrap().stats.message_count, 10);
        f.publish(&e, "t/x", "c", "10");
        let got = read_all(&e, "s", StartFrom::Earliest);
        assert_eq!(got.len(), 11);
        assert_eq!(e.get("s").unwrap().stats.message_count, 11);
        // Offsets strictly increase: no duplicates.
        assert!(got.windows(2).all(|w| w[0].0 < w[1].0));
        e.close();
    }

    /// A crash after a checkpoint: the entry files hold entries the stored checkpoint does
    /// not count. They are cut and indexed again from the log: nothing lost, nothing twice.
    #[test]
    fn entries_after_the_last_checkpoint_are_cut_and_indexed_again() {
        let f = Fixture::new("crash");
        let e = f.engine(&[]);
        e.create(StreamDef::new("s", "t/#")).unwrap();
        let mut lv = StreamDef::new("lv", "t/#");
        lv.is_lastvalue = true;
        lv.key_expression = "message.topic".into();
        e.create(lv).unwrap();
        for i in 0..5 {
            f.publish(&e, "t/x", "c", &format!("a{i}"));
        }
        e.checkpoint().unwrap();
        let tree = f.index.tree("s_streams").unwrap();
        let id = e.lookup("s").unwrap().id;
        let saved: Vec<(Vec<u8>, Option<sled::IVec>)> = [
            K_WATERMARK.to_vec(),
            k_id(b'n', id).to_vec(),
            k_id(b'c', id).to_vec(),
        ]
        .into_iter()
        .map(|k| {
            let v = tree.get(&k).unwrap();
            (k, v)
        })
        .collect();
        for i in 0..5 {
            f.publish(&e, "t/y", "c", &format!("b{i}"));
        }
        drop(tree);
        let f = f.restart(e);
        // Put the first checkpoint back, as if the process died before the second one.
        let tree = f.index.tree("s_streams").unwrap();
        for (k, v) in saved {
            tree.insert(k, v.unwrap()).unwrap();
        }
        drop(tree);
        let e = f.engine(&[]);
        wait_indexed(&e, f.store.committed_offset());
        let got = read_all(&e, "s", StartFrom::Earliest);
        let want: Vec<String> = (0..5)
            .map(|i| format!("a{i}"))
            .chain((0..5).map(|i| format!("b{i}")))
            .collect();
        assert_eq!(payloads(&got), want);
        assert_eq!(e.get("s").unwrap().stats.message_count, 10);
        // The last-value stream was not touched twice either.
        assert_eq!(
            payloads(&read_all(&e, "lv", StartFrom::Earliest)),
            ["a4", "b4"]
        );
        assert_eq!(e.get("lv").unwrap().stats.message_count, 2);
        e.close();
    }

    #[test]
    fn retention_of_a_regular_stream_deletes_whole_entry_files_after_a_checkpoint() {
        let f = Fixture::new("files");
        let e = f.engine(&[]);
        let mut d = StreamDef::new("s", "t/#");
        d.limits.max_message_count = Limit::Max(3);
        e.create(d).unwrap();
        for i in 0..6 {
            f.publish(&e, "t/x", "c", &i.to_string());
        }
        assert_eq!(
            payloads(&read_all(&e, "s", StartFrom::Earliest)),
            ["3", "4", "5"]
        );
        let h = e.lookup("s").unwrap();
        let entries = h.entries.as_ref().unwrap();
        assert_eq!((entries.head(), entries.end()), (3, 6));
        // The pinned log offset follows the head.
        e.checkpoint().unwrap();
        let first = read_all(&e, "s", StartFrom::Earliest)[0].0;
        assert_eq!(e.min_referenced_offset(), first);
        let f = f.restart(e);
        let e = f.engine(&[]);
        assert_eq!(
            payloads(&read_all(&e, "s", StartFrom::Earliest)),
            ["3", "4", "5"]
        );
        assert_eq!(e.get("s").unwrap().stats.message_count, 3);
        e.delete("s").unwrap();
        assert!(!f
            .dir
            .0
            .join("streams")
            .join(format!("{:020}", h.id))
            .exists());
        e.close();
    }

    #[test]
    fn config_defs_are_created_and_updated_at_open() {
        let f = Fixture::new("cfg");
        let e = f.engine(&[StreamDef::new("s", "t/#")]);
        let f = f.restart(e);
        let mut d = StreamDef::new("s", "t/#");
        d.read_max_unacked = 7;
        let e = f.engine(std::slice::from_ref(&d));
        assert_eq!(e.lookup("s").unwrap().read_max_unacked(), 7);
        e.close();
        let f = f.restart(e);
        let bad = StreamDef::new("s", "other/#");
        let r = Engine::open(
            f.store.clone(),
            &f.index,
            GlobalSettings::default(),
            std::slice::from_ref(&bad),
        );
        assert!(matches!(r, Err(OpenError::Config { .. })), "{r:?}");
    }

    #[test]
    fn count_limit_drops_the_oldest_entries() {
        let f = Fixture::new("limit");
        let e = f.engine(&[]);
        let mut d = StreamDef::new("s", "t");
        d.limits.max_message_count = Limit::Max(3);
        e.create(d).unwrap();
        for i in 0..6 {
            f.publish(&e, "t", "c", &i.to_string());
        }
        assert_eq!(
            payloads(&read_all(&e, "s", StartFrom::Earliest)),
            ["3", "4", "5"]
        );
        assert_eq!(e.get("s").unwrap().stats.message_count, 3);
        e.close();
    }

    #[test]
    fn expired_entries_are_never_read_and_gc_removes_them() {
        let f = Fixture::new("expiry");
        let e = f.engine(&[]);
        let mut d = StreamDef::new("s", "t");
        d.data_retention_period = SpecDurationMs(40).into();
        e.create(d).unwrap();
        f.publish(&e, "t", "c", "old");
        std::thread::sleep(Duration::from_millis(60));
        f.publish(&e, "t", "c", "new");
        assert_eq!(payloads(&read_all(&e, "s", StartFrom::Earliest)), ["new"]);
        assert_eq!(e.gc(), 1);
        assert_eq!(e.get("s").unwrap().stats.message_count, 1);
        e.close();
    }

    struct SpecDurationMs(u64);
    impl From<SpecDurationMs> for crate::model::SpecDuration {
        fn from(v: SpecDurationMs) -> Self {
            crate::model::SpecDuration(Duration::from_millis(v.0))
        }
    }

    #[test]
    fn last_value_stream_keeps_the_newest_message_per_key_beyond_log_retention() {
        let f = Fixture::new("lv");
        let e = f.engine(&[]);
        let mut d = StreamDef::new("lv", "dev/#");
        d.is_lastvalue = true;
        e.create(d).unwrap();
        f.publish(&e, "dev/1", "a", "a1");
        f.publish(&e, "dev/2", "b", "b1");
        f.publish(&e, "dev/1", "a", "a2");
        f.publish(&e, "dev/3", "b", "b2");
        assert_eq!(
            payloads(&read_all(&e, "lv", StartFrom::Earliest)),
            ["a2", "b2"]
        );
        assert_eq!(e.get("lv").unwrap().stats.message_count, 2);
        // Last values carry their record: they do not pin the log (beyond the checkpoint).
        e.checkpoint().unwrap();
        assert_eq!(e.min_referenced_offset(), e.indexed_offset());
        let f = f.restart(e);
        let e = f.engine(&[]);
        assert_eq!(
            payloads(&read_all(&e, "lv", StartFrom::Earliest)),
            ["a2", "b2"]
        );
        e.close();
    }

    #[test]
    fn delete_ends_reads_and_purges_entries() {
        let f = Fixture::new("delete");
        let e = f.engine(&[StreamDef::new("s", "t")]);
        f.publish(&e, "t", "c", "x");
        let h = e.lookup("s").unwrap();
        e.delete("s").unwrap();
        assert!(h.is_deleted());
        assert!(e.lookup("s").is_none());
        assert!(matches!(e.get("s"), Err(StreamError::NotFound(_))));
        let mut r = StreamReader::new(0);
        assert!(e.read(&h, &mut r, 10).unwrap().is_empty());
        assert_eq!(e.tree.scan_prefix(k_id(b'e', h.id)).count(), 0);
        // The name can be used again; the new stream starts empty.
        e.create(StreamDef::new("s", "t")).unwrap();
        assert!(read_all(&e, "s", StartFrom::Earliest).is_empty());
        e.close();
    }

    #[test]
    fn update_keeps_filter_and_lastvalue_fixed_and_create_checks_limits() {
        let f = Fixture::new("update");
        let e = f.engine(&[StreamDef::new("s", "t")]);
        let mut d = StreamDef::new("s", "u");
        assert!(matches!(
            e.update("s", d.clone()),
            Err(StreamError::Immutable("topic_filter"))
        ));
        d.topic_filter = "t".into();
        d.is_lastvalue = true;
        assert!(matches!(
            e.update("s", d.clone()),
            Err(StreamError::Immutable("is_lastvalue"))
        ));
        d.is_lastvalue = false;
        d.read_max_unacked = 5;
        assert_eq!(e.update("s", d).unwrap().def.read_max_unacked, 5);
        assert!(matches!(
            e.create(StreamDef::new("s", "t")),
            Err(StreamError::AlreadyExists(_))
        ));
        assert!(matches!(
            e.create(StreamDef::new("bad name", "t")),
            Err(StreamError::Invalid(_))
        ));
        let mut s = e.settings();
        s.max_stream_count = 1;
        e.put_settings(s).unwrap();
        assert!(matches!(
            e.create(StreamDef::new("s2", "t")),
            Err(StreamError::MaxStreamCount(1))
        ));
        let (list, more) = e.list(None, 10);
        assert_eq!(list.len(), 1);
        assert!(!more);
        e.close();
    }

    #[test]
    fn regular_entries_pin_the_log_from_their_oldest_offset() {
        let f = Fixture::new("pin");
        let e = f.engine(&[StreamDef::new("s", "t")]);
        let o = f.publish(&e, "t", "c", "x");
        f.publish(&e, "u", "c", "y");
        assert_eq!(e.min_referenced_offset(), o);
        e.close();
    }
}
