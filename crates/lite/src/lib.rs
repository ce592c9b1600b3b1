//! The lite-topic layer ("lanes", the RocketMQ 5.5 LiteTopic model, `docs/lanes.md`).
//!
//! A *lite parent* is a configured topic pattern with one lane placeholder
//! (`agents/{lane}/#`). Every publish whose topic matches it goes into the *lane* of its key:
//! created by its first message, given a dense per-lane offset under the log's append lock
//! (stored in the record as an index hint, so the index can be rebuilt from the log), indexed
//! as one 40-byte entry in files shared by all lanes, and expired after the parent's TTL
//! without publishes.
//!
//! - [`model`]: the parent resource (serde, validation) and its pattern;
//! - [`entries`]: the lane entry files (the index);
//! - [`journal`]: the lane table as of the last checkpoint;
//! - [`table`]: the lane table in memory (lanes by id, the key index);
//! - [`verify`]: the offline check of the lane index against the log;
//! - [`engine`]: the parent registry, the lane table, the index and the group offsets in sled.
//!
//! Consumer groups (dispatch, acks, suspend, dead letters) live in the broker
//! (`crates/broker/src/lite.rs`): they deliver to sessions.

pub mod engine;
pub mod entries;
pub mod journal;
pub mod model;
pub mod table;
pub mod verify;

pub use engine::{Engine, LaneInfo, LiteError, ParentInfo};
pub use model::{LaneSel, Mode, ParentDef, Pattern};
