//! Stream subscriptions (`$stream/<name>`, `$stream/<name>/<filter>`, `$s/<offset>/<filter>`):
//! the ExtSub-style handler that replays a named stream and then follows it live. The
//! SUBSCRIBE policy ([`subscribe`]: start position, binding, auto-create, resubscribe) is
//! here too; the connection authorizes the full topic first and starts the feeder after.
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
use lanemq_protocol::{QoS, SubscriptionOptions};
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
/// Longest wait of a new subscription for the stream indexer to reach the log's end.
const CATCH_UP_MAX: Duration = Duration::from_secs(2);

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

/// A SUBSCRIBE to a stream topic as the connection received it, already authorized on its
/// full filter (`$stream/...` is never routed: this module owns it).
pub struct SubscribeRequest<'a> {
    /// `$stream/<name>[/<filter>]` or `$s/<offset>/<filter>`.
    pub filter: &'a str,
    pub options: SubscriptionOptions,
    pub sub_id: Option<u32>,
    /// The SUBSCRIBE's user properties (`stream-offset`).
    pub user_properties: &'a [(String, String)],
    /// `mqtt.maximum_qos`: the granted QoS is at most this.
    pub maximum_qos: u8,
    /// The session outlives its connection: the subscription is stored.
    pub persistent: bool,
}

/// A stream SUBSCRIBE accepted: the connection starts [`spawn_feeder`] for `sub` unless it
/// was `kept` and its feeder still runs.
pub struct Subscribed {
    /// The granted QoS (the SUBACK code).
    pub qos: u8,
    pub sub: Arc<StreamSub>,
    /// The same subscription was already there (mosquitto_sub -c re-subscribes on every run):
    /// it keeps its position, a persistent session resumes after its last acknowledgement.
    pub kept: bool,
    /// For the SUBACK's reason string: why nothing arrives yet (the stream does not exist).
    pub note: Option<String>,
    /// The index ticket of the stored subscription (persistent sessions).
    pub ticket: Option<u64>,
}

/// A stream SUBSCRIBE refused: the MQTT 5 SUBACK code and the reason string.
pub struct Refused {
    pub code: u8,
    pub why: String,
}

/// The `$stream/` subscribe policy: parse the topic and the start position (topic or the
/// `stream-offset` user property), bind to the stream if its filter is the one subscribed,
/// auto-create it when `streams_config.auto_create` allows and `may_create` (the ACL's
/// `create` on the name and `subscribe` on the filter) agrees, keep an identical existing
/// subscription, or replace it and store the new one. Blocking parts (create, the first
/// index lookup) run under `block_in_place`; `create(def, internal)` creates the stream (the
/// broker's: cluster-wide in cluster mode).
pub fn subscribe(
    engine: &Arc<Engine>,
    persist: &Persist,
    session: &Session,
    req: SubscribeRequest<'_>,
    may_create: impl FnOnce(&str) -> bool,
    create: impl FnOnce(
        lanemq_streams::StreamDef,
        bool,
    ) -> Result<lanemq_streams::StreamInfo, lanemq_streams::StreamError>,
) -> Result<Subscribed, Refused> {
    use lanemq_protocol::reason as rc;
    use lanemq_streams::subscribe::{offset_from_user_properties, parse_topic};
    use lanemq_streams::{StreamDef, StreamError};
    let filter = req.filter;
    let fail = |code: u8, why: String| Err(Refused { code, why });
    if !engine.is_enabled() {
        return fail(
            rc::IMPLEMENTATION_SPECIFIC_ERROR,
            "streams are disabled (streams_config.enable = false)".into(),
        );
    }
    let t = match parse_topic(filter) {
        Ok(t) => t,
        Err(e) => return fail(rc::TOPIC_FILTER_INVALID, e.0),
    };
    let start = match t.start {
        Some(s) => s,
        None => match offset_from_user_properties(req.user_properties) {
            Ok(s) => s.unwrap_or(StartFrom::Latest),
            Err(e) => return fail(rc::IMPLEMENTATION_SPECIFIC_ERROR, e.0),
        },
    };
    let mut handle = engine.lookup(&t.name);
    let mut note = None;
    let mismatch = |h: &StreamHandle| {
        h.filter_mismatch(t.filter.as_deref()).map(|captures| {
            format!(
                "stream_bound_to_different_topic_filter: stream {:?} captures {captures:?}",
                t.name
            )
        })
    };
    if let Some(reason) = handle.as_deref().and_then(mismatch) {
        return fail(rc::IMPLEMENTATION_SPECIFIC_ERROR, reason);
    }
    match (&handle, &t.filter) {
        (None, Some(flt)) => {
            let settings = engine.settings();
            let lastvalue = settings.auto_create.lastvalue.clone();
            if lastvalue.is_none() && !settings.auto_create.regular {
                note = Some(format!(
                    "stream {:?} does not exist (auto-create is off); the subscription \
                     starts when it is created",
                    t.name
                ));
            } else {
                // Auto-create: `create` on the stream and `subscribe` on its filter.
                if !may_create(filter) {
                    return fail(
                        rc::NOT_AUTHORIZED,
                        format!(
                            "not authorized to create stream {:?} capturing {flt:?}",
                            t.name
                        ),
                    );
                }
                let mut def = StreamDef::new(&t.name, flt);
                match lastvalue {
                    Some(lv) => {
                        def.is_lastvalue = true;
                        def.key_expression = lv.key_expression;
                    }
                    None => def.data_retention_period = settings.regular_stream_retention_period,
                }
                let legacy = t.legacy;
                let created = tokio::task::block_in_place(move || create(def, legacy));
                match created {
                    Ok(_) | Err(StreamError::AlreadyExists(_)) => {
                        handle = engine.lookup(&t.name);
                        if let Some(reason) = handle.as_deref().and_then(mismatch) {
                            return fail(rc::IMPLEMENTATION_SPECIFIC_ERROR, reason);
                        }
                    }
                    Err(e @ StreamError::MaxStreamCount(_)) => {
                        return fail(rc::QUOTA_EXCEEDED, e.to_string())
                    }
                    Err(e @ StreamError::Invalid(_)) => {
                        return fail(rc::TOPIC_FILTER_INVALID, e.to_string())
                    }
                    Err(e) => return fail(rc::IMPLEMENTATION_SPECIFIC_ERROR, e.to_string()),
                }
            }
        }
        (None, None) => {
            note = Some(format!(
                "stream {:?} does not exist yet; the subscription starts when it is created",
                t.name
            ));
        }
        _ => {}
    }
    let mut options = req.options;
    options.qos = QoS::from_u8(options.qos.as_u8().min(req.maximum_qos)).unwrap_or(QoS::AtMostOnce);
    let qos = options.qos.as_u8();
    let existing = session.lock().stream_subs.get(filter).cloned();
    if let Some(old) = existing {
        if !old.is_ended()
            && old.start == start
            && old.options == options
            && old.sub_id == req.sub_id
        {
            return Ok(Subscribed {
                qos,
                sub: old,
                kept: true,
                note,
                ticket: None,
            });
        }
    }
    let sub = StreamSub::new(
        filter.to_string(),
        t.name.clone(),
        options,
        req.sub_id,
        start,
    );
    if let Some(h) = &handle {
        tokio::task::block_in_place(|| sub.bind_now(engine, h));
    }
    let old = session
        .lock()
        .stream_subs
        .insert(filter.to_string(), sub.clone());
    if let Some(old) = old {
        old.end();
        // What the replaced subscription queued and did not send yet is dropped (it was
        // never delivered); the new one reads from its own start.
        session.drop_queued_stream(&old);
    }
    let ticket = req.persistent.then(|| {
        persist.submit(Op::StreamSubPut {
            client: session.client_id.clone(),
            filter: filter.to_string(),
            value: sub.stored().encode(),
        })
    });
    Ok(Subscribed {
        qos,
        sub,
        kept: false,
        note,
        ticket,
    })
}

/// Wait (at most [`CATCH_UP_MAX`]) until the stream indexer has indexed the log below
/// `offset`. A reader that subscribes right after its PUBACKs then finds those messages in the
/// history; without it a last-value stream's snapshot could show an older value first and the
/// newer one as a live update.
async fn caught_up(engine: &Engine, offset: u64) {
    let deadline = tokio::time::Instant::now() + CATCH_UP_MAX;
    while engine.indexed_offset() < offset && tokio::time::Instant::now() < deadline {
        engine.poke();
        tokio::time::sleep(Duration::from_millis(1)).await;
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
    // Everything appended before the SUBSCRIBE is in the history it reads (read your writes).
    let subscribed_at = persist.store.next_offset();
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
        caught_up(&engine, subscribed_at).await;
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
