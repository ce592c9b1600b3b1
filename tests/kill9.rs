//! Crash durability: `kill -9` the real `lanemq` binary at random moments under QoS 1 and
//! QoS 2 load and check that nothing acknowledged is lost (issue 3, docs/durability.md).
//!
//! A child broker runs with `[storage] fsync = "always"` on a temp data dir and a free
//! 127.0.0.1 port. Publishers at QoS 1 and QoS 2 record a message as acknowledged when its
//! PUBACK (QoS 1) or PUBREC (QoS 2: the broker's promise starts there) arrives. A persistent
//! subscriber (clean start 0, session expiry 3600, subscription QoS 2) records every delivered
//! id, acknowledges properly and de-duplicates QoS 2 by packet id as a real client does (a QoS 2
//! PUBLISH whose packet id is still awaiting PUBREL is not a new message). Each cycle the broker
//! is killed 100–800 ms after the load (re)started, restarted on the same port and data dir,
//! and every client reconnects; the subscriber never subscribes again.
//!
//! At the end: every acknowledged message was delivered (lost = 0), QoS 2 exactly once, QoS 1
//! at least once (duplicates counted), a retained message set before the first kill is still
//! retained, and the subscription still matches new messages.
//!
//! ```sh
//! cargo build --release -p lanemq
//! KILL9_CYCLES=3 cargo test --release -p lanemq-tests --test it kill9:: -- --nocapture
//! ```
//!
//! Environment: `KILL9_CYCLES` (default 3), `KILL9_SEED` (replay a run), `LANEMQ_BIN` (else
//! the newer of `target/release/lanemq` and `target/debug/lanemq`), `KEEP_TMP=1` (keep the
//! data dir and broker log). The data dir is also kept when the test fails.
#![allow(clippy::unwrap_used)]

use bytes::{Bytes, BytesMut};
use lanemq_protocol::{
    decode, encode, ConnAck, Connect, ConnectProperties, Disconnect, Packet, ProtocolVersion,
    PubResp, Publish, PublishProperties, QoS, Subscribe, SubscribeFilter, SubscribeProperties,
    SubscriptionOptions,
};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The storage section of the child broker's config.
const STORAGE_TOML: &str = "[storage]\nfsync = \"always\"\n";
/// Publishers per QoS level.
const PUBLISHERS_PER_QOS: u64 = 2;
/// Unacknowledged messages each publisher keeps in flight.
const PUBLISH_WINDOW: usize = 8;
/// Receive Maximum of the subscriber.
const SUB_RECEIVE_MAX: u16 = 64;
const SUB_ID: &str = "k9-sub";
const RETAINED_TOPIC: &str = "k9-retained/config";
const RETAINED_PAYLOAD: &[u8] = b"retained-before-first-kill";

// ---------------------------------------------------------------------------------------------
// The child broker (the real binary).

use crate::child;

use child::Broker;

// ---------------------------------------------------------------------------------------------
// A minimal packet-level client that never panics on I/O (the broker dies under it).

#[derive(Debug)]
enum RecvErr {
    Timeout,
    Closed,
}

struct Conn {
    stream: TcpStream,
    rbuf: BytesMut,
    wbuf: BytesMut,
}

impl Conn {
    /// TCP connect, CONNECT, CONNACK with reason 0.
    async fn open(addr: SocketAddr, c: Connect) -> Result<(Conn, ConnAck), String> {
        let stream =
            match tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return Err(format!("connect: {e}")),
                Err(_) => return Err("connect: timeout".into()),
            };
        let _ = stream.set_nodelay(true);
        let mut conn = Conn {
            stream,
            rbuf: BytesMut::with_capacity(16 * 1024),
            wbuf: BytesMut::with_capacity(16 * 1024),
        };
        conn.queue(&Packet::Connect(Box::new(c)));
        conn.flush()
            .await
            .map_err(|_| "send CONNECT failed".to_string())?;
        match conn.recv(Duration::from_secs(3)).await {
            Ok(Packet::ConnAck(a)) if a.reason_code == 0 => Ok((conn, a)),
            Ok(Packet::ConnAck(a)) => Err(format!("CONNACK 0x{:02X}", a.reason_code)),
            Ok(other) => Err(format!("expected CONNACK, got {other:?}")),
            Err(e) => Err(format!("no CONNACK: {e:?}")),
        }
    }

    fn queue(&mut self, p: &Packet) {
        encode(p, ProtocolVersion::V5, &mut self.wbuf);
    }

    async fn flush(&mut self) -> Result<(), RecvErr> {
        if self.wbuf.is_empty() {
            return Ok(());
        }
        let buf = self.wbuf.split();
        match tokio::time::timeout(Duration::from_secs(10), self.stream.write_all(&buf)).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(RecvErr::Closed),
        }
    }

    async fn send(&mut self, p: &Packet) -> Result<(), RecvErr> {
        self.queue(p);
        self.flush().await
    }

    async fn recv(&mut self, wait: Duration) -> Result<Packet, RecvErr> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match decode(&mut self.rbuf, ProtocolVersion::V5, 0) {
                Ok(Some(p)) => return Ok(p),
                Ok(None) => {}
                Err(_) => return Err(RecvErr::Closed),
            }
            match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.rbuf)).await {
                Err(_) => return Err(RecvErr::Timeout),
                Ok(Ok(0)) | Ok(Err(_)) => return Err(RecvErr::Closed),
                Ok(Ok(_)) => {}
            }
        }
    }
}

fn connect_packet(client_id: &str, clean_start: bool, session_expiry: Option<u32>) -> Connect {
    Connect {
        protocol: ProtocolVersion::V5,
        clean_start,
        keep_alive: 60,
        client_id: client_id.to_string(),
        will: None,
        username: None,
        password: None,
        properties: ConnectProperties {
            session_expiry_interval: session_expiry,
            receive_maximum: Some(SUB_RECEIVE_MAX),
            ..ConnectProperties::default()
        },
    }
}

fn publish_packet(topic: &str, qos: QoS, pid: u16, retain: bool, payload: Vec<u8>) -> Publish {
    Publish {
        dup: false,
        qos,
        retain,
        topic: topic.to_string(),
        packet_id: pid,
        properties: PublishProperties::default(),
        payload: Bytes::from(payload),
    }
}

/// Connect with retries (the broker may be restarting) until `deadline`.
async fn connect_retry(
    addr: SocketAddr,
    c: &Connect,
    deadline: Instant,
) -> Result<(Conn, ConnAck), String> {
    loop {
        match Conn::open(addr, c.clone()).await {
            Ok(x) => return Ok(x),
            Err(e) => {
                if Instant::now() >= deadline {
                    return Err(e);
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Shared state.

/// A message id: QoS, publisher number and sequence, carried in the payload as
/// `k9|<qos>|<publisher>|<seq>|<padding>`.
type MsgId = (u8, u64, u64);

fn payload_of(id: MsgId) -> Vec<u8> {
    format!("k9|{}|{}|{}|{}", id.0, id.1, id.2, "x".repeat(48)).into_bytes()
}

fn parse_payload(p: &[u8]) -> Option<MsgId> {
    let s = std::str::from_utf8(p).ok()?;
    let mut it = s.split('|');
    if it.next()? != "k9" {
        return None;
    }
    let qos = it.next()?.parse().ok()?;
    let publisher = it.next()?.parse().ok()?;
    let seq = it.next()?.parse().ok()?;
    Some((qos, publisher, seq))
}

#[derive(Default)]
struct Ctl {
    stop_publishing: AtomicBool,
    stop_subscriber: AtomicBool,
    /// Successful CONNACKs per publisher (index = publisher number).
    pub_connects: Vec<AtomicU64>,
    sub_connects: AtomicU64,
    errors: Mutex<Vec<String>>,
}

impl Ctl {
    fn error(&self, e: String) {
        eprintln!("kill9: {e}");
        self.errors.lock().unwrap().push(e);
    }
}

#[derive(Default)]
struct PubTally {
    /// Acknowledged (PUBACK / PUBREC with a success code).
    acked: HashSet<MsgId>,
    /// PUBACK / PUBREC with a failure code (not a promise).
    refused: u64,
    sent: u64,
    /// Sent but neither acknowledged nor refused when the connection died.
    abandoned: u64,
}

#[derive(Default)]
struct SubState {
    /// New deliveries per id (QoS 2 protocol duplicates excluded).
    deliveries: HashMap<MsgId, u32>,
    /// The subscriber's QoS 2 receive state: packet id -> id, from PUBREC until PUBREL.
    /// Kept across reconnects, as the session state of a real client.
    awaiting_rel: HashMap<u16, MsgId>,
    /// QoS 2 PUBLISH with a packet id still awaiting PUBREL (dropped as the protocol says).
    qos2_protocol_dups: u64,
    /// ... of which carried a different message than the one first received with that id.
    qos2_pid_conflicts: u64,
    /// Delivered with a QoS other than the one it was published with.
    wrong_qos: u64,
    unknown_payloads: u64,
    unknown_pubrel: u64,
    /// Reconnects answered with session present = 0.
    session_lost: u64,
    markers: HashSet<String>,
    subscribed: bool,
    /// First delivery of each QoS 2 message, to explain a duplicate.
    q2_first: HashMap<MsgId, Q2First>,
    /// Explanations of QoS 2 duplicates (printed at the end).
    q2_dup_reports: Vec<String>,
}

/// How a QoS 2 message was first delivered.
struct Q2First {
    packet_id: u16,
    connection: u64,
    dup: bool,
    released: bool,
}

// ---------------------------------------------------------------------------------------------
// Clients.

fn topic_of(qos: u8, publisher: u64) -> String {
    format!("k9/q{qos}/p{publisher}")
}

async fn publisher(
    addr: SocketAddr,
    qos: QoS,
    index: u64,
    ctl: Arc<Ctl>,
    tally: Arc<Mutex<PubTally>>,
) {
    let client_id = format!("k9-pub-{index}");
    let topic = topic_of(qos.as_u8(), index);
    let mut seq: u64 = 0;
    let mut next_pid: u16 = 0;
    let hard_deadline = Instant::now() + Duration::from_secs(3600);
    'connection: while Instant::now() < hard_deadline {
        if ctl.stop_publishing.load(Ordering::SeqCst) {
            return;
        }
        let c = connect_packet(&client_id, true, None);
        let mut conn = match connect_retry(addr, &c, Instant::now() + Duration::from_secs(30)).await
        {
            Ok((conn, _)) => conn,
            Err(e) => {
                ctl.error(format!(
                    "publisher {client_id}: cannot reconnect within 30 s: {e}"
                ));
                return;
            }
        };
        ctl.pub_connects[index as usize].fetch_add(1, Ordering::SeqCst);
        // packet id -> (message, PUBREC seen)
        let mut inflight: HashMap<u16, (MsgId, bool)> = HashMap::new();
        let mut last_progress = Instant::now();
        let mut stop_since: Option<Instant> = None;
        loop {
            let stopping = ctl.stop_publishing.load(Ordering::SeqCst);
            if stopping {
                let since = *stop_since.get_or_insert_with(Instant::now);
                if inflight.is_empty() || since.elapsed() > Duration::from_secs(10) {
                    let _ = conn.send(&Packet::Disconnect(Disconnect::new(0))).await;
                    let mut t = tally.lock().unwrap();
                    t.abandoned += inflight.values().filter(|(_, rec)| !rec).count() as u64;
                    return;
                }
            } else {
                let mut queued = 0;
                while inflight.len() < PUBLISH_WINDOW {
                    seq += 1;
                    let id = (qos.as_u8(), index, seq);
                    loop {
                        next_pid = next_pid.wrapping_add(1).max(1);
                        if !inflight.contains_key(&next_pid) {
                            break;
                        }
                    }
                    conn.queue(&Packet::Publish(publish_packet(
                        &topic,
                        qos,
                        next_pid,
                        false,
                        payload_of(id),
                    )));
                    inflight.insert(next_pid, (id, false));
                    queued += 1;
                }
                tally.lock().unwrap().sent += queued;
                if conn.flush().await.is_err() {
                    break;
                }
            }
            match conn.recv(Duration::from_millis(100)).await {
                Ok(Packet::PubAck(a)) => {
                    if let Some((id, _)) = inflight.remove(&a.packet_id) {
                        let mut t = tally.lock().unwrap();
                        if a.reason_code < 0x80 {
                            t.acked.insert(id);
                        } else {
                            t.refused += 1;
                        }
                        last_progress = Instant::now();
                    }
                }
                Ok(Packet::PubRec(a)) => {
                    let mut remove = false;
                    if let Some((id, rec)) = inflight.get_mut(&a.packet_id) {
                        let mut t = tally.lock().unwrap();
                        if a.reason_code < 0x80 {
                            t.acked.insert(*id);
                            *rec = true;
                        } else {
                            t.refused += 1;
                            remove = true;
                        }
                        last_progress = Instant::now();
                    }
                    if remove {
                        inflight.remove(&a.packet_id);
                    } else if conn
                        .send(&Packet::PubRel(PubResp::new(a.packet_id, 0)))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
                Ok(Packet::PubComp(a)) => {
                    inflight.remove(&a.packet_id);
                    last_progress = Instant::now();
                }
                Ok(Packet::Disconnect(_)) => break,
                Ok(_) => {}
                Err(RecvErr::Timeout) => {}
                Err(RecvErr::Closed) => break,
            }
            if !inflight.is_empty() && last_progress.elapsed() > Duration::from_secs(10) {
                ctl.error(format!(
                    "publisher {client_id}: no acknowledgement for 10 s with {} in flight \
                     (broker stopped acknowledging?)",
                    inflight.len()
                ));
                continue 'connection;
            }
        }
        // The connection died: unacknowledged messages are abandoned (new ids follow).
        let mut t = tally.lock().unwrap();
        t.abandoned += inflight.values().filter(|(_, rec)| !rec).count() as u64;
    }
}

/// The persistent subscriber: subscribes once, then only reconnects (clean start 0).
async fn subscriber(addr: SocketAddr, ctl: Arc<Ctl>, state: Arc<Mutex<SubState>>, seed: u64) {
    let mut rng = Rng(seed);
    let c = connect_packet(SUB_ID, false, Some(3600));
    let hard_deadline = Instant::now() + Duration::from_secs(3600);
    let mut first = true;
    while Instant::now() < hard_deadline && !ctl.stop_subscriber.load(Ordering::SeqCst) {
        if !first {
            // Stay offline a little so that messages queue in the stored session too.
            tokio::time::sleep(Duration::from_millis(rng.range(0, 300))).await;
        }
        let (mut conn, ack) =
            match connect_retry(addr, &c, Instant::now() + Duration::from_secs(30)).await {
                Ok(x) => x,
                Err(e) => {
                    ctl.error(format!("subscriber: cannot reconnect within 30 s: {e}"));
                    return;
                }
            };
        if first {
            let sub = Subscribe {
                packet_id: 1,
                filters: ["k9/q1/#", "k9/q2/#"]
                    .iter()
                    .map(|f| SubscribeFilter {
                        filter: f.to_string(),
                        options: SubscriptionOptions {
                            qos: QoS::ExactlyOnce,
                            ..Default::default()
                        },
                    })
                    .collect(),
                properties: SubscribeProperties::default(),
            };
            if conn.send(&Packet::Subscribe(sub)).await.is_err() {
                ctl.error("subscriber: SUBSCRIBE not sent".into());
                return;
            }
            match conn.recv(Duration::from_secs(3)).await {
                Ok(Packet::SubAck(a)) if a.reason_codes == vec![2, 2] => {}
                other => {
                    ctl.error(format!("subscriber: expected SUBACK [2, 2], got {other:?}"));
                    return;
                }
            }
            state.lock().unwrap().subscribed = true;
            first = false;
        } else if !ack.session_present {
            state.lock().unwrap().session_lost += 1;
            ctl.error("subscriber: reconnect with clean start 0 got session present = 0".into());
        }
        let connection = ctl.sub_connects.fetch_add(1, Ordering::SeqCst) + 1;
        let mut last_send = Instant::now();
        loop {
            if ctl.stop_subscriber.load(Ordering::SeqCst) {
                let _ = conn.send(&Packet::Disconnect(Disconnect::new(0))).await;
                return;
            }
            let p = match conn.recv(Duration::from_millis(100)).await {
                Ok(p) => p,
                Err(RecvErr::Timeout) => {
                    if last_send.elapsed() > Duration::from_secs(15) {
                        if conn.send(&Packet::PingReq).await.is_err() {
                            break;
                        }
                        last_send = Instant::now();
                    }
                    continue;
                }
                Err(RecvErr::Closed) => break,
            };
            let reply = match p {
                Packet::Publish(p) => on_publish(&state, &p, connection),
                Packet::PubRel(r) => {
                    let mut s = state.lock().unwrap();
                    match s.awaiting_rel.remove(&r.packet_id) {
                        Some(id) => {
                            if let Some(f) = s.q2_first.get_mut(&id) {
                                f.released = true;
                            }
                        }
                        None => s.unknown_pubrel += 1,
                    }
                    Some(Packet::PubComp(PubResp::new(r.packet_id, 0)))
                }
                Packet::Disconnect(_) => break,
                _ => None,
            };
            if let Some(r) = reply {
                if conn.send(&r).await.is_err() {
                    break;
                }
                last_send = Instant::now();
            }
        }
    }
}

/// Record one PUBLISH at the subscriber; returns the acknowledgement to send.
fn on_publish(state: &Mutex<SubState>, p: &Publish, connection: u64) -> Option<Packet> {
    let mut s = state.lock().unwrap();
    let text = String::from_utf8_lossy(&p.payload).to_string();
    let id = parse_payload(&p.payload);
    match p.qos {
        QoS::AtMostOnce => {}
        QoS::AtLeastOnce => {}
        QoS::ExactlyOnce => {
            if let Some(first) = s.awaiting_rel.get(&p.packet_id).copied() {
                // Same packet id before PUBREL: not a new message (MQTT 5 4.3.3).
                s.qos2_protocol_dups += 1;
                if id.is_some() && id != Some(first) {
                    s.qos2_pid_conflicts += 1;
                    eprintln!(
                        "kill9: QoS 2 packet id {} awaiting PUBREL for {first:?} reused for {id:?}",
                        p.packet_id
                    );
                }
                return Some(Packet::PubRec(PubResp::new(p.packet_id, 0)));
            }
        }
    }
    if let Some(marker) = text.strip_prefix("marker|") {
        s.markers.insert(marker.to_string());
    } else if let Some(id) = id {
        *s.deliveries.entry(id).or_insert(0) += 1;
        if p.qos.as_u8() != id.0 {
            s.wrong_qos += 1;
        }
        if p.qos == QoS::ExactlyOnce {
            s.awaiting_rel.insert(p.packet_id, id);
            if let Some(f) = s.q2_first.get(&id) {
                let report = format!(
                    "QoS 2 message {id:?} delivered again as a new message: first as packet id \
                     {} on subscriber connection {} (DUP={}, PUBREL received: {}), again as \
                     packet id {} on connection {connection} (DUP={})",
                    f.packet_id, f.connection, f.dup, f.released, p.packet_id, p.dup
                );
                eprintln!("kill9: {report}");
                s.q2_dup_reports.push(report);
            } else {
                s.q2_first.insert(
                    id,
                    Q2First {
                        packet_id: p.packet_id,
                        connection,
                        dup: p.dup,
                        released: false,
                    },
                );
            }
        }
    } else {
        s.unknown_payloads += 1;
    }
    match p.qos {
        QoS::AtMostOnce => None,
        QoS::AtLeastOnce => Some(Packet::PubAck(PubResp::new(p.packet_id, 0))),
        QoS::ExactlyOnce => {
            if id.is_none() {
                // A marker: still keep the receive state until PUBREL.
                s.awaiting_rel.insert(p.packet_id, (0, u64::MAX, 0));
            }
            Some(Packet::PubRec(PubResp::new(p.packet_id, 0)))
        }
    }
}

/// Publish one message at `qos` from a fresh clean client and complete its flow; returns the
/// PUBACK/PUBREC reason code.
async fn publish_once(addr: SocketAddr, client_id: &str, p: Publish) -> Result<u8, String> {
    let (mut conn, _) = Conn::open(addr, connect_packet(client_id, true, None)).await?;
    let pid = p.packet_id;
    let qos = p.qos;
    conn.send(&Packet::Publish(p))
        .await
        .map_err(|e| format!("{e:?}"))?;
    let code = match conn.recv(Duration::from_secs(5)).await {
        Ok(Packet::PubAck(a)) if qos == QoS::AtLeastOnce && a.packet_id == pid => a.reason_code,
        Ok(Packet::PubRec(a)) if qos == QoS::ExactlyOnce && a.packet_id == pid => {
            conn.send(&Packet::PubRel(PubResp::new(pid, 0)))
                .await
                .map_err(|e| format!("{e:?}"))?;
            match conn.recv(Duration::from_secs(5)).await {
                Ok(Packet::PubComp(_)) => {}
                other => return Err(format!("expected PUBCOMP, got {other:?}")),
            }
            a.reason_code
        }
        other => return Err(format!("expected the acknowledgement, got {other:?}")),
    };
    let _ = conn.send(&Packet::Disconnect(Disconnect::new(0))).await;
    Ok(code)
}

/// splitmix64: a reproducible generator for the kill delays (no extra dependency).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

async fn wait_until(ms: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_millis(ms);
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_loses_no_acknowledged_message() {
    let t0 = Instant::now();
    let cycles: u32 = std::env::var("KILL9_CYCLES")
        .ok()
        .map(|v| v.parse().expect("KILL9_CYCLES is a number"))
        .unwrap_or(3);
    let seed: u64 = std::env::var("KILL9_SEED")
        .ok()
        .map(|v| v.parse().expect("KILL9_SEED is a number"))
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                ^ u64::from(std::process::id())
        });
    let mut rng = Rng(seed);
    let mut broker = Broker::start("kill9", STORAGE_TOML).await;
    let addr = broker.addr;
    println!(
        "kill9: seed={seed} cycles={cycles} bin={} addr={addr} dir={}",
        broker.bin.display(),
        broker.dir.0.display()
    );

    // A retained message, acknowledged before the first kill.
    let code = publish_once(
        addr,
        "k9-retainer",
        publish_packet(
            RETAINED_TOPIC,
            QoS::AtLeastOnce,
            1,
            true,
            RETAINED_PAYLOAD.to_vec(),
        ),
    )
    .await
    .expect("retained publish");
    assert!(code < 0x80, "PUBACK 0x{code:02X} for the retained message");

    let n_pub = (2 * PUBLISHERS_PER_QOS) as usize;
    let ctl = Arc::new(Ctl {
        pub_connects: (0..n_pub).map(|_| AtomicU64::new(0)).collect(),
        ..Ctl::default()
    });
    let tally = Arc::new(Mutex::new(PubTally::default()));
    let sub_state = Arc::new(Mutex::new(SubState::default()));

    let sub_task = tokio::spawn(subscriber(addr, ctl.clone(), sub_state.clone(), rng.next()));
    assert!(
        wait_until(5_000, || sub_state.lock().unwrap().subscribed).await,
        "the subscriber did not subscribe: {:?}",
        ctl.errors.lock().unwrap()
    );
    let mut pub_tasks = Vec::new();
    for i in 0..n_pub as u64 {
        let qos = if i < PUBLISHERS_PER_QOS {
            QoS::AtLeastOnce
        } else {
            QoS::ExactlyOnce
        };
        pub_tasks.push(tokio::spawn(publisher(
            addr,
            qos,
            i,
            ctl.clone(),
            tally.clone(),
        )));
    }

    let connects = |ctl: &Ctl| -> Vec<u64> {
        ctl.pub_connects
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .collect()
    };
    let mut before_kill = vec![0u64; n_pub];
    for cycle in 1..=cycles {
        // The load (re)starts when every publisher is connected to this incarnation.
        let load_started = wait_until(30_000, || {
            connects(&ctl)
                .iter()
                .zip(&before_kill)
                .all(|(now, before)| now > before)
        })
        .await;
        assert!(
            load_started,
            "cycle {cycle}: publishers did not reconnect within 30 s: {:?}; broker log:\n{}",
            ctl.errors.lock().unwrap(),
            broker.log_tail(30)
        );
        let delay = rng.range(100, 800);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        before_kill = connects(&ctl);
        let acked_so_far = tally.lock().unwrap().acked.len();
        let pid = broker.pid();
        broker.kill9();
        let t_restart = Instant::now();
        broker.restart().await;
        println!(
            "kill9: cycle {cycle}/{cycles}: kill -9 pid {pid} after {delay} ms of load \
             (acked so far {acked_so_far}); accepting again after {} ms",
            t_restart.elapsed().as_millis()
        );
    }

    // Load on the last incarnation, then stop the publishers (they wait for their acks).
    let reconnected = wait_until(30_000, || {
        connects(&ctl)
            .iter()
            .zip(&before_kill)
            .all(|(now, before)| now > before)
    })
    .await;
    assert!(
        reconnected,
        "publishers did not reconnect after the last restart: {:?}",
        ctl.errors.lock().unwrap()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    ctl.stop_publishing.store(true, Ordering::SeqCst);
    for t in pub_tasks {
        tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("publisher stops within 30 s")
            .expect("publisher task");
    }
    let acked: HashSet<MsgId> = tally.lock().unwrap().acked.clone();

    // Drain: every acknowledged id delivered and no QoS 2 flow left open.
    let drained = wait_until(30_000, || {
        let s = sub_state.lock().unwrap();
        s.awaiting_rel.is_empty() && acked.iter().all(|id| s.deliveries.contains_key(id))
    })
    .await;

    // The session's subscriptions still match new messages (no SUBSCRIBE since the first).
    let mut markers_ok = true;
    for (i, qos) in [QoS::AtLeastOnce, QoS::ExactlyOnce].into_iter().enumerate() {
        let topic = format!("k9/q{}/final", qos.as_u8());
        let p = publish_packet(
            &topic,
            qos,
            1,
            false,
            format!("marker|final-{i}").into_bytes(),
        );
        match publish_once(addr, &format!("k9-final-{i}"), p).await {
            Ok(code) if code < 0x80 => {}
            other => {
                markers_ok = false;
                ctl.error(format!("final publish on {topic}: {other:?}"));
            }
        }
    }
    let markers_delivered = wait_until(10_000, || {
        let s = sub_state.lock().unwrap();
        s.markers.contains("final-0") && s.markers.contains("final-1")
    })
    .await;
    if !markers_delivered {
        markers_ok = false;
        ctl.error(
            "the persistent subscriber did not get new messages after the last restart \
             (session subscriptions lost?)"
                .into(),
        );
    }
    // Late duplicates.
    tokio::time::sleep(Duration::from_millis(500)).await;
    ctl.stop_subscriber.store(true, Ordering::SeqCst);
    let _ = tokio::time::timeout(Duration::from_secs(10), sub_task).await;

    // The retained message set before the first kill, for a fresh subscriber.
    let retained = fresh_subscriber_retained(addr).await;
    let retained_ok = matches!(&retained, Ok(p) if p.retain && &p.payload[..] == RETAINED_PAYLOAD);
    if !retained_ok {
        ctl.error(format!(
            "retained message on {RETAINED_TOPIC} not kept across {cycles} kill -9 restarts: got {retained:?}"
        ));
    }

    // Counts.
    let s = sub_state.lock().unwrap();
    let t = tally.lock().unwrap();
    let lost: Vec<&MsgId> = acked
        .iter()
        .filter(|id| !s.deliveries.contains_key(id))
        .collect();
    let dup = |q: u8| -> u64 {
        s.deliveries
            .iter()
            .filter(|(id, _)| id.0 == q)
            .map(|(_, n)| u64::from(n.saturating_sub(1)))
            .sum()
    };
    let (dup1, dup2) = (dup(1), dup(2));
    let delivered = s.deliveries.len();
    let delivered_unacked = s.deliveries.keys().filter(|id| !acked.contains(id)).count();
    let acked_q1 = acked.iter().filter(|id| id.0 == 1).count();
    println!(
        "acked={} delivered={delivered} lost={} duplicates_qos1={dup1} duplicates_qos2={dup2} cycles={cycles}",
        acked.len(),
        lost.len(),
    );
    println!(
        "kill9: details: acked_qos1={acked_q1} acked_qos2={} sent={} refused={} abandoned={} \
         delivered_unacked={delivered_unacked} qos2_protocol_dups={} qos2_pid_conflicts={} \
         wrong_qos={} unknown_pubrel={} session_lost={} subscriber_connects={} drained={drained} \
         retained_ok={retained_ok} subscriptions_ok={markers_ok} seed={seed} elapsed={:.1}s",
        acked.len() - acked_q1,
        t.sent,
        t.refused,
        t.abandoned,
        s.qos2_protocol_dups,
        s.qos2_pid_conflicts,
        s.wrong_qos,
        s.unknown_pubrel,
        s.session_lost,
        ctl.sub_connects.load(Ordering::SeqCst),
        t0.elapsed().as_secs_f64()
    );
    let mut problems: Vec<String> = ctl.errors.lock().unwrap().clone();
    if !lost.is_empty() {
        let mut sample: Vec<&&MsgId> = lost.iter().take(10).collect();
        sample.sort();
        problems.push(format!(
            "{} acknowledged messages never delivered, e.g. (qos, publisher, seq) {sample:?}",
            lost.len()
        ));
    }
    if dup2 > 0 {
        problems.push(format!(
            "{dup2} QoS 2 messages delivered more than once (as new messages):\n    {}",
            s.q2_dup_reports.join("\n    ")
        ));
    }
    if s.wrong_qos > 0 {
        problems.push(format!(
            "{} messages delivered at another QoS than published (subscription QoS 2)",
            s.wrong_qos
        ));
    }
    if s.qos2_pid_conflicts > 0 {
        problems.push(format!(
            "{} QoS 2 PUBLISH reused a packet id still awaiting PUBREL for another message",
            s.qos2_pid_conflicts
        ));
    }
    if s.unknown_payloads > 0 {
        problems.push(format!("{} unknown payloads delivered", s.unknown_payloads));
    }
    if acked.is_empty() {
        problems.push("no message was acknowledged at all".into());
    }
    assert!(
        problems.is_empty(),
        "kill -9 durability failures (seed {seed}):\n  - {}\nbroker log tail:\n{}",
        problems.join("\n  - "),
        broker.log_tail(30)
    );
}

/// A fresh clean-start subscriber on the retained topic: the first PUBLISH after SUBACK.
async fn fresh_subscriber_retained(addr: SocketAddr) -> Result<Publish, String> {
    let (mut conn, _) = Conn::open(addr, connect_packet("k9-retained-check", true, None)).await?;
    let sub = Subscribe {
        packet_id: 1,
        filters: vec![SubscribeFilter {
            filter: RETAINED_TOPIC.to_string(),
            options: SubscriptionOptions {
                qos: QoS::AtLeastOnce,
                ..Default::default()
            },
        }],
        properties: SubscribeProperties::default(),
    };
    conn.send(&Packet::Subscribe(sub))
        .await
        .map_err(|e| format!("{e:?}"))?;
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        match conn.recv(Duration::from_millis(200)).await {
            Ok(Packet::Publish(p)) => {
                if p.qos != QoS::AtMostOnce {
                    let _ = conn
                        .send(&Packet::PubAck(PubResp::new(p.packet_id, 0)))
                        .await;
                }
                let _ = conn.send(&Packet::Disconnect(Disconnect::new(0))).await;
                return Ok(p);
            }
            Ok(_) | Err(RecvErr::Timeout) => {}
            Err(RecvErr::Closed) => return Err("connection closed".into()),
        }
    }
    Err("no retained message within 3 s".into())
}
