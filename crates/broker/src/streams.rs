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

use crate::message::{Delivery, Message, NOT_STORED};
use crate::persist::{Op, Persist};
use crate::session::Session;
use crate::stream_sub::{StreamSub, StreamTag};
use lanemq_protocol::QoS;
use lanemq_streams::engine::{Engine, StreamHandle, StreamReader};
use lanemq_streams::subscribe::StartFrom;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, warn};

/// Most messages one feeder read takes from the index.
const FEED_BATCH_MAX: usize = 256;
/// A feeder with nothing to do looks again this often (deleted streams, lost wake-ups).
const IDLE_RECHECK: Duration = Duration::from_millis(1000);

/// Store a subscription's position if it moved (persistent sessions only).
pub fn save_position(persist: &Persist, session: &Session, sub: &StreamSub, force: bool) {
    if session.lock().expiry_s == 0 {
        return;
    }
    if let Some(value) = sub.save_due(force) {
        persist.submit(Op::StreamSubPut {
            client: session.client_id.clone(),
            filter: sub.filter.clone(),
            value,
        });
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
    engine: Arc<Engine>,
    persist: Arc<Persist>,
    session: Arc<Session>,
    sub: Arc<StreamSub>,
    generation: u64,
) -> tokio::task::JoinHandle<()> {
    sub.owner.store(generation, Ordering::Release);
    tokio::spawn(feed(engine, persist, session, sub, generation))
}

fn alive(session: &Session, sub: &StreamSub, generation: u64) -> bool {
    if sub.is_ended() || sub.owner.load(Ordering::Acquire) != generation {
        return false;
    }
    let st = session.lock();
    !st.ended && st.connected && st.generation == generation
}

async fn feed(
    engine: Arc<Engine>,
    persist: Arc<Persist>,
    session: Arc<Session>,
    sub: Arc<StreamSub>,
    generation: u64,
) {
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
                match h.filter_mismatch(wanted_filter.as_deref()) {
                    Some(captures) => {
                        if !mismatch_logged {
                            mismatch_logged = true;
                            warn!(
                                stream = %sub.name,
                                subscribed = %sub.filter,
                                %captures,
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
                save_position(&persist, &session, &sub, true);
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
                save_position(&persist, &session, &sub, false);
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
                save_position(&persist, &session, &sub, false);
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
            save_position(&persist, &session, &sub, false);
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
