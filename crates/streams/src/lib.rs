//! Named streams (the EMQX 6.1 "MQTT Streams" model, `docs/streams.md`).
//!
//! A stream is an index over the shared log: a name, a topic filter, retention limits and
//! optional last-value semantics. A message that matches three streams is stored once in the
//! log; each stream indexes its position.
//!
//! - [`model`]: the stream resource and the global settings (serde, validation);
//! - [`keyexpr`]: key expressions (`message.from`, topic levels, JSON paths);
//! - [`filter_index`]: which streams match a topic, without scanning every stream;
//! - [`subscribe`]: parsing `$stream/...` / `$s/...` subscriptions and `stream-offset`;
//! - [`entries`]: a regular stream's index, a dense run of 24-byte entries in files of its own;
//! - [`engine`]: the registry in sled, the indexer that follows the log, retention, readers;
//! - [`verify`]: the offline check of the regular streams' entry files against the log.

pub mod engine;
pub mod entries;
pub mod filter_index;
pub mod keyexpr;
pub mod model;
pub mod subscribe;
pub mod verify;

pub use model::{
    GlobalSettings, Limit, Limits, SpecDuration, StreamDef, StreamError, StreamInfo, StreamStats,
    ValidationError,
};
