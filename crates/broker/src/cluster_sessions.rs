//! Cluster mode's persistent sessions (`docs/cluster.md`, "Sessions"): a client whose session
//! lives on one node can reconnect to any other node and resume it.
//!
//! What lives where:
//! - the cluster's sessions bucket (JetStream KV, `<stream>_SESSIONS`) holds, per client id
//!   with a Session Expiry above 0, a [`SessionRecord`]: the node that owns the session, its
//!   subscriptions, and a log offset from which matching records are replayed when it resumes
//!   elsewhere. The owner writes it when the client connects (before CONNACK) and refreshes it
//!   every [`SYNC_EVERY`] while anything changed ([`spawn_sync`]);
//! - a node answers `takeover` requests for the sessions it owns ([`spawn_takeover_server`]):
//!   it disconnects the client (0x8E), hands over the exact queue (log offsets) and its routed
//!   position, and ends its copy of the session;
//! - the node a client connects to ([`adopt`]) asks the owner for the session; when the owner
//!   does not answer (it is down), it resumes from the record in the bucket.
//!
//! Installing a resumed session is done by the replicator (`crate::cluster`), between two
//! records, so that no record is routed twice or missed: the queue handed over, then the
//! records from the owner's position up to this node's routed position matched against the
//! session's subscriptions, then live routing.
//!
//! Invariants: every node has the same log at the same offsets, so a queue entry or a position
//! means the same record everywhere. Taken over from a live owner, nothing is lost or
//! repeated; resumed from the bucket after the owner died, nothing acknowledged is lost and
//! messages after the record's position may come again (QoS 1 and QoS 2 duplicates after a
//! node's crash, as `docs/cluster.md` says).

use crate::broker::Broker;
use crate::cluster_state::{Install, SessionRecord};
use crate::message::{Delivery, Message};
use crate::router::Subscriber;
use crate::session::{Session, Subscription};
use bytes::Bytes;
use lanemq_protocol::{topic, QoS};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, info, warn};

/// How often the owner refreshes the records of its sessions that changed.
pub const SYNC_EVERY: Duration = Duration::from_millis(500);
/// How long a CONNECT waits for the sessions bucket to answer (during a nats-server failure).
const BUCKET_WAIT: Duration = Duration::from_secs(20);
/// How long a node waits for the owner of a session to hand it over.
const TAKEOVER_TIMEOUT: Duration = Duration::from_secs(3);

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

fn unhex6(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    if s.len() != 12 {
        return None;
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The takeover request.
#[derive(Debug, Serialize, Deserialize)]
struct Takeover {
    client: String,
    /// The new connection starts clean: the owner discards the session.
    discard: bool,
}

impl Broker {
    /// The record of a local session as it is now (its exact queue with `with_queue`).
    fn session_record(&self, session: &Session, routed: u64, with_queue: bool) -> SessionRecord {
        let node = self
            .cluster
            .get()
            .map(|c| c.link.options().node_id.clone())
            .unwrap_or_default();
        let st = session.lock();
        let subs = st
            .subscriptions
            .iter()
            .map(|(f, s)| {
                (
                    f.clone(),
                    hex(&crate::sub_codec::encode_sub(&s.options, s.sub_id)),
                )
            })
            .collect();
        let mut queue: Vec<(u64, u8, bool)> = Vec::new();
        for i in st.inflight.iter().filter(|i| i.delivery.stream.is_none()) {
            queue.push((
                i.delivery.msg.offset,
                i.delivery.qos.as_u8(),
                i.delivery.retain,
            ));
        }
        for d in st.queue.iter().filter(|d| d.stream.is_none()) {
            queue.push((d.msg.offset, d.qos.as_u8(), d.retain));
        }
        for s in st.spilled.iter() {
            queue.push((s.offset, s.qos.as_u8(), s.retain));
        }
        queue.retain(|q| q.0 != crate::message::NOT_STORED);
        let first = queue.iter().map(|q| q.0).min().unwrap_or(routed);
        let streams = st
            .stream_subs
            .iter()
            .map(|(f, sub)| (f.clone(), hex(&sub.stored().encode())))
            .collect();
        let claim = self.cluster.get().map_or(0, |c| {
            c.claims
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&session.client_id)
                .copied()
                .unwrap_or(0)
        });
        SessionRecord {
            streams,
            claim,
            node,
            protocol: st.protocol.level(),
            expiry_s: st.expiry_s,
            subs,
            position: if with_queue {
                routed
            } else {
                first.min(routed)
            },
            queue: if with_queue { queue } else { Vec::new() },
        }
    }

    /// What moves a local session's position: the sequence of its deliveries, and the
    /// oldest delivery it still holds (outside its stream subscriptions), if any.
    fn session_activity(session: &Session) -> (u64, Option<u64>) {
        let st = session.lock();
        let inflight = st
            .inflight
            .iter()
            .filter(|i| i.delivery.stream.is_none())
            .map(|i| i.delivery.msg.offset);
        let queued = st
            .queue
            .iter()
            .filter(|d| d.stream.is_none())
            .map(|d| d.msg.offset);
        let spilled = st.spilled.iter().map(|s| s.offset);
        let held = inflight
            .chain(queued)
            .chain(spilled)
            .filter(|o| *o != crate::message::NOT_STORED)
            .min();
        (st.next_seq, held)
    }
}

/// Before a CONNECT opens its session on this node (cluster mode): find the session in the
/// cluster. Returns the record to resume from (`None`: nothing to resume, or `clean_start`).
/// A session owned by another node is taken over from it (its client is disconnected there);
/// when that node does not answer, the record in the bucket is used.
pub async fn adopt(
    broker: &Arc<Broker>,
    client_id: &str,
    clean_start: bool,
) -> Option<SessionRecord> {
    let cluster = broker.cluster.get()?;
    let me = &cluster.link.options().node_id;
    let key = lanemq_cluster::session_key(client_id);
    // JetStream may be electing a leader (a nats-server just died): retry for a while.
    let deadline = tokio::time::Instant::now() + BUCKET_WAIT;
    let stored = loop {
        match cluster.kv.get(&key).await {
            Ok(Some(v)) => break serde_json::from_slice::<SessionRecord>(&v).ok(),
            Ok(None) => break None,
            Err(e) if tokio::time::Instant::now() < deadline => {
                debug!(error = %e, client = client_id, "cluster: sessions bucket not readable; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                warn!(error = %e, client = client_id, "cluster: cannot read the sessions bucket; the session starts here");
                break None;
            }
        }
    }?;
    if stored.node == *me {
        return None; // ours: the local session (if any) is the one
    }
    let req = Takeover {
        client: client_id.to_string(),
        discard: clean_start,
    };
    let body = Bytes::from(serde_json::to_vec(&req).unwrap_or_default());
    let answer = cluster
        .link
        .request(&stored.node, "takeover", body, TAKEOVER_TIMEOUT)
        .await;
    if clean_start {
        if let Err(e) = cluster.kv.delete(&key).await {
            debug!(error = %e, "cluster: cannot delete a session record");
        }
        return None;
    }
    match answer {
        Ok(b) if !b.is_empty() => match serde_json::from_slice::<SessionRecord>(&b) {
            Ok(r) => {
                info!(client = client_id, from = %stored.node, queued = r.queue.len(), "cluster: session taken over");
                Some(r)
            }
            Err(e) => {
                warn!(error = %e, "cluster: a takeover answer is not a session record");
                Some(stored)
            }
        },
        // The owner no longer has it (it expired there): nothing to resume.
        Ok(_) => None,
        Err(e) => {
            if stored.expiry_s == 0 {
                // Its session ended with its connection (the node died): nothing to resume.
                return None;
            }
            let mut stored = stored;
            // The log holds positions newer than the bucket's (written with the
            // acknowledgements): the newest of this claim is where the session resumes.
            if let Some(&(claim, pos)) = cluster
                .positions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(client_id)
            {
                if claim == stored.claim && stored.claim != 0 && pos > stored.position {
                    stored.position = pos;
                }
            }
            info!(client = client_id, owner = %stored.node, error = %e, position = stored.position,
                "cluster: the session's node did not answer; resuming from the sessions bucket");
            Some(stored)
        }
    }
}

/// After the CONNECT's session is open on this node: hand `record` to the replicator to install
/// (waits until it is done), then claim the session in the bucket (expiry above 0).
pub async fn install_and_claim(
    broker: &Arc<Broker>,
    session: &Arc<Session>,
    record: Option<SessionRecord>,
) -> bool {
    let Some(cluster) = broker.cluster.get() else {
        return false;
    };
    let mut resumed = false;
    if let Some(record) = record {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let req = Install {
            session: session.clone(),
            record,
            done: tx,
        };
        if cluster.installs.send(req).is_ok() {
            resumed = rx.await.is_ok();
        }
    }
    claim(broker, session).await;
    resumed
}

/// Write this node's record of `session` to the bucket, under a new claim. A session that
/// ends with its connection (expiry 0) is recorded too, so that a connection with its client
/// id on another node takes it over (it is never resumed from the bucket).
async fn claim(broker: &Arc<Broker>, session: &Arc<Session>) {
    let Some(cluster) = broker.cluster.get() else {
        return;
    };
    let id = new_claim();
    cluster
        .claims
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(session.client_id.clone(), id);
    let routed = broker.persist.store.next_offset();
    let rec = broker.session_record(session, routed, false);
    let key = lanemq_cluster::session_key(&session.client_id);
    if let Ok(v) = serde_json::to_vec(&rec) {
        if let Err(e) = cluster.kv.put(&key, Bytes::from(v)).await {
            warn!(error = %e, client = %session.client_id, "cluster: cannot record the session in the sessions bucket");
        }
    }
}

/// A claim id: the time in ns and a counter, unlikely to repeat across nodes and restarts.
fn new_claim() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (t ^ NEXT
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        .rotate_left(48))
    .max(1)
}

/// Install a resumed session (called by the replicator between two records, when its routed
/// position `routed` is at least `record.position`): the queue handed over, then the records
/// of `record.position..routed` its subscriptions match, then its subscriptions in the router.
pub fn install(broker: &Broker, session: &Arc<Session>, record: &SessionRecord, routed: u64) {
    let mut subs: Vec<(String, Subscription)> = Vec::new();
    for (f, v) in &record.subs {
        let Some(v) = unhex6(v) else { continue };
        let (options, sub_id) = crate::sub_codec::decode_sub(&v);
        subs.push((f.clone(), Subscription { options, sub_id }));
    }
    let store = &broker.persist.store;
    let push = |msg: Arc<Message>, qos: QoS, retain: bool, sub_ids: Vec<u32>| {
        let d = Delivery {
            msg,
            qos,
            retain,
            sub_ids,
            share: None,
            seq: 0,
            stream: None,
            lane: None,
        };
        session.push(d, Some(&broker.persist));
    };
    let mut handed = 0usize;
    for &(offset, qos, retain) in &record.queue {
        match store.read(offset) {
            Ok(r) => {
                push(
                    Arc::new(Message::from_record(&r)),
                    QoS::from_u8(qos).unwrap_or(QoS::AtLeastOnce),
                    retain,
                    Vec::new(),
                );
                handed += 1;
            }
            Err(e) => {
                warn!(offset, error = %e, "cluster: a handed-over queue entry is not in the log")
            }
        }
    }
    // The records the owner had not routed to the session.
    let plain: Vec<&(String, Subscription)> =
        subs.iter().filter(|(f, _)| !f.starts_with('$')).collect();
    let mut replayed = 0usize;
    if !plain.is_empty() && record.position < routed {
        let mut reader = store.reader(record.position);
        'read: loop {
            let batch = match reader.next_batch(1024, 4 << 20) {
                Ok(b) => b,
                Err(e) => {
                    warn!(error = %e, "cluster: cannot read the log to resume a session");
                    break;
                }
            };
            if batch.is_empty() {
                break;
            }
            for r in &batch {
                if r.offset >= routed {
                    break 'read;
                }
                let mut best: Option<QoS> = None;
                let mut rap = false;
                let mut ids = Vec::new();
                for (f, s) in &plain {
                    if !topic::matches(f, &r.topic) {
                        continue;
                    }
                    if s.options.no_local && r.client_id == *session.client_id {
                        continue;
                    }
                    let q = QoS::from_u8(r.qos)
                        .unwrap_or(QoS::AtMostOnce)
                        .min(s.options.qos);
                    best = Some(best.map_or(q, |b| b.max(q)));
                    rap |= s.options.retain_as_published;
                    ids.extend(s.sub_id);
                }
                if let Some(q) = best {
                    let msg = Arc::new(Message::from_record(r));
                    if msg.is_expired(std::time::Instant::now()) {
                        continue;
                    }
                    let retain = r.retain && rap;
                    push(msg, q, retain, ids);
                    replayed += 1;
                }
            }
        }
    }
    let mut streams = 0usize;
    {
        let mut st = session.lock();
        for (f, s) in &subs {
            st.subscriptions.insert(f.clone(), s.clone());
        }
        // Stream subscriptions go on from their acknowledged position (the same stream
        // offsets on every node); the connection starts their feeders.
        for (f, v) in &record.streams {
            let Some(stored) =
                unhex(v).and_then(|b| crate::stream_sub::StoredStreamSub::decode(&b))
            else {
                warn!(filter = %f, "cluster: a stream subscription of a session record is not understood");
                continue;
            };
            if st.expiry_s > 0 {
                broker.persist.submit(crate::persist::Op::StreamSubPut {
                    client: session.client_id.clone(),
                    filter: f.clone(),
                    value: stored.encode(),
                });
            }
            st.stream_subs.insert(
                f.clone(),
                crate::stream_sub::StreamSub::restored(f.clone(), stored),
            );
            streams += 1;
        }
    }
    for (f, s) in &subs {
        if f.starts_with("$stream/") || f.starts_with("$s/") {
            continue;
        }
        broker.persist.submit(crate::persist::Op::SubPut {
            client: session.client_id.clone(),
            filter: f.clone(),
            value: crate::sub_codec::encode_sub(&s.options, s.sub_id),
        });
        broker.add_subscription(
            session,
            f,
            Subscriber {
                session: session.clone(),
                options: s.options,
                sub_id: s.sub_id,
            },
        );
    }
    info!(client = %session.client_id, handed, replayed, streams, from = record.position, to = routed,
        "cluster: session resumed on this node");
}

/// Answer the other nodes' takeover requests for the sessions this node owns.
pub fn spawn_takeover_server(broker: Arc<Broker>) {
    tokio::spawn(async move {
        let Some(cluster) = broker.cluster.get() else {
            return;
        };
        let mut requests = match cluster.link.serve("takeover").await {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "cluster: cannot serve takeover requests");
                return;
            }
        };
        while let Some(req) = requests.next().await {
            let b = broker.clone();
            tokio::spawn(async move {
                let answer = match serde_json::from_slice::<Takeover>(&req.payload) {
                    Ok(t) => hand_over(&b, &t).await,
                    Err(_) => Bytes::new(),
                };
                if let (Some(reply), Some(c)) = (req.reply, b.cluster.get()) {
                    let _ = c.link.respond(reply, answer).await;
                }
            });
        }
    });
}

/// Give up a local session to another node: its connection leaves with 0x8E, then its record
/// with the exact queue is the answer and the session ends here.
async fn hand_over(broker: &Arc<Broker>, t: &Takeover) -> Bytes {
    let Some(session) = broker.get_session(&t.client) else {
        return Bytes::new();
    };
    {
        let mut st = session.lock();
        // As a take-over on one node: the connection sees a newer generation, leaves with
        // 0x8E and no longer touches the session.
        st.generation += 1;
        if st.connected {
            session.set_online(&mut st, false);
        }
        st.wake();
    }
    let routed = broker.replicator_routed();
    let rec = broker.session_record(&session, routed, true);
    let generation = session.lock().generation;
    broker.drop_session_for_takeover(&session, generation);
    if t.discard {
        return Bytes::from_static(b"{}");
    }
    Bytes::from(serde_json::to_vec(&rec).unwrap_or_default())
}

/// Refresh the bucket's records of this node's persistent sessions that changed.
pub fn spawn_sync(broker: Arc<Broker>) {
    tokio::spawn(async move {
        let mut last: HashMap<Arc<str>, SessionRecord> = HashMap::new();
        let mut shutdown = broker.shutdown_signal();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(SYNC_EVERY) => {}
                _ = shutdown.changed() => return,
            }
            let Some(cluster) = broker.cluster.get() else {
                return;
            };
            let routed = broker.replicator_routed();
            // The claims of sessions that ended here go (no lock held while looking).
            let clients: Vec<Arc<str>> = cluster
                .claims
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .keys()
                .cloned()
                .collect();
            let gone: Vec<Arc<str>> = clients
                .into_iter()
                .filter(|c| broker.get_session(c).is_none())
                .collect();
            if !gone.is_empty() {
                let mut claims = cluster.claims.lock().unwrap_or_else(|e| e.into_inner());
                for c in &gone {
                    claims.remove(c);
                }
            }
            let sessions = broker.persistent_sessions();
            let mut seen: HashMap<Arc<str>, SessionRecord> = HashMap::with_capacity(sessions.len());
            for s in sessions {
                let rec = broker.session_record(&s, routed, false);
                let changed = last.get(&s.client_id).is_none_or(|old| {
                    old.subs != rec.subs
                        || old.expiry_s != rec.expiry_s
                        || old.position != rec.position
                        || old.streams != rec.streams
                });
                if changed {
                    let key = lanemq_cluster::session_key(&s.client_id);
                    if let Ok(v) = serde_json::to_vec(&rec) {
                        if let Err(e) = cluster.kv.put(&key, Bytes::from(v)).await {
                            debug!(error = %e, "cluster: session record not refreshed");
                            continue;
                        }
                    }
                }
                seen.insert(s.client_id.clone(), rec);
            }
            last = seen;
        }
    });
}

/// How often the owner writes the positions of its sessions that moved to the log.
pub const POSITIONS_EVERY: Duration = Duration::from_millis(20);

/// Write the positions of this node's persistent sessions that moved (deliveries pushed,
/// acknowledgements received) to the cluster's log, many in one control record, in the
/// batches of the log: a session resumed after this node's death repeats at most what was in
/// flight and the last [`POSITIONS_EVERY`]. A session nothing happened to keeps its last
/// position (the records after it did not match it): writing the routed offset again would
/// itself move every node's routed offset, and again, for ever.
pub fn spawn_positions(broker: Arc<Broker>) {
    tokio::spawn(async move {
        let mut last: HashMap<Arc<str>, (u64, Option<u64>)> = HashMap::new();
        let mut shutdown = broker.shutdown_signal();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(POSITIONS_EVERY) => {}
                _ = shutdown.changed() => return,
            }
            let Some(cluster) = broker.cluster.get() else {
                return;
            };
            let routed = broker.replicator_routed();
            let sessions = broker.persistent_sessions();
            let claims = cluster
                .claims
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let mut moved = Vec::new();
            let mut seen: HashMap<Arc<str>, (u64, Option<u64>)> =
                HashMap::with_capacity(sessions.len());
            for s in sessions {
                let Some(&claim) = claims.get(&s.client_id) else {
                    continue;
                };
                let activity = Broker::session_activity(&s);
                if last.get(&s.client_id) != Some(&activity) {
                    let pos = activity.1.map_or(routed, |h| h.min(routed));
                    moved.push((s.client_id.to_string(), claim, pos));
                }
                seen.insert(s.client_id.clone(), activity);
            }
            last = seen;
            if !moved.is_empty() {
                broker.cluster_positions(moved).await;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let r = SessionRecord {
            node: "n1".into(),
            protocol: 5,
            expiry_s: 600,
            subs: vec![("t/#".into(), hex(&[1, 2, 3, 4, 5, 6]))],
            position: 42,
            queue: vec![(7, 1, false)],
            streams: vec![("$stream/s1".into(), hex(b"\x01abc"))],
            claim: 9,
        };
        let v = serde_json::to_vec(&r).expect("encode");
        assert_eq!(
            serde_json::from_slice::<SessionRecord>(&v).expect("decode"),
            r
        );
        assert_eq!(unhex6(&r.subs[0].1), Some([1, 2, 3, 4, 5, 6]));
        assert_eq!(unhex6("zz"), None);
        assert_eq!(unhex(&r.streams[0].1), Some(b"\x01abc".to_vec()));
        assert_eq!(unhex("abc"), None);
        // A record written before streams and claims existed still reads.
        let old = br#"{"node":"n1","protocol":5,"expiry_s":1,"subs":[],"position":3,"queue":[]}"#;
        let o: SessionRecord = serde_json::from_slice(old).expect("old record");
        assert_eq!((o.claim, o.streams.len()), (0, 0));
    }
}
