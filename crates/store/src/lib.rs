//! lanemq's storage: the durable shared log and the sled index.
//!
//! Every PUBLISH the broker accepts is appended once to the **log** ([`Store`]): segmented
//! append-only files `<data_dir>/log/<first_offset:020>.seg` of self-validating records
//! (magic/version, length, CRC32C, dense global offset; byte tables in
//! `docs/storage-format.md`). Writes run on one dedicated storage thread with group commit;
//! callers get the offset at once and a callback once the record meets the
//! [`FsyncPolicy`] (`docs/durability.md`). The first write or fsync error is sticky
//! (fail-stop). Recovery cuts a torn tail and reports it; corruption before the tail is an
//! error naming the segment and byte offset. Sealed segments carry a sparse `.idx` so open
//! scans only the last segment. Only the active segment and the one sealed last keep their
//! files open; older segments are opened on demand and kept in a bounded LRU of handles
//! (`StoreOptions::open_segments_max`, module `files`).
//!
//! The **index** ([`Index`], sled 0.34) is one sled database whose named trees belong to the
//! layers above (the broker's session trees, the stream and lite registries); each owner
//! documents its own schema.
//!
//! The crate is synchronous and has no async runtime dependency: the broker calls
//! `append`/`try_append` from any thread (they only block when the submission queue is
//! full; `try_append` never), wraps the callback in a oneshot, and runs reads, retention,
//! `sync`, `close` and sled calls on blocking threads.
//!
//! All file I/O goes through [`Fs`]/[`LogFile`]; [`MemFs`] injects faults and crashes.

mod error;
mod files;
pub mod fs;
mod index;
mod log;
pub mod record;
mod segment;
pub mod stats;
mod verify;

pub use error::{StoreError, TryAppendError};
pub use files::OPEN_SEGMENTS_MAX_DEFAULT;
pub use fs::{Faults, Fs, LogFile, MemFs, StdFs};
pub use index::Index;
pub use log::{
    now_us, Callback, Cut, FsyncPolicy, LogReader, RecoveryReport, RetentionReport, Store,
    StoreOptions, QUIET_SYNC_MAX,
};
pub use record::{IndexHint, Properties, Record, RecordIn};
pub use segment::{idx_file_name, segment_file_name, SEGMENT_HEADER_LEN};
pub use stats::{HistogramSnapshot, LogStats};
pub use verify::{
    dump, dump_with, format_timestamp_us, verify, verify_with, walk_records, Problem,
    SegmentSummary, VerifyReport, Walked,
};
