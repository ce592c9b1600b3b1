//! Cluster mode's state held by the broker (`Broker::cluster`): the link to JetStream, the
//! sessions bucket, the node's counters, and the queues between the replicator and the
//! callers that wait on it (resumed sessions to install, REST registry changes). The types
//! only: the behaviour is in `crate::cluster` and `crate::cluster_sessions`, above the broker.
//!
//! Invariant: this module imports nothing above the session layer, so `broker.rs` can hold a
//! `Cluster` without an import circle.

use crate::session::Session;
use lanemq_cluster::{ClusterError, Link, LinkOptions};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

/// Cluster mode's state in the broker.
#[derive(Debug)]
pub struct Cluster {
    /// The link to JetStream.
    pub link: Link,
    /// Records handed to the link.
    pub published: AtomicU64,
    /// Records the replicator appended to the local log.
    pub replicated: AtomicU64,
    /// Records JetStream did not store (their connections were closed unacknowledged).
    pub publish_failures: Arc<AtomicU64>,
    /// The replicator stopped on a misaligned offset (fail-stop).
    pub failed: AtomicBool,
    /// The replicator stopped because the log it read diverged from what JetStream
    /// acknowledged to this node.
    pub diverged: AtomicBool,
    /// The sessions bucket (`crate::cluster_sessions`).
    pub kv: lanemq_cluster::Kv,
    /// Resumed sessions for the replicator to install.
    pub installs: tokio::sync::mpsc::UnboundedSender<Install>,
    pub(crate) installs_rx: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<Install>>>,
    /// Every record below this offset has been routed to this node's sessions.
    pub routed: AtomicU64,
    /// REST calls waiting for their registry change (`Broker::create_stream` and the rest).
    pub registry: RegistryWaits,
    /// The last stream sequence the replicator applied.
    pub applied_seq: AtomicU64,
    /// `(stream sequence, offset of its first record)` of the last messages applied, oldest
    /// first (bounded): where a record JetStream acknowledged landed in the local log.
    pub applied: std::sync::Mutex<std::collections::VecDeque<(u64, u64)>>,
    /// QoS 0 records dropped because the cluster's log was behind (pacing).
    pub qos0_dropped: AtomicU64,
    /// While the log is congested: each QoS 0 publisher's window start and messages taken.
    pub quiet_budgets:
        std::sync::Mutex<std::collections::HashMap<Arc<str>, (std::time::Instant, usize)>>,
    /// The claim of each session this node owns ([`SessionRecord::claim`]).
    pub claims: std::sync::Mutex<std::collections::HashMap<Arc<str>, u64>>,
    /// The newest position of each session the log holds (`Positions` records of every
    /// node): client id to `(claim, position)`.
    pub positions: std::sync::Mutex<std::collections::HashMap<String, (u64, u64)>>,
}

impl Cluster {
    /// Connect to the cluster named in `cfg` (blocks up to its `connect_timeout_ms`).
    pub async fn connect(cfg: &crate::config::ClusterConfig) -> Result<Cluster, ClusterError> {
        let opts = LinkOptions {
            servers: cfg.servers.clone(),
            node_id: cfg.node_id.clone(),
            stream: cfg.stream.clone(),
            subject_prefix: cfg.subject_prefix.clone(),
            replicas: cfg.replicas,
            max_age: Duration::ZERO,
            max_bytes: 0,
            publish_timeout: Duration::from_millis(cfg.publish_timeout_ms),
            queue_records: cfg.queue_records,
            batch_records_max: cfg.batch_records_max,
            batch_bytes_max: cfg.batch_bytes_max,
            publish_window: cfg.publish_window,
            compress: cfg.compression == "zstd",
            auth: lanemq_cluster::LinkAuth {
                user: cfg.user.clone().zip(cfg.password.clone()),
                token: cfg.token.clone(),
                credentials_file: cfg.credentials_file.clone(),
                tls_ca_file: cfg.tls_ca_file.clone(),
                tls_client: cfg.tls_cert_file.clone().zip(cfg.tls_key_file.clone()),
                tls_required: cfg.tls_required,
            },
        };
        let link = Link::connect(opts, Duration::from_millis(cfg.connect_timeout_ms)).await?;
        // The bucket, once JetStream answers (a fresh cluster elects its leaders first).
        let deadline = tokio::time::Instant::now() + Duration::from_millis(cfg.connect_timeout_ms);
        let kv = loop {
            match link.sessions().await {
                Ok(kv) => break kv,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(error = %e, "cluster: sessions bucket not ready yet; retrying");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(e),
            }
        };
        let (installs, rx) = tokio::sync::mpsc::unbounded_channel();
        Ok(Cluster {
            link,
            published: AtomicU64::new(0),
            replicated: AtomicU64::new(0),
            publish_failures: Arc::new(AtomicU64::new(0)),
            failed: AtomicBool::new(false),
            diverged: AtomicBool::new(false),
            kv,
            installs,
            installs_rx: std::sync::Mutex::new(Some(rx)),
            routed: AtomicU64::new(0),
            registry: RegistryWaits::default(),
            applied_seq: AtomicU64::new(0),
            applied: Default::default(),
            qos0_dropped: AtomicU64::new(0),
            quiet_budgets: Default::default(),
            claims: Default::default(),
            positions: Default::default(),
        })
    }
}

/// The outcome of a registry change, for the REST call that asked for it.
#[derive(Debug)]
pub(crate) enum RegistryOutcome {
    Info(Result<lanemq_streams::StreamInfo, lanemq_streams::StreamError>),
    Done(Result<(), lanemq_streams::StreamError>),
    Parent(Result<lanemq_lite::ParentInfo, lanemq_lite::LiteError>),
    ParentDone(Result<(), lanemq_lite::LiteError>),
    /// A retained message deleted (this node had one).
    Removed(bool),
}

/// REST calls waiting for their registry change to come back through the log.
#[derive(Debug, Default)]
pub struct RegistryWaits {
    pub(crate) next: AtomicU64,
    pub(crate) waiting:
        std::sync::Mutex<std::collections::HashMap<u64, std::sync::mpsc::Sender<RegistryOutcome>>>,
}

/// A persistent session as the cluster's sessions bucket (and a takeover answer) holds it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SessionRecord {
    /// The node that owns the session.
    pub node: String,
    /// MQTT protocol level of its last connection.
    pub protocol: u8,
    /// Session Expiry Interval, seconds.
    pub expiry_s: u32,
    /// Subscriptions: the full filter and its stored options (`crate::sub_codec`, in hex).
    pub subs: Vec<(String, String)>,
    /// Records from this log offset on that match the subscriptions are the session's to
    /// receive (they were not routed to it by the owner, or not acknowledged).
    pub position: u64,
    /// A takeover's exact queue: `(offset, qos, retain)` of the deliveries the owner still had
    /// (in flight, queued, spilled), in order; empty in the bucket. Deliveries of stream
    /// subscriptions are not in it: those go on from their acknowledged position.
    pub queue: Vec<(u64, u8, bool)>,
    /// Stream subscriptions (`$stream/`, `$s/`): the filter and its stored form
    /// (`crate::stream_sub::StoredStreamSub`, in hex), with its acknowledged position.
    #[serde(default)]
    pub streams: Vec<(String, String)>,
    /// Which claim of the session this is: a node that takes a session writes a new one, and
    /// the positions it writes to the log carry it (0: none).
    #[serde(default)]
    pub claim: u64,
}

/// A request to the replicator: install a resumed session.
#[derive(Debug)]
pub struct Install {
    pub session: Arc<Session>,
    pub record: SessionRecord,
    pub done: tokio::sync::oneshot::Sender<()>,
}
