//! Idle-connection mode: how much broker memory does a connection cost? With `--half-open`,
//! a flood of TCP connections that never send CONNECT: does the broker close them after its
//! connect timeout, and does its memory come back?

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::conn::{parse_source_addrs, tcp_connect, Conn};
use crate::mqtt;
use crate::{client_id, rss, BenchOpts, BenchReport};

#[derive(Clone, Debug, Serialize)]
pub struct IdleReport {
    pub requested: usize,
    pub connected: u64,
    pub failed: u64,
    /// Connections dropped during the hold.
    pub dropped: u64,
    pub connect_secs: f64,
    pub hold_secs: f64,
    pub rss_before_kb: Option<u64>,
    /// One second after the last connection was established.
    pub rss_after_kb: Option<u64>,
    pub rss_end_kb: Option<u64>,
    /// (rss_after − rss_before) / connected.
    pub rss_per_connection_bytes: Option<f64>,
    /// (rss_end − rss_before) / connected: at the end of the hold, when a broker that
    /// hibernates idle connections has had the time to.
    pub rss_per_connection_end_bytes: Option<f64>,
    pub first_error: Option<String>,
    /// `--half-open` only.
    pub half_open: Option<HalfOpenReport>,
}

/// What became of connections that never sent CONNECT (`--half-open`).
#[derive(Clone, Debug, Serialize)]
pub struct HalfOpenReport {
    /// Bytes of a CONNECT each sent before going silent.
    pub bytes_sent: usize,
    /// Shortest and longest time from a connection's opening to its close by the broker.
    pub closed_after_ms_min: Option<u64>,
    pub closed_after_ms_max: Option<u64>,
    /// Broker RSS two seconds after the last connection was closed (or at the end of the hold).
    pub rss_closed_kb: Option<u64>,
}

pub async fn run(opts: &BenchOpts) -> anyhow::Result<BenchReport> {
    let mut report = BenchReport::empty(opts, "idle");
    let t0 = Instant::now();
    let hard_deadline = t0 + opts.hard_timeout();
    let n = opts.idle_connections;
    let rss_now = || opts.broker_pid.and_then(rss::vm_rss_kb);
    let rss_before = rss_now();
    let (stop_rss_tx, stop_rss_rx) = watch::channel(false);
    let sampler = opts
        .broker_pid
        .map(|pid| rss::spawn_sampler(pid, stop_rss_rx));

    let connected = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let dropped = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(std::sync::Mutex::new(None::<String>));
    let sem = Arc::new(tokio::sync::Semaphore::new(opts.connect_concurrency));
    let (stop_tx, stop_rx) = watch::channel(false);
    let addr = opts.addr();
    let version = opts.version();
    let ka = opts.keepalive;
    let ping_every = Duration::from_secs(u64::from(ka.max(2)) / 2);

    let sources: Arc<[Option<IpAddr>]> = match &opts.source_addrs {
        Some(s) => parse_source_addrs(s)?.into_iter().map(Some).collect(),
        None => Arc::new([None]),
    };
    let half_open = opts.half_open;
    // The first bytes of a CONNECT a half-open connection sends before going silent.
    let partial: Arc<[u8]> = {
        let mut b = BytesMut::new();
        mqtt::connect(&mut b, version, "half-open", ka);
        let n = opts.half_open_bytes.min(b.len());
        Arc::from(&b[..n])
    };
    let closed_min = Arc::new(AtomicU64::new(u64::MAX));
    let closed_max = Arc::new(AtomicU64::new(0));

    let mut set = JoinSet::new();
    for i in 0..n {
        let (addr, sem, id) = (addr.clone(), sem.clone(), client_id("i", i));
        let source = sources[i % sources.len()];
        let (connected, failed, dropped, first_error) = (
            connected.clone(),
            failed.clone(),
            dropped.clone(),
            first_error.clone(),
        );
        let (partial, closed_min, closed_max) =
            (partial.clone(), closed_min.clone(), closed_max.clone());
        let mut stop = stop_rx.clone();
        set.spawn(async move {
            let fail = |e: anyhow::Error| {
                failed.fetch_add(1, Ordering::Relaxed);
                let mut fe = first_error.lock().expect("first_error lock");
                fe.get_or_insert_with(|| format!("{e:#}"));
            };
            let permit = sem.acquire_owned().await;
            if half_open {
                let opened = tokio::select! {
                    c = tcp_connect(&addr, source) => c,
                    _ = stop.changed() => return,
                };
                drop(permit);
                let mut s = match opened {
                    Ok(s) => s,
                    Err(e) => return fail(e),
                };
                let t_open = Instant::now();
                connected.fetch_add(1, Ordering::Relaxed);
                if !partial.is_empty() && s.write_all(&partial).await.is_err() {
                    dropped.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                let mut buf = [0u8; 64];
                loop {
                    tokio::select! {
                        _ = stop.changed() => return,
                        r = s.read(&mut buf) => {
                            if matches!(r, Ok(n) if n > 0) {
                                continue;
                            }
                            let ms = t_open.elapsed().as_millis() as u64;
                            closed_min.fetch_min(ms, Ordering::Relaxed);
                            closed_max.fetch_max(ms, Ordering::Relaxed);
                            dropped.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    }
                }
            }
            let opened = tokio::select! {
                c = Conn::open_from(&addr, source, version, &id, ka, 64) => c,
                _ = stop.changed() => return,
            };
            drop(permit);
            let mut c = match opened {
                Ok(c) => c,
                Err(e) => return fail(e),
            };
            connected.fetch_add(1, Ordering::Relaxed);
            let mut out = BytesMut::with_capacity(2);
            mqtt::pingreq(&mut out);
            let mut ping = tokio::time::interval(ping_every);
            ping.tick().await;
            loop {
                tokio::select! {
                    _ = stop.changed() => break,
                    _ = ping.tick() => {
                        if c.wr.write_all(&out).await.is_err() {
                            dropped.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    }
                    r = c.rd.read_buf(&mut c.rbuf) => {
                        if !matches!(r, Ok(n) if n > 0) {
                            dropped.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                        c.rbuf.clear();
                    }
                }
            }
            c.close().await;
        });
    }

    // Wait until every connection attempt has finished (bounded).
    while (connected.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed)) < n as u64 {
        if Instant::now() >= hard_deadline {
            report.timed_out = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let connect_secs = t0.elapsed().as_secs_f64();
    let hold = Duration::from_secs_f64(opts.measured_duration().unwrap_or(10.0));
    let hold_start = Instant::now();
    let hold_end = (hold_start + hold).min(hard_deadline);
    tokio::time::sleep_until((hold_start + Duration::from_secs(1)).min(hold_end).into()).await;
    let rss_after = rss_now();
    if !opts.quiet && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        eprintln!(
            "{} connected, {} failed in {connect_secs:.2}s; holding {:.0}s",
            connected.load(Ordering::Relaxed),
            failed.load(Ordering::Relaxed),
            hold.as_secs_f64()
        );
    }
    let mut rss_closed = None;
    if half_open {
        // Until the broker has closed them all (bounded by the hold), then a moment for its
        // allocator to give the memory back.
        while dropped.load(Ordering::Relaxed) < connected.load(Ordering::Relaxed)
            && Instant::now() < hold_end
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let settle = (Instant::now() + Duration::from_secs(2)).min(hard_deadline);
        tokio::time::sleep_until(settle.into()).await;
        rss_closed = rss_now();
    } else {
        tokio::time::sleep_until(hold_end.into()).await;
    }
    let rss_end = rss_now();
    let hold_secs = hold_start.elapsed().as_secs_f64();
    let _ = stop_tx.send(true);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout_at(deadline, set.join_next()).await {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(_) => {
                set.abort_all();
                while set.join_next().await.is_some() {}
                break;
            }
        }
    }
    let _ = stop_rss_tx.send(true);
    if let Some(h) = sampler {
        report.broker_rss_max_kb = h.await.ok().flatten();
    }
    let connected = connected.load(Ordering::Relaxed);
    let per_conn = match (rss_before, rss_after) {
        (Some(b), Some(a)) if connected > 0 => {
            Some((a as f64 - b as f64) * 1024.0 / connected as f64)
        }
        _ => None,
    };
    let per_conn_end = match (rss_before, rss_end) {
        (Some(b), Some(a)) if connected > 0 && !half_open => {
            Some((a as f64 - b as f64) * 1024.0 / connected as f64)
        }
        _ => None,
    };
    let first_error = first_error.lock().expect("first_error lock").clone();
    if let Some(e) = &first_error {
        report
            .errors
            .push(format!("connect failed: {e} (raise `ulimit -n`?)"));
    }
    report.idle = Some(IdleReport {
        requested: n,
        connected,
        failed: failed.load(Ordering::Relaxed),
        dropped: dropped.load(Ordering::Relaxed),
        connect_secs,
        hold_secs,
        rss_before_kb: rss_before,
        rss_after_kb: rss_after,
        rss_end_kb: rss_end,
        rss_per_connection_bytes: per_conn,
        rss_per_connection_end_bytes: per_conn_end,
        first_error,
        half_open: half_open.then(|| {
            let min = closed_min.load(Ordering::Relaxed);
            HalfOpenReport {
                bytes_sent: partial.len(),
                closed_after_ms_min: (min != u64::MAX).then_some(min),
                closed_after_ms_max: (min != u64::MAX).then(|| closed_max.load(Ordering::Relaxed)),
                rss_closed_kb: rss_closed,
            }
        }),
    });
    report.elapsed_s = t0.elapsed().as_secs_f64();
    Ok(report)
}
