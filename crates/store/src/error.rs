//! Typed errors of the store.
//!
//! One enum for the whole crate, `Clone` so that the first storage failure can be
//! remembered (fail-stop) and handed to every later caller and every pending callback.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use crate::record::RecordIn;
use crate::Callback;

/// Errors of the log, the index and the offline tools.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// An I/O operation failed (opening, reading, recovering, deleting a segment).
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What the store was doing (`"write"`, `"fsync"`, `"open"`, ...).
        op: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: Arc<io::Error>,
    },
    /// The store hit a write or fsync error earlier and refuses every write since
    /// (fail-stop). Holds the original error.
    #[error("store is failed and refuses writes (fail-stop); first error: {0}")]
    Failed(Box<StoreError>),
    /// A record or file is not what the format says. Names the segment file and the byte
    /// position inside it.
    #[error("corrupt log: {} at byte {position}: {reason}", segment.display())]
    Corrupt {
        /// The segment (or index) file.
        segment: PathBuf,
        /// Byte position inside that file.
        position: u64,
        /// What is wrong.
        reason: String,
    },
    /// The offset is not readable: below the first retained offset, or not yet appended or
    /// not yet durable.
    #[error("offset {offset} is not in the log (readable range {first}..{next})")]
    OffsetOutOfRange {
        /// The offset asked for.
        offset: u64,
        /// First offset still stored.
        first: u64,
        /// Next offset to become readable (exclusive end).
        next: u64,
    },
    /// The encoded record is larger than `StoreOptions::record_bytes_max`.
    #[error("record of {len} bytes exceeds record_bytes_max {max}")]
    RecordTooLarge {
        /// Encoded length.
        len: usize,
        /// Configured limit.
        max: usize,
    },
    /// The record cannot be encoded (a field is over its length limit, QoS > 2, ...).
    #[error("invalid record: {0}")]
    InvalidRecord(&'static str),
    /// Options that cannot work together.
    #[error("invalid store options: {0}")]
    InvalidOptions(String),
    /// Cluster mode: the cluster's log (JetStream) did not store a record handed to it.
    #[error("the cluster did not store the record: {0}")]
    Cluster(String),
    /// The store was closed.
    #[error("store is closed")]
    Closed,
    /// The sled index failed.
    #[error("index: {0}")]
    Index(Arc<sled::Error>),
}

impl StoreError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        StoreError::Io {
            op,
            path: path.into(),
            source: Arc::new(source),
        }
    }

    pub(crate) fn corrupt(
        segment: impl Into<PathBuf>,
        position: u64,
        reason: impl Into<String>,
    ) -> Self {
        StoreError::Corrupt {
            segment: segment.into(),
            position,
            reason: reason.into(),
        }
    }

    /// True when this is the sticky fail-stop error (the store will never accept writes).
    pub fn is_failed(&self) -> bool {
        matches!(self, StoreError::Failed(_))
    }
}

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        StoreError::Index(Arc::new(e))
    }
}

/// Why [`crate::Store::try_append`] did not take the record.
pub enum TryAppendError {
    /// The submission queue is at `queue_records_max` / `queue_bytes_max`. The record and
    /// its callback are handed back untouched so the caller can retry or push back.
    Full(Box<RecordIn>, Option<Callback>),
    /// The store refused the record (failed, closed, invalid, too large). The callback was
    /// dropped without being called.
    Store(StoreError),
}

impl std::fmt::Debug for TryAppendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TryAppendError::Full(rec, _) => f
                .debug_struct("Full")
                .field("topic", &rec.topic)
                .finish_non_exhaustive(),
            TryAppendError::Store(e) => f.debug_tuple("Store").field(e).finish(),
        }
    }
}

impl std::fmt::Display for TryAppendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TryAppendError::Full(..) => f.write_str("store submission queue is full"),
            TryAppendError::Store(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for TryAppendError {}
