//! Broker configuration: the typed form of `etc/lanemq.toml`.
//!
//! Every key has a default, so an empty file is a valid configuration; unknown keys are
//! rejected (`deny_unknown_fields`). [`Config::from_toml`] reports every problem of a file at
//! once, before anything starts: unknown keys and values of the wrong type (each key found is
//! set aside and the file read again) and then every semantic error of [`Config::validate`],
//! each with its line and key path. Names carry their unit (`_ms`, `_s`, `_bytes`).

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;

/// The commented default configuration, embedded in the binary (`lanemq generate-config`).
pub const DEFAULT_CONFIG_TOML: &str = include_str!("../../../etc/lanemq.toml");

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub listeners: Vec<ListenerConfig>,
    pub mqtt: MqttConfig,
    pub storage: StorageConfig,
    /// Global settings of named streams (`GET/PUT /api/v5/streams/config` at run time).
    pub streams_config: lanemq_streams::GlobalSettings,
    /// Streams declared in the file (`[[streams]]`): created at start if missing, updated if
    /// their mutable fields differ. Streams created through the REST API live alongside.
    pub streams: Vec<lanemq_streams::StreamDef>,
    /// The REST admin API.
    pub admin: AdminConfig,
    /// The lite-topic layer (lanes): settings and the parents declared in the file.
    pub lite: LiteConfig,
    /// Cluster mode on NATS JetStream (`docs/cluster.md`); off while `servers` is empty.
    pub cluster: ClusterConfig,
}

/// `[cluster]`: cluster mode (`docs/cluster.md`). Off by default: the embedded store alone.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// NATS server URLs (`nats://host:port`); empty: cluster mode is off.
    pub servers: Vec<String>,
    /// This node's name, unique in the cluster (letters, digits, `-`, `_`).
    pub node_id: String,
    /// The JetStream stream that holds the shared log.
    pub stream: String,
    /// First token of the log's subjects (`<prefix>.<escaped topic>`).
    pub subject_prefix: String,
    /// Replicas of the log stream when this node creates it (1 to 5).
    pub replicas: usize,
    /// How long an accepted QoS 1/2 PUBLISH may wait for JetStream's ack (retries
    /// included) before its connection is closed unacknowledged.
    pub publish_timeout_ms: u64,
    /// How long the start waits for the NATS servers and the stream.
    pub connect_timeout_ms: u64,
    /// Records accepted by this node and not yet sent to JetStream, at most: beyond it a QoS
    /// 1/2 publisher waits, a QoS 0 message is dropped and counted.
    pub queue_records: usize,
    /// Records in one batch frame (one JetStream message), at most.
    pub batch_records_max: usize,
    /// Bytes of records in one batch frame, at most (keep it below the NATS servers'
    /// `max_payload`, 1 MiB by default).
    pub batch_bytes_max: usize,
    /// Batch frames sent to JetStream and not yet acknowledged, at most.
    pub publish_window: usize,
    /// Compression of batch frames: `zstd` or `none`.
    pub compression: String,
    /// NATS authentication: a user and password, a token, or a credentials file
    /// (`.creds`: JWT and NKey seed); at most one of the three.
    pub user: Option<String>,
    pub password: Option<String>,
    pub token: Option<String>,
    pub credentials_file: Option<String>,
    /// TLS to the NATS servers: root certificates (PEM) to trust, a client certificate and
    /// key (PEM, for servers that verify clients), and whether TLS is required even when a
    /// server does not ask for it.
    pub tls_ca_file: Option<String>,
    pub tls_cert_file: Option<String>,
    pub tls_key_file: Option<String>,
    pub tls_required: bool,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            servers: Vec::new(),
            node_id: String::new(),
            stream: "LANEMQ_LOG".into(),
            subject_prefix: "lanemq.log".into(),
            replicas: 3,
            publish_timeout_ms: 30_000,
            connect_timeout_ms: 30_000,
            queue_records: 16_384,
            batch_records_max: 1024,
            batch_bytes_max: 256 * 1024,
            publish_window: 2,
            compression: "zstd".into(),
            user: None,
            password: None,
            token: None,
            credentials_file: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_required: false,
        }
    }
}

impl ClusterConfig {
    /// Cluster mode is on.
    pub fn enabled(&self) -> bool {
        !self.servers.is_empty()
    }
}

/// `[lite]`: the lite-topic layer (`docs/lanes.md`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LiteConfig {
    /// How often lanes are checked for TTL expiry.
    pub sweep_interval_ms: u64,
    /// How often changed group offsets are made durable (a commit older than this survives
    /// a crash).
    pub flush_interval_ms: u64,
    /// Upper clamp of `lane-suspend-ms` / `lane-retry-ms` (the lower one is 50 ms).
    pub max_suspend_ms: u64,
    /// Lane messages of one group queued or in flight to one member at most.
    pub member_window: usize,
    /// Parents declared in the file (`[[lite.parents]]`): created at start if missing,
    /// updated if they differ. Parents created through the REST API live alongside.
    pub parents: Vec<lanemq_lite::ParentDef>,
}

impl Default for LiteConfig {
    fn default() -> Self {
        LiteConfig {
            sweep_interval_ms: 1000,
            flush_interval_ms: 100,
            max_suspend_ms: 3_600_000,
            member_window: 1024,
            parents: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Serve the REST admin API.
    pub enable: bool,
    /// Listen address (loopback by default: the API can create and delete streams).
    pub bind: SocketAddr,
    /// Bearer token. Unset: a random token is generated at first start and kept in
    /// `<data_dir>/admin.token` (mode 0600).
    pub token: Option<String>,
    /// Serve `GET /metrics` and `/api/v5/prometheus/stats` without the token (for a
    /// Prometheus that cannot send one; the figures name streams, parents and groups).
    pub metrics_public: bool,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            enable: true,
            bind: SocketAddr::from(([127, 0, 0, 1], 18083)),
            token: None,
            metrics_public: false,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            server: ServerConfig::default(),
            listeners: vec![ListenerConfig::default()],
            mqtt: MqttConfig::default(),
            storage: StorageConfig::default(),
            streams_config: lanemq_streams::GlobalSettings::default(),
            streams: Vec::new(),
            admin: AdminConfig::default(),
            lite: LiteConfig::default(),
            cluster: ClusterConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Where the durable log and index live.
    pub data_dir: PathBuf,
    /// Accept clients that present no username/password.
    pub allow_anonymous: bool,
    /// How long a graceful shutdown may take before connections are dropped.
    pub shutdown_grace_ms: u64,
    /// Interval of the `$SYS/broker/...` publications (0 disables them).
    pub sys_interval_s: u64,
    /// mosquitto_passwd-compatible password file; when set, every client must authenticate.
    pub password_file: Option<PathBuf>,
    /// ACL file (docs/security.md); unset = the embedded copy of `acl/default.acl`.
    pub acl_file: Option<PathBuf>,
    /// MQTT 5 enhanced authentication methods offered (`SCRAM-SHA-512`, `SCRAM-SHA-256`),
    /// checked against `password_file`. Empty: a CONNECT with an Authentication Method gets
    /// 0x8C Bad authentication method.
    pub auth_methods: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            data_dir: PathBuf::from("data"),
            allow_anonymous: true,
            shutdown_grace_ms: 5_000,
            sys_interval_s: 10,
            password_file: None,
            acl_file: None,
            auth_methods: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ListenerKind {
    /// MQTT over plain TCP.
    Tcp,
    /// MQTT over TLS (rustls).
    Tls,
    /// MQTT over WebSocket (path `/mqtt`, subprotocol `mqtt`).
    Ws,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    #[serde(default = "default_kind")]
    pub kind: ListenerKind,
    pub bind: SocketAddr,
    /// PEM certificate chain (TLS listeners).
    #[serde(default)]
    pub cert_path: Option<PathBuf>,
    /// PEM private key (TLS listeners).
    #[serde(default)]
    pub key_path: Option<PathBuf>,
    /// HTTP path of a WebSocket listener.
    #[serde(default = "default_ws_path")]
    pub path: String,
}

fn default_kind() -> ListenerKind {
    ListenerKind::Tcp
}
fn default_ws_path() -> String {
    "/mqtt".to_string()
}

impl Default for ListenerConfig {
    fn default() -> Self {
        ListenerConfig {
            kind: ListenerKind::Tcp,
            bind: SocketAddr::from(([127, 0, 0, 1], 1883)),
            cert_path: None,
            key_path: None,
            path: default_ws_path(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MqttConfig {
    /// Connections beyond this are refused (CONNACK 0x97 / 0x03).
    pub max_connections: usize,
    /// Largest packet accepted from a client, in bytes (announced as Maximum Packet Size).
    pub max_packet_size_bytes: u32,
    /// Receive Maximum announced to clients: unacknowledged inbound QoS 1/2 PUBLISH allowed.
    pub receive_maximum: u16,
    /// Cap on outbound unacknowledged QoS 1/2 PUBLISH per session (also bounded by the client's Receive Maximum).
    pub max_inflight_messages: u16,
    /// QoS 1/2 messages queued per session beyond the inflight window (online or offline).
    pub max_queued_messages: usize,
    /// What a full queue does: disconnect (0x97), drop_newest or drop_oldest.
    pub queue_overflow: QueueOverflow,
    /// Bytes of queued messages one session keeps in memory: beyond it QoS 0 is dropped for
    /// that session and QoS 1/2 is kept as log positions (read back when sent).
    pub outbound_buffer_bytes_max: usize,
    /// The same bound for all sessions together.
    pub queued_bytes_max_total: usize,
    /// PUBLISH packets one connection may send per second (0: no limit). Beyond it the
    /// broker stops reading that connection until its budget refills.
    pub max_publish_rate_per_s: u32,
    /// A client must send CONNECT within this time.
    pub connect_timeout_ms: u64,
    /// A plain-TCP connection with nothing to do for this long (no input, nothing to send,
    /// nothing waiting) hibernates: it leaves its task and waits in the broker's parking lot
    /// with its state in one box, and comes back on its next input, delivery or keep-alive
    /// deadline. 0: never.
    pub idle_hibernate_ms: u64,
    /// If set, overrides the client's keep alive (Server Keep Alive in CONNACK).
    pub server_keep_alive_s: Option<u16>,
    /// Largest keep alive accepted; larger requests are lowered through Server Keep Alive (MQTT 5).
    pub max_keep_alive_s: u16,
    /// Topic Alias Maximum announced to clients (client to server aliases); 0 disables.
    pub topic_alias_max: u16,
    /// Use topic aliases towards clients that allow them (server to client aliases).
    pub outbound_topic_aliases: bool,
    /// Largest Session Expiry Interval granted, in seconds (u32::MAX = never expire).
    pub max_session_expiry_s: u32,
    /// Highest QoS the broker accepts and grants (0..=2).
    pub maximum_qos: u8,
    pub retain_available: bool,
    /// Filters on which SUBSCRIBE is refused with 0x87 (a simple allow-list-free deny list, used
    /// for conformance testing; full ACL files come with the ACL engine).
    pub deny_subscribe: Vec<String>,
    /// SUBACK reason code for a filter refused by `deny_subscribe` (MQTT 5; 3.1.1 always gets
    /// 0x80). 0x87 "not authorized" by default; some test suites expect 0x80.
    pub deny_subscribe_reason_code: u8,
    /// Response Information returned when a client asks for it; `{client_id}` is substituted.
    pub response_information: Option<String>,
    /// Most levels a SUBSCRIBE topic filter may have (after `$share/<group>/`); a deeper one
    /// is refused with 0x8F (Topic Filter invalid; 3.1.1: 0x80). The subscription tree is
    /// walked level by level: this bounds its depth.
    pub max_topic_levels: u16,
}

impl Default for MqttConfig {
    fn default() -> Self {
        MqttConfig {
            max_connections: 100_000,
            max_packet_size_bytes: 1024 * 1024,
            receive_maximum: 1024,
            max_inflight_messages: 1024,
            max_queued_messages: 100_000,
            queue_overflow: QueueOverflow::Disconnect,
            outbound_buffer_bytes_max: 8 * 1024 * 1024,
            queued_bytes_max_total: 256 * 1024 * 1024,
            max_publish_rate_per_s: 0,
            connect_timeout_ms: 10_000,
            idle_hibernate_ms: 10_000,
            server_keep_alive_s: None,
            max_keep_alive_s: u16::MAX,
            topic_alias_max: 64,
            outbound_topic_aliases: true,
            max_session_expiry_s: u32::MAX,
            maximum_qos: 2,
            retain_available: true,
            deny_subscribe: Vec::new(),
            deny_subscribe_reason_code: 0x87,
            max_topic_levels: 256,
            response_information: None,
        }
    }
}

/// What happens when a session's queue holds `max_queued_messages` QoS 1/2 deliveries and
/// another one arrives (`mqtt.queue_overflow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum QueueOverflow {
    /// A connected client is disconnected with 0x97 (its session keeps the queue); the new
    /// message is dropped for it. An offline session drops the new message.
    #[default]
    Disconnect,
    /// The new message is dropped for this session.
    DropNewest,
    /// The oldest queued (not yet sent) message is dropped to make room.
    DropOldest,
}

/// When an accepted message counts as stored (see `docs/durability.md`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum FsyncMode {
    /// PUBACK/PUBREC after the record is fsynced (group commit).
    Always,
    /// PUBACK/PUBREC after the write; fsync every `fsync_interval_ms`.
    Interval,
    /// PUBACK/PUBREC after the write; the OS decides when data reaches the disk.
    Never,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// Durability policy of the shared log.
    pub fsync: FsyncMode,
    /// Period of the fsync under `fsync = "interval"`.
    pub fsync_interval_ms: u64,
    /// Log segments roll at this size.
    pub segment_bytes_max: u64,
    /// Delete log segments older than this (0: no age limit) once nothing references them.
    pub retention_max_age_s: u64,
    /// Keep the log under this size (0: no size limit), deleting unreferenced old segments.
    pub retention_max_bytes: u64,
    /// How often log retention runs.
    pub retention_interval_s: u64,
    /// Truncate the log at a corrupt record found before its tail instead of refusing to start
    /// (records after it are lost).
    pub truncate_corrupt: bool,
    /// Page cache of the index (sled), in bytes: bounds the memory a large stream replay or
    /// many sessions take.
    pub index_cache_bytes: u64,
    /// Sealed log segments whose files stay open for reads, at most (a least-recently-used
    /// cache of file handles; the active segment and the one sealed last are open on top).
    pub open_segments_max: usize,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            fsync: FsyncMode::Always,
            fsync_interval_ms: 10,
            segment_bytes_max: 64 * 1024 * 1024,
            retention_max_age_s: 7 * 24 * 3600,
            retention_max_bytes: 0,
            retention_interval_s: 60,
            truncate_corrupt: false,
            index_cache_bytes: 1024 * 1024,
            open_segments_max: lanemq_store::OPEN_SEGMENTS_MAX_DEFAULT,
        }
    }
}

/// Largest `storage.open_segments_max` accepted: each open segment is a file descriptor, and
/// more than this would compete with the connections for the open-files limit (a hard limit of
/// 20,000 is common) while no reader needs that many segments at once.
pub const OPEN_SEGMENTS_MAX_LIMIT: usize = 4096;

/// Every problem found in a configuration, reported together.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration:\n{}", .0.iter().map(|e| format!("  - {e}")).collect::<Vec<_>>().join("\n"))]
pub struct ConfigErrors(pub Vec<String>);

impl Config {
    /// Parse TOML and validate; every problem of the file at once, each with its line and
    /// key path ([`crate::config_lines`]).
    pub fn from_toml(text: &str) -> Result<Config, ConfigErrors> {
        Self::from_toml_with(text, |_| {})
    }

    /// [`Config::from_toml`] with `adjust` (the command line's overrides) applied to the file
    /// before it is validated: the configuration checked is the one the broker would run.
    pub fn from_toml_with(
        text: &str,
        adjust: impl Fn(&mut Config),
    ) -> Result<Config, ConfigErrors> {
        let mut config = crate::config_lines::load(text, |c: &Config| {
            let mut merged = c.clone();
            adjust(&mut merged);
            match merged.validate() {
                Ok(()) => Vec::new(),
                Err(ConfigErrors(v)) => v,
            }
        })
        .map_err(ConfigErrors)?;
        adjust(&mut config);
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigErrors> {
        let mut errors = Vec::new();
        let m = &self.mqtt;
        if self.listeners.is_empty() {
            errors.push("listeners: at least one listener is required".to_string());
        }
        for (i, l) in self.listeners.iter().enumerate() {
            if l.kind == ListenerKind::Tls && (l.cert_path.is_none() || l.key_path.is_none()) {
                errors.push(format!(
                    "listeners[{i}]: a tls listener needs cert_path and key_path"
                ));
            }
            for (name, p) in [("cert_path", &l.cert_path), ("key_path", &l.key_path)] {
                if let Some(p) = p {
                    if !p.exists() {
                        errors.push(format!(
                            "listeners[{i}].{name}: {} does not exist",
                            p.display()
                        ));
                    }
                }
            }
            if l.kind == ListenerKind::Ws && !l.path.starts_with('/') {
                errors.push(format!(
                    "listeners[{i}].path: must start with '/' (got {:?})",
                    l.path
                ));
            }
        }
        for (i, a) in self.listeners.iter().enumerate() {
            for b in &self.listeners[i + 1..] {
                if a.bind == b.bind && a.bind.port() != 0 {
                    errors.push(format!("listeners: {} is bound twice", a.bind));
                }
            }
        }
        if m.max_packet_size_bytes < 64 {
            errors.push(format!(
                "mqtt.max_packet_size_bytes: {} is below the minimum of 64",
                m.max_packet_size_bytes
            ));
        }
        if m.max_packet_size_bytes > 268_435_460 {
            errors
                .push("mqtt.max_packet_size_bytes: above the MQTT limit of 268435460".to_string());
        }
        if m.receive_maximum == 0 {
            errors.push("mqtt.receive_maximum: must be at least 1".to_string());
        }
        if m.max_inflight_messages == 0 {
            errors.push("mqtt.max_inflight_messages: must be at least 1".to_string());
        }
        if m.max_queued_messages == 0 {
            errors.push("mqtt.max_queued_messages: must be at least 1".to_string());
        }
        if m.outbound_buffer_bytes_max < 4096 {
            errors.push("mqtt.outbound_buffer_bytes_max: must be at least 4096".to_string());
        }
        if m.queued_bytes_max_total < m.outbound_buffer_bytes_max {
            errors.push(format!(
                "mqtt.queued_bytes_max_total: {} is below mqtt.outbound_buffer_bytes_max ({})",
                m.queued_bytes_max_total, m.outbound_buffer_bytes_max
            ));
        }
        if m.connect_timeout_ms == 0 {
            errors.push("mqtt.connect_timeout_ms: must be at least 1".to_string());
        }
        if m.maximum_qos > 2 {
            errors.push(format!(
                "mqtt.maximum_qos: {} is not a QoS (0, 1 or 2)",
                m.maximum_qos
            ));
        }
        if m.max_topic_levels == 0 {
            errors.push("mqtt.max_topic_levels: must be at least 1".to_string());
        }
        if m.deny_subscribe_reason_code < 0x80 {
            errors.push(format!(
                "mqtt.deny_subscribe_reason_code: {:#04x} is not a failure code (must be >= 0x80)",
                m.deny_subscribe_reason_code
            ));
        }
        for f in &m.deny_subscribe {
            if !lanemq_protocol::topic::valid_filter(f) {
                errors.push(format!(
                    "mqtt.deny_subscribe: {f:?} is not a valid topic filter"
                ));
            }
        }
        if let Some(p) = &self.server.password_file {
            if let Err(e) = lanemq_acl::PasswordFile::load(p) {
                errors.push(format!("server.password_file: {e}"));
            }
        }
        for m in &self.server.auth_methods {
            if lanemq_acl::scram::Mechanism::from_name(m).is_none() {
                errors.push(format!(
                    "server.auth_methods: unknown method {m:?} (known: SCRAM-SHA-512, SCRAM-SHA-256)"
                ));
            }
        }
        if !self.server.auth_methods.is_empty() && self.server.password_file.is_none() {
            errors.push(
                "server.auth_methods: SCRAM needs server.password_file (the users and their keys)"
                    .to_string(),
            );
        }
        if let Some(p) = &self.server.acl_file {
            if let Err(e) = lanemq_acl::Acl::load(p) {
                errors.push(format!("server.acl_file: {e}"));
            }
        }
        let st = &self.storage;
        if st.fsync == FsyncMode::Interval && st.fsync_interval_ms == 0 {
            errors.push(
                "storage.fsync_interval_ms: must be at least 1 with fsync = \"interval\""
                    .to_string(),
            );
        }
        if st.segment_bytes_max < 1024 * 1024 {
            errors.push("storage.segment_bytes_max: must be at least 1048576".to_string());
        }
        if st.index_cache_bytes < 1024 * 1024 {
            errors.push("storage.index_cache_bytes: must be at least 1048576".to_string());
        }
        if st.retention_interval_s == 0 {
            errors.push("storage.retention_interval_s: must be at least 1".to_string());
        }
        if !(1..=OPEN_SEGMENTS_MAX_LIMIT).contains(&st.open_segments_max) {
            errors.push(format!(
                "storage.open_segments_max: must be 1 to {OPEN_SEGMENTS_MAX_LIMIT} (sealed log segments kept open for reads; each is a file descriptor), not {}",
                st.open_segments_max
            ));
        }
        for (i, p) in self.lite.parents.iter().enumerate() {
            for e in p.validate() {
                errors.push(format!("lite.parents[{i}] ({:?}).{e}", p.name));
            }
            if self.lite.parents[..i].iter().any(|q| q.name == p.name) {
                errors.push(format!(
                    "lite.parents[{i}]: parent {:?} is declared twice",
                    p.name
                ));
            }
        }
        if self.lite.sweep_interval_ms == 0 {
            errors.push("lite.sweep_interval_ms must be at least 1".into());
        }
        if self.lite.max_suspend_ms < 50 {
            errors.push("lite.max_suspend_ms must be at least 50".into());
        }
        for e in self.streams_config.validate() {
            errors.push(format!("streams_config.{e}"));
        }
        let mut names = std::collections::HashSet::new();
        for (i, s) in self.streams.iter().enumerate() {
            for e in s.validate() {
                errors.push(format!("streams[{i}] ({:?}).{e}", s.name));
            }
            if !names.insert(s.name.as_str()) {
                errors.push(format!(
                    "streams[{i}]: stream {:?} is declared twice",
                    s.name
                ));
            }
        }
        if self.streams.len() > self.streams_config.max_stream_count as usize {
            errors.push(format!(
                "streams: {} streams declared, streams_config.max_stream_count is {}",
                self.streams.len(),
                self.streams_config.max_stream_count
            ));
        }
        if self.admin.enable
            && self.admin.bind.port() != 0
            && self.listeners.iter().any(|l| l.bind == self.admin.bind)
        {
            errors.push(format!(
                "admin.bind: {} is also an MQTT listener",
                self.admin.bind
            ));
        }
        if self
            .admin
            .token
            .as_deref()
            .is_some_and(|t| t.trim().is_empty())
        {
            errors.push("admin.token: must not be empty (remove it to generate one)".to_string());
        }
        let c = &self.cluster;
        if c.enabled() {
            for s in &c.servers {
                if !(s.starts_with("nats://") || s.starts_with("tls://")) || s.len() < 8 {
                    errors.push(format!(
                        "cluster.servers: {s:?} is not a NATS URL (nats://host:port)"
                    ));
                }
            }
            let name_ok = |n: &str| {
                !n.is_empty()
                    && n.len() <= 64
                    && n.chars()
                        .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_')
            };
            if !name_ok(&c.node_id) {
                errors.push(format!(
                    "cluster.node_id: {:?} must be 1 to 64 letters, digits, '-' or '_' (required in cluster mode)",
                    c.node_id
                ));
            }
            if !name_ok(&c.stream) {
                errors.push(format!(
                    "cluster.stream: {:?} must be 1 to 64 letters, digits, '-' or '_'",
                    c.stream
                ));
            }
            if c.subject_prefix.is_empty()
                || c.subject_prefix.split('.').any(|t| {
                    t.is_empty() || t.chars().any(|ch| matches!(ch, '*' | '>') || ch <= ' ')
                })
            {
                errors.push(format!(
                    "cluster.subject_prefix: {:?} is not a NATS subject without wildcards",
                    c.subject_prefix
                ));
            }
            if !(1..=5).contains(&c.replicas) {
                errors.push(format!("cluster.replicas: {} is not 1 to 5", c.replicas));
            }
            if !(1..=1_048_576).contains(&c.queue_records) {
                errors.push(format!(
                    "cluster.queue_records: {} is not 1 to 1048576",
                    c.queue_records
                ));
            }
            if !(1..=lanemq_cluster::BATCH_RECORDS_MAX).contains(&c.batch_records_max) {
                errors.push(format!(
                    "cluster.batch_records_max: {} is not 1 to {}",
                    c.batch_records_max,
                    lanemq_cluster::BATCH_RECORDS_MAX
                ));
            }
            if !(1024..=64 * 1024 * 1024).contains(&c.batch_bytes_max) {
                errors.push(format!(
                    "cluster.batch_bytes_max: {} is not 1024 to 67108864",
                    c.batch_bytes_max
                ));
            }
            if !matches!(c.compression.as_str(), "zstd" | "none") {
                errors.push(format!(
                    "cluster.compression: {:?} is not \"zstd\" or \"none\"",
                    c.compression
                ));
            }
            if !(1..=1024).contains(&c.publish_window) {
                errors.push(format!(
                    "cluster.publish_window: {} is not 1 to 1024",
                    c.publish_window
                ));
            }
            if c.publish_timeout_ms == 0 {
                errors.push("cluster.publish_timeout_ms: must be above 0".to_string());
            }
            let ways = [
                c.user.is_some(),
                c.token.is_some(),
                c.credentials_file.is_some(),
            ];
            if ways.iter().filter(|w| **w).count() > 1 {
                errors.push(
                    "cluster: set one of user/password, token or credentials_file, not several"
                        .to_string(),
                );
            }
            if c.user.is_some() != c.password.is_some() {
                errors.push("cluster.user and cluster.password go together".to_string());
            }
            if c.tls_cert_file.is_some() != c.tls_key_file.is_some() {
                errors
                    .push("cluster.tls_cert_file and cluster.tls_key_file go together".to_string());
            }
            for (key, path) in [
                ("credentials_file", &c.credentials_file),
                ("tls_ca_file", &c.tls_ca_file),
                ("tls_cert_file", &c.tls_cert_file),
                ("tls_key_file", &c.tls_key_file),
            ] {
                if let Some(p) = path {
                    if let Err(e) = std::fs::metadata(p) {
                        errors.push(format!("cluster.{key}: {p:?}: {e}"));
                    }
                }
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors(errors))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_problem_of_a_file_is_reported_with_its_line_and_key() {
        let text = r#"
[server]
sys_interval_s = 0
colour = "blue"

[mqtt]
max_connections = -5

[storage]
fsync = "sometimes"

[[lite.parents]]
name = "agents"
pattern = "agents/{lane}/#"

[[lite.parents]]
name = "bots"
pattern = "bots/#"
ttl_s = 0
"#;
        let errs = Config::from_toml(text).unwrap_err().0;
        let joined = errs.join("\n");
        assert_eq!(errs.len(), 5, "{joined}");
        assert!(
            errs[0].starts_with("line 4: server.colour: unknown field"),
            "{joined}"
        );
        assert!(
            errs[1].starts_with("line 7: mqtt.max_connections: "),
            "{joined}"
        );
        assert!(errs[2].starts_with("line 10: storage.fsync: "), "{joined}");
        let parent: Vec<&String> = errs[3..].iter().collect();
        assert!(
            parent
                .iter()
                .any(|e| e.starts_with("line 18: lite.parents[1]") && e.contains("pattern")),
            "{joined}"
        );
        assert!(
            parent
                .iter()
                .any(|e| e.starts_with("line 19: lite.parents[1]") && e.contains("ttl_s")),
            "{joined}"
        );
    }

    #[test]
    fn a_syntax_error_is_reported_alone_and_a_good_file_loads() {
        let errs = Config::from_toml("[mqtt\nmax_connections = 1\n")
            .unwrap_err()
            .0;
        assert_eq!(errs.len(), 1);
        assert!(errs[0].starts_with("line 1: TOML syntax"), "{errs:?}");
        let c = Config::from_toml("[mqtt]\nmax_connections = 7\n").unwrap();
        assert_eq!(c.mqtt.max_connections, 7);
        assert!(Config::from_toml("").is_ok());
        assert!(Config::from_toml(DEFAULT_CONFIG_TOML).is_ok());
    }

    #[test]
    fn open_segments_max_is_bounded_before_start() {
        assert_eq!(
            Config::from_toml("").unwrap().storage.open_segments_max,
            lanemq_store::OPEN_SEGMENTS_MAX_DEFAULT
        );
        assert_eq!(
            Config::from_toml("[storage]\nopen_segments_max = 2\n")
                .unwrap()
                .storage
                .open_segments_max,
            2
        );
        for bad in ["0", "4097", "100000"] {
            let errs = Config::from_toml(&format!("[storage]\nopen_segments_max = {bad}\n"))
                .unwrap_err()
                .0;
            assert_eq!(errs.len(), 1, "{errs:?}");
            assert!(
                errs[0].starts_with("line 2: storage.open_segments_max: must be 1 to 4096")
                    && errs[0].ends_with(&format!("not {bad}")),
                "{errs:?}"
            );
        }
        let errs = Config::from_toml("[storage]\nopen_segments_max = -1\n")
            .unwrap_err()
            .0;
        assert!(
            errs[0].starts_with("line 2: storage.open_segments_max: invalid value"),
            "{errs:?}"
        );
    }

    #[test]
    fn cluster_section_is_checked_before_start() {
        let errs = Config::from_toml(
            "[cluster]\nservers = [\"127.0.0.1:4222\"]\nnode_id = \"a b\"\nreplicas = 7\nsubject_prefix = \"x.*\"\n",
        )
        .unwrap_err()
        .0;
        let all = errs.join("\n");
        for key in [
            "cluster.servers",
            "cluster.node_id",
            "cluster.replicas",
            "cluster.subject_prefix",
        ] {
            assert!(all.contains(key), "{key} not reported: {all}");
        }
        let c = Config::from_toml(
            "[cluster]\nservers = [\"nats://127.0.0.1:4222\"]\nnode_id = \"n1\"\n",
        )
        .unwrap();
        assert!(c.cluster.enabled());
        assert_eq!(c.cluster.replicas, 3);
        assert!(!Config::default().cluster.enabled());
        // Authentication and TLS: one way at a time, pairs complete, files present.
        let errs = Config::from_toml(
            "[cluster]\nservers = [\"nats://127.0.0.1:4222\"]\nnode_id = \"n1\"\nuser = \"u\"\ntoken = \"t\"\ntls_cert_file = \"/nonexistent/c.pem\"\ncredentials_file = \"/nonexistent/x.creds\"\n",
        )
        .unwrap_err()
        .0;
        let all = errs.join("\n");
        for what in [
            "not several",
            "cluster.user and cluster.password",
            "cluster.tls_cert_file and cluster.tls_key_file",
            "cluster.credentials_file: \"/nonexistent/x.creds\"",
        ] {
            assert!(all.contains(what), "{what} not reported: {all}");
        }
        let c = Config::from_toml(
            "[cluster]\nservers = [\"nats://127.0.0.1:4222\"]\nnode_id = \"n1\"\nuser = \"u\"\npassword = \"p\"\n",
        )
        .unwrap();
        assert_eq!(c.cluster.password.as_deref(), Some("p"));
    }
}
