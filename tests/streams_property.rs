//! Property test for named streams against the real `lanemq` binary: for random interleavings
//! of publishes, subscribes at random offsets, disconnects / reconnects of persistent sessions
//! and restarts (graceful and kill -9), each subscriber receives exactly the messages of the
//! stream from its offset, per key in order.
//!
//! ```sh
//! cargo build -p lanemq
//! cargo nextest run -p lanemq-tests --test it streams_property::
//! ```
//!
//! Environment: `PROPTEST_CASES` (default 12), `PROPTEST_RNG_SEED` (default a fixed seed, so a
//! run is reproducible; set another to explore other sequences), `KEEP_TMP=1` (keep data dirs
//! and broker logs), `LANEMQ_BIN` (see tests/common/child.rs).
//!
//! # The setup
//!
//! One broker per case with two regular streams, `s1` capturing `p/#` (key: the publisher's
//! client id, the default `message.from`) and `s2` capturing `p/a/#` (key `message.topic`,
//! `read_max_unacked = 4`). Two publishers (`pubA`, `pubB`) publish QoS 1 to `p/a`, `p/a/x`,
//! `p/b`, `p/b/y`, `p` and `q/z` (in no stream), one at a time or both at once; each publisher
//! waits for a PUBACK before its next PUBLISH, and an operation ends when all its PUBACKs
//! arrived, so every message the model expects was acknowledged (also before a kill -9; fsync
//! `always`), messages of different operations are ordered, and each publisher's are. The
//! payload `m<seq>` is unique. Up to six subscribers subscribe `$stream/<name>` at QoS 1 with
//! `stream-offset` = `earliest`, `latest`, a timestamp (the client clock now, or the `ts` of a
//! message some subscriber received, −1 / ±0 / +1 µs) or `@<position>` of a message a subscriber
//! of that stream received. A subscriber is either a clean session (it ends at a restart or at
//! its disconnect) or a persistent session (clean start, session expiry 3600 s) that
//! disconnects and reconnects with clean start = false, or is taken over by a new connection
//! while connected. A persistent subscriber may lag its PUBACKs by up to 2 messages, so
//! disconnects, takeovers and restarts happen with received but unacknowledged messages; some
//! subscribers set Receive Maximum = lag + 2.
//!
//! At the end every persistent session reconnects, an "oracle" subscriber per stream reads it
//! from `earliest`, and the positions and timestamps it reports define the exact expectation.
//!
//! # What is checked
//!
//! - Oracle: each stream holds exactly the acknowledged publishes whose topic its filter
//!   matches, once each; positions increase and `ts` does not decrease in each publisher's
//!   order and from one operation to the next; `ts`
//!   lies between the client clock before the PUBLISH and after its PUBACK; `key` is the
//!   publisher's client id (`s1`) or the topic (`s2`); topics are the original ones.
//! - Each subscriber of stream S with offset O receives, as a set, exactly the messages of S
//!   that match O — `earliest`: all; `latest`: those published after its SUBACK; timestamp t:
//!   `ts >= t`; `@n`: position `> n` — limited, for a clean session, to those published before
//!   its session ended. Every delivery carries the same position, `ts`, key and topic as the
//!   oracle's.
//! - No duplicate within one connection. A message received again on a later connection of a
//!   persistent session is allowed only if (a) no earlier receipt of it was acknowledged (QoS 1
//!   redelivery), or (b) a kill -9 happened after its last acknowledged receipt (the stored
//!   position may lag the acknowledgements by the save interval). Acknowledged means: PUBACK
//!   sent before a DISCONNECT, or confirmed by a PINGREQ/PINGRESP round trip before a SIGTERM
//!   or a takeover. Graceful restarts, reconnects and takeovers therefore must resume exactly
//!   after the last acknowledged message.
//! - Per key, the first receipts are in log order (positions; for one publisher that is its
//!   publish order, checked on the oracle), and within one connection every key's messages
//!   (redeliveries included) are in log order.
//! - A persistent session finds its session present after each reconnect, and every expected
//!   message ends up acknowledged (a withheld PUBACK leads to a redelivery).
#![allow(clippy::unwrap_used)]

use crate::common;

use crate::child;

use child::Broker;
use common::{connect_v5, stream_offset_of, sub_opts, user_prop, RawClient, RecvError};
use lanemq_protocol::{Connect, Packet, PubResp, Publish, QoS};
use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, RngSeed, TestCaseError};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const ACL: &str = "default allow\n";
const CONFIG: &str = "[storage]\nfsync = \"always\"\n\n\
    [[streams]]\nname = \"s1\"\ntopic_filter = \"p/#\"\n\n\
    [[streams]]\nname = \"s2\"\ntopic_filter = \"p/a/#\"\nkey_expression = \"message.topic\"\n\
    read_max_unacked = 4\n\n";

struct StreamSpec {
    name: &'static str,
    /// The filter is `<prefix>/#`.
    prefix: &'static str,
    key_by_topic: bool,
}

const STREAMS: [StreamSpec; 2] = [
    StreamSpec {
        name: "s1",
        prefix: "p",
        key_by_topic: false,
    },
    StreamSpec {
        name: "s2",
        prefix: "p/a",
        key_by_topic: true,
    },
];

const TOPICS: [&str; 6] = ["p/a", "p/a/x", "p/b", "p/b/y", "p", "q/z"];
const PUBLISHERS: [&str; 2] = ["pubA", "pubB"];
const MAX_SUBS: usize = 6;
const SESSION_EXPIRY_S: u32 = 3600;
/// The whole case, including the final checks.
const CASE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a subscriber may take to receive what it must have.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_CASES: u32 = 12;
const DEFAULT_SEED: u64 = 0x5eed_0005_74ea_04d5;

/// Does stream `s` (filter `<prefix>/#`) capture `topic`? (Written out rather than taken
/// from the broker's matcher, which is under test.)
fn captures(s: usize, topic: &str) -> bool {
    let p = STREAMS[s].prefix;
    topic == p || topic.strip_prefix(p).is_some_and(|r| r.starts_with('/'))
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

// --- operations -------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Offset {
    Earliest,
    Latest,
    /// The client clock at SUBSCRIBE.
    Now,
    /// `ts + delta` of one message some subscriber received (`pick` modulo their number).
    TsOfSeen {
        pick: usize,
        delta: i8,
    },
    /// `@<position>` of one message a subscriber of the same stream received.
    AfterSeen {
        pick: usize,
    },
}

#[derive(Debug, Clone)]
enum Op {
    Publish {
        publisher: usize,
        topic: usize,
        count: usize,
    },
    /// Both publishers at once (each waits for its own PUBACKs), `count` messages each.
    PublishBoth {
        topics: (usize, usize),
        count: usize,
    },
    Subscribe {
        stream: usize,
        offset: Offset,
        persistent: bool,
        /// PUBACKs a persistent subscriber holds back (the newest ones).
        lag: usize,
        /// Receive Maximum = lag + 2.
        small_window: bool,
    },
    /// One of the connected subscribers (`sub` modulo their number).
    Disconnect { sub: usize },
    /// One of the disconnected persistent subscribers.
    Reconnect { sub: usize },
    /// One of the connected persistent subscribers connects again (clean start = false) while
    /// its connection is open: the session is taken over.
    Takeover { sub: usize },
    /// SIGTERM (or kill -9) and start again; `reconnect`: the persistent subscribers that were
    /// connected reconnect at once.
    Restart { kill: bool, reconnect: bool },
}

fn offset_strategy() -> impl Strategy<Value = Offset> {
    prop_oneof![
        2 => Just(Offset::Earliest),
        2 => Just(Offset::Latest),
        1 => Just(Offset::Now),
        3 => (0..64usize, -1i8..=1).prop_map(|(pick, delta)| Offset::TsOfSeen { pick, delta }),
        3 => (0..64usize).prop_map(|pick| Offset::AfterSeen { pick }),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..PUBLISHERS.len(), 0..TOPICS.len(), 1..5usize)
            .prop_map(|(publisher, topic, count)| Op::Publish { publisher, topic, count }),
        2 => (0..TOPICS.len(), 0..TOPICS.len(), 1..6usize)
            .prop_map(|(a, b, count)| Op::PublishBoth { topics: (a, b), count }),
        4 => (0..STREAMS.len(), offset_strategy(), any::<bool>(), 0..3usize, any::<bool>())
            .prop_map(|(stream, offset, persistent, lag, small_window)| Op::Subscribe {
                stream,
                offset,
                persistent,
                lag,
                small_window
            }),
        1 => (0..8usize).prop_map(|sub| Op::Disconnect { sub }),
        1 => (0..8usize).prop_map(|sub| Op::Reconnect { sub }),
        1 => (0..8usize).prop_map(|sub| Op::Takeover { sub }),
        1 => (any::<bool>(), any::<bool>())
            .prop_map(|(kill, reconnect)| Op::Restart { kill, reconnect }),
    ]
}

// --- the model ----------------------------------------------------------------------------------

/// One acknowledged publish; its payload is `m<seq>` (`seq` = index in `Case::pubs`).
struct Pub {
    topic: &'static str,
    publisher: usize,
    /// The operation that published it: messages of one batch may interleave (two
    /// publishers at once), batches never do.
    batch: usize,
    sent_us: u64,
    acked_us: u64,
}

/// A subscription's start, resolved when it was made.
#[derive(Debug, Clone, Copy)]
enum Start {
    Earliest,
    /// `before` publishes were acknowledged before the SUBACK.
    Latest {
        before: usize,
    },
    /// Messages with `ts >= t`; those from `sure_from` on certainly qualify.
    Ts {
        t: u64,
        sure_from: usize,
    },
    /// Messages at positions after `pos`, the position of `m<seq>`.
    After {
        pos: u64,
        seq: usize,
    },
}

/// One received PUBLISH.
#[derive(Debug, Clone)]
struct Got {
    seq: usize,
    pos: u64,
    ts: u64,
    key: Option<String>,
    topic: String,
    packet_id: u16,
    /// Connection number of the subscriber (persistent sessions reconnect).
    epoch: usize,
    /// kill -9s before it was received.
    kills: usize,
    acked: bool,
}

struct Sub {
    client_id: String,
    stream: usize,
    persistent: bool,
    lag: usize,
    receive_maximum: Option<u16>,
    start: Start,
    offset_text: String,
    conn: Option<RawClient>,
    epoch: usize,
    got: Vec<Got>,
    /// A clean session: how many publishes there were when it ended.
    ended_at: Option<usize>,
}

impl Sub {
    fn label(&self) -> String {
        format!(
            "{} ({}, {}{}, stream-offset {}{})",
            self.client_id,
            STREAMS[self.stream].name,
            if self.persistent {
                format!("persistent, ack lag {}", self.lag)
            } else {
                "clean".to_string()
            },
            match self.receive_maximum {
                Some(n) => format!(", receive maximum {n}"),
                None => String::new(),
            },
            self.offset_text,
            match self.start {
                Start::After { seq, .. } => format!(" = m{seq}"),
                Start::Latest { before } => format!(" = from m{before}"),
                Start::Ts { sure_from, .. } => format!(" ~ from m{sure_from}"),
                Start::Earliest => String::new(),
            }
        )
    }

    fn received(&self) -> BTreeSet<usize> {
        self.got.iter().map(|g| g.seq).collect()
    }

    fn acked(&self) -> BTreeSet<usize> {
        self.got.iter().filter(|g| g.acked).map(|g| g.seq).collect()
    }

    /// What it received, per connection: `m3 m4* ...` (`*`: not acknowledged).
    fn history(&self) -> String {
        let mut s = String::new();
        let mut epoch = usize::MAX;
        for g in &self.got {
            if g.epoch != epoch {
                epoch = g.epoch;
                let _ = write!(s, " | conn {epoch}:");
            }
            let _ = write!(s, " m{}{}", g.seq, if g.acked { "" } else { "*" });
        }
        s
    }
}

#[derive(Clone, Copy)]
enum Ack {
    /// Everything received on the current connection.
    All,
    /// All but the newest `lag` (persistent subscribers).
    Lagged,
}

fn seqs(s: &BTreeSet<usize>) -> String {
    let v: Vec<String> = s.iter().map(|i| format!("m{i}")).collect();
    format!("[{}]", v.join(" "))
}

fn persistent_connect(id: &str, clean_start: bool, receive_maximum: Option<u16>) -> Connect {
    let mut c = connect_v5(id);
    c.clean_start = clean_start;
    c.properties.session_expiry_interval = Some(SESSION_EXPIRY_S);
    c.properties.receive_maximum = receive_maximum;
    c
}

fn parse_got(p: &Publish, epoch: usize, kills: usize) -> Result<Got, String> {
    let text = String::from_utf8(p.payload.to_vec()).map_err(|_| format!("payload {p:?}"))?;
    let seq = text
        .strip_prefix('m')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("unexpected payload {text:?} on {}", p.topic))?;
    if p.qos != QoS::AtLeastOnce || p.packet_id == 0 {
        return Err(format!(
            "m{seq} delivered with {:?} / packet id {}",
            p.qos, p.packet_id
        ));
    }
    let ts = user_prop(p, "ts")
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| format!("m{seq}: no numeric ts user property ({p:?})"))?;
    Ok(Got {
        seq,
        pos: stream_offset_of(p),
        ts,
        key: user_prop(p, "key").map(str::to_string),
        topic: p.topic.clone(),
        packet_id: p.packet_id,
        epoch,
        kills,
        acked: false,
    })
}

struct Case {
    broker: Broker,
    pubs: Vec<Pub>,
    publishers: Vec<Option<RawClient>>,
    subs: Vec<Sub>,
    kills: usize,
    restarts: usize,
    /// Number of the operation running.
    batch: usize,
    trace: Arc<Mutex<String>>,
    /// Problems found while running (checked at the end with the rest).
    problems: Vec<String>,
}

impl Case {
    fn log(&self, line: String) {
        let mut t = self.trace.lock().unwrap();
        t.push_str(&line);
        t.push('\n');
    }

    fn problem(&mut self, p: String) {
        self.log(format!("   PROBLEM: {p}"));
        self.problems.push(p);
    }

    fn addr(&self) -> std::net::SocketAddr {
        self.broker.addr
    }

    // --- receiving -----------------------------------------------------------------------------

    /// Read what subscriber `i` was sent (until `wait` passes without a packet), then
    /// acknowledge per `ack`.
    async fn pump(&mut self, i: usize, wait: Duration, ack: Ack) {
        let kills = self.kills;
        let sub = &mut self.subs[i];
        let Some(conn) = sub.conn.as_mut() else {
            return;
        };
        let mut trouble = None;
        loop {
            match conn.try_recv(wait).await {
                Ok(Packet::Publish(p)) => match parse_got(&p, sub.epoch, kills) {
                    Ok(g) => sub.got.push(g),
                    Err(e) => trouble = Some(format!("{}: {e}", sub.client_id)),
                },
                Ok(other) => {
                    trouble = Some(format!("{}: unexpected {other:?}", sub.client_id));
                    break;
                }
                Err(RecvError::Timeout) => break,
                Err(e) => {
                    trouble = Some(format!("{}: connection lost ({e:?})", sub.client_id));
                    sub.conn = None;
                    break;
                }
            }
        }
        if let Some(t) = trouble {
            self.problem(t);
        }
        self.ack(i, ack).await;
    }

    async fn ack(&mut self, i: usize, ack: Ack) {
        let sub = &mut self.subs[i];
        let Some(conn) = sub.conn.as_mut() else {
            return;
        };
        let epoch = sub.epoch;
        let pending: Vec<usize> = (0..sub.got.len())
            .filter(|&k| sub.got[k].epoch == epoch && !sub.got[k].acked)
            .collect();
        let keep = match ack {
            Ack::All => 0,
            Ack::Lagged => sub.lag,
        };
        let n = pending.len().saturating_sub(keep);
        for &k in &pending[..n] {
            conn.send(Packet::PubAck(PubResp::new(sub.got[k].packet_id, 0)))
                .await;
            sub.got[k].acked = true;
        }
    }

    /// A short read of every connected subscriber.
    async fn pump_all(&mut self) {
        for i in 0..self.subs.len() {
            let ack = if self.subs[i].persistent {
                Ack::Lagged
            } else {
                Ack::All
            };
            self.pump(i, Duration::from_millis(2), ack).await;
        }
    }

    /// The messages subscriber `i` must have by now (a subset of what it should have: the
    /// timestamp case is decided exactly at the end, from the oracle).
    fn must_have(&self, i: usize) -> BTreeSet<usize> {
        let sub = &self.subs[i];
        let end = sub.ended_at.unwrap_or(self.pubs.len());
        (0..end)
            .filter(|&s| captures(sub.stream, self.pubs[s].topic))
            .filter(|&s| match sub.start {
                Start::Earliest => true,
                Start::Latest { before } => s >= before,
                Start::Ts { sure_from, .. } => s >= sure_from,
                Start::After { seq, .. } => s >= self.batch_end(seq),
            })
            .collect()
    }

    /// Until subscriber `i` received (`acked`: acknowledged) every message of `must`, then a
    /// short quiet read for anything extra. A timeout is noted; the final check tells what
    /// is wrong.
    async fn settle(&mut self, i: usize, must: &BTreeSet<usize>, ack: Ack, acked: bool) {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            if self.subs[i].conn.is_none() {
                return;
            }
            let have = if acked {
                self.subs[i].acked()
            } else {
                self.subs[i].received()
            };
            if must.is_subset(&have) {
                break;
            }
            if Instant::now() >= deadline {
                let missing: BTreeSet<usize> = must.difference(&have).copied().collect();
                let label = self.subs[i].label();
                self.log(format!(
                    "   {label}: still missing {} after {SETTLE_TIMEOUT:?}",
                    seqs(&missing)
                ));
                break;
            }
            self.pump(i, Duration::from_millis(5), ack).await;
        }
        self.pump(i, Duration::from_millis(20), ack).await;
    }

    /// PINGREQ/PINGRESP round trips until no PUBLISH precedes the PINGRESP: every PUBACK sent
    /// was processed by the broker.
    async fn sync(&mut self, i: usize, ack: Ack) {
        for _ in 0..100 {
            let kills = self.kills;
            let sub = &mut self.subs[i];
            let Some(conn) = sub.conn.as_mut() else {
                return;
            };
            let more = conn.sync().await;
            if more.is_empty() {
                return;
            }
            let mut errors = Vec::new();
            for p in &more {
                match parse_got(p, sub.epoch, kills) {
                    Ok(g) => sub.got.push(g),
                    Err(e) => errors.push(format!("{}: {e}", sub.client_id)),
                }
            }
            for e in errors {
                self.problem(e);
            }
            self.ack(i, ack).await;
        }
    }

    /// After the server closed (or is closing) subscriber `i`'s connection: read what is left
    /// (recorded as not acknowledged) until the close.
    async fn drain_closed(&mut self, i: usize) {
        let Some(conn) = self.subs[i].conn.take() else {
            return;
        };
        let epoch = self.subs[i].epoch;
        self.drain_conn(i, conn, epoch).await;
    }

    /// Like [`Case::drain_closed`] for an older connection `conn` (number `epoch`).
    async fn drain_conn(&mut self, i: usize, mut conn: RawClient, epoch: usize) {
        let kills = self.kills;
        let sub = &mut self.subs[i];
        loop {
            match conn.try_recv(Duration::from_millis(2_000)).await {
                Ok(Packet::Publish(p)) => {
                    if let Ok(g) = parse_got(&p, epoch, kills) {
                        sub.got.push(g);
                    }
                }
                Ok(Packet::Disconnect(_)) | Ok(Packet::PingResp) => {}
                Ok(other) => {
                    let id = sub.client_id.clone();
                    self.problem(format!("{id}: unexpected {other:?} while closing"));
                    return;
                }
                Err(RecvError::Timeout) => {
                    let id = sub.client_id.clone();
                    self.problem(format!("{id}: connection not closed within 2 s"));
                    return;
                }
                Err(_) => return,
            }
        }
    }

    // --- operations ----------------------------------------------------------------------------

    async fn publish(&mut self, publisher: usize, topic: usize, count: usize) {
        let first = self.pubs.len();
        let mut c = self.publisher(publisher).await;
        let topic = TOPICS[topic];
        let done = publish_seqs(&mut c, topic, first, count).await;
        self.publishers[publisher] = Some(c);
        self.record(publisher, topic, done);
        self.log(format!(
            "publish {} {topic}: m{first}..=m{}",
            PUBLISHERS[publisher],
            self.pubs.len() - 1
        ));
    }

    async fn publish_both(&mut self, topics: (usize, usize), count: usize) {
        let first = self.pubs.len();
        let (ta, tb) = (TOPICS[topics.0], TOPICS[topics.1]);
        let mut a = self.publisher(0).await;
        let mut b = self.publisher(1).await;
        let (da, db) = tokio::join!(
            publish_seqs(&mut a, ta, first, count),
            publish_seqs(&mut b, tb, first + count, count)
        );
        self.publishers[0] = Some(a);
        self.publishers[1] = Some(b);
        self.record(0, ta, da);
        self.record(1, tb, db);
        self.log(format!(
            "publish at once: {} {ta} m{first}..=m{}, {} {tb} m{}..=m{}",
            PUBLISHERS[0],
            first + count - 1,
            PUBLISHERS[1],
            first + count,
            first + 2 * count - 1
        ));
    }

    /// Publisher `i`'s connection (connected again after a restart).
    async fn publisher(&mut self, i: usize) -> RawClient {
        match self.publishers[i].take() {
            Some(c) => c,
            None => RawClient::connect_ok(self.addr(), connect_v5(PUBLISHERS[i])).await,
        }
    }

    fn record(&mut self, publisher: usize, topic: &'static str, done: Vec<(u64, u64)>) {
        for (sent_us, acked_us) in done {
            self.pubs.push(Pub {
                topic,
                publisher,
                batch: self.batch,
                sent_us,
                acked_us,
            });
        }
    }

    /// The first message of a later batch than `m<seq>`'s: from there on every message was
    /// published after it.
    fn batch_end(&self, seq: usize) -> usize {
        let b = self.pubs[seq].batch;
        (seq..self.pubs.len())
            .find(|&q| self.pubs[q].batch != b)
            .unwrap_or(self.pubs.len())
    }

    /// Every distinct message subscribers received, in publish order (of `stream`, if given).
    fn seen(&self, stream: Option<usize>) -> Vec<Got> {
        let mut m: BTreeMap<usize, Got> = BTreeMap::new();
        for s in &self.subs {
            if stream.is_some_and(|st| st != s.stream) {
                continue;
            }
            for g in &s.got {
                m.entry(g.seq).or_insert_with(|| g.clone());
            }
        }
        m.into_values().collect()
    }

    async fn subscribe(
        &mut self,
        stream: usize,
        offset: &Offset,
        persistent: bool,
        lag: usize,
        small_window: bool,
    ) {
        if self.subs.len() >= MAX_SUBS {
            self.log(format!(
                "subscribe {offset:?}: skipped ({MAX_SUBS} subscribers)"
            ));
            return;
        }
        let n = self.pubs.len();
        let (start, text) = match *offset {
            Offset::Earliest => (Start::Earliest, "earliest".to_string()),
            Offset::Latest => (Start::Latest { before: n }, "latest".to_string()),
            Offset::Now => {
                let t = now_us();
                (Start::Ts { t, sure_from: n }, t.to_string())
            }
            Offset::TsOfSeen { pick, delta } => {
                let seen = self.seen(None);
                if seen.is_empty() {
                    (Start::Earliest, "earliest".to_string())
                } else {
                    let g = &seen[pick % seen.len()];
                    let t = g.ts.saturating_add_signed(i64::from(delta));
                    let sure_from = self.batch_end(g.seq);
                    (Start::Ts { t, sure_from }, t.to_string())
                }
            }
            Offset::AfterSeen { pick } => {
                let seen = self.seen(Some(stream));
                if seen.is_empty() {
                    (Start::Earliest, "earliest".to_string())
                } else {
                    let g = &seen[pick % seen.len()];
                    (
                        Start::After {
                            pos: g.pos,
                            seq: g.seq,
                        },
                        format!("@{}", g.pos),
                    )
                }
            }
        };
        let i = self.subs.len();
        let client_id = format!("sub{i}");
        let lag = if persistent { lag } else { 0 };
        let receive_maximum = small_window.then(|| u16::try_from(lag).unwrap() + 2);
        let connect = if persistent {
            persistent_connect(&client_id, true, receive_maximum)
        } else {
            let mut c = connect_v5(&client_id);
            c.properties.receive_maximum = receive_maximum;
            c
        };
        let mut conn = RawClient::connect_ok(self.addr(), connect).await;
        let filter = format!("$stream/{}", STREAMS[stream].name);
        let ack = conn
            .subscribe_props(
                &[(filter.as_str(), sub_opts(QoS::AtLeastOnce))],
                Some(u32::try_from(i).unwrap() + 1),
                &[("stream-offset", text.as_str())],
            )
            .await;
        assert_eq!(ack.reason_codes, vec![1], "SUBACK for {filter}: {ack:?}");
        self.subs.push(Sub {
            client_id,
            stream,
            persistent,
            lag,
            receive_maximum,
            start,
            offset_text: text,
            conn: Some(conn),
            epoch: 0,
            got: Vec::new(),
            ended_at: None,
        });
        let label = self.subs[i].label();
        self.log(format!("subscribe {label}"));
    }

    async fn disconnect(&mut self, pick: usize) {
        let connected: Vec<usize> = (0..self.subs.len())
            .filter(|&i| self.subs[i].conn.is_some())
            .collect();
        if connected.is_empty() {
            self.log("disconnect: nobody connected".to_string());
            return;
        }
        let i = connected[pick % connected.len()];
        if self.subs[i].persistent {
            self.pump(i, Duration::from_millis(5), Ack::Lagged).await;
        } else {
            let must = self.must_have(i);
            self.settle(i, &must, Ack::All, false).await;
            self.subs[i].ended_at = Some(self.pubs.len());
        }
        let unacked = self.subs[i]
            .got
            .iter()
            .filter(|g| g.epoch == self.subs[i].epoch && !g.acked)
            .count();
        let label = self.subs[i].label();
        self.log(format!(
            "disconnect {label} ({unacked} received, not acknowledged)"
        ));
        if let Some(c) = self.subs[i].conn.as_mut() {
            c.send(Packet::Disconnect(lanemq_protocol::Disconnect::new(0)))
                .await;
        }
        self.drain_closed(i).await;
    }

    async fn reconnect_sub(&mut self, i: usize) {
        let sub = &mut self.subs[i];
        let (conn, ack) = RawClient::connect_ack(
            self.broker.addr,
            persistent_connect(&sub.client_id, false, sub.receive_maximum),
        )
        .await;
        sub.conn = Some(conn);
        sub.epoch += 1;
        let label = sub.label();
        if !ack.session_present {
            self.problem(format!(
                "{label}: session not present on reconnect ({ack:?})"
            ));
        }
        self.log(format!("reconnect {label}"));
    }

    async fn reconnect(&mut self, pick: usize) {
        let offline: Vec<usize> = (0..self.subs.len())
            .filter(|&i| self.subs[i].persistent && self.subs[i].conn.is_none())
            .collect();
        if offline.is_empty() {
            self.log("reconnect: no persistent subscriber offline".to_string());
            return;
        }
        self.reconnect_sub(offline[pick % offline.len()]).await;
    }

    async fn takeover(&mut self, pick: usize) {
        let online: Vec<usize> = (0..self.subs.len())
            .filter(|&i| self.subs[i].persistent && self.subs[i].conn.is_some())
            .collect();
        if online.is_empty() {
            self.log("takeover: no persistent subscriber connected".to_string());
            return;
        }
        let i = online[pick % online.len()];
        // Every PUBACK sent on the old connection is processed before the takeover.
        self.pump(i, Duration::from_millis(2), Ack::Lagged).await;
        self.sync(i, Ack::Lagged).await;
        let old = self.subs[i].conn.take().unwrap();
        let old_epoch = self.subs[i].epoch;
        self.reconnect_sub(i).await;
        self.drain_conn(i, old, old_epoch).await;
    }

    async fn restart(&mut self, kill: bool, reconnect: bool) {
        let connected: Vec<usize> = (0..self.subs.len())
            .filter(|&i| self.subs[i].conn.is_some())
            .collect();
        for &i in &connected {
            let (ack, must) = if self.subs[i].persistent {
                (Ack::Lagged, BTreeSet::new())
            } else {
                (Ack::All, self.must_have(i))
            };
            // Clean sessions end here: they must have everything published so far.
            self.settle(i, &must, ack, false).await;
            self.sync(i, ack).await;
        }
        for p in &mut self.publishers {
            *p = None;
        }
        self.log(format!(
            "restart {}{}",
            if kill { "kill -9" } else { "SIGTERM" },
            if reconnect {
                ", persistent subscribers reconnect"
            } else {
                ""
            }
        ));
        if kill {
            self.broker.kill9();
        } else {
            signal_handlers_installed(&self.broker).await;
            let status = self.broker.terminate().await;
            if !status.success() {
                self.problem(format!("exit status after SIGTERM: {status}"));
            }
        }
        for &i in &connected {
            self.drain_closed(i).await;
            if !self.subs[i].persistent {
                self.subs[i].ended_at = Some(self.pubs.len());
            }
        }
        self.restarts += 1;
        if kill {
            self.kills += 1;
        }
        self.broker.restart().await;
        if reconnect {
            for &i in &connected {
                if self.subs[i].persistent {
                    self.reconnect_sub(i).await;
                }
            }
        }
    }

    // --- the end -------------------------------------------------------------------------------

    /// Read stream `s` from `earliest` with a fresh client: position and `ts` of each message.
    async fn oracle(&mut self, s: usize) -> BTreeMap<usize, Got> {
        let want: BTreeSet<usize> = (0..self.pubs.len())
            .filter(|&q| captures(s, self.pubs[q].topic))
            .collect();
        let name = STREAMS[s].name;
        let mut c = RawClient::connect_ok(self.addr(), connect_v5(&format!("oracle-{name}"))).await;
        let filter = format!("$stream/{name}");
        let ack = c
            .subscribe_props(
                &[(filter.as_str(), sub_opts(QoS::AtLeastOnce))],
                None,
                &[("stream-offset", "earliest")],
            )
            .await;
        assert_eq!(ack.reason_codes, vec![1], "oracle SUBACK: {ack:?}");
        let mut got: Vec<Got> = Vec::new();
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            let have: BTreeSet<usize> = got.iter().map(|g| g.seq).collect();
            let wait = if want.is_subset(&have) || Instant::now() >= deadline {
                100
            } else {
                500
            };
            match c.try_recv(Duration::from_millis(wait)).await {
                Ok(Packet::Publish(p)) => {
                    c.send(Packet::PubAck(PubResp::new(p.packet_id, 0))).await;
                    match parse_got(&p, 0, 0) {
                        Ok(g) => got.push(g),
                        Err(e) => self.problem(format!("oracle {name}: {e}")),
                    }
                }
                Ok(other) => {
                    self.problem(format!("oracle {name}: unexpected {other:?}"));
                    break;
                }
                Err(RecvError::Timeout) if want.is_subset(&have) || Instant::now() >= deadline => {
                    break
                }
                Err(RecvError::Timeout) => {}
                Err(e) => {
                    self.problem(format!("oracle {name}: connection lost ({e:?})"));
                    break;
                }
            }
        }
        c.disconnect().await;
        // The stream holds exactly the acknowledged publishes its filter matches, once each.
        let mut by_seq: BTreeMap<usize, Got> = BTreeMap::new();
        for g in &got {
            if by_seq.insert(g.seq, g.clone()).is_some() {
                self.problem(format!("oracle {name}: m{} delivered twice", g.seq));
            }
        }
        let have: BTreeSet<usize> = by_seq.keys().copied().collect();
        let missing: BTreeSet<usize> = want.difference(&have).copied().collect();
        let extra: BTreeSet<usize> = have.difference(&want).copied().collect();
        if !missing.is_empty() {
            self.problem(format!(
                "oracle {name}: acknowledged publishes missing from the stream: {}",
                seqs(&missing)
            ));
        }
        if !extra.is_empty() {
            self.problem(format!(
                "oracle {name}: messages not captured by the filter: {}",
                seqs(&extra)
            ));
        }
        // Per publisher, and from one batch to the next, positions increase and ts does not
        // decrease.
        let mut prev: [Option<&Got>; 2] = [None, None];
        let mut earlier_batches: Option<&Got> = None;
        let mut this_batch: Vec<&Got> = Vec::new();
        for g in by_seq.values() {
            let Some(p) = self.pubs.get(g.seq) else {
                continue;
            };
            if this_batch
                .first()
                .is_some_and(|f| self.pubs[f.seq].batch != p.batch)
            {
                earlier_batches = this_batch.drain(..).max_by_key(|x| x.pos);
            }
            let publisher = p.publisher;
            let key = if STREAMS[s].key_by_topic {
                p.topic
            } else {
                PUBLISHERS[p.publisher]
            };
            let mut bad = Vec::new();
            if g.topic != p.topic {
                bad.push(format!("topic {:?} (published to {:?})", g.topic, p.topic));
            }
            if g.key.as_deref() != Some(key) {
                bad.push(format!("key {:?} (expected {key:?})", g.key));
            }
            if g.ts < p.sent_us || g.ts > p.acked_us {
                bad.push(format!(
                    "ts {} outside [{}, {}] (PUBLISH sent .. PUBACK received)",
                    g.ts, p.sent_us, p.acked_us
                ));
            }
            for q in [prev[p.publisher], earlier_batches].into_iter().flatten() {
                if g.pos <= q.pos {
                    bad.push(format!("position @{} after m{} @{}", g.pos, q.seq, q.pos));
                }
                if g.ts < q.ts {
                    bad.push(format!("ts {} before m{}'s {}", g.ts, q.seq, q.ts));
                }
            }
            if !bad.is_empty() {
                self.problem(format!("oracle {name}: m{}: {}", g.seq, bad.join("; ")));
            }
            prev[publisher] = Some(g);
            this_batch.push(g);
        }
        by_seq
    }

    /// Exactly what subscriber `i` should have received.
    fn expected(&self, i: usize, oracle: &[BTreeMap<usize, Got>]) -> BTreeSet<usize> {
        let sub = &self.subs[i];
        let o = &oracle[sub.stream];
        let end = sub.ended_at.unwrap_or(self.pubs.len());
        (0..end)
            .filter(|&s| captures(sub.stream, self.pubs[s].topic))
            .filter(|&s| match sub.start {
                Start::Earliest => true,
                Start::Latest { before } => s >= before,
                // A message the oracle lost: already reported; judged by the sure bound.
                Start::Ts { t, sure_from } => o.get(&s).map_or(s >= sure_from, |g| g.ts >= t),
                Start::After { pos, seq } => o.get(&s).map_or(s > seq, |g| g.pos > pos),
            })
            .collect()
    }

    fn check_sub(&self, i: usize, oracle: &[BTreeMap<usize, Got>]) -> Vec<String> {
        let sub = &self.subs[i];
        let want = self.expected(i, oracle);
        let have = sub.received();
        let mut bad = Vec::new();
        let missing: BTreeSet<usize> = want.difference(&have).copied().collect();
        let extra: BTreeSet<usize> = have.difference(&want).copied().collect();
        if !missing.is_empty() {
            bad.push(format!("missing {}", seqs(&missing)));
        }
        if !extra.is_empty() {
            bad.push(format!("not expected {}", seqs(&extra)));
        }
        if sub.persistent {
            let never: BTreeSet<usize> = want
                .intersection(&have)
                .filter(|s| !sub.acked().contains(s))
                .copied()
                .collect();
            if !never.is_empty() {
                bad.push(format!(
                    "received but never redelivered after the PUBACK was withheld: {}",
                    seqs(&never)
                ));
            }
        }
        // The same position, ts, key and topic as the oracle's.
        for g in &sub.got {
            if let Some(o) = oracle[sub.stream].get(&g.seq) {
                if (g.pos, g.ts, &g.key, &g.topic) != (o.pos, o.ts, &o.key, &o.topic) {
                    bad.push(format!(
                        "m{}: @{} ts {} key {:?} topic {} (oracle: @{} ts {} key {:?} topic {})",
                        g.seq, g.pos, g.ts, g.key, g.topic, o.pos, o.ts, o.key, o.topic
                    ));
                }
            }
        }
        // Duplicates.
        for (k, g) in sub.got.iter().enumerate() {
            let earlier: Vec<&Got> = sub.got[..k].iter().filter(|e| e.seq == g.seq).collect();
            if earlier.is_empty() {
                continue;
            }
            if earlier.iter().any(|e| e.epoch == g.epoch) {
                bad.push(format!(
                    "m{} received twice on connection {}",
                    g.seq, g.epoch
                ));
                continue;
            }
            if let Some(a) = earlier.iter().rev().find(|e| e.acked) {
                if g.kills <= a.kills {
                    bad.push(format!(
                        "m{} redelivered on connection {} although acknowledged on \
                         connection {} (no kill -9 in between)",
                        g.seq, g.epoch, a.epoch
                    ));
                }
            }
        }
        // Per key, in log order (positions; per publisher that is publish order, see the
        // oracle): first receipts, and everything within one connection.
        let key_of = |g: &Got| g.key.clone().unwrap_or_default();
        let mut first: BTreeMap<String, &Got> = BTreeMap::new();
        let mut seen = BTreeSet::new();
        let mut in_conn: BTreeMap<(usize, String), &Got> = BTreeMap::new();
        for g in &sub.got {
            if seen.insert(g.seq) {
                if let Some(p) = first.get(&key_of(g)) {
                    if g.pos < p.pos {
                        bad.push(format!(
                            "key {:?}: m{} first received after m{}",
                            key_of(g),
                            g.seq,
                            p.seq
                        ));
                    }
                }
                first.insert(key_of(g), g);
            }
            if let Some(p) = in_conn.get(&(g.epoch, key_of(g))) {
                if g.pos <= p.pos {
                    bad.push(format!(
                        "key {:?}: m{} after m{} on connection {}",
                        key_of(g),
                        g.seq,
                        p.seq,
                        g.epoch
                    ));
                }
            }
            in_conn.insert((g.epoch, key_of(g)), g);
        }
        if bad.is_empty() {
            return bad;
        }
        vec![format!(
            "{}: {}\n      expected {}\n      received{}",
            sub.label(),
            bad.join("; "),
            seqs(&want),
            sub.history()
        )]
    }

    async fn finish(&mut self) -> Vec<String> {
        for i in 0..self.subs.len() {
            if self.subs[i].persistent && self.subs[i].conn.is_none() {
                self.reconnect_sub(i).await;
            }
        }
        let mut oracle = Vec::new();
        for s in 0..STREAMS.len() {
            oracle.push(self.oracle(s).await);
        }
        for i in 0..self.subs.len() {
            if self.subs[i].conn.is_some() {
                let want = self.expected(i, &oracle);
                self.settle(i, &want, Ack::All, true).await;
            }
        }
        // Anything late (duplicates) has a moment to arrive.
        tokio::time::sleep(Duration::from_millis(50)).await;
        for i in 0..self.subs.len() {
            self.pump(i, Duration::from_millis(5), Ack::All).await;
        }
        let mut problems = std::mem::take(&mut self.problems);
        for i in 0..self.subs.len() {
            problems.extend(self.check_sub(i, &oracle));
        }
        problems
    }
}

/// Publish `m<first>`.. `count` messages QoS 1 to `topic`, each after the previous PUBACK;
/// returns the client clock before each PUBLISH and after its PUBACK.
async fn publish_seqs(
    c: &mut RawClient,
    topic: &str,
    first: usize,
    count: usize,
) -> Vec<(u64, u64)> {
    let mut done = Vec::with_capacity(count);
    for seq in first..first + count {
        let sent_us = now_us();
        let code = c.publish_qos1(topic, format!("m{seq}").as_bytes()).await;
        let acked_us = now_us();
        assert!(code < 0x80, "PUBACK 0x{code:02X} for m{seq}");
        done.push((sent_us, acked_us));
    }
    done
}

/// Until the broker logged `lanemq ready` for its latest start, plus a moment: it installs its
/// SIGTERM handler only after that, and a SIGTERM before kills it with the default action (a
/// race of its own, reported separately; see `sigterm_right_after_start_is_graceful`).
async fn signal_handlers_installed(b: &Broker) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let tail = b.log_tail(10_000);
        let ready = tail.rfind("lanemq ready");
        let opened = tail.rfind("log opened");
        if ready.is_some() && ready > opened {
            break;
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
}

async fn run_case(ops: Vec<Op>, trace: Arc<Mutex<String>>) -> Result<String, String> {
    let started = Instant::now();
    let broker = Broker::start_with_acl("streams-prop", ACL, CONFIG).await;
    let mut case = Case {
        broker,
        pubs: Vec::new(),
        publishers: vec![None, None],
        subs: Vec::new(),
        kills: 0,
        restarts: 0,
        batch: 0,
        trace,
        problems: Vec::new(),
    };
    for (n, op) in ops.iter().enumerate() {
        case.batch = n;
        case.log(format!("#{n} {op:?}"));
        match op {
            Op::Publish {
                publisher,
                topic,
                count,
            } => case.publish(*publisher, *topic, *count).await,
            Op::PublishBoth { topics, count } => case.publish_both(*topics, *count).await,
            Op::Subscribe {
                stream,
                offset,
                persistent,
                lag,
                small_window,
            } => {
                case.subscribe(*stream, offset, *persistent, *lag, *small_window)
                    .await
            }
            Op::Disconnect { sub } => case.disconnect(*sub).await,
            Op::Reconnect { sub } => case.reconnect(*sub).await,
            Op::Takeover { sub } => case.takeover(*sub).await,
            Op::Restart { kill, reconnect } => case.restart(*kill, *reconnect).await,
        }
        case.pump_all().await;
    }
    case.log("end: persistent subscribers reconnect, oracle reads".to_string());
    let problems = case.finish().await;
    if problems.is_empty() {
        let redelivered: usize = case
            .subs
            .iter()
            .map(|s| s.got.len() - s.received().len())
            .sum();
        let subs: Vec<String> = case
            .subs
            .iter()
            .map(|s| {
                let kind = match s.start {
                    Start::Earliest => "earliest",
                    Start::Latest { .. } => "latest",
                    Start::Ts { .. } => "ts",
                    Start::After { .. } => "@n",
                };
                let p = if s.persistent { "p" } else { "c" };
                format!("{p}:{kind}:{}", s.received().len())
            })
            .collect();
        Ok(format!(
            "{} ops, {} publishes, subscribers [{}], {} restarts ({} kill -9), {} redeliveries, {:?}",
            ops.len(),
            case.pubs.len(),
            subs.join(" "),
            case.restarts,
            case.kills,
            redelivered,
            started.elapsed()
        ))
    } else {
        Err(format!(
            "{}\n--- broker log tail ---\n{}",
            problems.join("\n"),
            case.broker.log_tail(20)
        ))
    }
}

/// One proptest case: its own runtime and broker, a bounded time, and the resolved operation
/// trace in the failure message.
fn check(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let trace = Arc::new(Mutex::new(String::new()));
    let t = trace.clone();
    let res = rt.block_on(async move {
        tokio::spawn(async move { tokio::time::timeout(CASE_TIMEOUT, run_case(ops, t)).await })
            .await
    });
    let trace = trace.lock().unwrap().clone();
    let fail = |why: String| {
        Err(TestCaseError::fail(format!(
            "{why}\n--- trace ---\n{trace}"
        )))
    };
    match res {
        Ok(Ok(Ok(summary))) => {
            eprintln!("case ok: {summary}");
            Ok(())
        }
        Ok(Ok(Err(problems))) => fail(problems),
        Ok(Err(_)) => fail(format!("the case did not finish within {CASE_TIMEOUT:?}")),
        Err(join) => {
            let why = match join.try_into_panic() {
                Ok(p) => p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panic".to_string()),
                Err(e) => e.to_string(),
            };
            fail(format!("panicked: {why}"))
        }
    }
}

fn config() -> PtConfig {
    // `PtConfig::default()` reads the PROPTEST_* environment; our defaults apply where unset.
    let mut cfg = PtConfig {
        failure_persistence: None,
        ..PtConfig::default()
    };
    let unset = |v: &str| std::env::var_os(v).is_none();
    if unset("PROPTEST_CASES") {
        cfg.cases = DEFAULT_CASES;
    }
    if unset("PROPTEST_RNG_SEED") {
        cfg.rng_seed = RngSeed::Fixed(DEFAULT_SEED);
    }
    if unset("PROPTEST_MAX_SHRINK_ITERS") {
        cfg.max_shrink_iters = 64;
    }
    if unset("PROPTEST_MAX_SHRINK_TIME") {
        cfg.max_shrink_time = 180_000;
    }
    cfg
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn subscribers_get_exactly_their_stream_from_their_offset_per_key_in_order(
        ops in prop::collection::vec(op_strategy(), 6..30)
    ) {
        check(ops)?;
    }
}

/// A SIGTERM as soon as the port accepts connections must still stop the broker gracefully
/// (exit status 0); the signal handlers are installed only after `Server::start` returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_right_after_start_is_graceful() {
    let mut b = Broker::start_with_acl("streams-prop-sigterm", ACL, CONFIG).await;
    for round in 0..200 {
        let status = b.terminate().await;
        assert!(
            status.success(),
            "round {round}: exit status after a SIGTERM right after start: {status}; log tail:\n{}",
            b.log_tail(30)
        );
        b.restart().await;
    }
}
