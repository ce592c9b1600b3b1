//! The sled database: one `sled::Db` whose named trees belong to the layers above, each of
//! which owns its schema and documents it next to its code — the broker's session trees
//! (`b_*`, `crates/broker/src/persist.rs`), the stream registry and checkpoints
//! (`crates/streams`), the lite registry (`crates/lite`).
//!
//! There is one schema per concern: this module owns only the `meta` tree's `watermark`
//! (a big-endian u64: the log offset below which the broker's log-derived state is complete;
//! the broker replays the log from it at start).
//!
//! **Rule** (for every owner): never let sled hold an entry for an offset that is not yet
//! durable in the log; insert index entries after the append's callback reported `Ok` (the
//! broker does this before it sends PUBACK/PUBREC). Otherwise a crash could lose the record
//! but keep the entry, and the offset would be reused by a different message.
//!
//! # Threads
//!
//! sled is `Send + Sync` and every call may block on I/O (page faults, its flusher,
//! `flush()`): call it from `spawn_blocking` or a storage task's own thread, never from an
//! async task directly and never from a store completion callback (that would stall group
//! commit for every publisher).

use std::path::Path;

use crate::error::StoreError;

/// The sled index.
#[derive(Debug, Clone)]
pub struct Index {
    db: sled::Db,
    meta: sled::Tree,
}

const WATERMARK_KEY: &[u8] = b"watermark";

/// How long an open waits for sled's file lock. sled takes an exclusive `flock` on its `db`
/// file and gives it back only when its last handle *and* its background threads are gone,
/// which can be a few milliseconds after the `Db` was dropped (a reopen in the same process —
/// a restart, a test — then fails with `WouldBlock`). A lock held by another process for longer
/// than this is reported as the error it is.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

fn open_waiting_for_lock(config: &sled::Config) -> Result<sled::Db, sled::Error> {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match config.open() {
            Err(sled::Error::Io(e))
                if e.to_string().starts_with("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

impl Index {
    /// Opens (or creates) the index in `dir`.
    pub fn open(dir: &Path) -> Result<Index, StoreError> {
        Self::from_db(open_waiting_for_lock(&sled::Config::new().path(dir))?)
    }

    /// Opens (or creates) the index in `dir` with a page cache of `cache_bytes`.
    pub fn open_with_cache(dir: &Path, cache_bytes: u64) -> Result<Index, StoreError> {
        Self::from_db(open_waiting_for_lock(
            &sled::Config::new().path(dir).cache_capacity(cache_bytes),
        )?)
    }

    /// A throw-away index (tests).
    pub fn temporary() -> Result<Index, StoreError> {
        Self::from_db(sled::Config::new().temporary(true).open()?)
    }

    fn from_db(db: sled::Db) -> Result<Index, StoreError> {
        Ok(Index {
            meta: db.open_tree("meta")?,
            db,
        })
    }

    /// Log offset below which the broker's log-derived state is complete (0 for a new index).
    pub fn watermark(&self) -> Result<u64, StoreError> {
        match self.meta.get(WATERMARK_KEY)? {
            None => Ok(0),
            Some(v) => v
                .get(..8)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| StoreError::corrupt("<sled index>", 0, "malformed watermark entry")),
        }
    }

    /// Records that the log-derived state is complete below `offset` (only with `offset <=
    /// store.committed_offset()`).
    pub fn set_watermark(&self, offset: u64) -> Result<(), StoreError> {
        self.meta.insert(WATERMARK_KEY, &offset.to_be_bytes())?;
        Ok(())
    }

    /// Makes everything written so far durable (blocks on I/O).
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }

    /// A named tree of a layer above (its schema is documented by its owner).
    pub fn tree(&self, name: &str) -> Result<sled::Tree, StoreError> {
        Ok(self.db.open_tree(name)?)
    }
}
