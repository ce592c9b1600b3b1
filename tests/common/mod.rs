//! Shared helpers for the black-box tests: an in-process server on `127.0.0.1:0` and a raw
//! packet-level MQTT client built on the lanemq-protocol codec.
#![allow(dead_code, clippy::unwrap_used)]

use bytes::{Bytes, BytesMut};
use lanemq_broker::{Config, ListenerConfig, Server};
use lanemq_protocol::{
    decode, encode, ConnAck, Connect, ConnectProperties, Disconnect, Packet, ProtocolVersion,
    PubResp, Publish, PublishProperties, QoS, SubAck, Subscribe, SubscribeFilter,
    SubscribeProperties, SubscriptionOptions, UnsubAck, Unsubscribe,
};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Default wait for a packet that must arrive.
pub const RECV_MS: u64 = 2_000;
/// Wait used to assert that nothing arrives.
pub const QUIET_MS: u64 = 250;

/// A configuration with one TCP listener on `127.0.0.1:0` and `$SYS` disabled.
pub fn config() -> Config {
    let mut cfg = Config {
        listeners: vec![ListenerConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            ..ListenerConfig::default()
        }],
        ..Config::default()
    };
    cfg.server.sys_interval_s = 0;
    cfg.server.shutdown_grace_ms = 1_000;
    cfg.server.data_dir = temp_data_dir();
    // Tests that need the REST API enable it on 127.0.0.1:0.
    cfg.admin.enable = false;
    // The test command runs the protocol tests a second time with every idle moment
    // hibernating (`LANEMQ_TEST_HIBERNATE_MS=1`): each connection then leaves its task and
    // comes back from the parking lot between most of its packets.
    if let Some(ms) = std::env::var("LANEMQ_TEST_HIBERNATE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        cfg.mqtt.idle_hibernate_ms = ms;
    }
    cfg
}

/// A fresh, empty data directory for one test server (under the system temp dir).
pub fn temp_data_dir() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "lanemq-test-{}-{}-{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A running in-process broker.
pub struct TestServer {
    pub server: Option<Server>,
    pub addr: SocketAddr,
}

impl TestServer {
    pub async fn start(cfg: Config) -> TestServer {
        cfg.validate().expect("test config is valid");
        let server = Server::start(cfg).await.expect("server starts");
        let addr = server.local_addrs()[0];
        TestServer {
            server: Some(server),
            addr,
        }
    }

    pub async fn default() -> TestServer {
        TestServer::start(config()).await
    }

    pub fn server(&self) -> &Server {
        self.server.as_ref().expect("server running")
    }

    pub async fn shutdown(&mut self, grace: Duration) {
        if let Some(s) = self.server.take() {
            s.shutdown(grace).await;
        }
    }

    /// A fresh MQTT 5 client (clean start, no session expiry).
    pub async fn v5(&self, client_id: &str) -> RawClient {
        RawClient::connect_ok(self.addr, connect_v5(client_id)).await
    }

    /// A fresh MQTT 3.1.1 client (clean session).
    pub async fn v311(&self, client_id: &str) -> RawClient {
        RawClient::connect_ok(self.addr, connect_v311(client_id)).await
    }

    /// Assert that the broker still serves a new client: subscribe, publish QoS 1, receive.
    pub async fn assert_alive(&self) {
        let mut c = self.v5("").await;
        let topic = format!("alive/{}", rand_suffix());
        c.subscribe(&topic, QoS::AtLeastOnce).await;
        c.publish_qos1(&topic, b"ping").await;
        let p = c.recv_publish().await;
        assert_eq!(p.topic, topic);
        assert_eq!(&p.payload[..], b"ping");
        c.disconnect().await;
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// A CONNECT for MQTT 5 with clean start, keep alive 60 and no properties.
pub fn connect_v5(client_id: &str) -> Connect {
    Connect {
        protocol: ProtocolVersion::V5,
        clean_start: true,
        keep_alive: 60,
        client_id: client_id.to_string(),
        will: None,
        username: None,
        password: None,
        properties: ConnectProperties::default(),
    }
}

/// A CONNECT for MQTT 3.1.1 with clean session and keep alive 60.
pub fn connect_v311(client_id: &str) -> Connect {
    Connect {
        protocol: ProtocolVersion::V311,
        ..connect_v5(client_id)
    }
}

/// Encode one packet for `version`.
pub fn bytes_of(p: &Packet, version: ProtocolVersion) -> Vec<u8> {
    let mut out = BytesMut::new();
    encode(p, version, &mut out);
    out.to_vec()
}

pub fn publish(topic: &str, qos: QoS, packet_id: u16, payload: &[u8]) -> Publish {
    Publish {
        dup: false,
        qos,
        retain: false,
        topic: topic.to_string(),
        packet_id,
        properties: PublishProperties::default(),
        payload: Bytes::copy_from_slice(payload),
    }
}

pub fn sub_opts(qos: QoS) -> SubscriptionOptions {
    SubscriptionOptions {
        qos,
        ..Default::default()
    }
}

/// Why [`RawClient::try_recv`] returned no packet.
#[derive(Debug, PartialEq, Eq)]
pub enum RecvError {
    Timeout,
    Closed,
    Decode(String),
}

pub struct RawClient {
    pub stream: TcpStream,
    pub version: ProtocolVersion,
    rbuf: BytesMut,
    next_pid: u16,
}

impl RawClient {
    /// Open a TCP connection without sending anything.
    pub async fn tcp(addr: SocketAddr, version: ProtocolVersion) -> RawClient {
        let stream = TcpStream::connect(addr).await.expect("tcp connect");
        stream.set_nodelay(true).unwrap();
        RawClient {
            stream,
            version,
            rbuf: BytesMut::with_capacity(4096),
            next_pid: 1,
        }
    }

    /// Connect (CONNACK 0x00 required) over a socket whose receive buffer is as small as the
    /// kernel allows: a client that stops reading then stops the broker's writes at once.
    pub async fn connect_small_rcvbuf(addr: SocketAddr, c: Connect) -> RawClient {
        let sock = tokio::net::TcpSocket::new_v4().expect("socket");
        sock.set_recv_buffer_size(4096).expect("SO_RCVBUF");
        let stream = sock.connect(addr).await.expect("tcp connect");
        stream.set_nodelay(true).unwrap();
        let mut client = RawClient {
            stream,
            version: c.protocol,
            rbuf: BytesMut::with_capacity(4096),
            next_pid: 1,
        };
        client.send(Packet::Connect(Box::new(c))).await;
        match client.recv().await {
            Packet::ConnAck(ack) => assert_eq!(ack.reason_code, 0, "CONNACK refused: {ack:?}"),
            other => panic!("expected CONNACK, got {other:?}"),
        }
        client
    }

    /// Publish `n` QoS 1 messages to `topic` (payload: the index as 4 big-endian bytes, then
    /// `pad` zero bytes) with at most `window` unacknowledged; returns every PUBACK code.
    pub async fn publish_qos1_pipelined(
        &mut self,
        topic: &str,
        n: u32,
        pad: usize,
        window: usize,
    ) -> Vec<u8> {
        let mut codes = Vec::with_capacity(n as usize);
        let mut outstanding = 0usize;
        let mut next = 0u32;
        while codes.len() < n as usize {
            while next < n && outstanding < window {
                let mut payload = next.to_be_bytes().to_vec();
                payload.resize(4 + pad, 0);
                let pid = self.next_pid();
                self.send(Packet::Publish(publish(
                    topic,
                    QoS::AtLeastOnce,
                    pid,
                    &payload,
                )))
                .await;
                next += 1;
                outstanding += 1;
            }
            match self.recv().await {
                Packet::PubAck(a) => {
                    codes.push(a.reason_code);
                    outstanding -= 1;
                }
                other => panic!("expected PUBACK, got {other:?}"),
            }
        }
        codes
    }

    /// Send CONNECT and return the client and whatever the server answered first.
    pub async fn connect(addr: SocketAddr, c: Connect) -> (RawClient, Result<Packet, RecvError>) {
        let mut client = RawClient::tcp(addr, c.protocol).await;
        client.send(Packet::Connect(Box::new(c))).await;
        let first = client.try_recv(Duration::from_millis(RECV_MS)).await;
        (client, first)
    }

    /// Connect and require CONNACK 0x00; returns the client (the CONNACK is in `last_connack`).
    pub async fn connect_ok(addr: SocketAddr, c: Connect) -> RawClient {
        RawClient::connect_ack(addr, c).await.0
    }

    /// Connect and require CONNACK 0x00; returns the client and the CONNACK.
    pub async fn connect_ack(addr: SocketAddr, c: Connect) -> (RawClient, ConnAck) {
        let (client, first) = RawClient::connect(addr, c).await;
        match first {
            Ok(Packet::ConnAck(ack)) => {
                assert_eq!(ack.reason_code, 0, "CONNACK refused: {ack:?}");
                (client, ack)
            }
            other => panic!("expected CONNACK, got {other:?}"),
        }
    }

    pub fn next_pid(&mut self) -> u16 {
        let pid = self.next_pid;
        self.next_pid = self.next_pid.wrapping_add(1).max(1);
        pid
    }

    pub async fn send(&mut self, p: Packet) {
        let b = bytes_of(&p, self.version);
        self.send_raw(&b).await;
    }

    /// Write bytes; errors are ignored (the server may already have closed).
    pub async fn send_raw(&mut self, b: &[u8]) {
        let _ = self.stream.write_all(b).await;
        let _ = self.stream.flush().await;
    }

    /// The next packet, or why there is none within `wait`.
    pub async fn try_recv(&mut self, wait: Duration) -> Result<Packet, RecvError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match decode(&mut self.rbuf, self.version, 0) {
                Ok(Some(p)) => return Ok(p),
                Ok(None) => {}
                Err(e) => return Err(RecvError::Decode(e.to_string())),
            }
            match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.rbuf)).await {
                Err(_) => return Err(RecvError::Timeout),
                Ok(Ok(0)) | Ok(Err(_)) => return Err(RecvError::Closed),
                Ok(Ok(_)) => {}
            }
        }
    }

    /// The next packet; panics if none arrives within [`RECV_MS`].
    pub async fn recv(&mut self) -> Packet {
        match self.try_recv(Duration::from_millis(RECV_MS)).await {
            Ok(p) => p,
            Err(e) => panic!("expected a packet, got {e:?}"),
        }
    }

    pub async fn recv_publish(&mut self) -> Publish {
        match self.recv().await {
            Packet::Publish(p) => p,
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }

    /// Receive a PUBLISH and acknowledge it (PUBACK, or PUBREC/PUBREL/PUBCOMP for QoS 2).
    pub async fn recv_publish_ack(&mut self) -> Publish {
        let p = self.recv_publish().await;
        match p.qos {
            QoS::AtMostOnce => {}
            QoS::AtLeastOnce => {
                self.send(Packet::PubAck(PubResp::new(p.packet_id, 0)))
                    .await
            }
            QoS::ExactlyOnce => {
                self.send(Packet::PubRec(PubResp::new(p.packet_id, 0)))
                    .await;
                match self.recv().await {
                    Packet::PubRel(r) => assert_eq!(r.packet_id, p.packet_id),
                    other => panic!("expected PUBREL, got {other:?}"),
                }
                self.send(Packet::PubComp(PubResp::new(p.packet_id, 0)))
                    .await;
            }
        }
        p
    }

    /// Assert that nothing arrives (and the connection stays open) for `ms`.
    pub async fn expect_nothing(&mut self, ms: u64) {
        match self.try_recv(Duration::from_millis(ms)).await {
            Err(RecvError::Timeout) => {}
            other => panic!("expected silence, got {other:?}"),
        }
    }

    /// Assert that nothing but a close follows (no packet) within [`RECV_MS`].
    pub async fn expect_closed(&mut self) {
        match self.try_recv(Duration::from_millis(RECV_MS)).await {
            Err(RecvError::Closed) => {}
            other => panic!("expected the connection to be closed, got {other:?}"),
        }
    }

    /// Assert a DISCONNECT with `code` (MQTT 5), then the close.
    pub async fn expect_disconnect(&mut self, code: u8) {
        match self.try_recv(Duration::from_millis(RECV_MS)).await {
            Ok(Packet::Disconnect(d)) => assert_eq!(
                d.reason_code, code,
                "DISCONNECT reason 0x{:02X}, expected 0x{code:02X} ({d:?})",
                d.reason_code
            ),
            other => panic!("expected DISCONNECT 0x{code:02X}, got {other:?}"),
        }
        self.expect_closed().await;
    }

    /// Subscribe to one filter with plain options; asserts the SUBACK grants `qos`.
    pub async fn subscribe(&mut self, filter: &str, qos: QoS) {
        let ack = self.subscribe_with(&[(filter, sub_opts(qos))], None).await;
        assert_eq!(ack.reason_codes, vec![qos.as_u8()], "SUBACK for {filter}");
    }

    /// SUBSCRIBE with explicit options and subscription identifier; returns the SUBACK.
    pub async fn subscribe_with(
        &mut self,
        filters: &[(&str, SubscriptionOptions)],
        sub_id: Option<u32>,
    ) -> SubAck {
        let pid = self.next_pid();
        self.send(Packet::Subscribe(Subscribe {
            packet_id: pid,
            filters: filters
                .iter()
                .map(|(f, o)| SubscribeFilter {
                    filter: f.to_string(),
                    options: *o,
                })
                .collect(),
            properties: SubscribeProperties {
                subscription_identifier: sub_id,
                user_properties: Vec::new(),
            },
        }))
        .await;
        match self.recv().await {
            Packet::SubAck(a) => {
                assert_eq!(a.packet_id, pid);
                a
            }
            other => panic!("expected SUBACK, got {other:?}"),
        }
    }

    pub async fn unsubscribe(&mut self, filter: &str) -> UnsubAck {
        let pid = self.next_pid();
        self.send(Packet::Unsubscribe(Unsubscribe {
            packet_id: pid,
            filters: vec![filter.to_string()],
            user_properties: Vec::new(),
        }))
        .await;
        match self.recv().await {
            Packet::UnsubAck(a) => {
                assert_eq!(a.packet_id, pid);
                a
            }
            other => panic!("expected UNSUBACK, got {other:?}"),
        }
    }

    pub async fn publish_qos0(&mut self, topic: &str, payload: &[u8]) {
        self.send(Packet::Publish(publish(topic, QoS::AtMostOnce, 0, payload)))
            .await;
    }

    /// Publish QoS 1 and wait for the PUBACK (returns its reason code).
    pub async fn publish_qos1(&mut self, topic: &str, payload: &[u8]) -> u8 {
        let pid = self.next_pid();
        self.publish_acked(publish(topic, QoS::AtLeastOnce, pid, payload))
            .await
    }

    /// Publish a QoS 1 or QoS 2 PUBLISH and complete its flow; returns PUBACK/PUBREC reason.
    pub async fn publish_acked(&mut self, p: Publish) -> u8 {
        let pid = p.packet_id;
        let qos = p.qos;
        self.send(Packet::Publish(p)).await;
        match qos {
            QoS::AtMostOnce => 0,
            QoS::AtLeastOnce => match self.recv().await {
                Packet::PubAck(a) => {
                    assert_eq!(a.packet_id, pid);
                    a.reason_code
                }
                other => panic!("expected PUBACK, got {other:?}"),
            },
            QoS::ExactlyOnce => {
                let code = match self.recv().await {
                    Packet::PubRec(a) => {
                        assert_eq!(a.packet_id, pid);
                        a.reason_code
                    }
                    other => panic!("expected PUBREC, got {other:?}"),
                };
                self.send(Packet::PubRel(PubResp::new(pid, 0))).await;
                match self.recv().await {
                    Packet::PubComp(a) => {
                        assert_eq!(a.packet_id, pid);
                        assert_eq!(a.reason_code, 0);
                    }
                    other => panic!("expected PUBCOMP, got {other:?}"),
                }
                code
            }
        }
    }

    /// A normal DISCONNECT (0x00), then wait for the server to close.
    pub async fn disconnect(mut self) {
        self.send(Packet::Disconnect(Disconnect::new(0))).await;
        let _ = self.try_recv(Duration::from_millis(RECV_MS)).await;
    }

    /// Send DISCONNECT with a reason and optional session expiry, then wait for the close.
    pub async fn disconnect_with(mut self, code: u8, session_expiry: Option<u32>) {
        let mut d = Disconnect::new(code);
        d.properties.session_expiry_interval = session_expiry;
        self.send(Packet::Disconnect(d)).await;
        let _ = self.try_recv(Duration::from_millis(RECV_MS)).await;
    }
}

/// Connect `c` over a socket that does not read, and fill the broker's writes to it (about
/// 12 MB of QoS 0 messages on `fill_topic`): when this connection closes, the broker's last
/// flush to it waits for its flush timeout, so a client that comes back at once finds the old
/// connection still closing (the window where session state used to be misread).
/// `subs` are subscribed (QoS 1) before the flood.
pub async fn stalled(addr: SocketAddr, c: Connect, fill_topic: &str, subs: &[&str]) -> RawClient {
    let mut old = RawClient::connect_small_rcvbuf(addr, c).await;
    for f in subs {
        old.subscribe(f, QoS::AtLeastOnce).await;
    }
    old.subscribe(fill_topic, QoS::AtMostOnce).await;
    let mut p = RawClient::connect_ok(addr, connect_v5("")).await;
    let big = vec![b'x'; 60_000];
    for _ in 0..200 {
        p.publish_qos0(fill_topic, &big).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    old
}

/// Wait until `f` is true (polling every 10 ms) or `ms` passed; returns the final value.
pub async fn eventually(ms: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(ms);
    loop {
        if f() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A rumqttc MQTT 5 client whose event loop runs in a task; incoming PUBLISH packets arrive on
/// the returned channel. Returns once CONNACK was received.
pub async fn rumqttc_v5(
    addr: SocketAddr,
    client_id: &str,
) -> (
    rumqttc::v5::AsyncClient,
    tokio::sync::mpsc::UnboundedReceiver<rumqttc::v5::mqttbytes::v5::Packet>,
) {
    use rumqttc::v5::mqttbytes::v5::Packet as P5;
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};
    let mut opts = MqttOptions::new(client_id, addr.ip().to_string(), addr.port());
    opts.set_keep_alive(Duration::from_secs(30));
    let (client, mut el) = AsyncClient::new(opts, 64);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (ctx, crx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut ctx = Some(ctx);
        loop {
            match el.poll().await {
                Ok(Event::Incoming(P5::ConnAck(_))) => {
                    if let Some(c) = ctx.take() {
                        let _ = c.send(());
                    }
                }
                Ok(Event::Incoming(p)) => {
                    if tx.send(p).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    tokio::time::timeout(Duration::from_millis(RECV_MS), crx)
        .await
        .expect("rumqttc v5 CONNACK in time")
        .expect("rumqttc v5 connected");
    (client, rx)
}

/// Like [`rumqttc_v5`] for MQTT 3.1.1.
pub async fn rumqttc_v311(
    addr: SocketAddr,
    client_id: &str,
    clean_session: bool,
) -> (
    rumqttc::AsyncClient,
    tokio::sync::mpsc::UnboundedReceiver<rumqttc::Packet>,
) {
    use rumqttc::{AsyncClient, Event, MqttOptions, Packet as P4};
    let mut opts = MqttOptions::new(client_id, addr.ip().to_string(), addr.port());
    opts.set_keep_alive(Duration::from_secs(30));
    opts.set_clean_session(clean_session);
    let (client, mut el) = AsyncClient::new(opts, 64);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (ctx, crx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut ctx = Some(ctx);
        loop {
            match el.poll().await {
                Ok(Event::Incoming(P4::ConnAck(a))) => {
                    if let Some(c) = ctx.take() {
                        let _ = c.send(a.session_present);
                    }
                }
                Ok(Event::Incoming(p)) => {
                    if tx.send(p).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    tokio::time::timeout(Duration::from_millis(RECV_MS), crx)
        .await
        .expect("rumqttc CONNACK in time")
        .expect("rumqttc connected");
    (client, rx)
}

/// Receive from a channel within [`RECV_MS`].
pub async fn recv_chan<T>(rx: &mut tokio::sync::mpsc::UnboundedReceiver<T>) -> T {
    tokio::time::timeout(Duration::from_millis(RECV_MS), rx.recv())
        .await
        .expect("message in time")
        .expect("channel open")
}

/// The next PUBLISH received by a rumqttc v5 client (other packets skipped).
pub async fn rumqttc_v5_publish(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<rumqttc::v5::mqttbytes::v5::Packet>,
) -> rumqttc::v5::mqttbytes::v5::Publish {
    loop {
        if let rumqttc::v5::mqttbytes::v5::Packet::Publish(p) = recv_chan(rx).await {
            return p;
        }
    }
}

/// Wait for the next SUBACK of a rumqttc v5 client.
pub async fn rumqttc_v5_suback(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<rumqttc::v5::mqttbytes::v5::Packet>,
) -> rumqttc::v5::mqttbytes::v5::SubAck {
    loop {
        if let rumqttc::v5::mqttbytes::v5::Packet::SubAck(a) = recv_chan(rx).await {
            return a;
        }
    }
}

/// The next PUBLISH received by a rumqttc 3.1.1 client (other packets skipped).
pub async fn rumqttc_v311_publish(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<rumqttc::Packet>,
) -> rumqttc::Publish {
    loop {
        if let rumqttc::Packet::Publish(p) = recv_chan(rx).await {
            return p;
        }
    }
}

/// Wait for the next SUBACK of a rumqttc 3.1.1 client.
pub async fn rumqttc_v311_suback(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<rumqttc::Packet>,
) -> rumqttc::SubAck {
    loop {
        if let rumqttc::Packet::SubAck(a) = recv_chan(rx).await {
            return a;
        }
    }
}

// --- Helpers for the stream tests (tests/streams.rs, tests/streams_restart.rs) ---------------

/// A permissive ACL file (`default allow`) in a fresh temp directory: the embedded default ACL
/// denies `$stream/#` and `$s/#`.
pub fn permissive_acl_file() -> std::path::PathBuf {
    let dir = temp_data_dir().with_extension("acl");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("allow.acl");
    std::fs::write(&p, "default allow\n").unwrap();
    p
}

/// [`config`] with a permissive ACL, so that stream subscriptions are allowed.
pub fn stream_config() -> Config {
    let mut cfg = config();
    cfg.server.acl_file = Some(permissive_acl_file());
    cfg
}

/// A user property of a PUBLISH.
pub fn user_prop<'a>(p: &'a Publish, key: &str) -> Option<&'a str> {
    p.properties
        .user_properties
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The log position of a delivered stream message (user property `stream-offset` = `@<n>`).
pub fn stream_offset_of(p: &Publish) -> u64 {
    let v = user_prop(p, "stream-offset")
        .unwrap_or_else(|| panic!("no stream-offset user property on {p:?}"));
    v.strip_prefix('@')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("stream-offset {v:?} is not @<n>"))
}

impl RawClient {
    /// SUBSCRIBE with options, subscription identifier and user properties; returns the SUBACK.
    pub async fn subscribe_props(
        &mut self,
        filters: &[(&str, SubscriptionOptions)],
        sub_id: Option<u32>,
        user_properties: &[(&str, &str)],
    ) -> SubAck {
        let pid = self.next_pid();
        self.send(Packet::Subscribe(Subscribe {
            packet_id: pid,
            filters: filters
                .iter()
                .map(|(f, o)| SubscribeFilter {
                    filter: f.to_string(),
                    options: *o,
                })
                .collect(),
            properties: SubscribeProperties {
                subscription_identifier: sub_id,
                user_properties: user_properties
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            },
        }))
        .await;
        match self.recv().await {
            Packet::SubAck(a) => {
                assert_eq!(a.packet_id, pid);
                a
            }
            other => panic!("expected SUBACK, got {other:?}"),
        }
    }

    /// Send PINGREQ and wait for PINGRESP: everything sent before was processed by the server.
    /// Returns the PUBLISH packets that arrived before the PINGRESP (any other packet panics).
    pub async fn sync(&mut self) -> Vec<Publish> {
        self.send(Packet::PingReq).await;
        let mut got = Vec::new();
        for _ in 0..1_000_000 {
            match self.recv().await {
                Packet::PingResp => return got,
                Packet::Publish(p) => got.push(p),
                other => panic!("expected PINGRESP, got {other:?}"),
            }
        }
        panic!("no PINGRESP after {} PUBLISH packets", got.len());
    }
}
