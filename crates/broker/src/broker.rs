//! Shared broker state: sessions, the router, retained messages, statistics, and the
//! authentication in force. The path a PUBLISH takes through them is `ingest.rs`.

use crate::config::Config;
use crate::message::NOT_STORED;
use crate::message::{Delivery, Message};
use crate::persist::{Op, Persist};
use crate::router::{Router, Subscriber};
use crate::session::{Kick, PushOutcome, QueueBudget, QueueLimits, Session, Spilled};
use lanemq_protocol::topic;
use lanemq_protocol::QoS;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;
use tokio::sync::watch;
use tracing::warn;

#[derive(Default)]
pub struct Stats {
    pub clients_connected: AtomicUsize,
    pub messages_received: AtomicU64,
    pub messages_sent: AtomicU64,
    pub messages_dropped: AtomicU64,
    pub bytes_received: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub auth_failures: AtomicU64,
    /// Subscriptions removed because a reloaded ACL (or the ACL at a reconnect) denies them.
    pub subscriptions_revoked: AtomicU64,
    /// Connections that completed the handshake (CONNACK 0x00) since start.
    pub connections_accepted: AtomicU64,
    /// CONNECTs refused, by CONNACK reason code (refusals are rare: a lock is fine).
    pub connects_refused: Mutex<std::collections::BTreeMap<u8, u64>>,
    /// Client PUBLISHes received, by QoS.
    pub received_qos: [AtomicU64; 3],
    /// Payload bytes of those PUBLISHes, by QoS.
    pub received_payload_bytes_qos: [AtomicU64; 3],
    /// PUBLISH packets sent to clients, by QoS (of the delivery).
    pub sent_qos: [AtomicU64; 3],
    /// Payload bytes of those PUBLISHes, by QoS.
    pub sent_payload_bytes_qos: [AtomicU64; 3],
    /// Deliveries discarded because the packet exceeded the client's Maximum Packet Size.
    pub dropped_too_large: AtomicU64,
    /// Queued deliveries discarded because their message expired before they were sent.
    pub dropped_expired: AtomicU64,
    /// Accepted PUBLISHes that matched no subscription (they stay in the log).
    pub no_subscribers: AtomicU64,
}

impl crate::lite::Ingest for Broker {
    fn ingest_stored(&self, msg: Arc<Message>) {
        self.ingest(msg);
    }

    fn publish_clustered(&self, msg: &Message) -> bool {
        if !self.clustered() {
            return false;
        }
        self.cluster_publish_internal(msg);
        true
    }

    fn cluster_node(&self) -> Option<String> {
        self.cluster.get().map(|c| c.link.options().node_id.clone())
    }

    fn lane_op(&self, op: crate::lite::LaneOp) {
        self.cluster_lane_op(op);
    }
}

impl Stats {
    /// Counts one client PUBLISH received (before it is delivered).
    pub fn received(&self, msg: &Message) {
        self.received_many(msg.qos, 1, msg.payload.len() as u64);
    }

    /// Counts `n` received PUBLISHes at `qos` carrying `payload_bytes` in all.
    pub fn received_many(&self, qos: QoS, n: u64, payload_bytes: u64) {
        self.messages_received.fetch_add(n, Ordering::Relaxed);
        let q = qos.as_u8() as usize;
        if let (Some(c), Some(b)) = (
            self.received_qos.get(q),
            self.received_payload_bytes_qos.get(q),
        ) {
            c.fetch_add(n, Ordering::Relaxed);
            b.fetch_add(payload_bytes, Ordering::Relaxed);
        }
    }

    /// Counts a received PUBLISH that matched no subscription (a lane message is kept for
    /// its groups: not counted).
    pub fn routed(&self, ingested: &Ingested, in_lane: bool) {
        if !ingested.matched && !in_lane {
            self.no_subscribers.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one CONNECT refused with CONNACK `code`.
    pub fn refused(&self, code: u8) {
        let mut m = self
            .connects_refused
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *m.entry(code).or_default() += 1;
    }
}

pub struct Broker {
    pub config: Config,
    pub router: RwLock<Router>,
    sessions: Mutex<HashMap<Arc<str>, Arc<Session>>>,
    pub(crate) retained: RwLock<HashMap<Arc<str>, Arc<Message>>>,
    pub stats: Stats,
    pub started: Instant,
    shutdown_tx: watch::Sender<bool>,
    /// Idle plain-TCP connections waiting without a task (`mqtt.idle_hibernate_ms`).
    pub lot: crate::park::Lot,
    next_client_seq: AtomicU64,
    /// The shared log and the index.
    pub persist: Arc<Persist>,
    /// Password file and ACL, swapped as a whole on reload.
    auth: RwLock<Arc<Auth>>,
    /// Bumped after every reload of `auth`: a connection's remembered ACL answer for its last
    /// topic holds while this is unchanged.
    auth_generation: AtomicU64,
    /// Named streams: the registry and the index over the log.
    pub streams: Arc<lanemq_streams::engine::Engine>,
    /// The lite-topic layer: lanes and their consumer groups.
    pub lite: Arc<crate::lite::Lite>,
    /// Bytes of queued messages every session holds in memory (`queued_bytes_max_total`).
    pub queue_budget: Arc<QueueBudget>,
    /// The queue limits every session shares.
    queue_limits: Arc<QueueLimits>,
    /// Cluster mode's link and counters (set once at start; empty on a single node).
    pub cluster: std::sync::OnceLock<crate::cluster_state::Cluster>,
}

/// Authentication and authorization in force.
pub struct Auth {
    /// When set, clients must present a username and a matching password.
    pub passwords: Option<lanemq_acl::PasswordFile>,
    pub acl: lanemq_acl::Acl,
}

impl Auth {
    /// Load the files named in the configuration; every error is reported.
    pub fn load(cfg: &crate::config::ServerConfig) -> Result<Auth, String> {
        let passwords = match &cfg.password_file {
            Some(p) => Some(lanemq_acl::PasswordFile::load(p).map_err(|e| e.to_string())?),
            None => None,
        };
        let acl = match &cfg.acl_file {
            Some(p) => lanemq_acl::Acl::load(p).map_err(|e| e.to_string())?,
            None => lanemq_acl::Acl::embedded_default(),
        };
        Ok(Auth { passwords, acl })
    }
}

/// The username and client id of messages published over the REST API (ACL rules for
/// `user:api` apply to them).
pub const API_IDENTITY: &str = "api";

/// What ingest did with a message.
#[derive(Debug, Clone, Default)]
pub struct Ingested {
    /// At least one subscription matched.
    pub matched: bool,
}

impl Broker {
    pub fn new(
        config: Config,
        persist: Arc<Persist>,
        auth: Auth,
        streams: Arc<lanemq_streams::engine::Engine>,
        lite: Arc<crate::lite::Lite>,
    ) -> Arc<Broker> {
        let (shutdown_tx, _) = watch::channel(false);
        let queue_budget = Arc::new(QueueBudget::new(config.mqtt.queued_bytes_max_total));
        let queue_limits = Arc::new(QueueLimits {
            max_queued: config.mqtt.max_queued_messages,
            bytes_max: config.mqtt.outbound_buffer_bytes_max,
            overflow: config.mqtt.queue_overflow,
            budget: queue_budget.clone(),
        });
        Arc::new(Broker {
            config,
            router: RwLock::new(Router::default()),
            sessions: Mutex::new(HashMap::new()),
            retained: RwLock::new(HashMap::new()),
            stats: Stats::default(),
            started: Instant::now(),
            shutdown_tx,
            lot: crate::park::Lot::new(),
            next_client_seq: AtomicU64::new(1),
            persist,
            auth: RwLock::new(Arc::new(auth)),
            auth_generation: AtomicU64::new(1),
            streams,
            lite,
            queue_limits,
            queue_budget,
            cluster: std::sync::OnceLock::new(),
        })
    }

    /// Queue limits of a new session.
    pub fn queue_limits(&self) -> Arc<QueueLimits> {
        self.queue_limits.clone()
    }

    /// Read the messages of spilled queue entries from the log (`None` where a record cannot
    /// be read: retention removed it, or the log failed; logged). Blocking file reads (at
    /// most 128 records or 64 KiB from a connection): on a multi-thread runtime they run in
    /// `block_in_place`, so the worker's other tasks move to another thread meanwhile.
    pub fn read_spilled(
        &self,
        client: &str,
        entries: Vec<Spilled>,
    ) -> Vec<(Spilled, Option<Arc<Message>>)> {
        use tokio::runtime::{Handle, RuntimeFlavor};
        let multi =
            Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread);
        if multi {
            tokio::task::block_in_place(|| self.read_spilled_now(client, entries))
        } else {
            self.read_spilled_now(client, entries)
        }
    }

    fn read_spilled_now(
        &self,
        client: &str,
        entries: Vec<Spilled>,
    ) -> Vec<(Spilled, Option<Arc<Message>>)> {
        let store = &self.persist.store;
        entries
            .into_iter()
            .map(|sp| {
                if let Some(m) = sp.carried().cloned() {
                    return (sp, Some(m));
                }
                match store.read(sp.offset) {
                Ok(r) => {
                    let m = Arc::new(Message::from_record(&r));
                    (sp, Some(m))
                }
                Err(e) => {
                    // Carried out of the log by retention?
                    let carried = if sp.seq == 0 {
                        Ok(None)
                    } else {
                        self.persist.carried_queued(client, sp.seq, sp.offset)
                    };
                    match carried {
                        Ok(Some(r)) => {
                            let m = Arc::new(crate::persist::carried_message(&r, sp.offset));
                            (sp, Some(m))
                        }
                        _ => {
                            warn!(%client, offset = sp.offset, error = %e, "queued message not in the log; dropped");
                            (sp, None)
                        }
                    }
                }
            }})
            .collect()
    }

    /// The password file and ACL in force.
    pub fn auth(&self) -> Arc<Auth> {
        self.auth.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Changes with every reload of the password file and the ACL (never 0).
    pub fn auth_generation(&self) -> u64 {
        self.auth_generation.load(Ordering::Acquire)
    }

    /// Re-read the password file and the ACL (SIGHUP, `POST /api/v5/authorization/reload`).
    /// A file that fails to load is reported and the rules in force stay. Then every
    /// subscription of every session whose client is known is checked against the new rules
    /// ([`Broker::revoke_denied`]); returns how many were revoked.
    pub fn reload_auth(&self) -> Result<u64, String> {
        let auth = Auth::load(&self.config.server)?;
        *self.auth.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(auth);
        self.auth_generation.fetch_add(1, Ordering::AcqRel);
        let sessions: Vec<Arc<Session>> = self.sessions_lock().values().cloned().collect();
        Ok(sessions.iter().map(|s| self.revoke_denied(s, true)).sum())
    }

    /// Check every subscription of `session` (router, lane group and `$stream/` ones) against
    /// the ACL in force, as the identity of its last connection; remove each one denied (from
    /// the router or the lane group, and from the index for a persistent session), count and
    /// log it. With `kick`, a connected client that lost one is disconnected (MQTT 5:
    /// DISCONNECT 0x87 Not authorized), so it learns of it and resubscribes under the new
    /// rules. A session restored after a restart whose client has not connected since is
    /// left for its next CONNECT (which checks it too). Returns the number revoked.
    pub fn revoke_denied(&self, session: &Arc<Session>, kick: bool) -> u64 {
        let auth = self.auth();
        let (filters, username, ip) = {
            let st = session.lock();
            let Some((username, ip)) = st.identity.clone().filter(|_| !st.ended) else {
                return 0;
            };
            let filters: Vec<String> = st
                .subscriptions
                .keys()
                .chain(st.stream_subs.keys())
                .cloned()
                .collect();
            (filters, username, ip)
        };
        let denied: Vec<String> = filters
            .into_iter()
            .filter(|f| {
                let req = lanemq_acl::Request {
                    username: username.as_deref(),
                    client_id: &session.client_id,
                    ip,
                    action: lanemq_acl::Action::Subscribe,
                    topic: f,
                };
                !auth.acl.check_subscribe(&req, false).allowed
            })
            .collect();
        if denied.is_empty() {
            return 0;
        }
        let mut routed = Vec::new();
        let persistent = {
            let mut st = session.lock();
            for f in &denied {
                if let Some(sub) = st.stream_subs.remove(f) {
                    sub.end();
                    if st.expiry_s > 0 {
                        self.persist.submit(Op::StreamSubRemove {
                            client: session.client_id.clone(),
                            filter: f.clone(),
                        });
                    }
                } else if st.subscriptions.remove(f).is_some() {
                    routed.push(f.clone());
                }
            }
            if kick && st.connected {
                st.kick = Some(Kick::NotAuthorized);
                st.wake();
            }
            st.expiry_s > 0
        };
        for f in &routed {
            self.remove_subscription(session, f);
            if persistent {
                self.persist.submit(Op::SubRemove {
                    client: session.client_id.clone(),
                    filter: f.clone(),
                });
            }
        }
        for f in &denied {
            warn!(client = %session.client_id, filter = %f, "subscription revoked: the ACL in force denies it");
        }
        let n = denied.len() as u64;
        self.stats
            .subscriptions_revoked
            .fetch_add(n, Ordering::Relaxed);
        n
    }

    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown_tx.subscribe()
    }

    /// Ask every connection to end with DISCONNECT 0x8B.
    pub fn begin_shutdown(&self) {
        self.shutdown_tx.send_replace(true);
        let sessions: Vec<Arc<Session>> = self.sessions_lock().values().cloned().collect();
        for s in sessions {
            let mut st = s.lock();
            if st.connected {
                st.kick = Some(Kick::Shutdown);
                st.wake();
            }
        }
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown_tx.borrow()
    }

    pub(crate) fn sessions_lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Arc<Session>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn assign_client_id(&self) -> String {
        let n = self.next_client_seq.fetch_add(1, Ordering::Relaxed);
        format!("lanemq-{:x}-{n}", crate::message::now_us())
    }

    pub fn session_count(&self) -> usize {
        self.sessions_lock().len()
    }

    pub fn get_session(&self, client_id: &str) -> Option<Arc<Session>> {
        self.sessions_lock().get(client_id).cloned()
    }

    /// Find or create the session for a CONNECT. With `clean_start` any existing session is
    /// ended first; so is one that ends with its connection (Session Expiry 0, an MQTT 3.1.1
    /// clean session, or a DISCONNECT that set the expiry to 0), even while that connection
    /// is still closing or is being taken over [MQTT-3.1.2-23, MQTT-3.2.2-3]. Returns the
    /// session and whether an existing one was resumed (Session Present).
    pub fn open_session(
        &self,
        client_id: &str,
        clean_start: bool,
        make: impl FnOnce() -> Session,
    ) -> (Arc<Session>, bool) {
        let mut map = self.sessions_lock();
        if let Some(existing) = map.get(client_id).cloned() {
            let resumable = !clean_start && {
                let st = existing.lock();
                !st.ended && st.expiry_s > 0
            };
            if resumable {
                return (existing, true);
            }
            map.remove(client_id);
            drop(map);
            existing.lock().replaced = true;
            self.end_session(&existing);
            map = self.sessions_lock();
        }
        let s = Arc::new(make());
        map.insert(s.client_id.clone(), s.clone());
        (s, false)
    }

    /// The sessions with a Session Expiry above 0 (cluster mode keeps their records).
    pub(crate) fn persistent_sessions(&self) -> Vec<Arc<Session>> {
        self.sessions_lock()
            .values()
            .filter(|s| {
                let st = s.lock();
                !st.ended && st.expiry_s > 0
            })
            .cloned()
            .collect()
    }

    /// Cluster mode: end a local session handed over to another node (its connection already
    /// saw a newer generation). Its queue and subscriptions go; its record in the sessions
    /// bucket stays (the new owner writes it).
    pub(crate) fn drop_session_for_takeover(&self, session: &Arc<Session>, generation: u64) {
        {
            let st = session.lock();
            if st.generation != generation || st.ended {
                return;
            }
        }
        self.remove_and_end(session);
    }

    /// Take `session` out of the map (if it is still the one there) and end it.
    fn remove_and_end(&self, session: &Arc<Session>) {
        let mut map = self.sessions_lock();
        if map
            .get(&session.client_id)
            .is_some_and(|s| Arc::ptr_eq(s, session))
        {
            map.remove(&session.client_id);
        }
        drop(map);
        self.end_session(session);
    }

    /// `DELETE /api/v5/clients/{clientid}`: a connected client gets DISCONNECT 0x98 (its
    /// session stays if it has an expiry); the stored session of a client that is not
    /// connected is discarded.
    pub fn kick_client(&self, client_id: &str) -> lanemq_admin::Kicked {
        use lanemq_admin::Kicked;
        let Some(session) = self.sessions_lock().get(client_id).cloned() else {
            return Kicked::NotFound;
        };
        let generation = {
            let mut st = session.lock();
            if st.ended {
                return Kicked::NotFound;
            }
            if st.connected {
                st.kick = Some(Kick::Administrative);
                st.wake();
                return Kicked::Disconnected;
            }
            st.generation
        };
        self.expire_session(&session, generation);
        tracing::info!(client = client_id, "admin API: stored session discarded");
        Kicked::Discarded
    }

    /// Remove a session if it is still this one and its generation is `generation` (so a
    /// reconnect in the meantime keeps it).
    pub fn expire_session(&self, session: &Arc<Session>, generation: u64) {
        {
            let st = session.lock();
            if st.generation != generation || st.connected || st.ended {
                return;
            }
        }
        self.remove_and_end(session);
    }

    /// End a session: unsubscribe everything, hand pending shared-subscription messages to
    /// other members of their groups.
    fn end_session(&self, session: &Arc<Session>) {
        self.persist.submit(Op::SessionRemove {
            client: session.client_id.clone(),
        });
        let (subs, pending) = {
            let mut st = session.lock();
            st.ended = true;
            st.wake();
            let subs: Vec<String> = st.subscriptions.drain().map(|(f, _)| f).collect();
            for (_, s) in st.stream_subs.drain() {
                s.end();
            }
            (subs, st.drain_pending())
        };
        let (mut pending, spilled) = pending;
        let shared: Vec<Spilled> = spilled
            .into_iter()
            .filter(|s| s.share().is_some())
            .collect();
        if !shared.is_empty() {
            for (sp, m) in self.read_spilled(&session.client_id, shared) {
                if let Some(m) = m {
                    pending.push(sp.into_delivery(m));
                }
            }
        }
        self.lite.send(crate::lite::Event::Ended(session.clone()));
        {
            let mut router = self.router.write().unwrap_or_else(|e| e.into_inner());
            for f in &subs {
                let (group, inner) = split_share(f);
                router.unsubscribe(group, inner, &session.client_id);
            }
        }
        let router = self.router.read().unwrap_or_else(|e| e.into_inner());
        for d in pending {
            let Some(share) = d.share.clone() else {
                continue;
            };
            if let Some(m) = router.pick_shared(&share.group, &share.filter, &session.client_id) {
                let qos = d.msg.qos.min(m.options.qos);
                self.push(
                    &m.session,
                    Delivery {
                        qos,
                        sub_ids: m.sub_id.into_iter().collect(),
                        ..d
                    },
                );
            }
        }
    }

    pub fn add_subscription(&self, session: &Arc<Session>, full_filter: &str, sub: Subscriber) {
        self.add_subscription_retained(session, full_filter, sub, false);
    }

    /// Add a subscription and, with `want_retained`, take the retained messages its filter
    /// matches in the same step, under the router's write lock: a retained PUBLISH racing
    /// with the SUBSCRIBE reaches it once, from the table or live, never both
    /// ([`Broker::deliver_with`] holds the read lock from the table update to the route).
    pub fn add_subscription_retained(
        &self,
        session: &Arc<Session>,
        full_filter: &str,
        sub: Subscriber,
        want_retained: bool,
    ) -> Vec<Arc<Message>> {
        let (group, inner) = split_share(full_filter);
        if let (Some(g), Some((parent, sel))) = (group, self.lite.lane_filter(inner)) {
            // A lane group (restored or new without `lane-offset`): not in the router.
            self.lite
                .send(crate::lite::Event::Join(Box::new(crate::lite::Join {
                    session: session.clone(),
                    filter: full_filter.to_string(),
                    group: Some(g.to_string()),
                    parent,
                    sel,
                    inner: inner.to_string(),
                    qos: sub.options.qos.min(QoS::AtLeastOnce),
                    sub_id: sub.sub_id,
                    start: None,
                    stored: true,
                })));
            return Vec::new();
        }
        let mut router = self.router.write().unwrap_or_else(|e| e.into_inner());
        router.subscribe(group, inner, sub);
        if want_retained {
            self.retained_matching(inner)
        } else {
            Vec::new()
        }
    }

    /// Turn the shared subscriptions that a lite parent now covers into lane-group members
    /// (after a parent was created or changed at run time): `$share/<g>/<filter>` made while
    /// no parent matched `<filter>` is a plain round-robin group in the router; from now on
    /// its messages go into lanes, so it leaves the router and joins the lane group `<g>`
    /// (QoS at most 1, as for any lane group; its stored form is unchanged and restores as a
    /// lane group). Returns how many were converted.
    pub fn convert_shared_to_lane_groups(&self) -> usize {
        let sessions: Vec<Arc<Session>> = self.sessions_lock().values().cloned().collect();
        let mut converted = 0;
        for session in sessions {
            let candidates: Vec<(String, crate::session::Subscription)> = {
                let st = session.lock();
                if st.ended {
                    continue;
                }
                st.subscriptions
                    .iter()
                    .filter(|(f, _)| {
                        let (group, inner) = split_share(f);
                        group.is_some() && self.lite.lane_filter(inner).is_some()
                    })
                    .map(|(f, s)| (f.clone(), s.clone()))
                    .collect()
            };
            for (filter, sub) in candidates {
                let (Some(group), inner) = split_share(&filter) else {
                    continue;
                };
                let Some((parent, sel)) = self.lite.lane_filter(inner) else {
                    continue;
                };
                // Only those still in the router (a lane group member is not).
                let was_routed = self
                    .router
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .unsubscribe(Some(group), inner, &session.client_id);
                if !was_routed {
                    continue;
                }
                let qos = sub.options.qos.min(QoS::AtLeastOnce);
                if let Some(s) = session.lock().subscriptions.get_mut(&filter) {
                    s.options.qos = qos;
                }
                self.lite
                    .send(crate::lite::Event::Join(Box::new(crate::lite::Join {
                        session: session.clone(),
                        filter: filter.clone(),
                        group: Some(group.to_string()),
                        parent,
                        sel,
                        inner: inner.to_string(),
                        qos,
                        sub_id: sub.sub_id,
                        start: None,
                        stored: true,
                    })));
                tracing::info!(client = %session.client_id, %filter, "shared subscription now a lane group: a lite parent covers its filter");
                converted += 1;
            }
        }
        converted
    }

    pub fn remove_subscription(&self, session: &Arc<Session>, full_filter: &str) -> bool {
        let (group, inner) = split_share(full_filter);
        if self.lite.lane_filter(inner).is_some() {
            self.lite.send(crate::lite::Event::Leave {
                client: session.client_id.clone(),
                filter: full_filter.to_string(),
            });
            if group.is_some() {
                return true;
            }
        }
        self.router
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .unsubscribe(group, inner, &session.client_id)
    }

    fn push(&self, session: &Arc<Session>, d: Delivery) -> PushOutcome {
        let outcome = session.push(d, Some(&self.persist));
        if outcome == PushOutcome::Dropped {
            self.stats.messages_dropped.fetch_add(1, Ordering::Relaxed);
        }
        outcome
    }

    /// Retained messages matching `filter`, not expired (expired ones are removed).
    pub fn retained_matching(&self, filter: &str) -> Vec<Arc<Message>> {
        let now = Instant::now();
        let mut expired = Vec::new();
        let mut out = Vec::new();
        {
            let r = self.retained.read().unwrap_or_else(|e| e.into_inner());
            for (t, m) in r.iter() {
                if topic::matches(filter, t) {
                    if m.is_expired(now) {
                        expired.push(t.clone());
                    } else {
                        out.push(m.clone());
                    }
                }
            }
        }
        if !expired.is_empty() {
            let mut r = self.retained.write().unwrap_or_else(|e| e.into_inner());
            for t in expired {
                if r.get(&t).is_some_and(|m| m.is_expired(now)) {
                    r.remove(&t);
                }
            }
        }
        out.sort_by(|a, b| a.topic.cmp(&b.topic));
        out
    }

    /// Remove the retained message of `topic` without publishing anything (REST
    /// `DELETE /api/v5/mqtt/retainer/message/{topic}`); false if there was none.
    pub fn delete_retained(&self, topic: &str) -> bool {
        let removed = self
            .retained
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(topic);
        match removed {
            Some(old) => {
                if old.offset != NOT_STORED {
                    self.persist.submit(Op::Retain {
                        topic: old.topic.clone(),
                        offset: None,
                    });
                }
                true
            }
            None => false,
        }
    }

    /// Every retained message (topic, message), copied out of the table.
    pub fn retained_snapshot(&self) -> Vec<(Arc<str>, Arc<Message>)> {
        self.retained
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(t, m)| (t.clone(), m.clone()))
            .collect()
    }

    /// Every session, copied out of the table.
    pub(crate) fn sessions_snapshot(&self) -> Vec<Arc<Session>> {
        self.sessions_lock().values().cloned().collect()
    }

    pub fn retained_count(&self) -> usize {
        self.retained
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

/// Split `$share/<group>/<filter>` into `(Some(group), filter)`, anything else into `(None, f)`.
pub fn split_share(full: &str) -> (Option<&str>, &str) {
    match topic::parse_shared(full) {
        Ok(Some(s)) => (Some(s.group), s.filter),
        _ => (None, full),
    }
}
