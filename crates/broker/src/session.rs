//! Session state (MQTT 5 section 4.1): subscriptions, the queue of messages not yet sent, the
//! outbound inflight window and the inbound QoS 2 packet identifiers.
//!
//! A session outlives its connections. It is shared between its connection task (which drains
//! the queue, assigns packet identifiers and handles acknowledgements) and publishers (which
//! push deliveries). The lock is never held across an `.await`.
//!
//! Seam for the durable store: a [`Delivery`] refers to its message by `Arc`; the store issue
//! turns the offline part of the queue into log positions without changing this interface.

use crate::message::{Delivery, NOT_STORED};
use crate::persist::{Op, Persist};
use crate::streams::StreamSub;
use lanemq_protocol::{ProtocolVersion, QoS, SubscriptionOptions};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::Notify;

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
}

/// Outcome of [`Session::push`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushOutcome {
    Queued,
    /// Queued, but the connected session's queue is above its back-pressure mark: the
    /// publisher should pause reading until it drains ([`Session::wait_for_space`]).
    Congested,
    /// QoS 0 to an offline session, or queue full: dropped and counted.
    Dropped,
}

#[derive(Debug)]
pub struct SessionState {
    /// Generation of the connection that owns the session; bumped on every (re)connect.
    pub generation: u64,
    pub connected: bool,
    pub kick: Option<Kick>,
    /// Set once the session has ended; pushes are then ignored.
    pub ended: bool,
    pub protocol: ProtocolVersion,
    /// Session Expiry Interval in seconds (u32::MAX: never).
    pub expiry_s: u32,
    /// Full filters as subscribed (including `$share/<group>/`).
    pub subscriptions: HashMap<String, Subscription>,
    pub queue: VecDeque<Delivery>,
    pub queued_bytes: usize,
    pub inflight: VecDeque<Inflight>,
    pub pids_in_use: HashSet<u16>,
    pub next_pid: u16,
    /// Inbound QoS 2 packet identifiers received and PUBREC'd, waiting for PUBREL.
    pub inbound_qos2: HashSet<u16>,
    pub max_queued: usize,
    pub outbound_bytes_max: usize,
    pub dropped: u64,
    /// Wakes the owning connection task (new deliveries, a kick). Replaced on every connect;
    /// `None` while offline.
    pub waker: Option<Arc<Notify>>,
    /// Queue length above which publishers feeding this connected session pause (0: never).
    pub backpressure_messages: usize,
    /// A publisher waits on `Session::space`.
    pub space_waiters: bool,
    /// Next persisted queue sequence number.
    pub next_seq: u64,
    /// During start-up replay: offsets already in the restored queue (de-duplication).
    pub replay_offsets: Option<HashSet<u64>>,
    /// Stream subscriptions by full filter (`$stream/...`, `$s/...`); not in the router.
    pub stream_subs: HashMap<String, Arc<StreamSub>>,
}

pub struct Session {
    pub client_id: Arc<str>,
    state: Mutex<SessionState>,
    /// Signalled when a congested queue has drained below half its back-pressure mark.
    space: Notify,
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
        max_queued: usize,
        outbound_bytes_max: usize,
    ) -> Session {
        Session {
            client_id,
            state: Mutex::new(SessionState {
                generation: 0,
                connected: false,
                kick: None,
                ended: false,
                protocol,
                expiry_s: 0,
                subscriptions: HashMap::new(),
                queue: VecDeque::new(),
                queued_bytes: 0,
                inflight: VecDeque::new(),
                pids_in_use: HashSet::new(),
                next_pid: 1,
                inbound_qos2: HashSet::new(),
                max_queued,
                outbound_bytes_max,
                dropped: 0,
                waker: None,
                backpressure_messages: 0,
                space_waiters: false,
                next_seq: 1,
                replay_offsets: None,
                stream_subs: HashMap::new(),
            }),
            space: Notify::new(),
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
    }

    /// Queue a delivery. QoS 0 is only queued for a connected session; the queue is bounded
    /// by `max_queued` messages and, for connected QoS 0, by the outbound byte budget.
    pub fn push(&self, mut d: Delivery, persist: Option<&Persist>) -> PushOutcome {
        let mut st = self.lock();
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
            if !st.connected || st.queued_bytes + cost > st.outbound_bytes_max {
                st.dropped += 1;
                return PushOutcome::Dropped;
            }
        } else if st.queue.len() >= st.max_queued {
            st.dropped += 1;
            if st.connected && st.kick.is_none() {
                st.kick = Some(Kick::SlowConsumer);
                st.wake();
            }
            return PushOutcome::Dropped;
        }
        st.queued_bytes += cost;
        if let Some(p) = persist {
            if st.expiry_s > 0 && d.qos != QoS::AtMostOnce && d.msg.offset != NOT_STORED {
                d.seq = st.next_seq;
                st.next_seq += 1;
                p.submit(Op::QueuePush {
                    client: self.client_id.clone(),
                    seq: d.seq,
                    offset: d.msg.offset,
                    qos: d.qos.as_u8(),
                    retain: d.retain,
                });
            }
        }
        st.queue.push_back(d);
        if st.queue.len() == 1 {
            st.wake();
        }
        if st.is_congested() {
            PushOutcome::Congested
        } else {
            PushOutcome::Queued
        }
    }

    /// Queue a stream delivery. Its feeder already bounds how many are queued or in flight
    /// (`read_max_unacked`), so neither the queue limit nor the QoS 0 byte budget applies.
    pub fn push_stream(&self, d: Delivery) {
        let mut st = self.lock();
        if st.ended {
            return;
        }
        st.queued_bytes += d.msg.cost();
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
            st.queued_bytes += d.msg.cost();
            st.queue.push_back(d);
        }
        if was_empty {
            st.wake();
        }
        true
    }

    /// Remove lane deliveries matching `pred`, queued or in flight (a batch handed to another
    /// member, an expired lane). Returns how many.
    pub fn revoke_lane(&self, pred: impl Fn(&crate::lite::LaneTag) -> bool) -> usize {
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
        st.queued_bytes = st.queued_bytes.saturating_sub(freed);
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
    pub fn revoke_queued_lane(&self, pred: impl Fn(&crate::lite::LaneTag) -> bool) -> Vec<u64> {
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
        st.queued_bytes = st.queued_bytes.saturating_sub(freed);
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
        st.queued_bytes = st.queued_bytes.saturating_sub(freed);
    }

    /// Wait until this session's queue is no longer congested (or the session went offline).
    /// The caller bounds the wait with a timeout.
    pub async fn wait_for_space(&self) {
        loop {
            let notified = self.space.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.lock();
                if !st.connected || st.ended || !st.is_congested() {
                    return;
                }
                st.space_waiters = true;
            }
            notified.await;
        }
    }

    /// Called by the owning connection after draining: release waiting publishers once the
    /// queue is below half the mark.
    pub fn release_space(&self, st: &mut SessionState) {
        if st.space_waiters && !st.is_congested_low() {
            st.space_waiters = false;
            self.space.notify_waiters();
        }
    }
}

impl SessionState {
    /// Above the back-pressure mark (messages, or half the outbound byte budget).
    pub fn is_congested(&self) -> bool {
        self.connected
            && self.backpressure_messages > 0
            && (self.queue.len() >= self.backpressure_messages
                || self.queued_bytes >= self.outbound_bytes_max / 2)
    }

    /// Still above the low-water mark (half the back-pressure mark).
    fn is_congested_low(&self) -> bool {
        self.connected
            && self.backpressure_messages > 0
            && (self.queue.len() >= self.backpressure_messages / 2
                || self.queued_bytes >= self.outbound_bytes_max / 4)
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
        self.queued_bytes = self.queued_bytes.saturating_sub(d.msg.cost());
        Some(d)
    }

    /// Drop everything queued and inflight (clean start, session end); returns what was pending
    /// so shared-subscription messages can go to another member.
    pub fn drain_pending(&mut self) -> Vec<Delivery> {
        // A QoS 2 message whose PUBREC arrived was received by the client: not pending.
        let mut out: Vec<Delivery> = self
            .inflight
            .drain(..)
            .filter(|i| i.stage != InflightStage::PubComp)
            .map(|i| i.delivery)
            .collect();
        out.extend(self.queue.drain(..));
        self.queued_bytes = 0;
        self.pids_in_use.clear();
        out
    }
}
