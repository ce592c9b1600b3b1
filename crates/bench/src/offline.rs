//! Offline-sessions mode: N persistent sessions subscribe one topic at QoS 1 and go away,
//! one publisher sends `--count` QoS 1 messages to it (N × count queued messages), then every
//! session comes back and takes its queue. How long do the publishes take, how much broker
//! memory does a queued message cost, how fast do the queues drain?

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::BytesMut;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinSet;

use crate::conn::Conn;
use crate::mqtt::{self, Frame, PublishTemplate};
use crate::{rss, BenchOpts, BenchReport};

#[derive(Clone, Debug, Serialize)]
pub struct OfflineReport {
    pub sessions: usize,
    pub messages: u64,
    /// sessions × messages.
    pub queued_expected: u64,
    pub setup_secs: f64,
    /// First PUBLISH to the last PUBACK.
    pub publish_secs: f64,
    pub rss_before_kb: Option<u64>,
    /// Two seconds after the last PUBACK.
    pub rss_after_kb: Option<u64>,
    /// (rss_after − rss_before) / queued_expected.
    pub rss_per_queued_bytes: Option<f64>,
    /// Messages the sessions received when they came back.
    pub drained: u64,
    /// First reconnect to the last message received.
    pub drain_secs: f64,
}

/// Persistent session ids, fixed per process so the sessions can be resumed.
fn session_id(run: u64, i: usize) -> String {
    format!("lanemq-bench-off-{run}-{i}")
}

pub async fn run(opts: &BenchOpts) -> anyhow::Result<BenchReport> {
    let mut report = BenchReport::empty(opts, "offline-sessions");
    let t0 = Instant::now();
    let deadline = t0 + opts.hard_timeout();
    let n = opts.offline_sessions;
    let count = opts.count.unwrap_or(200);
    let topic = format!("{}/offline", opts.topic_prefix);
    let version = opts.version();
    let expiry = if opts.session_expiry > 0 {
        opts.session_expiry
    } else {
        3600
    };
    let run_id = std::process::id() as u64;
    let addr = opts.addr();
    let sem = Arc::new(tokio::sync::Semaphore::new(opts.connect_concurrency));

    // 1. Sessions subscribe and leave.
    let mut set = JoinSet::new();
    for i in 0..n {
        let (addr, sem, topic, id) = (
            addr.clone(),
            sem.clone(),
            topic.clone(),
            session_id(run_id, i),
        );
        let ka = opts.keepalive;
        set.spawn(async move {
            let _permit = sem.acquire_owned().await?;
            let mut c = Conn::open_with_expiry(&addr, version, &id, ka, 512, expiry).await?;
            c.subscribe(&topic, 1).await?;
            c.close().await;
            anyhow::Ok(())
        });
    }
    while let Some(r) = set.join_next().await {
        r.context("set-up task")??;
    }
    let setup_secs = t0.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before = opts.broker_pid.and_then(rss::vm_rss_kb);

    // 2. One publisher, QoS 1, a window of --inflight.
    let mut p = Conn::open(
        &addr,
        version,
        &crate::client_id("offp", 0),
        opts.keepalive,
        4096,
    )
    .await?;
    let window = opts
        .inflight
        .min(usize::from(p.receive_max.unwrap_or(u16::MAX)))
        .max(1);
    let tpl = PublishTemplate::new(version, &topic, 1, opts.payload.max(16) as usize);
    let start = Instant::now();
    let (mut sent, mut acked, mut outstanding) = (0u64, 0u64, 0usize);
    let mut out = BytesMut::new();
    while acked < count {
        if Instant::now() >= deadline {
            report.timed_out = true;
            break;
        }
        while sent < count && outstanding < window {
            let pid = (sent % 65_535) as u16 + 1;
            tpl.write(&mut out, pid, 0, sent);
            sent += 1;
            outstanding += 1;
        }
        if !out.is_empty() {
            p.wr.write_all(&out).await?;
            out.clear();
        }
        match tokio::time::timeout(Duration::from_secs(30), p.next_frame()).await {
            Ok(Ok(Frame::Ack {
                kind: 4, reason, ..
            })) => {
                if reason >= 0x80 {
                    report.ack_errors += 1;
                }
                acked += 1;
                outstanding -= 1;
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => bail!("publisher: {e:#}"),
            Err(_) => bail!("publisher: no PUBACK for 30 s"),
        }
    }
    let publish_secs = start.elapsed().as_secs_f64();
    p.close().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_after = opts.broker_pid.and_then(rss::vm_rss_kb);

    // 3. Every session comes back and takes its queue.
    let drained = Arc::new(AtomicU64::new(0));
    let drain_start = Instant::now();
    let mut set = JoinSet::new();
    for i in 0..n {
        let (addr, sem, drained, id) = (
            addr.clone(),
            sem.clone(),
            drained.clone(),
            session_id(run_id, i),
        );
        let ka = opts.keepalive;
        set.spawn(async move {
            let permit = sem.acquire_owned().await?;
            let mut c =
                Conn::open_session(&addr, version, &id, ka, 16 * 1024, expiry, false).await?;
            drop(permit);
            let mut got = 0u64;
            let mut acks = BytesMut::new();
            while got < count {
                if Instant::now() >= deadline {
                    break;
                }
                let r =
                    tokio::time::timeout(Duration::from_secs(10), c.rd.read_buf(&mut c.rbuf)).await;
                match r {
                    Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
                    Ok(Ok(_)) => {}
                }
                while let Some(f) = mqtt::parse(&mut c.rbuf, version)? {
                    if let Frame::Publish { qos, pid, .. } = f {
                        got += 1;
                        if qos == 1 {
                            mqtt::ack(&mut acks, 4, pid);
                        }
                    }
                }
                if !acks.is_empty() {
                    c.wr.write_all(&acks).await?;
                    acks.clear();
                }
                c.ensure_read_space_later();
            }
            drained.fetch_add(got, Ordering::Relaxed);
            c.close().await;
            anyhow::Ok(Instant::now())
        });
    }
    let mut last = drain_start;
    while let Some(r) = set.join_next().await {
        match r.context("drain task")? {
            Ok(t) => last = last.max(t),
            Err(e) => report.errors.push(format!("{e:#}")),
        }
    }
    let drained = drained.load(Ordering::Relaxed);
    let queued_expected = n as u64 * count;
    report.published = sent;
    report.acked = acked;
    report.received = drained;
    report.expected = queued_expected;
    report.loss = queued_expected as i64 - drained as i64;
    report.publish_secs = publish_secs;
    report.elapsed_s = t0.elapsed().as_secs_f64();
    report.offline = Some(OfflineReport {
        sessions: n,
        messages: count,
        queued_expected,
        setup_secs,
        publish_secs,
        rss_before_kb: rss_before,
        rss_after_kb: rss_after,
        rss_per_queued_bytes: rss_after
            .zip(rss_before)
            .map(|(a, b)| (a as f64 - b as f64) * 1024.0 / queued_expected.max(1) as f64),
        drained,
        drain_secs: last.duration_since(drain_start).as_secs_f64(),
    });
    Ok(report)
}
