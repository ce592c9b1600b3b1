//! What the admin API needs from the broker ([`AdminBackend`]) and the data it exchanges
//! with it: clients and subscriptions, lanes and lane metrics, broker metrics, publishing,
//! retained messages, stream pages.
//!
//! Low level: imports nothing of the crate, so every handler module and the router can
//! import it (the broker implements the trait in `crates/broker/src/admin.rs`).
//! Invariant: the methods are synchronous and may block; the router calls them on the
//! blocking pool.

use lanemq_lite::{LaneInfo, LiteError, ParentDef, ParentInfo};
use lanemq_streams::subscribe::StartFrom;
use lanemq_streams::{GlobalSettings, StreamDef, StreamError, StreamInfo};
use serde::Serialize;
use serde_json::Value;

/// What the admin API needs from the broker. The methods are synchronous; the router calls
/// them in [`tokio::task::spawn_blocking`].
pub trait AdminBackend: Send + Sync + 'static {
    /// Up to `limit` streams sorted by name, all strictly after `after` (when given), and
    /// whether more follow.
    fn list_streams(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<StreamInfo>, bool), StreamError>;
    fn get_stream(&self, name: &str) -> Result<StreamInfo, StreamError>;
    fn create_stream(&self, def: StreamDef) -> Result<StreamInfo, StreamError>;
    /// Replaces the whole definition (the name, `topic_filter` and `is_lastvalue` are fixed:
    /// [`StreamError::Immutable`]).
    fn update_stream(&self, name: &str, def: StreamDef) -> Result<StreamInfo, StreamError>;
    fn delete_stream(&self, name: &str) -> Result<(), StreamError>;
    fn get_settings(&self) -> GlobalSettings;
    /// Replaces the global settings; returns them as now in force.
    fn put_settings(&self, s: GlobalSettings) -> Result<GlobalSettings, StreamError>;
    /// Re-reads the authorization rules. `Ok`: a summary; `Err`: what is wrong, with
    /// `file:line:col`.
    fn reload_authorization(&self) -> Result<String, String>;
    /// Broker statistics, returned as is by `GET /stats`.
    fn stats(&self) -> Value;

    // --- lite parents and lanes (`/api/v5/lite/...`, docs/admin-api.md#lanes) ---

    /// Every lite parent, in creation order.
    fn list_parents(&self) -> Vec<ParentInfo>;
    fn get_parent(&self, name: &str) -> Result<ParentInfo, LiteError>;
    fn create_parent(&self, def: ParentDef) -> Result<ParentInfo, LiteError>;
    /// Replaces the whole definition (an empty `name` means the path name).
    fn update_parent(&self, name: &str, def: ParentDef) -> Result<ParentInfo, LiteError>;
    /// Deletes the parent with its lanes, their index and the group offsets.
    fn delete_parent(&self, name: &str) -> Result<(), LiteError>;
    /// Up to `limit` lanes of `parent` sorted by key, all strictly after `after` (when
    /// given), and whether more follow.
    fn list_lanes(
        &self,
        parent: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<LaneInfo>, bool), LiteError>;
    /// One lane with the figures of every group of its parent (`None`: no such lane).
    fn get_lane(&self, parent: &str, lane: &str) -> Result<Option<LaneDetail>, LiteError>;
    /// The consumer groups of `parent` (JSON objects, one per group, sorted by name).
    fn lite_groups(&self, parent: &str) -> Result<Vec<Value>, LiteError>;
    /// The figures of `group` on up to `limit` lanes of `parent` sorted by key, strictly
    /// after `after`, and whether more follow (`None`: no such group).
    fn group_lag(
        &self,
        parent: &str,
        group: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Option<(Vec<Value>, bool)>, LiteError>;
    /// The lite layer's gauges and counters (`GET /lite/metrics`).
    fn lite_metrics(&self) -> LiteMetrics;

    // --- clients and subscriptions (`/api/v5/clients`, `/api/v5/subscriptions`) ---

    /// Every session, connected or not (filtered and paged by the router).
    fn clients(&self) -> Vec<ClientInfo>;
    fn client(&self, clientid: &str) -> Option<ClientInfo>;
    /// Disconnect the client with 0x98 Administrative action (its session stays if it has an
    /// expiry), or discard the stored session of a client that is not connected.
    fn kick(&self, clientid: &str) -> Kicked;
    /// The subscriptions of one session (`None`: no such session).
    fn client_subscriptions(&self, clientid: &str) -> Option<Vec<SubscriptionInfo>>;
    /// Every subscription of every session.
    fn subscriptions(&self) -> Vec<SubscriptionInfo>;
    /// Serving (false once a shutdown began): `GET /status`.
    fn running(&self) -> bool;
    /// Why the broker cannot store messages (its log failed and refuses writes), if it
    /// cannot: `GET /status` answers 503 with it.
    fn storage_failure(&self) -> Option<String> {
        None
    }
    /// Publish as the `api` identity (`POST /publish`): the ACL applies; for QoS 1/2 the
    /// answer comes once the message is durable.
    fn publish(&self, msg: ApiPublish) -> Result<Published, PublishError>;
    /// Retained messages whose topic matches `filter` (every one without it); `Err`: the
    /// filter is not a valid MQTT filter.
    fn retained(&self, filter: Option<&str>) -> Result<Vec<RetainedInfo>, String>;
    /// One retained message with its payload.
    fn retained_message(&self, topic: &str) -> Option<(RetainedInfo, Vec<u8>)>;
    /// Remove a retained message (nothing is published); false if there was none.
    fn delete_retained(&self, topic: &str) -> bool;
    /// The figures of the whole broker for `GET /metrics`.
    fn metrics(&self) -> BrokerMetrics;
    /// Up to `limit` messages of stream `name` from `start` (`GET /stream/{name}/messages`).
    fn read_stream(
        &self,
        name: &str,
        start: StartFrom,
        limit: usize,
    ) -> Result<StreamPage, StreamError>;
}

/// One session, connected or not (`GET /clients`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClientInfo {
    pub clientid: String,
    /// The username the client presented (or authenticated as).
    pub username: Option<String>,
    /// Address of the current or last connection (none for a session restored from disk
    /// whose client has not come back).
    pub ip_address: Option<String>,
    pub connected: bool,
    /// When the current or last connection was accepted, milliseconds since the epoch.
    pub connected_at: Option<u64>,
    /// 3 (MQTT 3.1), 4 (3.1.1) or 5.
    pub proto_ver: u8,
    pub proto_name: &'static str,
    /// Session Expiry Interval in seconds (0: the session ends with the connection).
    pub expiry_interval: u32,
    pub subscriptions_cnt: usize,
    /// Messages queued for the client (in memory and as log positions).
    pub mqueue_len: usize,
    /// QoS 1/2 deliveries sent and not yet acknowledged.
    pub inflight_cnt: usize,
    /// Messages dropped for this session (QoS 0 while away, byte budgets, queue overflow).
    pub mqueue_dropped: u64,
}

/// What `DELETE /clients/{clientid}` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kicked {
    /// The connection got DISCONNECT 0x98 (MQTT 5) or was closed (3.1.1).
    Disconnected,
    /// No connection: the stored session was discarded.
    Discarded,
    NotFound,
}

/// One subscription (`GET /subscriptions`, `GET /clients/{clientid}/subscriptions`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SubscriptionInfo {
    pub clientid: String,
    /// The filter as subscribed (with `$share/<group>/` or `$stream/` when it has one).
    pub topic: String,
    pub qos: u8,
    /// No Local.
    pub nl: u8,
    /// Retain As Published.
    pub rap: u8,
    /// Retain Handling.
    pub rh: u8,
}

/// One lane with the figures of every group of its parent (`GET .../lanes/{lane}`).
#[derive(Debug, Clone, Serialize)]
pub struct LaneDetail {
    #[serde(flatten)]
    pub lane: LaneInfo,
    /// One object per group: `group` and the group's figures on this lane.
    pub groups: Vec<Value>,
}

/// The gauges and counters of the lite layer (`GET /lite/metrics`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LiteMetrics {
    /// Lanes in the lane table (every parent).
    pub lanes: u64,
    /// Lite parents in force.
    pub parents: u64,
    pub lanes_created: u64,
    pub lanes_expired: u64,
    pub suspended: u64,
    pub retried: u64,
    pub redelivered: u64,
    pub ack_timeouts: u64,
    pub dead_lettered: u64,
    pub committed: u64,
    pub publish_refused: u64,
    pub indexed: u64,
    /// Lanes per parent: `(parent name, lanes)`.
    pub parent_lanes: Vec<(String, u64)>,
}

/// A histogram as read: `(upper bound, observations in that bucket)` pairs (not cumulative:
/// the exposition adds them up), the sum and the count (observations above the last bound
/// count only here, in `+Inf`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistogramFigures {
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
    pub count: u64,
}

/// Messages and payload bytes of one QoS level.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QosFigures {
    pub messages: u64,
    pub payload_bytes: u64,
}

/// The shared log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogFigures {
    pub appended_records: u64,
    pub appended_bytes: u64,
    /// Write batches (group commits).
    pub batches: u64,
    pub fsyncs: u64,
    /// Appends that waited for a full submission queue.
    pub append_waits: u64,
    pub segments: u64,
    pub segment_bytes: u64,
    pub first_offset: u64,
    pub next_offset: u64,
    /// Exclusive end of the durable (readable) records.
    pub committed_offset: u64,
    /// Records waiting for the storage thread.
    pub queued_records: u64,
    /// The log stopped taking writes after a storage error (fail-stop).
    pub failed: bool,
    pub fsync_seconds: HistogramFigures,
    pub batch_records: HistogramFigures,
}

/// One named stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamFigures {
    pub name: String,
    pub records: u64,
    pub bytes: u64,
    pub readers: u64,
    /// Age of the oldest message held; `None` when the stream is empty.
    pub oldest_age_seconds: Option<f64>,
}

/// One lite parent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParentFigures {
    pub name: String,
    pub lanes: u64,
    /// Lanes some connected group can take now.
    pub ready_lanes: u64,
}

/// One consumer group of a lite parent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupFigures {
    pub parent: String,
    pub group: String,
    pub members_online: u64,
    pub inflight: u64,
    pub lanes_behind: u64,
    pub lag_messages: u64,
    pub dead_letters: u64,
}

/// Everything `GET /metrics` shows of the broker, read once per scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BrokerMetrics {
    pub uptime_seconds: u64,
    pub connections: u64,
    /// Connections hibernating (idle, waiting in the parking lot without a task).
    pub connections_hibernating: u64,
    pub connections_accepted: u64,
    /// CONNECTs refused, by CONNACK reason name (`bad_user_name_or_password`, ...).
    pub connects_refused: Vec<(String, u64)>,
    pub auth_failures: u64,
    pub sessions_online: u64,
    pub sessions_offline: u64,
    pub subscriptions: u64,
    pub received: [QosFigures; 3],
    pub sent: [QosFigures; 3],
    /// Bytes read from and written to client connections (every packet).
    pub network_received_bytes: u64,
    pub network_sent_bytes: u64,
    /// Messages discarded, by reason (`queue_full`, `expired`, ...).
    pub dropped: Vec<(String, u64)>,
    /// Accepted PUBLISHes that matched no subscription.
    pub no_subscribers: u64,
    pub retained: u64,
    pub inflight: u64,
    pub queued_messages: u64,
    pub queued_bytes: u64,
    pub queued_bytes_limit: u64,
    pub spilled: u64,
    pub slow_consumers_disconnected: u64,
    pub log: LogFigures,
    /// Next log offset each index has not indexed yet: `(index, offset)`.
    pub indexed_offsets: Vec<(String, u64)>,
    pub streams: Vec<StreamFigures>,
    pub lite: LiteMetrics,
    pub parents: Vec<ParentFigures>,
    pub groups: Vec<GroupFigures>,
    /// Cluster mode's figures (`None` on a single node).
    pub cluster: Option<ClusterFigures>,
}

/// Cluster mode: the node's traffic with the cluster's log (docs/cluster.md).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterFigures {
    /// Records this node handed to the cluster's log.
    pub published: u64,
    /// Records JetStream did not store (their publishers' connections were closed).
    pub publish_failures: u64,
    /// Records the replicator appended to the local log.
    pub replicated: u64,
    /// Every record below this log offset has been routed to this node's sessions.
    pub routed_offset: u64,
    /// 1 when the replicator stopped (fail-stop on a misaligned offset).
    pub replicator_failed: u64,
    /// 1 when the replicator stopped because the log it read diverged from what JetStream
    /// acknowledged to this node.
    pub diverged: u64,
    /// QoS 0 records dropped because the cluster's log was behind (pacing).
    pub qos0_dropped: u64,
}

/// A message to publish, checked for shape (the broker checks the topic, QoS and ACL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiPublish {
    pub topic: String,
    pub payload: Vec<u8>,
    pub qos: u8,
    pub retain: bool,
    pub payload_format_indicator: Option<u8>,
    pub message_expiry_interval: Option<u32>,
    pub content_type: Option<String>,
    pub response_topic: Option<String>,
    pub correlation_data: Option<Vec<u8>>,
    pub user_properties: Vec<(String, String)>,
}

/// Why a message was not published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishError {
    /// The topic, QoS, retain flag or payload is not acceptable (400).
    Invalid(String),
    /// The ACL denies the `api` identity this topic (403).
    NotAuthorized(String),
    /// The store refused or did not answer in time (503).
    Unavailable(String),
}

/// What happened to a published message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// Stored at this log offset and delivered to at least one subscription (or a lane).
    Delivered(u64),
    /// Stored at this log offset; no subscription matched (MQTT reason 0x10).
    NoSubscribers(u64),
}

/// One retained message, without its payload (`GET .../messages`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RetainedInfo {
    pub topic: String,
    /// The message's log offset.
    pub msgid: String,
    pub qos: u8,
    pub from_clientid: String,
    pub from_username: Option<String>,
    /// Arrival time, milliseconds since the epoch.
    pub publish_at: u64,
    pub payload_bytes: usize,
}

/// One message of a stream as the API returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamMessageView {
    /// The stream position (the log offset).
    pub offset: u64,
    pub topic: String,
    pub qos: u8,
    pub retain: bool,
    /// Arrival time, microseconds since the epoch.
    pub ts_us: u64,
    /// The last-value key (last-value streams only).
    pub key: Option<String>,
    pub from_clientid: String,
    pub payload: Vec<u8>,
    pub payload_format_indicator: Option<u8>,
    pub message_expiry_interval: Option<u32>,
    pub content_type: Option<String>,
    pub response_topic: Option<String>,
    pub correlation_data: Option<Vec<u8>>,
    pub user_properties: Vec<(String, String)>,
}

/// A page read from a stream: the messages, and the next position to read.
#[derive(Debug, Clone, Default)]
pub struct StreamPage {
    pub messages: Vec<StreamMessageView>,
    /// The first position the next read would look at.
    pub next: u64,
}
