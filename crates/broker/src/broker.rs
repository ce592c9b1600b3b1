//! Shared broker state: sessions, the router, retained messages, statistics, and the ingest
//! path every accepted PUBLISH (and will) goes through.

use crate::config::Config;
use crate::message::NOT_STORED;
use crate::message::{Delivery, Message};
use crate::persist::{Op, Persist};
use crate::router::{Router, Subscriber, Target};
use crate::session::{Kick, PushOutcome, QueueBudget, QueueLimits, Session, Spilled};
use lanemq_protocol::topic;
use lanemq_protocol::QoS;
use lanemq_store::{Callback, RecordIn, StoreError, TryAppendError};
use std::collections::{HashMap, HashSet};
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
}

impl Stats {
    /// Counts one client PUBLISH received (before it is delivered).
    pub fn received(&self, msg: &Message) {
        self.messages_received.fetch_add(1, Ordering::Relaxed);
        let q = msg.qos.as_u8() as usize;
        if let (Some(n), Some(b)) = (
            self.received_qos.get(q),
            self.received_payload_bytes_qos.get(q),
        ) {
            n.fetch_add(1, Ordering::Relaxed);
            b.fetch_add(msg.payload.len() as u64, Ordering::Relaxed);
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
    retained: RwLock<HashMap<Arc<str>, Arc<Message>>>,
    pub stats: Stats,
    pub started: Instant,
    shutdown_tx: watch::Sender<bool>,
    next_client_seq: AtomicU64,
    /// The shared log and the index.
    pub persist: Arc<Persist>,
    /// Password file and ACL, swapped as a whole on reload.
    auth: RwLock<Arc<Auth>>,
    /// Named streams: the registry and the index over the log.
    pub streams: Arc<lanemq_streams::engine::Engine>,
    /// The lite-topic layer: lanes and their consumer groups.
    pub lite: Arc<crate::lite::Lite>,
    /// Bytes of queued messages every session holds in memory (`queued_bytes_max_total`).
    pub queue_budget: Arc<QueueBudget>,
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
        Arc::new(Broker {
            config,
            router: RwLock::new(Router::default()),
            sessions: Mutex::new(HashMap::new()),
            retained: RwLock::new(HashMap::new()),
            stats: Stats::default(),
            started: Instant::now(),
            shutdown_tx,
            next_client_seq: AtomicU64::new(1),
            persist,
            auth: RwLock::new(Arc::new(auth)),
            streams,
            lite,
            queue_budget,
        })
    }

    /// Queue limits of a new session.
    pub fn queue_limits(&self) -> QueueLimits {
        let m = &self.config.mqtt;
        QueueLimits {
            max_queued: m.max_queued_messages,
            bytes_max: m.outbound_buffer_bytes_max,
            overflow: m.queue_overflow,
            budget: self.queue_budget.clone(),
        }
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

    /// Re-read the password file and the ACL (SIGHUP, `POST /api/v5/authorization/reload`).
    /// A file that fails to load is reported and the rules in force stay. Then every
    /// subscription of every session whose client is known is checked against the new rules
    /// ([`Broker::revoke_denied`]); returns how many were revoked.
    pub fn reload_auth(&self) -> Result<u64, String> {
        let auth = Auth::load(&self.config.server)?;
        *self.auth.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(auth);
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
            self.end_session(&existing);
            map = self.sessions_lock();
        }
        let s = Arc::new(make());
        map.insert(s.client_id.clone(), s.clone());
        (s, false)
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

    /// Append a message's record to the log; `on_durable` fires (on the storage thread) once
    /// it meets the durability policy. Never blocks the runtime for long: a full submission
    /// queue is waited for with `block_in_place`.
    pub fn append(&self, rec: RecordIn, on_durable: Callback) -> Result<u64, StoreError> {
        if self.lite.engine.active() {
            if let lanemq_lite::engine::Classified::Lane { parent, key } =
                self.lite.engine.classify(&rec.topic)
            {
                return self.append_lane(rec, on_durable, parent, &key);
            }
        }
        self.append_plain(rec, on_durable)
    }

    /// [`Broker::append`] of a record already known not to belong to a lane.
    pub fn append_plain(&self, rec: RecordIn, on_durable: Callback) -> Result<u64, StoreError> {
        match self.persist.store.try_append(rec, on_durable) {
            Ok(offset) => Ok(offset),
            Err(TryAppendError::Store(e)) => Err(e),
            Err(TryAppendError::Full(rec, cb)) => {
                let store = self.persist.store.clone();
                tokio::task::block_in_place(move || store.append(*rec, cb))
            }
        }
    }

    /// [`Broker::append`] of a message that goes into the lane `key` of `parent`: the lane
    /// offset is assigned under the append lock and stored in the record.
    pub fn append_lane(
        &self,
        rec: RecordIn,
        on_durable: Callback,
        parent: u32,
        key: &str,
    ) -> Result<u64, StoreError> {
        let engine = self.lite.engine.clone();
        let assign = |e: Arc<lanemq_lite::Engine>, key: String| {
            move |pos: u64, hints: &mut Vec<lanemq_store::IndexHint>| {
                hints.push(e.assign(parent, &key, pos));
            }
        };
        match self.persist.store.try_append_with(
            rec,
            assign(engine.clone(), key.to_string()),
            on_durable,
        ) {
            Ok(offset) => Ok(offset),
            Err(TryAppendError::Store(e)) => Err(e),
            Err(TryAppendError::Full(rec, cb)) => {
                let store = self.persist.store.clone();
                let a = assign(engine, key.to_string());
                tokio::task::block_in_place(move || store.append_with(*rec, a, cb))
            }
        }
    }

    /// Deliver a client's message that is in the log (or needs none): counts it as received.
    pub fn ingest(&self, msg: Arc<Message>) -> Ingested {
        self.stats.received(&msg);
        let in_lane = msg.in_lane;
        let ingested = self.deliver(msg);
        self.stats.routed(&ingested, in_lane);
        ingested
    }

    /// Apply a stored (or unstored, `$SYS`) message: update the retained table, route it to
    /// every matching session, and record the effects in the index.
    pub fn deliver(&self, msg: Arc<Message>) -> Ingested {
        self.deliver_with(msg, None)
    }

    /// [`Broker::deliver`]; with `deferred`, the retained-table op and the routed marker are
    /// returned there instead of submitted (for a message delivered before it is durable: the
    /// index must never point at a record that may not survive).
    pub fn deliver_with(&self, msg: Arc<Message>, mut deferred: Option<&mut Vec<Op>>) -> Ingested {
        let stored = msg.offset != NOT_STORED;
        let mut effects = false;
        let mut submit = |op: Op| match deferred.as_mut() {
            Some(v) => v.push(op),
            None => {
                self.persist.submit(op);
            }
        };
        // The router's read lock is held from the retained-table update to the route, and a
        // subscription takes its retained messages under the write lock
        // ([`Broker::add_subscription_retained`]): a new subscription gets a retained
        // message either from the table or live, never both.
        let router = self.router.read().unwrap_or_else(|e| e.into_inner());
        let mut retain_op = None;
        if msg.retain {
            let mut r = self.retained.write().unwrap_or_else(|e| e.into_inner());
            if msg.payload.is_empty() {
                if r.remove(&msg.topic)
                    .is_some_and(|old| old.offset != NOT_STORED)
                {
                    retain_op = Some(Op::Retain {
                        topic: msg.topic.clone(),
                        offset: None,
                    });
                }
            } else if self.config.mqtt.retain_available {
                r.insert(msg.topic.clone(), msg.clone());
                if stored {
                    retain_op = Some(Op::Retain {
                        topic: msg.topic.clone(),
                        offset: Some(msg.offset),
                    });
                }
            }
        }
        let mut targets: Vec<Target> = Vec::new();
        router.route(&msg.topic, &msg.publisher, msg.qos, &mut targets);
        drop(router);
        if let Some(op) = retain_op {
            effects = true;
            submit(op);
        }
        let ingested = Ingested {
            matched: !targets.is_empty(),
        };
        for t in targets {
            let retain = msg.retain && t.retain_as_published;
            let d = Delivery {
                msg: msg.clone(),
                qos: t.qos,
                retain,
                sub_ids: t.sub_ids,
                share: t.share,
                seq: 0,
                stream: None,
                lane: None,
            };
            // A durable queue entry is an effect a replay must not repeat: deliveries to
            // sessions that end with their connection leave nothing in the index, so QoS 1
            // needs no `Routed` marker for them (one per message was most of the index's disk
            // writes). QoS 2 keeps the marker as before: a replay also restores the
            // publisher's inbound packet ids, which must not come back after its PUBREL.
            let qos2 = msg.qos == QoS::ExactlyOnce && d.qos != QoS::AtMostOnce;
            let mut durable = false;
            let outcome = t.session.push_tracked(d, Some(&self.persist), &mut durable);
            if outcome == PushOutcome::Dropped {
                self.stats.messages_dropped.fetch_add(1, Ordering::Relaxed);
            }
            effects |= stored && (durable || qos2);
        }
        if effects {
            submit(Op::Routed { offset: msg.offset });
        }
        ingested
    }

    /// Publish a broker-originated message (a will): append it, deliver it once durable.
    pub fn publish_internal(self: &Arc<Self>, mut msg: Message) {
        let rec = crate::persist::record_in(&msg, None);
        let low = self.persist.register_low();
        low.store(self.persist.store.next_offset(), Ordering::SeqCst);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let cb: Callback = Box::new(move |r| {
            let _ = tx.send(r);
        });
        match self.append(rec, cb) {
            Ok(offset) => msg.offset = offset,
            Err(e) => {
                warn!(error = %e, topic = %msg.topic, "cannot store a will message; dropped");
                return;
            }
        }
        let broker = self.clone();
        tokio::spawn(async move {
            match rx.await {
                Ok(Ok(_)) => {
                    broker.ingest(Arc::new(msg));
                }
                Ok(Err(e)) => warn!(error = %e, "will message not stored; dropped"),
                Err(_) => {}
            }
            drop(low);
        });
    }

    /// Publish a message for the REST API (`POST /api/v5/publish`) as the `api` identity:
    /// the same checks as a client's PUBLISH (topic, `$SYS`, QoS, retain, payload format,
    /// size, ACL), stored, then routed once durable. Blocks until then (call it off the
    /// runtime's workers). Returns the log offset and whether anything matched.
    pub fn publish_api(
        self: &Arc<Self>,
        msg: lanemq_admin::ApiPublish,
    ) -> Result<lanemq_admin::Published, lanemq_admin::PublishError> {
        use lanemq_admin::{PublishError, Published};
        let cfg = &self.config.mqtt;
        let invalid = |m: String| Err(PublishError::Invalid(m));
        if !topic::valid_topic_name(&msg.topic) {
            return invalid(format!("{:?} is not a valid topic name", msg.topic));
        }
        if msg.topic == "$SYS" || msg.topic.starts_with("$SYS/") {
            return invalid("$SYS topics are the broker's own".into());
        }
        if msg.qos > cfg.maximum_qos {
            return invalid(format!("qos {} is above mqtt.maximum_qos", msg.qos));
        }
        if msg.retain && !cfg.retain_available {
            return invalid("retained messages are not available (mqtt.retain_available)".into());
        }
        if msg.payload_format_indicator == Some(1) && std::str::from_utf8(&msg.payload).is_err() {
            return invalid("payload_format_indicator is 1 but the payload is not UTF-8".into());
        }
        if msg.payload.len() > cfg.max_packet_size_bytes as usize {
            return invalid(format!(
                "payload of {} bytes is above mqtt.max_packet_size_bytes",
                msg.payload.len()
            ));
        }
        let auth = self.auth();
        let req = lanemq_acl::Request {
            username: Some(API_IDENTITY),
            client_id: API_IDENTITY,
            ip: std::net::IpAddr::from([127, 0, 0, 1]),
            action: lanemq_acl::Action::Publish,
            topic: &msg.topic,
        };
        if !auth.acl.check(&req).allowed {
            return Err(PublishError::NotAuthorized(format!(
                "the ACL denies user {API_IDENTITY:?} publishing to {:?}",
                msg.topic
            )));
        }
        let props = lanemq_protocol::PublishProperties {
            payload_format_indicator: msg.payload_format_indicator,
            message_expiry_interval: msg.message_expiry_interval,
            content_type: msg.content_type,
            response_topic: msg.response_topic,
            correlation_data: msg.correlation_data.map(bytes::Bytes::from),
            user_properties: msg.user_properties,
            ..Default::default()
        };
        let mut m = Message::new(
            msg.topic.as_str().into(),
            bytes::Bytes::from(msg.payload),
            QoS::from_u8(msg.qos).unwrap_or(QoS::AtMostOnce),
            msg.retain,
            props,
            API_IDENTITY.into(),
        );
        m.username = Some(API_IDENTITY.into());
        let rec = crate::persist::record_in(&m, None);
        let low = self.persist.register_low();
        low.store(self.persist.store.next_offset(), Ordering::SeqCst);
        let (tx, rx) = std::sync::mpsc::channel();
        let cb: Callback = Box::new(move |r| {
            let _ = tx.send(r);
        });
        let in_lane = self.lite.engine.active()
            && matches!(
                self.lite.engine.classify(&msg.topic),
                lanemq_lite::engine::Classified::Lane { .. }
            );
        m.offset = self
            .append(rec, cb)
            .map_err(|e| PublishError::Unavailable(format!("cannot store the message: {e}")))?;
        m.in_lane = in_lane;
        let offset = m.offset;
        match rx.recv_timeout(std::time::Duration::from_secs(10)) {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(PublishError::Unavailable(format!(
                    "the message was not stored: {e}"
                )))
            }
            Err(_) => {
                return Err(PublishError::Unavailable(
                    "the store did not answer within 10 s".into(),
                ))
            }
        }
        let ingested = self.ingest(Arc::new(m));
        drop(low);
        Ok(if ingested.matched || in_lane {
            Published::Delivered(offset)
        } else {
            Published::NoSubscribers(offset)
        })
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

/// What [`Broker::restore`] found, for the log line and for the timers to start.
#[derive(Default)]
pub struct Restored {
    pub sessions: usize,
    pub sessions_expired: usize,
    pub queued: usize,
    pub retained: usize,
    pub replayed: u64,
    /// Offline sessions and the seconds left before they expire (u32::MAX: never).
    pub expiries: Vec<(Arc<Session>, u32)>,
    /// Pending wills: (client, message, seconds until due).
    pub wills: Vec<(Arc<str>, Message, u64)>,
}

impl Broker {
    /// Rebuild sessions, subscriptions, queues, inflight state and retained messages from the
    /// index, then replay the log from the index watermark. Blocking; run before listening.
    pub fn restore(self: &Arc<Self>) -> Result<Restored, crate::persist::PersistError> {
        use crate::persist::record_pid;
        use crate::session::{Inflight, InflightStage, Subscription};
        use crate::sub_codec::decode_sub;
        let p = self.persist.clone();
        let mut out = Restored::default();
        let now = crate::message::now_us();
        // Retained messages.
        for (topic, offset, carried) in p.load_retained()? {
            if let Some(r) = carried {
                let m = crate::persist::carried_message(&r, offset);
                self.retained
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(topic.into(), Arc::new(m));
                out.retained += 1;
                continue;
            }
            match p.store.read(offset) {
                Ok(r) => {
                    let m = Message::from_record(&r);
                    self.retained
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(topic.into(), Arc::new(m));
                    out.retained += 1;
                }
                Err(e) => {
                    warn!(%topic, offset, error = %e, "retained message not in the log; dropped")
                }
            }
        }
        // Sessions.
        let wills: HashMap<String, RecordIn> = p.load_wills()?.into_iter().collect();
        for (client, meta) in p.load_sessions()? {
            let away_s = if meta.disconnected_at_us == 0 {
                0
            } else {
                now.saturating_sub(meta.disconnected_at_us) / 1_000_000
            };
            let will = wills.get(&client);
            if meta.expiry_s != u32::MAX && away_s >= u64::from(meta.expiry_s) {
                p.remove_session_now(&client)?;
                out.sessions_expired += 1;
                if let Some(w) = will {
                    out.wills.push((client.as_str().into(), will_message(w), 0));
                }
                continue;
            }
            let left = if meta.expiry_s == u32::MAX {
                u32::MAX
            } else {
                meta.expiry_s - away_s as u32
            };
            let protocol = match meta.protocol {
                5 => lanemq_protocol::ProtocolVersion::V5,
                3 => lanemq_protocol::ProtocolVersion::V31,
                _ => lanemq_protocol::ProtocolVersion::V311,
            };
            let client_id: Arc<str> = client.as_str().into();
            let session = Arc::new(Session::new(
                client_id.clone(),
                protocol,
                self.queue_limits(),
            ));
            let subs = p.load_subs(&client)?;
            let queue = p.load_queue(&client)?;
            let inflight: HashMap<u64, (u16, u8)> = p
                .load_inflight(&client)?
                .into_iter()
                .map(|(pid, seq, stage)| (seq, (pid, stage)))
                .collect();
            let inbound = p.load_inbound(&client)?;
            let queued_seqs: HashSet<u64> = queue.iter().map(|q| q.seq).collect();
            for (&seq, &(pid, _)) in &inflight {
                if !queued_seqs.contains(&seq) {
                    // Its delivery finished just before a crash: forget the stale state.
                    p.submit(Op::InflightRemove {
                        client: client_id.clone(),
                        pid,
                    });
                }
            }
            let max_seq = queue
                .iter()
                .map(|q| q.seq)
                .chain(inflight.keys().copied())
                .max()
                .unwrap_or(0);
            {
                let mut st = session.lock();
                st.expiry_s = meta.expiry_s;
                st.next_seq = max_seq + 1;
                let mut seen = HashSet::new();
                for (filter, v) in &subs {
                    let (options, sub_id) = decode_sub(v);
                    st.subscriptions
                        .insert(filter.clone(), Subscription { options, sub_id });
                }
                let (first, end) = (p.store.first_offset(), p.store.committed_offset());
                for row in queue {
                    let crate::persist::QueuedRow {
                        seq,
                        offset,
                        qos,
                        retain,
                        carried,
                    } = row;
                    st.next_seq = st.next_seq.max(seq + 1);
                    if carried.is_none() && (offset < first || offset >= end) {
                        warn!(%client, offset, "queued message not in the log; dropped");
                        p.submit(Op::QueueRemove {
                            client: client_id.clone(),
                            seq,
                        });
                        continue;
                    }
                    seen.insert(offset);
                    let qos = QoS::from_u8(qos).unwrap_or(QoS::AtLeastOnce);
                    let Some(&(pid, stage)) = inflight.get(&seq) else {
                        // Not sent yet: a log position, read when the client takes it.
                        st.spilled
                            .push_back(Spilled::restored(offset, seq, qos, retain));
                        out.queued += 1;
                        continue;
                    };
                    let msg = match carried {
                        Some(r) => Arc::new(crate::persist::carried_message(&r, offset)),
                        None => match p.store.read(offset) {
                            Ok(r) => Arc::new(Message::from_record(&r)),
                            Err(e) => {
                                warn!(%client, offset, error = %e, "queued message not in the log; dropped");
                                continue;
                            }
                        },
                    };
                    let d = Delivery {
                        msg,
                        qos,
                        retain,
                        sub_ids: Vec::new(),
                        share: None,
                        seq,
                        stream: None,
                        lane: None,
                    };
                    let stage = match stage {
                        1 => InflightStage::PubAck,
                        2 => InflightStage::PubRec,
                        _ => InflightStage::PubComp,
                    };
                    st.pids_in_use.insert(pid);
                    st.inflight.push_back(Inflight {
                        packet_id: pid,
                        stage,
                        delivery: d,
                    });
                    out.queued += 1;
                }
                for (pid, _offset, received) in &inbound {
                    if *received {
                        st.inbound_qos2.insert(*pid);
                    }
                }
                st.replay_offsets = Some(Box::new(seen));
                for (filter, s) in p.load_stream_subs(&client)? {
                    st.stream_subs.insert(
                        filter.clone(),
                        crate::stream_sub::StreamSub::restored(filter, s),
                    );
                }
            }
            // Subscriptions go into the router (lock order: router after the session lock
            // was released).
            for (filter, v) in &subs {
                let (options, sub_id) = decode_sub(v);
                if crate::sub_codec::is_lane_replay(v) {
                    if let Some((parent, sel)) = self.lite.lane_filter(filter) {
                        // A private one-lane replay: it goes on from its stored position.
                        self.lite
                            .send(crate::lite::Event::Join(Box::new(crate::lite::Join {
                                session: session.clone(),
                                filter: filter.clone(),
                                group: None,
                                parent,
                                sel,
                                inner: filter.clone(),
                                qos: options.qos.min(QoS::AtLeastOnce),
                                sub_id,
                                start: None,
                                stored: true,
                            })));
                        continue;
                    }
                }
                self.add_subscription(
                    &session,
                    filter,
                    Subscriber {
                        session: session.clone(),
                        options,
                        sub_id,
                    },
                );
            }
            self.sessions_lock()
                .insert(client_id.clone(), session.clone());
            if let Some(w) = will {
                let delay = u64::from(meta.will_delay_s.min(left));
                let due = if meta.disconnected_at_us == 0 {
                    delay
                } else {
                    delay.saturating_sub(away_s)
                };
                out.wills.push((client_id.clone(), will_message(w), due));
            }
            out.expiries.push((session, left));
            out.sessions += 1;
        }
        // Replay what the index may not have: records after the watermark.
        let inbound_state: Mutex<HashMap<(String, u16), u64>> = Mutex::new(HashMap::new());
        for s in self.sessions_lock().values() {
            for (pid, offset, _) in p.load_inbound(&s.client_id)? {
                inbound_state
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert((s.client_id.to_string(), pid), offset);
            }
        }
        // The index thread runs from here on; a low-watermark cell keeps it from moving the
        // watermark past records not replayed yet.
        let from = p.index.watermark()?.max(p.store.first_offset());
        let low = p.register_low();
        low.store(from, Ordering::SeqCst);
        p.start();
        let end = p.store.committed_offset();
        let mut reader = p.store.reader(from);
        let mut replayed = 0u64;
        'replay: loop {
            let batch = reader.next_batch(1024, 4 << 20)?;
            if batch.is_empty() {
                break;
            }
            for r in &batch {
                if r.offset >= end {
                    break 'replay;
                }
                low.store(r.offset, Ordering::SeqCst);
                replayed += 1;
                if p.is_routed(r.offset)? {
                    continue;
                }
                if let (2, Some(pid)) = (r.qos, record_pid(r)) {
                    if let Some(s) = self.get_session(&r.client_id) {
                        let key = (r.client_id.clone(), pid);
                        let mut known = inbound_state.lock().unwrap_or_else(|e| e.into_inner());
                        if known.get(&key).is_none_or(|&o| o < r.offset) {
                            known.insert(key, r.offset);
                            s.lock().inbound_qos2.insert(pid);
                            p.submit(Op::InboundAdd {
                                client: s.client_id.clone(),
                                pid,
                                offset: r.offset,
                            });
                        }
                    }
                }
                self.deliver(Arc::new(Message::from_record(r)));
            }
        }
        drop(low);
        out.replayed = replayed;
        for s in self.sessions_lock().values() {
            s.lock().replay_offsets = None;
        }
        Ok(out)
    }
}

fn will_message(r: &RecordIn) -> Message {
    let mut m = Message::new(
        r.topic.as_str().into(),
        r.payload.clone(),
        QoS::from_u8(r.qos).unwrap_or(QoS::AtMostOnce),
        r.retain,
        crate::message::from_store_properties(&r.properties),
        r.client_id.as_str().into(),
    );
    m.offset = NOT_STORED;
    m
}
