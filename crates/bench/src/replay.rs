//! Stream replay mode: one MQTT 5 subscriber reads a named stream from an offset
//! (`SUBSCRIBE $stream/<name>` with the user property `stream-offset`) and counts what
//! arrives: how fast does the broker replay history, and how much memory does it take?

use std::time::{Duration, Instant};

use bytes::BytesMut;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use crate::conn::Conn;
use crate::mqtt::{self, Frame, Version};
use crate::{client_id, rss, BenchOpts, BenchReport};

#[derive(Clone, Debug, Serialize)]
pub struct ReplayReport {
    pub stream: String,
    pub offset: String,
    /// Messages expected (`--count`), if given.
    pub expected: Option<u64>,
    pub received: u64,
    /// SUBACK to the last message counted.
    pub secs: f64,
    pub msgs_per_sec: f64,
    /// Seconds from SUBACK to the first message.
    pub first_message_secs: Option<f64>,
    pub rss_before_kb: Option<u64>,
    /// Max RSS during the replay minus RSS before it.
    pub rss_growth_kb: Option<u64>,
}

pub async fn run(opts: &BenchOpts, stream: &str) -> anyhow::Result<BenchReport> {
    let mut report = BenchReport::empty(opts, "stream-replay");
    let t0 = Instant::now();
    let deadline = t0 + opts.hard_timeout();
    let rss_before = opts.broker_pid.and_then(rss::vm_rss_kb);
    let (stop_tx, stop_rx) = watch::channel(false);
    let sampler = opts.broker_pid.map(|pid| rss::spawn_sampler(pid, stop_rx));
    let mut c = Conn::open(
        &opts.addr(),
        Version::V5,
        &client_id("r", 0),
        opts.keepalive,
        256 * 1024,
    )
    .await?;
    let filter = format!("$stream/{stream}");
    c.subscribe_with_property(&filter, opts.qos, "stream-offset", &opts.stream_offset)
        .await?;
    let start = Instant::now();
    let mut received = 0u64;
    let mut first = None;
    let mut last = start;
    let mut acks = BytesMut::new();
    let idle = Duration::from_secs_f64(opts.drain.max(0.5));
    let want = opts.count;
    'read: loop {
        if want.is_some_and(|w| received >= w) {
            break;
        }
        let now = Instant::now();
        if now >= deadline {
            report.timed_out = true;
            break;
        }
        let wait = idle.min(deadline - now);
        let n = match tokio::time::timeout(wait, c.rd.read_buf(&mut c.rbuf)).await {
            Ok(Ok(0)) => {
                report.errors.push("connection closed by broker".into());
                break;
            }
            Ok(Ok(n)) => n,
            Ok(Err(e)) => {
                report.errors.push(e.to_string());
                break;
            }
            Err(_) => break, // no progress for --drain seconds
        };
        let _ = n;
        loop {
            match mqtt::parse(&mut c.rbuf, Version::V5)? {
                Some(Frame::Publish { qos, pid, .. }) => {
                    received += 1;
                    last = Instant::now();
                    first.get_or_insert(last);
                    match qos {
                        1 => mqtt::ack(&mut acks, 4, pid),
                        2 => mqtt::ack(&mut acks, 5, pid),
                        _ => {}
                    }
                    if want.is_some_and(|w| received >= w) {
                        break;
                    }
                }
                Some(Frame::Ack { kind: 6, pid, .. }) => mqtt::ack(&mut acks, 7, pid),
                Some(Frame::Disconnect { reason }) => {
                    report
                        .errors
                        .push(format!("DISCONNECT from broker, reason {reason:#x}"));
                    break 'read;
                }
                Some(_) => {}
                None => break,
            }
        }
        if !acks.is_empty() {
            c.wr.write_all(&acks).await?;
            acks.clear();
        }
        c.ensure_read_space_later();
    }
    let secs = last.duration_since(start).as_secs_f64();
    c.close().await;
    let _ = stop_tx.send(true);
    let rss_max = match sampler {
        Some(h) => h.await.ok().flatten(),
        None => None,
    };
    report.broker_rss_max_kb = rss_max;
    report.received = received;
    report.expected = want.unwrap_or(received);
    report.loss = report.expected as i64 - received as i64;
    report.elapsed_s = t0.elapsed().as_secs_f64();
    report.msgs_per_sec_out = if secs > 0.0 {
        received as f64 / secs
    } else {
        0.0
    };
    report.replay = Some(ReplayReport {
        stream: stream.to_string(),
        offset: opts.stream_offset.clone(),
        expected: want,
        received,
        secs,
        msgs_per_sec: report.msgs_per_sec_out,
        first_message_secs: first.map(|f| f.duration_since(start).as_secs_f64()),
        rss_before_kb: rss_before,
        rss_growth_kb: rss_max.zip(rss_before).map(|(m, b)| m.saturating_sub(b)),
    });
    Ok(report)
}
