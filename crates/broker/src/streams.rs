//! Stream subscriptions (`$stream/<name>`, `$stream/<name>/<filter>`, `$s/<offset>/<filter>`):
//! the ExtSub-style handler that replays a named stream and then follows it live.
//!
//! A stream subscription never enters the router. Each one is a [`StreamSub`] in its session,
//! fed by one *feeder* task per connection: the feeder reads the stream index in batches on a
//! blocking thread and pushes the messages into the session queue, where the connection's
//! ordinary drain sends them within the client's Receive Maximum. At most `read_max_unacked`
//! messages of one subscription are queued or in flight at any time, so a replay of a million
//! messages holds at most that many in memory; the feeder pauses until acknowledgements
//! (PUBACK, PUBCOMP, or the write of a QoS 0 PUBLISH) make room.
//!
//! Positions are log offsets. The stream index only grows at its end, in log order, so a
//! feeder that moves forward from its position sees history and then live messages with no gap
//! and no duplicate. The *acknowledged position* is the highest offset below which everything
//! delivered was acknowledged; a persistent session stores it (tree `b_stream_subs`) and
//! resumes after it on reconnect and after a restart.

use crate::broker::Broker;
use crate::message::{Delivery, Message, NOT_STORED};
use crate::persist::Op;
use crate::session::Session;
use lanemq_protocol::{QoS, SubscriptionOptions};
use lanemq_streams::engine::{Engine, StreamHandle, StreamReader};
use lanemq_streams::subscribe::StartFrom;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tracing::{debug, warn};

/// Most messages one feeder read takes from the index.
const FEED_BATCH_MAX: usize = 256;
/// A feeder with nothing to do looks again this often (deleted streams, lost wake-ups).
const IDLE_RECHECK: Duration = Duration::from_millis(1000);
/// The acknowledged position is stored at most this often while messages flow.
const SAVE_INTERVAL: Duration = Duration::from_millis(200);

/// One stream subscription of a session.
#[derive(Debug)]
pub struct StreamSub {
    /// The filter as subscribed (`$stream/...` or `$s/...`).
    pub filter: String,
    /// The stream's name (`/<filter>` for the legacy `$s/` form).
    pub name: String,
    /// Options with the granted QoS.
    pub options: SubscriptionOptions,
    pub sub_id: Option<u32>,
    /// Where a subscription without a stored position starts.
    pub start: StartFrom,
    state: Mutex<SubState>,
    /// Signalled when acknowledgements make room, and when the subscription ends.
    pub space: Notify,
    ended: AtomicBool,
    /// Generation of the connection whose feeder may push (older feeders stop).
    owner: AtomicU64,
}

#[derive(Debug, Default)]
struct SubState {
    /// Stream the position belongs to (a stream deleted and created again starts afresh).
    stream_id: Option<u64>,
    /// Next position to read; `None` until resolved against the stream.
    next: Option<u64>,
    /// Positions pushed and not yet acknowledged.
    outstanding: BTreeSet<u64>,
    /// Highest position pushed.
    pushed: Option<u64>,
    /// Position last stored.
    saved: Option<u64>,
    saved_at: Option<Instant>,
}

/// What a persisted stream subscription holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredStreamSub {
    pub name: String,
    pub options: SubscriptionOptions,
    pub sub_id: Option<u32>,
    pub start: StartFrom,
    pub stream_id: Option<u64>,
    /// Acknowledged position: resume after it.
    pub position: Option<u64>,
}

impl StoredStreamSub {
    /// `v1 | qos u8, flags u8 | sub_id u32 (0 = none) | start tag u8 | start u64 | stream id u64 (0 =
    /// none) | has position u8 | position u64 | name`.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(32 + self.name.len());
        v.push(1);
        let o = crate::persist::encode_sub(&self.options, None);
        v.extend_from_slice(&o[..2]);
        v.extend_from_slice(&self.sub_id.unwrap_or(0).to_be_bytes());
        let (tag, val) = match self.start {
            StartFrom::Earliest => (0u8, 0u64),
            StartFrom::Latest => (1, 0),
            StartFrom::TimestampUs(t) => (2, t),
            StartFrom::After(o) => (3, o),
        };
        v.push(tag);
        v.extend_from_slice(&val.to_be_bytes());
        v.extend_from_slice(&self.stream_id.unwrap_or(0).to_be_bytes());
        v.push(u8::from(self.position.is_some()));
        v.extend_from_slice(&self.position.unwrap_or(0).to_be_bytes());
        v.extend_from_slice(self.name.as_bytes());
        v
    }

    pub fn decode(v: &[u8]) -> Option<StoredStreamSub> {
        if *v.first()? != 1 {
            return None;
        }
        let be32 = |r: std::ops::Range<usize>| -> Option<u32> {
            Some(u32::from_be_bytes(v.get(r)?.try_into().ok()?))
        };
        let be64 = |r: std::ops::Range<usize>| -> Option<u64> {
            Some(u64::from_be_bytes(v.get(r)?.try_into().ok()?))
        };
        let mut opts = [0u8; 6];
        opts[..2].copy_from_slice(v.get(1..3)?);
        let (options, _) = crate::persist::decode_sub(&opts);
        let sub_id = be32(3..7).filter(|&i| i != 0);
        let val = be64(8..16)?;
        let start = match *v.get(7)? {
            0 => StartFrom::Earliest,
            1 => StartFrom::Latest,
            2 => StartFrom::TimestampUs(val),
            3 => StartFrom::After(val),
            _ => return None,
        };
        let stream_id = be64(16..24).filter(|&i| i != 0);
        let has_pos = *v.get(24)? != 0;
        let position = be64(25..33).filter(|_| has_pos);
        let name = std::str::from_utf8(v.get(33..)?).ok()?.to_string();
        Some(StoredStreamSub {
            name,
            options,
            sub_id,
            start,
            stream_id,
            position,
        })
    }
}

impl StreamSub {
    pub fn new(
        filter: String,
        name: String,
        options: SubscriptionOptions,
        sub_id: Option<u32>,
        start: StartFrom,
    ) -> Arc<StreamSub> {
        Arc::new(StreamSub {
            filter,
            name,
            options,
            sub_id,
            start,
            state: Mutex::new(SubState::default()),
            space: Notify::new(),
            ended: AtomicBool::new(false),
            owner: AtomicU64::new(0),
        })
    }

    /// A subscription restored from the index.
    pub fn restored(filter: String, s: StoredStreamSub) -> Arc<StreamSub> {
        let sub = StreamSub::new(filter, s.name, s.options, s.sub_id, s.start);
        {
            let mut st = sub.lock();
            st.stream_id = s.stream_id;
            st.next = s.position.map(|p| p.saturating_add(1));
            st.saved = s.position;
        }
        sub
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SubState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Resolve the start position now (at SUBSCRIBE: `latest` means "from now on").
    pub fn bind_now(&self, engine: &Engine, h: &StreamHandle) {
        let pos = engine.start_position(h, self.start).unwrap_or_else(|e| {
            warn!(stream = %h.name, error = %e, "cannot resolve the stream offset; from the start");
            0
        });
        let mut st = self.lock();
        st.stream_id = Some(h.id);
        st.next = Some(pos);
    }

    pub fn end(&self) {
        self.ended.store(true, Ordering::Release);
        self.space.notify_waiters();
    }

    pub fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// A pushed message is finished (acknowledged, or discarded as if delivered).
    pub fn ack(&self, offset: u64) {
        let mut st = self.lock();
        if st.outstanding.remove(&offset) {
            drop(st);
            self.space.notify_waiters();
        }
    }

    /// The acknowledged position: everything delivered up to it was acknowledged.
    pub fn acked_position(&self) -> Option<u64> {
        let st = self.lock();
        Self::acked_of(&st)
    }

    fn acked_of(st: &SubState) -> Option<u64> {
        match st.outstanding.first() {
            Some(&o) => o.checked_sub(1).or(st.saved),
            // Everything before the read position was delivered and acknowledged, or skipped.
            None => match st.next {
                Some(n) => n.checked_sub(1).or(st.saved),
                None => st.pushed.or(st.saved),
            },
        }
    }

    pub fn stored(&self) -> StoredStreamSub {
        let st = self.lock();
        StoredStreamSub {
            name: self.name.clone(),
            options: self.options,
            sub_id: self.sub_id,
            start: self.start,
            stream_id: st.stream_id,
            position: Self::acked_of(&st),
        }
    }

    /// The value to store if the acknowledged position moved (and `force` or the save
    /// interval passed).
    fn save_due(&self, force: bool) -> Option<Vec<u8>> {
        let (pos, due) = {
            let st = self.lock();
            let pos = Self::acked_of(&st);
            let idle = st.outstanding.is_empty();
            let due = pos != st.saved
                && (force || idle || st.saved_at.is_none_or(|t| t.elapsed() >= SAVE_INTERVAL));
            (pos, due)
        };
        if !due {
            return None;
        }
        let v = self.stored().encode();
        let mut st = self.lock();
        st.saved = pos;
        st.saved_at = Some(Instant::now());
        Some(v)
    }
}

/// Store a subscription's position if it moved (persistent sessions only).
pub fn save_position(broker: &Broker, session: &Session, sub: &StreamSub, force: bool) {
    if session.lock().expiry_s == 0 {
        return;
    }
    if let Some(value) = sub.save_due(force) {
        broker.persist.submit(Op::StreamSubPut {
            client: session.client_id.clone(),
            filter: sub.filter.clone(),
            value,
        });
    }
}

/// A delivery's link back to its stream subscription.
#[derive(Debug, Clone)]
pub struct StreamTag {
    pub sub: Arc<StreamSub>,
    pub offset: u64,
}

impl StreamTag {
    pub fn done(&self) {
        self.sub.ack(self.offset);
    }
}

/// Counts a subscriber on a stream for as long as a feeder is bound to it.
struct Bound(Arc<StreamHandle>);
impl Bound {
    fn new(h: Arc<StreamHandle>) -> Bound {
        h.subscriber_delta(true);
        Bound(h)
    }
}
impl Drop for Bound {
    fn drop(&mut self) {
        self.0.subscriber_delta(false);
    }
}

/// Start the feeder of `sub` for the connection of `generation`.
pub fn spawn_feeder(
    broker: Arc<Broker>,
    session: Arc<Session>,
    sub: Arc<StreamSub>,
    generation: u64,
) -> tokio::task::JoinHandle<()> {
    sub.owner.store(generation, Ordering::Release);
    tokio::spawn(feed(broker, session, sub, generation))
}

fn alive(session: &Session, sub: &StreamSub, generation: u64) -> bool {
    if sub.is_ended() || sub.owner.load(Ordering::Acquire) != generation {
        return false;
    }
    let st = session.lock();
    !st.ended && st.connected && st.generation == generation
}

async fn feed(broker: Arc<Broker>, session: Arc<Session>, sub: Arc<StreamSub>, generation: u64) {
    let engine = broker.streams.clone();
    let check = Duration::from_millis(
        engine
            .settings()
            .check_stream_status_interval
            .as_millis()
            .max(100),
    );
    let wanted_filter = lanemq_streams::subscribe::parse_topic(&sub.filter)
        .ok()
        .and_then(|t| t.filter);
    let mut mismatch_logged = false;
    'bind: loop {
        // Wait for the stream to exist.
        let h = loop {
            if !alive(&session, &sub, generation) {
                return;
            }
            let created = engine.registry_changed.notified();
            tokio::pin!(created);
            created.as_mut().enable();
            if let Some(h) = engine.lookup(&sub.name) {
                // `$stream/<name>/<filter>` binds only to a stream of that filter: the ACL
                // authorized that filter, not whatever a stream created later captures.
                match &wanted_filter {
                    Some(f) if h.topic_filter() != *f => {
                        if !mismatch_logged {
                            mismatch_logged = true;
                            warn!(
                                stream = %sub.name,
                                subscribed = %sub.filter,
                                captures = %h.topic_filter(),
                                "pending stream subscription not bound: the stream captures a \
                                 different topic filter"
                            );
                        }
                    }
                    _ => break h,
                }
            }
            tokio::select! {
                _ = &mut created => {}
                _ = sub.space.notified() => {}
                _ = tokio::time::sleep(check) => {}
            }
        };
        let fresh = {
            let st = sub.lock();
            st.stream_id != Some(h.id) || st.next.is_none()
        };
        if fresh {
            // First binding, or the stream was deleted and created again: a pending
            // subscription reads the new stream from its beginning.
            let pos = match sub.start {
                StartFrom::Latest => h.created_offset,
                s => {
                    let e = engine.clone();
                    let hh = h.clone();
                    tokio::task::spawn_blocking(move || e.start_position(&hh, s))
                        .await
                        .ok()
                        .and_then(|r| r.ok())
                        .unwrap_or(0)
                }
            };
            let mut st = sub.lock();
            st.stream_id = Some(h.id);
            st.next = Some(pos);
            st.outstanding.clear();
        }
        let _bound = Bound::new(h.clone());
        debug!(stream = %h.name, filter = %sub.filter, "stream subscription bound");
        let mut reader = StreamReader::for_start(sub.lock().next.unwrap_or(0), sub.start);
        loop {
            if !alive(&session, &sub, generation) {
                save_position(&broker, &session, &sub, true);
                return;
            }
            if h.is_deleted() {
                debug!(stream = %h.name, "stream deleted: subscription pending again");
                continue 'bind;
            }
            let room = h.read_max_unacked().max(1) as usize;
            let outstanding = sub.lock().outstanding.len();
            let space = sub.space.notified();
            tokio::pin!(space);
            space.as_mut().enable();
            if outstanding >= room {
                save_position(&broker, &session, &sub, false);
                tokio::select! {
                    _ = &mut space => {}
                    _ = tokio::time::sleep(IDLE_RECHECK) => {}
                }
                continue;
            }
            let more = h.notify.notified();
            tokio::pin!(more);
            more.as_mut().enable();
            let want = (room - outstanding).min(FEED_BATCH_MAX);
            let (e, hh) = (engine.clone(), h.clone());
            let res = tokio::task::spawn_blocking(move || {
                let r = e.read(&hh, &mut reader, want);
                (r, reader)
            })
            .await;
            let batch = match res {
                Ok((Ok(b), r)) => {
                    reader = r;
                    b
                }
                Ok((Err(err), r)) => {
                    reader = r;
                    warn!(stream = %h.name, error = %err, "stream read failed; retrying");
                    tokio::time::sleep(IDLE_RECHECK).await;
                    continue;
                }
                Err(_) => return,
            };
            if batch.is_empty() {
                sub.lock().next = Some(reader.next);
                save_position(&broker, &session, &sub, false);
                tokio::select! {
                    _ = &mut more => {}
                    _ = &mut space => {}
                    _ = tokio::time::sleep(IDLE_RECHECK) => {}
                }
                continue;
            }
            for m in batch {
                let d = {
                    let mut st = sub.lock();
                    if sub.owner.load(Ordering::Acquire) != generation || sub.is_ended() {
                        return;
                    }
                    st.outstanding.insert(m.offset);
                    st.pushed = Some(st.pushed.map_or(m.offset, |p| p.max(m.offset)));
                    st.next = Some(m.offset + 1);
                    delivery(&sub, m)
                };
                session.push_stream(d);
            }
            save_position(&broker, &session, &sub, false);
        }
    }
}

/// The delivery of one stream message: original topic, granted QoS, the subscription
/// identifier, and the user properties `stream-offset` (`@<position>`), `ts` and `key`.
fn delivery(sub: &Arc<StreamSub>, m: lanemq_streams::engine::StreamMessage) -> Delivery {
    let mut msg = Message::from_record(&m.record);
    msg.offset = NOT_STORED;
    let up = &mut msg.properties.user_properties;
    up.push(("stream-offset".into(), format!("@{}", m.offset)));
    up.push(("ts".into(), m.record.timestamp_us.to_string()));
    if let Some(k) = m.key {
        up.push(("key".into(), k));
    }
    let qos = QoS::from_u8(msg.qos.as_u8().min(sub.options.qos.as_u8())).unwrap_or(QoS::AtMostOnce);
    Delivery {
        msg: Arc::new(msg),
        qos,
        retain: false,
        sub_ids: sub.sub_id.into_iter().collect(),
        share: None,
        seq: 0,
        stream: Some(StreamTag {
            sub: sub.clone(),
            offset: m.offset,
        }),
        lane: None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn stored_stream_sub_round_trips() {
        let options = SubscriptionOptions {
            qos: QoS::AtLeastOnce,
            ..Default::default()
        };
        for (start, position, sub_id) in [
            (StartFrom::Earliest, None, None),
            (StartFrom::Latest, Some(0), Some(7)),
            (
                StartFrom::TimestampUs(1_700_000_000_000_000),
                Some(42),
                None,
            ),
            (StartFrom::After(9), Some(u64::MAX - 1), Some(268_435_455)),
        ] {
            let s = StoredStreamSub {
                name: "events.v1".into(),
                options,
                sub_id,
                start,
                stream_id: Some(3),
                position,
            };
            assert_eq!(StoredStreamSub::decode(&s.encode()), Some(s));
        }
        assert_eq!(StoredStreamSub::decode(&[]), None);
        assert_eq!(StoredStreamSub::decode(&[2, 0, 0]), None);
    }

    #[test]
    fn acked_position_is_below_the_oldest_outstanding_message() {
        let sub = StreamSub::new(
            "$stream/s".into(),
            "s".into(),
            SubscriptionOptions::default(),
            None,
            StartFrom::Earliest,
        );
        assert_eq!(sub.acked_position(), None);
        {
            let mut st = sub.lock();
            for o in [10, 11, 15] {
                st.outstanding.insert(o);
            }
            st.pushed = Some(15);
            st.next = Some(16);
        }
        assert_eq!(sub.acked_position(), Some(9));
        sub.ack(11);
        assert_eq!(sub.acked_position(), Some(9));
        sub.ack(10);
        assert_eq!(sub.acked_position(), Some(14));
        sub.ack(15);
        assert_eq!(sub.acked_position(), Some(15));
    }
}
