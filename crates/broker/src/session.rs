//! Session state (MQTT 5 section 4.1): subscriptions, the queue of messages not yet sent, the
//! outbound inflight window and the inbound QoS 2 packet identifiers.
//!
//! A session outlives its connections. It is shared between its connection task (which drains
//! the queue, assigns packet identifiers and handles acknowledgements) and publishers (which
//! push deliveries). The lock is never held across an `.await`.
//!
//! The queue has two parts, sent in this order: `queue`, deliveries in memory (each holds its
//! message by `Arc`), then `spilled`, deliveries of stored QoS 1/2 messages kept only as log
//! positions. A QoS 1/2 delivery is spilled when the session is not connected, when its in-memory bytes
//! (`outbound_buffer_bytes_max`) or the broker-wide ones (`queued_bytes_max_total`) are used
//! up, and always once something is spilled (order). The owning connection moves spilled
//! entries back into memory, reading the log, as the client takes them.
//!
//! Invariants:
//! - every delivery in `spilled` comes after every delivery in `queue`;
//! - `queued_bytes` is the cost of `queue`, and the broker-wide [`QueueBudget`] is the sum of
//!   every session's `queued_bytes` (changed only through [`SessionState::add_bytes`] and
//!   [`SessionState::sub_bytes`]);
//! - `queue.len() + spilled.len()` never exceeds `max_queued` for client deliveries (stream
//!   and lane deliveries are bounded by their feeders instead);
//! - publishers never wait for a session: a full queue applies [`QueueOverflow`].

pub use crate::config::QueueOverflow;
use crate::lazy::{LazyMap, LazySet};
use crate::message::{Delivery, NOT_STORED};
use crate::persist::{Op, Persist};
pub use crate::spill::{SpillQueue, Spilled, SpilledExtra};
use crate::stream_sub::StreamSub;
use lanemq_protocol::{ProtocolVersion, QoS, SubscriptionOptions};
use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::waker::ConnWaker;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    pub options: SubscriptionOptions,
    pub sub_id: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InflightStage {
    /// QoS 1 sent, waiting for PUBACK.
    PubAck,
    /// QoS 2 sent, waiting for PUBREC.
    PubRec,
    /// PUBREL sent, waiting for PUBCOMP.
    PubComp,
}

#[derive(Debug, Clone)]
pub struct Inflight {
    pub packet_id: u16,
    pub stage: InflightStage,
    pub delivery: Delivery,
}

/// Why a connection must go away, set by someone other than the connection itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kick {
    /// Another connection took the session over (0x8E).
    TakenOver,
    /// The outbound budget was exceeded (0x97).
    SlowConsumer,
    /// The server is shutting down (0x8B).
    Shutdown,
    /// A reloaded ACL denies a subscription the session had (0x87); the subscription is gone.
    NotAuthorized,
    /// Kicked over the REST API (`DELETE /api/v5/clients/{clientid}`, 0x98).
    Administrative,
}

/// Outcome of [`Session::push`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushOutcome {
    /// In memory.
    Queued,
    /// Kept as a log position (QoS 1/2 beyond the memory budgets).
    Spilled,
    /// QoS 0 to an offline session or beyond the byte budgets, or the queue was full (see
    /// [`QueueOverflow`]): dropped and counted.
    Dropped,
}

/// The broker-wide budget of queued message bytes kept in memory (`queued_bytes_max_total`).
#[derive(Debug, Default)]
pub struct QueueBudget {
    used: AtomicUsize,
    max: usize,
    /// QoS 1/2 deliveries kept as log positions because a byte budget was used up.
    pub spilled: AtomicU64,
    /// QoS 0 deliveries dropped because a byte budget was used up.
    pub dropped_qos0: AtomicU64,
    /// QoS 1/2 deliveries dropped because a queue was full.
    pub dropped_queue_full: AtomicU64,
    /// Connections closed with 0x97 because their queue was full.
    pub slow_consumers_disconnected: AtomicU64,
}

impl QueueBudget {
    pub fn new(max: usize) -> QueueBudget {
        QueueBudget {
            max,
            ..Default::default()
        }
    }

    /// Bytes of queued messages held in memory by every session.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    pub fn max(&self) -> usize {
        self.max
    }

    fn has_room(&self, cost: usize) -> bool {
        self.used.load(Ordering::Relaxed) + cost <= self.max
    }
}

/// A session's queue limits (from `[mqtt]`) and the broker-wide budget.
#[derive(Debug, Clone)]
pub struct QueueLimits {
    /// QoS 1/2 deliveries queued at most (memory and log positions).
    pub max_queued: usize,
    /// Bytes of queued messages this session keeps in memory.
    pub bytes_max: usize,
    pub overflow: QueueOverflow,
    pub budget: Arc<QueueBudget>,
}

impl QueueLimits {
    /// Limits for tests: `max_queued` messages, `bytes_max` bytes, a budget of its own.
    pub fn simple(max_queued: usize, bytes_max: usize) -> QueueLimits {
        QueueLimits {
            max_queued,
            bytes_max,
            overflow: QueueOverflow::Disconnect,
            budget: Arc::new(QueueBudget::new(usize::MAX / 2)),
        }
    }
}

#[derive(Debug)]
pub struct SessionState {
    /// Generation of the connection that owns the session; bumped on every (re)connect.
    pub generation: u64,
    pub connected: bool,
    pub kick: Option<Kick>,
    /// Set once the session has ended; pushes are then ignored.
    pub ended: bool,
    /// Ended because a new connection for its client id started a new session (Clean Start,
    /// or nothing to resume): that connection cancels a delayed will [MQTT-3.1.2-8].
    pub replaced: bool,
    pub protocol: ProtocolVersion,
    /// Session Expiry Interval in seconds (u32::MAX: never).
    pub expiry_s: u32,
    /// Full filters as subscribed (including `$share/<group>/`).
    pub subscriptions: LazyMap<String, Subscription>,
    /// Deliveries in memory, sent first.
    pub queue: VecDeque<Delivery>,
    /// QoS 1/2 deliveries kept as log positions, sent after `queue`.
    pub spilled: SpillQueue,
    /// Cost of `queue` (see [`crate::message::Message::cost`]).
    queued_bytes: usize,
    pub inflight: VecDeque<Inflight>,
    pub pids_in_use: LazySet<u16>,
    pub next_pid: u16,
    /// Inbound QoS 2 packet identifiers received and PUBREC'd, waiting for PUBREL.
    pub inbound_qos2: LazySet<u16>,
    /// Shared by every session of the broker (one configuration).
    pub limits: Arc<QueueLimits>,
    pub dropped: u64,
    /// Wakes the owning connection task (new deliveries, a kick). Replaced on every connect;
    /// `None` while offline.
    pub waker: Option<Arc<ConnWaker>>,
    /// Next persisted queue sequence number.
    pub next_seq: u64,
    /// During start-up replay: offsets already in the restored queue (de-duplication).
    pub replay_offsets: Option<Box<HashSet<u64>>>,
    /// Stream subscriptions by full filter (`$stream/...`, `$s/...`); not in the router.
    pub stream_subs: LazyMap<String, Arc<StreamSub>>,
    /// Who the session's last connection was (username, address): the identity its
    /// subscriptions are checked as when the ACL is reloaded. `None` for a session restored
    /// after a restart until its client connects again.
    pub identity: Option<(Option<Arc<str>>, std::net::IpAddr)>,
    /// When the current or last connection was accepted (ms since the epoch; 0: not since
    /// the broker started).
    pub connected_at_ms: u64,
}

impl SessionState {
    /// Give back the spare capacity of the queues and packet id sets: a session that took a
    /// burst keeps its peak capacity otherwise (about 70 KB after 200 messages in flight), and
    /// a broker holds many idle and offline sessions.
    pub fn trim(&mut self) {
        crate::spill::shrink_deque(&mut self.queue);
        crate::spill::shrink_deque(&mut self.inflight);
        self.spilled.shrink();
        if self.pids_in_use.capacity() > 2 * self.pids_in_use.len() + 16 {
            self.pids_in_use.shrink_to_fit();
        }
        if self.inbound_qos2.capacity() > 2 * self.inbound_qos2.len() + 16 {
            self.inbound_qos2.shrink_to_fit();
        }
    }
}

impl Drop for SessionState {
    /// Give the in-memory bytes back to the broker-wide budget.
    fn drop(&mut self) {
        let n = self.queued_bytes;
        self.sub_bytes(n);
    }
}

pub struct Session {
    pub client_id: Arc<str>,
    state: Mutex<SessionState>,
    /// Mirror of `state.connected`, readable without the lock (shared-subscription choice).
    online: AtomicBool,
    /// Set by the lane dispatcher when a lane batch of this session was not acknowledged in
    /// time (`ack_timeout_ms`): no new lane batches until it shows life (any PUBACK, a new
    /// connection).
    lane_stuck: AtomicBool,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("client_id", &self.client_id)
            .finish()
    }
}

impl Session {
    pub fn new(
        client_id: Arc<str>,
        protocol: ProtocolVersion,
        limits: Arc<QueueLimits>,
    ) -> Session {
        Session {
            client_id,
            state: Mutex::new(SessionState {
                generation: 0,
                connected: false,
                kick: None,
                ended: false,
                replaced: false,
                protocol,
                expiry_s: 0,
                subscriptions: LazyMap::new(),
                queue: VecDeque::new(),
                spilled: SpillQueue::default(),
                queued_bytes: 0,
                inflight: VecDeque::new(),
                pids_in_use: LazySet::new(),
                next_pid: 1,
                inbound_qos2: LazySet::new(),
                limits,
                dropped: 0,
                waker: None,
                next_seq: 1,
                replay_offsets: None,
                stream_subs: LazyMap::new(),
                identity: None,
                connected_at_ms: 0,
            }),
            online: AtomicBool::new(false),
            lane_stuck: AtomicBool::new(false),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, SessionState> {
        // A panic while holding the lock would be a bug; keep serving with the state as is.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn is_online(&self) -> bool {
        self.online.load(Ordering::Relaxed)
    }

    /// Marked stuck by the lane dispatcher (a lane batch timed out).
    pub fn is_lane_stuck(&self) -> bool {
        self.lane_stuck.load(Ordering::Relaxed)
    }

    pub fn set_lane_stuck(&self, stuck: bool) {
        self.lane_stuck.store(stuck, Ordering::Relaxed);
    }

    /// Clear the stuck mark; true if it was set (the dispatcher must then be told).
    pub fn clear_lane_stuck(&self) -> bool {
        self.lane_stuck.load(Ordering::Relaxed) && self.lane_stuck.swap(false, Ordering::AcqRel)
    }

    pub fn set_online(&self, st: &mut SessionState, online: bool) {
        st.connected = online;
        self.online.store(online, Ordering::Relaxed);
        if !online {
            st.trim();
        }
    }

    /// Queue a delivery. Never waits: QoS 0 is queued only for a connected session within the
    /// byte budgets (else dropped and counted); QoS 1/2 beyond the byte budgets is kept as a
    /// log position; a full queue applies the session's [`QueueOverflow`].
    pub fn push(&self, d: Delivery, persist: Option<&Persist>) -> PushOutcome {
        self.push_tracked(d, persist, &mut false)
    }

    /// [`Session::push`]; sets `durable` when the delivery became a durable queue entry (a
    /// persistent session's QoS 1/2 message), the only effect a replay after a restart must
    /// not apply twice.
    pub fn push_tracked(
        &self,
        d: Delivery,
        persist: Option<&Persist>,
        durable: &mut bool,
    ) -> PushOutcome {
        let mut st = self.lock();
        self.push_locked(&mut st, d, persist, durable)
    }

    /// [`Session::push`] of several deliveries under one lock, in order; returns how many
    /// were dropped.
    pub fn push_many(&self, ds: Vec<Delivery>, persist: Option<&Persist>) -> u64 {
        let mut st = self.lock();
        let mut dropped = 0;
        for d in ds {
            if self.push_locked(&mut st, d, persist, &mut false) == PushOutcome::Dropped {
                dropped += 1;
            }
        }
        dropped
    }

    fn push_locked(
        &self,
        st: &mut SessionState,
        mut d: Delivery,
        persist: Option<&Persist>,
        durable: &mut bool,
    ) -> PushOutcome {
        if st.ended {
            return PushOutcome::Dropped;
        }
        if let Some(seen) = &st.replay_offsets {
            if seen.contains(&d.msg.offset) {
                return PushOutcome::Queued;
            }
        }
        let cost = d.msg.cost();
        if d.qos == QoS::AtMostOnce {
            if !st.connected || !st.has_room(cost) {
                st.dropped += 1;
                if st.connected {
                    st.limits
                        .budget
                        .dropped_qos0
                        .fetch_add(1, Ordering::Relaxed);
                }
                return PushOutcome::Dropped;
            }
        } else if st.queue.len() + st.spilled.len() >= st.limits.max_queued {
            st.dropped += 1;
            st.limits
                .budget
                .dropped_queue_full
                .fetch_add(1, Ordering::Relaxed);
            let overflow = st.limits.overflow;
            match overflow {
                QueueOverflow::DropOldest if st.drop_oldest(&self.client_id, persist) => {}
                QueueOverflow::Disconnect if st.connected && st.kick.is_none() => {
                    st.kick = Some(Kick::SlowConsumer);
                    st.wake();
                    return PushOutcome::Dropped;
                }
                _ => return PushOutcome::Dropped,
            }
        }
        if let Some(p) = persist {
            if st.expiry_s > 0 && d.qos != QoS::AtMostOnce && d.msg.offset != NOT_STORED {
                d.seq = st.next_seq;
                st.next_seq += 1;
                let carried = (d.msg.offset < p.carry_floor())
                    .then(|| Box::new(crate::persist::record_in(&d.msg, None)));
                p.submit(Op::QueuePush {
                    client: self.client_id.clone(),
                    seq: d.seq,
                    offset: d.msg.offset,
                    qos: d.qos.as_u8(),
                    retain: d.retain,
                    carried,
                });
                *durable = true;
            }
        }
        let spillable = d.qos != QoS::AtMostOnce
            && d.msg.offset != NOT_STORED
            && d.stream.is_none()
            && d.lane.is_none();
        // A session that is away holds positions only (32 bytes a message, nothing of the
        // message itself): it may stay away long, and many sessions may be away at once.
        if spillable && (!st.connected || !st.spilled.is_empty() || !st.has_room(cost)) {
            let floor = persist.map_or(0, Persist::carry_floor);
            st.spilled.push_back(Spilled::of(&d, floor));
            st.limits.budget.spilled.fetch_add(1, Ordering::Relaxed);
            if st.queue.is_empty() && st.spilled.len() == 1 {
                st.wake();
            }
            return PushOutcome::Spilled;
        }
        st.add_bytes(cost);
        st.queue.push_back(d);
        if st.queue.len() == 1 {
            st.wake();
        }
        PushOutcome::Queued
    }

    /// Queue a stream delivery. Its feeder already bounds how many are queued or in flight
    /// (`read_max_unacked`), so neither the queue limit nor the QoS 0 byte budget applies.
    pub fn push_stream(&self, d: Delivery) {
        let mut st = self.lock();
        if st.ended {
            return;
        }
        st.add_bytes(d.msg.cost());
        st.queue.push_back(d);
        if st.queue.len() == 1 {
            st.wake();
        }
    }

    /// Queue the deliveries of one lane batch (bounded by the lane dispatcher's member
    /// window). False if the session has ended.
    pub fn push_lane(&self, ds: Vec<Delivery>) -> bool {
        let mut st = self.lock();
        if st.ended {
            return false;
        }
        let was_empty = st.queue.is_empty();
        for d in ds {
            st.add_bytes(d.msg.cost());
            st.queue.push_back(d);
        }
        if was_empty {
            st.wake();
        }
        true
    }

    /// Remove lane deliveries matching `pred`, queued or in flight (a batch handed to another
    /// member, an expired lane). Returns how many.
    pub fn revoke_lane(&self, pred: impl Fn(&crate::message::LaneTag) -> bool) -> usize {
        let mut st = self.lock();
        let st = &mut *st;
        let mut n = 0;
        let mut freed = 0;
        st.queue.retain(|d| {
            let hit = d.lane.as_ref().is_some_and(&pred);
            if hit {
                n += 1;
                freed += d.msg.cost();
            }
            !hit
        });
        st.sub_bytes(freed);
        let pids = &mut st.pids_in_use;
        st.inflight.retain(|i| {
            let hit = i.delivery.lane.as_ref().is_some_and(&pred);
            if hit {
                n += 1;
                pids.remove(&i.packet_id);
            }
            !hit
        });
        n
    }

    /// Remove the queued (not yet sent) lane deliveries matching `pred`; their offsets.
    pub fn revoke_queued_lane(&self, pred: impl Fn(&crate::message::LaneTag) -> bool) -> Vec<u64> {
        let mut st = self.lock();
        let mut out = Vec::new();
        let mut freed = 0;
        st.queue.retain(|d| match &d.lane {
            Some(t) if pred(t) => {
                out.push(t.offset);
                freed += d.msg.cost();
                false
            }
            _ => true,
        });
        st.sub_bytes(freed);
        out
    }

    /// Remove the queued (not yet sent) deliveries of stream subscription `sub`.
    pub fn drop_queued_stream(&self, sub: &Arc<StreamSub>) {
        let mut st = self.lock();
        let mut freed = 0;
        st.queue.retain(|d| {
            let mine = d.stream.as_ref().is_some_and(|t| Arc::ptr_eq(&t.sub, sub));
            if mine {
                freed += d.msg.cost();
            }
            !mine
        });
        st.sub_bytes(freed);
    }

    /// The first spilled entries (clones), at most `n` and `bytes_max` bytes and never beyond
    /// the session's own byte budget, but at least one while the queue in memory is empty:
    /// read from the log without the lock, then taken with [`SessionState::take_spilled`].
    pub fn peek_spilled(&self, n: usize, bytes_max: usize) -> Vec<Spilled> {
        let st = self.lock();
        let room = st
            .limits
            .bytes_max
            .saturating_sub(st.queued_bytes)
            .min(bytes_max);
        let mut used = 0usize;
        let mut out = Vec::new();
        for sp in st.spilled.iter().take(n) {
            // Restored entries do not know their size: count a small message.
            let cost = if sp.cost == 0 { 128 } else { sp.cost as usize };
            if used + cost > room && !(out.is_empty() && st.queue.is_empty()) {
                break;
            }
            used += cost;
            out.push(sp.clone());
        }
        out
    }
}

impl SessionState {
    /// Room for `cost` more bytes in memory, for this session and broker-wide.
    fn has_room(&self, cost: usize) -> bool {
        self.queued_bytes + cost <= self.limits.bytes_max && self.limits.budget.has_room(cost)
    }

    /// Account `n` bytes more in `queue`.
    pub fn add_bytes(&mut self, n: usize) {
        self.queued_bytes += n;
        self.limits.budget.used.fetch_add(n, Ordering::Relaxed);
    }

    /// Account `n` bytes less in `queue`.
    pub fn sub_bytes(&mut self, n: usize) {
        let n = n.min(self.queued_bytes);
        self.queued_bytes -= n;
        self.limits.budget.used.fetch_sub(n, Ordering::Relaxed);
    }

    /// Bytes of queued messages this session holds in memory.
    pub fn queued_bytes(&self) -> usize {
        self.queued_bytes
    }

    /// Drop the oldest queued client delivery (in memory first, then spilled; never a stream
    /// or lane delivery, whose feeders own them). False if there is none.
    fn drop_oldest(&mut self, client: &Arc<str>, persist: Option<&Persist>) -> bool {
        let seq = if let Some(i) = self
            .queue
            .iter()
            .position(|d| d.stream.is_none() && d.lane.is_none())
        {
            let Some(d) = self.queue.remove(i) else {
                return false;
            };
            self.sub_bytes(d.msg.cost());
            d.seq
        } else if let Some(sp) = self.spilled.pop_front() {
            sp.seq
        } else {
            return false;
        };
        if let (Some(p), true) = (persist, seq != 0) {
            p.submit(Op::QueueRemove {
                client: client.clone(),
                seq,
            });
        }
        true
    }

    /// Take the spilled entries read by [`Session::peek_spilled`], in order, as deliveries in
    /// memory. `read` holds each entry with its message, or `None` where it could not be
    /// read (dropped: returned as the third element for the caller to forget). An entry no
    /// longer at the front (dropped meanwhile) is skipped.
    pub fn take_spilled(
        &mut self,
        read: Vec<(Spilled, Option<Arc<crate::message::Message>>)>,
    ) -> Vec<Spilled> {
        let mut lost = Vec::new();
        for (sp, msg) in read {
            let front = self.spilled.front_key() == Some((sp.offset, sp.seq));
            if !front {
                continue;
            }
            self.spilled.pop_front();
            match msg {
                Some(m) => {
                    let d = sp.into_delivery(m);
                    self.add_bytes(d.msg.cost());
                    self.queue.push_back(d);
                }
                None => lost.push(sp),
            }
        }
        lost
    }

    /// Wake the connection task, if one is attached.
    pub fn wake(&self) {
        if let Some(w) = &self.waker {
            w.notify_one();
        }
    }

    /// Next free packet identifier (never 0, never one in use). `None` if all 65535 are in use.
    pub fn alloc_pid(&mut self) -> Option<u16> {
        if self.pids_in_use.len() >= usize::from(u16::MAX) {
            return None;
        }
        loop {
            let pid = self.next_pid;
            self.next_pid = if self.next_pid == u16::MAX {
                1
            } else {
                self.next_pid + 1
            };
            if self.pids_in_use.insert(pid) {
                return Some(pid);
            }
        }
    }

    /// Remove an inflight entry by packet id (acks usually arrive in order: check the front first).
    pub fn take_inflight(&mut self, pid: u16, stage: InflightStage) -> Option<Inflight> {
        let idx = if self.inflight.front().is_some_and(|f| f.packet_id == pid) {
            0
        } else {
            self.inflight.iter().position(|f| f.packet_id == pid)?
        };
        if self.inflight[idx].stage != stage {
            return None;
        }
        let entry = self.inflight.remove(idx)?;
        self.pids_in_use.remove(&pid);
        Some(entry)
    }

    pub fn pop_queue(&mut self) -> Option<Delivery> {
        let d = self.queue.pop_front()?;
        self.sub_bytes(d.msg.cost());
        Some(d)
    }

    /// Put a delivery just popped back at the front.
    pub fn unpop_queue(&mut self, d: Delivery) {
        self.add_bytes(d.msg.cost());
        self.queue.push_front(d);
    }

    /// Drop everything queued and inflight (clean start, session end); returns what was pending
    /// (and the spilled entries) so shared-subscription messages can go to another member.
    pub fn drain_pending(&mut self) -> (Vec<Delivery>, Vec<Spilled>) {
        // A QoS 2 message whose PUBREC arrived was received by the client: not pending.
        let mut out: Vec<Delivery> = self
            .inflight
            .drain(..)
            .filter(|i| i.stage != InflightStage::PubComp)
            .map(|i| i.delivery)
            .collect();
        out.extend(self.queue.drain(..));
        let n = self.queued_bytes;
        self.sub_bytes(n);
        self.pids_in_use.clear();
        let spilled = self.spilled.take_all();
        (out, spilled)
    }
}
