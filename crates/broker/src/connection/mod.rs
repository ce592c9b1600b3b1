//! One task per network connection: CONNECT handshake, then a single `select!` loop over
//! reading (decode + handle), writing (a bounded buffer), session wake-ups and keep alive.
//!
//! Invariants:
//! - the session lock is never held across an `.await`, and never while taking the router lock
//!   (lock order: router, then session);
//! - at most `send_window` QoS 1/2 PUBLISH are unacknowledged [MQTT-4.9.0-2];
//! - the write buffer stops growing at `WRITE_HIGH_WATER_BYTES`; the session queue (bounded by
//!   `max_queued_messages` and `outbound_buffer_bytes_max`) holds the rest;
//! - a connection whose session generation changed (take-over) stops touching the session.
//!
//! - an idle connection holds no read or write buffer, and its task's future is small: the
//!   buffers are taken while data flows and dropped when the connection waits with nothing
//!   buffered; the short-lived stages (handshake, enhanced authentication, the close) run in
//!   boxed futures; rarely used state (will, topic aliases, stream feeders, rate limit) is
//!   boxed and allocated only when used.
//!
//! - a plain-TCP connection with nothing to do for `mqtt.idle_hibernate_ms` leaves its task
//!   and waits in the broker's parking lot (`crate::park`; `hibernate.rs`).
//!
//! This file keeps the socket loop, framing, packet dispatch and the drain of the session
//! queue; the handshake, PUBLISH, SUBSCRIBE/UNSUBSCRIBE, hibernation and the end of a
//! connection (will, expiry) are in the files beside it.

mod close;
mod handshake;
mod hibernate;
mod publish;
mod subscribe;

pub use close::start_restored_timers;
use handshake::reject_bad_connect;
pub use hibernate::serve_tcp;

use crate::broker::Broker;
use crate::lazy::{LazyDeque, LazyMap};
use crate::message::{Delivery, Message};
use crate::persist::{Op, SessionMeta};
use crate::router::Subscriber;
use crate::session::{Inflight, InflightStage, Kick, Session, Subscription};
use crate::stream_sub::StreamSub;
use crate::waker::ConnWaker;
use bytes::BytesMut;
use futures_util::future::Either;
use lanemq_acl::{Action, Request};
use lanemq_protocol::reason as rc;
use lanemq_protocol::topic;
use lanemq_protocol::{
    decode, encode, encoded_len, AckProperties, ConnAck, ConnAckProperties, Connect, DecodeError,
    Disconnect, Packet, ProtocolVersion, PubResp, Publish, PublishOut, QoS, SubAck, Subscribe,
    UnsubAck, Unsubscribe, Will,
};
use std::cell::RefCell;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tracing::{debug, debug_span, warn, Instrument};

/// The write buffer is filled from the session queue up to this size.
const WRITE_HIGH_WATER_BYTES: usize = 64 * 1024;
/// First capacity of a write buffer taken for acknowledgements and other small packets.
const WRITE_BUFFER_MIN_BYTES: usize = 256;
/// Size of each thread's read scratch (see [`read_some`]): the most one read takes.
const READ_BUFFER_STEP_BYTES: usize = 16 * 1024;
/// Free room below which a read buffer grows, when a read has to go in place.
const READ_ROOM_MIN_BYTES: usize = 256;
/// How long the final DISCONNECT and buffered data may take to flush.
const FLUSH_TIMEOUT_MS: u64 = 1_000;
/// Spilled queue entries are read back from the log when fewer than this many are in memory.
const REFILL_LOW: usize = 64;
/// Spilled queue entries read back at a time, at most.
const REFILL_BATCH: usize = 128;
/// Bytes of spilled queue entries read back at a time, at most (at least one entry; never
/// beyond the session's `outbound_buffer_bytes_max`).
const REFILL_BYTES_MAX: usize = 64 * 1024;
/// A drained session queue whose capacity is above this gives the spare room back.
const TRIM_QUEUE_CAPACITY: usize = 1024;
/// How long input is drained after a server-initiated DISCONNECT.
const LINGER_MS: u64 = 500;
/// How much input is drained at most after a server-initiated DISCONNECT.
const LINGER_BYTES_MAX: usize = 1024 * 1024;

/// How the socket loop ended: the connection closes, or it hibernates (plain TCP only; see
/// `crate::park`) with its keep-alive deadline.
enum Exit {
    Close(Close),
    Park(Option<tokio::time::Instant>),
}

/// When a plain-TCP connection hibernates (see `crate::park` and `hibernate.rs`).
#[derive(Debug, Clone, Copy)]
struct Hibernate {
    /// Nothing to do for this long: hibernate (`mqtt.idle_hibernate_ms`).
    after: Duration,
    /// The limit until the connection is active past it: shorter for a connection just back
    /// from the lot, which most often had one keep-alive ping or one delivery to handle.
    first: Duration,
}

/// When the socket loop's timer fires: the keep-alive deadline or the next hibernation check,
/// whichever is first (a year from `now` when there is neither).
fn timer_at(
    keep_alive: Option<tokio::time::Instant>,
    check: Option<tokio::time::Instant>,
    now: tokio::time::Instant,
) -> tokio::time::Instant {
    match (keep_alive, check) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b).unwrap_or(now + Duration::from_secs(86_400 * 365)),
    }
}

/// How a connection ends.
#[derive(Debug, Clone, Copy)]
struct Close {
    /// DISCONNECT reason code to send (MQTT 5 only).
    reason: Option<u8>,
    /// Publish the will message.
    will: bool,
}

impl Close {
    fn error(code: u8) -> Close {
        Close {
            reason: Some(code),
            will: true,
        }
    }
    fn silent(will: bool) -> Close {
        Close { reason: None, will }
    }
}

/// Serve one connection until it ends.
///
/// Not an `async fn`: the future is [`run`]'s (in its span when that is enabled), without a
/// frame of its own (each level of futures keeps its own copy of the arguments for the life of
/// the connection).
pub fn serve_connection<R, W>(
    broker: Arc<Broker>,
    reader: R,
    writer: W,
    peer: SocketAddr,
) -> impl Future<Output = ()> + Send
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send,
{
    // A DEBUG span: at the default INFO filter a span costs nothing, where an enabled one
    // costs each connection some 450 bytes in the subscriber. The WARN events of a connection
    // name the client themselves. Disabled, the future does not carry it at all.
    let span = debug_span!("conn", %peer, client_id = tracing::field::Empty);
    let run = run(broker, reader, writer, peer);
    if span.is_disabled() {
        Either::Left(run)
    } else {
        Either::Right(Box::pin(run.instrument(span)))
    }
}

/// What a connection sent first.
enum First {
    Connect(Box<Connect>),
    Bad(DecodeError),
    /// Nothing within the connect timeout, end of stream, another packet, or shutdown.
    Nothing,
}

/// Wait (up to `connect_timeout_ms`) for the first packet. A connection that sends nothing
/// holds no read buffer meanwhile.
async fn read_first<R>(
    broker: &Broker,
    reader: &mut R,
    rbuf: &mut BytesMut,
) -> std::io::Result<First>
where
    R: AsyncRead + Unpin + Send,
{
    let cfg = &broker.config.mqtt;
    let timeout = Duration::from_millis(cfg.connect_timeout_ms);
    let mut shutdown = broker.shutdown_signal();
    let first = tokio::time::timeout(timeout, async {
        loop {
            if *shutdown.borrow_and_update() {
                // Shutting down: a connection that has not sent CONNECT yet just goes.
                return Ok(First::Nothing);
            }
            match decode(rbuf, ProtocolVersion::V5, cfg.max_packet_size_bytes) {
                Ok(Some(Packet::Connect(c))) => {
                    return Ok::<First, std::io::Error>(First::Connect(c))
                }
                Ok(Some(other)) => {
                    debug!(packet_type = other.type_id(), "first packet is not CONNECT");
                    return Ok(First::Nothing);
                }
                Ok(None) => {}
                Err(e) => return Ok(First::Bad(e)),
            }
            tokio::select! {
                n = read_some(reader, rbuf) => {
                    let n = n?;
                    if n == 0 {
                        return Ok(First::Nothing);
                    }
                    broker.stats.bytes_received.fetch_add(n as u64, Ordering::Relaxed);
                }
                _ = shutdown.changed() => {}
            }
        }
    })
    .await;
    match first {
        Err(_) => {
            debug!("no CONNECT within the connect timeout");
            Ok(First::Nothing)
        }
        Ok(r) => r,
    }
}

/// The CONNECT exchange: enhanced authentication when the CONNECT asks for it, then the
/// handshake. Short-lived, so [`run`] boxes it rather than carry its size for the whole life
/// of the connection.
async fn establish<R, W>(
    broker: &Arc<Broker>,
    connect: Box<Connect>,
    reader: &mut R,
    writer: &mut W,
    rbuf: &mut BytesMut,
    peer: SocketAddr,
) -> std::io::Result<Option<Conn>>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send,
{
    let mut connect = *connect;
    let mut enhanced = None;
    if connect.protocol.is_v5() && connect.properties.authentication_method.is_some() {
        enhanced = crate::enhanced_auth::connect_exchange(
            broker,
            &mut connect,
            reader,
            writer,
            rbuf,
            peer,
        )
        .await?;
        if enhanced.is_none() {
            return Ok(None);
        }
    }
    Conn::handshake(broker.clone(), connect, enhanced, peer, writer).await
}

/// The life of a connection. A function returning an `async move` block rather than an
/// `async fn`, whose future would hold a second copy of every argument.
#[allow(clippy::manual_async_fn)]
fn run<R, W>(
    broker: Arc<Broker>,
    mut reader: R,
    mut writer: W,
    peer: SocketAddr,
) -> impl Future<Output = ()> + Send
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send,
{
    async move {
        let mut rbuf = BytesMut::new();
        // `conn` lives in this block only, so that the future's layout can overlap it with the
        // states before it (a local alive at two awaits gets a slot of its own).
        let close_down = {
            let Some(mut conn) =
                accept_connect(&broker, &mut reader, &mut writer, &mut rbuf, peer).await
            else {
                return;
            };
            let close = match conn
                .run_loop(&mut reader, &mut writer, &mut rbuf, None, None)
                .await
            {
                Exit::Close(c) => c,
                // Not asked to hibernate (`hibernate` is `None`).
                Exit::Park(_) => Close::silent(true),
            };
            Box::pin(conn.close_down(close, &mut reader, &mut writer))
        };
        drop(rbuf);
        close_down.await;
    }
}

/// From the first byte to an established connection: the CONNECT (within the connect
/// timeout; a malformed one is answered with a refusing CONNACK), enhanced authentication when
/// it asks for it, the handshake. `None`: the connection ends here.
async fn accept_connect<R, W>(
    broker: &Arc<Broker>,
    reader: &mut R,
    writer: &mut W,
    rbuf: &mut BytesMut,
    peer: SocketAddr,
) -> Option<Conn>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send,
{
    let io_error = |e: std::io::Error| debug!(error = %e, "connection ended with I/O error");
    let connect = match read_first(broker, reader, rbuf).await {
        Ok(First::Connect(c)) => c,
        Ok(First::Bad(err)) => {
            Box::pin(reject_bad_connect(writer, &err)).await;
            return None;
        }
        Ok(First::Nothing) => return None,
        Err(e) => {
            io_error(e);
            return None;
        }
    };
    match Box::pin(establish(broker, connect, reader, writer, rbuf, peer)).await {
        Ok(Some(conn)) => {
            tracing::Span::current().record("client_id", &*conn.client_id);
            Some(conn)
        }
        Ok(None) => None,
        Err(e) => {
            io_error(e);
            None
        }
    }
}

thread_local! {
    /// Where a connection without a read buffer reads (see [`read_some`]); one per thread.
    static READ_SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Read once from `reader` into `rbuf`; `Ok(0)` at the end of the stream. Cancel safe.
///
/// The read goes into this thread's scratch buffer ([`READ_BUFFER_STEP_BYTES`]), and `rbuf`
/// takes a copy of what was read: it holds what a connection has received and not yet
/// decoded, never room for what it might receive. So an idle connection holds no read buffer
/// (an empty one is dropped before waiting), a silent or slow one that sent part of a packet
/// holds only that part, and a large packet grows its buffer geometrically. The packets split
/// off the buffer keep only the read they came in.
fn read_some<'a, R: AsyncRead + Unpin>(
    reader: &'a mut R,
    rbuf: &'a mut BytesMut,
) -> impl Future<Output = std::io::Result<usize>> + 'a {
    std::future::poll_fn(move |cx| poll_read_some(reader, rbuf, cx))
}

fn poll_read_some<R: AsyncRead + Unpin>(
    reader: &mut R,
    rbuf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<std::io::Result<usize>> {
    READ_SCRATCH.with(|scratch| {
        let Ok(mut scratch) = scratch.try_borrow_mut() else {
            // Not expected (no read nests in another on one thread): read in place.
            if rbuf.capacity() - rbuf.len() < READ_ROOM_MIN_BYTES {
                rbuf.reserve(READ_BUFFER_STEP_BYTES);
            }
            return std::pin::pin!(reader.read_buf(&mut *rbuf)).poll(cx);
        };
        if scratch.len() < READ_BUFFER_STEP_BYTES {
            scratch.resize(READ_BUFFER_STEP_BYTES, 0);
        }
        let mut rb = ReadBuf::new(&mut scratch[..]);
        match Pin::new(&mut *reader).poll_read(cx, &mut rb) {
            Poll::Ready(Ok(())) => {
                let filled = rb.filled();
                let n = filled.len();
                if rbuf.capacity() - rbuf.len() < n {
                    // At least doubling: a large packet arrives in many reads.
                    rbuf.reserve(n.max(rbuf.len()));
                }
                rbuf.extend_from_slice(filled);
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                if rbuf.is_empty() {
                    // Nothing buffered: no buffer while waiting. (An empty view of the last
                    // read, its packets split off, would also keep that read's memory.)
                    *rbuf = BytesMut::new();
                }
                Poll::Pending
            }
        }
    })
}

/// `max_publish_rate_per_s` of one connection: a token bucket holding one second of budget.
/// Boxed in [`Conn`], with its own timer, so that connections without a limit carry neither.
struct RateLimit {
    per_s: f64,
    tokens: f64,
    last: Instant,
    /// The budget ran out and has not refilled to 10 ms worth yet.
    paused: bool,
    /// Fires when reading may resume.
    resume: Pin<Box<tokio::time::Sleep>>,
}

impl RateLimit {
    fn new(per_s: u32) -> RateLimit {
        RateLimit {
            per_s: f64::from(per_s),
            tokens: f64::from(per_s),
            last: Instant::now(),
            paused: false,
            resume: Box::pin(tokio::time::sleep(Duration::ZERO)),
        }
    }

    /// One PUBLISH received.
    fn take(&mut self) {
        self.tokens -= 1.0;
    }

    /// When reading may resume, if the budget is spent. A spent budget waits for 10 ms worth
    /// of it (at least one message), so a paced connection is served in batches rather than
    /// one PUBLISH per wake-up (which would also cost the log one write each).
    fn paused_until(&mut self) -> Option<tokio::time::Instant> {
        let now = Instant::now();
        let dt = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.per_s).min(self.per_s);
        let resume_at = if self.paused {
            (self.per_s / 100.0).max(1.0)
        } else {
            1.0
        };
        if self.tokens >= resume_at {
            self.paused = false;
            return None;
        }
        self.paused = true;
        let wait = (resume_at - self.tokens) / self.per_s;
        Some(tokio::time::Instant::from_std(
            now + Duration::from_secs_f64(wait),
        ))
    }
}

/// Wait until `until` on the rate limit's timer; never completes without both.
fn rate_pause<'a>(
    rate: &'a mut Option<Box<RateLimit>>,
    until: Option<tokio::time::Instant>,
) -> impl Future<Output = ()> + 'a {
    std::future::poll_fn(move |cx| match (rate.as_deref_mut(), until) {
        (Some(r), Some(t)) => {
            if r.resume.deadline() != t {
                r.resume.as_mut().reset(t);
            }
            r.resume.as_mut().poll(cx)
        }
        _ => Poll::Pending,
    })
}

/// After a server-sent DISCONNECT and a write shutdown, read and discard what the client still
/// sends for a moment, so closing does not reset the connection before the client has read
/// the DISCONNECT (a reset can discard data not yet read). Bounded in time and bytes.
async fn linger<R: AsyncRead + Unpin>(reader: &mut R) {
    let mut buf = vec![0u8; 4096];
    let mut budget = LINGER_BYTES_MAX;
    let _ = tokio::time::timeout(Duration::from_millis(LINGER_MS), async {
        while budget > 0 {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => budget = budget.saturating_sub(n),
            }
        }
    })
    .await;
}

/// The acknowledgement a PUBLISH is owed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owed {
    Nothing,
    PubAck(u16),
    PubRec(u16),
}

/// A PUBLISH waiting for the store (or an acknowledgement waiting behind one).
struct PendingPub {
    msg: Option<Arc<Message>>,
    ack: Owed,
    code: u8,
    /// Waits for a store completion (a stored message, delivered or not yet).
    counted: bool,
    /// Index ops to submit once durable (for a message delivered before that).
    after: Vec<Op>,
    /// Log offset of the record waited for (`u64::MAX` when not counted).
    offset: u64,
}

/// Filled by store callbacks (on the storage thread), read by the connection task.
struct Completions {
    ok: AtomicU64,
    failed: AtomicBool,
    waker: Arc<ConnWaker>,
}

struct Conn {
    broker: Arc<Broker>,
    version: ProtocolVersion,
    client_id: Arc<str>,
    session: Arc<Session>,
    generation: u64,
    waker: Arc<ConnWaker>,
    /// 1.5 x the granted keep alive, in milliseconds (0: none). At most 98,302,500.
    keep_alive_ms: u32,
    /// Outbound QoS 1/2 window: min(client Receive Maximum, max_inflight_messages).
    send_window: u16,
    /// Largest packet the client accepts.
    client_max_packet: u32,
    /// Client's Topic Alias Maximum (server-to-client aliases).
    client_alias_max: u16,
    inbound_aliases: LazyMap<u16, Arc<str>>,
    outbound_aliases: LazyMap<Arc<str>, u16>,
    problem_info: bool,
    will: Option<Box<Will>>,
    /// Session Expiry Interval from CONNECT, possibly updated by DISCONNECT.
    session_expiry_s: u32,
    wbuf: BytesMut,
    /// `max_publish_rate_per_s`: reading pauses while the budget is spent.
    rate: Option<Box<RateLimit>>,
    /// Username as presented in CONNECT (authenticated when a password file is in use).
    username: Option<Arc<str>>,
    /// Stored PUBLISHes not yet durable, in arrival order.
    pending: LazyDeque<PendingPub>,
    completions: Arc<Completions>,
    /// Completions consumed from `completions.ok`.
    completed: u64,
    /// First log offset this connection has appended but not routed (for the watermark).
    low: Arc<AtomicU64>,
    /// Write barriers: bytes from this absolute position wait for this index ticket.
    barriers: LazyDeque<(u64, u64)>,
    /// Bytes written to the socket so far.
    abs_written: u64,
    peer: SocketAddr,
    /// Feeder task of each stream subscription, by full filter.
    feeders: LazyMap<String, tokio::task::JoinHandle<()>>,
    /// Enhanced authentication: the method and user, and a re-authentication in progress.
    enhanced: Option<Box<crate::enhanced_auth::Live>>,
    /// A subscriber dropped QoS 0 messages of this client's last read (its queue was full):
    /// the task yields once before reading again, so that the subscriber's connection gets
    /// the CPU before more of what it cannot take is read. Never a wait: a stuck subscriber
    /// costs this client one trip through the scheduler per read.
    yield_before_read: bool,
    /// A SUBSCRIBE or UNSUBSCRIBE waits in the read buffer until the PUBLISHes this client
    /// sent before it took effect (were routed, and set the retained table): packets of one
    /// connection take effect in the order they were sent. Reading pauses meanwhile.
    held: bool,
    /// The last topic this client published on, its ACL answer and its route; taken with
    /// the first PUBLISH (a connection that only subscribes never holds one).
    last_topic: Option<Box<LastTopic>>,
}

/// What a connection remembers of the last topic it published on: a client usually
/// publishes on one topic, or a few, over and over.
#[derive(Default)]
struct LastTopic {
    /// The topic; its `Arc` is shared by every message published on it.
    topic: Option<Arc<str>>,
    /// [`Broker::auth_generation`] of `allowed` (0: not checked yet).
    acl_generation: u64,
    allowed: bool,
    route: crate::router::RouteCache,
    /// QoS 0 messages of the current read nobody waits for, not appended yet.
    quiet: Vec<Message>,
    /// When the first of them was received (µs since the epoch): their timestamp.
    quiet_at: u64,
}

/// At most this many QoS 0 messages are batched ([`Conn::flush_quiet`]).
const QUIET_BATCH_MAX: usize = 256;

/// The topic alias of an outbound PUBLISH (see [`Conn::alias_plan`]).
#[derive(Debug, Clone, Copy)]
enum AliasPlan {
    None,
    Existing(u16),
    New(u16),
}

/// At most this many deliveries are taken from the session queue per lock.
const DRAIN_BATCH: usize = 256;

/// A delivery taken from the session queue, encoded once the lock is released.
struct Outgoing {
    /// For QoS 1/2 a copy with what the PUBLISH needs (the delivery itself is in flight).
    d: Delivery,
    pid: u16,
    dup: bool,
    /// The index ticket the packet waits for (QoS 2: its packet id durable).
    ticket: Option<u64>,
}

/// What one [`Conn::drain`] did, added to the broker's counters once.
#[derive(Default)]
struct DrainCounts {
    expired: u64,
    too_large: u64,
    qos: [u64; 3],
    bytes_qos: [u64; 3],
}

impl DrainCounts {
    fn record(&self, stats: &crate::broker::Stats) {
        let sent: u64 = self.qos.iter().sum();
        if sent > 0 {
            stats.messages_sent.fetch_add(sent, Ordering::Relaxed);
        }
        if self.too_large > 0 {
            stats
                .messages_dropped
                .fetch_add(self.too_large, Ordering::Relaxed);
            stats
                .dropped_too_large
                .fetch_add(self.too_large, Ordering::Relaxed);
        }
        if self.expired > 0 {
            stats
                .dropped_expired
                .fetch_add(self.expired, Ordering::Relaxed);
        }
        for q in 0..3 {
            if self.qos[q] > 0 {
                stats.sent_qos[q].fetch_add(self.qos[q], Ordering::Relaxed);
                stats.sent_payload_bytes_qos[q].fetch_add(self.bytes_qos[q], Ordering::Relaxed);
            }
        }
    }
}

impl Conn {
    /// On session resume, send every unacknowledged PUBLISH again with DUP=1 and every PUBREL
    /// [MQTT-4.4.0-1].
    fn resend_inflight(&mut self) {
        let now = Instant::now();
        let entries: Vec<Inflight> = self.session.lock().inflight.iter().cloned().collect();
        for e in entries {
            match e.stage {
                InflightStage::PubComp => {
                    self.encode(&Packet::PubRel(PubResp::new(e.packet_id, rc::SUCCESS)));
                }
                _ => self.encode_delivery(&e.delivery, e.packet_id, true, now),
            }
        }
    }

    fn encode(&mut self, p: &Packet) {
        if self.wbuf.capacity() == 0 {
            // Released while idle: take a small one (it grows by doubling if need be).
            self.wbuf.reserve(WRITE_BUFFER_MIN_BYTES);
        }
        encode(p, self.version, &mut self.wbuf);
    }

    /// An acknowledgement, with its properties stripped if the client asked for no problem
    /// information or the packet would exceed the client's Maximum Packet Size.
    fn encode_ack(&mut self, mut p: Packet) {
        let strip = |props: &mut AckProperties| {
            props.reason_string = None;
            props.user_properties.clear();
        };
        let props = match &mut p {
            Packet::PubAck(r) | Packet::PubRec(r) | Packet::PubRel(r) | Packet::PubComp(r) => {
                Some(&mut r.properties)
            }
            Packet::SubAck(s) => Some(&mut s.properties),
            Packet::UnsubAck(u) => Some(&mut u.properties),
            _ => None,
        };
        if let Some(props) = props {
            if !self.problem_info {
                strip(props);
            }
        }
        if encoded_len(&p, self.version) > self.client_max_packet as usize {
            match &mut p {
                Packet::PubAck(r) | Packet::PubRec(r) | Packet::PubRel(r) | Packet::PubComp(r) => {
                    strip(&mut r.properties)
                }
                Packet::SubAck(s) => strip(&mut s.properties),
                Packet::UnsubAck(u) => strip(&mut u.properties),
                _ => {}
            }
        }
        self.encode(&p);
    }

    /// An acknowledgement from the client for packet id `pid`: if a delivery with that id is
    /// in flight, its stage must be one of `allowed` (a PUBREC for a QoS 1 message, a PUBACK
    /// for a QoS 2 one or a PUBCOMP before the PUBREL is a protocol error, MQTT 5 4.13: the
    /// connection ends, with DISCONNECT 0x82 for MQTT 5). An id not in flight is left to the
    /// caller (ignored, or answered with 0x92).
    fn expect_stage(&self, pid: u16, allowed: &[InflightStage]) -> Result<(), Close> {
        let st = self.session.lock();
        match st.inflight.iter().find(|f| f.packet_id == pid) {
            Some(f) if !allowed.contains(&f.stage) => {
                debug!(pid, stage = ?f.stage, "acknowledgement of the wrong kind");
                Err(Close::error(rc::PROTOCOL_ERROR))
            }
            _ => Ok(()),
        }
    }

    /// The topic alias a PUBLISH of `topic` would carry now (MQTT 5 with outbound aliases):
    /// one already assigned, a new one while the client's Topic Alias Maximum allows, or none.
    fn alias_plan(&self, topic: &Arc<str>) -> AliasPlan {
        if !self.version.is_v5() || self.client_alias_max == 0 {
            return AliasPlan::None;
        }
        if let Some(a) = self.outbound_aliases.get(topic) {
            AliasPlan::Existing(*a)
        } else if self.outbound_aliases.len() < usize::from(self.client_alias_max) {
            AliasPlan::New((self.outbound_aliases.len() + 1) as u16)
        } else {
            AliasPlan::None
        }
    }

    /// The outbound PUBLISH of a delivery, borrowing the stored message: with `alias`, the
    /// topic is left out if the alias is already known to the client.
    fn publish_out<'d>(
        &self,
        d: &'d Delivery,
        pid: u16,
        dup: bool,
        now: Instant,
        alias: AliasPlan,
    ) -> PublishOut<'d> {
        let v5 = self.version.is_v5();
        let (topic, topic_alias) = match alias {
            AliasPlan::None => (&*d.msg.topic, None),
            AliasPlan::Existing(a) => ("", Some(a)),
            AliasPlan::New(a) => (&*d.msg.topic, Some(a)),
        };
        PublishOut {
            dup,
            qos: d.qos,
            retain: d.retain,
            topic,
            packet_id: pid,
            properties: &d.msg.properties,
            message_expiry_interval: if v5 {
                d.msg.remaining_expiry_s(now)
            } else {
                None
            },
            topic_alias,
            subscription_identifiers: if v5 { &d.sub_ids } else { &[] },
            payload: &d.msg.payload,
        }
    }

    /// Encode a delivery into the write buffer (assigning a new topic alias if one is free).
    fn encode_delivery(&mut self, d: &Delivery, pid: u16, dup: bool, now: Instant) {
        let plan = self.alias_plan(&d.msg.topic);
        if let AliasPlan::New(a) = plan {
            self.outbound_aliases.insert(d.msg.topic.clone(), a);
        }
        if self.wbuf.capacity() == 0 {
            self.wbuf.reserve(WRITE_BUFFER_MIN_BYTES);
        }
        let out = self.publish_out(d, pid, dup, now, plan);
        out.encode(self.version, &mut self.wbuf);
    }

    /// Does the PUBLISH of `d` fit the client's Maximum Packet Size? `sure` is the quick
    /// answer for a batch (whatever alias the packet ends up with); otherwise the exact one for
    /// the alias it would get now.
    fn fits(&self, d: &Delivery, now: Instant, sure: bool) -> bool {
        let full = self
            .publish_out(d, 1, false, now, AliasPlan::None)
            .encoded_len(self.version);
        // A new alias adds its 3-byte property, and may lengthen two length varints.
        if full + 5 <= self.client_max_packet as usize {
            return true;
        }
        if sure {
            return false;
        }
        let plan = self.alias_plan(&d.msg.topic);
        self.publish_out(d, 1, false, now, plan)
            .encoded_len(self.version)
            <= self.client_max_packet as usize
    }

    /// Bring spilled queue entries (log positions) back into memory, reading the log without
    /// the session lock. [`Conn::drain`] calls it when the in-memory part runs low.
    fn refill(&mut self) {
        let entries = self.session.peek_spilled(REFILL_BATCH, REFILL_BYTES_MAX);
        let read = self.broker.read_spilled(&self.client_id, entries);
        let lost = self.session.lock().take_spilled(read);
        for sp in lost {
            self.forget_delivery(sp.seq, None);
        }
    }

    /// Move deliveries from the session queue into the write buffer, within the inflight
    /// window and the write high-water mark. Returns a kick if the connection must end.
    ///
    /// Deliveries are taken in batches under the session lock (packet ids, the inflight
    /// window, the index ops) and encoded after it is released: the publishers pushing into
    /// this session wait for the bookkeeping only, never for the encoding.
    fn drain(&mut self) -> Option<Kick> {
        let session = self.session.clone();
        let mut st = session.lock();
        if st.ended || st.generation != self.generation {
            return Some(Kick::TakenOver);
        }
        if let Some(k) = st.kick.take() {
            return Some(k);
        }
        if !st.spilled.is_empty() && st.queue.len() < REFILL_LOW {
            drop(st);
            self.refill();
            st = session.lock();
        }
        // After the refill: a message read back from the log that has expired is due now.
        let now = Instant::now();
        let mut n = DrainCounts::default();
        if self.wbuf.capacity() == 0 && !st.queue.is_empty() {
            // Released while idle: size it for what is queued, up to the high-water mark.
            let want = st
                .queued_bytes()
                .clamp(WRITE_BUFFER_MIN_BYTES, WRITE_HIGH_WATER_BYTES);
            self.wbuf.reserve(want);
        }
        let mut batch: Vec<Outgoing> = Vec::new();
        loop {
            // Under the lock: take what fits the write buffer.
            let mut planned = self.wbuf.len();
            while planned < WRITE_HIGH_WATER_BYTES && batch.len() < DRAIN_BATCH {
                let Some(front) = st.queue.front() else { break };
                if front.qos != QoS::AtMostOnce
                    && st.inflight.len() >= usize::from(self.send_window)
                {
                    break;
                }
                let Some(d) = st.pop_queue() else { break };
                if d.msg.is_expired(now) {
                    n.expired += 1;
                    self.discard(&d);
                    continue;
                }
                if !self.fits(&d, now, true) {
                    // Near the client's Maximum Packet Size: decided alone, with the alias
                    // it would get after what is batched before it has been encoded.
                    if !batch.is_empty() {
                        st.unpop_queue(d);
                        break;
                    }
                    if !self.fits(&d, now, false) {
                        // [MQTT-3.1.2-25]: discard as if delivered.
                        self.discard(&d);
                        n.too_large += 1;
                        continue;
                    }
                }
                let pid = if d.qos == QoS::AtMostOnce {
                    0
                } else {
                    match st.alloc_pid() {
                        Some(pid) => pid,
                        None => {
                            st.unpop_queue(d);
                            break;
                        }
                    }
                };
                let mut ticket = None;
                if d.seq != 0 && d.qos != QoS::AtMostOnce {
                    let stage = if d.qos == QoS::ExactlyOnce { 2 } else { 1 };
                    let t = self.broker.persist.submit(Op::InflightPut {
                        client: self.client_id.clone(),
                        pid,
                        seq: d.seq,
                        stage,
                    });
                    if stage == 2 {
                        // A QoS 2 PUBLISH goes out only once its packet id is durable, so that
                        // a resend after a crash carries the same id and the client
                        // de-duplicates it.
                        ticket = Some(t);
                    }
                }
                planned += d.msg.cost();
                let dup = d.lane.is_some_and(|t| t.dup);
                let d = if d.qos == QoS::AtMostOnce {
                    d
                } else {
                    let copy = Delivery {
                        msg: d.msg.clone(),
                        qos: d.qos,
                        retain: d.retain,
                        sub_ids: d.sub_ids.clone(),
                        share: None,
                        seq: 0,
                        stream: None,
                        lane: None,
                    };
                    let stage = if d.qos == QoS::AtLeastOnce {
                        InflightStage::PubAck
                    } else {
                        InflightStage::PubRec
                    };
                    st.inflight.push_back(Inflight {
                        packet_id: pid,
                        stage,
                        delivery: d,
                    });
                    copy
                };
                batch.push(Outgoing {
                    d,
                    pid,
                    dup,
                    ticket,
                });
            }
            if st.queue.is_empty() && st.queue.capacity() > TRIM_QUEUE_CAPACITY {
                st.trim();
            }
            if batch.is_empty() {
                break;
            }
            drop(st);
            // Without the lock: encode (the last reference to a message may go here too).
            for o in batch.drain(..) {
                if let Some(t) = o.ticket {
                    self.barrier(t);
                }
                self.encode_delivery(&o.d, o.pid, o.dup, now);
                let q = o.d.qos.as_u8() as usize & 3;
                if let (Some(c), Some(b)) = (n.qos.get_mut(q), n.bytes_qos.get_mut(q)) {
                    *c += 1;
                    *b += o.d.msg.payload.len() as u64;
                }
                if o.d.qos == QoS::AtMostOnce {
                    if let Some(t) = &o.d.stream {
                        t.done();
                    }
                    if let Some(t) = o.d.lane {
                        self.broker.lite.done(t);
                    }
                }
            }
            st = session.lock();
            if st.ended || st.generation != self.generation {
                drop(st);
                n.record(&self.broker.stats);
                return Some(Kick::TakenOver);
            }
        }
        drop(st);
        n.record(&self.broker.stats);
        None
    }

    /// A delivery taken from the queue that will not be sent (expired, too large): its queue
    /// entry is forgotten and its stream or lane is told.
    fn discard(&self, d: &Delivery) {
        self.forget_delivery(d.seq, None);
        if let Some(t) = &d.stream {
            t.done();
        }
        if let Some(t) = d.lane {
            self.broker.lite.done(t);
        }
    }

    /// The socket loop. A function returning an `async move` block rather than an `async fn`,
    /// whose future would hold a second copy of every argument.
    ///
    /// `keep_alive_at`: the keep-alive deadline of a connection coming back from the parking
    /// lot (otherwise one keep-alive from now). `hibernate`: how long the connection may have
    /// nothing to do before it returns [`Exit::Park`] (`None`: it never does).
    #[allow(clippy::manual_async_fn)]
    fn run_loop<'a, R, W>(
        &'a mut self,
        reader: &'a mut R,
        writer: &'a mut W,
        rbuf: &'a mut BytesMut,
        keep_alive_at: Option<tokio::time::Instant>,
        hibernate: Option<Hibernate>,
    ) -> impl Future<Output = Exit> + Send + 'a
    where
        R: AsyncRead + Unpin + Send,
        W: AsyncWrite + Unpin + Send,
    {
        async move {
            let max_packet = self.broker.config.mqtt.max_packet_size_bytes;
            let start = tokio::time::Instant::now();
            let mut ka_at = keep_alive_at.or_else(|| self.keep_alive().map(|ka| start + ka));
            // When the connection last read, wrote or was woken, and how long it may then be
            // idle before it hibernates (`Hibernate::first` until it is active past that).
            let mut last_active = start;
            let mut idle_limit = hibernate.map(|h| h.first);
            let mut check_at = idle_limit.map(|l| start + l);
            let timed = ka_at.is_some() || check_at.is_some();
            let deadline = tokio::time::sleep_until(timer_at(ka_at, check_at, start));
            tokio::pin!(deadline);
            // Packets already buffered behind CONNECT.
            if !rbuf.is_empty() {
                if let Err(c) = self.process_input(rbuf, max_packet) {
                    return Exit::Close(c);
                }
            }
            loop {
                if self.rate.is_some() && !rbuf.is_empty() {
                    // Packets left in the buffer by a rate-limit pause.
                    if let Err(c) = self.process_input(rbuf, max_packet) {
                        return Exit::Close(c);
                    }
                }
                if let Err(c) = self.process_completions() {
                    return Exit::Close(c);
                }
                if self.held && !self.unrouted() {
                    // The PUBLISHes before a held SUBSCRIBE / UNSUBSCRIBE took effect.
                    self.held = false;
                    if let Err(c) = self.process_input(rbuf, max_packet) {
                        return Exit::Close(c);
                    }
                }
                if let Some(kick) = self.drain() {
                    return Exit::Close(match kick {
                        Kick::TakenOver => Close {
                            reason: Some(rc::SESSION_TAKEN_OVER),
                            will: true,
                        },
                        Kick::SlowConsumer => {
                            self.broker
                                .queue_budget
                                .slow_consumers_disconnected
                                .fetch_add(1, Ordering::Relaxed);
                            warn!(
                                client_id = %self.client_id,
                                peer = %self.peer,
                                "slow consumer: queue limit reached, disconnecting"
                            );
                            Close::error(rc::QUOTA_EXCEEDED)
                        }
                        Kick::Shutdown => Close {
                            reason: Some(rc::SERVER_SHUTTING_DOWN),
                            will: false,
                        },
                        Kick::NotAuthorized => Close::error(rc::NOT_AUTHORIZED),
                        Kick::Administrative => {
                            warn!(
                                client_id = %self.client_id,
                                peer = %self.peer,
                                "kicked over the admin API"
                            );
                            Close::error(rc::ADMINISTRATIVE_ACTION)
                        }
                    });
                }
                let writable = self.writable();
                let writing = writable > 0;
                // Release the write buffer once everything is written and nothing is queued (the
                // read buffer is released by `read_some`): an idle connection holds neither. (An
                // empty buffer may still hold its allocation with no capacity left: written data
                // is advanced past, not moved.)
                if self.wbuf.is_empty() && self.session.lock().queue.is_empty() {
                    self.wbuf = BytesMut::new();
                    if self.barriers.is_empty() {
                        self.barriers.clear();
                    }
                }
                if self.yield_before_read {
                    self.yield_before_read = false;
                    tokio::task::yield_now().await;
                    continue;
                }
                let paused = self.rate.as_mut().and_then(|r| r.paused_until());
                tokio::select! {
                    biased;
                    res = writer.write(&self.wbuf[..writable]), if writing => {
                        if hibernate.is_some() {
                            last_active = tokio::time::Instant::now();
                        }
                        match res {
                            Ok(0) | Err(_) => return Exit::Close(Close::silent(true)),
                            Ok(n) => {
                                bytes::Buf::advance(&mut self.wbuf, n);
                                self.abs_written += n as u64;
                                self.broker.stats.bytes_sent.fetch_add(n as u64, Ordering::Relaxed);
                            }
                        }
                    }
                    _ = rate_pause(&mut self.rate, paused), if paused.is_some() => {
                        let now = tokio::time::Instant::now();
                        last_active = now;
                        // Not reading was our choice: the client's keep alive starts afresh.
                        if let Some(ka) = self.keep_alive() {
                            ka_at = Some(now + ka);
                            deadline.as_mut().reset(timer_at(ka_at, check_at, now));
                        }
                    }
                    res = read_some(reader, rbuf), if paused.is_none() && !self.held => {
                        match res {
                            Ok(0) | Err(_) => return Exit::Close(Close::silent(true)),
                            Ok(n) => {
                                self.broker.stats.bytes_received.fetch_add(n as u64, Ordering::Relaxed);
                                if timed {
                                    last_active = tokio::time::Instant::now();
                                }
                                if let Some(ka) = self.keep_alive() {
                                    let now = last_active;
                                    ka_at = Some(now + ka);
                                    deadline.as_mut().reset(timer_at(ka_at, check_at, now));
                                }
                                if let Err(c) = self.process_input(rbuf, max_packet) {
                                    return Exit::Close(c);
                                }
                            }
                        }
                    }
                    _ = self.waker.notified() => {
                        if hibernate.is_some() {
                            last_active = tokio::time::Instant::now();
                        }
                    }
                    _ = &mut deadline, if timed => {
                        let now = tokio::time::Instant::now();
                        if ka_at.is_some_and(|t| now >= t) {
                            debug!("keep alive timeout");
                            return Exit::Close(Close::error(rc::KEEP_ALIVE_TIMEOUT));
                        }
                        if let (Some(h), Some(limit)) = (hibernate, idle_limit) {
                            if now >= last_active + limit {
                                if self.can_hibernate(rbuf) {
                                    self.shed();
                                    return Exit::Park(ka_at);
                                }
                                // Idle, but something is still held (a store completion, a
                                // rate pause): look again later.
                                check_at = Some(now + h.after);
                            } else {
                                // Active past the first period: from now on the full one.
                                let limit = if last_active >= start + h.first {
                                    h.after
                                } else {
                                    limit
                                };
                                idle_limit = Some(limit);
                                check_at = Some(last_active + limit);
                            }
                        }
                        deadline.as_mut().reset(timer_at(ka_at, check_at, now));
                    }
                }
            }
        }
    }

    /// The keep-alive deadline's distance (1.5 x the granted keep alive), if there is one.
    fn keep_alive(&self) -> Option<Duration> {
        (self.keep_alive_ms > 0).then(|| Duration::from_millis(u64::from(self.keep_alive_ms)))
    }

    /// Gives back what a hibernating connection does not need: the empty queue of stored
    /// publishes (its capacity), the last topic's cache (route, ACL answer, batch room; taken
    /// again with the next PUBLISH) and the session's empty queues.
    fn shed(&mut self) {
        self.pending.clear();
        self.last_topic = None;
        self.session.lock().trim();
    }

    /// Nothing buffered either way, nothing waiting for the store or the index, nothing to
    /// send: the connection's state is all in `self` and its session, and only input, a
    /// wake-up or the keep-alive deadline can give it work.
    fn can_hibernate(&mut self, rbuf: &BytesMut) -> bool {
        if !(rbuf.is_empty()
            && self.wbuf.is_empty()
            && self.pending.is_empty()
            && self.barriers.is_empty()
            && !self.yield_before_read
            && self.last_topic.as_ref().is_none_or(|t| t.quiet.is_empty()))
        {
            return false;
        }
        if self
            .rate
            .as_mut()
            .is_some_and(|r| r.paused_until().is_some())
        {
            return false;
        }
        let st = self.session.lock();
        st.queue.is_empty() && st.spilled.is_empty()
    }

    /// Decode and handle every complete packet in `rbuf`; the QoS 0 messages batched on the
    /// way are appended and delivered before it returns, whatever the outcome.
    fn process_input(&mut self, rbuf: &mut BytesMut, max_packet: u32) -> Result<(), Close> {
        let r = self.process_packets(rbuf, max_packet);
        self.flush_quiet()?;
        r
    }

    fn process_packets(&mut self, rbuf: &mut BytesMut, max_packet: u32) -> Result<(), Close> {
        loop {
            if self
                .rate
                .as_mut()
                .is_some_and(|r| r.paused_until().is_some())
            {
                // Over `max_publish_rate_per_s`: the rest waits in the buffer.
                return Ok(());
            }
            // A SUBSCRIBE or UNSUBSCRIBE behind PUBLISHes that wait for the store waits for
            // them to be routed ([`Conn::held`]; the run loop goes on once they are).
            if matches!(rbuf.first().map(|b| b >> 4), Some(8 | 10)) && self.unrouted() {
                self.held = true;
                return Ok(());
            }
            match decode(rbuf, self.version, max_packet) {
                Ok(Some(p)) => {
                    if !matches!(&p, Packet::Publish(x) if x.qos == QoS::AtMostOnce) {
                        // What was published before a SUBSCRIBE, an UNSUBSCRIBE or any other
                        // packet is delivered before it is handled.
                        self.flush_quiet()?;
                    }
                    self.handle(p)?
                }
                Ok(None) => return Ok(()),
                Err(e) => {
                    debug!(error = %e, "invalid packet");
                    return Err(Close::error(e.reason_code()));
                }
            }
        }
    }

    /// Some PUBLISH of this connection is stored but not routed yet (it is routed once
    /// durable, [`Conn::process_completions`]).
    fn unrouted(&self) -> bool {
        self.pending.iter().any(|p| p.msg.is_some())
    }

    fn handle(&mut self, p: Packet) -> Result<(), Close> {
        match p {
            Packet::Publish(p) => {
                if let Some(r) = &mut self.rate {
                    r.take();
                }
                self.on_publish(p)
            }
            Packet::PubAck(r) => {
                // PUBACK for a QoS 2 delivery in flight [MQTT-4.13]: a protocol error.
                self.expect_stage(r.packet_id, &[InflightStage::PubAck])?;
                let done = self
                    .session
                    .lock()
                    .take_inflight(r.packet_id, InflightStage::PubAck);
                if let Some(t) = done.as_ref().and_then(|d| d.delivery.lane) {
                    self.broker
                        .lite
                        .ack(t, r.reason_code, &r.properties.user_properties);
                }
                // Any PUBACK (even for a revoked packet id) clears a lane stuck mark.
                if self.session.clear_lane_stuck() {
                    self.broker.lite.alive(self.session.clone());
                }
                self.forget(done.as_ref());
                Ok(())
            }
            Packet::PubRec(r) => {
                // PUBREC for a QoS 1 delivery in flight: a protocol error (a repeated PUBREC
                // after our PUBREL is answered with the PUBREL again).
                self.expect_stage(
                    r.packet_id,
                    &[InflightStage::PubRec, InflightStage::PubComp],
                )?;
                let mut st = self.session.lock();
                let pos = st
                    .inflight
                    .iter()
                    .position(|f| f.packet_id == r.packet_id && f.stage == InflightStage::PubRec);
                let known = match pos {
                    Some(_) if r.reason_code >= 0x80 => {
                        let done = st.take_inflight(r.packet_id, InflightStage::PubRec);
                        drop(st);
                        self.forget(done.as_ref());
                        return Ok(());
                    }
                    Some(i) => {
                        st.inflight[i].stage = InflightStage::PubComp;
                        let seq = st.inflight[i].delivery.seq;
                        drop(st);
                        if seq != 0 {
                            // PUBREL only once "received" is durable: after a crash the
                            // message must come back as PUBREL, never as a new PUBLISH.
                            let t = self.broker.persist.submit(Op::InflightPut {
                                client: self.client_id.clone(),
                                pid: r.packet_id,
                                seq,
                                stage: 3,
                            });
                            self.barrier(t);
                        }
                        true
                    }
                    None => {
                        let k = st.inflight.iter().any(|f| {
                            f.packet_id == r.packet_id && f.stage == InflightStage::PubComp
                        });
                        drop(st);
                        k
                    }
                };
                let code = if known {
                    rc::SUCCESS
                } else {
                    rc::PACKET_IDENTIFIER_NOT_FOUND
                };
                self.encode_ack(Packet::PubRel(PubResp::new(r.packet_id, code)));
                Ok(())
            }
            Packet::PubComp(r) => {
                // PUBCOMP for a QoS 1 delivery, or before our PUBREL: a protocol error.
                self.expect_stage(r.packet_id, &[InflightStage::PubComp])?;
                let done = self
                    .session
                    .lock()
                    .take_inflight(r.packet_id, InflightStage::PubComp);
                self.forget(done.as_ref());
                Ok(())
            }
            Packet::PubRel(r) => {
                let known = self.session.lock().inbound_qos2.remove(&r.packet_id);
                if known && self.persistent() {
                    // PUBCOMP only once the release is durable, so a restarted broker never
                    // mistakes the publisher's next message with this packet id for a resend.
                    let t = self.broker.persist.submit(Op::InboundRelease {
                        client: self.client_id.clone(),
                        pid: r.packet_id,
                    });
                    self.barrier(t);
                }
                let code = if known {
                    rc::SUCCESS
                } else {
                    rc::PACKET_IDENTIFIER_NOT_FOUND
                };
                self.encode_ack(Packet::PubComp(PubResp::new(r.packet_id, code)));
                Ok(())
            }
            Packet::Subscribe(s) => self.on_subscribe(s),
            Packet::Unsubscribe(u) => {
                self.on_unsubscribe(u);
                Ok(())
            }
            Packet::PingReq => {
                self.encode(&Packet::PingResp);
                Ok(())
            }
            Packet::Disconnect(d) => self.on_disconnect(d),
            Packet::Auth(a) => {
                // An AUTH without a method in CONNECT is a Protocol Error [MQTT-4.12.0-7].
                let Some(live) = self.enhanced.as_mut() else {
                    return Err(Close::error(rc::PROTOCOL_ERROR));
                };
                let reply = live.on_auth(&self.broker, a).map_err(Close::error)?;
                self.encode(&reply);
                Ok(())
            }
            Packet::Connect(_) => Err(Close::error(rc::PROTOCOL_ERROR)),
            Packet::ConnAck(_) | Packet::SubAck(_) | Packet::UnsubAck(_) | Packet::PingResp => {
                Err(Close::error(rc::PROTOCOL_ERROR))
            }
        }
    }

    fn on_disconnect(&mut self, d: Disconnect) -> Result<(), Close> {
        if let Some(e) = d.properties.session_expiry_interval {
            if self.session_expiry_s == 0 && e != 0 {
                // [MQTT-3.14.2-2]
                return Err(Close::error(rc::PROTOCOL_ERROR));
            }
            self.session_expiry_s = e.min(self.broker.config.mqtt.max_session_expiry_s);
            let mut st = self.session.lock();
            if st.generation == self.generation {
                st.expiry_s = self.session_expiry_s;
            }
        }
        Err(Close::silent(d.reason_code != rc::NORMAL_DISCONNECTION))
    }

    /// Does this session outlive the connection (so its state is persisted)?
    fn persistent(&self) -> bool {
        self.session_expiry_s > 0
    }

    /// A delivery is finished (acknowledged, refused, or discarded): drop its persisted state.
    fn forget(&self, done: Option<&Inflight>) {
        if let Some(e) = done {
            self.forget_delivery(e.delivery.seq, Some(e.packet_id));
            if let Some(t) = &e.delivery.stream {
                t.done();
            }
        }
    }

    fn forget_delivery(&self, seq: u64, pid: Option<u16>) {
        if seq == 0 {
            return;
        }
        // Queue entry first: if a crash keeps only a prefix of these ops, an inflight entry
        // without its queue entry is ignored at restore, whereas a queue entry without its
        // inflight state would be sent again as a new message (a QoS 2 duplicate).
        let client = self.client_id.clone();
        self.broker.persist.submit(Op::QueueRemove {
            client: client.clone(),
            seq,
        });
        if let Some(pid) = pid {
            self.broker
                .persist
                .submit(Op::InflightRemove { client, pid });
        }
    }

    /// Hold everything encoded from now on until the index has flushed `ticket`.
    fn barrier(&mut self, ticket: u64) {
        let at = self.abs_written + self.wbuf.len() as u64;
        self.barriers.push_back((at, ticket));
        self.broker.persist.submit(Op::Wake(self.waker.clone()));
    }

    /// Bytes of the write buffer that may be written now.
    fn writable(&mut self) -> usize {
        let flushed = self.broker.persist.flushed();
        while self.barriers.front().is_some_and(|&(_, t)| t <= flushed) {
            self.barriers.pop_front();
        }
        match self.barriers.front() {
            Some(&(at, _)) => (at.saturating_sub(self.abs_written) as usize).min(self.wbuf.len()),
            None => self.wbuf.len(),
        }
    }
}
