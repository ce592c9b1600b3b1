//! The message path below the connection. Every PUBLISH — a client's, a will, one sent over
//! the REST API — goes through here in two steps, and this module never calls back into the
//! connection that sent it:
//!
//! 1. [`Broker::admit`] classifies the topic **once** (plain, a lane of a lite parent, or
//!    refused by the lite layer: key too long 0x90, lane quota 0x97), marks the message
//!    `in_lane`, and appends its record to the shared log; a lane record gets its lane offset
//!    under the log's append lock ([`lanemq_lite::Engine::assign`]). The caller has the log
//!    offset at once; `on_durable` fires on the storage thread once the record meets the
//!    fsync policy.
//! 2. [`Broker::ingest`] / [`Broker::ingest_with`] deliver a message that is durable (or a QoS
//!    0 message that needs no durability): the retained table, the router, the session
//!    queues, and the index ops that record what a replay must not repeat.
//!    [`Broker::committed`] then wakes the stream indexer and the lane dispatcher, which read
//!    new records from the log themselves (lanes and streams never see a message twice).
//!
//! Invariants: nothing is routed before its record is durable except the QoS 0 fast path,
//! whose index ops wait in `deferred` until it is; the router's read lock is held from the
//! retained-table update to the route ([`Broker::deliver_with`]).

use crate::broker::{Broker, Ingested, API_IDENTITY};
use crate::message::{Delivery, Message, NOT_STORED};
use crate::persist::Op;
use crate::router::{RouteCache, Target};
use crate::session::PushOutcome;
use lanemq_lite::engine::Classified;
use lanemq_protocol::topic;
use lanemq_protocol::QoS;
use lanemq_store::{Callback, RecordIn, StoreError, TryAppendError};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tracing::warn;

/// What [`Broker::admit`] did with a message.
#[derive(Debug)]
pub enum Admitted {
    /// Appended at this log offset.
    Stored(u64),
    /// Not accepted by the lite layer: the PUBACK/PUBREC reason `code`, and why.
    Refused { code: u8, why: String },
}

impl Broker {
    /// Classify `msg` (sets `in_lane`) and append its record; `inbound_pid` is the packet id
    /// of a QoS 2 PUBLISH (stored so a restart restores it). `on_durable` `None`: nobody waits
    /// for the record (a QoS 0 message delivered at once; see
    /// [`lanemq_store::Store::try_append`]). Never blocks the runtime for
    /// long: a full submission queue is waited for with `block_in_place`.
    pub fn admit(
        &self,
        msg: &mut Message,
        inbound_pid: Option<u16>,
        on_durable: Option<Callback>,
    ) -> Result<Admitted, StoreError> {
        match self.classify(&msg.topic) {
            Ok(lane) => self.admit_as(msg, lane, inbound_pid, on_durable),
            Err(refused) => Ok(refused),
        }
    }

    /// The lite layer's verdict on a topic: plain (`None`), the lane `(parent, key)`, or
    /// refused (`Err`, counted).
    pub fn classify(&self, topic: &str) -> Result<Option<(u32, String)>, Admitted> {
        match self.lite.engine.classify(topic) {
            Classified::Plain => Ok(None),
            Classified::Lane { parent, key } => Ok(Some((parent, key))),
            Classified::Refused { code, why } => {
                self.lite
                    .engine
                    .counters
                    .publish_refused
                    .fetch_add(1, Ordering::Relaxed);
                Err(Admitted::Refused { code, why })
            }
        }
    }

    /// [`Broker::admit`] of a message already classified ([`Broker::classify`]). In cluster
    /// mode the record goes to the cluster's log (`crate::cluster`).
    pub fn admit_as(
        &self,
        msg: &mut Message,
        lane: Option<(u32, String)>,
        inbound_pid: Option<u16>,
        on_durable: Option<Callback>,
    ) -> Result<Admitted, StoreError> {
        if let Some(c) = self.cluster.get() {
            return self.cluster_admit(c, msg, lane.is_some(), inbound_pid, on_durable);
        }
        self.admit_local(msg, lane, inbound_pid, on_durable)
    }

    /// [`Broker::admit_as`] into the local log (a single node; cluster mode's replicator).
    pub(crate) fn admit_local(
        &self,
        msg: &mut Message,
        lane: Option<(u32, String)>,
        inbound_pid: Option<u16>,
        on_durable: Option<Callback>,
    ) -> Result<Admitted, StoreError> {
        msg.in_lane = lane.is_some();
        let rec = crate::persist::record_in(msg, inbound_pid);
        let offset = match lane {
            Some((parent, key)) => self.append_lane(rec, on_durable, parent, &key)?,
            None => self.append_plain(rec, on_durable)?,
        };
        Ok(Admitted::Stored(offset))
    }

    /// Cluster mode's replicator: append a record of the cluster's log (already classified)
    /// with an extra index hint; returns its offset.
    pub(crate) fn append_replica(
        &self,
        msg: &mut Message,
        lane: Option<(u32, String)>,
        inbound_pid: Option<u16>,
        hint: Option<lanemq_store::IndexHint>,
        on_durable: Option<Callback>,
    ) -> Result<u64, StoreError> {
        msg.in_lane = lane.is_some();
        let mut rec = crate::persist::record_in(msg, inbound_pid);
        rec.index_hints.extend(hint);
        match lane {
            Some((parent, key)) => self.append_lane(rec, on_durable, parent, &key),
            None => self.append_plain(rec, on_durable),
        }
    }

    /// Append the records of plain messages nobody waits for (QoS 0, not retained, in no
    /// lane: [`Broker::classify`] said so) under one lock of the log, and set their offsets.
    /// They are delivered with [`Broker::deliver_quiet`].
    pub fn admit_quiet(&self, msgs: &mut [Message]) -> Result<(), StoreError> {
        if msgs.is_empty() {
            return Ok(());
        }
        if let Some(c) = self.cluster.get() {
            return self.cluster_admit_quiet(c, msgs);
        }
        let recs: Vec<RecordIn> = msgs
            .iter()
            .map(|m| crate::persist::record_in(m, None))
            .collect();
        let store = &self.persist.store;
        let offsets = match store.try_append_quiet_batch(&recs)? {
            Some(r) => r,
            None => tokio::task::block_in_place(|| store.append_quiet_batch(&recs))?,
        };
        for (m, o) in msgs.iter_mut().zip(offsets) {
            m.offset = o;
        }
        Ok(())
    }

    /// Deliver messages admitted by [`Broker::admit_quiet`], routed through the publisher's
    /// `cache`: one router lock for them all, and one session lock per session they go to
    /// (deliveries to one session are pushed together, in order). Returns how many
    /// deliveries were dropped (a subscriber's QoS 0 budget was full).
    pub fn deliver_quiet(&self, msgs: Vec<Message>, cache: &mut RouteCache) -> u64 {
        /// Beyond this many sessions a batch pushes each delivery on its own (a linear
        /// search per delivery would cost more than the locks it saves).
        const BUCKETS_MAX: usize = 16;
        let mut buckets: Vec<(Arc<crate::session::Session>, Vec<Delivery>)> = Vec::new();
        let mut dropped = 0u64;
        let (mut payload_bytes, mut unmatched) = (0u64, 0u64);
        let n = msgs.len() as u64;
        if msgs.first().is_some_and(|m| m.forwarded) {
            // Cluster mode: every node delivers them as it reads them from the cluster's log.
            let bytes = msgs.iter().map(|m| m.payload.len() as u64).sum();
            self.stats.received_many(QoS::AtMostOnce, n, bytes);
            return 0;
        }
        let router = self.router.read().unwrap_or_else(|e| e.into_inner());
        for m in msgs {
            let msg = Arc::new(m);
            payload_bytes += msg.payload.len() as u64;
            let targets = router.route_cached(&msg.topic, &msg.publisher, msg.qos, cache);
            if targets.is_empty() {
                unmatched += 1;
            }
            for t in targets {
                let d = t.delivery(&msg, false);
                if let Some(b) = buckets.iter_mut().find(|(s, _)| Arc::ptr_eq(s, &t.session)) {
                    b.1.push(d);
                } else if buckets.len() < BUCKETS_MAX {
                    buckets.push((t.session.clone(), vec![d]));
                } else if t.session.push(d, Some(&self.persist)) == PushOutcome::Dropped {
                    dropped += 1;
                }
            }
        }
        drop(router);
        // The counters once per batch (they are shared by every connection's thread).
        self.stats.received_many(QoS::AtMostOnce, n, payload_bytes);
        if unmatched > 0 {
            self.stats
                .no_subscribers
                .fetch_add(unmatched, Ordering::Relaxed);
        }
        for (session, ds) in buckets {
            dropped += session.push_many(ds, Some(&self.persist));
        }
        if dropped > 0 {
            self.stats
                .messages_dropped
                .fetch_add(dropped, Ordering::Relaxed);
        }
        dropped
    }

    /// Append a record that belongs to no lane.
    fn append_plain(&self, rec: RecordIn, on_durable: Option<Callback>) -> Result<u64, StoreError> {
        match self.persist.store.try_append(rec, on_durable) {
            Ok(offset) => Ok(offset),
            Err(TryAppendError::Store(e)) => Err(e),
            Err(TryAppendError::Full(rec, cb)) => {
                let store = self.persist.store.clone();
                tokio::task::block_in_place(move || store.append_blocking(*rec, |_, _| {}, cb))
            }
        }
    }

    /// Append a record of the lane `key` of `parent`: the lane offset is assigned under the
    /// log's append lock and stored in the record.
    fn append_lane(
        &self,
        rec: RecordIn,
        on_durable: Option<Callback>,
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
                tokio::task::block_in_place(move || store.append_blocking(*rec, a, cb))
            }
        }
    }

    /// Deliver a published message that is in the log (or needs none): counts it as
    /// received, then [`Broker::deliver`].
    pub fn ingest(&self, msg: Arc<Message>) -> Ingested {
        self.ingest_with(msg, None)
    }

    /// [`Broker::ingest`]; with `deferred`, as [`Broker::deliver_with`].
    pub fn ingest_with(&self, msg: Arc<Message>, deferred: Option<&mut Vec<Op>>) -> Ingested {
        self.ingest_routed(msg, deferred, None)
    }

    /// Count the message received, deliver it (through `cache` if given), count it routed.
    fn ingest_routed(
        &self,
        msg: Arc<Message>,
        deferred: Option<&mut Vec<Op>>,
        cache: Option<&mut RouteCache>,
    ) -> Ingested {
        self.stats.received(&msg);
        let in_lane = msg.in_lane;
        let ingested = self.deliver_routed(msg, deferred, cache);
        self.stats.routed(&ingested, in_lane);
        ingested
    }

    /// Records were made durable: the stream indexer and the lane dispatcher read them from
    /// the log soon. Cheap; called once per batch of completions.
    pub fn committed(&self) {
        self.streams.poke();
        self.lite.poke();
    }

    /// Apply a stored (or unstored, `$SYS`) message: update the retained table, route it to
    /// every matching session, and record the effects in the index.
    pub fn deliver(&self, msg: Arc<Message>) -> Ingested {
        self.deliver_with(msg, None)
    }

    /// [`Broker::deliver`]; with `deferred`, the retained-table op and the routed marker are
    /// returned there instead of submitted (for a message delivered before it is durable: the
    /// index must never point at a record that may not survive).
    pub fn deliver_with(&self, msg: Arc<Message>, deferred: Option<&mut Vec<Op>>) -> Ingested {
        self.deliver_routed(msg, deferred, None)
    }

    /// [`Broker::deliver_with`] for a client's PUBLISH, routed through its connection's
    /// [`RouteCache`].
    pub fn deliver_cached(
        &self,
        msg: Arc<Message>,
        deferred: Option<&mut Vec<Op>>,
        cache: &mut RouteCache,
    ) -> Ingested {
        self.ingest_routed(msg, deferred, Some(cache))
    }

    fn deliver_routed(
        &self,
        msg: Arc<Message>,
        mut deferred: Option<&mut Vec<Op>>,
        cache: Option<&mut RouteCache>,
    ) -> Ingested {
        if msg.forwarded {
            // Cluster mode: the replicator of every node delivers it (`crate::cluster`).
            return Ingested { matched: true };
        }
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
        let mut own: Vec<Target> = Vec::new();
        let targets: &[Target] = match cache {
            Some(c) => router.route_cached(&msg.topic, &msg.publisher, msg.qos, c),
            None => {
                router.route(&msg.topic, &msg.publisher, msg.qos, &mut own);
                &own
            }
        };
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
            let d = t.delivery(&msg, retain);
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
        let low = self.persist.register_low();
        low.store(self.persist.store.next_offset(), Ordering::SeqCst);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let cb: Callback = Box::new(move |r| {
            let _ = tx.send(r);
        });
        match self.admit(&mut msg, None, Some(cb)) {
            Ok(Admitted::Stored(offset)) => msg.offset = offset,
            Ok(Admitted::Refused { why, .. }) => {
                warn!(topic = %msg.topic, %why, "will message refused by the lite layer; dropped");
                return;
            }
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
        let low = self.persist.register_low();
        low.store(self.persist.store.next_offset(), Ordering::SeqCst);
        let (tx, rx) = std::sync::mpsc::channel();
        let cb: Callback = Box::new(move |r| {
            let _ = tx.send(r);
        });
        match self
            .admit(&mut m, None, Some(cb))
            .map_err(|e| PublishError::Unavailable(format!("cannot store the message: {e}")))?
        {
            Admitted::Stored(offset) => m.offset = offset,
            Admitted::Refused { why, .. } => return Err(PublishError::Invalid(why)),
        }
        let in_lane = m.in_lane;
        let mut offset = m.offset;
        match rx.recv_timeout(std::time::Duration::from_secs(10)) {
            // Cluster mode: the callback says where JetStream stored it; the offset is known
            // once this node's replicator applied it.
            Ok(Ok(o)) => {
                if offset == NOT_STORED {
                    offset = self
                        .cluster_offset(o, std::time::Duration::from_secs(10))
                        .unwrap_or(NOT_STORED);
                }
            }
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
}
