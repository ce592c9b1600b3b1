//! lanemq broker core: listeners, connections, sessions, router, retained messages, wills and
//! the QoS flows of MQTT 3.1.1 and 5.0.
//!
//! Start a server with [`Server::start`]; stop it with [`Server::shutdown`] (DISCONNECT 0x8B to
//! every MQTT 5 client, flush, bounded grace period).

pub mod admin;
pub mod anyhow_lite;
pub mod broker;
pub mod cluster;
pub mod cluster_sessions;
pub mod cluster_state;
pub mod config;
pub mod config_lines;
pub mod connection;
pub(crate) mod enhanced_auth;
pub mod ingest;
pub mod lazy;
pub mod listener;
pub mod lite;
pub mod message;
pub mod park;
pub mod persist;
pub mod queue_journal;
pub mod restore;
pub mod retention;
pub mod router;
pub mod session;
pub mod spill;
pub mod stream_sub;
pub mod streams;
pub mod sub_codec;
pub mod sys;
pub mod tls;
pub mod waker;
pub mod ws;

pub use broker::Broker;
pub use config::{Config, ConfigErrors, ListenerConfig, ListenerKind, DEFAULT_CONFIG_TOML};
pub use listener::Server;
