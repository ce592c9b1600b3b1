//! The sled index: one `sled::Db`, one tree per concern, big-endian keys so that range
//! scans come out in order.
//!
//! | tree            | key                                    | value                                 |
//! |-----------------|----------------------------------------|---------------------------------------|
//! | `sessions`      | client                                 | opaque session state (broker-encoded) |
//! | `subscriptions` | client, filter                         | opaque subscription options           |
//! | `inflight`      | client, packet id u16                  | log offset u64, QoS u8, stage u8      |
//! | `offline_queue` | client, seq u64                        | log offset u64                        |
//! | `retained`      | topic                                  | log offset u64                        |
//! | `inbound_qos2`  | client, packet id u16                  | empty                                 |
//! | `wills`         | client                                 | fire-at µs u64, record encoding       |
//! | `meta`          | `watermark`                            | log offset u64                        |
//! | `streams`       | (next issue) stream id u64, seq u64    | log offset                            |
//! | `lanes`         | (next issue) lane id u64, seq u64      | log offset                            |
//!
//! `client` in a key is `len u16 | bytes`, so every key of one client shares a prefix and
//! one client's prefix is never a prefix of another's.
//!
//! # Log-derived state and the watermark
//!
//! `retained`, `offline_queue`, `streams` and `lanes` are derived from the log: the
//! `watermark` (in `meta`) is the log offset up to which they are complete, and
//! [`catch_up`] replays the log from there on start. Replays must be idempotent — they are
//! when keys are derived from the record (use the log offset as the offline-queue `seq`).
//! Sessions, subscriptions, inflight state, inbound QoS 2 ids and wills are primary state
//! that only lives here.
//!
//! **Rule**: never let sled hold an entry for an offset that is not yet durable in the log;
//! insert index entries after the append's callback reported `Ok` (the broker does this
//! before it sends PUBACK/PUBREC). Otherwise a crash could lose the record but keep the
//! entry, and the offset would be reused by a different message. `set_watermark(w)` only
//! with `w <= store.committed_offset()`.
//!
//! # Threads
//!
//! sled is `Send + Sync` and every call may block on I/O (page faults, its flusher,
//! `flush()`): call it from `spawn_blocking` or a storage task's own thread, never from an
//! async task directly and never from a store completion callback (that would stall group
//! commit for every publisher).

use std::path::Path;

use bytes::Bytes;

use crate::error::StoreError;
use crate::log::Store;
use crate::record::{self, Record, RecordIn};

const WATERMARK_KEY: &[u8] = b"watermark";

/// Stage of an outbound QoS 1/2 delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InflightStage {
    /// QoS 1 PUBLISH sent, waiting for PUBACK.
    AwaitPuback,
    /// QoS 2 PUBLISH sent, waiting for PUBREC.
    AwaitPubrec,
    /// PUBREL sent, waiting for PUBCOMP.
    AwaitPubcomp,
}

impl InflightStage {
    fn to_u8(self) -> u8 {
        match self {
            InflightStage::AwaitPuback => 1,
            InflightStage::AwaitPubrec => 2,
            InflightStage::AwaitPubcomp => 3,
        }
    }
    fn from_u8(b: u8) -> Option<Self> {
        match b {
            1 => Some(InflightStage::AwaitPuback),
            2 => Some(InflightStage::AwaitPubrec),
            3 => Some(InflightStage::AwaitPubcomp),
            _ => None,
        }
    }
}

/// One outbound message awaiting acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InflightEntry {
    /// Log offset of the message.
    pub offset: u64,
    /// QoS it was sent with.
    pub qos: u8,
    /// Where the handshake is.
    pub stage: InflightStage,
}

/// A pending will message with a delay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Will {
    /// When to publish it, µs since the epoch.
    pub fire_at_us: u64,
    /// The message.
    pub message: RecordIn,
}

/// What [`catch_up`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CatchUpReport {
    /// Watermark found.
    pub from: u64,
    /// Watermark after (exclusive end replayed).
    pub to: u64,
    /// Records replayed.
    pub records: u64,
    /// Records between the watermark and the log's first offset that retention had
    /// already deleted (should be 0 when the watermark pins retention).
    pub skipped: u64,
    /// The watermark was beyond the log's end: the index is ahead of the log (possible
    /// only after a power loss under a relaxed fsync policy). Nothing was replayed; the
    /// caller should rebuild the log-derived trees.
    pub index_ahead: bool,
}

/// The sled index.
#[derive(Debug, Clone)]
pub struct Index {
    db: sled::Db,
    sessions: sled::Tree,
    subscriptions: sled::Tree,
    inflight: sled::Tree,
    offline_queue: sled::Tree,
    retained: sled::Tree,
    inbound_qos2: sled::Tree,
    wills: sled::Tree,
    meta: sled::Tree,
    streams: sled::Tree,
    lanes: sled::Tree,
}

fn client_prefix(client: &str) -> Result<Vec<u8>, StoreError> {
    let len = u16::try_from(client.len())
        .map_err(|_| StoreError::InvalidRecord("client id longer than 65535 bytes"))?;
    let mut k = Vec::with_capacity(2 + client.len() + 16);
    k.extend_from_slice(&len.to_be_bytes());
    k.extend_from_slice(client.as_bytes());
    Ok(k)
}

fn client_key(client: &str, suffix: &[u8]) -> Result<Vec<u8>, StoreError> {
    let mut k = client_prefix(client)?;
    k.extend_from_slice(suffix);
    Ok(k)
}

fn corrupt_index(what: &str) -> StoreError {
    StoreError::corrupt("<sled index>", 0, format!("malformed {what} entry"))
}

fn be_u64(v: &[u8]) -> Option<u64> {
    let b: [u8; 8] = v.get(..8)?.try_into().ok()?;
    Some(u64::from_be_bytes(b))
}

fn be_u16(v: &[u8]) -> Option<u16> {
    let b: [u8; 2] = v.get(..2)?.try_into().ok()?;
    Some(u16::from_be_bytes(b))
}

impl Index {
    /// Opens (or creates) the index in `dir`.
    pub fn open(dir: &Path) -> Result<Index, StoreError> {
        Self::from_db(sled::Config::new().path(dir).open()?)
    }

    /// Opens (or creates) the index in `dir` with a page cache of `cache_bytes`.
    pub fn open_with_cache(dir: &Path, cache_bytes: u64) -> Result<Index, StoreError> {
        Self::from_db(
            sled::Config::new()
                .path(dir)
                .cache_capacity(cache_bytes)
                .open()?,
        )
    }

    /// A throw-away index (tests).
    pub fn temporary() -> Result<Index, StoreError> {
        Self::from_db(sled::Config::new().temporary(true).open()?)
    }

    fn from_db(db: sled::Db) -> Result<Index, StoreError> {
        Ok(Index {
            sessions: db.open_tree("sessions")?,
            subscriptions: db.open_tree("subscriptions")?,
            inflight: db.open_tree("inflight")?,
            offline_queue: db.open_tree("offline_queue")?,
            retained: db.open_tree("retained")?,
            inbound_qos2: db.open_tree("inbound_qos2")?,
            wills: db.open_tree("wills")?,
            meta: db.open_tree("meta")?,
            streams: db.open_tree("streams")?,
            lanes: db.open_tree("lanes")?,
            db,
        })
    }

    /// Makes everything written so far durable (blocks on I/O).
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }

    /// A named tree for later layers (streams, lanes, registries, group offsets).
    pub fn tree(&self, name: &str) -> Result<sled::Tree, StoreError> {
        Ok(self.db.open_tree(name)?)
    }

    /// The `streams` tree (keys `stream id u64 | seq u64`, see [`Index::seq_key`]).
    pub fn streams(&self) -> &sled::Tree {
        &self.streams
    }

    /// The `lanes` tree (keys `lane id u64 | seq u64`, see [`Index::seq_key`]).
    pub fn lanes(&self) -> &sled::Tree {
        &self.lanes
    }

    /// `id u64 | seq u64`, big-endian: ranges over one id come out in seq order.
    pub fn seq_key(id: u64, seq: u64) -> [u8; 16] {
        let mut k = [0u8; 16];
        k[..8].copy_from_slice(&id.to_be_bytes());
        k[8..].copy_from_slice(&seq.to_be_bytes());
        k
    }

    // --- watermark ---------------------------------------------------------------------

    /// Log offset up to which the log-derived trees are complete (0 for a new index).
    pub fn watermark(&self) -> Result<u64, StoreError> {
        match self.meta.get(WATERMARK_KEY)? {
            None => Ok(0),
            Some(v) => be_u64(&v).ok_or_else(|| corrupt_index("watermark")),
        }
    }

    /// Records that the log-derived trees are complete below `offset`.
    pub fn set_watermark(&self, offset: u64) -> Result<(), StoreError> {
        self.meta.insert(WATERMARK_KEY, &offset.to_be_bytes())?;
        Ok(())
    }

    // --- sessions ----------------------------------------------------------------------

    /// Stores a persistent session's state.
    pub fn put_session(&self, client: &str, state: &[u8]) -> Result<(), StoreError> {
        self.sessions.insert(client_prefix(client)?, state)?;
        Ok(())
    }

    /// A session's state.
    pub fn get_session(&self, client: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .sessions
            .get(client_prefix(client)?)?
            .map(|v| v.to_vec()))
    }

    /// Every stored session: (client, state).
    pub fn sessions(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let mut out = Vec::new();
        for kv in self.sessions.iter() {
            let (k, v) = kv?;
            out.push((decode_client(&k)?.0, v.to_vec()));
        }
        Ok(out)
    }

    /// Removes a session and everything of that client (subscriptions, inflight, offline
    /// queue, inbound QoS 2 ids, will).
    pub fn remove_session(&self, client: &str) -> Result<(), StoreError> {
        let p = client_prefix(client)?;
        self.sessions.remove(&p)?;
        self.wills.remove(&p)?;
        for t in [
            &self.subscriptions,
            &self.inflight,
            &self.offline_queue,
            &self.inbound_qos2,
        ] {
            let mut batch = sled::Batch::default();
            for kv in t.scan_prefix(&p) {
                batch.remove(kv?.0);
            }
            t.apply_batch(batch)?;
        }
        Ok(())
    }

    // --- subscriptions -----------------------------------------------------------------

    /// Stores a subscription (options encoded by the broker).
    pub fn put_subscription(
        &self,
        client: &str,
        filter: &str,
        options: &[u8],
    ) -> Result<(), StoreError> {
        self.subscriptions
            .insert(client_key(client, filter.as_bytes())?, options)?;
        Ok(())
    }

    /// Removes a subscription; true if it existed.
    pub fn remove_subscription(&self, client: &str, filter: &str) -> Result<bool, StoreError> {
        Ok(self
            .subscriptions
            .remove(client_key(client, filter.as_bytes())?)?
            .is_some())
    }

    /// A client's subscriptions: (filter, options), by filter.
    pub fn subscriptions(&self, client: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let p = client_prefix(client)?;
        let mut out = Vec::new();
        for kv in self.subscriptions.scan_prefix(&p) {
            let (k, v) = kv?;
            let f = String::from_utf8(k[p.len()..].to_vec())
                .map_err(|_| corrupt_index("subscription"))?;
            out.push((f, v.to_vec()));
        }
        Ok(out)
    }

    // --- inflight ----------------------------------------------------------------------

    /// Stores an outbound inflight message.
    pub fn put_inflight(
        &self,
        client: &str,
        packet_id: u16,
        e: InflightEntry,
    ) -> Result<(), StoreError> {
        let mut v = [0u8; 10];
        v[..8].copy_from_slice(&e.offset.to_be_bytes());
        v[8] = e.qos;
        v[9] = e.stage.to_u8();
        self.inflight
            .insert(client_key(client, &packet_id.to_be_bytes())?, &v)?;
        Ok(())
    }

    /// Removes an inflight entry; true if it existed.
    pub fn remove_inflight(&self, client: &str, packet_id: u16) -> Result<bool, StoreError> {
        Ok(self
            .inflight
            .remove(client_key(client, &packet_id.to_be_bytes())?)?
            .is_some())
    }

    /// A client's inflight messages, by packet id.
    pub fn inflight(&self, client: &str) -> Result<Vec<(u16, InflightEntry)>, StoreError> {
        let p = client_prefix(client)?;
        let mut out = Vec::new();
        for kv in self.inflight.scan_prefix(&p) {
            let (k, v) = kv?;
            let pid = be_u16(&k[p.len()..]).ok_or_else(|| corrupt_index("inflight"))?;
            let offset = be_u64(&v).ok_or_else(|| corrupt_index("inflight"))?;
            let stage = v
                .get(9)
                .and_then(|&b| InflightStage::from_u8(b))
                .ok_or_else(|| corrupt_index("inflight"))?;
            out.push((
                pid,
                InflightEntry {
                    offset,
                    qos: v[8],
                    stage,
                },
            ));
        }
        Ok(out)
    }

    // --- offline queue -----------------------------------------------------------------

    /// Queues a log offset for an offline client at `seq`. Using the log offset itself as
    /// `seq` makes replays after a crash idempotent.
    pub fn offline_push(&self, client: &str, seq: u64, offset: u64) -> Result<(), StoreError> {
        self.offline_queue.insert(
            client_key(client, &seq.to_be_bytes())?,
            &offset.to_be_bytes(),
        )?;
        Ok(())
    }

    /// Up to `limit` queued (seq, offset) of a client from `from_seq`, in seq order.
    pub fn offline_range(
        &self,
        client: &str,
        from_seq: u64,
        limit: usize,
    ) -> Result<Vec<(u64, u64)>, StoreError> {
        let p = client_prefix(client)?;
        let start = client_key(client, &from_seq.to_be_bytes())?;
        let end = client_key(client, &u64::MAX.to_be_bytes())?;
        let mut out = Vec::new();
        for kv in self.offline_queue.range(start..=end) {
            if out.len() >= limit {
                break;
            }
            let (k, v) = kv?;
            let seq = be_u64(&k[p.len()..]).ok_or_else(|| corrupt_index("offline queue"))?;
            let off = be_u64(&v).ok_or_else(|| corrupt_index("offline queue"))?;
            out.push((seq, off));
        }
        Ok(out)
    }

    /// Removes a client's queued entries with seq `<= through_seq`; returns how many.
    pub fn offline_remove_through(
        &self,
        client: &str,
        through_seq: u64,
    ) -> Result<usize, StoreError> {
        let start = client_key(client, &0u64.to_be_bytes())?;
        let end = client_key(client, &through_seq.to_be_bytes())?;
        let mut batch = sled::Batch::default();
        let mut n = 0;
        for kv in self.offline_queue.range(start..=end) {
            batch.remove(kv?.0);
            n += 1;
        }
        self.offline_queue.apply_batch(batch)?;
        Ok(n)
    }

    // --- retained ----------------------------------------------------------------------

    /// Sets the retained message of a topic.
    pub fn put_retained(&self, topic: &str, offset: u64) -> Result<(), StoreError> {
        self.retained
            .insert(topic.as_bytes(), &offset.to_be_bytes())?;
        Ok(())
    }

    /// Clears the retained message of a topic; true if there was one.
    pub fn remove_retained(&self, topic: &str) -> Result<bool, StoreError> {
        Ok(self.retained.remove(topic.as_bytes())?.is_some())
    }

    /// The retained message offset of a topic.
    pub fn get_retained(&self, topic: &str) -> Result<Option<u64>, StoreError> {
        match self.retained.get(topic.as_bytes())? {
            None => Ok(None),
            Some(v) => Ok(Some(be_u64(&v).ok_or_else(|| corrupt_index("retained"))?)),
        }
    }

    /// Every retained message: (topic, offset), by topic.
    pub fn retained(&self) -> Result<Vec<(String, u64)>, StoreError> {
        let mut out = Vec::new();
        for kv in self.retained.iter() {
            let (k, v) = kv?;
            let t = String::from_utf8(k.to_vec()).map_err(|_| corrupt_index("retained"))?;
            out.push((t, be_u64(&v).ok_or_else(|| corrupt_index("retained"))?));
        }
        Ok(out)
    }

    // --- inbound QoS 2 -----------------------------------------------------------------

    /// Remembers an inbound QoS 2 packet id (PUBREC sent, PUBREL not yet received).
    pub fn put_inbound_qos2(&self, client: &str, packet_id: u16) -> Result<(), StoreError> {
        self.inbound_qos2
            .insert(client_key(client, &packet_id.to_be_bytes())?, &[])?;
        Ok(())
    }

    /// True if the packet id is pending.
    pub fn has_inbound_qos2(&self, client: &str, packet_id: u16) -> Result<bool, StoreError> {
        Ok(self
            .inbound_qos2
            .contains_key(client_key(client, &packet_id.to_be_bytes())?)?)
    }

    /// Forgets a packet id (PUBREL received); true if it was pending.
    pub fn remove_inbound_qos2(&self, client: &str, packet_id: u16) -> Result<bool, StoreError> {
        Ok(self
            .inbound_qos2
            .remove(client_key(client, &packet_id.to_be_bytes())?)?
            .is_some())
    }

    /// A client's pending inbound QoS 2 packet ids.
    pub fn inbound_qos2(&self, client: &str) -> Result<Vec<u16>, StoreError> {
        let p = client_prefix(client)?;
        let mut out = Vec::new();
        for kv in self.inbound_qos2.scan_prefix(&p) {
            let (k, _) = kv?;
            out.push(be_u16(&k[p.len()..]).ok_or_else(|| corrupt_index("inbound qos2"))?);
        }
        Ok(out)
    }

    // --- wills -------------------------------------------------------------------------

    /// Stores a delayed will.
    pub fn put_will(&self, client: &str, will: &Will) -> Result<(), StoreError> {
        let rec =
            record::encode_record(0, 0, will.message.clone()).map_err(StoreError::InvalidRecord)?;
        let mut v = Vec::with_capacity(8 + rec.len());
        v.extend_from_slice(&will.fire_at_us.to_be_bytes());
        v.extend_from_slice(&rec);
        self.wills.insert(client_prefix(client)?, v)?;
        Ok(())
    }

    /// Removes a will; true if there was one.
    pub fn remove_will(&self, client: &str) -> Result<bool, StoreError> {
        Ok(self.wills.remove(client_prefix(client)?)?.is_some())
    }

    /// Every pending will: (client, will).
    pub fn wills(&self) -> Result<Vec<(String, Will)>, StoreError> {
        let mut out = Vec::new();
        for kv in self.wills.iter() {
            let (k, v) = kv?;
            let fire_at_us = be_u64(&v).ok_or_else(|| corrupt_index("will"))?;
            let rec: Record = record::decode_record(Bytes::copy_from_slice(&v[8..]))
                .map_err(|_| corrupt_index("will"))?;
            let mut message = rec.to_record_in();
            message.timestamp_us = None;
            out.push((
                decode_client(&k)?.0,
                Will {
                    fire_at_us,
                    message,
                },
            ));
        }
        Ok(out)
    }
}

fn decode_client(k: &[u8]) -> Result<(String, usize), StoreError> {
    let n = be_u16(k).ok_or_else(|| corrupt_index("client key"))? as usize;
    let s = k.get(2..2 + n).ok_or_else(|| corrupt_index("client key"))?;
    let c = String::from_utf8(s.to_vec()).map_err(|_| corrupt_index("client key"))?;
    Ok((c, 2 + n))
}

/// Replays the log from the index watermark to the committed end, calling `apply` for each
/// record in order, and advances the watermark after every batch. `apply` must be
/// idempotent (a crash between `apply` and the watermark update replays the record again).
/// Run it before accepting connections, on a blocking thread.
pub fn catch_up(
    store: &Store,
    index: &Index,
    mut apply: impl FnMut(&Record) -> Result<(), StoreError>,
) -> Result<CatchUpReport, StoreError> {
    const BATCH_RECORDS_MAX: usize = 1024;
    const BATCH_BYTES_MAX: usize = 4 << 20;
    let from = index.watermark()?;
    let end = store.committed_offset();
    let mut rep = CatchUpReport {
        from,
        to: from,
        ..CatchUpReport::default()
    };
    if from > end {
        rep.index_ahead = true;
        tracing::warn!(
            watermark = from,
            log_end = end,
            "index watermark is beyond the log: index ahead"
        );
        return Ok(rep);
    }
    let first = store.first_offset();
    let start = from.max(first);
    rep.skipped = start - from;
    let mut reader = store.reader(start);
    loop {
        let batch = reader.next_batch(BATCH_RECORDS_MAX, BATCH_BYTES_MAX)?;
        let Some(last) = batch.last().map(|r| r.offset) else {
            break;
        };
        for r in &batch {
            apply(r)?;
        }
        rep.records += batch.len() as u64;
        index.set_watermark(last + 1)?;
        rep.to = last + 1;
        if last + 1 >= end {
            break;
        }
    }
    if rep.to < start {
        index.set_watermark(start)?;
        rep.to = start;
    }
    Ok(rep)
}
