//! Cluster mode's link to NATS JetStream: the shared log of every lanemq node of a cluster is
//! one replicated JetStream stream.
//!
//! What this crate owns:
//! - the connection to the NATS servers (reconnecting on its own, across the listed servers);
//! - the log stream (`cluster.stream`, default `LANEMQ_LOG`): created when missing with the
//!   configured replicas, file storage, limits retention; its subjects are
//!   `<subject_prefix>.<escaped topic>` ([`subject_for`]);
//! - publishing records in the order they are handed over ([`Link::publish`]): one sender
//!   task takes them from a bounded channel and packs them into **batch frames**
//!   ([`encode_batch`]: many records in one JetStream message, at most
//!   `batch_records_max` records and `batch_bytes_max` bytes), so the stream holds one node's
//!   records in the order that node accepted them. A batch closes when the channel holds
//!   nothing more (the records that arrive while earlier batches wait for their acks make the
//!   next one: the window is the group commit). Up to `publish_window` batches are
//!   published before their acks come back (pipelined); each carries a `Nats-Msg-Id`, and an
//!   ack that times out is retried with the same id (JetStream's duplicate window keeps one
//!   copy) until `publish_timeout`. The callbacks of the records fire **in the order the
//!   records were handed over**, with the batch's stream sequence and the record's index in
//!   it ([`Ack`]);
//! - records that must be their own message under their topic's subject
//!   ([`Link::publish_alone`]: records a node reads again by subject) and offset marks
//!   ([`Link::mark`]);
//! - reading the stream in order from a sequence ([`Link::feed`]), with an ordered consumer
//!   that the client recreates on a gap.
//!
//! The crate knows nothing of MQTT or of the record format: it carries opaque bytes. The
//! broker puts one encoded log record in each message (`crates/broker/src/cluster.rs`).
//!
//! Invariants: the stream's sequences are dense (nothing is deleted but from its head by its
//! limits), and every node reads the same messages in the same order, so a reader that
//! numbers the records of the messages one after the other gives every record the same
//! number (log offset) on every node. A batch frame is never split: it is stored, retried and
//! read as one message.

use async_nats::jetstream::{self, consumer, message::PublishMessage, stream};
use bytes::Bytes;
use futures_util::StreamExt;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// Errors of the cluster link.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClusterError {
    /// Connecting to the NATS servers failed.
    #[error("cannot connect to the NATS servers {servers}: {why}")]
    Connect {
        /// The servers tried.
        servers: String,
        /// What failed.
        why: String,
    },
    /// Creating or checking the log stream failed.
    #[error("JetStream stream {stream}: {why}")]
    Stream {
        /// Stream name.
        stream: String,
        /// What failed.
        why: String,
    },
    /// A record was not acknowledged by JetStream within `publish_timeout`.
    #[error("JetStream did not store the record: {0}")]
    Publish(String),
    /// Reading the stream failed.
    #[error("reading the JetStream stream: {0}")]
    Feed(String),
    /// A key-value operation on the sessions bucket failed.
    #[error("sessions bucket: {0}")]
    Kv(String),
    /// A request to another node failed (no answer, nobody serving it).
    #[error("request to another node: {0}")]
    Request(String),
    /// The link is closed (the broker is stopping).
    #[error("the cluster link is closed")]
    Closed,
}

/// Settings of the link (`[cluster]` in the broker's configuration).
#[derive(Debug, Clone)]
pub struct LinkOptions {
    /// NATS server URLs, e.g. `nats://127.0.0.1:4222`.
    pub servers: Vec<String>,
    /// This node's name: the NATS connection name and the prefix of its message ids.
    pub node_id: String,
    /// The JetStream stream that holds the log.
    pub stream: String,
    /// First token(s) of the log's subjects.
    pub subject_prefix: String,
    /// Replicas of the stream when this node creates it (1..=5).
    pub replicas: usize,
    /// The stream's `max_age` (zero: none).
    pub max_age: Duration,
    /// The stream's `max_bytes` (zero: none).
    pub max_bytes: u64,
    /// How long a record may wait for JetStream's ack, retries included.
    pub publish_timeout: Duration,
    /// Records handed over but not yet sent, at most (the publisher waits beyond).
    pub queue_records: usize,
    /// Records in one batch frame, at most.
    pub batch_records_max: usize,
    /// Bytes of records in one batch frame, at most (a record larger than this travels alone).
    pub batch_bytes_max: usize,
    /// Batches published and not yet acknowledged, at most.
    pub publish_window: usize,
    /// Compress batch frames with zstd.
    pub compress: bool,
    /// Authentication and TLS towards the NATS servers.
    pub auth: LinkAuth,
}

/// How the link authenticates to the NATS servers and secures the connection.
#[derive(Clone, Default)]
pub struct LinkAuth {
    /// User and password.
    pub user: Option<(String, String)>,
    /// A token.
    pub token: Option<String>,
    /// A credentials file (`.creds`: JWT and NKey seed).
    pub credentials_file: Option<String>,
    /// Root certificates (PEM) to trust.
    pub tls_ca_file: Option<String>,
    /// A client certificate and its key (PEM).
    pub tls_client: Option<(String, String)>,
    /// TLS even when the server does not ask for it.
    pub tls_required: bool,
}

impl std::fmt::Debug for LinkAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Secrets are never printed.
        f.debug_struct("LinkAuth")
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("credentials_file", &self.credentials_file)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_client", &self.tls_client.as_ref().map(|(c, _)| c))
            .field("tls_required", &self.tls_required)
            .finish()
    }
}

/// Where JetStream stored a record: the stream message (its sequence) and the record's place
/// in that message's batch (0 for a record published alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// Stream sequence of the message that holds the record.
    pub seq: u64,
    /// The record's index in the message's batch.
    pub index: u32,
}

/// What happens once JetStream has a record: where it is, or why it is not.
pub type Done = Box<dyn FnOnce(Result<Ack, ClusterError>) + Send>;

/// One record to publish.
struct Out {
    /// `Some`: published alone under this subject; `None`: in a batch frame.
    alone: Option<String>,
    payload: Bytes,
    /// `None`: nobody waits (the batch is acknowledged all the same: that paces the sender).
    done: Option<Done>,
}

/// Message ids kept for the reader's check, per side ([`Link::check_read`]).
const ACKED_IDS_KEPT: usize = 65_536;

/// How often the connection pings its NATS server (two unanswered pings: reconnect).
const PING_INTERVAL: Duration = Duration::from_secs(2);

/// Most records one batch frame may hold (`batch_records_max` is at most this).
pub const BATCH_RECORDS_MAX: usize = 4096;

/// First bytes of a batch frame: `\0LMQB` and the frame version (1). A lanemq log record
/// starts with its magic byte 0xA1 and a control record with `\0LANEMQ-CTL\0`, so a frame is
/// never taken for either.
pub const BATCH_MAGIC: &[u8] = b"\0LMQB\x01";
/// First bytes of an offset mark ([`Link::mark`]).
pub const MARK_MAGIC: &[u8] = b"\0LMQM\x01";

impl Out {
    /// A record for a batch frame.
    fn batched(payload: Bytes, done: Option<Done>) -> Out {
        Out {
            alone: None,
            payload,
            done,
        }
    }
}

/// First bytes of a batch frame whose body is compressed with zstd (frame version 2).
pub const BATCH_ZSTD_MAGIC: &[u8] = b"\0LMQB\x02";

/// A batch frame's body is compressed from this many bytes on (when compression is on).
const COMPRESS_FROM_BYTES: usize = 512;

/// zstd's level for batch frames: the fastest (the frames are small and alike; level 1
/// already takes most of what there is to take).
const ZSTD_LEVEL: i32 = 1;

/// Most bytes a compressed frame may expand to (a frame larger than this is refused).
const FRAME_BYTES_MAX: usize = 256 * 1024 * 1024;

/// Encode records as one batch frame:
///
/// ```text
/// version 1: magic "\0LMQB" 0x01 | body
/// version 2: magic "\0LMQB" 0x02 | body_len u32 BE | zstd(body)
/// body:      count u32 BE | count x (len u32 BE | record bytes)
/// ```
///
/// With `compress`, a body of [`COMPRESS_FROM_BYTES`] or more is compressed (version 2)
/// when that makes it smaller.
pub fn encode_frame<B: AsRef<[u8]>>(records: &[B], compress: bool) -> Bytes {
    let plain = encode_batch(records);
    let body = &plain[BATCH_MAGIC.len()..];
    if !compress || body.len() < COMPRESS_FROM_BYTES {
        return plain;
    }
    let z = COMPRESSOR.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_none() {
            *c = zstd::bulk::Compressor::new(ZSTD_LEVEL).ok();
        }
        c.as_mut().map(|c| c.compress(body))
    });
    match z.unwrap_or_else(|| zstd::bulk::compress(body, ZSTD_LEVEL)) {
        Ok(z) if z.len() + 4 < body.len() => {
            let mut b = Vec::with_capacity(BATCH_ZSTD_MAGIC.len() + 4 + z.len());
            b.extend_from_slice(BATCH_ZSTD_MAGIC);
            b.extend_from_slice(&(body.len() as u32).to_be_bytes());
            b.extend_from_slice(&z);
            Bytes::from(b)
        }
        _ => plain,
    }
}

/// Encode records as one uncompressed batch frame (version 1, [`encode_frame`]).
pub fn encode_batch<B: AsRef<[u8]>>(records: &[B]) -> Bytes {
    let total: usize = records.iter().map(|r| 4 + r.as_ref().len()).sum();
    let mut b = Vec::with_capacity(BATCH_MAGIC.len() + 4 + total);
    b.extend_from_slice(BATCH_MAGIC);
    b.extend_from_slice(&(records.len() as u32).to_be_bytes());
    for r in records {
        let r = r.as_ref();
        b.extend_from_slice(&(r.len() as u32).to_be_bytes());
        b.extend_from_slice(r);
    }
    Bytes::from(b)
}

/// What one message of the log stream holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Records, in order (one for a message published alone or by an older lanemq).
    Records(Vec<Bytes>),
    /// An offset mark: the message at stream sequence `seq` starts at log offset `offset`.
    Mark {
        /// Stream sequence.
        seq: u64,
        /// Log offset of that message's first record.
        offset: u64,
    },
}

/// Split a message of the log stream into its records (zero-copy slices of `payload`).
/// `Err` for a batch frame whose lengths do not add up.
pub fn frame_of(payload: Bytes) -> Result<Frame, String> {
    if let Some(rest) = payload.strip_prefix(MARK_MAGIC) {
        if rest.len() != 16 {
            return Err(format!("an offset mark of {} bytes", payload.len()));
        }
        let seq = u64::from_be_bytes(rest[..8].try_into().map_err(|_| "mark")?);
        let offset = u64::from_be_bytes(rest[8..].try_into().map_err(|_| "mark")?);
        return Ok(Frame::Mark { seq, offset });
    }
    if let Some(rest) = payload.strip_prefix(BATCH_ZSTD_MAGIC) {
        let len = rest
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(|b: [u8; 4]| u32::from_be_bytes(b) as usize)
            .ok_or("a compressed batch frame without its length")?;
        if len > FRAME_BYTES_MAX {
            return Err(format!("a compressed batch frame of {len} bytes"));
        }
        let body = DECOMPRESSOR.with(|d| {
            let mut d = d.borrow_mut();
            if d.is_none() {
                *d = Some(
                    zstd::bulk::Decompressor::new()
                        .map_err(|e| format!("cannot start zstd: {e}"))?,
                );
            }
            match d.as_mut() {
                Some(d) => d
                    .decompress(&rest[4..], len)
                    .map_err(|e| format!("a compressed batch frame does not decompress: {e}")),
                None => Err("cannot start zstd".to_string()),
            }
        })?;
        if body.len() != len {
            return Err(format!(
                "a compressed batch frame gave {} bytes, not {len}",
                body.len()
            ));
        }
        return records_of(Bytes::from(body), 0);
    }
    if !payload.starts_with(BATCH_MAGIC) {
        return Ok(Frame::Records(vec![payload]));
    }
    records_of(payload, BATCH_MAGIC.len())
}

thread_local! {
    /// One zstd compression context per thread.
    static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { std::cell::RefCell::new(None) };
    /// One zstd decompression context per thread (making one costs more than a frame).
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// The records of a frame body (`count | count x (len | bytes)`) that starts at `pos`.
fn records_of(payload: Bytes, mut pos: usize) -> Result<Frame, String> {
    let u32_at = |pos: usize| -> Result<usize, String> {
        payload
            .get(pos..pos + 4)
            .and_then(|b| b.try_into().ok())
            .map(|b: [u8; 4]| u32::from_be_bytes(b) as usize)
            .ok_or_else(|| format!("a batch frame cut at byte {pos} of {}", payload.len()))
    };
    let count = u32_at(pos)?;
    pos += 4;
    if count > payload.len() / 4 {
        return Err(format!(
            "a batch frame of {} bytes says {count} records",
            payload.len()
        ));
    }
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let len = u32_at(pos)?;
        pos += 4;
        if payload.len() - pos < len {
            return Err(format!(
                "a batch frame's record of {len} bytes runs past its end"
            ));
        }
        out.push(payload.slice(pos..pos + len));
        pos += len;
    }
    if pos != payload.len() {
        return Err(format!(
            "{} bytes after a batch frame's records",
            payload.len() - pos
        ));
    }
    Ok(Frame::Records(out))
}

/// A record of the stream, in order.
#[derive(Debug)]
pub struct Entry {
    /// Stream sequence.
    pub seq: u64,
    /// The message: a batch frame, a record published alone, or an offset mark
    /// ([`frame_of`]).
    pub payload: Bytes,
    /// A digest of the message's bytes ([`digest`]).
    pub digest: u64,
    /// The message's `Nats-Msg-Id` (every message a lanemq node publishes has one).
    pub id: Option<String>,
}

/// The `Nats-Msg-Id` header of a message read from the stream.
fn msg_id(m: &async_nats::Message) -> Option<String> {
    m.headers
        .as_ref()?
        .get(async_nats::header::NATS_MESSAGE_ID)
        .map(|v| v.as_str().to_string())
}

/// A digest of a stream message's bytes: its CRC32C and its length.
pub fn digest(payload: &[u8]) -> u64 {
    (u64::from(crc32c::crc32c(payload)) << 32) | (payload.len() as u64 & 0xffff_ffff)
}

/// State of the log stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamState {
    /// First sequence still in the stream (`last + 1` when empty).
    pub first_seq: u64,
    /// Last sequence appended (0 when nothing ever was).
    pub last_seq: u64,
    /// Messages in the stream.
    pub messages: u64,
}

/// The connection to the cluster's JetStream.
#[derive(Clone)]
pub struct Link {
    client: async_nats::Client,
    js: jetstream::Context,
    opts: LinkOptions,
    tx: mpsc::Sender<Out>,
    /// The highest stream sequence JetStream acknowledged to this node.
    acked: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Records the sender took from the channel whose message is not acknowledged yet.
    in_flight: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Message ids by stream sequence, bounded: those JetStream acknowledged to this node and
    /// those its reader read, to compare whichever comes second ([`Link::check_read`]).
    ids: std::sync::Arc<std::sync::Mutex<Ids>>,
}

/// Why [`Link::check_read`] refused a message the feed gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadCheck {
    /// Not applied: read it again (from a fresh feed) until it is the acknowledged one.
    Reread(String),
    /// A message already applied differs from what JetStream acknowledged there.
    Diverged(String),
}

/// What [`Link::check_read`] compares.
#[derive(Debug, Default)]
struct Ids {
    /// Stream sequence to (message id, digest of what was published).
    acked: std::collections::BTreeMap<u64, (String, u64)>,
    /// Stream sequence to the digest of what the reader read.
    read: std::collections::BTreeMap<u64, u64>,
    /// The message ids the reader accepted, with their sequence (the newest
    /// [`ACKED_IDS_KEPT`], oldest first in `seen_order`).
    seen: std::collections::HashMap<String, u64>,
    seen_order: std::collections::VecDeque<String>,
    /// This node's message ids JetStream acknowledged, with their sequence (the newest
    /// [`ACKED_IDS_KEPT`], oldest first in `acked_order`).
    acked_ids: std::collections::HashMap<String, u64>,
    acked_order: std::collections::VecDeque<String>,
    /// The first disagreement seen, for the reader to stop on.
    diverged: Option<String>,
}

impl Ids {
    fn keep<V>(m: &mut std::collections::BTreeMap<u64, V>) {
        while m.len() > ACKED_IDS_KEPT {
            m.pop_first();
        }
    }

    /// [`Link::check_read`].
    fn check_read(&mut self, seq: u64, digest: u64, id: Option<&str>) -> Result<(), ReadCheck> {
        if let Some(why) = &self.diverged {
            return Err(ReadCheck::Diverged(why.clone()));
        }
        if let Some(acked) = self.acked.get(&seq) {
            if acked.1 != digest {
                return Err(ReadCheck::Reread(mismatch(seq, acked, digest)));
            }
        }
        // JetStream stores one message per id (its duplicate window is longer than a
        // publish is retried): an id read a second time, at another sequence, comes from a
        // copy of the stream that holds a message the stream never committed there.
        if let Some(&at) = id.and_then(|id| self.acked_ids.get(id)) {
            if at != seq {
                return Err(ReadCheck::Reread(format!(
                    "at stream sequence {seq} the feed gave this node's message {}, which \
                     JetStream stored at sequence {at}",
                    id.unwrap_or_default()
                )));
            }
        }
        if let Some(id) = id {
            match self.seen.get(id) {
                Some(&first) if first != seq => {
                    return Err(ReadCheck::Reread(format!(
                        "at stream sequence {seq} the feed gave message {id} again, which it \
                         gave at sequence {first} (JetStream stores one message per id)"
                    )));
                }
                Some(_) => {}
                None => {
                    self.seen.insert(id.to_string(), seq);
                    self.seen_order.push_back(id.to_string());
                    while self.seen_order.len() > ACKED_IDS_KEPT {
                        if let Some(old) = self.seen_order.pop_front() {
                            self.seen.remove(&old);
                        }
                    }
                }
            }
        }
        if self.acked.remove(&seq).is_none() {
            self.read.insert(seq, digest);
            Ids::keep(&mut self.read);
        }
        Ok(())
    }

    /// JetStream acknowledged this node's message `id` (id, digest) at `seq`.
    fn acked(&mut self, seq: u64, id: (String, u64)) {
        // Read (and applied) already at another sequence: that copy was not the committed one.
        if let Some(&at) = self.seen.get(&id.0) {
            if at != seq && self.diverged.is_none() {
                self.diverged = Some(format!(
                    "this node applied its message {} at stream sequence {at}, read from a copy \
                     of the log, but JetStream stored it at sequence {seq}",
                    id.0
                ));
            }
        }
        self.acked_ids.insert(id.0.clone(), seq);
        self.acked_order.push_back(id.0.clone());
        while self.acked_order.len() > ACKED_IDS_KEPT {
            if let Some(old) = self.acked_order.pop_front() {
                self.acked_ids.remove(&old);
            }
        }
        match self.read.remove(&seq) {
            Some(read) => self.compare(seq, &id, read),
            None => {
                self.acked.insert(seq, id);
                Ids::keep(&mut self.acked);
            }
        }
    }

    fn compare(&mut self, seq: u64, acked: &(String, u64), read: u64) {
        if read != acked.1 && self.diverged.is_none() {
            self.diverged = Some(mismatch(seq, acked, read));
        }
    }
}

/// What a message read at `seq` that is not the acknowledged one is called in logs.
fn mismatch(seq: u64, acked: &(String, u64), read: u64) -> String {
    format!(
        "at stream sequence {seq} JetStream acknowledged this node's message {} (digest \
         {:016x}), but this node's feed gave another one (digest {read:016x})",
        acked.0, acked.1
    )
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("servers", &self.opts.servers)
            .field("node_id", &self.opts.node_id)
            .field("stream", &self.opts.stream)
            .finish()
    }
}

/// The subject of a record of `topic`: each topic level becomes one token, escaped so that
/// the mapping is reversible ([`topic_of`]): `%` `.` `*` `>` and bytes at or below space are
/// written `%XX`; an empty level is `%`.
pub fn subject_for(prefix: &str, topic: &str) -> String {
    let mut s = String::with_capacity(prefix.len() + topic.len() + 8);
    s.push_str(prefix);
    for level in topic.split('/') {
        s.push('.');
        if level.is_empty() {
            s.push('%');
            continue;
        }
        for c in level.chars() {
            match c {
                '%' | '.' | '*' | '>' | '\u{0}'..=' ' | '\u{7f}' => {
                    let mut b = [0u8; 4];
                    for byte in c.encode_utf8(&mut b).bytes() {
                        s.push_str(&format!("%{byte:02X}"));
                    }
                }
                c => s.push(c),
            }
        }
    }
    s
}

/// The topic of a subject made by [`subject_for`] with `prefix`; `None` if it is not one.
pub fn topic_of(prefix: &str, subject: &str) -> Option<String> {
    let rest = subject.strip_prefix(prefix)?.strip_prefix('.')?;
    let mut levels = Vec::new();
    for token in rest.split('.') {
        if token == "%" {
            levels.push(String::new());
            continue;
        }
        let mut bytes = Vec::with_capacity(token.len());
        let mut it = token.bytes();
        while let Some(b) = it.next() {
            if b == b'%' {
                let hex = [it.next()?, it.next()?];
                let hex = std::str::from_utf8(&hex).ok()?;
                bytes.push(u8::from_str_radix(hex, 16).ok()?);
            } else {
                bytes.push(b);
            }
        }
        levels.push(String::from_utf8(bytes).ok()?);
    }
    Some(levels.join("/"))
}

impl Link {
    /// Connect to the servers (retrying while `connect_timeout` lasts) and make sure the log
    /// stream exists. An existing stream is used as it is (its replicas and limits are its
    /// own); its subjects must cover `<subject_prefix>.>`.
    pub async fn connect(
        opts: LinkOptions,
        connect_timeout: Duration,
    ) -> Result<Link, ClusterError> {
        let servers = opts.servers.join(",");
        let addrs: Vec<async_nats::ServerAddr> = opts
            .servers
            .iter()
            .map(|s| {
                s.parse().map_err(|e| ClusterError::Connect {
                    servers: servers.clone(),
                    why: format!("{s:?}: {e}"),
                })
            })
            .collect::<Result<_, _>>()?;
        // The last error a server reported (an authorization violation, say): the start's
        // error names it, not only the timeout it caused.
        let last_error: std::sync::Arc<std::sync::Mutex<Option<String>>> = Default::default();
        let seen_error = last_error.clone();
        let mut connect = async_nats::ConnectOptions::new();
        let a = &opts.auth;
        if let Some((u, p)) = &a.user {
            connect = connect.user_and_password(u.clone(), p.clone());
        }
        if let Some(t) = &a.token {
            connect = connect.token(t.clone());
        }
        if let Some(path) = &a.credentials_file {
            connect = connect
                .credentials_file(path)
                .await
                .map_err(|e| ClusterError::Connect {
                    servers: servers.clone(),
                    why: format!("credentials file {path:?}: {e}"),
                })?;
        }
        if let Some(ca) = &a.tls_ca_file {
            connect = connect.add_root_certificates(ca.into());
        }
        if let Some((cert, key)) = &a.tls_client {
            connect = connect.add_client_certificate(cert.into(), key.into());
        }
        if a.tls_required {
            connect = connect.require_tls(true);
        }
        let connect = connect
            .name(format!("lanemq {}", opts.node_id))
            .retry_on_initial_connect()
            .max_reconnects(None)
            .connection_timeout(Duration::from_secs(2))
            // A server cut off by the network (no RST, no FIN) is noticed after two missed
            // pings, and the client moves to another listed server.
            .ping_interval(PING_INTERVAL)
            .event_callback(move |ev| {
                let last = last_error.clone();
                async move {
                    match ev {
                        async_nats::Event::Disconnected => {
                            warn!("cluster: disconnected from NATS")
                        }
                        async_nats::Event::Connected => {
                            tracing::info!("cluster: connected to NATS")
                        }
                        async_nats::Event::ServerError(e) => {
                            warn!(error = %e, "cluster: NATS server error");
                            *last.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
                        }
                        async_nats::Event::ClientError(e) => {
                            debug!(error = %e, "cluster: NATS connection error");
                            *last.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
                        }
                        other => debug!(event = %other, "cluster: NATS event"),
                    }
                }
            })
            .connect(addrs);
        let client = tokio::time::timeout(connect_timeout, connect)
            .await
            .map_err(|_| ClusterError::Connect {
                servers: servers.clone(),
                why: format!("no server answered within {connect_timeout:?}"),
            })?
            .map_err(|e| ClusterError::Connect {
                servers: servers.clone(),
                why: e.to_string(),
            })?;
        let js = jetstream::ContextBuilder::new()
            .timeout(Duration::from_secs(5))
            .ack_timeout(Duration::from_secs(5))
            .max_ack_inflight(16_384)
            .backpressure_on_inflight(true)
            .build(client.clone());
        let (tx, rx) = mpsc::channel(opts.queue_records.max(1));
        let link = Link {
            client,
            js,
            opts,
            tx,
            acked: Default::default(),
            in_flight: Default::default(),
            ids: Default::default(),
        };
        let deadline = tokio::time::Instant::now() + connect_timeout;
        loop {
            match link.ensure_stream().await {
                Ok(()) => break,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    debug!(error = %e, "cluster: stream not ready yet; retrying");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => {
                    let last = seen_error.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    return Err(match (e, last) {
                        (ClusterError::Stream { stream, why }, Some(server)) => {
                            ClusterError::Stream {
                                stream,
                                why: format!("{why} (last NATS error: {server})"),
                            }
                        }
                        (e, _) => e,
                    });
                }
            }
        }
        tokio::spawn(sender(link.clone(), rx));
        Ok(link)
    }

    /// The version of the NATS server this link is connected to now (`2.9.10`).
    pub fn server_version(&self) -> String {
        self.client.server_info().version
    }

    /// This link's settings.
    pub fn options(&self) -> &LinkOptions {
        &self.opts
    }

    async fn ensure_stream(&self) -> Result<(), ClusterError> {
        let o = &self.opts;
        let err = |why: String| ClusterError::Stream {
            stream: o.stream.clone(),
            why,
        };
        let want = format!("{}.>", o.subject_prefix);
        let cfg = stream::Config {
            name: o.stream.clone(),
            subjects: vec![want.clone()],
            num_replicas: o.replicas,
            storage: stream::StorageType::File,
            retention: stream::RetentionPolicy::Limits,
            discard: stream::DiscardPolicy::Old,
            max_age: o.max_age,
            max_bytes: i64::try_from(o.max_bytes)
                .ok()
                .filter(|b| *b > 0)
                .unwrap_or(-1),
            max_messages: -1,
            max_messages_per_subject: -1,
            max_message_size: -1,
            duplicate_window: Duration::from_secs(120),
            deny_delete: true,
            ..Default::default()
        };
        let mut s = self
            .js
            .get_or_create_stream(cfg)
            .await
            .map_err(|e| err(e.to_string()))?;
        let info = s.info().await.map_err(|e| err(e.to_string()))?;
        if !info.config.subjects.iter().any(|x| *x == want || x == ">") {
            return Err(err(format!(
                "its subjects {:?} do not cover {want:?}",
                info.config.subjects
            )));
        }
        Ok(())
    }

    /// The stream's first and last sequence now.
    pub async fn state(&self) -> Result<StreamState, ClusterError> {
        let mut s = self
            .js
            .get_stream(&self.opts.stream)
            .await
            .map_err(|e| ClusterError::Feed(e.to_string()))?;
        let info = s
            .info()
            .await
            .map_err(|e| ClusterError::Feed(e.to_string()))?;
        Ok(StreamState {
            first_seq: info.state.first_sequence,
            last_seq: info.state.last_sequence,
            messages: info.state.messages,
        })
    }

    /// Hand a record over for publishing in a batch frame. Records are published in the
    /// order of the calls. `done` (if any) fires once JetStream acknowledged the batch that
    /// holds it (in the order of the calls), or with the error that kept it from being stored.
    /// Waits only while `queue_records` records are queued.
    pub async fn publish(&self, payload: Bytes, done: Option<Done>) -> Result<(), ClusterError> {
        let out = Out::batched(payload, done);
        self.tx.send(out).await.map_err(|_| ClusterError::Closed)
    }

    /// [`Link::publish`] without waiting: `Err` gives the record back when the queue is full
    /// (or the link closed).
    pub fn try_publish(
        &self,
        payload: Bytes,
        done: Option<Done>,
    ) -> Result<(), (Bytes, Option<Done>)> {
        let out = Out::batched(payload, done);
        self.tx.try_send(out).map_err(|e| {
            let out = match e {
                mpsc::error::TrySendError::Full(o) | mpsc::error::TrySendError::Closed(o) => o,
            };
            (out.payload, out.done)
        })
    }

    /// [`Link::publish`] from a thread outside the runtime (blocks while the queue is full).
    pub fn publish_blocking(&self, payload: Bytes, done: Option<Done>) -> Result<(), ClusterError> {
        let out = Out::batched(payload, done);
        self.tx.blocking_send(out).map_err(|_| ClusterError::Closed)
    }

    /// Hand a record over for publishing as its own message under the subject of `topic`
    /// (so [`Link::read_subject`] finds it), in order with the batched ones.
    pub async fn publish_alone(
        &self,
        topic: &str,
        payload: Bytes,
        done: Option<Done>,
    ) -> Result<(), ClusterError> {
        let out = self.alone(topic, payload, done);
        self.tx.send(out).await.map_err(|_| ClusterError::Closed)
    }

    /// [`Link::publish_alone`] from a thread outside the runtime.
    pub fn publish_alone_blocking(
        &self,
        topic: &str,
        payload: Bytes,
        done: Option<Done>,
    ) -> Result<(), ClusterError> {
        let out = self.alone(topic, payload, done);
        self.tx.blocking_send(out).map_err(|_| ClusterError::Closed)
    }

    /// A record published alone under the subject of `topic`.
    fn alone(&self, topic: &str, payload: Bytes, done: Option<Done>) -> Out {
        Out {
            alone: Some(subject_for(&self.opts.subject_prefix, topic)),
            payload,
            done,
        }
    }

    /// Records handed over and not yet taken by the sender.
    pub fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// Records handed over whose message JetStream has not acknowledged yet: those queued and
    /// those in the messages of the window.
    pub fn unacked(&self) -> usize {
        self.queued() + self.in_flight.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The reader read a message of `digest` at stream sequence `seq`, not applied yet:
    /// compared with what JetStream acknowledged to this node there, now or when the ack
    /// comes (whichever is second).
    ///
    /// [`ReadCheck::Reread`] when the ack came first and names another message: the feed is
    /// served by a nats-server whose copy is not the committed one (a leader cut off from the
    /// others serves writes it never committed, seen on nats-server 2.9.10 right after a
    /// partition heals). Nothing is applied; the ack is kept, so the message read again is
    /// compared again. Also [`ReadCheck::Reread`] when the message's id (`id`, its
    /// `Nats-Msg-Id`) was read before at another sequence: JetStream stores one message per
    /// id, so that copy holds a duplicate the stream never committed (a publish retried on the
    /// new leader after the cut-off one had stored it). [`ReadCheck::Diverged`] once a message
    /// already applied turned out to differ from the ack that came after it: this node's log
    /// is not the cluster's.
    pub fn check_read(&self, seq: u64, digest: u64, id: Option<&str>) -> Result<(), ReadCheck> {
        self.ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .check_read(seq, digest, id)
    }

    /// Whether a disagreement was found ([`Link::check_read`]), and what.
    pub fn diverged(&self) -> Option<String> {
        self.ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .diverged
            .clone()
    }

    /// The highest stream sequence JetStream acknowledged to this node so far.
    pub fn acked_seq(&self) -> u64 {
        self.acked.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The subject of offset marks.
    fn mark_subject(&self) -> String {
        subject_for(&self.opts.subject_prefix, "$lanemq/mark")
    }

    /// Write an offset mark: the message at stream sequence `seq` starts at log offset
    /// `offset` (what a node with an empty log needs to join a stream whose head its limits
    /// removed). In order with the records handed over.
    pub async fn mark(&self, seq: u64, offset: u64) -> Result<(), ClusterError> {
        let mut b = MARK_MAGIC.to_vec();
        b.extend_from_slice(&seq.to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes());
        let out = Out {
            alone: Some(self.mark_subject()),
            payload: Bytes::from(b),
            done: None,
        };
        self.tx.send(out).await.map_err(|_| ClusterError::Closed)
    }

    /// The newest offset mark in the stream, if any: `(seq, offset)`.
    pub async fn last_mark(&self) -> Result<Option<(u64, u64)>, ClusterError> {
        let s = self
            .js
            .get_stream(&self.opts.stream)
            .await
            .map_err(|e| ClusterError::Feed(e.to_string()))?;
        match s
            .get_last_raw_message_by_subject(&self.mark_subject())
            .await
        {
            Ok(m) => match frame_of(m.payload) {
                Ok(Frame::Mark { seq, offset }) => Ok(Some((seq, offset))),
                _ => Ok(None),
            },
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(ClusterError::Feed(e.to_string())),
        }
    }

    /// Read the stream in order from sequence `from` (at least 1).
    pub async fn feed(&self, from: u64) -> Result<Feed, ClusterError> {
        let s = self
            .js
            .get_stream(&self.opts.stream)
            .await
            .map_err(|e| ClusterError::Feed(e.to_string()))?;
        let c = s
            .create_consumer(consumer::pull::OrderedConfig {
                deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: from.max(1),
                },
                ..Default::default()
            })
            .await
            .map_err(|e| ClusterError::Feed(e.to_string()))?;
        let messages = c
            .messages()
            .await
            .map_err(|e| ClusterError::Feed(e.to_string()))?;
        Ok(Feed { messages })
    }

    /// The records published under `topic` up to sequence `upto` (inclusive), in order:
    /// a bounded read of one subject of the log (nothing when the subject holds none).
    pub async fn read_subject(&self, topic: &str, upto: u64) -> Result<Vec<Entry>, ClusterError> {
        let err = |e: String| ClusterError::Feed(e);
        let subject = subject_for(&self.opts.subject_prefix, topic);
        let s = self
            .js
            .get_stream(&self.opts.stream)
            .await
            .map_err(|e| err(e.to_string()))?;
        let last = match s.get_last_raw_message_by_subject(&subject).await {
            Ok(m) => m.sequence,
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => {
                return Ok(Vec::new())
            }
            Err(e) => return Err(err(e.to_string())),
        };
        let target = last.min(upto);
        let mut out = Vec::new();
        if target == 0 {
            return Ok(out);
        }
        let c = s
            .create_consumer(consumer::pull::OrderedConfig {
                deliver_policy: consumer::DeliverPolicy::All,
                filter_subject: subject,
                ..Default::default()
            })
            .await
            .map_err(|e| err(e.to_string()))?;
        let mut messages = c.messages().await.map_err(|e| err(e.to_string()))?;
        while let Some(m) = messages.next().await {
            let m = m.map_err(|e| err(e.to_string()))?;
            let seq = m.info().map_err(|e| err(e.to_string()))?.stream_sequence;
            if seq > target {
                break;
            }
            out.push(Entry {
                seq,
                id: msg_id(&m.message),
                digest: digest(&m.message.payload),
                payload: m.message.payload.clone(),
            });
            if seq == target {
                break;
            }
        }
        Ok(out)
    }

    /// Tell the other nodes this node is alive (`<subject_prefix>-hb.<node>`, core NATS).
    pub async fn beat(&self) -> Result<(), ClusterError> {
        let subject = format!("{}-hb.{}", self.opts.subject_prefix, self.opts.node_id);
        self.client
            .publish(subject, Bytes::new())
            .await
            .map_err(|e| ClusterError::Request(e.to_string()))
    }

    /// The heartbeats of every node ([`Link::beat`]).
    pub async fn beats(&self) -> Result<Beats, ClusterError> {
        let prefix = format!("{}-hb.", self.opts.subject_prefix);
        let sub = self
            .client
            .subscribe(format!("{prefix}*"))
            .await
            .map_err(|e| ClusterError::Request(e.to_string()))?;
        Ok(Beats { sub, prefix })
    }

    /// The sessions bucket (`<stream>_SESSIONS`, the log stream's replicas), created when
    /// missing.
    pub async fn sessions(&self) -> Result<Kv, ClusterError> {
        let name = format!("{}_SESSIONS", self.opts.stream);
        let prefix = format!("{}-sessions", self.opts.subject_prefix);
        let stream = self
            .js
            .get_or_create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![format!("{prefix}.>")],
                num_replicas: self.opts.replicas,
                storage: stream::StorageType::File,
                retention: stream::RetentionPolicy::Limits,
                discard: stream::DiscardPolicy::Old,
                max_messages_per_subject: 1,
                max_messages: -1,
                max_bytes: -1,
                max_message_size: -1,
                ..Default::default()
            })
            .await
            .map_err(|e| ClusterError::Kv(format!("stream {name}: {e}")))?;
        Ok(Kv {
            js: self.js.clone(),
            stream,
            prefix,
        })
    }

    /// The subject of requests `what` to the node `node_id`: `<subject_prefix>-rpc.<node>.<what>`,
    /// outside the log stream's subjects.
    pub fn node_subject(&self, node_id: &str, what: &str) -> String {
        format!("{}-rpc.{node_id}.{what}", self.opts.subject_prefix)
    }

    /// Receive the requests sent to this node under `what` ([`Link::request`]).
    pub async fn serve(&self, what: &str) -> Result<Requests, ClusterError> {
        let subject = self.node_subject(&self.opts.node_id, what);
        let sub = self
            .client
            .subscribe(subject)
            .await
            .map_err(|e| ClusterError::Request(e.to_string()))?;
        Ok(Requests { sub })
    }

    /// Ask the node `node_id` (`what`, as it serves it) and wait up to `timeout` for its
    /// answer. `Err` when no node serves that subject or it did not answer in time.
    pub async fn request(
        &self,
        node_id: &str,
        what: &str,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, ClusterError> {
        let subject = self.node_subject(node_id, what);
        let r = tokio::time::timeout(timeout, self.client.request(subject, payload))
            .await
            .map_err(|_| ClusterError::Request(format!("node {node_id} did not answer")))?
            .map_err(|e| ClusterError::Request(e.to_string()))?;
        Ok(r.payload)
    }

    /// Answer a request.
    pub async fn respond(&self, reply: String, payload: Bytes) -> Result<(), ClusterError> {
        self.client
            .publish(reply, payload)
            .await
            .map_err(|e| ClusterError::Request(e.to_string()))
    }

    /// Wait until everything handed over so far has been written to the NATS connection.
    pub async fn flush(&self) -> Result<(), ClusterError> {
        self.client
            .flush()
            .await
            .map_err(|e| ClusterError::Publish(e.to_string()))
    }
}

/// The cluster's key-value bucket of persistent sessions ([`Link::sessions`]): a JetStream
/// stream `<stream>_SESSIONS` that keeps the last message of each subject
/// `<subject_prefix>-sessions.<key>` ([`session_key`]); an empty value is a deleted key.
/// (JetStream's own KV buckets are the same thing; this keeps to the stream API every
/// nats-server version lanemq meets answers the same way.)
#[derive(Clone)]
pub struct Kv {
    js: jetstream::Context,
    stream: jetstream::stream::Stream,
    prefix: String,
}

impl std::fmt::Debug for Kv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Kv")
    }
}

/// The key of a client id in the sessions bucket: `c.` and the id's bytes in hex (KV keys
/// allow only a few characters; hex keeps every client id distinct).
pub fn session_key(client_id: &str) -> String {
    let mut k = String::with_capacity(2 + 2 * client_id.len());
    k.push_str("c.");
    for b in client_id.bytes() {
        k.push_str(&format!("{b:02x}"));
    }
    if client_id.is_empty() {
        k.push('_');
    }
    k
}

impl Kv {
    fn subject(&self, key: &str) -> String {
        format!("{}.{key}", self.prefix)
    }

    /// The value of `key`, if any.
    pub async fn get(&self, key: &str) -> Result<Option<Bytes>, ClusterError> {
        match self
            .stream
            .get_last_raw_message_by_subject(&self.subject(key))
            .await
        {
            Ok(m) if m.payload.is_empty() => Ok(None),
            Ok(m) => Ok(Some(m.payload)),
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(ClusterError::Kv(e.to_string())),
        }
    }

    /// Store `value` under `key` (replicated before it returns).
    pub async fn put(&self, key: &str, value: Bytes) -> Result<(), ClusterError> {
        let ack = self
            .js
            .publish(self.subject(key), value)
            .await
            .map_err(|e| ClusterError::Kv(e.to_string()))?;
        ack.await
            .map(|_| ())
            .map_err(|e| ClusterError::Kv(e.to_string()))
    }

    /// Remove `key` (an empty value).
    pub async fn delete(&self, key: &str) -> Result<(), ClusterError> {
        self.put(key, Bytes::new()).await
    }
}

/// Heartbeats of the nodes ([`Link::beats`]).
pub struct Beats {
    sub: async_nats::Subscriber,
    prefix: String,
}

impl std::fmt::Debug for Beats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Beats")
    }
}

impl Beats {
    /// The node of the next heartbeat; `None` when the link closed.
    pub async fn next(&mut self) -> Option<String> {
        loop {
            let m = self.sub.next().await?;
            if let Some(node) = m.subject.as_str().strip_prefix(&self.prefix) {
                return Some(node.to_string());
            }
        }
    }
}

/// Requests addressed to one node ([`Link::serve`]).
pub struct Requests {
    sub: async_nats::Subscriber,
}

impl std::fmt::Debug for Requests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Requests")
    }
}

/// One request: its body and where the answer goes.
#[derive(Debug)]
pub struct Request {
    /// The request's body.
    pub payload: Bytes,
    /// The inbox of the asking node (`None`: nobody waits for an answer).
    pub reply: Option<String>,
}

impl Requests {
    /// The next request; `None` when the link closed.
    pub async fn next(&mut self) -> Option<Request> {
        let m = self.sub.next().await?;
        Some(Request {
            payload: m.payload,
            reply: m.reply.map(|r| r.to_string()),
        })
    }
}

/// The stream read in order ([`Link::feed`]).
pub struct Feed {
    messages: consumer::pull::Ordered,
}

impl std::fmt::Debug for Feed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Feed")
    }
}

impl Feed {
    /// The next record; `None` when the consumer ended.
    pub async fn next(&mut self) -> Option<Result<Entry, ClusterError>> {
        let m = match self.messages.next().await? {
            Ok(m) => m,
            Err(e) => return Some(Err(ClusterError::Feed(e.to_string()))),
        };
        let seq = match m.info() {
            Ok(i) => i.stream_sequence,
            Err(e) => return Some(Err(ClusterError::Feed(e.to_string()))),
        };
        Some(Ok(Entry {
            seq,
            id: msg_id(&m.message),
            digest: digest(&m.message.payload),
            payload: m.message.payload.clone(),
        }))
    }
}

/// One published message (a batch frame or a record alone) waiting for its ack: the
/// callbacks of its records with their indexes, and the outcome.
type Inflight = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = (
                    Vec<(u32, Done)>,
                    usize,
                    Result<(u64, (String, u64)), ClusterError>,
                ),
            > + Send,
    >,
>;

/// Publishes the records handed over, in order, packed into batch frames: a batch takes what
/// the channel holds (up to its limits) when the window has room, so the records that arrive
/// while earlier batches wait for their acks make the next batch. At most `publish_window`
/// messages wait for their acks; the callbacks fire in the order of the messages (a message
/// acknowledged early waits for the ones before it), so records are acknowledged in the order
/// they were handed over.
async fn sender(link: Link, mut rx: mpsc::Receiver<Out>) {
    use futures_util::stream::FuturesOrdered;
    let id_prefix = format!(
        "{}-{}",
        link.opts.node_id,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros())
    );
    let window = link.opts.publish_window.max(1);
    let records_max = link.opts.batch_records_max.clamp(1, BATCH_RECORDS_MAX);
    let bytes_max = link.opts.batch_bytes_max.max(1);
    let batch_subject = subject_for(&link.opts.subject_prefix, "$lanemq/batch");
    let mut counter: u64 = 0;
    let mut inflight: FuturesOrdered<Inflight> = FuturesOrdered::new();
    // A record taken from the channel that starts the next message.
    let mut carry: Option<Out> = None;
    let mut closed = false;
    loop {
        if carry.is_none() && !closed && inflight.len() < window {
            tokio::select! {
                biased;
                Some((dones, n, r)) = inflight.next(), if !inflight.is_empty() => {
                    finish(&link, dones, n, r);
                    continue;
                }
                o = rx.recv() => match o {
                    Some(o) => carry = Some(o),
                    None => closed = true,
                },
            }
        }
        if carry.is_none() || inflight.len() >= window {
            match inflight.next().await {
                Some((dones, n, r)) => {
                    finish(&link, dones, n, r);
                    continue;
                }
                None if closed => return,
                None => continue,
            }
        }
        let Some(first) = carry.take() else { continue };
        counter += 1;
        let id = format!("{id_prefix}-{counter}");
        let (subject, payload, dones, n) = match first.alone {
            Some(subject) => {
                let dones: Vec<(u32, Done)> = first.done.map(|d| (0, d)).into_iter().collect();
                (subject, first.payload, dones, 1)
            }
            None => {
                let mut bytes = first.payload.len();
                let mut records = vec![first.payload];
                let mut dones: Vec<(u32, Done)> = Vec::new();
                if let Some(d) = first.done {
                    dones.push((0, d));
                }
                while records.len() < records_max && bytes < bytes_max {
                    let Ok(o) = rx.try_recv() else { break };
                    if o.alone.is_some() || bytes + o.payload.len() > bytes_max {
                        carry = Some(o);
                        break;
                    }
                    bytes += o.payload.len();
                    if let Some(d) = o.done {
                        dones.push((records.len() as u32, d));
                    }
                    records.push(o.payload);
                }
                (
                    batch_subject.clone(),
                    encode_frame(&records, link.opts.compress),
                    dones,
                    records.len(),
                )
            }
        };
        link.in_flight
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        let first = link
            .js
            .send_publish(
                subject.clone(),
                PublishMessage::build()
                    .payload(payload.clone())
                    .message_id(&id),
            )
            .await;
        let retry = Retry {
            js: link.js.clone(),
            subject,
            payload,
            id,
            deadline: tokio::time::Instant::now() + link.opts.publish_timeout,
        };
        inflight.push_back(Box::pin(async move {
            let id = (retry.id.clone(), digest(&retry.payload));
            let r = match first {
                // (A duplicate's ack names the sequence of the first copy.)
                Ok(ack) => match ack.await {
                    Ok(a) => Ok(a.sequence),
                    Err(e) => retry.run(e.to_string()).await,
                },
                Err(e) => retry.run(e.to_string()).await,
            };
            (dones, n, r.map(|seq| (seq, id)))
        }));
    }
}

/// A message's outcome to the callbacks of its records.
fn finish(
    link: &Link,
    dones: Vec<(u32, Done)>,
    n: usize,
    r: Result<(u64, (String, u64)), ClusterError>,
) {
    link.in_flight
        .fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
    match r {
        Ok((seq, id)) => {
            link.acked
                .fetch_max(seq, std::sync::atomic::Ordering::Relaxed);
            link.ids
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .acked(seq, id);
            for (index, done) in dones {
                done(Ok(Ack { seq, index }));
            }
        }
        Err(e) => {
            warn!(error = %e, "cluster: JetStream did not store a batch of records");
            for (_, done) in dones {
                done(Err(e.clone()));
            }
        }
    }
}

/// A message whose first publish was not acknowledged: published again with the same message
/// id until its deadline.
struct Retry {
    js: jetstream::Context,
    subject: String,
    payload: Bytes,
    id: String,
    deadline: tokio::time::Instant,
}

impl Retry {
    async fn run(self, mut last: String) -> Result<u64, ClusterError> {
        let mut pause = Duration::from_millis(100);
        loop {
            if tokio::time::Instant::now() + pause >= self.deadline {
                return Err(ClusterError::Publish(last));
            }
            debug!(error = %last, id = %self.id, "cluster: publish not acknowledged; retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
            let r = self
                .js
                .send_publish(
                    self.subject.clone(),
                    PublishMessage::build()
                        .payload(self.payload.clone())
                        .message_id(&self.id),
                )
                .await;
            match r {
                Ok(ack) => match ack.await {
                    Ok(a) => return Ok(a.sequence),
                    Err(e) => last = e.to_string(),
                },
                Err(e) => last = e.to_string(),
            }
        }
    }
}

/// Whether a nats-server of `version` can fsync before it acknowledges a JetStream message
/// (`jetstream { sync_interval: always }`, nats-server 2.10 and later). `None`: not a version
/// this can read.
pub fn can_sync_always(version: &str) -> Option<bool> {
    let mut it = version.trim_start_matches('v').split(['.', '-']);
    let major: u32 = it.next()?.parse().ok()?;
    let minor: u32 = it.next()?.parse().ok()?;
    Some(major > 2 || (major == 2 && minor >= 10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_round_trip() {
        for t in [
            "a/b/c",
            "sensors/1.5/temp",
            "/leading",
            "trailing/",
            "a//b",
            "with space/and*star/and>gt/100%",
            "ünï/cödé",
            "",
        ] {
            let s = subject_for("lanemq.log", t);
            assert!(
                !s.contains(' ') && !s.contains('*') && !s.contains('>'),
                "{s}"
            );
            assert!(s.split('.').all(|tok| !tok.is_empty()), "{s}");
            assert_eq!(topic_of("lanemq.log", &s).as_deref(), Some(t), "{s}");
        }
        assert_eq!(subject_for("p", "a/b.c"), "p.a.b%2Ec");
        assert_eq!(topic_of("p", "q.a"), None);
    }

    #[test]
    fn a_read_that_differs_from_the_ack_is_divergence_whichever_comes_first() {
        let mut ids = Ids::default();
        // Read first, acked later, the same bytes: fine.
        ids.read.insert(1, digest(b"one"));
        let read = ids.read.remove(&1).expect("read");
        ids.compare(1, &("n-1".into(), digest(b"one")), read);
        assert!(ids.diverged.is_none());
        // Read (and applied) first, acked later as another message: divergence, named.
        ids.compare(2, &("n-2".into(), digest(b"two")), digest(b"other"));
        assert!(ids.diverged.as_deref().is_some_and(|w| w.contains("n-2")));
        assert_ne!(digest(b"ab"), digest(b"abc"));
    }

    #[test]
    fn a_read_that_differs_from_an_earlier_ack_is_read_again_until_it_matches() {
        let mut ids = Ids::default();
        ids.acked.insert(5, ("n-5".into(), digest(b"five")));
        // A stale copy served another message there: not applied, the ack is kept.
        let r = ids.check_read(5, digest(b"stale"), Some("n-5"));
        assert!(
            matches!(&r, Err(ReadCheck::Reread(w)) if w.contains("n-5")),
            "{r:?}"
        );
        assert!(ids.diverged.is_none());
        // Read again from the committed copy: applied, the ack consumed.
        assert_eq!(ids.check_read(5, digest(b"five"), Some("n-5")), Ok(()));
        assert!(ids.acked.is_empty());
        // A sequence without an ack is remembered for the ack to come.
        assert_eq!(ids.check_read(6, digest(b"six"), Some("m-1")), Ok(()));
        assert_eq!(ids.read.get(&6), Some(&digest(b"six")));
        // Once diverged, every read is refused as such.
        ids.compare(7, &("n-7".into(), digest(b"seven")), digest(b"x"));
        assert!(matches!(
            ids.check_read(8, 0, None),
            Err(ReadCheck::Diverged(_))
        ));
    }

    #[test]
    fn an_id_read_again_at_another_sequence_is_read_again() {
        let mut ids = Ids::default();
        assert_eq!(ids.check_read(10, digest(b"b"), Some("m-7")), Ok(()));
        // The same sequence read again (a reopened feed) is fine.
        assert_eq!(ids.check_read(10, digest(b"b"), Some("m-7")), Ok(()));
        // The same id at a later sequence: a copy holding an uncommitted duplicate.
        let r = ids.check_read(11, digest(b"b"), Some("m-7"));
        assert!(
            matches!(&r, Err(ReadCheck::Reread(w)) if w.contains("m-7") && w.contains("10")),
            "{r:?}"
        );
        assert!(ids.diverged.is_none());
        assert_eq!(ids.check_read(11, digest(b"c"), Some("m-8")), Ok(()));
        assert_eq!(ids.check_read(12, digest(b"d"), None), Ok(()));
        // Bounded: the oldest ids are forgotten.
        for i in 0..(ACKED_IDS_KEPT as u64 + 10) {
            let id = format!("x-{i}");
            assert_eq!(ids.check_read(100 + i, 0, Some(&id)), Ok(()));
        }
        assert_eq!(ids.seen.len(), ACKED_IDS_KEPT);
        assert_eq!(ids.seen_order.len(), ACKED_IDS_KEPT);
    }

    #[test]
    fn this_nodes_message_read_at_another_sequence_than_acked() {
        // The ack first: the copy that holds it elsewhere is read again.
        let mut ids = Ids::default();
        ids.acked(9916, ("n-1975".into(), digest(b"mine")));
        let r = ids.check_read(9915, digest(b"mine"), Some("n-1975"));
        assert!(
            matches!(&r, Err(ReadCheck::Reread(w)) if w.contains("9916")),
            "{r:?}"
        );
        assert_eq!(ids.check_read(9915, digest(b"other"), Some("m-3")), Ok(()));
        assert_eq!(
            ids.check_read(9916, digest(b"mine"), Some("n-1975")),
            Ok(())
        );
        assert!(ids.diverged.is_none());
        // The read first (applied), the ack after names another sequence: diverged.
        let mut ids = Ids::default();
        assert_eq!(
            ids.check_read(9915, digest(b"mine"), Some("n-1975")),
            Ok(())
        );
        ids.acked(9916, ("n-1975".into(), digest(b"mine")));
        assert!(ids.diverged.as_deref().is_some_and(|w| w.contains("9915")));
    }

    #[test]
    fn sync_always_needs_2_10() {
        assert_eq!(can_sync_always("2.9.10"), Some(false));
        assert_eq!(can_sync_always("v2.10.0"), Some(true));
        assert_eq!(can_sync_always("2.15.1"), Some(true));
        assert_eq!(can_sync_always("3.0.0-beta"), Some(true));
        assert_eq!(can_sync_always("x"), None);
    }

    #[test]
    fn batch_frames_round_trip_and_refuse_bad_lengths() {
        let recs = [b"\xA1one".to_vec(), Vec::new(), vec![7u8; 300]];
        let f = encode_batch(&recs);
        let Ok(Frame::Records(got)) = frame_of(f.clone()) else {
            panic!("not a batch")
        };
        assert_eq!(got.len(), 3);
        for (g, r) in got.iter().zip(&recs) {
            assert_eq!(&g[..], &r[..]);
        }
        // A plain record is one record; a cut or padded frame is an error.
        let plain = Bytes::from_static(b"\xA1plain");
        assert_eq!(frame_of(plain.clone()), Ok(Frame::Records(vec![plain])));
        assert!(frame_of(f.slice(..f.len() - 1)).is_err());
        let mut padded = f.to_vec();
        padded.push(0);
        assert!(frame_of(Bytes::from(padded)).is_err());
        let mut huge = BATCH_MAGIC.to_vec();
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(frame_of(Bytes::from(huge)).is_err());
        // A compressed frame holds the same records; a damaged one is an error.
        let many: Vec<Vec<u8>> = (0..200)
            .map(|i| format!("\u{a1}record {i} of a batch").into_bytes())
            .collect();
        let z = encode_frame(&many, true);
        assert!(z.starts_with(BATCH_ZSTD_MAGIC), "compressed");
        assert!(z.len() < encode_batch(&many).len() / 2);
        let Ok(Frame::Records(got)) = frame_of(z.clone()) else {
            panic!("not a batch")
        };
        assert_eq!(got.len(), 200);
        assert_eq!(&got[7][..], &many[7][..]);
        assert!(frame_of(z.slice(..z.len() - 3)).is_err());
        let mut mark = MARK_MAGIC.to_vec();
        mark.extend_from_slice(&5u64.to_be_bytes());
        mark.extend_from_slice(&40u64.to_be_bytes());
        assert_eq!(
            frame_of(Bytes::from(mark)),
            Ok(Frame::Mark { seq: 5, offset: 40 })
        );
    }
}
