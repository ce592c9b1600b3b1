//! Publisher and subscriber tasks of the throughput / latency run, and the
//! connection loops they share with the lanes mode.
//!
//! Each connection is driven by one task that `select!`s over its socket's
//! read half, write half and a pacing timer, so QoS 1/2 acknowledgements are
//! processed while PUBLISH frames are still being written (an inflight
//! window, not one round trip per message), and frames are batched into
//! writes of up to [`BATCH_BYTES`]. [`publish_loop`] runs a publisher for a
//! [`Feed`] (what it sends and how it counts), [`receive_loop`] a subscriber
//! for a [`Sink`] (what it does with a delivery).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use bytes::{Buf, BytesMut};
use hdrhistogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::sleep_until;

use crate::conn::Conn;
use crate::mqtt::{self, Frame, Publish, PublishTemplate};

/// Target size of one write: many PUBLISH frames per syscall.
pub const BATCH_BYTES: usize = 64 * 1024;

/// Nanoseconds since `base`: the clock of every embedded timestamp.
pub fn nanos_since(base: Instant) -> u64 {
    base.elapsed().as_nanos() as u64
}

/// Counters shared by all tasks, read by the progress line and the drain.
pub struct Shared {
    /// Base of every embedded timestamp.
    pub base: Instant,
    /// Messages stamped before this (nanos since `base`) are warm-up.
    pub measure_start_ns: u64,
    pub sent: AtomicU64,
    /// Sum over sent messages of the subscribers each should reach.
    pub expected: AtomicU64,
    pub received: AtomicU64,
}

impl Shared {
    pub fn now_ns(&self) -> u64 {
        nanos_since(self.base)
    }
}

/// When and how fast one publisher sends.
#[derive(Clone, Debug)]
pub struct Pace {
    pub qos: u8,
    /// Messages per second for this publisher; 0 = unlimited.
    pub rate: f64,
    pub count: Option<u64>,
    pub start: Instant,
    pub end: Option<Instant>,
    /// Inflight window (QoS > 0), see [`Conn::window`].
    pub window: usize,
}

/// Offset of publisher `i` in its start time: the publishers spread evenly
/// over one interval of the total `rate` (none when unlimited).
pub fn stagger(i: usize, rate: u64) -> Duration {
    if rate > 0 {
        Duration::from_secs_f64(i as f64 / rate as f64)
    } else {
        Duration::ZERO
    }
}

/// What a publisher sends, and its bookkeeping; driven by [`publish_loop`].
pub trait Feed {
    /// About the size of one PUBLISH frame (sizes the write buffer).
    fn frame_len(&self) -> usize;
    /// Append the next PUBLISH, packet id `pid` (0 at QoS 0), stamped `ts`;
    /// false, appending nothing, when there is none (the publisher is done).
    fn write_next(&mut self, buf: &mut BytesMut, pid: u16, ts: u64) -> bool;
    /// `n` > 0 PUBLISH frames stamped `ts` were appended.
    fn sent(&mut self, n: u64, ts: u64);
    /// A PUBACK / PUBREC / PUBCOMP with `reason`; `done` when it ended the
    /// exchange of a packet in flight (a refused PUBREC ends it too).
    fn ack(&mut self, kind: u8, reason: u8, done: bool);
}

/// What [`publish_loop`] counts itself.
#[derive(Debug, Default)]
pub struct Sent {
    pub sent: u64,
    /// Nanos since base when the last PUBLISH bytes were written to the socket.
    pub last_send_ns: u64,
}

/// Send `feed`'s messages at `pace` until its end or count, the feed runs
/// out, or `stop`; then wait for what is in flight (unless stopped).
pub async fn publish_loop(
    c: &mut Conn,
    pace: &Pace,
    base: Instant,
    stop: &mut watch::Receiver<bool>,
    feed: &mut impl Feed,
    r: &mut Sent,
) -> anyhow::Result<()> {
    let mut wbuf = BytesMut::with_capacity(BATCH_BYTES + feed.frame_len() + 1024);
    let mut in_use = if pace.qos > 0 {
        vec![false; 65_536]
    } else {
        Vec::new()
    };
    let mut next_pid: u16 = 0;
    let mut inflight = 0usize;
    let mut done_sending = false;
    // wbuf holds PUBLISH bytes (not only PUBRELs) not yet written.
    let mut pub_pending = false;
    if *stop.borrow() {
        return Ok(());
    }
    loop {
        let now = Instant::now();
        if !done_sending
            && (pace.end.is_some_and(|e| now >= e) || pace.count.is_some_and(|n| r.sent >= n))
        {
            done_sending = true;
        }
        if done_sending && wbuf.is_empty() && inflight == 0 {
            return Ok(());
        }
        // Top up the write buffer.
        let mut next_due = None;
        if !done_sending && wbuf.len() < BATCH_BYTES && now >= pace.start {
            let mut n = u64::MAX;
            if let Some(c) = pace.count {
                n = n.min(c - r.sent);
            }
            if pace.qos > 0 {
                n = n.min((pace.window - inflight) as u64);
            }
            if pace.rate > 0.0 {
                let due = ((now - pace.start).as_secs_f64() * pace.rate) as u64 + 1;
                let allowed = due.saturating_sub(r.sent);
                if allowed <= n {
                    n = allowed;
                    let at = (r.sent + n) as f64 / pace.rate;
                    next_due = Some(pace.start + Duration::from_secs_f64(at));
                }
            }
            // One send time for the batch (no clock read when the window is full).
            let ts = if n > 0 { nanos_since(base) } else { 0 };
            let mut wrote = 0;
            // Up to BATCH_BYTES and one frame more.
            while wrote < n && wbuf.len() <= BATCH_BYTES {
                let pid = if pace.qos > 0 {
                    loop {
                        next_pid = next_pid.wrapping_add(1).max(1);
                        if !in_use[usize::from(next_pid)] {
                            break;
                        }
                    }
                    next_pid
                } else {
                    0
                };
                if !feed.write_next(&mut wbuf, pid, ts) {
                    done_sending = true;
                    break;
                }
                if pace.qos > 0 {
                    in_use[usize::from(pid)] = true;
                    inflight += 1;
                }
                wrote += 1;
            }
            if wrote > 0 {
                r.sent += wrote;
                pub_pending = true;
                feed.sent(wrote, ts);
            }
        } else if !done_sending && now < pace.start {
            next_due = Some(pace.start);
        }
        // The feed may have run out just now, with nothing left in flight.
        if done_sending && wbuf.is_empty() && inflight == 0 {
            return Ok(());
        }
        // Wake-up for the end of the run when nothing else would wake us.
        let wake = match (next_due, pace.end) {
            _ if done_sending || !wbuf.is_empty() => None,
            (Some(d), Some(e)) => Some(d.min(e)),
            (Some(d), None) => Some(d),
            (None, Some(e)) if pace.qos > 0 => Some(e),
            (None, _) => None,
        };
        tokio::select! {
            biased;
            _ = stop.changed() => return Ok(()),
            res = c.rd.read_buf(&mut c.rbuf) => {
                if res? == 0 {
                    bail!("connection closed by broker");
                }
                c.ensure_read_space_later();
                while let Some(f) = mqtt::parse(&mut c.rbuf, c.version)? {
                    match f {
                        Frame::Ack { kind, pid, reason } => {
                            let slot = usize::from(pid);
                            let in_flight = in_use.get(slot) == Some(&true);
                            let done = match (pace.qos, kind) {
                                (1, mqtt::PUBACK) | (2, mqtt::PUBCOMP) => in_flight,
                                (2, mqtt::PUBREC) if reason < 0x80 => {
                                    mqtt::ack(&mut wbuf, mqtt::PUBREL, pid);
                                    false
                                }
                                // Refused: the exchange ends here.
                                (2, mqtt::PUBREC) => in_flight,
                                _ => false,
                            };
                            if done {
                                in_use[slot] = false;
                                inflight -= 1;
                            }
                            feed.ack(kind, reason, done);
                        }
                        Frame::Disconnect { reason } => bail!("broker sent DISCONNECT {reason:#x}"),
                        _ => {}
                    }
                }
            }
            res = c.wr.write(&wbuf), if !wbuf.is_empty() => {
                let n = res?;
                if n == 0 {
                    bail!("write returned 0");
                }
                wbuf.advance(n);
                if pub_pending {
                    r.last_send_ns = nanos_since(base);
                    pub_pending = !wbuf.is_empty();
                }
            }
            _ = sleep_until(wake.unwrap_or(now).into()), if wake.is_some() => {}
        }
    }
}

/// What a subscriber does with the PUBLISH frames it reads; driven by
/// [`receive_loop`], which acknowledges them.
pub trait Sink {
    /// One PUBLISH, read at `now` (nanos since the run's base).
    fn publish(&mut self, p: &Publish<'_>, now: u64);
    /// The frames of one read were handled: `got` PUBLISH among them.
    fn batch(&mut self, _got: u64, _now: u64) {}
}

/// Hand every PUBLISH to `sink` and acknowledge it (QoS 1 and 2) until
/// `stop`; frames already buffered (from the set-up) come first.
pub async fn receive_loop(
    c: &mut Conn,
    base: Instant,
    stop: &mut watch::Receiver<bool>,
    sink: &mut impl Sink,
) -> anyhow::Result<()> {
    let mut acks = BytesMut::with_capacity(4096);
    if *stop.borrow() {
        return Ok(());
    }
    loop {
        let now = nanos_since(base);
        let mut got = 0;
        while let Some(f) = mqtt::parse_with(&mut c.rbuf, c.version, |p| sink.publish(p, now))? {
            match f {
                Frame::Publish { qos, pid, .. } => {
                    got += 1;
                    match qos {
                        1 => mqtt::ack(&mut acks, mqtt::PUBACK, pid),
                        2 => mqtt::ack(&mut acks, mqtt::PUBREC, pid),
                        _ => {}
                    }
                }
                Frame::Ack {
                    kind: mqtt::PUBREL,
                    pid,
                    ..
                } => mqtt::ack(&mut acks, mqtt::PUBCOMP, pid),
                Frame::Disconnect { reason } => bail!("broker sent DISCONNECT {reason:#x}"),
                _ => {}
            }
        }
        sink.batch(got, now);
        if !acks.is_empty() {
            tokio::select! {
                biased;
                _ = stop.changed() => return Ok(()),
                res = c.wr.write_all(&acks) => res?,
            }
            acks.clear();
        }
        c.ensure_read_space_later();
        tokio::select! {
            biased;
            _ = stop.changed() => return Ok(()),
            res = c.rd.read_buf(&mut c.rbuf) => {
                if res? == 0 {
                    bail!("connection closed by broker");
                }
            }
        }
    }
}

pub struct PubCfg {
    pub id: u32,
    pub template: PublishTemplate,
    pub pace: Pace,
    pub subs_per_msg: u64,
}

#[derive(Debug, Default)]
pub struct PubResult {
    pub sent: u64,
    pub sent_measured: u64,
    pub acked: u64,
    pub ack_errors: u64,
    pub subs_per_msg: u64,
    /// Nanos since base when the last PUBLISH bytes were written to the socket.
    pub last_send_ns: u64,
    pub error: Option<String>,
}

/// The throughput run's [`Feed`]: the template to one topic, tagged with the
/// publisher id and sequence.
struct LoadFeed<'a> {
    cfg: &'a PubCfg,
    shared: &'a Shared,
    r: PubResult,
    seq: u64,
}

impl Feed for LoadFeed<'_> {
    fn frame_len(&self) -> usize {
        self.cfg.template.frame_len()
    }

    fn write_next(&mut self, buf: &mut BytesMut, pid: u16, ts: u64) -> bool {
        let tag = u64::from(self.cfg.id) << 32 | (self.seq & 0xffff_ffff);
        self.cfg.template.write(buf, pid, ts, tag);
        self.seq += 1;
        true
    }

    fn sent(&mut self, n: u64, ts: u64) {
        if ts >= self.shared.measure_start_ns {
            self.r.sent_measured += n;
        }
        self.shared.sent.fetch_add(n, Ordering::Relaxed);
        self.shared
            .expected
            .fetch_add(n * self.cfg.subs_per_msg, Ordering::Relaxed);
    }

    fn ack(&mut self, kind: u8, reason: u8, done: bool) {
        if reason >= 0x80 {
            self.r.ack_errors += 1;
        }
        if done && kind != mqtt::PUBREC {
            self.r.acked += 1;
        }
    }
}

pub async fn publisher(
    mut c: Conn,
    cfg: PubCfg,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) -> PubResult {
    let mut feed = LoadFeed {
        cfg: &cfg,
        shared: &shared,
        r: PubResult {
            subs_per_msg: cfg.subs_per_msg,
            ..PubResult::default()
        },
        seq: 0,
    };
    let mut sent = Sent::default();
    let res = publish_loop(
        &mut c,
        &cfg.pace,
        shared.base,
        &mut stop,
        &mut feed,
        &mut sent,
    )
    .await;
    let mut r = feed.r;
    r.sent = sent.sent;
    r.last_send_ns = sent.last_send_ns;
    if let Err(e) = res {
        r.error = Some(format!("publisher {}: {e:#}", cfg.id));
    }
    c.close().await;
    r
}

pub struct SubResult {
    pub received: u64,
    pub received_measured: u64,
    pub last_recv_ns: u64,
    pub hist: Histogram<u64>,
    pub error: Option<String>,
}

pub fn new_histogram() -> Histogram<u64> {
    // 1 ns .. 60 s at 3 significant figures.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("static histogram bounds are valid")
}

/// The throughput run's [`Sink`]: latency of the measured messages, counts.
struct LoadSink<'a> {
    shared: &'a Shared,
    r: SubResult,
}

impl Sink for LoadSink<'_> {
    fn publish(&mut self, p: &Publish<'_>, now: u64) {
        if let Some(ts) = p.ts() {
            if ts >= self.shared.measure_start_ns {
                self.r.received_measured += 1;
                self.r.hist.saturating_record(now.saturating_sub(ts).max(1));
            }
        }
    }

    fn batch(&mut self, got: u64, now: u64) {
        if got > 0 {
            self.r.received += got;
            self.r.last_recv_ns = now;
            self.shared.received.fetch_add(got, Ordering::Relaxed);
        }
    }
}

pub async fn subscriber(
    mut c: Conn,
    id: usize,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) -> SubResult {
    let mut sink = LoadSink {
        shared: &shared,
        r: SubResult {
            received: 0,
            received_measured: 0,
            last_recv_ns: 0,
            hist: new_histogram(),
            error: None,
        },
    };
    if let Err(e) = receive_loop(&mut c, shared.base, &mut stop, &mut sink).await {
        sink.r.error = Some(format!("subscriber {id}: {e:#}"));
    }
    c.close().await;
    sink.r
}
