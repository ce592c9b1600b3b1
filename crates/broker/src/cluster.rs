//! Cluster mode (`[cluster]`, `docs/cluster.md`): the broker's side of the shared log on NATS
//! JetStream ([`lanemq_cluster::Link`]).
//!
//! In cluster mode the JetStream stream is the log and each node's local log is a replica of
//! it, offset for offset (stream sequence `s` is local offset `s - 1`):
//! - a message a client (or a will, or the REST API) publishes on any node is encoded as a log
//!   record and handed to the link instead of the local log ([`Broker::cluster_admit`]); its
//!   `on_durable` callback fires when JetStream acknowledged it with the stream's
//!   replication, and the message is marked `forwarded`, so the publisher's side does not
//!   route it;
//! - one task per node, the replicator ([`spawn_replicator`]), reads the stream in order from
//!   the local log's end and appends each record locally at the same offset (lanes get their
//!   lane offsets under the local append lock, as on a single node), then delivers it to this
//!   node's sessions once the local record is durable (a QoS 0 message with nothing waiting
//!   before it at once), updates the retained table and wakes the stream indexer and the lane
//!   dispatcher. Every node reads the same records in the same order, so retained messages,
//!   named streams and their `stream-offset` values are the same on every node.
//!
//! Invariants:
//! - in cluster mode nothing but the replicator appends to the local log; an offset the
//!   replicator did not expect stops it (fail-stop, logged), since a replica that lost its
//!   alignment would deliver the wrong messages;
//! - a record that is not a lanemq record (something else published on the log's subjects) is
//!   stored as an empty `$lanemq/void` record, never delivered, so offsets stay aligned.

use crate::broker::Broker;
use crate::cluster_state::{Cluster, RegistryOutcome};
use crate::ingest::Admitted;
use crate::message::{Message, NOT_STORED};
use bytes::Bytes;
use lanemq_cluster::{Ack, ClusterError, Done, Frame, ReadCheck};
use lanemq_store::{Callback, RecordIn, StoreError};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tracing::{error, info, warn};

/// How often the replicator logs its progress (when it appended anything).
const REPORT_EVERY: Duration = Duration::from_secs(10);
/// How long the log's feed may be silent while the stream holds unread records.
const STALL_CHECK: Duration = Duration::from_secs(2);
/// A feed that gives, at one sequence, a message other than the one JetStream acknowledged to
/// this node there is opened again after this pause...
const REREAD_PAUSE: Duration = Duration::from_millis(500);
/// ...for at most this long: a copy that never agrees with the ack means the ack named a
/// message the cluster's log does not hold there, and the node stops (fail-stop).
const REREAD_MAX: Duration = Duration::from_secs(120);

/// The topic of the placeholder record stored for a stream message that is not a lanemq record.
pub const VOID_TOPIC: &str = "$lanemq/void";

/// Where an empty local log starts to follow the cluster's stream: its first message (offset
/// 0) while nothing was ever removed from the stream's head, else the newest offset mark
/// ([`lanemq_cluster::Link::mark`]) that is still in the stream.
pub fn join_point(
    state: lanemq_cluster::StreamState,
    mark: Option<(u64, u64)>,
) -> Result<Position, String> {
    if state.first_seq <= 1 {
        return Ok(Position { seq: 1, offset: 0 });
    }
    match mark {
        Some((seq, offset)) if seq >= state.first_seq => Ok(Position { seq, offset }),
        _ => Err(format!(
            "the cluster's log starts at stream sequence {} (its limits removed the records \
             before) and holds no offset mark this node could start from; start this node \
             once a running node wrote one (every 30 s)",
            state.first_seq
        )),
    }
}

/// Check that the local log, continuing the stream at `p` ([`resume_point`]), can follow
/// the cluster's stream.
pub fn check_alignment(p: Position, state: lanemq_cluster::StreamState) -> Result<(), String> {
    if p.seq > state.last_seq + 1 {
        return Err(format!(
            "this node's log continues the cluster's log at stream sequence {} but the \
             cluster's log ends at sequence {}: the data directory belongs to another log (a \
             single-node broker, or a stream that was deleted); start this node with an empty \
             data directory",
            p.seq, state.last_seq
        ));
    }
    if p.seq < state.first_seq {
        return Err(format!(
            "this node's log continues the cluster's log at stream sequence {} but the \
             cluster's log now starts at sequence {}: the records between were removed by the \
             stream's limits before this node read them; start this node with an empty data \
             directory",
            p.seq, state.first_seq
        ));
    }
    Ok(())
}

/// The record a message is published as (the local log's encoding, offset 0).
fn encode(msg: &Message, pid: Option<u16>) -> Result<Bytes, StoreError> {
    let rec = crate::persist::record_in(msg, pid);
    lanemq_store::record::encode_record(0, msg.timestamp_us, rec)
        .map(Bytes::from)
        .map_err(|why| StoreError::Cluster(format!("cannot encode the record: {why}")))
}

impl Broker {
    /// Cluster mode is on.
    pub fn clustered(&self) -> bool {
        self.cluster.get().is_some()
    }

    /// Cluster mode: every record below this offset has been routed to this node's sessions.
    pub fn replicator_routed(&self) -> u64 {
        self.cluster
            .get()
            .map_or(0, |c| c.routed.load(Ordering::SeqCst))
    }

    /// Cluster mode's [`Broker::admit_as`]: hand the record to the cluster's log. The message
    /// is marked `forwarded` (the replicator delivers it on every node); `on_durable` fires
    /// once JetStream stored it, with an ack token ([`ack_token`]; the log offset is known
    /// once the replicator applied it: [`Broker::cluster_offset`]).
    pub(crate) fn cluster_admit(
        &self,
        cluster: &Cluster,
        msg: &mut Message,
        lane: bool,
        inbound_pid: Option<u16>,
        on_durable: Option<Callback>,
    ) -> Result<Admitted, StoreError> {
        msg.in_lane = lane;
        msg.forwarded = true;
        let payload = encode(msg, inbound_pid)?;
        let done: Option<Done> = on_durable.map(|cb| {
            let failures = cluster.publish_failures.clone();
            let c: Done = Box::new(move |r: Result<Ack, ClusterError>| {
                if r.is_err() {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
                cb(r.map(ack_token)
                    .map_err(|e| StoreError::Cluster(e.to_string())));
            });
            c
        });
        self.cluster_send(cluster, payload, done)?;
        Ok(Admitted::Stored(NOT_STORED))
    }

    /// Hand one encoded record to the link, waiting (off the runtime's hot path) while its
    /// queue is full.
    fn cluster_send(
        &self,
        cluster: &Cluster,
        payload: Bytes,
        done: Option<Done>,
    ) -> Result<(), StoreError> {
        cluster.published.fetch_add(1, Ordering::Relaxed);
        match cluster.link.try_publish(payload, done) {
            Ok(()) => Ok(()),
            Err((payload, done)) => {
                let link = cluster.link.clone();
                tokio::task::block_in_place(move || link.publish_blocking(payload, done))
                    .map_err(|e| StoreError::Cluster(e.to_string()))
            }
        }
    }

    /// Cluster mode's [`Broker::admit_quiet`]: QoS 0 records nobody waits for, in order (the
    /// batch of one read of one connection). They are paced as on a single node: while the
    /// cluster's log is congested ([`QUIET_UNACKED_MAX`] records or more this node handed
    /// over wait for JetStream's acknowledgement, or its replicator is more than
    /// [`QUIET_LAG_MAX`] frames behind what JetStream acknowledged to it) each publisher may
    /// hand over [`QUIET_PER_WINDOW`]
    /// messages per [`QUIET_WINDOW`] and the rest are dropped and counted
    /// (`cluster_qos0_dropped`): a flooding client loses most of its messages, a client at a
    /// modest rate none. A full queue drops what does not fit.
    pub(crate) fn cluster_admit_quiet(
        &self,
        cluster: &Cluster,
        msgs: &mut [Message],
    ) -> Result<(), StoreError> {
        let congested = cluster.link.unacked() >= QUIET_UNACKED_MAX
            || cluster
                .link
                .acked_seq()
                .saturating_sub(cluster.applied_seq.load(Ordering::Relaxed))
                > QUIET_LAG_MAX;
        // While congested, each publisher gets QUIET_PER_WINDOW messages per QUIET_WINDOW:
        // the flooders lose what is above; a client at a modest rate loses nothing.
        let allowed = if congested && !msgs.is_empty() {
            let now = std::time::Instant::now();
            let mut budgets = cluster
                .quiet_budgets
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if budgets.len() > QUIET_BUDGETS_MAX {
                budgets.retain(|_, (since, _)| now.duration_since(*since) < QUIET_WINDOW);
            }
            let b = budgets.entry(msgs[0].publisher.clone()).or_insert((now, 0));
            if now.duration_since(b.0) >= QUIET_WINDOW {
                *b = (now, 0);
            }
            let take = QUIET_PER_WINDOW.saturating_sub(b.1).min(msgs.len());
            b.1 += take;
            take
        } else {
            msgs.len()
        };
        let mut dropped = 0usize;
        for (i, m) in msgs.iter_mut().enumerate() {
            m.forwarded = true;
            if i >= allowed {
                dropped += 1;
                continue;
            }
            let payload = encode(m, None)?;
            if cluster.link.try_publish(payload, None).is_err() {
                dropped += 1;
            } else {
                cluster.published.fetch_add(1, Ordering::Relaxed);
            }
        }
        if dropped > 0 {
            cluster
                .qos0_dropped
                .fetch_add(dropped as u64, Ordering::Relaxed);
            self.stats
                .messages_dropped
                .fetch_add(dropped as u64, Ordering::Relaxed);
            tracing::debug!(client_id = %msgs[0].publisher, dropped, "cluster: QoS 0 messages dropped (the cluster's log is congested)");
        }
        Ok(())
    }

    /// Publish a message built by the broker itself (a dead letter) through the cluster; every
    /// node stores and delivers it from the log.
    pub(crate) fn cluster_publish_internal(&self, msg: &Message) {
        let Some(cluster) = self.cluster.get() else {
            return;
        };
        let payload = match encode(msg, None) {
            Ok(p) => p,
            Err(e) => {
                warn!(error = %e, topic = %msg.topic, "cannot publish to the cluster");
                return;
            }
        };
        let topic = msg.topic.clone();
        let done: Done = Box::new(move |r| {
            if let Err(e) = r {
                warn!(error = %e, %topic, "the cluster did not store a broker message");
            }
        });
        cluster.published.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = cluster.link.publish_blocking(payload, Some(done)) {
            warn!(error = %e, "cannot publish to the cluster");
        }
    }

    /// Cluster mode: the log offset of a record JetStream acknowledged ([`ack_token`]), once
    /// this node's replicator applied it (waits up to `wait`; blocks: call it off the
    /// runtime's workers). `None` when it did not come in time.
    pub fn cluster_offset(&self, token: u64, wait: Duration) -> Option<u64> {
        let cluster = self.cluster.get()?;
        let (seq, index) = (token >> ACK_INDEX_BITS, token & ((1 << ACK_INDEX_BITS) - 1));
        let deadline = std::time::Instant::now() + wait;
        loop {
            {
                let applied = cluster.applied.lock().unwrap_or_else(|e| e.into_inner());
                if let Some((_, base)) = applied.iter().rev().find(|(s, _)| *s == seq) {
                    return Some(base + index);
                }
                if applied.front().is_some_and(|(s, _)| *s > seq) {
                    return None;
                }
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Bits of an ack token that hold the record's index in its batch.
const ACK_INDEX_BITS: u32 = 20;

/// What a cluster-mode `on_durable` callback gets instead of a log offset: the stream
/// sequence and the record's index in its batch, packed (the offset itself is known once the
/// replicator applied the message: [`Broker::cluster_offset`]).
pub fn ack_token(a: Ack) -> u64 {
    (a.seq << ACK_INDEX_BITS) | u64::from(a.index)
}

/// The cluster's log is congested for QoS 0 while this node's replicator is more than this
/// many stream messages behind what JetStream acknowledged to it ...
const QUIET_LAG_MAX: u64 = 2;
/// ... or while this many records it handed over wait for JetStream's acknowledgement (queued
/// or in the window). Both bound what a paced client's message waits behind: at a flood's
/// rate (about 120 k records/s on 2 cores) 2048 records are 17 ms.
const QUIET_UNACKED_MAX: usize = 2048;
/// While the log is congested, QoS 0 messages each publisher may hand over per window.
const QUIET_PER_WINDOW: usize = 64;
/// The window of [`QUIET_PER_WINDOW`].
const QUIET_WINDOW: Duration = Duration::from_millis(10);
/// Publishers' budgets kept before the stale ones are forgotten.
const QUIET_BUDGETS_MAX: usize = 4096;

/// Completions of local appends the replicator waits for: the local log is durable below
/// `durable` (the callback of a message's last record sets it; the log completes in order).
#[derive(Debug, Default)]
struct Completions {
    durable: AtomicU64,
    failed: AtomicBool,
    notify: tokio::sync::Notify,
}

/// Index hint kind: on the first record of each message of the cluster's log, the message's
/// stream sequence (`id`) and its number of records (`seq`). A restart finds where to read
/// the stream again from the last one ([`resume_point`]).
pub const HINT_CLUSTER_SEQ: u8 = 0x11;

/// How far back from its end a restart looks for [`HINT_CLUSTER_SEQ`] (a batch has at most
/// this many records).
use lanemq_cluster::BATCH_RECORDS_MAX;

/// How often the replicator writes an offset mark to the stream (when it appended anything).
const MARK_EVERY: Duration = Duration::from_secs(30);

/// Where the replicator reads the stream again: the message at stream sequence `seq` starts
/// at log offset `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// Stream sequence of the next message to read.
    pub seq: u64,
    /// Log offset of that message's first record.
    pub offset: u64,
}

/// Where a local log continues the cluster's stream: from the last record that carries
/// [`HINT_CLUSTER_SEQ`] (that message is read again; its records this log already holds are
/// skipped). `None` for an empty log. A log without such a record (written before batch
/// frames, one record per message) continues at sequence `next offset + 1`.
pub fn resume_point(store: &lanemq_store::Store) -> Result<Option<Position>, String> {
    let next = store.next_offset();
    let first = store.first_offset();
    if next <= first {
        return Ok(None);
    }
    let floor = first.max(next.saturating_sub(BATCH_RECORDS_MAX as u64 + 1));
    let mut o = next;
    while o > floor {
        o -= 1;
        let rec = store
            .read(o)
            .map_err(|e| format!("reading the local log at offset {o}: {e}"))?;
        if let Some(h) = rec.index_hints.iter().find(|h| h.kind == HINT_CLUSTER_SEQ) {
            return Ok(Some(Position {
                seq: h.id,
                offset: o,
            }));
        }
    }
    Ok(Some(Position {
        seq: next + 1,
        offset: next,
    }))
}

/// Start the replicator: the stream read in order from the local log's end, appended locally
/// and delivered to this node's sessions.
pub fn spawn_replicator(broker: Arc<Broker>, start: Position) {
    tokio::spawn(async move {
        if let Err(why) = replicate(&broker, start).await {
            if let Some(c) = broker.cluster.get() {
                c.failed.store(true, Ordering::SeqCst);
            }
            error!(%why, "cluster: the replicator stopped; this node no longer delivers the cluster's messages");
        }
    });
}

/// The replicator's state between messages.
struct Replica {
    /// The next message to apply and the offset of its first record.
    pos: Position,
    done: Arc<Completions>,
    /// Records appended, not yet durable, in offset order.
    pending: VecDeque<Arc<Message>>,
    low: Arc<AtomicU64>,
}

async fn replicate(broker: &Arc<Broker>, start: Position) -> Result<(), String> {
    let Some(cluster) = broker.cluster.get() else {
        return Ok(());
    };
    let link = cluster.link.clone();
    let store = broker.persist.store.clone();
    let mut r = Replica {
        pos: start,
        done: Arc::new(Completions::default()),
        pending: VecDeque::new(),
        low: broker.persist.register_low(),
    };
    let mut shutdown = broker.shutdown_signal();
    let mut pause = Duration::from_millis(100);
    let mut installs = cluster
        .installs_rx
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .ok_or("the replicator runs once")?;
    let mut waiting: Vec<crate::cluster_state::Install> = Vec::new();
    cluster.routed.store(store.next_offset(), Ordering::SeqCst);
    cluster
        .applied_seq
        .store(start.seq.saturating_sub(1), Ordering::Relaxed);
    // The membership records up to the message this log holds in full (a membership record
    // travels alone: its message is whole once its record is here).
    let upto = if start.offset < store.next_offset() {
        start.seq
    } else {
        start.seq.saturating_sub(1)
    };
    replay_lane_membership(broker, &link, upto).await;
    let mut marked = tokio::time::Instant::now();
    let mut marked_seq = 0u64;
    // The sequence the feed last gave a message other than the acknowledged one at, since when.
    let mut rereading: Option<(u64, tokio::time::Instant)> = None;
    loop {
        if broker.is_shutting_down() {
            return Ok(());
        }
        let from = r.pos.seq;
        let mut feed = match link.feed(from).await {
            Ok(f) => {
                info!(
                    from_seq = from,
                    offset = r.pos.offset,
                    "cluster: reading the log"
                );
                pause = Duration::from_millis(100);
                f
            }
            Err(e) => {
                warn!(error = %e, "cluster: cannot read the log; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = shutdown.changed() => return Ok(()),
                }
                pause = (pause * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        let mut report = tokio::time::Instant::now() + REPORT_EVERY;
        let mut reported = cluster.replicated.load(Ordering::Relaxed);
        let mut last_entry = tokio::time::Instant::now();
        let mut watch = tokio::time::interval(STALL_CHECK);
        loop {
            if tokio::time::Instant::now() >= report {
                let n = cluster.replicated.load(Ordering::Relaxed);
                if n != reported {
                    info!(
                        records = n - reported,
                        next_offset = store.next_offset(),
                        "cluster: records replicated from the log"
                    );
                    reported = n;
                }
                report = tokio::time::Instant::now() + REPORT_EVERY;
            }
            let notified = r.done.notify.notified();
            tokio::select! {
                entry = feed.next() => match entry {
                    Some(Ok(e)) => {
                        last_entry = tokio::time::Instant::now();
                        let seq = e.seq;
                        if let Applied::Reread(why) = apply(broker, &mut r, e)? {
                            let since = match rereading {
                                Some((s, t)) if s == seq => t,
                                _ => tokio::time::Instant::now(),
                            };
                            rereading = Some((seq, since));
                            if since.elapsed() >= REREAD_MAX {
                                cluster.diverged.store(true, Ordering::SeqCst);
                                return Err(format!(
                                    "the cluster's log diverged: {why}, for {} s of reading \
                                     again; this node's log is not the cluster's (start it \
                                     again with an empty data directory)",
                                    REREAD_MAX.as_secs()
                                ));
                            }
                            warn!(
                                why,
                                "cluster: the log's feed gave a message that is not the \
                                 acknowledged one (a nats-server serving a copy it has not \
                                 committed); reading again"
                            );
                            tokio::select! {
                                _ = tokio::time::sleep(REREAD_PAUSE) => {}
                                _ = shutdown.changed() => return Ok(()),
                            }
                            break;
                        }
                    }
                    Some(Err(e)) => {
                        warn!(error = %e, "cluster: reading the log failed; reading again");
                        break;
                    }
                    None => break,
                },
                _ = notified => {}
                Some(i) = installs.recv() => waiting.push(i),
                _ = tokio::time::sleep_until(report) => {}
                _ = watch.tick() => {
                    if let Some(why) = link.diverged() {
                        cluster.diverged.store(true, Ordering::SeqCst);
                        return Err(format!(
                            "the cluster's log diverged: {why}; this node's log is not the \
                             cluster's (start it again with an empty data directory)"
                        ));
                    }
                    // The ordered consumer notices a dead server only after missed heartbeats
                    // (30 s and more): a feed that is silent while the stream holds records
                    // this node has not read is opened again.
                    if last_entry.elapsed() >= STALL_CHECK {
                        if let Ok(state) = link.state().await {
                            if state.last_seq >= r.pos.seq {
                                warn!(
                                    next_seq = r.pos.seq,
                                    stream_last_seq = state.last_seq,
                                    "cluster: the log's feed stalled; reading again"
                                );
                                break;
                            }
                        }
                    }
                    // An offset mark now and then: a node with an empty log can join from it
                    // once the stream's limits removed its head.
                    if marked.elapsed() >= MARK_EVERY && r.pos.seq > marked_seq + 1 {
                        marked = tokio::time::Instant::now();
                        marked_seq = r.pos.seq;
                        if let Err(e) = link.mark(r.pos.seq, r.pos.offset).await {
                            tracing::debug!(error = %e, "cluster: offset mark not written");
                        }
                    }
                }
                _ = shutdown.changed() => return Ok(()),
            }
            deliver_completed(broker, &mut r)?;
            let routed = r
                .pending
                .front()
                .map_or_else(|| store.next_offset(), |m| m.offset);
            cluster.routed.store(routed, Ordering::SeqCst);
            if !waiting.is_empty() {
                // A resumed session is installed once this node has routed everything its
                // old owner had (`crate::cluster_sessions::install`).
                let (ready, later): (Vec<_>, Vec<_>) =
                    waiting.drain(..).partition(|i| i.record.position <= routed);
                waiting = later;
                for i in ready {
                    crate::cluster_sessions::install(broker, &i.session, &i.record, routed);
                    let _ = i.done.send(());
                }
            }
        }
    }
}
/// The lane membership records of the messages this node's local log already holds (stream
/// sequences up to `upto`), read again from the cluster's log so the dispatcher knows the
/// groups' member sets (they are not kept locally).
async fn replay_lane_membership(broker: &Broker, link: &lanemq_cluster::Link, upto: u64) {
    let mut pause = Duration::from_millis(250);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match link.read_subject(LANES_TOPIC, upto).await {
            Ok(entries) => {
                let n = entries.len();
                for e in entries {
                    if let Some(op) = lane_op_of(&e.payload) {
                        broker.lite.send(crate::lite::Event::Remote {
                            op,
                            at: e.seq,
                            replay: true,
                        });
                    }
                }
                if n > 0 {
                    info!(records = n, "cluster: lane membership read again");
                }
                return;
            }
            Err(e) if tokio::time::Instant::now() < deadline => {
                warn!(error = %e, "cluster: cannot read the lane membership records; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            Err(e) => {
                error!(error = %e, "cluster: lane membership records not read; lanes of groups with members on other nodes may wait for a node's restart");
                return;
            }
        }
    }
}

/// Apply one message of the stream: its records appended to the local log at their offsets
/// (the first one carries [`HINT_CLUSTER_SEQ`]), runs of plain records under one lock of the
/// log, with one completion callback for the message's last record.
fn apply(
    broker: &Arc<Broker>,
    r: &mut Replica,
    e: lanemq_cluster::Entry,
) -> Result<Applied, String> {
    if e.seq < r.pos.seq {
        return Ok(Applied::Done); // already here (the feed was restarted)
    }
    if e.seq > r.pos.seq {
        return Err(format!(
            "the cluster's log skipped from sequence {} to {} (its limits removed records \
             this node had not read); restart this node with an empty data directory",
            r.pos.seq, e.seq
        ));
    }
    if let Some(c) = broker.cluster.get() {
        // A message this node published: JetStream said where it stored it. A feed that gives
        // something else there is served from a copy that is not the committed one (a
        // nats-server that served writes it never committed): nothing of it is applied, and
        // it is read again. A message applied earlier that the ack contradicts means this log
        // diverged: stop rather than deliver the wrong messages.
        match c.link.check_read(e.seq, e.digest, e.id.as_deref()) {
            Ok(()) => {}
            Err(ReadCheck::Reread(why)) => return Ok(Applied::Reread(why)),
            Err(ReadCheck::Diverged(why)) => {
                c.diverged.store(true, Ordering::SeqCst);
                return Err(format!(
                    "the cluster's log diverged: {why}; this node's log is not the cluster's \
                     (start it again with an empty data directory)"
                ));
            }
        }
    }
    let records = match lanemq_cluster::frame_of(e.payload) {
        Ok(Frame::Records(recs)) => recs,
        Ok(Frame::Mark { .. }) => Vec::new(),
        Err(why) => {
            warn!(
                seq = e.seq,
                why,
                "cluster: a message of the log is not a valid batch frame; nothing of it is stored"
            );
            Vec::new()
        }
    };
    let store = &broker.persist.store;
    let base = r.pos.offset;
    let count = records.len();
    let cluster = broker.cluster.get().ok_or("not in cluster mode")?;
    let expected = store.next_offset();
    if base > expected {
        return Err(format!(
            "the local log is at offset {expected} but the cluster's message {} starts at {base}",
            e.seq
        ));
    }
    // Records this log holds already (a restart cut the message) are skipped.
    let skip = usize::try_from(expected - base)
        .unwrap_or(usize::MAX)
        .min(count);
    let mut run = Run::default();
    for (i, payload) in records.into_iter().enumerate().skip(skip) {
        let offset = base + i as u64;
        let hint = (i == 0).then_some(lanemq_store::IndexHint {
            kind: HINT_CLUSTER_SEQ,
            id: e.seq,
            seq: count as u64,
        });
        let last = i + 1 == count;
        apply_record(broker, r, &mut run, payload, offset, hint, last)?;
    }
    run.flush(broker, r)?;
    cluster
        .replicated
        .fetch_add((count - skip) as u64, Ordering::Relaxed);
    r.pos = Position {
        seq: e.seq + 1,
        offset: base + count as u64,
    };
    cluster.applied_seq.store(e.seq, Ordering::Relaxed);
    let mut applied = cluster.applied.lock().unwrap_or_else(|e| e.into_inner());
    if applied.len() >= APPLIED_KEPT {
        applied.pop_front();
    }
    applied.push_back((e.seq, base));
    Ok(Applied::Done)
}

/// What [`apply`] did with a message of the feed.
enum Applied {
    /// Applied, or already here.
    Done,
    /// Not applied: the feed gave another message than the one JetStream acknowledged at its
    /// sequence ([`ReadCheck::Reread`]); the feed is opened again.
    Reread(String),
}

/// Messages of the stream whose first offset is kept for [`Broker::cluster_offset`].
const APPLIED_KEPT: usize = 4096;

/// Plain records of a message waiting to be appended together.
#[derive(Default)]
struct Run {
    /// Offset of the first record.
    first: u64,
    recs: Vec<RecordIn>,
    /// The messages, and whether each is delivered at once (a QoS 0 record with nothing
    /// waiting before it).
    msgs: Vec<(Message, bool)>,
    /// The completion callback of the message's last record, when it is in the run.
    cb: Option<Callback>,
}

impl Run {
    /// Append the run under one lock of the log, then deliver what goes at once and queue
    /// the rest until it is durable.
    fn flush(&mut self, broker: &Arc<Broker>, r: &mut Replica) -> Result<(), String> {
        if self.recs.is_empty() {
            return Ok(());
        }
        let store = &broker.persist.store;
        let mut cb = self.cb.take();
        let range = match store
            .try_append_records(&self.recs, &mut cb)
            .map_err(|e| format!("local log: {e}"))?
        {
            Some(range) => range,
            None => {
                let s = store.clone();
                let recs = &self.recs;
                tokio::task::block_in_place(move || s.append_records(recs, cb))
                    .map_err(|e| format!("local log: {e}"))?
            }
        };
        if range.start != self.first {
            return Err(format!(
                "the local log appended at offset {} but the cluster's record is at {}",
                range.start, self.first
            ));
        }
        self.recs.clear();
        let mut delivered = false;
        for (mut msg, now) in self.msgs.drain(..) {
            msg.offset = self.first;
            self.first += 1;
            let msg = Arc::new(msg);
            if now {
                broker.deliver(msg);
                delivered = true;
            } else {
                r.pending.push_back(msg);
            }
        }
        if delivered {
            broker.committed();
        }
        Ok(())
    }
}

/// Apply one record of a message at `offset` (the local log's next one once `run` is
/// appended): a plain record joins the run; a lane record or a control record is appended
/// on its own after it.
#[allow(clippy::too_many_arguments)]
fn apply_record(
    broker: &Arc<Broker>,
    r: &mut Replica,
    run: &mut Run,
    payload: Bytes,
    offset: u64,
    hint: Option<lanemq_store::IndexHint>,
    last: bool,
) -> Result<(), String> {
    let store = &broker.persist.store;
    let (mut msg, pid) = match lanemq_store::record::decode_record(payload.clone()) {
        Ok(rec) => {
            let pid = rec
                .index_hints
                .iter()
                .find(|h| h.kind == crate::persist::HINT_PACKET_ID)
                .and_then(|h| u16::try_from(h.id).ok());
            (Message::from_record(&rec), pid)
        }
        Err(why) => {
            run.flush(broker, r)?;
            let control = payload.starts_with(CTL_MAGIC);
            if !control {
                warn!(offset, why, "cluster: a message on the log's subjects is not a lanemq record; stored as {VOID_TOPIC}");
            }
            let mut m = Message::new(
                VOID_TOPIC.into(),
                Bytes::new(),
                lanemq_protocol::QoS::AtMostOnce,
                false,
                Default::default(),
                "$lanemq".into(),
            );
            m.offset = NOT_STORED;
            // The log's time, not this node's clock: the previous record's timestamp (the
            // store raises 0 to it), the same on every node.
            m.timestamp_us = 0;
            let mut rec: RecordIn = crate::persist::record_in(&m, None);
            rec.index_hints.extend(hint);
            let cb = last.then(|| completion(&r.done, offset));
            let got = store
                .append_blocking(rec, |_, _| {}, cb)
                .map_err(|e| format!("local log: {e}"))?;
            if got != offset {
                return Err(format!("local log appended at {got}, expected {offset}"));
            }
            if control {
                // A registry change: applied here, after its placeholder, on every node.
                apply_control(broker, &payload, offset);
            }
            return Ok(());
        }
    };
    msg.offset = NOT_STORED;
    // A lane's record gets its lane offset here, as on a single node; a topic the lite layer
    // refuses here (its quota differs from the origin's) is stored as a plain record.
    let lane = broker.classify(&msg.topic).unwrap_or(None);
    let quiet = msg.qos == lanemq_protocol::QoS::AtMostOnce && !msg.retain && lane.is_none();
    // A QoS 0 record with nothing waiting before it is delivered at once.
    let waiting = !r.pending.is_empty() || run.msgs.iter().any(|(_, now)| !now);
    let now = quiet && !waiting;
    if !waiting && !now {
        r.low.store(offset, Ordering::SeqCst);
    }
    let cb: Option<Callback> = (last && !now).then(|| completion(&r.done, offset));
    // Lane times are the log's time: the same decisions (TTL) at the same offset everywhere.
    broker.lite.engine.advance_clock(msg.timestamp_us);
    if lane.is_none() {
        msg.in_lane = false;
        let mut rec = crate::persist::record_in(&msg, pid);
        rec.index_hints.extend(hint);
        if run.recs.is_empty() {
            run.first = offset;
        }
        run.recs.push(rec);
        run.msgs.push((msg, now));
        run.cb = cb;
        return Ok(());
    }
    run.flush(broker, r)?;
    let got = broker
        .append_replica(&mut msg, lane, pid, hint, cb)
        .map_err(|e| format!("local log: {e}"))?;
    if got != offset {
        return Err(format!(
            "the local log appended at offset {got} but the cluster's record is at {offset}"
        ));
    }
    msg.offset = got;
    r.pending.push_back(Arc::new(msg));
    Ok(())
}

/// The callback of a message's last record: the local log is durable up to `offset`.
fn completion(done: &Arc<Completions>, offset: u64) -> Callback {
    let d = done.clone();
    Box::new(move |r| {
        match r {
            Ok(_) => {
                d.durable.fetch_max(offset + 1, Ordering::Release);
            }
            Err(_) => d.failed.store(true, Ordering::Release),
        }
        d.notify.notify_one();
    })
}

/// Deliver, in order, the pending records the local log has made durable.
fn deliver_completed(broker: &Arc<Broker>, r: &mut Replica) -> Result<(), String> {
    if r.done.failed.load(Ordering::Acquire) {
        return Err("the local log refused a write".into());
    }
    let durable = r.done.durable.load(Ordering::Acquire);
    let mut any = false;
    while r.pending.front().is_some_and(|m| m.offset < durable) {
        if let Some(msg) = r.pending.pop_front() {
            broker.deliver(msg);
            any = true;
        }
    }
    if any {
        broker.committed();
    }
    r.low.store(
        r.pending.front().map_or(u64::MAX, |m| m.offset),
        Ordering::SeqCst,
    );
    Ok(())
}

/// The first bytes of a control record of the cluster's log (a registry change). A control
/// record is not a log record (it does not decode as one), so no MQTT client can publish one:
/// the broker encodes every client message itself.
const CTL_MAGIC: &[u8] = b"\0LANEMQ-CTL\0";

/// A change of the named streams' registry, applied by every node at the same log offset.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct RegistryOp {
    /// The node that asked, and its request number (its REST call waits for the answer).
    node: String,
    id: u64,
    op: RegistryChange,
}

/// A change of one named stream, or a lane record (`crate::lite::LaneOp`).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum RegistryChange {
    Create(lanemq_streams::StreamDef),
    Update(String, lanemq_streams::StreamDef),
    Delete(String),
    Lane(crate::lite::LaneOp),
    /// An internal stream (`$s/` subscriptions) auto-created by a SUBSCRIBE.
    CreateInternal(lanemq_streams::StreamDef),
    /// A stream or parent of a node's configuration: created if missing, updated if it
    /// differs.
    EnsureStream(lanemq_streams::StreamDef),
    EnsureParent(lanemq_lite::ParentDef),
    CreateParent(lanemq_lite::ParentDef),
    /// Delete the retained message of a topic (REST).
    DeleteRetained(String),
    UpdateParent(String, lanemq_lite::ParentDef),
    DeleteParent(String),
    /// Positions of sessions: `(client id, claim, position)`.
    Positions(Vec<(String, u64, u64)>),
}

/// The topic of the lane membership records: a starting node reads this subject of the log
/// again to know the groups' member sets (`crate::lite_cluster`).
pub const LANES_TOPIC: &str = "$lanemq/lanes";
/// How often a node tells the others it is alive.
const BEAT_EVERY: Duration = Duration::from_secs(1);
/// A node not heard for this long is declared down (its lanes go to the other nodes).
pub const NODE_TIMEOUT: Duration = Duration::from_secs(5);

/// The control record of a lane record, and the topic it goes alone under (membership
/// records: a starting node reads them again by subject); `None`: in a batch.
fn lane_record(node: &str, op: crate::lite::LaneOp) -> Option<(Option<&'static str>, Bytes)> {
    let topic = op.is_membership().then_some(LANES_TOPIC);
    let req = RegistryOp {
        node: node.to_string(),
        id: 0,
        op: RegistryChange::Lane(op),
    };
    let mut body = CTL_MAGIC.to_vec();
    match serde_json::to_writer(&mut body, &req) {
        Ok(()) => Some((topic, Bytes::from(body))),
        Err(e) => {
            warn!(error = %e, "cluster: cannot encode a lane record");
            None
        }
    }
}

/// A lane record read again from the log at start (`Event::Remote` with `replay`).
fn lane_op_of(payload: &[u8]) -> Option<crate::lite::LaneOp> {
    let body = payload.strip_prefix(CTL_MAGIC)?;
    match serde_json::from_slice::<RegistryOp>(body).ok()?.op {
        RegistryChange::Lane(op) => Some(op),
        _ => None,
    }
}

/// Tell the other nodes this node is alive, and declare down the group members not heard
/// for [`NODE_TIMEOUT`] (only the lowest live node does, so one record is written).
pub fn spawn_lane_watch(broker: Arc<Broker>) {
    let Some(c) = broker.cluster.get() else {
        return;
    };
    let link = c.link.clone();
    let beat = link.clone();
    let b = broker.clone();
    tokio::spawn(async move {
        let mut shutdown = b.shutdown_signal();
        loop {
            if let Err(e) = beat.beat().await {
                tracing::debug!(error = %e, "cluster: heartbeat not sent");
            }
            tokio::select! {
                _ = tokio::time::sleep(BEAT_EVERY) => {}
                _ = shutdown.changed() => return,
            }
        }
    });
    tokio::spawn(async move {
        let me = link.options().node_id.clone();
        let mut shutdown = broker.shutdown_signal();
        let mut beats = loop {
            match link.beats().await {
                Ok(b) => break b,
                Err(e) => {
                    warn!(error = %e, "cluster: cannot watch the nodes' heartbeats; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(BEAT_EVERY) => {}
                        _ = shutdown.changed() => return,
                    }
                }
            }
        };
        let started = tokio::time::Instant::now();
        let mut seen: std::collections::HashMap<String, tokio::time::Instant> =
            std::collections::HashMap::new();
        let mut declared: std::collections::HashMap<String, tokio::time::Instant> =
            std::collections::HashMap::new();
        let mut tick = tokio::time::interval(BEAT_EVERY);
        loop {
            tokio::select! {
                n = beats.next() => match n {
                    Some(n) => {
                        seen.insert(n, tokio::time::Instant::now());
                    }
                    None => return,
                },
                _ = tick.tick() => {
                    let now = tokio::time::Instant::now();
                    if now - started < NODE_TIMEOUT {
                        continue;
                    }
                    let alive = |n: &str| {
                        n == me || seen.get(n).is_some_and(|t| now - *t < NODE_TIMEOUT)
                    };
                    let lowest = seen
                        .keys()
                        .map(String::as_str)
                        .filter(|n| alive(n))
                        .chain([me.as_str()])
                        .min()
                        .map(str::to_string);
                    if lowest.as_deref() != Some(me.as_str()) {
                        continue;
                    }
                    for node in broker.lite.cluster_members() {
                        if alive(&node)
                            || declared.get(&node).is_some_and(|t| now - *t < NODE_TIMEOUT * 2)
                        {
                            continue;
                        }
                        warn!(%node, "cluster: node not heard for {NODE_TIMEOUT:?}; declared down (its lanes go to the other nodes)");
                        let op = crate::lite::LaneOp::Down {
                            node: node.clone(),
                            boot: 0,
                        };
                        if let Some((topic, body)) = lane_record(&me, op) {
                            let done: Done = Box::new(|_| {});
                            let sent = match topic {
                                Some(t) => link.publish_alone(t, body, Some(done)).await,
                                None => link.publish(body, Some(done)).await,
                            };
                            if let Err(e) = sent {
                                warn!(error = %e, "cluster: cannot write a lane record");
                            }
                        }
                        declared.insert(node, now);
                    }
                }
                _ = shutdown.changed() => return,
            }
        }
    });
}

impl Broker {
    /// Cluster mode: write session positions to the log (a control record in the batches).
    pub(crate) async fn cluster_positions(&self, list: Vec<(String, u64, u64)>) {
        let Some(cluster) = self.cluster.get() else {
            return;
        };
        let req = RegistryOp {
            node: cluster.link.options().node_id.clone(),
            id: 0,
            op: RegistryChange::Positions(list),
        };
        let mut body = CTL_MAGIC.to_vec();
        if serde_json::to_writer(&mut body, &req).is_err() {
            return;
        }
        if let Err(e) = cluster.link.publish(Bytes::from(body), None).await {
            tracing::debug!(error = %e, "cluster: session positions not written");
        }
    }
}

/// How long a REST call waits for its registry change to come back through the log.
const REGISTRY_WAIT: Duration = Duration::from_secs(30);

impl Broker {
    /// Cluster mode: write a lane record to the log (from the lane dispatcher's thread; in
    /// the order of the calls, acknowledged and retried like a QoS 1 record).
    pub(crate) fn cluster_lane_op(&self, op: crate::lite::LaneOp) {
        let Some(cluster) = self.cluster.get() else {
            return;
        };
        let Some((topic, body)) = lane_record(&cluster.link.options().node_id, op) else {
            return;
        };
        let done: Done = Box::new(|r| {
            if let Err(e) = r {
                warn!(error = %e, "cluster: a lane record was not stored");
            }
        });
        let sent = match topic {
            Some(t) => cluster.link.publish_alone_blocking(t, body, Some(done)),
            None => cluster.link.publish_blocking(body, Some(done)),
        };
        if let Err(e) = sent {
            warn!(error = %e, "cluster: cannot write a lane record");
        }
    }

    /// Cluster mode: create, update or delete a named stream on every node. The change goes
    /// through the cluster's log as a control record; every node applies it when its
    /// replicator reaches it (so every node's stream starts at the same offset), and this
    /// call returns what this node's registry answered. Blocks (a REST handler's thread).
    fn cluster_registry(&self, op: RegistryChange) -> RegistryOutcome {
        let unavailable = |why: String| lanemq_streams::StreamError::Storage(why);
        let lite = |why: String| lanemq_lite::LiteError::Storage(why);
        let fail = |op: &RegistryChange, why: String| match op {
            RegistryChange::Delete(_) => RegistryOutcome::Done(Err(unavailable(why))),
            RegistryChange::CreateParent(_)
            | RegistryChange::UpdateParent(..)
            | RegistryChange::EnsureParent(_) => RegistryOutcome::Parent(Err(lite(why))),
            RegistryChange::DeleteParent(_) => RegistryOutcome::ParentDone(Err(lite(why))),
            RegistryChange::DeleteRetained(_) => RegistryOutcome::Done(Err(unavailable(why))),
            _ => RegistryOutcome::Info(Err(unavailable(why))),
        };
        let Some(cluster) = self.cluster.get() else {
            return fail(&op, "not in cluster mode".into());
        };
        let id = cluster.registry.next.fetch_add(1, Ordering::Relaxed) + 1;
        let req = RegistryOp {
            node: cluster.link.options().node_id.clone(),
            id,
            op,
        };
        let mut body = CTL_MAGIC.to_vec();
        if let Err(e) = serde_json::to_writer(&mut body, &req) {
            return fail(&req.op, e.to_string());
        }
        let (tx, rx) = std::sync::mpsc::channel();
        cluster
            .registry
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tx);
        let (dtx, drx) = std::sync::mpsc::channel();
        let done: Done = Box::new(move |r| {
            let _ = dtx.send(r);
        });
        let sent = cluster.link.publish_blocking(Bytes::from(body), Some(done));
        let stored = match sent {
            Ok(()) => drx
                .recv_timeout(REGISTRY_WAIT)
                .map_err(|_| "the cluster's log did not answer".to_string())
                .and_then(|r| r.map_err(|e| e.to_string())),
            Err(e) => Err(e.to_string()),
        };
        let outcome = match stored {
            Ok(_) => rx.recv_timeout(REGISTRY_WAIT).unwrap_or_else(|_| {
                fail(
                    &req.op,
                    "this node's replicator did not apply the change".into(),
                )
            }),
            Err(why) => fail(&req.op, why),
        };
        cluster
            .registry
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        outcome
    }

    /// [`lanemq_streams::engine::Engine::create`], cluster-wide in cluster mode.
    pub fn create_stream(
        &self,
        def: lanemq_streams::StreamDef,
    ) -> Result<lanemq_streams::StreamInfo, lanemq_streams::StreamError> {
        if !self.clustered() {
            return self.streams.create(def);
        }
        stream_answer(self.cluster_registry(RegistryChange::Create(def)))
    }

    /// [`lanemq_streams::engine::Engine::create_internal`] (a stream auto-created for `$s/`
    /// subscriptions), cluster-wide in cluster mode.
    pub fn create_stream_internal(
        &self,
        def: lanemq_streams::StreamDef,
    ) -> Result<lanemq_streams::StreamInfo, lanemq_streams::StreamError> {
        if !self.clustered() {
            return self.streams.create_internal(def);
        }
        stream_answer(self.cluster_registry(RegistryChange::CreateInternal(def)))
    }

    /// [`lanemq_streams::engine::Engine::update`], cluster-wide in cluster mode.
    pub fn update_stream(
        &self,
        name: &str,
        def: lanemq_streams::StreamDef,
    ) -> Result<lanemq_streams::StreamInfo, lanemq_streams::StreamError> {
        if !self.clustered() {
            return self.streams.update(name, def);
        }
        stream_answer(self.cluster_registry(RegistryChange::Update(name.to_string(), def)))
    }

    /// [`lanemq_streams::engine::Engine::delete`], cluster-wide in cluster mode.
    pub fn delete_stream(&self, name: &str) -> Result<(), lanemq_streams::StreamError> {
        if !self.clustered() {
            return self.streams.delete(name);
        }
        match self.cluster_registry(RegistryChange::Delete(name.to_string())) {
            RegistryOutcome::Done(r) => r,
            RegistryOutcome::Info(r) => r.map(|_| ()),
            _ => Err(lanemq_streams::StreamError::Storage(
                "unexpected answer".into(),
            )),
        }
    }
}

impl Broker {
    /// Create a lite parent; in cluster mode on every node, at the same log offset (so every
    /// node puts the same records into the same lanes).
    pub fn create_parent(
        &self,
        def: lanemq_lite::ParentDef,
    ) -> Result<lanemq_lite::ParentInfo, lanemq_lite::LiteError> {
        if !self.clustered() {
            return self.local_create_parent(def);
        }
        parent_answer(self.cluster_registry(RegistryChange::CreateParent(def)))
    }

    /// Update a lite parent (cluster-wide in cluster mode).
    pub fn update_parent(
        &self,
        name: &str,
        def: lanemq_lite::ParentDef,
    ) -> Result<lanemq_lite::ParentInfo, lanemq_lite::LiteError> {
        if !self.clustered() {
            return self.local_update_parent(name, def);
        }
        parent_answer(self.cluster_registry(RegistryChange::UpdateParent(name.to_string(), def)))
    }

    /// Delete a lite parent and its lanes (cluster-wide in cluster mode).
    pub fn delete_parent(&self, name: &str) -> Result<(), lanemq_lite::LiteError> {
        if !self.clustered() {
            return self.local_delete_parent(name);
        }
        match self.cluster_registry(RegistryChange::DeleteParent(name.to_string())) {
            RegistryOutcome::ParentDone(r) => r,
            RegistryOutcome::Parent(r) => r.map(|_| ()),
            _ => Err(lanemq_lite::LiteError::Storage("unexpected answer".into())),
        }
    }
}

impl Broker {
    /// Create a lite parent on this node (`Broker::create_parent` decides where).
    fn local_create_parent(
        &self,
        def: lanemq_lite::ParentDef,
    ) -> Result<lanemq_lite::ParentInfo, lanemq_lite::LiteError> {
        let engine = &self.lite.engine;
        let info = engine.create_parent(def)?;
        engine.warn_overlaps();
        let converted = self.convert_shared_to_lane_groups();
        tracing::info!(parent = %info.def.name, pattern = %info.def.pattern, converted, "lite parent created");
        Ok(info)
    }

    /// Update a lite parent on this node.
    fn local_update_parent(
        &self,
        name: &str,
        def: lanemq_lite::ParentDef,
    ) -> Result<lanemq_lite::ParentInfo, lanemq_lite::LiteError> {
        let engine = &self.lite.engine;
        let info = engine.update_parent(name, def)?;
        engine.warn_overlaps();
        let converted = self.convert_shared_to_lane_groups();
        tracing::info!(parent = %name, converted, "lite parent updated");
        Ok(info)
    }

    /// Delete a lite parent on this node.
    fn local_delete_parent(&self, name: &str) -> Result<(), lanemq_lite::LiteError> {
        let ids = self.lite.engine.delete_parent(name)?;
        tracing::info!(parent = %name, lanes = ids.len(), "lite parent deleted");
        // The dispatcher forgets the lanes and drops the groups of the parent.
        self.lite.send(crate::lite::Event::LanesRemoved(ids));
        Ok(())
    }
}

impl Broker {
    /// Delete a retained message (REST): in cluster mode on every node, at the same log
    /// offset. Whether this node had one.
    pub fn delete_retained_everywhere(&self, topic: &str) -> bool {
        if !self.clustered() {
            return self.delete_retained(topic);
        }
        match self.cluster_registry(RegistryChange::DeleteRetained(topic.to_string())) {
            RegistryOutcome::Removed(r) => r,
            other => {
                warn!(topic, outcome = ?other, "cluster: retained message not deleted");
                false
            }
        }
    }
}

/// Cluster mode, at start: the streams (`[[streams]]`) and lite parents (`[[lite.parents]]`)
/// of this node's configuration go through the log, so every node creates them at the same
/// offset (a node declaring one that exists already changes nothing; one that differs updates
/// it everywhere). Blocks until this node applied them (bounded per item).
pub fn declare_configured(broker: &Broker) {
    for def in broker.config.streams.clone() {
        let name = def.name.clone();
        match broker.cluster_registry(RegistryChange::EnsureStream(def)) {
            RegistryOutcome::Info(Err(e)) | RegistryOutcome::Done(Err(e)) => {
                warn!(stream = %name, error = %e, "cluster: stream of the config file not declared")
            }
            _ => {}
        }
    }
    for def in broker.config.lite.parents.clone() {
        let name = def.name.clone();
        match broker.cluster_registry(RegistryChange::EnsureParent(def)) {
            RegistryOutcome::Parent(Err(e)) | RegistryOutcome::ParentDone(Err(e)) => {
                warn!(parent = %name, error = %e, "cluster: lite parent of the config file not declared")
            }
            _ => {}
        }
    }
}

/// A registry change's answer as a stream's info.
fn stream_answer(
    o: RegistryOutcome,
) -> Result<lanemq_streams::StreamInfo, lanemq_streams::StreamError> {
    match o {
        RegistryOutcome::Info(r) => r,
        RegistryOutcome::Done(Err(e)) => Err(e),
        _ => Err(lanemq_streams::StreamError::Storage(
            "unexpected answer".into(),
        )),
    }
}

fn parent_answer(o: RegistryOutcome) -> Result<lanemq_lite::ParentInfo, lanemq_lite::LiteError> {
    match o {
        RegistryOutcome::Parent(r) => r,
        RegistryOutcome::ParentDone(Err(e)) => Err(e),
        _ => Err(lanemq_lite::LiteError::Storage("unexpected answer".into())),
    }
}

/// Apply a control record read from the log (the replicator, right after storing its
/// placeholder at the record's offset). Answers the REST call when this node asked.
fn apply_control(broker: &Broker, payload: &[u8], offset: u64) {
    let Some(body) = payload.strip_prefix(CTL_MAGIC) else {
        return;
    };
    let req: RegistryOp = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => {
            warn!(error = %e, "cluster: a control record of the log is not understood; skipped");
            return;
        }
    };
    let op = match req.op {
        RegistryChange::Positions(list) => {
            if let Some(c) = broker.cluster.get() {
                let mut map = c.positions.lock().unwrap_or_else(|e| e.into_inner());
                for (client, claim, pos) in list {
                    let e = map.entry(client).or_insert((claim, pos));
                    if e.0 != claim || e.1 < pos {
                        *e = (claim, pos);
                    }
                }
            }
            return;
        }
        RegistryChange::Lane(op) => {
            broker.lite.send(crate::lite::Event::Remote {
                op,
                at: offset,
                replay: false,
            });
            return;
        }
        op => op,
    };
    let outcome = tokio::task::block_in_place(|| match op {
        RegistryChange::Lane(_) | RegistryChange::Positions(_) => RegistryOutcome::Done(Ok(())),
        RegistryChange::DeleteRetained(topic) => {
            RegistryOutcome::Removed(broker.delete_retained(&topic))
        }
        RegistryChange::Create(def) => RegistryOutcome::Info(broker.streams.create(def)),
        RegistryChange::CreateInternal(def) => {
            RegistryOutcome::Info(broker.streams.create_internal(def))
        }
        RegistryChange::Update(name, def) => {
            RegistryOutcome::Info(broker.streams.update(&name, def))
        }
        RegistryChange::Delete(name) => RegistryOutcome::Done(broker.streams.delete(&name)),
        RegistryChange::EnsureStream(def) => {
            RegistryOutcome::Info(match broker.streams.get(&def.name) {
                Err(lanemq_streams::StreamError::NotFound(_)) => broker.streams.create(def),
                Ok(cur) if cur.def != def => broker.streams.update(&def.name.clone(), def),
                other => other,
            })
        }
        RegistryChange::EnsureParent(def) => {
            RegistryOutcome::Parent(match broker.lite.engine.get_parent(&def.name) {
                Err(lanemq_lite::LiteError::NotFound(_)) => broker.local_create_parent(def),
                Ok(cur) if cur.def != def => broker.local_update_parent(&def.name.clone(), def),
                other => other,
            })
        }
        RegistryChange::CreateParent(def) => {
            RegistryOutcome::Parent(broker.local_create_parent(def))
        }
        RegistryChange::UpdateParent(name, def) => {
            RegistryOutcome::Parent(broker.local_update_parent(&name, def))
        }
        RegistryChange::DeleteParent(name) => {
            RegistryOutcome::ParentDone(broker.local_delete_parent(&name))
        }
    });
    let Some(cluster) = broker.cluster.get() else {
        return;
    };
    if req.node == cluster.link.options().node_id {
        if let Some(tx) = cluster
            .registry
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&req.id)
        {
            let _ = tx.send(outcome);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lanemq_cluster::StreamState;

    fn state(first_seq: u64, last_seq: u64) -> StreamState {
        StreamState {
            first_seq,
            last_seq,
            messages: (last_seq + 1).saturating_sub(first_seq),
        }
    }

    #[test]
    fn a_local_log_must_fit_the_clusters() {
        let at = |seq, offset| Position { seq, offset };
        // An empty stream, or one that still holds its first message: an empty log starts at 0.
        assert_eq!(join_point(state(0, 0), None), Ok(at(1, 0)));
        assert_eq!(join_point(state(1, 100), None), Ok(at(1, 0)));
        // Its limits removed 1..=49: an empty log needs a mark still in the stream.
        assert!(join_point(state(50, 100), None).is_err());
        assert!(join_point(state(50, 100), Some((40, 900))).is_err());
        assert_eq!(
            join_point(state(50, 100), Some((60, 1200))),
            Ok(at(60, 1200))
        );
        // A log that continues at sequence 1..=101 fits 1..=100; one past it, or before the
        // stream's first message, does not.
        assert!(check_alignment(at(1, 0), state(0, 0)).is_ok());
        assert!(check_alignment(at(6, 5), state(0, 0)).is_err());
        assert!(check_alignment(at(1, 0), state(1, 100)).is_ok());
        assert!(check_alignment(at(101, 5000), state(1, 100)).is_ok());
        assert!(check_alignment(at(102, 5000), state(1, 100)).is_err());
        assert!(check_alignment(at(49, 700), state(50, 100)).is_err());
        assert!(check_alignment(at(50, 700), state(50, 100)).is_ok());
    }

    #[test]
    fn control_records_are_not_log_records() {
        let mut body = CTL_MAGIC.to_vec();
        body.extend_from_slice(b"{}");
        assert!(lanemq_store::record::decode_record(Bytes::from(body)).is_err());
    }
}
