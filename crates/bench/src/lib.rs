//! lanemq-bench: an MQTT 3.1.1 / 5 load generator.
//!
//! [`run`] drives publishers and subscribers over a lean raw-TCP client
//! (see [`mqtt`]) and returns a [`BenchReport`] with throughput, end-to-end
//! latency percentiles, loss and optionally the broker's peak RSS. The
//! options are a [`clap::Args`] struct so another binary can flatten them
//! (`lanemq bench ...`).

use std::fmt;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinSet;

pub mod conn;
mod idle;
pub mod lanes;
pub mod load;
pub mod mqtt;
mod offline;
mod replay;
pub mod rss;

use conn::Conn;
use load::{Pace, PubCfg, Shared};
use mqtt::{PublishTemplate, Version};

pub use idle::{HalfOpenReport, IdleReport};
pub use lanes::LanesReport;
pub use offline::OfflineReport;
pub use replay::ReplayReport;

/// How publishers and subscribers are wired to topics.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TopicMode {
    /// All publishers publish to one topic; every subscriber subscribes to it.
    FanIn,
    /// One topic; every subscriber receives every message (typically 1 publisher).
    FanOut,
    /// Publisher i publishes to its own topic, read by subscriber i only.
    Pairs,
}

/// Load generator options.
#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct BenchOpts {
    /// Broker host.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Broker MQTT port.
    #[arg(long, default_value_t = 1883)]
    pub port: u16,
    /// The subscribers' MQTT port, when they connect to another broker of a cluster than the
    /// publishers (same host).
    #[arg(long)]
    pub sub_port: Option<u16>,
    /// Number of publishing connections.
    #[arg(long, default_value_t = 1)]
    pub publishers: usize,
    /// Number of subscribing connections.
    #[arg(long, default_value_t = 1)]
    pub subscribers: usize,
    /// QoS of the PUBLISHes and of the subscriptions.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub qos: u8,
    /// Payload size in bytes (the first 16 carry a timestamp and a tag).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(16..))]
    pub payload: u32,
    /// Topic layout.
    #[arg(long, value_enum, default_value_t = TopicMode::FanIn)]
    pub topic_mode: TopicMode,
    /// Measured run time in seconds (after --warmup). Default 10 unless --count is given.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Messages per publisher (warm-up included); stops at whichever of --duration/--count comes first.
    #[arg(long)]
    pub count: Option<u64>,
    /// Total publish rate in msg/s over all publishers, paced evenly; 0 = as fast as possible.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// MQTT version: 3 (3.1.1) or 5.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u8).range(3..=5))]
    pub mqtt_version: u8,
    /// Write the JSON report to this file ("-" = stdout).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Broker process id: sample its VmRSS from /proc and report the maximum.
    #[arg(long)]
    pub broker_pid: Option<u32>,
    /// Idle mode: open this many idle connections, hold them for --duration,
    /// report broker RSS before/after and per connection.
    #[arg(long, default_value_t = 0)]
    pub idle_connections: usize,
    /// Local source addresses of the idle connections, used in turn: a comma-separated
    /// list of addresses and IPv4 ranges, e.g. `127.0.0.1-127.0.0.8`. One source address
    /// has ~28k ephemeral ports towards one broker port; 200,000 connections need 8 (on
    /// Linux all of 127.0.0.0/8 reaches a broker listening on 127.0.0.1).
    #[arg(long, value_name = "ADDRS")]
    pub source_addrs: Option<String>,
    /// Idle mode without MQTT: the connections never send CONNECT (a flood of silent TCP
    /// connections); reports how many the broker closed, how long after opening, and its
    /// RSS once they are closed. The hold ends when all are closed (or after --duration).
    #[arg(long)]
    pub half_open: bool,
    /// With --half-open: send the first N bytes of a CONNECT, then nothing more.
    #[arg(long, default_value_t = 0)]
    pub half_open_bytes: usize,
    /// Offline-sessions mode: this many persistent sessions subscribe one topic at QoS 1 and
    /// disconnect, one publisher sends --count (default 200) QoS 1 messages of --payload
    /// bytes to it, then every session reconnects and takes its queue; reports the publish
    /// time, broker RSS per queued message (with --broker-pid) and the drain time.
    #[arg(long, default_value_t = 0)]
    pub offline_sessions: usize,
    /// Warm-up seconds before measuring (messages sent during warm-up are not counted).
    #[arg(long, default_value_t = 0.0)]
    pub warmup: f64,
    /// QoS 1/2 inflight window per publisher (capped by the broker's Receive Maximum).
    #[arg(long, default_value_t = 100)]
    pub inflight: usize,
    /// Keep-alive seconds sent in CONNECT (idle connections ping at half of it).
    #[arg(long, default_value_t = 60)]
    pub keepalive: u16,
    /// Topic prefix.
    #[arg(long, default_value = "lanemq-bench")]
    pub topic_prefix: String,
    /// After publishing stops, wait up to this many seconds without progress
    /// for outstanding messages.
    #[arg(long, default_value_t = 3.0)]
    pub drain: f64,
    /// Hard overall timeout in seconds (default: warm-up + duration + drain + 60).
    #[arg(long)]
    pub timeout: Option<f64>,
    /// Connection handshakes in flight at once (idle mode and set-up).
    #[arg(long, default_value_t = 200)]
    pub connect_concurrency: usize,
    /// No progress line even on a terminal.
    #[arg(long)]
    pub quiet: bool,
    /// Stream replay mode: one MQTT 5 subscriber reads `$stream/<NAME>` from
    /// --stream-offset until --count messages arrived (or --drain seconds without any).
    #[arg(long, value_name = "NAME")]
    pub stream_replay: Option<String>,
    /// `stream-offset` of the replay: earliest, latest, a Unix time in µs, or @<position>.
    #[arg(long, default_value = "earliest")]
    pub stream_offset: String,
    /// Session Expiry Interval of the (reading) subscribers in seconds: > 0 makes their
    /// sessions persistent (MQTT 5; with 3.1.1 clean session 0).
    #[arg(long, default_value_t = 0)]
    pub session_expiry: u32,
    /// Stuck subscribers: clients that subscribe to --stuck-filter and then never read
    /// their socket again (like a SIGSTOPped `mosquitto_sub`), held open for the whole run.
    /// A broker must not let them slow the publishers or the other subscribers.
    #[arg(long, default_value_t = 0)]
    pub stuck_subscribers: usize,
    /// Topic filter of the stuck subscribers.
    #[arg(long, default_value = "#")]
    pub stuck_filter: String,
    /// QoS of the stuck subscribers' subscription.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub stuck_qos: u8,
    /// Session Expiry Interval of the stuck subscribers in seconds (MQTT 5; with 3.1.1 any
    /// value > 0 means clean session 0): > 0 makes their sessions persistent.
    #[arg(long, default_value_t = 0)]
    pub stuck_session_expiry: u32,
    /// A user property on the stuck subscribers' SUBSCRIBE, `KEY=VALUE` (MQTT 5), e.g.
    /// `stream-offset=earliest` for a stalled stream replay.
    #[arg(long, value_name = "KEY=VALUE")]
    pub stuck_user_property: Option<String>,
    #[command(flatten)]
    pub lanes: lanes::LanesOpts,
}

#[derive(clap::Parser)]
struct DefaultsOnly {
    #[command(flatten)]
    opts: BenchOpts,
}

impl Default for BenchOpts {
    fn default() -> Self {
        use clap::Parser;
        DefaultsOnly::parse_from(["lanemq-bench"]).opts
    }
}

impl BenchOpts {
    fn version(&self) -> Version {
        if self.mqtt_version == 5 {
            Version::V5
        } else {
            Version::V311
        }
    }

    fn addr(&self) -> String {
        self.addr_at(self.port)
    }

    fn addr_at(&self, port: u16) -> String {
        if self.host.contains(':') && !self.host.starts_with('[') {
            format!("[{}]:{}", self.host, port)
        } else {
            format!("{}:{}", self.host, port)
        }
    }

    /// Measured duration; `None` = count-bounded only.
    fn measured_duration(&self) -> Option<f64> {
        match (self.duration, self.count) {
            (Some(d), _) => Some(d),
            (None, Some(_)) => None,
            (None, None) => Some(10.0),
        }
    }

    fn hard_timeout(&self) -> Duration {
        let secs = self.timeout.unwrap_or_else(|| {
            self.warmup + self.measured_duration().unwrap_or(600.0) + self.drain + 60.0
        });
        Duration::from_secs_f64(secs.max(1.0))
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.mqtt_version == 4 {
            bail!("--mqtt-version must be 3 (for 3.1.1) or 5");
        }
        if let Some(d) = self.duration {
            if !(d.is_finite() && d > 0.0) {
                bail!("--duration must be > 0");
            }
        }
        if !(self.warmup.is_finite()
            && self.warmup >= 0.0
            && self.drain.is_finite()
            && self.drain >= 0.0)
        {
            bail!("--warmup and --drain must be >= 0");
        }
        if self.idle_connections == 0 && self.offline_sessions == 0 {
            if self.publishers == 0 {
                bail!("--publishers must be >= 1");
            }
            if self.qos > 0 && self.inflight == 0 {
                bail!("--inflight must be >= 1");
            }
        }
        if let Some(p) = &self.stuck_user_property {
            if !p.contains('=') {
                bail!("--stuck-user-property must be KEY=VALUE, got {p:?}");
            }
        }
        if self.connect_concurrency == 0 {
            bail!("--connect-concurrency must be >= 1");
        }
        if let Some(s) = &self.source_addrs {
            conn::parse_source_addrs(s)?;
        }
        if self.half_open && self.idle_connections == 0 {
            bail!("--half-open needs --idle-connections N");
        }
        Ok(())
    }
}

/// Latency percentiles in microseconds.
#[derive(Clone, Debug, Serialize)]
pub struct Latency {
    pub samples: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

impl Latency {
    /// The percentiles of a histogram of nanoseconds; None when it is empty.
    pub fn from_histogram(hist: &Histogram<u64>) -> Option<Latency> {
        if hist.is_empty() {
            return None;
        }
        Some(Latency {
            samples: hist.len(),
            mean_us: hist.mean() / 1e3,
            p50_us: quantile_us(hist, 0.50),
            p90_us: quantile_us(hist, 0.90),
            p99_us: quantile_us(hist, 0.99),
            p999_us: quantile_us(hist, 0.999),
            max_us: hist.max() as f64 / 1e3,
        })
    }
}

/// A quantile of a histogram of nanoseconds, in microseconds.
fn quantile_us(hist: &Histogram<u64>, q: f64) -> f64 {
    hist.value_at_quantile(q) as f64 / 1e3
}

#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub tool: String,
    /// "raw-tcp" (the built-in client).
    pub client: &'static str,
    /// "throughput" or "idle".
    pub mode: &'static str,
    pub opts: BenchOpts,
    pub started_unix_ms: u64,
    pub elapsed_s: f64,
    /// Messages published in the measured window (after warm-up).
    pub published: u64,
    /// Messages received in the measured window, over all subscribers.
    pub received: u64,
    /// published × subscribers per message.
    pub expected: u64,
    /// expected − received (QoS 0 losses are allowed by the protocol; negative = duplicates).
    pub loss: i64,
    /// QoS 1/2 flows completed (PUBACK / PUBCOMP), warm-up included.
    pub acked: u64,
    pub ack_errors: u64,
    /// Seconds from the end of warm-up to the last PUBLISH.
    pub publish_secs: f64,
    pub msgs_per_sec_in: f64,
    pub msgs_per_sec_out: f64,
    pub latency: Option<Latency>,
    pub broker_rss_max_kb: Option<u64>,
    /// With `--broker-pid`: the broker's CPU time (user + system) from the end of warm-up to
    /// the end of the publishing, divided by the messages published and received in that
    /// time, in µs. What one message in plus its deliveries out cost the broker.
    pub broker_cpu_us_per_msg: Option<f64>,
    pub idle: Option<IdleReport>,
    pub replay: Option<ReplayReport>,
    pub offline: Option<OfflineReport>,
    pub lanes: Option<LanesReport>,
    pub timed_out: bool,
    pub errors: Vec<String>,
}

impl BenchReport {
    fn empty(opts: &BenchOpts, mode: &'static str) -> Self {
        BenchReport {
            tool: format!("lanemq-bench {}", env!("CARGO_PKG_VERSION")),
            client: "raw-tcp",
            mode,
            opts: opts.clone(),
            started_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            elapsed_s: 0.0,
            published: 0,
            received: 0,
            expected: 0,
            loss: 0,
            acked: 0,
            ack_errors: 0,
            publish_secs: 0.0,
            msgs_per_sec_in: 0.0,
            msgs_per_sec_out: 0.0,
            latency: None,
            broker_rss_max_kb: None,
            broker_cpu_us_per_msg: None,
            idle: None,
            replay: None,
            offline: None,
            lanes: None,
            timed_out: false,
            errors: Vec::new(),
        }
    }

    /// Write the JSON report to `path` ("-" = stdout).
    pub fn write_json(&self, path: &std::path::Path) -> anyhow::Result<()> {
        let s = serde_json::to_string_pretty(self)?;
        if path.as_os_str() == "-" {
            println!("{s}");
        } else {
            std::fs::write(path, s + "\n").with_context(|| format!("write {}", path.display()))?;
        }
        Ok(())
    }
}

fn human(n: f64) -> String {
    if n >= 1e6 {
        format!("{:.2}M", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1}k", n / 1e3)
    } else {
        format!("{n:.0}")
    }
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.opts;
        if let Some(l) = &self.lanes {
            write!(f, "{l}")?;
        } else if let Some(r) = &self.replay {
            let kb = |v: Option<u64>| v.map_or("n/a".to_string(), |v| format!("{v} KiB"));
            writeln!(
                f,
                "stream replay of $stream/{} from {}: {} messages{} in {:.2}s = {} msg/s",
                r.stream,
                r.offset,
                r.received,
                r.expected
                    .map_or(String::new(), |e| format!(" of {e} expected")),
                r.secs,
                human(r.msgs_per_sec)
            )?;
            writeln!(
                f,
                "first message after {}; broker RSS before {}, max {}, growth {}",
                r.first_message_secs
                    .map_or("n/a".to_string(), |s| format!("{:.3}s", s)),
                kb(r.rss_before_kb),
                kb(self.broker_rss_max_kb),
                kb(r.rss_growth_kb)
            )?;
        } else if let Some(r) = &self.offline {
            let kb = |v: Option<u64>| v.map_or("n/a".to_string(), |v| format!("{v} KiB"));
            writeln!(
                f,
                "offline sessions: {} sessions set up in {:.2}s; {} QoS 1 publishes ({} queued) in {:.2}s",
                r.sessions, r.setup_secs, r.messages, r.queued_expected, r.publish_secs
            )?;
            writeln!(
                f,
                "broker RSS before {}, after {}; per queued message {}",
                kb(r.rss_before_kb),
                kb(r.rss_after_kb),
                r.rss_per_queued_bytes
                    .map_or("n/a".to_string(), |b| format!("{b:.1} bytes"))
            )?;
            writeln!(
                f,
                "drained {} of {} in {:.2}s after reconnect",
                r.drained, r.queued_expected, r.drain_secs
            )?;
        } else if let Some(idle) = &self.idle {
            writeln!(
                f,
                "idle connections: {} requested, {} connected, {} failed in {:.2}s",
                idle.requested, idle.connected, idle.failed, idle.connect_secs
            )?;
            let kb = |v: Option<u64>| v.map_or("n/a".to_string(), |v| format!("{v} KiB"));
            writeln!(
                f,
                "broker RSS: before {}, after connect {}, end {}, max {}",
                kb(idle.rss_before_kb),
                kb(idle.rss_after_kb),
                kb(idle.rss_end_kb),
                kb(self.broker_rss_max_kb)
            )?;
            if let Some(b) = idle.rss_per_connection_bytes {
                writeln!(f, "broker RSS per connection: {b:.0} bytes")?;
            }
            if let Some(b) = idle.rss_per_connection_end_bytes {
                writeln!(
                    f,
                    "broker RSS per connection at the end of the hold: {b:.0} bytes"
                )?;
            }
            if let Some(h) = &idle.half_open {
                writeln!(
                    f,
                    "half-open: {} of {} closed by the broker, {} ms to {} ms after opening; \
                     broker RSS once closed {}",
                    idle.dropped,
                    idle.connected,
                    h.closed_after_ms_min
                        .map_or("n/a".to_string(), |v| v.to_string()),
                    h.closed_after_ms_max
                        .map_or("n/a".to_string(), |v| v.to_string()),
                    kb(h.rss_closed_kb)
                )?;
            } else if idle.dropped > 0 {
                writeln!(f, "dropped by the broker during the hold: {}", idle.dropped)?;
            }
        } else {
            writeln!(
                f,
                "{:?} qos{} payload {}B pubs {} subs {} mqtt v{} rate {}",
                o.topic_mode,
                o.qos,
                o.payload,
                o.publishers,
                o.subscribers,
                o.mqtt_version,
                if o.rate == 0 {
                    "max".to_string()
                } else {
                    o.rate.to_string()
                }
            )?;
            writeln!(
                f,
                "published {} in {:.2}s = {} msg/s in",
                self.published,
                self.publish_secs,
                human(self.msgs_per_sec_in)
            )?;
            writeln!(
                f,
                "received  {} = {} msg/s out (expected {}, loss {})",
                self.received,
                human(self.msgs_per_sec_out),
                self.expected,
                self.loss
            )?;
            if let Some(l) = &self.latency {
                writeln!(f, "latency us: p50 {:.0} p90 {:.0} p99 {:.0} p99.9 {:.0} max {:.0} (mean {:.0}, n={})",
                    l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.max_us, l.mean_us, l.samples)?;
            }
            if let Some(kb) = self.broker_rss_max_kb {
                writeln!(f, "broker max RSS: {kb} KiB")?;
            }
            if let Some(us) = self.broker_cpu_us_per_msg {
                writeln!(f, "broker CPU: {us:.2} µs per message in + out")?;
            }
        }
        if self.timed_out {
            writeln!(f, "TIMED OUT (hard timeout)")?;
        }
        for e in &self.errors {
            writeln!(f, "error: {e}")?;
        }
        Ok(())
    }
}

/// Run one benchmark. Every loop is bounded by the duration/count and by
/// the hard timeout; the function returns even when the broker stalls.
pub async fn run(opts: BenchOpts) -> anyhow::Result<BenchReport> {
    opts.validate()?;
    let report = if let Some(phase) = opts.lanes.phase {
        lanes::run(&opts, phase).await?
    } else if let Some(s) = &opts.stream_replay {
        replay::run(&opts, s).await?
    } else if opts.idle_connections > 0 {
        idle::run(&opts).await?
    } else if opts.offline_sessions > 0 {
        offline::run(&opts).await?
    } else {
        run_load(&opts).await?
    };
    if let Some(p) = &opts.json {
        report.write_json(p)?;
    }
    Ok(report)
}

/// Unique per process and call, so repeated runs never collide on ids.
fn client_id(role: &str, i: usize) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    format!("lmqb-{}-{seq}-{role}{i}", std::process::id())
}

/// Open `--stuck-subscribers` clients that subscribe to `--stuck-filter` and are never read
/// from again; the caller holds them open for the whole run.
pub async fn connect_stuck(opts: &BenchOpts) -> anyhow::Result<Vec<Conn>> {
    let mut stuck = Vec::with_capacity(opts.stuck_subscribers);
    for i in 0..opts.stuck_subscribers {
        let id = client_id("stuck", i);
        let mut c = Conn::open_with_expiry(
            &opts.addr(),
            opts.version(),
            &id,
            opts.keepalive,
            4096,
            opts.stuck_session_expiry,
        )
        .await?;
        match opts
            .stuck_user_property
            .as_deref()
            .and_then(|p| p.split_once('='))
        {
            Some((k, v)) => {
                c.subscribe_with_property(&opts.stuck_filter, opts.stuck_qos, k, v)
                    .await?
            }
            None => c.subscribe(&opts.stuck_filter, opts.stuck_qos).await?,
        }
        stuck.push(c);
    }
    Ok(stuck)
}

/// Connect `n` clients with at most `--connect-concurrency` handshakes at once.
async fn connect_many(
    opts: &BenchOpts,
    role: &'static str,
    n: usize,
    read_chunk: usize,
    version: Version,
) -> anyhow::Result<Vec<Conn>> {
    let addr = match (role, opts.sub_port) {
        ("s", Some(p)) => opts.addr_at(p),
        _ => opts.addr(),
    };
    let sem = Arc::new(tokio::sync::Semaphore::new(opts.connect_concurrency));
    let mut set = JoinSet::new();
    for i in 0..n {
        let (addr, sem, id) = (addr.clone(), sem.clone(), client_id(role, i));
        let ka = opts.keepalive;
        let expiry = if role == "s" { opts.session_expiry } else { 0 };
        set.spawn(async move {
            let _permit = sem.acquire_owned().await.context("semaphore closed")?;
            Conn::open_with_expiry(&addr, version, &id, ka, read_chunk, expiry)
                .await
                .map(|c| (i, c))
        });
    }
    let mut out: Vec<Option<Conn>> = (0..n).map(|_| None).collect();
    while let Some(res) = set.join_next().await {
        let (i, c) = res.context("connect task panicked")??;
        out[i] = Some(c);
    }
    out.into_iter()
        .map(|c| c.context("missing connection"))
        .collect()
}

async fn run_load(opts: &BenchOpts) -> anyhow::Result<BenchReport> {
    let mut report = BenchReport::empty(opts, "throughput");
    let t0 = Instant::now();
    let hard_deadline = t0 + opts.hard_timeout();
    let version = opts.version();
    let prefix = opts.topic_prefix.trim_end_matches('/');
    let nonce = format!(
        "{}-{}",
        std::process::id(),
        report.started_unix_ms % 1_000_000
    );
    let topic_for_pub = |i: usize| match opts.topic_mode {
        TopicMode::FanIn | TopicMode::FanOut => format!("{prefix}/{nonce}/t"),
        TopicMode::Pairs => format!("{prefix}/{nonce}/p{i}"),
    };
    let subs_per_msg = |i: usize| match opts.topic_mode {
        TopicMode::FanIn | TopicMode::FanOut => opts.subscribers as u64,
        TopicMode::Pairs => u64::from(i < opts.subscribers),
    };

    let (stop_rss_tx, stop_rss_rx) = watch::channel(false);
    let rss = opts
        .broker_pid
        .map(|pid| rss::spawn_sampler(pid, stop_rss_rx));

    // Stuck subscribers: subscribed, then never read from again (held until the end).
    let stuck = connect_stuck(opts).await?;

    // Subscribers first, all subscribed before anything is published.
    let mut subs = tokio::time::timeout_at(
        hard_deadline.into(),
        connect_many(opts, "s", opts.subscribers, 256 * 1024, version),
    )
    .await
    .context("timed out connecting subscribers")??;
    let mut set = JoinSet::new();
    for (i, mut c) in subs.drain(..).enumerate() {
        let filter = match opts.topic_mode {
            TopicMode::Pairs => topic_for_pub(i),
            _ => topic_for_pub(0),
        };
        let qos = opts.qos;
        set.spawn(async move { c.subscribe(&filter, qos).await.map(|()| (i, c)) });
    }
    let mut subs: Vec<Option<Conn>> = (0..opts.subscribers).map(|_| None).collect();
    while let Some(res) = set.join_next().await {
        let (i, c) = res.context("subscribe task panicked")??;
        subs[i] = Some(c);
    }
    let pubs = tokio::time::timeout_at(
        hard_deadline.into(),
        connect_many(opts, "p", opts.publishers, 16 * 1024, version),
    )
    .await
    .context("timed out connecting publishers")??;

    let base = Instant::now();
    let start = base + Duration::from_millis(20);
    let measure_start = start + Duration::from_secs_f64(opts.warmup);
    let end = opts
        .measured_duration()
        .map(|d| measure_start + Duration::from_secs_f64(d));
    let shared = Arc::new(Shared {
        base,
        measure_start_ns: (measure_start - base).as_nanos() as u64,
        sent: AtomicU64::new(0),
        expected: AtomicU64::new(0),
        received: AtomicU64::new(0),
    });
    let (stop_pub_tx, stop_pub_rx) = watch::channel(false);
    let (stop_sub_tx, stop_sub_rx) = watch::channel(false);
    // The broker's CPU time at the end of warm-up, and the messages counted by then.
    let cpu_start = opts.broker_pid.map(|pid| {
        let shared = shared.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(measure_start.into()).await;
            let counted =
                shared.sent.load(Ordering::Relaxed) + shared.received.load(Ordering::Relaxed);
            rss::cpu_seconds(pid).map(|s| (s, counted, Instant::now()))
        })
    });

    let mut sub_tasks = JoinSet::new();
    for (i, c) in subs.into_iter().enumerate() {
        let c = c.context("missing subscriber")?;
        sub_tasks.spawn(load::subscriber(c, i, shared.clone(), stop_sub_rx.clone()));
    }
    let per_pub_rate = opts.rate as f64 / opts.publishers as f64;
    let mut pub_tasks = JoinSet::new();
    for (i, c) in pubs.into_iter().enumerate() {
        let cfg = PubCfg {
            id: i as u32,
            template: PublishTemplate::new(
                version,
                &topic_for_pub(i),
                opts.qos,
                opts.payload as usize,
            ),
            pace: Pace {
                qos: opts.qos,
                rate: per_pub_rate,
                count: opts.count,
                start: start + load::stagger(i, opts.rate),
                end,
                window: c.window(opts.inflight),
            },
            subs_per_msg: subs_per_msg(i),
        };
        pub_tasks.spawn(load::publisher(c, cfg, shared.clone(), stop_pub_rx.clone()));
    }

    let progress =
        (!opts.quiet && std::io::stderr().is_terminal()).then(|| spawn_progress(shared.clone()));

    // Publishers end by themselves (duration/count); the hard deadline aborts them.
    let mut pub_results = Vec::new();
    report.timed_out = join_publishers(
        &mut pub_tasks,
        hard_deadline,
        &stop_pub_tx,
        &mut pub_results,
    )
    .await?;
    if let (Some(h), Some(pid)) = (cpu_start, opts.broker_pid) {
        let counted = shared.sent.load(Ordering::Relaxed) + shared.received.load(Ordering::Relaxed);
        if let (Ok(Some((s0, n0, t0))), Some(s1)) = (h.await, rss::cpu_seconds(pid)) {
            let n = counted.saturating_sub(n0);
            // A window shorter than a second is too coarse for 10 ms ticks.
            if n > 0 && t0.elapsed() >= Duration::from_secs(1) {
                report.broker_cpu_us_per_msg = Some((s1 - s0) * 1e6 / n as f64);
            }
        }
    }

    // Drain: wait until everything expected has arrived, or no progress
    // for --drain seconds, or the hard deadline.
    if !report.timed_out {
        let expected_all = shared.expected.load(Ordering::Relaxed);
        report.timed_out = drain(&shared.received, expected_all, opts.drain, hard_deadline).await;
    }
    let _ = stop_sub_tx.send(true);
    let mut sub_results = Vec::new();
    collect_bounded(&mut sub_tasks, &mut sub_results).await;
    if let Some(p) = progress {
        p.abort();
        eprintln!();
    }
    let _ = stop_rss_tx.send(true);
    // The stuck subscribers were held open up to here.
    drop(stuck);
    if let Some(h) = rss {
        report.broker_rss_max_kb = h.await.ok().flatten();
    }

    // Aggregate.
    let mut hist = load::new_histogram();
    let mut last_send_ns = shared.measure_start_ns;
    for p in &pub_results {
        report.published += p.sent_measured;
        report.expected += p.sent_measured * p.subs_per_msg;
        report.acked += p.acked;
        report.ack_errors += p.ack_errors;
        last_send_ns = last_send_ns.max(p.last_send_ns);
        if let Some(e) = &p.error {
            report.errors.push(e.clone());
        }
    }
    let mut last_recv_ns = shared.measure_start_ns;
    for s in &sub_results {
        report.received += s.received_measured;
        last_recv_ns = last_recv_ns.max(s.last_recv_ns);
        hist.add(&s.hist).context("merge histograms")?;
        if let Some(e) = &s.error {
            report.errors.push(e.clone());
        }
    }
    if pub_results.len() < opts.publishers || sub_results.len() < opts.subscribers {
        report
            .errors
            .push("some tasks did not finish and were aborted".into());
    }
    report.loss = report.expected as i64 - report.received as i64;
    report.publish_secs = (last_send_ns - shared.measure_start_ns) as f64 / 1e9;
    let recv_secs = (last_recv_ns - shared.measure_start_ns) as f64 / 1e9;
    if report.publish_secs > 0.0 {
        report.msgs_per_sec_in = report.published as f64 / report.publish_secs;
    }
    if recv_secs > 0.0 {
        report.msgs_per_sec_out = report.received as f64 / recv_secs;
    }
    report.latency = Latency::from_histogram(&hist);
    report.elapsed_s = t0.elapsed().as_secs_f64();
    Ok(report)
}

/// Wait for all publishers, or stop them at `deadline` (returns true when it hit).
async fn join_publishers<T: 'static>(
    set: &mut JoinSet<T>,
    deadline: Instant,
    stop: &watch::Sender<bool>,
    out: &mut Vec<T>,
) -> anyhow::Result<bool> {
    loop {
        tokio::select! {
            r = set.join_next() => match r {
                Some(r) => out.push(r.context("publisher task panicked")?),
                None => return Ok(false),
            },
            _ = tokio::time::sleep_until(deadline.into()) => {
                let _ = stop.send(true);
                collect_bounded(set, out).await;
                return Ok(true);
            }
        }
    }
}

/// After the publishers: wait until `received` reaches `target`, or it made no
/// progress for `idle_secs`; true when `deadline` came first.
async fn drain(received: &AtomicU64, target: u64, idle_secs: f64, deadline: Instant) -> bool {
    let idle = Duration::from_secs_f64(idle_secs);
    let mut last = received.load(Ordering::Relaxed);
    let mut last_progress = Instant::now();
    loop {
        let got = received.load(Ordering::Relaxed);
        if got >= target {
            return false;
        }
        if got != last {
            last = got;
            last_progress = Instant::now();
        } else if last_progress.elapsed() >= idle {
            return false;
        }
        if Instant::now() >= deadline {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Join the remaining tasks, aborting any still running after 5 s.
async fn collect_bounded<T: 'static>(set: &mut JoinSet<T>, out: &mut Vec<T>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match tokio::time::timeout_at(deadline, set.join_next()).await {
            Ok(Some(Ok(v))) => out.push(v),
            Ok(Some(Err(_))) => {}
            Ok(None) => return,
            Err(_) => {
                set.abort_all();
                while set.join_next().await.is_some() {}
                return;
            }
        }
    }
}

fn spawn_progress(shared: Arc<Shared>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        let (mut ls, mut lr) = (0u64, 0u64);
        // Bounded by the caller, which aborts this task when the run ends.
        loop {
            tick.tick().await;
            let s = shared.sent.load(Ordering::Relaxed);
            let r = shared.received.load(Ordering::Relaxed);
            eprint!(
                "\r[{:6.1}s] sent {:>10} ({:>8} msg/s)  recv {:>10} ({:>8} msg/s)   ",
                shared.base.elapsed().as_secs_f64(),
                s,
                human((s - ls) as f64),
                r,
                human((r - lr) as f64)
            );
            (ls, lr) = (s, r);
        }
    })
}
