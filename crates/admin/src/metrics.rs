//! Prometheus metrics of the whole broker: `GET /metrics` and the EMQX path
//! `GET /api/v5/prometheus/stats`.
//!
//! Owns: [`BrokerMetrics`] (the figures the backend reads at each scrape), their names, help
//! texts, types and units, the process figures read from `/proc/self`, and the two
//! exposition formats, both written by the `prometheus-client` library: the Prometheus text
//! format 0.0.4 (default) and OpenMetrics 1.0 (when the scraper's `Accept` asks for it).
//! Invariants: every name starts with `lanemq_` except the standard `process_*` ones;
//! counters end in `_total`, units are in names (`_bytes`, `_seconds`); a label value is a
//! name from the broker's own state (stream, parent, group, reason), escaped by the library;
//! nothing here keeps state between scrapes.

use axum::extract::State;
use axum::http::header::{ACCEPT, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeMetric,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::backend::{
    BrokerMetrics, GroupFigures, HistogramFigures, LiteMetrics, QosFigures, StreamFigures,
};
use crate::http::{blocking, ApiError, AppState};

/// `Content-Type` of the Prometheus text format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
/// `Content-Type` of the OpenMetrics text format.
pub const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The process, from `/proc/self` (absent fields: not Linux, or not readable).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessFigures {
    pub resident_memory_bytes: Option<u64>,
    pub virtual_memory_bytes: Option<u64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    pub threads: Option<u64>,
    pub cpu_seconds: Option<f64>,
    pub start_time_seconds: Option<f64>,
}

impl ProcessFigures {
    /// Reads `/proc/self/{status,stat,fd,limits}` and `/proc/stat` (btime).
    pub fn read() -> ProcessFigures {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let kib = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        };
        let open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as u64);
        let max_fds = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|l| {
                l.lines()
                    .find(|l| l.starts_with("Max open files"))
                    .and_then(|l| l.split_whitespace().nth(3))
                    .and_then(|v| v.parse::<u64>().ok())
            });
        // /proc/self/stat: fields after the ")" of the command; utime, stime are fields
        // 14 and 15, starttime 22 (in clock ticks; USER_HZ is 100 on Linux).
        const TICKS: f64 = 100.0;
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok());
        let cpu_seconds = match (field(14), field(15)) {
            (Some(u), Some(s)) => Some((u + s) as f64 / TICKS),
            _ => None,
        };
        let btime = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<u64>().ok())
        });
        let start_time_seconds = match (btime, field(22)) {
            (Some(b), Some(st)) => Some(b as f64 + st as f64 / TICKS),
            _ => None,
        };
        ProcessFigures {
            resident_memory_bytes: kib("VmRSS:").map(|v| v * 1024),
            virtual_memory_bytes: kib("VmSize:").map(|v| v * 1024),
            open_fds,
            max_fds,
            threads: kib("Threads:"),
            cpu_seconds,
            start_time_seconds,
        }
    }
}

/// One scrape: the broker's figures and the process's.
#[derive(Debug)]
struct Scrape {
    broker: BrokerMetrics,
    process: ProcessFigures,
}

type Enc<'a> = DescriptorEncoder<'a>;
type FmtResult = Result<(), std::fmt::Error>;

fn counter(e: &mut Enc<'_>, name: &str, help: &str, unit: Option<&Unit>, v: u64) -> FmtResult {
    let m = e.encode_descriptor(name, help, unit, MetricType::Counter)?;
    ConstCounter::new(v).encode(m)
}

fn gauge(e: &mut Enc<'_>, name: &str, help: &str, unit: Option<&Unit>, v: u64) -> FmtResult {
    let m = e.encode_descriptor(name, help, unit, MetricType::Gauge)?;
    ConstGauge::new(v as i64).encode(m)
}

fn gauge_f(e: &mut Enc<'_>, name: &str, help: &str, unit: Option<&Unit>, v: f64) -> FmtResult {
    let m = e.encode_descriptor(name, help, unit, MetricType::Gauge)?;
    ConstGauge::new(v).encode(m)
}

/// A family of one metric type over label sets (`N`: `u64` counts, `f64` measures).
fn family<L, N>(
    e: &mut Enc<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    ty: MetricType,
    rows: impl IntoIterator<Item = (L, N)>,
) -> FmtResult
where
    L: prometheus_client::encoding::EncodeLabelSet,
    N: EncodeGaugeValue + EncodeCounterValue + std::fmt::Debug,
{
    let mut m = e.encode_descriptor(name, help, unit, ty)?;
    for (labels, v) in rows {
        let s = m.encode_family(&labels)?;
        match ty {
            MetricType::Counter => ConstCounter::new(v).encode(s)?,
            _ => ConstGauge::new(v).encode(s)?,
        }
    }
    Ok(())
}

fn histogram(
    e: &mut Enc<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    h: &HistogramFigures,
) -> FmtResult {
    let mut m = e.encode_descriptor(name, help, unit, MetricType::Histogram)?;
    // The OpenMetrics writer prints only the buckets it is given (the 0.0.4 one adds
    // `+Inf` itself, unless one is there): give it the `+Inf` bucket, with the
    // observations above the last bound.
    let mut buckets = h.buckets.clone();
    if buckets.last().is_none_or(|b| b.0.is_finite()) {
        let counted: u64 = buckets.iter().map(|b| b.1).sum();
        buckets.push((f64::INFINITY, h.count.saturating_sub(counted)));
    }
    m.encode_histogram::<prometheus_client::encoding::NoLabelSet>(h.sum, h.count, &buckets, None)
}

const QOS: [&str; 3] = ["0", "1", "2"];

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> FmtResult {
        let b = &self.broker;
        let bytes = Unit::Bytes;
        let secs = Unit::Seconds;
        let e = &mut e;
        gauge(
            e,
            "lanemq_uptime",
            "Time since the broker started.",
            Some(&secs),
            b.uptime_seconds,
        )?;
        // Connections and sessions.
        gauge(
            e,
            "lanemq_connections",
            "Client connections (after CONNACK).",
            None,
            b.connections,
        )?;
        if let Some(c) = &b.cluster {
            counter(
                e,
                "lanemq_cluster_published",
                "Records this node handed to the cluster's log (cluster mode).",
                None,
                c.published,
            )?;
            counter(
                e,
                "lanemq_cluster_publish_failures",
                "Records the cluster's log did not store; their connections were closed.",
                None,
                c.publish_failures,
            )?;
            counter(
                e,
                "lanemq_cluster_replicated",
                "Records read from the cluster's log and appended to the local log.",
                None,
                c.replicated,
            )?;
            gauge(
                e,
                "lanemq_cluster_routed_offset",
                "Every record below this log offset has been routed to this node's sessions.",
                None,
                c.routed_offset,
            )?;
            gauge(
                e,
                "lanemq_cluster_replicator_failed",
                "1 when the replicator stopped on a misaligned offset (fail-stop).",
                None,
                c.replicator_failed,
            )?;
            gauge(
                e,
                "lanemq_cluster_diverged",
                "1 when the replicator stopped because the log it read diverged from what JetStream acknowledged to this node.",
                None,
                c.diverged,
            )?;
            counter(
                e,
                "lanemq_cluster_qos0_dropped",
                "QoS 0 messages dropped because the cluster's log was behind (pacing).",
                None,
                c.qos0_dropped,
            )?;
        }
        gauge(
            e,
            "lanemq_connections_hibernating",
            "Idle connections waiting in the parking lot, without a task.",
            None,
            b.connections_hibernating,
        )?;
        counter(
            e,
            "lanemq_connections_accepted",
            "Connections accepted (CONNACK 0x00) since start.",
            None,
            b.connections_accepted,
        )?;
        family(
            e,
            "lanemq_connections_refused",
            "CONNECTs refused, by CONNACK reason.",
            None,
            MetricType::Counter,
            b.connects_refused
                .iter()
                .map(|(r, n)| ([("reason", r.as_str())], *n)),
        )?;
        counter(
            e,
            "lanemq_authentication_failures",
            "Failed authentications (password or enhanced).",
            None,
            b.auth_failures,
        )?;
        family(
            e,
            "lanemq_sessions",
            "Sessions, by state (online: connected; offline: kept for a later connection).",
            None,
            MetricType::Gauge,
            [
                ("online", b.sessions_online),
                ("offline", b.sessions_offline),
            ]
            .map(|(s, n)| ([("state", s)], n)),
        )?;
        gauge(
            e,
            "lanemq_subscriptions",
            "Subscriptions of every session.",
            None,
            b.subscriptions,
        )?;
        // Messages.
        let per_qos = |f: fn(&QosFigures) -> u64, q: &[QosFigures; 3]| {
            QOS.iter()
                .zip(q.iter())
                .map(|(l, x)| ([("qos", *l)], f(x)))
                .collect::<Vec<_>>()
        };
        family(
            e,
            "lanemq_messages_received",
            "PUBLISH packets received from clients, by QoS.",
            None,
            MetricType::Counter,
            per_qos(|x| x.messages, &b.received),
        )?;
        family(
            e,
            "lanemq_messages_received_payload",
            "Payload bytes of the PUBLISH packets received, by QoS.",
            Some(&bytes),
            MetricType::Counter,
            per_qos(|x| x.payload_bytes, &b.received),
        )?;
        family(
            e,
            "lanemq_messages_sent",
            "PUBLISH packets sent to clients, by QoS of the delivery.",
            None,
            MetricType::Counter,
            per_qos(|x| x.messages, &b.sent),
        )?;
        family(
            e,
            "lanemq_messages_sent_payload",
            "Payload bytes of the PUBLISH packets sent, by QoS.",
            Some(&bytes),
            MetricType::Counter,
            per_qos(|x| x.payload_bytes, &b.sent),
        )?;
        counter(
            e,
            "lanemq_network_received",
            "Bytes read from client connections (every packet).",
            Some(&bytes),
            b.network_received_bytes,
        )?;
        counter(
            e,
            "lanemq_network_sent",
            "Bytes written to client connections (every packet).",
            Some(&bytes),
            b.network_sent_bytes,
        )?;
        family(
            e,
            "lanemq_messages_dropped",
            "Deliveries discarded, by reason.",
            None,
            MetricType::Counter,
            b.dropped
                .iter()
                .map(|(r, n)| ([("reason", r.as_str())], *n)),
        )?;
        counter(
            e,
            "lanemq_messages_no_subscribers",
            "Accepted PUBLISHes that matched no subscription (they are still in the log).",
            None,
            b.no_subscribers,
        )?;
        gauge(
            e,
            "lanemq_retained_messages",
            "Retained messages.",
            None,
            b.retained,
        )?;
        gauge(
            e,
            "lanemq_inflight_messages",
            "Deliveries sent and not yet acknowledged (QoS 1 and 2), every session.",
            None,
            b.inflight,
        )?;
        gauge(
            e,
            "lanemq_queued_messages",
            "Deliveries waiting in session queues (online and offline).",
            None,
            b.queued_messages,
        )?;
        gauge(
            e,
            "lanemq_queued",
            "Bytes held by session queues in memory.",
            Some(&bytes),
            b.queued_bytes,
        )?;
        gauge(
            e,
            "lanemq_queued_limit",
            "The broker-wide limit of queued bytes (mqtt.max_queued_bytes_total).",
            Some(&bytes),
            b.queued_bytes_limit,
        )?;
        counter(
            e,
            "lanemq_queue_spilled",
            "Deliveries moved from memory to the log-backed queue of their session.",
            None,
            b.spilled,
        )?;
        counter(
            e,
            "lanemq_slow_consumers_disconnected",
            "Clients disconnected for not reading their deliveries.",
            None,
            b.slow_consumers_disconnected,
        )?;
        // The log.
        let l = &b.log;
        counter(
            e,
            "lanemq_log_appended_records",
            "Records written to the shared log since start.",
            None,
            l.appended_records,
        )?;
        counter(
            e,
            "lanemq_log_appended",
            "Record bytes written to the shared log since start.",
            Some(&bytes),
            l.appended_bytes,
        )?;
        counter(
            e,
            "lanemq_log_write_batches",
            "Write batches (group commits) of the storage thread.",
            None,
            l.batches,
        )?;
        counter(
            e,
            "lanemq_log_fsyncs",
            "fsyncs of the log's tail segment.",
            None,
            l.fsyncs,
        )?;
        counter(
            e,
            "lanemq_log_append_waits",
            "Appends that found the log's submission queue full and waited for the storage thread.",
            None,
            l.append_waits,
        )?;
        histogram(
            e,
            "lanemq_log_fsync_duration",
            "Time one fsync of the log took.",
            Some(&secs),
            &l.fsync_seconds,
        )?;
        histogram(
            e,
            "lanemq_log_batch_records",
            "Records per write batch (group commit size).",
            None,
            &l.batch_records,
        )?;
        gauge(
            e,
            "lanemq_log_failed",
            "1 once the log refuses writes after a storage error (fail-stop: restart the broker).",
            None,
            u64::from(l.failed),
        )?;
        gauge(
            e,
            "lanemq_log_segments",
            "Segment files of the log.",
            None,
            l.segments,
        )?;
        gauge(
            e,
            "lanemq_log_size",
            "Bytes of every segment of the log.",
            Some(&bytes),
            l.segment_bytes,
        )?;
        gauge(
            e,
            "lanemq_log_first_offset",
            "First offset the log still holds.",
            None,
            l.first_offset,
        )?;
        gauge(
            e,
            "lanemq_log_next_offset",
            "Next offset the log assigns.",
            None,
            l.next_offset,
        )?;
        gauge(
            e,
            "lanemq_log_committed_offset",
            "End of the records that met the fsync policy.",
            None,
            l.committed_offset,
        )?;
        gauge(
            e,
            "lanemq_log_queued_records",
            "Records waiting for the storage thread.",
            None,
            l.queued_records,
        )?;
        family(
            e,
            "lanemq_index_lag_records",
            "Log records an index has not indexed yet (next offset - indexed offset).",
            None,
            MetricType::Gauge,
            b.indexed_offsets
                .iter()
                .map(|(i, o)| ([("index", i.as_str())], l.next_offset.saturating_sub(*o))),
        )?;
        // Streams.
        gauge(
            e,
            "lanemq_streams",
            "Named streams.",
            None,
            b.streams.len() as u64,
        )?;
        let st = |f: fn(&StreamFigures) -> u64| {
            b.streams
                .iter()
                .map(move |s| ([("stream", s.name.as_str())], f(s)))
        };
        family(
            e,
            "lanemq_stream_records",
            "Messages a stream holds.",
            None,
            MetricType::Gauge,
            st(|s| s.records),
        )?;
        family(
            e,
            "lanemq_stream_size",
            "Topic and payload bytes of the messages a stream holds.",
            Some(&bytes),
            MetricType::Gauge,
            st(|s| s.bytes),
        )?;
        family(
            e,
            "lanemq_stream_readers",
            "Stream subscriptions reading a stream now.",
            None,
            MetricType::Gauge,
            st(|s| s.readers),
        )?;
        family(
            e,
            "lanemq_stream_oldest_age",
            "Age of the oldest message a stream holds (absent when empty).",
            Some(&secs),
            MetricType::Gauge,
            b.streams.iter().filter_map(|s| {
                s.oldest_age_seconds
                    .map(|a| ([("stream", s.name.as_str())], a))
            }),
        )?;
        // Lanes.
        encode_lite(e, &b.lite)?;
        family(
            e,
            "lanemq_lite_parent_ready_lanes",
            "Lanes of a parent that a connected group can take now.",
            None,
            MetricType::Gauge,
            b.parents
                .iter()
                .map(|p| ([("parent", p.name.as_str())], p.ready_lanes)),
        )?;
        let gr = |f: fn(&GroupFigures) -> u64| {
            b.groups.iter().map(move |g| {
                (
                    [("parent", g.parent.as_str()), ("group", g.group.as_str())],
                    f(g),
                )
            })
        };
        family(e, "lanemq_lite_group_lag_messages", "Messages a group has not committed (on lanes it never read after starting at latest: an upper bound).", None, MetricType::Gauge, gr(|g| g.lag_messages))?;
        family(
            e,
            "lanemq_lite_group_lanes_behind",
            "Lanes with messages a group has not committed.",
            None,
            MetricType::Gauge,
            gr(|g| g.lanes_behind),
        )?;
        family(
            e,
            "lanemq_lite_group_inflight_messages",
            "Lane messages sent to a group's members and not yet acknowledged.",
            None,
            MetricType::Gauge,
            gr(|g| g.inflight),
        )?;
        family(
            e,
            "lanemq_lite_group_members_online",
            "Connected members of a group.",
            None,
            MetricType::Gauge,
            gr(|g| g.members_online),
        )?;
        family(
            e,
            "lanemq_lite_group_dead_letters",
            "Messages a group dead-lettered since start ($private: private replays).",
            None,
            MetricType::Counter,
            gr(|g| g.dead_letters),
        )?;
        // The process.
        let p = &self.process;
        if let Some(v) = p.resident_memory_bytes {
            gauge(
                e,
                "process_resident_memory",
                "Resident memory size.",
                Some(&bytes),
                v,
            )?;
        }
        if let Some(v) = p.virtual_memory_bytes {
            gauge(
                e,
                "process_virtual_memory",
                "Virtual memory size.",
                Some(&bytes),
                v,
            )?;
        }
        if let Some(v) = p.open_fds {
            gauge(e, "process_open_fds", "Open file descriptors.", None, v)?;
        }
        if let Some(v) = p.max_fds {
            gauge(
                e,
                "process_max_fds",
                "Limit of open file descriptors.",
                None,
                v,
            )?;
        }
        if let Some(v) = p.threads {
            gauge(e, "process_threads", "OS threads of the process.", None, v)?;
        }
        if let Some(v) = p.cpu_seconds {
            let m = e.encode_descriptor(
                "process_cpu",
                "User and system CPU time spent.",
                Some(&secs),
                MetricType::Counter,
            )?;
            ConstCounter::new(v).encode(m)?;
        }
        if let Some(v) = p.start_time_seconds {
            gauge_f(
                e,
                "process_start_time",
                "Start time of the process since the Unix epoch.",
                Some(&secs),
                v,
            )?;
        }
        Ok(())
    }
}

/// The lite layer's lane counts and counters (also `GET /api/v5/lite/metrics` alone).
fn encode_lite(e: &mut Enc<'_>, lm: &LiteMetrics) -> FmtResult {
    gauge(
        e,
        "lanemq_lite_parents",
        "Lite parents in force.",
        None,
        lm.parents,
    )?;
    gauge(
        e,
        "lanemq_lite_lanes",
        "Lanes in the lane table (every parent).",
        None,
        lm.lanes,
    )?;
    for (name, help, v) in lm.counters() {
        counter(e, &format!("lanemq_lite_{name}"), help, None, v)?;
    }
    family(
        e,
        "lanemq_lite_parent_lanes",
        "Lanes of a lite parent.",
        None,
        MetricType::Gauge,
        lm.parent_lanes
            .iter()
            .map(|(p, n)| ([("parent", p.as_str())], *n)),
    )
}

/// The lite layer's part alone, for `GET /api/v5/lite/metrics`.
#[derive(Debug)]
struct LiteScrape(LiteMetrics);

impl Collector for LiteScrape {
    fn encode(&self, mut e: DescriptorEncoder) -> FmtResult {
        encode_lite(&mut e, &self.0)
    }
}

/// `GET /api/v5/lite/metrics` in the Prometheus text format.
pub(crate) fn render_lite(lm: LiteMetrics) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(LiteScrape(lm)));
    let mut out = String::with_capacity(4096);
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry) {
        tracing::error!(error = %e, "lite metrics encoding failed");
    }
    out
}

/// OpenMetrics only when the scraper asks for it (Prometheus does, with a q-value).
fn wants_openmetrics(headers: &HeaderMap) -> bool {
    headers
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| {
            v.to_ascii_lowercase()
                .contains("application/openmetrics-text")
        })
}

/// The exposition of one scrape in the Prometheus text format or in OpenMetrics.
pub fn render(broker: BrokerMetrics, process: ProcessFigures, openmetrics: bool) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape { broker, process }));
    let mut out = String::with_capacity(16 * 1024);
    let r = if openmetrics {
        prometheus_client::encoding::text::encode(&mut out, &registry)
    } else {
        prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
    };
    if let Err(e) = r {
        // Writing to a String cannot fail; an encoder refusal is a bug worth seeing.
        tracing::error!(error = %e, "metrics encoding failed");
    }
    out
}

async fn scrape(State(st): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let b = st.backend;
    let om = wants_openmetrics(&headers);
    let text = blocking(move || render(b.metrics(), ProcessFigures::read(), om)).await?;
    let mut resp = text.into_response();
    let ct = if om {
        OPENMETRICS_TEXT
    } else {
        PROMETHEUS_TEXT
    };
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(ct));
    Ok(resp)
}

/// `GET /metrics` and `GET /api/v5/prometheus/stats` (behind the token unless
/// `[admin] metrics_public`).
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/metrics", get(scrape))
        .route("/api/v5/prometheus/stats", get(scrape))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::LogFigures;

    fn sample() -> BrokerMetrics {
        BrokerMetrics {
            cluster: Some(crate::backend::ClusterFigures {
                published: 11,
                publish_failures: 1,
                replicated: 12,
                routed_offset: 13,
                replicator_failed: 0,
                diverged: 0,
                qos0_dropped: 4,
            }),
            connections: 3,
            connections_hibernating: 2,
            connections_accepted: 10,
            connects_refused: vec![("bad_user_name_or_password".into(), 2)],
            received: [
                QosFigures {
                    messages: 5,
                    payload_bytes: 50,
                },
                QosFigures {
                    messages: 1,
                    payload_bytes: 7,
                },
                QosFigures::default(),
            ],
            log: LogFigures {
                next_offset: 100,
                fsync_seconds: HistogramFigures {
                    buckets: vec![(0.001, 3), (0.01, 1)],
                    sum: 0.012,
                    count: 5,
                },
                ..Default::default()
            },
            indexed_offsets: vec![("streams".into(), 90)],
            streams: vec![StreamFigures {
                name: "a\"b".into(),
                records: 4,
                bytes: 40,
                readers: 1,
                oldest_age_seconds: Some(2.5),
            }],
            groups: vec![GroupFigures {
                parent: "agents".into(),
                group: "workers".into(),
                lag_messages: 7,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn prometheus_text_has_types_units_labels_and_escapes() {
        let t = render(
            sample(),
            ProcessFigures {
                open_fds: Some(9),
                ..Default::default()
            },
            false,
        );
        for line in [
            "# TYPE lanemq_connections gauge",
            "lanemq_connections 3",
            "# TYPE lanemq_connections_hibernating gauge",
            "lanemq_connections_hibernating 2",
            "lanemq_cluster_published_total 11",
            "lanemq_cluster_publish_failures_total 1",
            "lanemq_cluster_replicated_total 12",
            "lanemq_cluster_routed_offset 13",
            "lanemq_cluster_replicator_failed 0",
            "lanemq_cluster_diverged 0",
            "lanemq_cluster_qos0_dropped_total 4",
            "# TYPE lanemq_connections_accepted_total counter",
            "lanemq_connections_accepted_total 10",
            "lanemq_connections_refused_total{reason=\"bad_user_name_or_password\"} 2",
            "lanemq_messages_received_total{qos=\"0\"} 5",
            "lanemq_messages_received_payload_bytes_total{qos=\"1\"} 7",
            "# TYPE lanemq_log_fsync_duration_seconds histogram",
            "lanemq_log_fsync_duration_seconds_bucket{le=\"0.001\"} 3",
            "lanemq_log_fsync_duration_seconds_bucket{le=\"0.01\"} 4",
            "lanemq_log_fsync_duration_seconds_bucket{le=\"+Inf\"} 5",
            "lanemq_log_fsync_duration_seconds_count 5",
            "lanemq_index_lag_records{index=\"streams\"} 10",
            "lanemq_stream_records{stream=\"a\\\"b\"} 4",
            "lanemq_stream_oldest_age_seconds{stream=\"a\\\"b\"} 2.5",
            "lanemq_lite_group_lag_messages{parent=\"agents\",group=\"workers\"} 7",
            "process_open_fds 9",
        ] {
            assert!(t.lines().any(|l| l == line), "missing {line:?} in\n{t}");
        }
        assert!(!t.contains("# EOF"));
        assert!(
            !t.contains("process_resident_memory"),
            "absent figures are left out"
        );
    }

    #[test]
    fn openmetrics_ends_with_eof_and_histograms_end_in_inf() {
        let t = render(sample(), ProcessFigures::default(), true);
        assert!(t.ends_with("# EOF\n"), "{t}");
        assert!(t.contains("lanemq_connections_accepted_total 10"));
        for text in [t, render(sample(), ProcessFigures::default(), false)] {
            let inf: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with("lanemq_log_fsync_duration_seconds_bucket{le=\"+Inf\"}"))
                .collect();
            assert_eq!(
                inf,
                ["lanemq_log_fsync_duration_seconds_bucket{le=\"+Inf\"} 5"],
                "{text}"
            );
        }
    }

    #[test]
    fn process_figures_are_read_on_linux() {
        let p = ProcessFigures::read();
        if cfg!(target_os = "linux") {
            assert!(p.resident_memory_bytes.is_some_and(|v| v > 0), "{p:?}");
            assert!(p.open_fds.is_some_and(|v| v > 0), "{p:?}");
            assert!(p.cpu_seconds.is_some(), "{p:?}");
            assert!(p.start_time_seconds.is_some_and(|v| v > 1.0e9), "{p:?}");
        }
    }
}
