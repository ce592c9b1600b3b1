//! The broker side of the REST admin API: [`BrokerAdmin`] implements
//! [`lanemq_admin::AdminBackend`] over the broker's stream engine, its authorization rules
//! and its statistics; [`start`] binds and serves the API for [`crate::Server`].

use crate::broker::Broker;
use crate::config::Config;
use lanemq_admin::{
    AdminBackend, ClientInfo, Kicked, LaneDetail, LiteMetrics, StreamMessageView, StreamPage,
    SubscriptionInfo,
};
use lanemq_lite::{LaneInfo, LiteError, ParentDef, ParentInfo};
use lanemq_streams::engine::StreamReader;
use lanemq_streams::subscribe::StartFrom;
use lanemq_streams::{GlobalSettings, StreamDef, StreamError, StreamInfo};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// The admin API backend of a running broker.
pub struct BrokerAdmin {
    broker: Arc<Broker>,
}

impl BrokerAdmin {
    pub fn new(broker: Arc<Broker>) -> BrokerAdmin {
        BrokerAdmin { broker }
    }

    /// What the rules in force are, for the reload answer and the log.
    fn auth_summary(&self) -> String {
        let auth = self.broker.auth();
        let acl = &auth.acl;
        let mut s = format!(
            "authorization reloaded: ACL {} ({} rule{}, default {})",
            acl.source_name(),
            acl.len(),
            if acl.len() == 1 { "" } else { "s" },
            if acl.default_allows() {
                "allow"
            } else {
                "deny"
            }
        );
        match (&auth.passwords, &self.broker.config.server.password_file) {
            (Some(p), Some(path)) => s.push_str(&format!(
                "; password file {} ({} user{})",
                path.display(),
                p.len(),
                if p.len() == 1 { "" } else { "s" }
            )),
            _ => s.push_str("; no password file"),
        }
        s
    }
}

fn client_info(s: &crate::session::Session) -> ClientInfo {
    let st = s.lock();
    let (username, ip) = match &st.identity {
        Some((u, ip)) => (u.as_deref().map(str::to_string), Some(ip.to_string())),
        None => (None, None),
    };
    let level = st.protocol.level();
    ClientInfo {
        clientid: s.client_id.to_string(),
        username,
        ip_address: ip,
        connected: st.connected,
        connected_at: (st.connected_at_ms > 0).then_some(st.connected_at_ms),
        proto_ver: level,
        proto_name: if level == 3 { "MQIsdp" } else { "MQTT" },
        expiry_interval: st.expiry_s,
        subscriptions_cnt: st.subscriptions.len() + st.stream_subs.len(),
        mqueue_len: st.queue.len() + st.spilled.len(),
        inflight_cnt: st.inflight.len(),
        mqueue_dropped: st.dropped,
    }
}

fn retained_info(m: &crate::message::Message) -> lanemq_admin::RetainedInfo {
    lanemq_admin::RetainedInfo {
        topic: m.topic.to_string(),
        msgid: m.offset.to_string(),
        qos: m.qos.as_u8(),
        from_clientid: m.publisher.to_string(),
        from_username: m.username.as_deref().map(str::to_string),
        publish_at: m.timestamp_us / 1000,
        payload_bytes: m.payload.len(),
    }
}

fn subscription_infos(s: &crate::session::Session) -> Vec<SubscriptionInfo> {
    let st = s.lock();
    let one = |topic: &str, o: &lanemq_protocol::SubscriptionOptions| SubscriptionInfo {
        clientid: s.client_id.to_string(),
        topic: topic.to_string(),
        qos: o.qos.as_u8(),
        nl: u8::from(o.no_local),
        rap: u8::from(o.retain_as_published),
        rh: o.retain_handling,
    };
    let mut out: Vec<SubscriptionInfo> = st
        .subscriptions
        .iter()
        .map(|(f, sub)| one(f, &sub.options))
        .collect();
    for (f, sub) in &st.stream_subs {
        out.push(one(f, &sub.options));
    }
    out
}

impl AdminBackend for BrokerAdmin {
    fn list_streams(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<StreamInfo>, bool), StreamError> {
        Ok(self.broker.streams.list(after, limit))
    }

    fn get_stream(&self, name: &str) -> Result<StreamInfo, StreamError> {
        self.broker.streams.get(name)
    }

    fn create_stream(&self, def: StreamDef) -> Result<StreamInfo, StreamError> {
        // Cluster mode: on every node, through the cluster's log (`crate::cluster`).
        self.broker.create_stream(def)
    }

    fn update_stream(&self, name: &str, def: StreamDef) -> Result<StreamInfo, StreamError> {
        // The engine refuses changes of topic_filter / is_lastvalue (Immutable).
        self.broker.update_stream(name, def)
    }

    fn delete_stream(&self, name: &str) -> Result<(), StreamError> {
        self.broker.delete_stream(name)
    }

    fn get_settings(&self) -> GlobalSettings {
        self.broker.streams.settings()
    }

    fn put_settings(&self, s: GlobalSettings) -> Result<GlobalSettings, StreamError> {
        self.broker.streams.put_settings(s)?;
        Ok(self.broker.streams.settings())
    }

    fn reload_authorization(&self) -> Result<String, String> {
        match self.broker.reload_auth() {
            Ok(revoked) => {
                let summary = format!(
                    "{}; {revoked} subscription{} revoked",
                    self.auth_summary(),
                    if revoked == 1 { "" } else { "s" }
                );
                info!(%summary, "admin API: authorization reloaded");
                Ok(summary)
            }
            Err(e) => {
                warn!(error = %e, "admin API: authorization reload failed, the previous rules stay in force");
                Err(format!("{e} (the previous rules stay in force)"))
            }
        }
    }

    fn clients(&self) -> Vec<ClientInfo> {
        let sessions: Vec<Arc<crate::session::Session>> =
            self.broker.sessions_lock().values().cloned().collect();
        sessions.iter().map(|s| client_info(s)).collect()
    }

    fn client(&self, clientid: &str) -> Option<ClientInfo> {
        let s = self.broker.sessions_lock().get(clientid).cloned()?;
        Some(client_info(&s))
    }

    fn kick(&self, clientid: &str) -> Kicked {
        let k = self.broker.kick_client(clientid);
        if k == Kicked::Disconnected {
            info!(
                client = clientid,
                "admin API: client kicked (DISCONNECT 0x98)"
            );
        }
        k
    }

    fn client_subscriptions(&self, clientid: &str) -> Option<Vec<SubscriptionInfo>> {
        let s = self.broker.sessions_lock().get(clientid).cloned()?;
        Some(subscription_infos(&s))
    }

    fn subscriptions(&self) -> Vec<SubscriptionInfo> {
        let sessions: Vec<Arc<crate::session::Session>> =
            self.broker.sessions_lock().values().cloned().collect();
        sessions
            .iter()
            .flat_map(|s| subscription_infos(s))
            .collect()
    }

    fn publish(
        &self,
        msg: lanemq_admin::ApiPublish,
    ) -> Result<lanemq_admin::Published, lanemq_admin::PublishError> {
        self.broker.publish_api(msg)
    }

    fn retained(&self, filter: Option<&str>) -> Result<Vec<lanemq_admin::RetainedInfo>, String> {
        if let Some(f) = filter {
            if !lanemq_protocol::topic::valid_filter(f) {
                return Err(format!("topic {f:?} is not a valid MQTT topic filter"));
            }
        }
        Ok(self
            .broker
            .retained_snapshot()
            .iter()
            .filter(|(t, _)| filter.is_none_or(|f| lanemq_protocol::topic::matches(f, t)))
            .map(|(_, m)| retained_info(m))
            .collect())
    }

    fn retained_message(&self, topic: &str) -> Option<(lanemq_admin::RetainedInfo, Vec<u8>)> {
        self.broker
            .retained_snapshot()
            .into_iter()
            .find(|(t, _)| &**t == topic)
            .map(|(_, m)| (retained_info(&m), m.payload.to_vec()))
    }

    fn delete_retained(&self, topic: &str) -> bool {
        let removed = self.broker.delete_retained_everywhere(topic);
        if removed {
            info!(topic, "admin API: retained message deleted");
        }
        removed
    }

    fn running(&self) -> bool {
        !self.broker.is_shutting_down()
    }

    fn storage_failure(&self) -> Option<String> {
        self.broker.persist.store.failure().map(|e| e.to_string())
    }

    fn read_stream(
        &self,
        name: &str,
        start: StartFrom,
        limit: usize,
    ) -> Result<StreamPage, StreamError> {
        let engine = &self.broker.streams;
        if !engine.is_enabled() {
            return Err(StreamError::Disabled);
        }
        let h = engine
            .lookup(name)
            .ok_or_else(|| StreamError::NotFound(name.to_string()))?;
        let from = engine
            .start_position(&h, start)
            .map_err(|e| StreamError::Storage(e.to_string()))?;
        let mut reader = StreamReader::for_start(from, start);
        let read = engine.read(&h, &mut reader, limit)?;
        let messages = read
            .into_iter()
            .map(|m| {
                let r = m.record;
                let p = r.properties;
                StreamMessageView {
                    offset: m.offset,
                    topic: r.topic,
                    qos: r.qos,
                    retain: r.retain,
                    ts_us: r.timestamp_us,
                    key: m.key,
                    from_clientid: r.client_id,
                    payload: r.payload.to_vec(),
                    payload_format_indicator: p.payload_format_indicator,
                    message_expiry_interval: p.message_expiry_interval,
                    content_type: p.content_type,
                    response_topic: p.response_topic,
                    correlation_data: p.correlation_data.map(|b| b.to_vec()),
                    user_properties: p.user_properties,
                }
            })
            .collect();
        Ok(StreamPage {
            messages,
            next: reader.next,
        })
    }

    fn stats(&self) -> Value {
        let b = &self.broker;
        let st = &b.stats;
        let streams = serde_json::to_value(b.streams.stats()).unwrap_or(Value::Null);
        let q = &b.queue_budget;
        let store = &b.persist.store;
        let ls = store.stats();
        let failure = store.failure().map(|e| e.to_string());
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_s": b.started.elapsed().as_secs(),
            "broker": {
                "clients_connected": st.clients_connected.load(Ordering::Relaxed),
                "messages_received": st.messages_received.load(Ordering::Relaxed),
                "messages_sent": st.messages_sent.load(Ordering::Relaxed),
                "messages_dropped": st.messages_dropped.load(Ordering::Relaxed),
                "bytes_received": st.bytes_received.load(Ordering::Relaxed),
                "bytes_sent": st.bytes_sent.load(Ordering::Relaxed),
                "auth_failures": st.auth_failures.load(Ordering::Relaxed),
                "subscriptions_revoked": st.subscriptions_revoked.load(Ordering::Relaxed),
                "sessions": b.session_count(),
                "retained": b.retained_count(),
            },
            "queues": {
                "queued_bytes": q.used(),
                "queued_bytes_max_total": q.max(),
                "spilled": q.spilled.load(Ordering::Relaxed),
                "dropped_qos0": q.dropped_qos0.load(Ordering::Relaxed),
                "dropped_queue_full": q.dropped_queue_full.load(Ordering::Relaxed),
                "slow_consumers_disconnected": q.slow_consumers_disconnected.load(Ordering::Relaxed),
            },
            "streams": streams,
            "log": {
                "first_offset": store.first_offset(),
                "next_offset": store.next_offset(),
                "committed_offset": store.committed_offset(),
                "queued_records": store.queued_records(),
                "segments": store.segment_count(),
                "size_bytes": store.size_bytes(),
                "appended_records": ls.appended_records.load(Ordering::Relaxed),
                "fsyncs": ls.fsyncs.load(Ordering::Relaxed),
                "failed": failure.is_some(),
                "failure": failure,
            },
        })
    }

    fn list_parents(&self) -> Vec<ParentInfo> {
        self.broker.lite.engine.list_parents()
    }

    fn get_parent(&self, name: &str) -> Result<ParentInfo, LiteError> {
        self.broker.lite.engine.get_parent(name)
    }

    fn create_parent(&self, def: ParentDef) -> Result<ParentInfo, LiteError> {
        self.broker.create_parent(def)
    }

    fn update_parent(&self, name: &str, def: ParentDef) -> Result<ParentInfo, LiteError> {
        self.broker.update_parent(name, def)
    }

    fn delete_parent(&self, name: &str) -> Result<(), LiteError> {
        self.broker.delete_parent(name)
    }

    fn list_lanes(
        &self,
        parent: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<LaneInfo>, bool), LiteError> {
        self.broker.lite.engine.list_lanes(parent, after, limit)
    }

    fn get_lane(&self, parent: &str, lane: &str) -> Result<Option<LaneDetail>, LiteError> {
        let engine = &self.broker.lite.engine;
        let Some(info) = engine.get_lane(parent, lane)? else {
            return Ok(None);
        };
        let pid = parent_id(engine, parent)?;
        let (id, key, next) = (info.id, info.lane.clone(), info.next_offset);
        let groups = self.query(move |d| {
            d.groups_of(pid)
                .into_iter()
                .map(|g| with_group(&g.group, &d.group_lane(pid, &g.group, id, &key, next)))
                .collect::<Vec<Value>>()
        })?;
        Ok(Some(LaneDetail { lane: info, groups }))
    }

    fn lite_groups(&self, parent: &str) -> Result<Vec<Value>, LiteError> {
        let pid = parent_id(&self.broker.lite.engine, parent)?;
        self.query(move |d| {
            d.groups_of(pid)
                .iter()
                .map(|g| serde_json::to_value(g).unwrap_or(Value::Null))
                .collect()
        })
    }

    fn group_lag(
        &self,
        parent: &str,
        group: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Option<(Vec<Value>, bool)>, LiteError> {
        let engine = &self.broker.lite.engine;
        let pid = parent_id(engine, parent)?;
        let (lanes, more) = engine.list_lanes(parent, after, limit)?;
        let group = group.to_string();
        let rows = self.query(move |d| {
            if !d.groups_of(pid).iter().any(|g| g.group == group) {
                return None;
            }
            Some(
                lanes
                    .iter()
                    .map(|l| {
                        let gl = d.group_lane(pid, &group, l.id, &l.lane, l.next_offset);
                        serde_json::to_value(gl).unwrap_or(Value::Null)
                    })
                    .collect::<Vec<Value>>(),
            )
        })?;
        Ok(rows.map(|r| (r, more)))
    }

    fn metrics(&self) -> lanemq_admin::BrokerMetrics {
        use lanemq_admin::{
            BrokerMetrics, GroupFigures, HistogramFigures, LogFigures, ParentFigures, QosFigures,
            StreamFigures,
        };
        let b = &self.broker;
        let st = &b.stats;
        let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let qos = |m: &[std::sync::atomic::AtomicU64; 3],
                   by: &[std::sync::atomic::AtomicU64; 3]| {
            let f = |i: usize| QosFigures {
                messages: n(&m[i]),
                payload_bytes: n(&by[i]),
            };
            [f(0), f(1), f(2)]
        };
        // Sessions: one short lock each (no lock is held across sessions).
        let sessions: Vec<Arc<crate::session::Session>> =
            b.sessions_lock().values().cloned().collect();
        let (mut online, mut subscriptions, mut inflight, mut queued) = (0u64, 0u64, 0u64, 0u64);
        for s in &sessions {
            let g = s.lock();
            online += u64::from(g.connected);
            subscriptions += (g.subscriptions.len() + g.stream_subs.len()) as u64;
            inflight += g.inflight.len() as u64;
            queued += (g.queue.len() + g.spilled.len()) as u64;
        }
        let refused = st
            .connects_refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(code, count)| {
                let name = lanemq_protocol::reason::name(*code)
                    .to_ascii_lowercase()
                    .replace([' ', '-'], "_");
                (name, *count)
            })
            .collect();
        let q = &b.queue_budget;
        let store = &b.persist.store;
        let ls = store.stats();
        let hist = |h: lanemq_store::HistogramSnapshot| HistogramFigures {
            buckets: h.buckets,
            sum: h.sum,
            count: h.count,
        };
        let log = LogFigures {
            appended_records: n(&ls.appended_records),
            appended_bytes: n(&ls.appended_bytes),
            batches: n(&ls.batches),
            fsyncs: n(&ls.fsyncs),
            append_waits: n(&ls.append_waits),
            segments: store.segment_count() as u64,
            segment_bytes: store.size_bytes(),
            first_offset: store.first_offset(),
            next_offset: store.next_offset(),
            committed_offset: store.committed_offset(),
            queued_records: store.queued_records() as u64,
            failed: store.failure().is_some(),
            fsync_seconds: hist(ls.fsync_seconds.snapshot()),
            batch_records: hist(ls.batch_records.snapshot()),
        };
        let now_us = lanemq_store::now_us();
        let mut streams = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let (page, more) = b.streams.list(after.as_deref(), 1000);
            after = page.last().map(|s| s.def.name.clone());
            streams.extend(page.into_iter().map(|s| {
                StreamFigures {
                    records: s.stats.message_count,
                    bytes: s.stats.message_bytes,
                    readers: s.stats.subscribers,
                    oldest_age_seconds: s
                        .stats
                        .oldest_timestamp_us
                        .map(|t| now_us.saturating_sub(t) as f64 / 1e6),
                    name: s.def.name,
                }
            }));
            if !more || after.is_none() {
                break;
            }
        }
        let engine = &b.lite.engine;
        let parents_info = engine.list_parents();
        let ids: Vec<(u32, String)> = parents_info
            .iter()
            .filter_map(|p| {
                engine
                    .parent(&p.def.name)
                    .map(|x| (x.id, p.def.name.clone()))
            })
            .collect();
        let figures = self
            .query(move |d| {
                let ready = d.ready_lanes();
                ids.into_iter()
                    .map(|(id, name)| {
                        (
                            name,
                            ready.get(&id).copied().unwrap_or(0),
                            d.group_figures(id),
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        let mut parents = Vec::new();
        let mut groups = Vec::new();
        for (name, ready, gs) in figures {
            let lanes = parents_info
                .iter()
                .find(|p| p.def.name == name)
                .map_or(0, |p| p.lanes);
            parents.push(ParentFigures {
                name: name.clone(),
                lanes,
                ready_lanes: ready,
            });
            // The backlog is computed here, off the dispatcher's thread (short lock holds).
            let wanted: Vec<(String, u64, Option<u64>)> = gs
                .iter()
                .filter(|g| !g.private)
                .map(|g| (g.group.clone(), g.default, g.since))
                .collect();
            let backlogs = engine
                .parent(&name)
                .map(|p| engine.group_backlogs(p.id, &wanted))
                .transpose()
                .unwrap_or_else(|e| {
                    warn!(parent = %name, error = %e, "metrics: group backlog not computed");
                    None
                })
                .unwrap_or_default();
            let mut backlog = backlogs.into_iter();
            groups.extend(gs.into_iter().map(|g| {
                let (lanes_behind, lag_messages) = if g.private {
                    (0, 0)
                } else {
                    backlog.next().unwrap_or((0, 0))
                };
                GroupFigures {
                    parent: name.clone(),
                    group: g.group,
                    members_online: g.members_online,
                    inflight: g.inflight,
                    lanes_behind,
                    lag_messages,
                    dead_letters: g.dead_letters,
                }
            }));
        }
        let total = sessions.len() as u64;
        let cluster = b.cluster.get().map(|c| lanemq_admin::ClusterFigures {
            published: c.published.load(Ordering::Relaxed),
            publish_failures: c.publish_failures.load(Ordering::Relaxed),
            replicated: c.replicated.load(Ordering::Relaxed),
            routed_offset: c.routed.load(Ordering::Relaxed),
            replicator_failed: u64::from(c.failed.load(Ordering::Relaxed)),
            diverged: u64::from(c.diverged.load(Ordering::Relaxed)),
            qos0_dropped: c.qos0_dropped.load(Ordering::Relaxed),
        });
        BrokerMetrics {
            cluster,
            uptime_seconds: b.started.elapsed().as_secs(),
            connections: st.clients_connected.load(Ordering::Relaxed) as u64,
            connections_hibernating: b.lot.parked() as u64,
            connections_accepted: n(&st.connections_accepted),
            connects_refused: refused,
            auth_failures: n(&st.auth_failures),
            sessions_online: online,
            sessions_offline: total.saturating_sub(online),
            subscriptions,
            received: qos(&st.received_qos, &st.received_payload_bytes_qos),
            sent: qos(&st.sent_qos, &st.sent_payload_bytes_qos),
            network_received_bytes: n(&st.bytes_received),
            network_sent_bytes: n(&st.bytes_sent),
            dropped: vec![
                ("queue_full".into(), n(&q.dropped_queue_full)),
                ("queue_full_qos0".into(), n(&q.dropped_qos0)),
                ("packet_too_large".into(), n(&st.dropped_too_large)),
                ("expired".into(), n(&st.dropped_expired)),
            ],
            no_subscribers: n(&st.no_subscribers),
            retained: b.retained_count() as u64,
            inflight,
            queued_messages: queued,
            queued_bytes: q.used() as u64,
            queued_bytes_limit: q.max() as u64,
            spilled: n(&q.spilled),
            slow_consumers_disconnected: n(&q.slow_consumers_disconnected),
            log,
            indexed_offsets: vec![("streams".into(), b.streams.indexed_offset())],
            streams,
            lite: self.lite_metrics(),
            parents,
            groups,
        }
    }

    fn lite_metrics(&self) -> LiteMetrics {
        let engine = &self.broker.lite.engine;
        let c = &engine.counters;
        let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let parents = engine.list_parents();
        LiteMetrics {
            lanes: engine.lane_count() as u64,
            parents: parents.len() as u64,
            lanes_created: n(&c.lanes_created),
            lanes_expired: n(&c.lanes_expired),
            suspended: n(&c.suspended),
            retried: n(&c.retried),
            redelivered: n(&c.redelivered),
            ack_timeouts: n(&c.ack_timeouts),
            dead_lettered: n(&c.dead_lettered),
            committed: n(&c.committed),
            publish_refused: n(&c.publish_refused),
            indexed: n(&c.indexed),
            parent_lanes: parents.into_iter().map(|p| (p.def.name, p.lanes)).collect(),
        }
    }
}

impl BrokerAdmin {
    /// Runs `f` on the lane dispatcher (bounded wait).
    fn query<T: Send + 'static>(
        &self,
        f: impl FnOnce(&crate::lite::Dispatcher) -> T + Send + 'static,
    ) -> Result<T, LiteError> {
        self.broker
            .lite
            .query(f)
            .ok_or_else(|| LiteError::Storage("the lane dispatcher did not answer".into()))
    }
}

fn parent_id(engine: &lanemq_lite::Engine, name: &str) -> Result<u32, LiteError> {
    engine
        .parent(name)
        .map(|p| p.id)
        .ok_or_else(|| LiteError::NotFound(name.into()))
}

/// A group's figures on one lane, with the group name first.
fn with_group(group: &str, gl: &crate::lite::GroupLane) -> Value {
    let mut o = serde_json::Map::new();
    o.insert("group".into(), Value::String(group.to_string()));
    if let Ok(Value::Object(m)) = serde_json::to_value(gl) {
        o.extend(m);
    }
    Value::Object(o)
}

/// The admin API bound and its token loaded, not yet serving. [`prepare`] runs before the
/// broker opens its storage so a busy port or an unreadable token fails the start early.
pub struct Prepared {
    listener: TcpListener,
    addr: SocketAddr,
    token: String,
}

impl Prepared {
    /// The bound address (the real port when `admin.bind` has port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Binds `config.admin.bind` and loads (or generates) the API token.
pub async fn prepare(config: &Config) -> Result<Prepared, String> {
    let bind = config.admin.bind;
    let listener = TcpListener::bind(bind)
        .await
        .map_err(|e| format!("cannot bind the admin API on {bind} (admin.bind): {e}"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("admin API listener on {bind}: {e}"))?;
    let data_dir = config.server.data_dir.clone();
    let file = data_dir.join(lanemq_admin::TOKEN_FILE);
    let configured = config.admin.token.clone();
    let (token, path, existed) = tokio::task::spawn_blocking(move || {
        let existed = data_dir.join(lanemq_admin::TOKEN_FILE).exists();
        lanemq_admin::load_or_create_token(&data_dir, configured.as_deref())
            .map(|(t, p)| (t, p, existed))
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| match config.admin.token {
        Some(_) => format!("admin.token: {e}"),
        None => format!("admin API token ({}): {e}", file.display()),
    })?;
    // Never log the token itself.
    match &path {
        Some(p) if existed => info!("admin API token read from {}", p.display()),
        Some(p) => info!("admin API token written to {}", p.display()),
        None => info!("admin API token from the configuration (admin.token)"),
    }
    Ok(Prepared {
        listener,
        addr,
        token,
    })
}

/// Serves the API until the broker shuts down (then lets running requests finish).
pub fn spawn(broker: Arc<Broker>, prepared: Prepared) -> JoinHandle<()> {
    let Prepared {
        listener,
        addr,
        token,
    } = prepared;
    let opts = lanemq_admin::RouterOptions {
        metrics_public: broker.config.admin.metrics_public,
        ..Default::default()
    };
    let router = lanemq_admin::router_with(Arc::new(BrokerAdmin::new(broker.clone())), token, opts);
    let mut shutdown = broker.shutdown_signal();
    info!(%addr, "admin API listening");
    tokio::spawn(async move {
        let stop = async move {
            while !*shutdown.borrow_and_update() {
                if shutdown.changed().await.is_err() {
                    return;
                }
            }
        };
        if let Err(e) = lanemq_admin::serve(listener, router, stop).await {
            warn!(error = %e, "admin API stopped");
        }
    })
}
