//! Shared broker state: sessions, the router, retained messages, statistics, and the ingest
//! path every accepted PUBLISH (and will) goes through.

use crate::config::Config;
use crate::message::{Delivery, Message};
use crate::router::{Router, Subscriber, Target};
use crate::session::{Kick, PushOutcome, Session};
use lanemq_protocol::topic;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;
use tokio::sync::watch;

#[derive(Default)]
pub struct Stats {
    pub clients_connected: AtomicUsize,
    pub messages_received: AtomicU64,
    pub messages_sent: AtomicU64,
    pub messages_dropped: AtomicU64,
    pub bytes_received: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub auth_failures: AtomicU64,
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
}

/// What ingest did with a message.
#[derive(Debug, Clone, Default)]
pub struct Ingested {
    /// At least one subscription matched.
    pub matched: bool,
    /// Connected sessions whose queue is above its back-pressure mark after this message.
    pub congested: Vec<Arc<Session>>,
}

impl Broker {
    pub fn new(config: Config) -> Arc<Broker> {
        let (shutdown_tx, _) = watch::channel(false);
        Arc::new(Broker {
            config,
            router: RwLock::new(Router::default()),
            sessions: Mutex::new(HashMap::new()),
            retained: RwLock::new(HashMap::new()),
            stats: Stats::default(),
            started: Instant::now(),
            shutdown_tx,
            next_client_seq: AtomicU64::new(1),
        })
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

    fn sessions_lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Arc<Session>>> {
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
    /// ended first. Returns the session and whether an existing one was resumed.
    pub fn open_session(
        &self,
        client_id: &str,
        clean_start: bool,
        make: impl FnOnce() -> Session,
    ) -> (Arc<Session>, bool) {
        let mut map = self.sessions_lock();
        if let Some(existing) = map.get(client_id).cloned() {
            if !clean_start {
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
        let (subs, pending) = {
            let mut st = session.lock();
            st.ended = true;
            st.wake();
            let subs: Vec<String> = st.subscriptions.drain().map(|(f, _)| f).collect();
            (subs, st.drain_pending())
        };
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

    pub fn add_subscription(&self, _session: &Arc<Session>, full_filter: &str, sub: Subscriber) {
        let (group, inner) = split_share(full_filter);
        self.router
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .subscribe(group, inner, sub);
    }

    pub fn remove_subscription(&self, session: &Arc<Session>, full_filter: &str) -> bool {
        let (group, inner) = split_share(full_filter);
        self.router
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .unsubscribe(group, inner, &session.client_id)
    }

    fn push(&self, session: &Arc<Session>, d: Delivery) -> PushOutcome {
        let outcome = session.push(d);
        if outcome == PushOutcome::Dropped {
            self.stats.messages_dropped.fetch_add(1, Ordering::Relaxed);
        }
        outcome
    }

    /// Accept one message: update the retained table, route it to every matching session.
    ///
    /// Seam: the durable store appends here, before the caller acknowledges.
    pub fn ingest(&self, msg: Arc<Message>) -> Ingested {
        self.stats.messages_received.fetch_add(1, Ordering::Relaxed);
        self.ingest_internal(msg)
    }

    /// Ingest without counting the message as received from a client (`$SYS`).
    pub fn ingest_internal(&self, msg: Arc<Message>) -> Ingested {
        if msg.retain {
            let mut r = self.retained.write().unwrap_or_else(|e| e.into_inner());
            if msg.payload.is_empty() {
                r.remove(&msg.topic);
            } else if self.config.mqtt.retain_available {
                r.insert(msg.topic.clone(), msg.clone());
            }
        }
        let mut targets: Vec<Target> = Vec::new();
        self.router.read().unwrap_or_else(|e| e.into_inner()).route(
            &msg.topic,
            &msg.publisher,
            msg.qos,
            &mut targets,
        );
        let mut ingested = Ingested {
            matched: !targets.is_empty(),
            congested: Vec::new(),
        };
        for t in targets {
            let retain = msg.retain && t.retain_as_published;
            let d = Delivery {
                msg: msg.clone(),
                qos: t.qos,
                retain,
                sub_ids: t.sub_ids,
                share: t.share,
            };
            if self.push(&t.session, d) == PushOutcome::Congested {
                ingested.congested.push(t.session);
            }
        }
        ingested
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
