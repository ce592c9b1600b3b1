//! Publisher and subscriber tasks of the throughput / latency run.
//!
//! Each connection is driven by one task that `select!`s over its socket's
//! read half, write half and a pacing timer, so QoS 1/2 acknowledgements are
//! processed while PUBLISH frames are still being written (an inflight
//! window, not one round trip per message), and frames are batched into
//! writes of up to [`BATCH_BYTES`].

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
use crate::mqtt::{self, Frame, PublishTemplate};

/// Target size of one write: many PUBLISH frames per syscall.
pub const BATCH_BYTES: usize = 64 * 1024;

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
        self.base.elapsed().as_nanos() as u64
    }
}

pub struct PubCfg {
    pub id: u32,
    pub template: PublishTemplate,
    pub qos: u8,
    /// Messages per second for this publisher; 0 = unlimited.
    pub rate: f64,
    pub count: Option<u64>,
    pub start: Instant,
    pub end: Option<Instant>,
    pub window: usize,
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

pub async fn publisher(
    mut c: Conn,
    cfg: PubCfg,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) -> PubResult {
    let mut r = PubResult {
        subs_per_msg: cfg.subs_per_msg,
        ..PubResult::default()
    };
    if let Err(e) = publish_loop(&mut c, &cfg, &shared, &mut stop, &mut r).await {
        r.error = Some(format!("publisher {}: {e:#}", cfg.id));
    }
    c.close().await;
    r
}

async fn publish_loop(
    c: &mut Conn,
    cfg: &PubCfg,
    shared: &Shared,
    stop: &mut watch::Receiver<bool>,
    r: &mut PubResult,
) -> anyhow::Result<()> {
    let frame_len = cfg.template.frame_len();
    let mut wbuf = BytesMut::with_capacity(BATCH_BYTES + frame_len + 1024);
    let mut in_use = if cfg.qos > 0 {
        vec![false; 65_536]
    } else {
        Vec::new()
    };
    let mut next_pid: u16 = 0;
    let mut inflight = 0usize;
    let mut done_sending = false;
    // wbuf holds PUBLISH bytes (not only PUBRELs) not yet written.
    let mut pub_pending = false;
    let tag_hi = u64::from(cfg.id) << 32;
    if *stop.borrow() {
        return Ok(());
    }
    loop {
        let now = Instant::now();
        if !done_sending
            && (cfg.end.is_some_and(|e| now >= e) || cfg.count.is_some_and(|n| r.sent >= n))
        {
            done_sending = true;
        }
        if done_sending && wbuf.is_empty() && inflight == 0 {
            return Ok(());
        }
        // Top up the write buffer.
        let mut next_due = None;
        if !done_sending && wbuf.len() < BATCH_BYTES && now >= cfg.start {
            let mut n = ((BATCH_BYTES - wbuf.len()) / frame_len + 1) as u64;
            if let Some(c) = cfg.count {
                n = n.min(c - r.sent);
            }
            if cfg.qos > 0 {
                n = n.min((cfg.window - inflight) as u64);
            }
            if cfg.rate > 0.0 {
                let due = ((now - cfg.start).as_secs_f64() * cfg.rate) as u64 + 1;
                let allowed = due.saturating_sub(r.sent);
                if allowed <= n {
                    n = allowed;
                    let at = (r.sent + n) as f64 / cfg.rate;
                    next_due = Some(cfg.start + Duration::from_secs_f64(at));
                }
            }
            if n > 0 {
                let ts = shared.now_ns();
                for _ in 0..n {
                    let pid = if cfg.qos > 0 {
                        loop {
                            next_pid = next_pid.wrapping_add(1).max(1);
                            if !in_use[usize::from(next_pid)] {
                                break;
                            }
                        }
                        in_use[usize::from(next_pid)] = true;
                        inflight += 1;
                        next_pid
                    } else {
                        0
                    };
                    cfg.template
                        .write(&mut wbuf, pid, ts, tag_hi | (r.sent & 0xffff_ffff));
                    r.sent += 1;
                }
                if ts >= shared.measure_start_ns {
                    r.sent_measured += n;
                }
                pub_pending = true;
                shared.sent.fetch_add(n, Ordering::Relaxed);
                shared
                    .expected
                    .fetch_add(n * cfg.subs_per_msg, Ordering::Relaxed);
            }
        } else if !done_sending && now < cfg.start {
            next_due = Some(cfg.start);
        }
        // Wake-up for the end of the run when nothing else would wake us.
        let wake = match (next_due, cfg.end) {
            _ if done_sending || !wbuf.is_empty() => None,
            (Some(d), Some(e)) => Some(d.min(e)),
            (Some(d), None) => Some(d),
            (None, Some(e)) if cfg.qos > 0 => Some(e),
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
                            if reason >= 0x80 {
                                r.ack_errors += 1;
                            }
                            let slot = usize::from(pid);
                            match (cfg.qos, kind) {
                                (1, mqtt::PUBACK) | (2, mqtt::PUBCOMP) if in_use.get(slot) == Some(&true) => {
                                    in_use[slot] = false;
                                    inflight -= 1;
                                    r.acked += 1;
                                }
                                (2, mqtt::PUBREC) if reason < 0x80 => mqtt::ack(&mut wbuf, mqtt::PUBREL, pid),
                                (2, mqtt::PUBREC) if in_use.get(slot) == Some(&true) => {
                                    // Refused: the exchange ends here.
                                    in_use[slot] = false;
                                    inflight -= 1;
                                }
                                _ => {}
                            }
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
                    r.last_send_ns = shared.now_ns();
                    pub_pending = !wbuf.is_empty();
                }
            }
            _ = sleep_until(wake.unwrap_or(now).into()), if wake.is_some() => {}
        }
    }
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

pub async fn subscriber(
    mut c: Conn,
    id: usize,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) -> SubResult {
    let mut r = SubResult {
        received: 0,
        received_measured: 0,
        last_recv_ns: 0,
        hist: new_histogram(),
        error: None,
    };
    if let Err(e) = subscribe_loop(&mut c, &shared, &mut stop, &mut r).await {
        r.error = Some(format!("subscriber {id}: {e:#}"));
    }
    c.close().await;
    r
}

async fn subscribe_loop(
    c: &mut Conn,
    shared: &Shared,
    stop: &mut watch::Receiver<bool>,
    r: &mut SubResult,
) -> anyhow::Result<()> {
    let mut acks = BytesMut::with_capacity(4096);
    if *stop.borrow() {
        return Ok(());
    }
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => return Ok(()),
            res = c.rd.read_buf(&mut c.rbuf) => {
                if res? == 0 {
                    bail!("connection closed by broker");
                }
            }
        }
        let now = shared.now_ns();
        let mut got = 0;
        while let Some(f) = mqtt::parse(&mut c.rbuf, c.version)? {
            match f {
                Frame::Publish { qos, pid, ts } => {
                    got += 1;
                    if let Some(ts) = ts {
                        if ts >= shared.measure_start_ns {
                            r.received_measured += 1;
                            r.hist.saturating_record(now.saturating_sub(ts).max(1));
                        }
                    }
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
        if got > 0 {
            r.received += got;
            r.last_recv_ns = now;
            shared.received.fetch_add(got, Ordering::Relaxed);
        }
        if !acks.is_empty() {
            tokio::select! {
                biased;
                _ = stop.changed() => return Ok(()),
                res = c.wr.write_all(&acks) => res?,
            }
            acks.clear();
        }
        c.ensure_read_space_later();
    }
}
