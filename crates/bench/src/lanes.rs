//! Lanes mode (issue 6, lite topics): load for a lite parent such as `agents/{lane}/#`.
//!
//! Lane `i` is the topic `<parent>/l-<i>/x`. Lanes are partitioned over the publisher
//! connections (lane `i` belongs to publisher `i % publishers`), so every lane has one
//! publisher and a defined publish order.
//!
//! * `--lanes create`: publish one QoS 1 message to each of `--lanes-count` lanes with
//!   `--publishers` connections and an inflight window of `--inflight`; report the lane
//!   creation rate and the broker's RSS before, right after the last PUBACK and once the
//!   broker is quiet again (at most `--lanes-settle` seconds later) → bytes per lane.
//! * `--lanes active`: `--lanes-members` connections subscribe to
//!   `$share/<group>/<parent>/+/#` (QoS 1, user property `lane-offset` = `--lanes-offset`),
//!   then `--lanes-active` lanes get `--rate` msg/s in total for `--duration` seconds
//!   (each message to the next lane in rotation, or to a random one with
//!   `--lanes-pick random`). Consumers PUBACK every delivery. Reported: publish-to-delivery
//!   latency (p50/p95/p99/p99.9/max, after `--warmup`), delivered / lost / duplicated
//!   messages, per-lane order (the payload's per-lane sequence and the `lane-offset` user
//!   property, which must grow by one), and how the lanes spread over the members.
//!
//! Payload (≥ 24 bytes): the generator's stamp ([`mqtt::STAMP_LEN`]: send time in ns since
//! the run's base instant (u64 BE) and a tag made of the lane index (u32 BE) and the per-lane
//! sequence (u32 BE)), the run nonce (u64 BE), filler. A delivery with another nonce was
//! published by an earlier run (e.g. the create phase) and is counted as `stale`.
//!
//! The connections, the PUBLISH encoding and parsing and the publisher and member loops are
//! the generator's ([`crate::conn`], [`crate::mqtt`], [`crate::load`]); this module adds the
//! lanes' [`Feed`] (lane topics, picking) and [`Sink`] (per-lane checks).

use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::BytesMut;
use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::conn::Conn;
use crate::load::{self, nanos_since, new_histogram, Feed, Pace, Sent, Sink};
use crate::mqtt::{self, Publish, PublishTemplate, Version, STAMP_LEN};
use crate::{
    collect_bounded, connect_many, drain, join_publishers, quantile_us, rss, BenchOpts,
    BenchReport, Latency,
};

/// Payload bytes used by the header (stamp: timestamp, lane, sequence; nonce).
const HEADER: usize = STAMP_LEN + 8;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LanesPhase {
    /// One QoS 1 message to each of --lanes-count lanes.
    Create,
    /// --lanes-active lanes at --rate msg/s through a --lanes-members member group.
    Active,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LanePick {
    /// Each publisher cycles through its lanes.
    Rotate,
    /// Each message goes to a random lane of its publisher.
    Random,
}

/// Options of the lanes mode (all prefixed `--lanes`).
#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct LanesOpts {
    /// Lanes mode (lite topics): `create` or `active`. Uses --publishers, --inflight, --rate,
    /// --duration, --warmup, --drain, --payload, --broker-pid; always MQTT 5 and QoS 1.
    #[arg(id = "lanes", long = "lanes", value_enum, value_name = "PHASE")]
    pub phase: Option<LanesPhase>,
    /// First topic level(s) of the lite parent `<parent>/{lane}/#`; lane i is `<parent>/l-<i>/x`.
    #[arg(id = "lanes_parent", long = "lanes-parent", default_value = "agents")]
    pub parent: String,
    /// create: number of lanes (one message each).
    #[arg(id = "lanes_count", long = "lanes-count", default_value_t = 1_000_000)]
    pub count: u32,
    /// active: number of lanes receiving messages (lanes 0 .. N-1).
    #[arg(id = "lanes_active", long = "lanes-active", default_value_t = 1_000)]
    pub active: u32,
    /// active: how a publisher picks the lane of its next message.
    #[arg(id = "lanes_pick", long = "lanes-pick", value_enum, default_value_t = LanePick::Rotate)]
    pub pick: LanePick,
    /// active: besides --rate, publish this many msg/s to lanes that do not exist yet (each
    /// gets one message: lanes created under load), spread over the publishers.
    #[arg(id = "lanes_new_rate", long = "lanes-new-rate", default_value_t = 0)]
    pub new_rate: u64,
    /// active: shared-subscription group name.
    #[arg(id = "lanes_group", long = "lanes-group", default_value = "bench")]
    pub group: String,
    /// active: members (connections) of the group.
    #[arg(id = "lanes_members", long = "lanes-members", default_value_t = 4)]
    pub members: usize,
    /// active: `lane-offset` user property of the SUBSCRIBE (earliest, latest, <n>, or none).
    #[arg(id = "lanes_offset", long = "lanes-offset", default_value = "latest")]
    pub offset: String,
    /// create (with --broker-pid): after the last PUBACK, wait until the broker is quiet (under
    /// 10% of a core for 2 s, and RSS steady), at most this many seconds, before the settled
    /// RSS sample.
    #[arg(id = "lanes_settle", long = "lanes-settle", default_value_t = 300.0)]
    pub settle: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct LanesReport {
    pub phase: String,
    pub parent: String,
    /// create: lanes published to; active: active lanes.
    pub lanes: u64,
    pub publishers: usize,
    /// PUBLISH packets sent (warm-up included).
    pub published: u64,
    /// PUBACK with a reason < 0x80.
    pub acked: u64,
    /// PUBACK with a reason >= 0x80 (e.g. 0x97 quota exceeded).
    pub ack_errors: u64,
    pub first_ack_error: Option<String>,
    /// create: first PUBLISH to last PUBACK; active: publish window.
    pub publish_secs: f64,
    pub msgs_per_sec: f64,
    // ---- create
    pub lanes_per_sec: Option<f64>,
    /// Broker RSS when the run started (create and active).
    pub rss_before_kb: Option<u64>,
    pub rss_after_kb: Option<u64>,
    pub rss_settled_kb: Option<u64>,
    /// Seconds from the last PUBACK until the broker was quiet (or --lanes-settle ran out).
    pub settle_secs: Option<f64>,
    /// Broker CPU seconds spent during that time.
    pub settle_cpu_secs: Option<f64>,
    /// false when --lanes-settle ran out before the broker was quiet.
    pub settled: Option<bool>,
    /// (settled − before) / acked lanes.
    pub rss_per_lane_bytes: Option<f64>,
    // ---- active
    pub members: usize,
    pub group: String,
    pub lane_offset: String,
    pub rate: u64,
    /// Messages per second to lanes created during the run (--lanes-new-rate).
    pub new_rate: u64,
    /// Granted QoS per member (SUBACK reason).
    pub granted: Vec<u8>,
    /// Deliveries of this run's messages (duplicates included).
    pub delivered: u64,
    /// Deliveries of messages published after the warm-up (the latency samples).
    pub delivered_measured: u64,
    /// Distinct messages of this run delivered.
    pub delivered_unique: u64,
    /// published − delivered_unique.
    pub lost: i64,
    /// delivered − delivered_unique.
    pub duplicates: u64,
    /// Deliveries whose per-lane sequence was not above the highest one seen for the lane
    /// (a duplicate or out of order).
    pub seq_backwards: u64,
    /// Deliveries that skipped sequence numbers of their lane (loss or out of order).
    pub seq_gaps: u64,
    /// `lane-offset` not exactly one above the previous delivery of the lane.
    pub offset_breaks: u64,
    /// `lane-offset` lower than or equal to the previous one of the lane.
    pub offset_backwards: u64,
    /// Deliveries without a `lane` or `lane-offset` user property.
    pub missing_props: u64,
    /// `lane` user property not equal to the topic's lane key.
    pub lane_mismatch: u64,
    /// Deliveries of messages from another run (e.g. the create phase).
    pub stale: u64,
    /// Deliveries with DUP=1.
    pub dup_flag: u64,
    pub per_member: Vec<u64>,
    /// Distinct lanes each member received.
    pub lanes_per_member: Vec<u64>,
    pub first_delivery_secs: Option<f64>,
    pub latency: Option<LaneLatency>,
}

/// Publish-to-delivery latency in microseconds.
#[derive(Clone, Debug, Serialize)]
pub struct LaneLatency {
    pub samples: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

impl fmt::Display for LanesReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kb = |v: Option<u64>| v.map_or("n/a".to_string(), |v| format!("{v} KiB"));
        writeln!(
            f,
            "lanes {} on {}/l-<i>/x: {} lanes, {} publishers: published {}, acked {}, ack errors {}{} in {:.2}s = {:.0} msg/s",
            self.phase,
            self.parent,
            self.lanes,
            self.publishers,
            self.published,
            self.acked,
            self.ack_errors,
            self.first_ack_error
                .as_ref()
                .map_or(String::new(), |e| format!(" (first: {e})")),
            self.publish_secs,
            self.msgs_per_sec
        )?;
        if self.phase == "create" {
            writeln!(
                f,
                "lane creation: {:.0} lanes/s; broker RSS before {}, after {}, settled {} ({}); per lane {}",
                self.lanes_per_sec.unwrap_or(0.0),
                kb(self.rss_before_kb),
                kb(self.rss_after_kb),
                kb(self.rss_settled_kb),
                match (self.settle_secs, self.settle_cpu_secs, self.settled) {
                    (Some(s), c, Some(q)) => format!(
                        "{}quiet after {s:.1}s, broker CPU {:.1}s meanwhile",
                        if q { "" } else { "NOT " },
                        c.unwrap_or(0.0)
                    ),
                    _ => "no --broker-pid".to_string(),
                },
                self.rss_per_lane_bytes
                    .map_or("n/a".to_string(), |b| format!("{b:.0} B"))
            )?;
            return Ok(());
        }
        writeln!(
            f,
            "group $share/{}/{}/+/# x{} (lane-offset {}, granted {:?}), rate {}",
            self.group, self.parent, self.members, self.lane_offset, self.granted, self.rate
        )?;
        writeln!(
            f,
            "delivered {} (unique {}, measured {}), lost {}, duplicates {}, per-lane sequence backwards {} gaps {}, stale {}, DUP=1 {}",
            self.delivered,
            self.delivered_unique,
            self.delivered_measured,
            self.lost,
            self.duplicates,
            self.seq_backwards,
            self.seq_gaps,
            self.stale,
            self.dup_flag
        )?;
        writeln!(
            f,
            "lane-offset: breaks {}, backwards {}, missing props {}, lane mismatch {}",
            self.offset_breaks, self.offset_backwards, self.missing_props, self.lane_mismatch
        )?;
        writeln!(
            f,
            "per member: messages {:?}, lanes {:?}; first delivery after {}",
            self.per_member,
            self.lanes_per_member,
            self.first_delivery_secs
                .map_or("n/a".to_string(), |s| format!("{s:.3}s"))
        )?;
        if let Some(l) = &self.latency {
            writeln!(
                f,
                "latency us: p50 {:.0} p90 {:.0} p95 {:.0} p99 {:.0} p99.9 {:.0} max {:.0} (mean {:.0}, n={})",
                l.p50_us, l.p90_us, l.p95_us, l.p99_us, l.p999_us, l.max_us, l.mean_us, l.samples
            )?;
        }
        Ok(())
    }
}

pub async fn run(opts: &BenchOpts, phase: LanesPhase) -> anyhow::Result<BenchReport> {
    let lo = &opts.lanes;
    if lo.parent.is_empty() || lo.parent.starts_with('$') || lo.parent.contains(['+', '#']) {
        bail!("--lanes-parent must be a plain topic prefix");
    }
    if opts.publishers == 0 || opts.inflight == 0 {
        bail!("--publishers and --inflight must be >= 1");
    }
    match phase {
        LanesPhase::Create => run_create(opts).await,
        LanesPhase::Active => run_active(opts).await,
    }
}

fn nonce() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (u64::from(std::process::id()) << 40) | 1
}

/// Which lanes publisher `p` of `n_pubs` owns among `0..lanes`: `p, p + n_pubs, ...`.
fn owned(p: usize, n_pubs: usize, lanes: u32) -> Vec<u32> {
    (p as u64..u64::from(lanes))
        .step_by(n_pubs)
        .map(|l| l as u32)
        .collect()
}

/// xorshift64*: enough for spreading messages over lanes.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Messages of one publisher: (lane, per-lane sequence).
struct Picker {
    lanes: Vec<u32>,
    seqs: Vec<u32>,
    pick: LanePick,
    /// create: each lane once.
    once: bool,
    k: usize,
    rng: Rng,
    /// active with --lanes-new-rate: lanes not used yet, taken in order with probability
    /// `fresh_p` per message.
    fresh: Vec<u32>,
    fresh_k: usize,
    fresh_p: f64,
}

impl Picker {
    fn next(&mut self) -> Option<(u32, u32)> {
        if self.lanes.is_empty() {
            return None;
        }
        if self.fresh_p > 0.0 && self.fresh_k < self.fresh.len() {
            let r = (self.rng.next() >> 11) as f64 / (1u64 << 53) as f64;
            if r < self.fresh_p {
                self.fresh_k += 1;
                return Some((self.fresh[self.fresh_k - 1], 0));
            }
        }
        let i = if self.once {
            if self.k >= self.lanes.len() {
                return None;
            }
            self.k
        } else {
            match self.pick {
                LanePick::Rotate => self.k % self.lanes.len(),
                LanePick::Random => (self.rng.next() % self.lanes.len() as u64) as usize,
            }
        };
        self.k += 1;
        let seq = self.seqs[i];
        self.seqs[i] = seq.wrapping_add(1);
        Some((self.lanes[i], seq))
    }
}

fn lane_topic(out: &mut String, parent: &str, lane: u32) {
    out.clear();
    let _ = write!(out, "{parent}/l-{lane}/x");
}

/// What a publisher sends: one message to a lane at a time, picked by its [`Picker`].
struct LaneFeed {
    parent: String,
    picker: Picker,
    /// Version, QoS, payload length and filler of every message (its topic is not used).
    template: PublishTemplate,
    base: Instant,
    nonce: u64,
    /// Publishers count their messages here (progress, drain target).
    sent: Arc<AtomicU64>,
    /// The current message's topic (reused).
    topic: String,
    r: PubResult,
}

impl Feed for LaneFeed {
    fn frame_len(&self) -> usize {
        self.template.frame_len() + 16
    }

    fn write_next(&mut self, buf: &mut BytesMut, pid: u16, ts: u64) -> bool {
        let Some((lane, seq)) = self.picker.next() else {
            return false;
        };
        lane_topic(&mut self.topic, &self.parent, lane);
        let tag = u64::from(lane) << 32 | u64::from(seq);
        let nonce = self.nonce.to_be_bytes();
        self.template
            .write_to(buf, &self.topic, pid, ts, tag, &nonce);
        true
    }

    fn sent(&mut self, n: u64, ts: u64) {
        self.r.first_send_ns.get_or_insert(ts);
        self.sent.fetch_add(n, Ordering::Relaxed);
    }

    fn ack(&mut self, _kind: u8, reason: u8, done: bool) {
        if !done {
            return;
        }
        if reason >= 0x80 {
            self.r.ack_errors += 1;
            self.r.first_ack_error.get_or_insert(reason);
        } else {
            self.r.acked += 1;
        }
        self.r.last_ack_ns = nanos_since(self.base);
    }
}

#[derive(Debug, Default)]
struct PubResult {
    sent: u64,
    acked: u64,
    ack_errors: u64,
    first_ack_error: Option<u8>,
    /// Nanos since base of the first PUBLISH and of the last PUBLISH / PUBACK.
    first_send_ns: Option<u64>,
    last_send_ns: u64,
    last_ack_ns: u64,
    error: Option<String>,
}

async fn publisher(
    mut c: Conn,
    id: usize,
    pace: Pace,
    mut feed: LaneFeed,
    mut stop: watch::Receiver<bool>,
) -> PubResult {
    let mut sent = Sent::default();
    let res = load::publish_loop(&mut c, &pace, feed.base, &mut stop, &mut feed, &mut sent).await;
    let mut r = feed.r;
    r.sent = sent.sent;
    r.last_send_ns = sent.last_send_ns;
    if let Err(e) = res {
        r.error = Some(format!("publisher {id}: {e:#}"));
    }
    c.close().await;
    r
}

/// Connect the publishers and spawn their tasks.
#[allow(clippy::too_many_arguments)]
async fn spawn_publishers(
    opts: &BenchOpts,
    lanes: u32,
    fresh: u32,
    once: bool,
    rate: u64,
    start: Instant,
    end: Option<Instant>,
    base: Instant,
    nonce: u64,
    sent: &Arc<AtomicU64>,
    stop: &watch::Receiver<bool>,
) -> anyhow::Result<JoinSet<PubResult>> {
    let n_pubs = opts.publishers;
    let payload = (opts.payload as usize).max(HEADER);
    let template = PublishTemplate::new(Version::V5, &opts.lanes.parent, 1, payload);
    let conns = connect_many(opts, "lp", n_pubs, 64 * 1024, Version::V5).await?;
    let per_pub_rate = rate as f64 / n_pubs as f64;
    let mut set = JoinSet::new();
    for (i, c) in conns.into_iter().enumerate() {
        let fresh_lanes: Vec<u32> = owned(i, n_pubs, fresh)
            .into_iter()
            .map(|l| l + lanes)
            .collect();
        let lanes = owned(i, n_pubs, lanes);
        let pace = Pace {
            qos: 1,
            rate: per_pub_rate,
            count: None,
            start: start + load::stagger(i, rate),
            end,
            window: c.window(opts.inflight),
        };
        let feed = LaneFeed {
            parent: opts.lanes.parent.clone(),
            picker: Picker {
                seqs: vec![0; lanes.len()],
                lanes,
                pick: opts.lanes.pick,
                once,
                k: 0,
                rng: Rng(nonce ^ (0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(i as u64 + 1)) | 1),
                fresh: fresh_lanes,
                fresh_k: 0,
                fresh_p: if rate > 0 && fresh > 0 {
                    opts.lanes.new_rate as f64 / rate as f64
                } else {
                    0.0
                },
            },
            template: template.clone(),
            base,
            nonce,
            sent: sent.clone(),
            topic: String::new(),
            r: PubResult::default(),
        };
        set.spawn(publisher(c, i, pace, feed, stop.clone()));
    }
    Ok(set)
}

/// Add the publishers' counts to `rep` and their errors to `errors`: the first PUBLISH's
/// time (nanos since base, 0 when none was sent).
fn sum_publishers(res: &[PubResult], rep: &mut LanesReport, errors: &mut Vec<String>) -> u64 {
    for p in res {
        rep.published += p.sent;
        rep.acked += p.acked;
        rep.ack_errors += p.ack_errors;
        if rep.first_ack_error.is_none() {
            rep.first_ack_error = p.first_ack_error.map(|c| format!("{c:#04x}"));
        }
        if let Some(e) = &p.error {
            errors.push(e.clone());
        }
    }
    res.iter()
        .filter_map(|p| p.first_send_ns)
        .min()
        .unwrap_or(0)
}

fn spawn_progress(
    label: &'static str,
    sent: Arc<AtomicU64>,
    recv: Option<Arc<AtomicU64>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let t0 = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        let (mut ls, mut lr) = (0u64, 0u64);
        // Aborted by the caller when the run ends.
        loop {
            tick.tick().await;
            let s = sent.load(Ordering::Relaxed);
            let r = recv.as_ref().map_or(0, |r| r.load(Ordering::Relaxed));
            eprint!(
                "\r[{:6.1}s] {label}: sent {s:>10} ({:>8}/s)  delivered {r:>10} ({:>8}/s)   ",
                t0.elapsed().as_secs_f64(),
                s - ls,
                r - lr
            );
            (ls, lr) = (s, r);
        }
    })
}

async fn run_create(opts: &BenchOpts) -> anyhow::Result<BenchReport> {
    use std::io::IsTerminal;
    let lo = &opts.lanes;
    let mut report = BenchReport::empty(opts, "lanes-create");
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(opts.timeout.unwrap_or(3600.0).max(1.0));
    let mut rep = LanesReport {
        phase: "create".into(),
        parent: lo.parent.clone(),
        lanes: u64::from(lo.count),
        publishers: opts.publishers,
        rss_before_kb: opts.broker_pid.and_then(rss::vm_rss_kb),
        ..LanesReport::default()
    };
    let base = Instant::now();
    let sent = Arc::new(AtomicU64::new(0));
    let (stop_tx, stop_rx) = watch::channel(false);
    let (stop_rss_tx, stop_rss_rx) = watch::channel(false);
    let sampler = opts
        .broker_pid
        .map(|pid| rss::spawn_sampler(pid, stop_rss_rx));
    let mut set = tokio::time::timeout_at(
        deadline.into(),
        spawn_publishers(
            opts,
            lo.count,
            0,
            true,
            opts.rate,
            base,
            None,
            base,
            nonce(),
            &sent,
            &stop_rx,
        ),
    )
    .await
    .context("timed out connecting publishers")??;
    let progress = (!opts.quiet && std::io::stderr().is_terminal())
        .then(|| spawn_progress("create", sent.clone(), None));
    let mut res = Vec::new();
    report.timed_out = join_publishers(&mut set, deadline, &stop_tx, &mut res).await?;
    if let Some(p) = progress {
        p.abort();
        eprintln!();
    }
    rep.rss_after_kb = opts.broker_pid.and_then(rss::vm_rss_kb);
    let first = sum_publishers(&res, &mut rep, &mut report.errors);
    let last = res.iter().map(|p| p.last_ack_ns).max().unwrap_or(0);
    rep.publish_secs = last.saturating_sub(first) as f64 / 1e9;
    if rep.publish_secs > 0.0 {
        rep.msgs_per_sec = rep.acked as f64 / rep.publish_secs;
        rep.lanes_per_sec = Some(rep.msgs_per_sec);
    }
    if let Some(pid) = opts.broker_pid {
        let (secs, cpu, quiet) = settle(pid, Duration::from_secs_f64(lo.settle.max(0.0))).await;
        rep.rss_settled_kb = rss::vm_rss_kb(pid);
        rep.settle_secs = Some(secs);
        rep.settle_cpu_secs = cpu;
        rep.settled = Some(quiet);
    }
    let _ = stop_rss_tx.send(true);
    if let Some(h) = sampler {
        report.broker_rss_max_kb = h.await.ok().flatten();
    }
    if let (Some(b), Some(a)) = (rep.rss_before_kb, rep.rss_settled_kb.or(rep.rss_after_kb)) {
        if rep.acked > 0 {
            rep.rss_per_lane_bytes = Some((a as f64 - b as f64) * 1024.0 / rep.acked as f64);
        }
    }
    report.published = rep.published;
    report.acked = rep.acked;
    report.ack_errors = rep.ack_errors;
    report.publish_secs = rep.publish_secs;
    report.msgs_per_sec_in = rep.msgs_per_sec;
    report.elapsed_s = t0.elapsed().as_secs_f64();
    report.lanes = Some(rep);
    Ok(report)
}

/// utime + stime of `pid` in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// Wait until the broker is quiet: under 10% of a core over the last 2 s and RSS within
/// 1% over those 2 s, at most `max`. Returns (seconds waited, broker CPU seconds meanwhile,
/// quiet reached).
async fn settle(pid: u32, max: Duration) -> (f64, Option<f64>, bool) {
    const TICKS_PER_SEC: f64 = 100.0; // USER_HZ on Linux
    let t0 = Instant::now();
    let cpu0 = cpu_ticks(pid);
    let mut hist: std::collections::VecDeque<(Option<u64>, Option<u64>)> =
        std::collections::VecDeque::new();
    let mut quiet = false;
    loop {
        hist.push_back((cpu_ticks(pid), rss::vm_rss_kb(pid)));
        if hist.len() > 5 {
            hist.pop_front();
        }
        if hist.len() == 5 {
            let (c0, r0) = hist[0];
            let (c1, r1) = hist[4];
            let cpu_ok = matches!((c0, c1), (Some(a), Some(b)) if (b.saturating_sub(a) as f64) < 0.1 * 2.0 * TICKS_PER_SEC);
            let rss_ok = matches!((r0, r1), (Some(a), Some(b)) if (a as f64 - b as f64).abs() <= a as f64 * 0.01);
            if cpu_ok && rss_ok {
                quiet = true;
                break;
            }
        }
        if t0.elapsed() >= max {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let cpu = cpu0
        .zip(cpu_ticks(pid))
        .map(|(a, b)| b.saturating_sub(a) as f64 / TICKS_PER_SEC);
    (t0.elapsed().as_secs_f64(), cpu, quiet)
}

/// Per-lane state shared by the members: last sequence + 1 and last offset + 1 (0 = none).
struct LaneState {
    seq: Vec<AtomicU64>,
    offset: Vec<AtomicU64>,
    delivered: AtomicU64,
}

struct MemberCfg {
    id: usize,
    base: Instant,
    measure_start_ns: u64,
    nonce: u64,
    state: Arc<LaneState>,
}

struct MemberResult {
    r: LanesReport,
    /// (lane << 32 | seq) of every delivery of this run.
    got: std::collections::HashSet<u64>,
    lanes_seen: u64,
    first_ns: Option<u64>,
    hist: Histogram<u64>,
    error: Option<String>,
}

/// Fields of a PUBLISH that the lanes check needs.
#[derive(Debug, Default, PartialEq, Eq)]
struct LanePublish {
    dup: bool,
    /// Lane index from the topic `<parent>/l-<i>/...`.
    topic_lane: Option<u32>,
    /// `lane` user property parsed as `l-<i>` (Some(None) = present but not of that form).
    lane_prop: Option<Option<u32>>,
    lane_offset: Option<u64>,
    /// ts, lane, seq, nonce from the payload.
    header: Option<(u64, u32, u32, u64)>,
}

impl LanePublish {
    fn read(p: &Publish<'_>) -> Self {
        let mut lp = LanePublish {
            dup: p.dup,
            topic_lane: p.topic.split(|&b| b == b'/').find_map(parse_lane_key),
            header: match (p.ts(), p.tag(), mqtt::be_u64(p.payload, STAMP_LEN)) {
                (Some(ts), Some(tag), Some(nonce)) => {
                    Some((ts, (tag >> 32) as u32, tag as u32, nonce))
                }
                _ => None,
            },
            ..LanePublish::default()
        };
        for (key, val) in p.user_properties() {
            match key {
                b"lane" => lp.lane_prop = Some(parse_lane_key(val)),
                b"lane-offset" => {
                    lp.lane_offset = std::str::from_utf8(val).ok().and_then(|s| s.parse().ok())
                }
                _ => {}
            }
        }
        lp
    }
}

fn parse_lane_key(s: &[u8]) -> Option<u32> {
    std::str::from_utf8(s.strip_prefix(b"l-")?)
        .ok()?
        .parse()
        .ok()
}

async fn member(
    mut c: Conn,
    cfg: MemberCfg,
    lanes: usize,
    mut stop: watch::Receiver<bool>,
) -> MemberResult {
    let mut sink = MemberSink {
        cfg: &cfg,
        m: MemberResult {
            r: LanesReport::default(),
            got: std::collections::HashSet::new(),
            lanes_seen: 0,
            first_ns: None,
            hist: new_histogram(),
            error: None,
        },
        seen: vec![false; lanes],
    };
    // Frames may already be buffered from the set-up (an `earliest` group).
    if let Err(e) = load::receive_loop(&mut c, cfg.base, &mut stop, &mut sink).await {
        sink.m.error = Some(format!("member {}: {e:#}", cfg.id));
    }
    let mut m = sink.m;
    m.lanes_seen = sink.seen.iter().filter(|&&s| s).count() as u64;
    c.close().await;
    m
}

/// A member's [`Sink`]: the per-lane checks of every delivery.
struct MemberSink<'a> {
    cfg: &'a MemberCfg,
    m: MemberResult,
    /// Lanes delivered to this member.
    seen: Vec<bool>,
}

impl Sink for MemberSink<'_> {
    fn publish(&mut self, p: &Publish<'_>, now: u64) {
        self.on_delivery(&LanePublish::read(p), now);
    }
}

impl MemberSink<'_> {
    fn on_delivery(&mut self, p: &LanePublish, now: u64) {
        let (cfg, m) = (self.cfg, &mut self.m);
        let r = &mut m.r;
        if p.dup {
            r.dup_flag += 1;
        }
        let Some((ts, lane, seq, nonce)) = p.header else {
            r.stale += 1;
            return;
        };
        if nonce != cfg.nonce || lane as usize >= self.seen.len() {
            r.stale += 1;
            return;
        }
        r.delivered += 1;
        m.first_ns.get_or_insert(now);
        cfg.state.delivered.fetch_add(1, Ordering::Relaxed);
        self.seen[lane as usize] = true;
        if ts >= cfg.measure_start_ns {
            r.delivered_measured += 1;
            m.hist.saturating_record(now.saturating_sub(ts).max(1));
        }
        let l = lane as usize;
        m.got.insert(u64::from(lane) << 32 | u64::from(seq));
        let prev = cfg.state.seq[l].fetch_max(u64::from(seq) + 1, Ordering::Relaxed);
        if u64::from(seq) < prev {
            r.seq_backwards += 1;
        } else if u64::from(seq) > prev {
            r.seq_gaps += 1;
        }
        match (p.lane_prop, p.lane_offset) {
            (Some(lp), Some(off)) => {
                if lp != Some(lane) || p.topic_lane != Some(lane) {
                    r.lane_mismatch += 1;
                }
                let prev = cfg.state.offset[l].fetch_max(off + 1, Ordering::Relaxed);
                if prev != 0 {
                    if off < prev {
                        r.offset_backwards += 1;
                        r.offset_breaks += 1;
                    } else if off != prev {
                        r.offset_breaks += 1;
                    }
                }
            }
            _ => r.missing_props += 1,
        }
    }
}

async fn run_active(opts: &BenchOpts) -> anyhow::Result<BenchReport> {
    use std::io::IsTerminal;
    let lo = &opts.lanes;
    if lo.members == 0 || lo.active == 0 {
        bail!("--lanes-members and --lanes-active must be >= 1");
    }
    let mut report = BenchReport::empty(opts, "lanes-active");
    let t0 = Instant::now();
    let duration = opts.duration.unwrap_or(10.0);
    let deadline = t0
        + Duration::from_secs_f64(
            opts.timeout
                .unwrap_or(opts.warmup + duration + opts.drain + 60.0)
                .max(1.0),
        );
    let nonce = nonce();
    let mut rep = LanesReport {
        phase: "active".into(),
        parent: lo.parent.clone(),
        lanes: u64::from(lo.active),
        publishers: opts.publishers,
        members: lo.members,
        group: lo.group.clone(),
        lane_offset: lo.offset.clone(),
        rate: opts.rate,
        new_rate: lo.new_rate,
        rss_before_kb: opts.broker_pid.and_then(rss::vm_rss_kb),
        ..LanesReport::default()
    };
    let (stop_rss_tx, stop_rss_rx) = watch::channel(false);
    let sampler = opts
        .broker_pid
        .map(|pid| rss::spawn_sampler(pid, stop_rss_rx));

    // The group first: every member subscribed before anything is published.
    let filter = format!("$share/{}/{}/+/#", lo.group, lo.parent);
    let prop = (lo.offset != "none").then_some(("lane-offset", lo.offset.as_str()));
    let mut members = tokio::time::timeout_at(
        deadline.into(),
        connect_many(opts, "lm", lo.members, 256 * 1024, Version::V5),
    )
    .await
    .context("timed out connecting group members")??;
    for c in &mut members {
        rep.granted.push(c.subscribe_v5(&filter, 1, prop).await?);
    }
    // Lanes created during the run: up to --lanes-new-rate per second of the whole run.
    let fresh = (lo.new_rate as f64 * (opts.warmup + duration + 1.0)).ceil() as u32;
    let lanes = lo.active as usize + fresh as usize;
    let state = Arc::new(LaneState {
        seq: (0..lanes).map(|_| AtomicU64::new(0)).collect(),
        offset: (0..lanes).map(|_| AtomicU64::new(0)).collect(),
        delivered: AtomicU64::new(0),
    });
    let base = Instant::now();
    let start = base + Duration::from_millis(20);
    let measure_start = start + Duration::from_secs_f64(opts.warmup);
    let end = measure_start + Duration::from_secs_f64(duration);
    let measure_start_ns = (measure_start - base).as_nanos() as u64;
    let (stop_sub_tx, stop_sub_rx) = watch::channel(false);
    let mut member_tasks = JoinSet::new();
    for (i, c) in members.into_iter().enumerate() {
        let cfg = MemberCfg {
            id: i,
            base,
            measure_start_ns,
            nonce,
            state: state.clone(),
        };
        member_tasks.spawn(member(c, cfg, lanes, stop_sub_rx.clone()));
    }
    let sent = Arc::new(AtomicU64::new(0));
    let (stop_pub_tx, stop_pub_rx) = watch::channel(false);
    let mut set = tokio::time::timeout_at(
        deadline.into(),
        spawn_publishers(
            opts,
            lo.active,
            fresh,
            false,
            opts.rate + lo.new_rate,
            start,
            Some(end),
            base,
            nonce,
            &sent,
            &stop_pub_rx,
        ),
    )
    .await
    .context("timed out connecting publishers")??;
    let progress = (!opts.quiet && std::io::stderr().is_terminal()).then(|| {
        let d = Arc::new(AtomicU64::new(0));
        let (d2, st) = (d.clone(), state.clone());
        let mirror = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tick.tick().await;
                d2.store(st.delivered.load(Ordering::Relaxed), Ordering::Relaxed);
            }
        });
        (spawn_progress("active", sent.clone(), Some(d)), mirror)
    });
    let mut res = Vec::new();
    report.timed_out = join_publishers(&mut set, deadline, &stop_pub_tx, &mut res).await?;
    let published: u64 = res.iter().map(|p| p.sent).sum();

    // Drain: until every message of this run arrived (duplicates aside), no progress for
    // --drain seconds, or the deadline.
    if !report.timed_out {
        report.timed_out = drain(&state.delivered, published, opts.drain, deadline).await;
    }
    let _ = stop_sub_tx.send(true);
    let mut mres = Vec::new();
    collect_bounded(&mut member_tasks, &mut mres).await;
    if let Some((p, mirror)) = progress {
        p.abort();
        mirror.abort();
        eprintln!();
    }
    let _ = stop_rss_tx.send(true);
    if let Some(h) = sampler {
        report.broker_rss_max_kb = h.await.ok().flatten();
    }

    let first = sum_publishers(&res, &mut rep, &mut report.errors);
    let last_send = res.iter().map(|p| p.last_send_ns).max().unwrap_or(0);
    rep.publish_secs = last_send.saturating_sub(first) as f64 / 1e9;
    if rep.publish_secs > 0.0 {
        rep.msgs_per_sec = rep.published as f64 / rep.publish_secs;
    }
    let mut hist = new_histogram();
    let mut first_delivery: Option<u64> = None;
    for m in &mres {
        let r = &m.r;
        rep.delivered += r.delivered;
        rep.delivered_measured += r.delivered_measured;
        rep.seq_backwards += r.seq_backwards;
        rep.seq_gaps += r.seq_gaps;
        rep.offset_breaks += r.offset_breaks;
        rep.offset_backwards += r.offset_backwards;
        rep.missing_props += r.missing_props;
        rep.lane_mismatch += r.lane_mismatch;
        rep.stale += r.stale;
        rep.dup_flag += r.dup_flag;
        rep.per_member.push(r.delivered);
        rep.lanes_per_member.push(m.lanes_seen);
        if let Some(f) = m.first_ns {
            first_delivery = Some(first_delivery.map_or(f, |x| x.min(f)));
        }
        hist.add(&m.hist).context("merge histograms")?;
        if let Some(e) = &m.error {
            report.errors.push(e.clone());
        }
    }
    if mres.len() < lo.members {
        report
            .errors
            .push("some group members did not finish and were aborted".into());
    }
    let mut all: std::collections::HashSet<u64> = std::collections::HashSet::new();
    for m in &mut mres {
        all.extend(m.got.drain());
    }
    rep.delivered_unique = all.len() as u64;
    rep.duplicates = rep.delivered - rep.delivered_unique;
    rep.first_delivery_secs = first_delivery.map(|f| f.saturating_sub(first) as f64 / 1e9);
    rep.lost = rep.published as i64 - rep.delivered_unique as i64;
    report.latency = Latency::from_histogram(&hist);
    rep.latency = report.latency.as_ref().map(|l| LaneLatency {
        samples: l.samples,
        mean_us: l.mean_us,
        p50_us: l.p50_us,
        p90_us: l.p90_us,
        p95_us: quantile_us(&hist, 0.95),
        p99_us: l.p99_us,
        p999_us: l.p999_us,
        max_us: l.max_us,
    });
    report.published = rep.published;
    report.received = rep.delivered;
    report.expected = rep.published;
    report.loss = rep.lost;
    report.acked = rep.acked;
    report.ack_errors = rep.ack_errors;
    report.publish_secs = rep.publish_secs;
    report.msgs_per_sec_in = rep.msgs_per_sec;
    report.elapsed_s = t0.elapsed().as_secs_f64();
    report.lanes = Some(rep);
    Ok(report)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_next_to_the_others() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            opts: BenchOpts,
        }
        let d = BenchOpts::default();
        assert_eq!(d.lanes.phase, None);
        assert_eq!(d.lanes.count, 1_000_000);
        let c = Cli::try_parse_from([
            "b",
            "--lanes",
            "active",
            "--lanes-count",
            "5",
            "--count",
            "7",
            "--lanes-pick",
            "random",
        ])
        .unwrap();
        assert_eq!(c.opts.lanes.phase, Some(LanesPhase::Active));
        assert_eq!(c.opts.lanes.count, 5);
        assert_eq!(c.opts.count, Some(7));
        assert_eq!(c.opts.lanes.pick, LanePick::Random);
    }

    #[test]
    fn owned_partitions_lanes() {
        let all: Vec<u32> = (0..3).flat_map(|p| owned(p, 3, 10)).collect();
        let mut s = all.clone();
        s.sort_unstable();
        assert_eq!(s, (0..10).collect::<Vec<_>>());
        assert!(owned(5, 8, 3).is_empty());
    }

    #[test]
    fn picker_once_and_rotate() {
        let mut p = Picker {
            lanes: vec![1, 4],
            seqs: vec![0; 2],
            pick: LanePick::Rotate,
            once: true,
            k: 0,
            rng: Rng(7),
            fresh: Vec::new(),
            fresh_k: 0,
            fresh_p: 0.0,
        };
        assert_eq!(p.next(), Some((1, 0)));
        assert_eq!(p.next(), Some((4, 0)));
        assert_eq!(p.next(), None);
        p.once = false;
        p.k = 0;
        assert_eq!(p.next(), Some((1, 1)));
        assert_eq!(p.next(), Some((4, 1)));
        assert_eq!(p.next(), Some((1, 2)));
        // New lanes: each once, in order, about fresh_p of the messages.
        p.fresh = vec![100, 103, 106];
        p.fresh_p = 0.5;
        let got: Vec<(u32, u32)> = (0..40).filter_map(|_| p.next()).collect();
        let new: Vec<u32> = got.iter().filter(|x| x.0 >= 100).map(|x| x.0).collect();
        assert_eq!(new, [100, 103, 106]);
        assert!(got.iter().filter(|x| x.0 >= 100).all(|x| x.1 == 0));
    }

    /// One frame through the generator's parser, read as a member reads it.
    fn read_lane_publish(b: &mut BytesMut) -> (mqtt::Frame, LanePublish) {
        let mut lp = None;
        let f = mqtt::parse_with(b, Version::V5, |p| lp = Some(LanePublish::read(p)))
            .unwrap()
            .unwrap();
        (f, lp.unwrap())
    }

    #[test]
    fn publish_roundtrip_with_lane_props() {
        use bytes::BufMut;
        // As a lanes publisher writes it.
        let t = PublishTemplate::new(Version::V5, "agents", 1, HEADER + 2);
        let mut b = BytesMut::new();
        t.write_to(
            &mut b,
            "agents/l-42/x",
            9,
            123,
            42 << 32 | 7,
            &99u64.to_be_bytes(),
        );
        assert_eq!(b.len(), 2 + 2 + 13 + 2 + 1 + HEADER + 2);
        let (f, p) = read_lane_publish(&mut b);
        assert!(b.is_empty());
        assert_eq!(
            f,
            mqtt::Frame::Publish {
                qos: 1,
                pid: 9,
                ts: Some(123)
            }
        );
        assert!(!p.dup);
        assert_eq!(p.topic_lane, Some(42));
        assert_eq!(p.header, Some((123, 42, 7, 99)));
        assert_eq!(p.lane_prop, None);
        assert_eq!(p.lane_offset, None);

        // The same PUBLISH as the broker would deliver it (DUP=1): user properties lane,
        // lane-offset, and a subscription identifier.
        let topic = b"agents/l-42/x";
        let mut props = BytesMut::new();
        for (k, v) in [("lane", "l-42"), ("lane-offset", "17")] {
            props.put_u8(0x26);
            props.put_u16(k.len() as u16);
            props.put_slice(k.as_bytes());
            props.put_u16(v.len() as u16);
            props.put_slice(v.as_bytes());
        }
        props.put_u8(0x0B);
        props.put_u8(3);
        let mut body = BytesMut::new();
        body.put_u16(topic.len() as u16);
        body.put_slice(topic);
        body.put_u16(5);
        mqtt::put_varint(&mut body, props.len());
        body.put_slice(&props);
        body.put_u64(1);
        body.put_u32(42);
        body.put_u32(3);
        body.put_u64(99);
        let mut b = BytesMut::new();
        b.put_u8(0x3a);
        mqtt::put_varint(&mut b, body.len());
        b.put_slice(&body);
        let (f, p) = read_lane_publish(&mut b);
        assert!(matches!(f, mqtt::Frame::Publish { qos: 1, pid: 5, .. }));
        assert!(p.dup);
        assert_eq!(p.topic_lane, Some(42));
        assert_eq!(p.lane_prop, Some(Some(42)));
        assert_eq!(p.lane_offset, Some(17));
        assert_eq!(p.header, Some((1, 42, 3, 99)));

        // A payload shorter than the header: not this run's.
        let mut b = BytesMut::new();
        PublishTemplate::new(Version::V5, "agents/l-1/x", 0, 20).write(&mut b, 0, 1, 2);
        assert_eq!(read_lane_publish(&mut b).1.header, None);
    }
}
