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

use crate::broker::Broker;
use crate::message::{Delivery, Message};
use crate::persist::{Op, SessionMeta};
use crate::router::Subscriber;
use crate::session::{Inflight, InflightStage, Kick, Session, Subscription};
use crate::stream_sub::StreamSub;
use bytes::BytesMut;
use lanemq_acl::{Action, Request};
use lanemq_protocol::reason as rc;
use lanemq_protocol::topic;
use lanemq_protocol::{
    decode, encode, encoded_len, AckProperties, ConnAck, ConnAckProperties, Connect, DecodeError,
    Disconnect, Packet, ProtocolVersion, PubResp, Publish, QoS, SubAck, Subscribe, UnsubAck,
    Unsubscribe, Will,
};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;
use tracing::{debug, info_span, warn, Instrument};

/// The write buffer is filled from the session queue up to this size.
const WRITE_HIGH_WATER_BYTES: usize = 64 * 1024;
/// Read buffer capacity while a connection is idle (memory per idle connection matters).
const READ_BUFFER_IDLE_BYTES: usize = 512;
/// Read buffer growth step when it runs out of room.
const READ_BUFFER_STEP_BYTES: usize = 16 * 1024;
/// Buffers above this capacity are released once empty.
const BUFFER_SHRINK_BYTES: usize = 64 * 1024;
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
pub async fn serve_connection<R, W>(broker: Arc<Broker>, reader: R, writer: W, peer: SocketAddr)
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send,
{
    let span = info_span!("conn", %peer, client_id = tracing::field::Empty);
    async move {
        if let Err(e) = run(broker, reader, writer, peer).await {
            debug!(error = %e, "connection ended with I/O error");
        }
    }
    .instrument(span)
    .await
}

async fn run<R, W>(
    broker: Arc<Broker>,
    mut reader: R,
    mut writer: W,
    peer: SocketAddr,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send,
{
    let cfg = &broker.config.mqtt;
    let mut rbuf = BytesMut::with_capacity(READ_BUFFER_IDLE_BYTES);
    let timeout = Duration::from_millis(cfg.connect_timeout_ms);
    enum First {
        Packet(Packet),
        Bad(DecodeError),
        Eof,
    }
    let mut shutdown = broker.shutdown_signal();
    let first = tokio::time::timeout(timeout, async {
        loop {
            if *shutdown.borrow_and_update() {
                // Shutting down: a connection that has not sent CONNECT yet just goes.
                return Ok(First::Eof);
            }
            match decode(&mut rbuf, ProtocolVersion::V5, cfg.max_packet_size_bytes) {
                Ok(Some(p)) => return Ok::<First, std::io::Error>(First::Packet(p)),
                Ok(None) => {}
                Err(e) => return Ok(First::Bad(e)),
            }
            tokio::select! {
                n = reader.read_buf(&mut rbuf) => {
                    let n = n?;
                    if n == 0 {
                        return Ok(First::Eof);
                    }
                    broker.stats.bytes_received.fetch_add(n as u64, Ordering::Relaxed);
                }
                _ = shutdown.changed() => {}
            }
        }
    })
    .await;
    let connect = match first {
        Err(_) => {
            debug!("no CONNECT within the connect timeout");
            return Ok(());
        }
        Ok(Err(e)) => return Err(e),
        Ok(Ok(First::Bad(err))) => {
            reject_bad_connect(&mut writer, &err).await;
            return Ok(());
        }
        Ok(Ok(First::Eof)) => return Ok(()),
        Ok(Ok(First::Packet(Packet::Connect(c)))) => c,
        Ok(Ok(First::Packet(other))) => {
            debug!(packet_type = other.type_id(), "first packet is not CONNECT");
            return Ok(());
        }
    };
    let mut connect = *connect;
    let mut enhanced = None;
    if connect.protocol.is_v5() && connect.properties.authentication_method.is_some() {
        enhanced = crate::enhanced_auth::connect_exchange(
            &broker,
            &mut connect,
            &mut reader,
            &mut writer,
            &mut rbuf,
            peer,
        )
        .await?;
        if enhanced.is_none() {
            return Ok(());
        }
    }
    let Some(mut conn) =
        Conn::handshake(broker.clone(), connect, enhanced, peer, &mut writer).await?
    else {
        return Ok(());
    };
    tracing::Span::current().record("client_id", &*conn.client_id);
    let close = conn.run_loop(&mut reader, &mut writer, rbuf).await;
    let v5 = conn.version.is_v5();
    conn.finish(close, &mut writer).await;
    if close.reason.is_some() && v5 {
        linger(&mut reader).await;
    }
    Ok(())
}

/// `max_publish_rate_per_s` of one connection: a token bucket holding one second of budget.
struct RateLimit {
    per_s: f64,
    tokens: f64,
    last: Instant,
    /// The budget ran out and has not refilled to 10 ms worth yet.
    paused: bool,
}

impl RateLimit {
    fn new(per_s: u32) -> RateLimit {
        RateLimit {
            per_s: f64::from(per_s),
            tokens: f64::from(per_s),
            last: Instant::now(),
            paused: false,
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

async fn sleep_until_opt(t: Option<tokio::time::Instant>) {
    if let Some(t) = t {
        tokio::time::sleep_until(t).await;
    }
}

/// After a server-sent DISCONNECT and a write shutdown, read and discard what the client still
/// sends for a moment, so closing does not reset the connection before the client has read
/// the DISCONNECT (a reset can discard data not yet read). Bounded in time and bytes.
async fn linger<R: AsyncRead + Unpin>(reader: &mut R) {
    let mut buf = [0u8; 4096];
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

/// Check the CONNECT's credentials: against the password file when one is configured
/// (clients without a username count as anonymous), else only `allow_anonymous`. Without a
/// password file a username is taken as given (as mosquitto does), for ACL rules by user.
async fn authenticate(broker: &Arc<Broker>, c: &Connect) -> bool {
    let anonymous_ok = broker.config.server.allow_anonymous;
    let auth = broker.auth();
    let Some(user) = c.username.clone() else {
        return anonymous_ok;
    };
    if auth.passwords.is_none() {
        return true;
    }
    let password = c.password.clone().unwrap_or_default();
    // PBKDF2 takes a while by design: keep it off the runtime's worker threads.
    tokio::task::spawn_blocking(move || {
        auth.passwords
            .as_ref()
            .is_some_and(|p| p.verify(&user, &password))
    })
    .await
    .unwrap_or(false)
}

/// Map a decode error of the first packet to a CONNACK where the protocol allows one.
async fn reject_bad_connect<W: AsyncWrite + Unpin>(writer: &mut W, err: &DecodeError) {
    let (version, code) = match err {
        DecodeError::UnsupportedProtocolVersion(level) if *level < 5 => {
            (ProtocolVersion::V311, rc::UNSUPPORTED_PROTOCOL_VERSION)
        }
        DecodeError::UnsupportedProtocolVersion(_) => {
            (ProtocolVersion::V5, rc::UNSUPPORTED_PROTOCOL_VERSION)
        }
        _ => {
            debug!(error = %err, "malformed CONNECT");
            return;
        }
    };
    let mut out = BytesMut::new();
    encode(
        &Packet::ConnAck(ConnAck {
            reason_code: code,
            ..Default::default()
        }),
        version,
        &mut out,
    );
    let _ = tokio::time::timeout(
        Duration::from_millis(FLUSH_TIMEOUT_MS),
        writer.write_all(&out),
    )
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
    waker: Arc<Notify>,
}

struct Conn {
    broker: Arc<Broker>,
    version: ProtocolVersion,
    client_id: Arc<str>,
    session: Arc<Session>,
    generation: u64,
    waker: Arc<Notify>,
    keep_alive: Option<Duration>,
    /// Outbound QoS 1/2 window: min(client Receive Maximum, max_inflight_messages).
    send_window: usize,
    /// Largest packet the client accepts.
    client_max_packet: usize,
    /// Client's Topic Alias Maximum (server-to-client aliases).
    client_alias_max: u16,
    inbound_aliases: HashMap<u16, Arc<str>>,
    outbound_aliases: HashMap<Arc<str>, u16>,
    problem_info: bool,
    will: Option<Will>,
    /// Session Expiry Interval from CONNECT, possibly updated by DISCONNECT.
    session_expiry_s: u32,
    wbuf: BytesMut,
    /// `max_publish_rate_per_s`: reading pauses while the budget is spent.
    rate: Option<RateLimit>,
    /// Username as presented in CONNECT (authenticated when a password file is in use).
    username: Option<Arc<str>>,
    /// Stored PUBLISHes not yet durable, in arrival order.
    pending: VecDeque<PendingPub>,
    completions: Arc<Completions>,
    /// Completions consumed from `completions.ok`.
    completed: u64,
    /// First log offset this connection has appended but not routed (for the watermark).
    low: Arc<AtomicU64>,
    /// Write barriers: bytes from this absolute position wait for this index ticket.
    barriers: VecDeque<(u64, u64)>,
    /// Bytes written to the socket so far.
    abs_written: u64,
    peer: SocketAddr,
    /// Feeder task of each stream subscription, by full filter.
    feeders: HashMap<String, tokio::task::JoinHandle<()>>,
    /// Enhanced authentication: the method and user, and a re-authentication in progress.
    enhanced: Option<Box<crate::enhanced_auth::Live>>,
}

impl Conn {
    async fn handshake<W: AsyncWrite + Unpin>(
        broker: Arc<Broker>,
        c: Connect,
        enhanced: Option<crate::enhanced_auth::Verified>,
        peer: SocketAddr,
        writer: &mut W,
    ) -> std::io::Result<Option<Conn>> {
        let cfg = &broker.config.mqtt;
        let version = c.protocol;
        let v5 = version.is_v5();
        let refuse = |code: u8| -> BytesMut {
            let mut out = BytesMut::new();
            encode(
                &Packet::ConnAck(ConnAck {
                    reason_code: code,
                    ..Default::default()
                }),
                version,
                &mut out,
            );
            out
        };
        let mut reject: Option<u8> = None;
        if broker.is_shutting_down() {
            reject = Some(rc::SERVER_UNAVAILABLE);
        } else if broker.stats.clients_connected.load(Ordering::Relaxed) >= cfg.max_connections {
            reject = Some(if v5 {
                rc::QUOTA_EXCEEDED
            } else {
                rc::SERVER_UNAVAILABLE
            });
        } else if c.properties.authentication_method.is_some() && enhanced.is_none() {
            // MQTT 3.1.1 has no AUTH; an MQTT 5 CONNECT with a method ran the exchange already.
            reject = Some(rc::BAD_AUTHENTICATION_METHOD);
        } else if enhanced.is_none() && !authenticate(&broker, &c).await {
            broker.stats.auth_failures.fetch_add(1, Ordering::Relaxed);
            warn!(
                username = c.username.as_deref().unwrap_or(""),
                client_id = %c.client_id,
                %peer,
                "authentication failed"
            );
            reject = Some(rc::BAD_USER_NAME_OR_PASSWORD);
        } else if c.client_id.is_empty()
            && (version == ProtocolVersion::V31 || (!v5 && !c.clean_start))
        {
            // MQTT 3.1 requires a client id of 1 to 23 characters (CONNACK rc 2); 3.1.1 one
            // for a persistent session [MQTT-3.1.3-8].
            reject = Some(rc::CLIENT_IDENTIFIER_NOT_VALID);
        } else if let Some(w) = &c.will {
            if !topic::valid_topic_name(&w.topic) {
                reject = Some(rc::TOPIC_NAME_INVALID);
            } else if w.qos.as_u8() > cfg.maximum_qos {
                reject = Some(rc::QOS_NOT_SUPPORTED);
            } else if w.retain && !cfg.retain_available {
                reject = Some(rc::RETAIN_NOT_SUPPORTED);
            }
        }
        if let Some(code) = reject {
            debug!(reason = rc::name(code), "CONNECT refused");
            broker.stats.refused(code);
            let out = refuse(code);
            let _ = tokio::time::timeout(
                Duration::from_millis(FLUSH_TIMEOUT_MS),
                writer.write_all(&out),
            )
            .await;
            return Ok(None);
        }

        let mut props = ConnAckProperties::default();
        let client_id: Arc<str> = if c.client_id.is_empty() {
            let id = broker.assign_client_id();
            if v5 {
                props.assigned_client_identifier = Some(id.clone());
            }
            id.into()
        } else {
            c.client_id.as_str().into()
        };
        // Session expiry: 3.1.1 clean session 0 means "never expires".
        let requested_expiry = if v5 {
            c.properties.session_expiry_interval.unwrap_or(0)
        } else if c.clean_start {
            0
        } else {
            u32::MAX
        };
        let session_expiry_s = requested_expiry.min(cfg.max_session_expiry_s);
        if v5 && session_expiry_s != requested_expiry {
            props.session_expiry_interval = Some(session_expiry_s);
        }
        // Keep alive.
        let mut keep_alive_s = c.keep_alive;
        if v5 {
            let wanted = cfg.server_keep_alive_s.unwrap_or(c.keep_alive);
            let granted = if wanted == 0 && cfg.max_keep_alive_s < u16::MAX {
                cfg.max_keep_alive_s
            } else {
                wanted.min(cfg.max_keep_alive_s)
            };
            if granted != c.keep_alive {
                props.server_keep_alive = Some(granted);
            }
            keep_alive_s = granted;
        }
        let keep_alive =
            (keep_alive_s > 0).then(|| Duration::from_millis(u64::from(keep_alive_s) * 1500));

        if v5 {
            if cfg.receive_maximum != u16::MAX {
                props.receive_maximum = Some(cfg.receive_maximum);
            }
            if cfg.maximum_qos < 2 {
                props.maximum_qos = Some(cfg.maximum_qos);
            }
            if !cfg.retain_available {
                props.retain_available = Some(false);
            }
            props.maximum_packet_size = Some(cfg.max_packet_size_bytes);
            if let Some(v) = &enhanced {
                props.authentication_method = Some(v.method.clone());
                props.authentication_data = Some(v.server_final.clone());
            }
            if cfg.topic_alias_max > 0 {
                props.topic_alias_maximum = Some(cfg.topic_alias_max);
            }
            if c.properties.request_response_information == Some(true) {
                if let Some(info) = &cfg.response_information {
                    props.response_information = Some(info.replace("{client_id}", &client_id));
                }
            }
        }

        // The CONNACK must fit the client's Maximum Packet Size too [MQTT-3.1.2-24]: the
        // optional properties go first; a client whose limit is below even that gets no
        // CONNACK, and the connection closes (before any session is touched).
        if let Some(max) = c.properties.maximum_packet_size.filter(|_| v5) {
            let size = |props: &ConnAckProperties| {
                lanemq_protocol::encoded_len(
                    &Packet::ConnAck(ConnAck {
                        session_present: false,
                        reason_code: rc::SUCCESS,
                        properties: props.clone(),
                    }),
                    version,
                )
            };
            let max = usize::try_from(max).unwrap_or(usize::MAX);
            if size(&props) > max {
                props.reason_string = None;
                props.user_properties.clear();
                props.response_information = None;
            }
            if size(&props) > max {
                warn!(
                    client_id = %client_id,
                    %peer,
                    maximum_packet_size = max,
                    connack_bytes = size(&props),
                    "the client's Maximum Packet Size is smaller than the CONNACK; closing"
                );
                return Ok(None);
            }
        }
        let limits = broker.queue_limits();
        let (session, resumed) = broker.open_session(&client_id, c.clean_start, || {
            Session::new(client_id.clone(), version, limits)
        });
        let waker = Arc::new(Notify::new());
        let mut wbuf = BytesMut::new();
        let generation;
        {
            let mut st = session.lock();
            if st.connected {
                // Take-over: the old connection sees the new generation and leaves with 0x8E.
                st.wake();
            }
            st.generation += 1;
            generation = st.generation;
            session.set_online(&mut st, true);
            st.waker = Some(waker.clone());
            st.kick = None;
            st.protocol = version;
            st.expiry_s = session_expiry_s;
            st.identity = Some((c.username.as_deref().map(Arc::from), peer.ip()));
            st.connected_at_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        }
        if resumed {
            // The rules may have changed while the session was away (a reload, a restart),
            // and its client may come back as someone else: what it may no longer read goes.
            broker.revoke_denied(&session, false);
        }
        let persist = &broker.persist;
        if session_expiry_s > 0 {
            let will_delay_s = c
                .will
                .as_ref()
                .and_then(|w| w.properties.will_delay_interval)
                .unwrap_or(0);
            persist.submit(Op::SessionPut {
                client: client_id.clone(),
                meta: SessionMeta {
                    expiry_s: session_expiry_s,
                    protocol: version.level(),
                    disconnected_at_us: 0,
                    will_delay_s,
                },
            });
            match &c.will {
                Some(w) if will_delay_s > 0 => {
                    let mut msg = Message::new(
                        w.topic.as_str().into(),
                        w.payload.clone(),
                        w.qos,
                        w.retain,
                        will_properties(w),
                        client_id.clone(),
                    );
                    msg.username = c.username.as_deref().map(Arc::from);
                    let rec = crate::persist::record_in(&msg, None);
                    persist.submit(Op::WillPut {
                        client: client_id.clone(),
                        record: Box::new(rec),
                    });
                }
                _ => {
                    persist.submit(Op::WillRemove {
                        client: client_id.clone(),
                    });
                }
            }
        } else if resumed {
            // The session no longer outlives its connection: forget its persisted state.
            persist.submit(Op::SessionRemove {
                client: client_id.clone(),
            });
        }
        let connack = ConnAck {
            session_present: resumed,
            reason_code: rc::SUCCESS,
            properties: props,
        };
        encode(&Packet::ConnAck(connack), version, &mut wbuf);

        let waker_for_store = waker.clone();
        let send_window = usize::from(
            c.properties
                .receive_maximum
                .unwrap_or(u16::MAX)
                .min(cfg.max_inflight_messages),
        );
        let client_max_packet = c
            .properties
            .maximum_packet_size
            .map_or(usize::MAX, |m| m as usize);
        let mut conn = Conn {
            broker: broker.clone(),
            version,
            client_id,
            session,
            generation,
            waker,
            keep_alive,
            send_window,
            client_max_packet,
            client_alias_max: if v5 && cfg.outbound_topic_aliases {
                c.properties.topic_alias_maximum.unwrap_or(0)
            } else {
                0
            },
            inbound_aliases: HashMap::new(),
            outbound_aliases: HashMap::new(),
            problem_info: c.properties.request_problem_information.unwrap_or(true),
            will: c.will,
            session_expiry_s,
            wbuf,
            rate: (cfg.max_publish_rate_per_s > 0)
                .then(|| RateLimit::new(cfg.max_publish_rate_per_s)),
            username: c.username.as_deref().map(Arc::from),
            pending: VecDeque::new(),
            completions: Arc::new(Completions {
                ok: AtomicU64::new(0),
                failed: AtomicBool::new(false),
                waker: waker_for_store,
            }),
            completed: 0,
            low: broker.persist.register_low(),
            barriers: VecDeque::new(),
            abs_written: 0,
            peer,
            feeders: HashMap::new(),
            enhanced: enhanced
                .as_ref()
                .map(|v| Box::new(crate::enhanced_auth::Live::new(v))),
        };
        if resumed {
            broker
                .lite
                .send(crate::lite::Event::Online(conn.session.clone()));
            conn.resend_inflight();
            let subs: Vec<Arc<StreamSub>> =
                conn.session.lock().stream_subs.values().cloned().collect();
            for sub in subs {
                conn.start_feeder(sub);
            }
        }
        broker
            .stats
            .clients_connected
            .fetch_add(1, Ordering::Relaxed);
        broker
            .stats
            .connections_accepted
            .fetch_add(1, Ordering::Relaxed);
        debug!(resumed, keep_alive_s, "client connected");
        Ok(Some(conn))
    }

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
                _ => {
                    let (p, _) = self.build_publish(&e.delivery, e.packet_id, true, now);
                    self.encode(&Packet::Publish(p));
                }
            }
        }
    }

    fn encode(&mut self, p: &Packet) {
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
        if encoded_len(&p, self.version) > self.client_max_packet {
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

    /// Build an outbound PUBLISH; returns it and the topic whose alias was newly assigned.
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

    fn build_publish(
        &mut self,
        d: &Delivery,
        pid: u16,
        dup: bool,
        now: Instant,
    ) -> (Publish, Option<Arc<str>>) {
        let mut properties = if self.version.is_v5() {
            d.msg.properties.clone()
        } else {
            Default::default()
        };
        let mut topic_name = String::new();
        let mut new_alias = None;
        if self.version.is_v5() {
            properties.message_expiry_interval = d.msg.remaining_expiry_s(now);
            properties.subscription_identifiers = d.sub_ids.clone();
            if self.client_alias_max > 0 {
                if let Some(a) = self.outbound_aliases.get(&d.msg.topic) {
                    properties.topic_alias = Some(*a);
                } else if self.outbound_aliases.len() < usize::from(self.client_alias_max) {
                    let a = (self.outbound_aliases.len() + 1) as u16;
                    self.outbound_aliases.insert(d.msg.topic.clone(), a);
                    properties.topic_alias = Some(a);
                    topic_name.push_str(&d.msg.topic);
                    new_alias = Some(d.msg.topic.clone());
                }
            }
        }
        if (properties.topic_alias.is_none() || new_alias.is_some()) && topic_name.is_empty() {
            topic_name.push_str(&d.msg.topic);
        }
        let p = Publish {
            dup,
            qos: d.qos,
            retain: d.retain,
            topic: topic_name,
            packet_id: pid,
            properties,
            payload: d.msg.payload.clone(),
        };
        (p, new_alias)
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
        let mut sent = 0u64;
        let mut dropped = 0u64;
        let mut expired = 0u64;
        let mut sent_qos = [0u64; 3];
        let mut sent_bytes_qos = [0u64; 3];
        while self.wbuf.len() < WRITE_HIGH_WATER_BYTES {
            let Some(front) = st.queue.front() else { break };
            if front.qos != QoS::AtMostOnce && st.inflight.len() >= self.send_window {
                break;
            }
            let Some(d) = st.pop_queue() else { break };
            if d.msg.is_expired(now) {
                expired += 1;
                self.forget_delivery(d.seq, None);
                if let Some(t) = &d.stream {
                    t.done();
                }
                if let Some(t) = d.lane {
                    self.broker.lite.done(t);
                }
                continue;
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
            let dup = d.lane.is_some_and(|t| t.dup);
            let (p, new_alias) = self.build_publish(&d, pid, dup, now);
            let packet = Packet::Publish(p);
            if encoded_len(&packet, self.version) > self.client_max_packet {
                // [MQTT-3.1.2-25]: discard as if delivered.
                if let Some(t) = new_alias {
                    self.outbound_aliases.remove(&t);
                }
                st.pids_in_use.remove(&pid);
                self.forget_delivery(d.seq, None);
                if let Some(t) = &d.stream {
                    t.done();
                }
                if let Some(t) = d.lane {
                    self.broker.lite.done(t);
                }
                dropped += 1;
                continue;
            }
            if d.seq != 0 && d.qos != QoS::AtMostOnce {
                let stage = if d.qos == QoS::ExactlyOnce { 2 } else { 1 };
                let t = self.broker.persist.submit(Op::InflightPut {
                    client: self.client_id.clone(),
                    pid,
                    seq: d.seq,
                    stage,
                });
                if stage == 2 {
                    // A QoS 2 PUBLISH goes out only once its packet id is durable, so that a
                    // resend after a crash carries the same id and the client de-duplicates it.
                    self.barrier(t);
                }
            }
            encode(&packet, self.version, &mut self.wbuf);
            sent += 1;
            let q = d.qos.as_u8() as usize & 3;
            if let (Some(n), Some(b)) = (sent_qos.get_mut(q), sent_bytes_qos.get_mut(q)) {
                *n += 1;
                *b += d.msg.payload.len() as u64;
            }
            if let (Some(t), QoS::AtMostOnce) = (&d.stream, d.qos) {
                t.done();
            }
            if let (Some(t), QoS::AtMostOnce) = (d.lane, d.qos) {
                self.broker.lite.done(t);
            }
            if d.qos != QoS::AtMostOnce {
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
            }
        }
        if st.queue.is_empty() && st.queue.capacity() > TRIM_QUEUE_CAPACITY {
            st.trim();
        }
        drop(st);
        let stats = &self.broker.stats;
        if sent > 0 {
            stats.messages_sent.fetch_add(sent, Ordering::Relaxed);
        }
        if dropped > 0 {
            stats.messages_dropped.fetch_add(dropped, Ordering::Relaxed);
            stats
                .dropped_too_large
                .fetch_add(dropped, Ordering::Relaxed);
        }
        if expired > 0 {
            stats.dropped_expired.fetch_add(expired, Ordering::Relaxed);
        }
        for q in 0..3 {
            if sent_qos[q] > 0 {
                stats.sent_qos[q].fetch_add(sent_qos[q], Ordering::Relaxed);
                stats.sent_payload_bytes_qos[q].fetch_add(sent_bytes_qos[q], Ordering::Relaxed);
            }
        }
        None
    }

    async fn run_loop<R, W>(&mut self, reader: &mut R, writer: &mut W, mut rbuf: BytesMut) -> Close
    where
        R: AsyncRead + Unpin + Send,
        W: AsyncWrite + Unpin + Send,
    {
        let max_packet = self.broker.config.mqtt.max_packet_size_bytes;
        let far = Duration::from_secs(86_400 * 365);
        let keep_alive = self.keep_alive;
        let deadline = tokio::time::sleep(keep_alive.unwrap_or(far));
        tokio::pin!(deadline);
        let waker = self.waker.clone();
        // Packets already buffered behind CONNECT.
        if !rbuf.is_empty() {
            if let Err(c) = self.process_input(&mut rbuf, max_packet) {
                return c;
            }
        }
        loop {
            if self.rate.is_some() && !rbuf.is_empty() {
                // Packets left in the buffer by a rate-limit pause.
                if let Err(c) = self.process_input(&mut rbuf, max_packet) {
                    return c;
                }
            }
            if let Err(c) = self.process_completions() {
                return c;
            }
            if let Some(kick) = self.drain() {
                return match kick {
                    Kick::TakenOver => Close {
                        reason: Some(rc::SESSION_TAKEN_OVER),
                        will: true,
                    },
                    Kick::SlowConsumer => {
                        self.broker
                            .queue_budget
                            .slow_consumers_disconnected
                            .fetch_add(1, Ordering::Relaxed);
                        warn!("slow consumer: queue limit reached, disconnecting");
                        Close::error(rc::QUOTA_EXCEEDED)
                    }
                    Kick::Shutdown => Close {
                        reason: Some(rc::SERVER_SHUTTING_DOWN),
                        will: false,
                    },
                    Kick::NotAuthorized => Close::error(rc::NOT_AUTHORIZED),
                    Kick::Administrative => {
                        warn!("kicked over the admin API");
                        Close::error(rc::ADMINISTRATIVE_ACTION)
                    }
                };
            }
            let writable = self.writable();
            let writing = writable > 0;
            // Release a large write buffer only once the connection is idle: under load it
            // would be grown again at once (copying on every doubling).
            if self.wbuf.is_empty()
                && self.wbuf.capacity() > BUFFER_SHRINK_BYTES
                && self.session.lock().queue.is_empty()
            {
                self.wbuf = BytesMut::new();
            }
            if rbuf.is_empty() && rbuf.capacity() > BUFFER_SHRINK_BYTES {
                rbuf = BytesMut::with_capacity(READ_BUFFER_IDLE_BYTES);
            } else if rbuf.capacity() - rbuf.len() < READ_BUFFER_IDLE_BYTES / 2 {
                rbuf.reserve(READ_BUFFER_STEP_BYTES);
            }
            let paused = self.rate.as_mut().and_then(RateLimit::paused_until);
            tokio::select! {
                biased;
                res = writer.write(&self.wbuf[..writable]), if writing => {
                    match res {
                        Ok(0) | Err(_) => return Close::silent(true),
                        Ok(n) => {
                            bytes::Buf::advance(&mut self.wbuf, n);
                            self.abs_written += n as u64;
                            self.broker.stats.bytes_sent.fetch_add(n as u64, Ordering::Relaxed);
                        }
                    }
                }
                _ = sleep_until_opt(paused), if paused.is_some() => {
                    // Not reading was our choice: the client's keep alive starts afresh.
                    if let Some(ka) = keep_alive {
                        deadline.as_mut().reset(tokio::time::Instant::now() + ka);
                    }
                }
                res = reader.read_buf(&mut rbuf), if paused.is_none() => {
                    match res {
                        Ok(0) | Err(_) => return Close::silent(true),
                        Ok(n) => {
                            self.broker.stats.bytes_received.fetch_add(n as u64, Ordering::Relaxed);
                            if let Some(ka) = keep_alive {
                                deadline.as_mut().reset(tokio::time::Instant::now() + ka);
                            }
                            if let Err(c) = self.process_input(&mut rbuf, max_packet) {
                                return c;
                            }
                        }
                    }
                }
                _ = waker.notified() => {}
                _ = &mut deadline, if keep_alive.is_some() => {
                    debug!("keep alive timeout");
                    return Close::error(rc::KEEP_ALIVE_TIMEOUT);
                }
            }
        }
    }

    fn process_input(&mut self, rbuf: &mut BytesMut, max_packet: u32) -> Result<(), Close> {
        loop {
            if self
                .rate
                .as_mut()
                .is_some_and(|r| r.paused_until().is_some())
            {
                // Over `max_publish_rate_per_s`: the rest waits in the buffer.
                return Ok(());
            }
            match decode(rbuf, self.version, max_packet) {
                Ok(Some(p)) => self.handle(p)?,
                Ok(None) => return Ok(()),
                Err(e) => {
                    debug!(error = %e, "invalid packet");
                    return Err(Close::error(e.reason_code()));
                }
            }
        }
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

    fn on_publish(&mut self, p: Publish) -> Result<(), Close> {
        let cfg = &self.broker.config.mqtt;
        let topic: Arc<str> = match p.properties.topic_alias {
            Some(alias) => {
                if alias == 0 || alias > cfg.topic_alias_max {
                    return Err(Close::error(rc::TOPIC_ALIAS_INVALID));
                }
                if p.topic.is_empty() {
                    match self.inbound_aliases.get(&alias) {
                        Some(t) => t.clone(),
                        None => return Err(Close::error(rc::PROTOCOL_ERROR)),
                    }
                } else {
                    let t: Arc<str> = p.topic.as_str().into();
                    self.inbound_aliases.insert(alias, t.clone());
                    t
                }
            }
            None if p.topic.is_empty() => return Err(Close::error(rc::PROTOCOL_ERROR)),
            None => p.topic.as_str().into(),
        };
        if !topic::valid_topic_name(&topic) {
            return Err(Close::error(rc::TOPIC_NAME_INVALID));
        }
        if !p.properties.subscription_identifiers.is_empty() {
            return Err(Close::error(rc::PROTOCOL_ERROR));
        }
        if p.qos.as_u8() > cfg.maximum_qos {
            return Err(Close::error(rc::QOS_NOT_SUPPORTED));
        }
        if p.retain && !cfg.retain_available {
            return Err(Close::error(rc::RETAIN_NOT_SUPPORTED));
        }
        let bad_payload = p.properties.payload_format_indicator == Some(1)
            && std::str::from_utf8(&p.payload).is_err();
        let pid = p.packet_id;
        let ack = match p.qos {
            QoS::AtMostOnce => Owed::Nothing,
            QoS::AtLeastOnce => Owed::PubAck(pid),
            QoS::ExactlyOnce => Owed::PubRec(pid),
        };
        if p.qos == QoS::ExactlyOnce && self.session.lock().inbound_qos2.contains(&pid) {
            // A resend of a QoS 2 message already received: acknowledge, never deliver twice.
            self.queue_ack(ack, rc::SUCCESS);
            return Ok(());
        }
        if bad_payload {
            self.queue_ack(ack, rc::PAYLOAD_FORMAT_INVALID);
            return Ok(());
        }
        if topic.starts_with("$SYS/") || &*topic == "$SYS" || !self.allowed(Action::Publish, &topic)
        {
            // Refused: $SYS is the broker's own (clients may read it, never write it), or the
            // ACL denies it. MQTT 5 learns why; 3.1.1 cannot be told, the message is dropped.
            debug!(topic = %topic, "publish refused");
            if self.version.is_v5() {
                self.queue_ack(ack, rc::NOT_AUTHORIZED);
            } else {
                if p.qos == QoS::ExactlyOnce {
                    self.session.lock().inbound_qos2.insert(pid);
                }
                self.queue_ack(ack, rc::SUCCESS);
            }
            return Ok(());
        }
        if p.qos == QoS::ExactlyOnce {
            let mut st = self.session.lock();
            if st.inbound_qos2.len() >= usize::from(cfg.receive_maximum) {
                return Err(Close::error(rc::RECEIVE_MAXIMUM_EXCEEDED));
            }
            st.inbound_qos2.insert(pid);
        }
        self.accept(topic, p, ack)
    }

    /// Does the ACL allow this action on this topic (or filter)?
    fn allowed(&self, action: Action, topic: &str) -> bool {
        let auth = self.broker.auth();
        let req = Request {
            username: self.username.as_deref(),
            client_id: &self.client_id,
            ip: self.peer.ip(),
            action,
            topic,
        };
        let d = match action {
            Action::Subscribe => auth.acl.check_subscribe(&req, false),
            _ => auth.acl.check(&req),
        };
        if !d.allowed {
            debug!(?action, topic, decision = %d, "ACL denied");
        }
        d.allowed
    }

    /// Send an acknowledgement now, or after the stored messages received before it.
    fn queue_ack(&mut self, ack: Owed, code: u8) {
        if self.pending.is_empty() {
            self.send_ack(ack, code);
        } else {
            self.pending.push_back(PendingPub {
                msg: None,
                ack,
                code,
                counted: false,
                after: Vec::new(),
                offset: u64::MAX,
            });
        }
    }

    fn send_ack(&mut self, ack: Owed, code: u8) {
        match ack {
            Owed::Nothing => {}
            Owed::PubAck(pid) => self.encode_ack(Packet::PubAck(PubResp::new(pid, code))),
            Owed::PubRec(pid) => self.encode_ack(Packet::PubRec(PubResp::new(pid, code))),
        }
    }

    /// Append an accepted PUBLISH to the log. It is delivered and acknowledged once durable
    /// ([`Conn::process_completions`]); a QoS 0 message that is not retained and has nothing
    /// queued before it is delivered at once (nothing depends on its durability).
    fn accept(&mut self, topic: Arc<str>, p: Publish, ack: Owed) -> Result<(), Close> {
        use lanemq_lite::engine::Classified;
        let lane = match self.broker.lite.engine.classify(&topic) {
            Classified::Plain => None,
            Classified::Lane { parent, key } => Some((parent, key)),
            Classified::Refused { code, why } => {
                // Key too long (0x90) or the parent's lane quota (0x97): not accepted.
                self.broker
                    .lite
                    .engine
                    .counters
                    .publish_refused
                    .fetch_add(1, Ordering::Relaxed);
                debug!(topic = %topic, %why, "publish refused by the lite layer");
                if p.qos == QoS::ExactlyOnce {
                    self.session.lock().inbound_qos2.remove(&p.packet_id);
                }
                if ack == Owed::Nothing {
                    self.broker
                        .stats
                        .messages_dropped
                        .fetch_add(1, Ordering::Relaxed);
                } else if self.version.is_v5() {
                    self.queue_ack(ack, code);
                } else {
                    // 3.1.1 has no reason codes: the PUBACK cannot say it; the message is
                    // dropped and counted.
                    self.broker
                        .stats
                        .messages_dropped
                        .fetch_add(1, Ordering::Relaxed);
                    self.queue_ack(ack, rc::SUCCESS);
                }
                return Ok(());
            }
        };
        let persist = self.broker.persist.clone();
        // QoS 0 with nothing queued before it is delivered at once (a retained one updates
        // the retained table at once too; its index entry waits until the record is durable).
        let fast = ack == Owed::Nothing && self.pending.is_empty();
        let retain = p.retain;
        if self.pending.is_empty() {
            self.low
                .store(persist.store.next_offset(), Ordering::SeqCst);
        }
        let mut msg = Message::new(
            topic,
            p.payload,
            p.qos,
            p.retain,
            p.properties,
            self.client_id.clone(),
        );
        msg.username = self.username.clone();
        msg.in_lane = lane.is_some();
        let pid = (p.qos == QoS::ExactlyOnce).then_some(p.packet_id);
        let rec = crate::persist::record_in(&msg, pid);
        let cb: lanemq_store::Callback = if fast && !retain {
            Box::new(|_| {})
        } else {
            let c = self.completions.clone();
            Box::new(move |r| {
                match r {
                    Ok(_) => {
                        c.ok.fetch_add(1, Ordering::Release);
                    }
                    Err(_) => c.failed.store(true, Ordering::Release),
                }
                c.waker.notify_one();
            })
        };
        let appended = match &lane {
            Some((parent, key)) => self.broker.append_lane(rec, cb, *parent, key),
            None => self.broker.append_plain(rec, cb),
        };
        match appended {
            Ok(offset) => msg.offset = offset,
            Err(e) => {
                warn!(error = %e, "cannot store a message: closing the connection unacknowledged");
                return Err(Close::error(rc::UNSPECIFIED_ERROR));
            }
        }
        let offset = msg.offset;
        let msg = Arc::new(msg);
        if fast && !retain {
            self.deliver(msg, None);
            self.low.store(u64::MAX, Ordering::SeqCst);
        } else if fast {
            let mut after = Vec::new();
            self.deliver(msg, Some(&mut after));
            self.pending.push_back(PendingPub {
                msg: None,
                ack,
                code: rc::SUCCESS,
                counted: true,
                after,
                offset,
            });
        } else {
            self.pending.push_back(PendingPub {
                msg: Some(msg),
                ack,
                code: rc::SUCCESS,
                counted: true,
                after: Vec::new(),
                offset,
            });
        }
        Ok(())
    }

    /// Deliver a stored message; returns the PUBACK/PUBREC code.
    fn deliver(&mut self, msg: Arc<Message>, deferred: Option<&mut Vec<Op>>) -> u8 {
        self.broker.stats.received(&msg);
        // 0x10 only tells a publisher nobody got it; a retained message is kept for later.
        let kept = (msg.retain && !msg.payload.is_empty()) || msg.in_lane;
        let in_lane = msg.in_lane;
        let ingested = self.broker.deliver_with(msg, deferred);
        self.broker.stats.routed(&ingested, in_lane);
        if ingested.matched || kept || !self.version.is_v5() {
            rc::SUCCESS
        } else {
            rc::NO_MATCHING_SUBSCRIBERS
        }
    }

    /// Deliver and acknowledge the messages the store has made durable, in order.
    fn process_completions(&mut self) -> Result<(), Close> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let ok = self.completions.ok.load(Ordering::Acquire);
        let mut durable = false;
        while let Some(front) = self.pending.front() {
            if front.counted {
                if self.completed >= ok {
                    break;
                }
                self.completed += 1;
            }
            let Some(e) = self.pending.pop_front() else {
                break;
            };
            for op in e.after {
                self.broker.persist.submit(op);
            }
            let mut code = e.code;
            if let Some(msg) = e.msg {
                let offset = msg.offset;
                durable = true;
                code = self.deliver(msg, None);
                if let (Owed::PubRec(pid), true) = (e.ack, self.persistent()) {
                    self.broker.persist.submit(Op::InboundAdd {
                        client: self.client_id.clone(),
                        pid,
                        offset,
                    });
                }
            }
            self.send_ack(e.ack, code);
        }
        if durable {
            // New records are committed: the stream indexer picks them up now.
            self.broker.streams.poke();
            self.broker.lite.poke();
        }
        let low = self
            .pending
            .iter()
            .find_map(|e| e.counted.then_some(e.offset))
            .unwrap_or(u64::MAX);
        self.low.store(low, Ordering::SeqCst);
        if self.completions.failed.load(Ordering::Acquire) && self.pending.iter().any(|e| e.counted)
        {
            warn!("the log refused a write: closing the connection unacknowledged");
            return Err(Close::error(rc::UNSPECIFIED_ERROR));
        }
        Ok(())
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

    fn on_subscribe(&mut self, s: Subscribe) -> Result<(), Close> {
        let v5 = self.version.is_v5();
        let broker = self.broker.clone();
        let cfg = &broker.config.mqtt;
        let mut codes = Vec::with_capacity(s.filters.len());
        let mut retained: Vec<Delivery> = Vec::new();
        let mut sub_ticket = None;
        let mut reasons: Vec<String> = Vec::new();
        for f in &s.filters {
            let (group, inner) = match topic::parse_shared(&f.filter) {
                Ok(Some(sh)) => (Some(sh.group), sh.filter),
                Ok(None) => (None, f.filter.as_str()),
                Err(_) => {
                    codes.push(if v5 {
                        rc::TOPIC_FILTER_INVALID
                    } else {
                        rc::UNSPECIFIED_ERROR
                    });
                    continue;
                }
            };
            if group.is_some() && f.options.no_local {
                // [MQTT-3.8.3-4]
                return Err(Close::error(rc::PROTOCOL_ERROR));
            }
            if !topic::valid_filter(inner) {
                codes.push(if v5 {
                    rc::TOPIC_FILTER_INVALID
                } else {
                    rc::UNSPECIFIED_ERROR
                });
                continue;
            }
            if !self.allowed(Action::Subscribe, &f.filter) {
                codes.push(if v5 {
                    rc::NOT_AUTHORIZED
                } else {
                    rc::UNSPECIFIED_ERROR
                });
                continue;
            }
            if lanemq_streams::subscribe::is_stream_filter(inner) {
                let code = if group.is_some() {
                    reasons.push(format!(
                        "{}: stream subscriptions cannot be shared",
                        f.filter
                    ));
                    if v5 {
                        rc::SHARED_SUBSCRIPTIONS_NOT_SUPPORTED
                    } else {
                        rc::UNSPECIFIED_ERROR
                    }
                } else {
                    let (code, t) = self.subscribe_stream(
                        &f.filter,
                        f.options,
                        s.properties.subscription_identifier,
                        &s.properties.user_properties,
                        &mut reasons,
                    );
                    if t.is_some() {
                        sub_ticket = t;
                    }
                    code
                };
                codes.push(code);
                continue;
            }
            let denied = cfg
                .deny_subscribe
                .iter()
                .any(|d| d == inner || (!topic::has_wildcards(inner) && topic::matches(d, inner)));
            if denied {
                codes.push(if v5 {
                    cfg.deny_subscribe_reason_code
                } else {
                    rc::UNSPECIFIED_ERROR
                });
                continue;
            }
            let qos =
                QoS::from_u8(f.options.qos.as_u8().min(cfg.maximum_qos)).unwrap_or(QoS::AtMostOnce);
            let mut options = f.options;
            options.qos = qos;
            let sub_id = s.properties.subscription_identifier;
            if let Some((parent, sel)) = self.broker.lite.lane_filter(inner) {
                use crate::lite::Start;
                let next = self.broker.persist.store.next_offset();
                let start = match Start::from_user_properties(&s.properties.user_properties, next) {
                    Ok(st) => st,
                    Err(why) => {
                        reasons.push(format!("{}: {why}", f.filter));
                        codes.push(if v5 {
                            rc::IMPLEMENTATION_SPECIFIC_ERROR
                        } else {
                            rc::UNSPECIFIED_ERROR
                        });
                        continue;
                    }
                };
                let one = matches!(sel, lanemq_lite::LaneSel::One(_));
                if group.is_some() || (start.is_some() && one) {
                    // A lane group (or a private replay of one lane): QoS at most 1
                    // [MQTT-4.8.2-5 would strand a lane at QoS 2], never in the router.
                    let qos = qos.min(QoS::AtLeastOnce);
                    options.qos = qos;
                    self.session
                        .lock()
                        .subscriptions
                        .insert(f.filter.clone(), Subscription { options, sub_id });
                    self.broker
                        .lite
                        .send(crate::lite::Event::Join(Box::new(crate::lite::Join {
                            session: self.session.clone(),
                            filter: f.filter.clone(),
                            group: group.map(str::to_string),
                            parent,
                            sel,
                            inner: inner.to_string(),
                            qos,
                            sub_id,
                            start,
                            stored: group.is_some() || self.persistent(),
                        })));
                    if self.persistent() {
                        // A private replay is stored too, flagged: it is restored with its
                        // session and goes on from its stored position.
                        let mut value = crate::sub_codec::encode_sub(&options, sub_id);
                        if group.is_none() {
                            value[1] |= crate::sub_codec::SUB_FLAG_LANE_REPLAY;
                        }
                        let t = self.broker.persist.submit(Op::SubPut {
                            client: self.client_id.clone(),
                            filter: f.filter.clone(),
                            value,
                        });
                        sub_ticket = Some(t);
                    }
                    codes.push(qos.as_u8());
                    continue;
                }
            }
            let existed = self
                .session
                .lock()
                .subscriptions
                .insert(f.filter.clone(), Subscription { options, sub_id })
                .is_some();
            let send_retained = group.is_none()
                && (options.retain_handling == 0 || (options.retain_handling == 1 && !existed));
            let matching = self.broker.add_subscription_retained(
                &self.session,
                &f.filter,
                Subscriber {
                    session: self.session.clone(),
                    options,
                    sub_id,
                },
                send_retained,
            );
            if self.persistent() {
                let t = self.broker.persist.submit(Op::SubPut {
                    client: self.client_id.clone(),
                    filter: f.filter.clone(),
                    value: crate::sub_codec::encode_sub(&options, sub_id),
                });
                sub_ticket = Some(t);
            }
            codes.push(qos.as_u8());
            for m in matching {
                let q = m.qos.min(qos);
                retained.push(Delivery {
                    msg: m,
                    qos: q,
                    retain: true,
                    sub_ids: sub_id.into_iter().collect(),
                    share: None,
                    seq: 0,
                    stream: None,
                    lane: None,
                });
            }
        }
        if let Some(t) = sub_ticket {
            // SUBACK once the subscription is durable.
            self.barrier(t);
        }
        let mut properties = AckProperties::default();
        if !reasons.is_empty() {
            properties.reason_string = Some(reasons.join("; "));
        }
        self.encode_ack(Packet::SubAck(SubAck {
            packet_id: s.packet_id,
            reason_codes: codes,
            properties,
        }));
        for d in retained {
            self.session.push(d, Some(&self.broker.persist));
        }
        Ok(())
    }

    fn on_unsubscribe(&mut self, u: Unsubscribe) {
        let mut codes = Vec::with_capacity(u.filters.len());
        for f in &u.filters {
            let stream_sub = self.session.lock().stream_subs.remove(f);
            if let Some(sub) = stream_sub {
                sub.end();
                if let Some(j) = self.feeders.remove(f) {
                    j.abort();
                }
                if self.persistent() {
                    let t = self.broker.persist.submit(Op::StreamSubRemove {
                        client: self.client_id.clone(),
                        filter: f.clone(),
                    });
                    self.barrier(t);
                }
                codes.push(rc::SUCCESS);
                continue;
            }
            let had = self.session.lock().subscriptions.remove(f).is_some();
            if had {
                self.broker.remove_subscription(&self.session, f);
                if self.persistent() {
                    let t = self.broker.persist.submit(Op::SubRemove {
                        client: self.client_id.clone(),
                        filter: f.clone(),
                    });
                    self.barrier(t);
                }
            }
            codes.push(if had {
                rc::SUCCESS
            } else {
                rc::NO_SUBSCRIPTION_EXISTED
            });
        }
        self.encode_ack(Packet::UnsubAck(UnsubAck {
            packet_id: u.packet_id,
            reason_codes: codes,
            properties: Default::default(),
        }));
    }

    fn start_feeder(&mut self, sub: Arc<StreamSub>) {
        let filter = sub.filter.clone();
        let j = crate::streams::spawn_feeder(
            self.broker.streams.clone(),
            self.broker.persist.clone(),
            self.session.clone(),
            sub,
            self.generation,
        );
        if let Some(old) = self.feeders.insert(filter, j) {
            old.abort();
        }
    }

    /// SUBSCRIBE to `$stream/<name>[/<filter>]` or `$s/<offset>/<filter>` (already authorized
    /// on the full filter). Returns the SUBACK code and the ticket of the persisted
    /// subscription; failures add a reason to `reasons`.
    fn subscribe_stream(
        &mut self,
        filter: &str,
        mut options: lanemq_protocol::SubscriptionOptions,
        sub_id: Option<u32>,
        user_properties: &[(String, String)],
        reasons: &mut Vec<String>,
    ) -> (u8, Option<u64>) {
        use lanemq_streams::subscribe::{offset_from_user_properties, parse_topic, StartFrom};
        use lanemq_streams::{StreamDef, StreamError};
        let v5 = self.version.is_v5();
        let mut fail = |code: u8, why: String| {
            reasons.push(format!("{filter}: {why}"));
            (if v5 { code } else { rc::UNSPECIFIED_ERROR }, None)
        };
        if !v5 {
            return fail(
                rc::UNSPECIFIED_ERROR,
                "stream subscriptions need MQTT 5".into(),
            );
        }
        let engine = self.broker.streams.clone();
        if !engine.is_enabled() {
            return fail(
                rc::IMPLEMENTATION_SPECIFIC_ERROR,
                "streams are disabled (streams_config.enable = false)".into(),
            );
        }
        let t = match parse_topic(filter) {
            Ok(t) => t,
            Err(e) => return fail(rc::TOPIC_FILTER_INVALID, e.0),
        };
        let start = match t.start {
            Some(s) => s,
            None => match offset_from_user_properties(user_properties) {
                Ok(s) => s.unwrap_or(StartFrom::Latest),
                Err(e) => return fail(rc::IMPLEMENTATION_SPECIFIC_ERROR, e.0),
            },
        };
        let mut handle = engine.lookup(&t.name);
        let mut pending_note = None;
        let mismatch = |h: &lanemq_streams::engine::StreamHandle| {
            h.filter_mismatch(t.filter.as_deref()).map(|captures| {
                format!(
                    "stream_bound_to_different_topic_filter: stream {:?} captures {captures:?}",
                    t.name
                )
            })
        };
        if let Some(reason) = handle.as_deref().and_then(mismatch) {
            return fail(rc::IMPLEMENTATION_SPECIFIC_ERROR, reason);
        }
        match (&handle, &t.filter) {
            (None, Some(flt)) => {
                let settings = engine.settings();
                let lastvalue = settings.auto_create.lastvalue.clone();
                if lastvalue.is_none() && !settings.auto_create.regular {
                    pending_note = Some(format!(
                        "stream {:?} does not exist (auto-create is off); the subscription \
                         starts when it is created",
                        t.name
                    ));
                } else {
                    // Auto-create: `create` on the stream and `subscribe` on its filter.
                    if !self.allowed_auto_create(filter) {
                        return fail(
                            rc::NOT_AUTHORIZED,
                            format!(
                                "not authorized to create stream {:?} capturing {flt:?}",
                                t.name
                            ),
                        );
                    }
                    let mut def = StreamDef::new(&t.name, flt);
                    match lastvalue {
                        Some(lv) => {
                            def.is_lastvalue = true;
                            def.key_expression = lv.key_expression;
                        }
                        None => {
                            def.data_retention_period = settings.regular_stream_retention_period
                        }
                    }
                    let legacy = t.legacy;
                    let e = engine.clone();
                    let created = tokio::task::block_in_place(move || {
                        if legacy {
                            e.create_internal(def)
                        } else {
                            e.create(def)
                        }
                    });
                    match created {
                        Ok(_) | Err(StreamError::AlreadyExists(_)) => {
                            handle = engine.lookup(&t.name);
                            if let Some(reason) = handle.as_deref().and_then(mismatch) {
                                return fail(rc::IMPLEMENTATION_SPECIFIC_ERROR, reason);
                            }
                        }
                        Err(e @ StreamError::MaxStreamCount(_)) => {
                            return fail(rc::QUOTA_EXCEEDED, e.to_string())
                        }
                        Err(e @ StreamError::Invalid(_)) => {
                            return fail(rc::TOPIC_FILTER_INVALID, e.to_string())
                        }
                        Err(e) => return fail(rc::IMPLEMENTATION_SPECIFIC_ERROR, e.to_string()),
                    }
                }
            }
            (None, None) => {
                pending_note = Some(format!(
                    "stream {:?} does not exist yet; the subscription starts when it is created",
                    t.name
                ));
            }
            _ => {}
        }
        let cfg = &self.broker.config.mqtt;
        options.qos =
            QoS::from_u8(options.qos.as_u8().min(cfg.maximum_qos)).unwrap_or(QoS::AtMostOnce);
        // The same SUBSCRIBE again (mosquitto_sub -c re-subscribes on every run) keeps the
        // subscription and its position: a persistent session resumes after its last ack.
        let existing = self.session.lock().stream_subs.get(filter).cloned();
        if let Some(old) = &existing {
            if !old.is_ended()
                && old.start == start
                && old.options == options
                && old.sub_id == sub_id
            {
                if let Some(note) = pending_note {
                    reasons.push(format!("{filter}: {note}"));
                }
                if self.feeders.get(filter).is_none_or(|j| j.is_finished()) {
                    self.start_feeder(old.clone());
                }
                return (options.qos.as_u8(), None);
            }
        }
        let sub = StreamSub::new(filter.to_string(), t.name.clone(), options, sub_id, start);
        if let Some(h) = &handle {
            let e = engine.clone();
            tokio::task::block_in_place(|| sub.bind_now(&e, h));
        }
        if let Some(note) = pending_note {
            reasons.push(format!("{filter}: {note}"));
        }
        let old = self
            .session
            .lock()
            .stream_subs
            .insert(filter.to_string(), sub.clone());
        if let Some(old) = old {
            old.end();
            // What the replaced subscription queued and did not send yet is dropped (it was
            // never delivered); the new one reads from its own start.
            self.session.drop_queued_stream(&old);
        }
        let ticket = self.persistent().then(|| {
            self.broker.persist.submit(Op::StreamSubPut {
                client: self.client_id.clone(),
                filter: filter.to_string(),
                value: sub.stored().encode(),
            })
        });
        self.start_feeder(sub);
        (options.qos.as_u8(), ticket)
    }

    /// May this client auto-create the stream of `filter` (`create` on the stream name and
    /// `subscribe` on the filter the new stream would capture)?
    fn allowed_auto_create(&self, filter: &str) -> bool {
        let auth = self.broker.auth();
        let req = Request {
            username: self.username.as_deref(),
            client_id: &self.client_id,
            ip: self.peer.ip(),
            action: Action::Subscribe,
            topic: filter,
        };
        let d = auth.acl.check_subscribe(&req, true);
        if !d.allowed {
            debug!(topic = filter, decision = %d, "ACL denied stream auto-create");
        }
        d.allowed
    }

    /// Send the final DISCONNECT, flush, detach from the session, schedule its expiry and the
    /// will.
    async fn finish<W: AsyncWrite + Unpin>(mut self, close: Close, writer: &mut W) {
        // Stream feeders belong to the connection; the positions stay with the session.
        for (_, j) in self.feeders.drain() {
            j.abort();
        }
        let stream_subs: Vec<Arc<StreamSub>> =
            self.session.lock().stream_subs.values().cloned().collect();
        for sub in &stream_subs {
            crate::streams::save_position(&self.broker.persist, &self.session, sub, true);
        }
        // Messages already appended: wait (bounded) until durable, then deliver and ack them,
        // so nothing stored is left unrouted.
        let deadline = Instant::now() + Duration::from_millis(FLUSH_TIMEOUT_MS);
        while self.pending.iter().any(|e| e.counted)
            && !self.completions.failed.load(Ordering::Acquire)
            && Instant::now() < deadline
        {
            let _ = tokio::time::timeout(Duration::from_millis(5), self.waker.notified()).await;
            if self.process_completions().is_err() {
                break;
            }
        }
        let _ = self.process_completions();
        self.pending.clear();
        self.low.store(u64::MAX, Ordering::SeqCst);
        // Bytes behind a write barrier go out only once the index has flushed them.
        while !self.barriers.is_empty() && Instant::now() < deadline {
            if self.writable() == self.wbuf.len() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let writable = self.writable();
        self.wbuf.truncate(writable);
        self.barriers.clear();
        if let (Some(code), true) = (close.reason, self.version.is_v5()) {
            let mut d = Disconnect::new(code);
            if code == rc::QUOTA_EXCEEDED {
                d.properties.reason_string = Some("outbound queue limit reached".into());
            }
            self.encode(&Packet::Disconnect(d));
        }
        if !self.wbuf.is_empty() {
            let buf = std::mem::take(&mut self.wbuf);
            let _ = tokio::time::timeout(
                Duration::from_millis(FLUSH_TIMEOUT_MS),
                writer.write_all(&buf),
            )
            .await;
        }
        let _ =
            tokio::time::timeout(Duration::from_millis(FLUSH_TIMEOUT_MS), writer.shutdown()).await;
        self.broker
            .stats
            .clients_connected
            .fetch_sub(1, Ordering::Relaxed);

        let (still_ours, resumed_elsewhere, expiry) = {
            let mut st = self.session.lock();
            if !st.ended && st.generation == self.generation {
                self.session.set_online(&mut st, false);
                st.waker = None;
                (true, false, st.expiry_s)
            } else {
                (false, !st.ended, 0)
            }
        };
        // A new connection to this session (a take-over, or a reconnect that came before
        // this connection finished closing) cancels a delayed will [MQTT-3.1.3-9].
        let taken_over = matches!(close.reason, Some(rc::SESSION_TAKEN_OVER)) || resumed_elsewhere;
        debug!(peer = %self.peer, will = close.will, "client disconnected");
        let broker = self.broker.clone();
        if still_ours {
            broker
                .lite
                .send(crate::lite::Event::Offline(self.session.clone()));
        }
        if still_ours {
            if expiry > 0 {
                broker.persist.submit(Op::SessionPut {
                    client: self.client_id.clone(),
                    meta: SessionMeta {
                        expiry_s: expiry,
                        protocol: self.version.level(),
                        disconnected_at_us: crate::message::now_us(),
                        will_delay_s: self
                            .will
                            .as_ref()
                            .filter(|_| close.will)
                            .and_then(|w| w.properties.will_delay_interval)
                            .unwrap_or(0),
                    },
                });
            }
            schedule_expiry(&broker, &self.session, self.generation, expiry);
        }
        let Some(will) = self.will.take().filter(|_| close.will) else {
            if self.persistent() {
                broker.persist.submit(Op::WillRemove {
                    client: self.client_id.clone(),
                });
            }
            return;
        };
        let delay = will.properties.will_delay_interval.unwrap_or(0);
        if taken_over {
            // A new connection for this client id exists: a delayed will is cancelled; an
            // immediate one is published [MQTT-3.1.3-9].
            if delay == 0 {
                publish_will(&broker, &self.client_id, will);
            }
            return;
        }
        let delay = if still_ours { delay.min(expiry) } else { 0 };
        if delay == 0 {
            publish_will(&broker, &self.client_id, will);
        } else {
            let session = self.session.clone();
            let generation = self.generation;
            let client_id = self.client_id.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(u64::from(delay))).await;
                let reconnected = {
                    let st = session.lock();
                    st.generation != generation || st.connected
                };
                if !reconnected {
                    publish_will(&broker, &client_id, will);
                }
            });
        }
    }
}

/// After a restart: expiry timers for the restored (offline) sessions, and pending wills.
pub fn start_restored_timers(broker: &Arc<Broker>, restored: crate::broker::Restored) {
    for (session, left) in restored.expiries {
        let generation = session.lock().generation;
        schedule_expiry(broker, &session, generation, left.max(1));
    }
    for (client, msg, due_s) in restored.wills {
        let broker = broker.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(due_s)).await;
            let resumed = broker.get_session(&client).is_some_and(|s| {
                let st = s.lock();
                st.generation != 0 || st.connected
            });
            broker.persist.submit(Op::WillRemove {
                client: client.clone(),
            });
            if !resumed {
                broker.publish_internal(msg);
            }
        });
    }
}

/// Remove the session after its expiry interval unless a connection resumed it.
fn schedule_expiry(broker: &Arc<Broker>, session: &Arc<Session>, generation: u64, expiry_s: u32) {
    if expiry_s == 0 {
        broker.expire_session(session, generation);
    } else if expiry_s != u32::MAX {
        let broker = broker.clone();
        let session = session.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(u64::from(expiry_s))).await;
            broker.expire_session(&session, generation);
        });
    }
}

fn will_properties(w: &Will) -> lanemq_protocol::PublishProperties {
    lanemq_protocol::PublishProperties {
        payload_format_indicator: w.properties.payload_format_indicator,
        message_expiry_interval: w.properties.message_expiry_interval,
        content_type: w.properties.content_type.clone(),
        response_topic: w.properties.response_topic.clone(),
        correlation_data: w.properties.correlation_data.clone(),
        user_properties: w.properties.user_properties.clone(),
        ..Default::default()
    }
}

fn publish_will(broker: &Arc<Broker>, client_id: &Arc<str>, will: Will) {
    broker.persist.submit(Op::WillRemove {
        client: client_id.clone(),
    });
    let mut props = lanemq_protocol::PublishProperties {
        payload_format_indicator: will.properties.payload_format_indicator,
        message_expiry_interval: will.properties.message_expiry_interval,
        content_type: will.properties.content_type,
        response_topic: will.properties.response_topic,
        correlation_data: will.properties.correlation_data,
        user_properties: will.properties.user_properties,
        ..Default::default()
    };
    props.topic_alias = None;
    let msg = Message::new(
        will.topic.as_str().into(),
        will.payload,
        will.qos,
        will.retain,
        props,
        client_id.clone(),
    );
    broker.publish_internal(msg);
}
