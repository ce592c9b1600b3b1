//! Named streams (`/work/shared/spec/streams.md`, docs/streams.md): `$stream/<name>`,
//! `$stream/<name>/<filter>` and `$s/<offset>/<filter>` subscriptions against an in-process
//! server — start offsets, replay then live, SUBACK errors, auto-create, pending
//! subscriptions, deletion, QoS / subscription identifier / original topics, last-value
//! streams, flow control (`read_max_unacked`, Receive Maximum) and a big replay.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use lanemq_protocol::reason as rc;
use lanemq_protocol::{Packet, PubResp, Publish, QoS};
use lanemq_streams::engine::Engine;
use lanemq_streams::StreamDef;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const EARLIEST: &[(&str, &str)] = &[("stream-offset", "earliest")];

/// A server with a permissive ACL and the given streams declared in its configuration.
async fn server_with(streams: Vec<StreamDef>) -> TestServer {
    let mut cfg = stream_config();
    cfg.streams = streams;
    TestServer::start(cfg).await
}

/// The default test stream: `events` capturing `t/#`.
async fn events_server() -> TestServer {
    server_with(vec![StreamDef::new("events", "t/#")]).await
}

fn engine(s: &TestServer) -> Arc<Engine> {
    s.server().broker().streams.clone()
}

/// Create a stream at run time (blocking call on a blocking thread).
async fn create_stream(s: &TestServer, def: StreamDef) {
    let e = engine(s);
    tokio::task::spawn_blocking(move || e.create(def))
        .await
        .unwrap()
        .expect("stream created");
}

async fn delete_stream(s: &TestServer, name: &str) {
    let e = engine(s);
    let name = name.to_string();
    tokio::task::spawn_blocking(move || e.delete(&name))
        .await
        .unwrap()
        .expect("stream deleted");
}

/// Until the stream indexer caught up with everything appended to the log (bounded: 10 s).
async fn wait_indexed(s: &TestServer) {
    let e = engine(s);
    let end = e.store().next_offset();
    assert!(
        eventually(10_000, || e.indexed_offset() >= end).await,
        "the stream indexer did not reach offset {end} (at {})",
        e.indexed_offset()
    );
}

/// Publish `payload(i)` for each `i` at QoS 1 to `topic(i)` (each PUBACK awaited).
async fn publish_range(
    c: &mut RawClient,
    range: std::ops::Range<usize>,
    topic: impl Fn(usize) -> String,
) {
    for i in range {
        // 0x10 (no matching subscribers) is a success code too.
        let code = c.publish_qos1(&topic(i), format!("m{i}").as_bytes()).await;
        assert!(code == 0 || code == 0x10, "PUBACK 0x{code:02X}");
    }
}

fn t0(_: usize) -> String {
    "t/0".to_string()
}

fn payload(p: &Publish) -> String {
    String::from_utf8(p.payload.to_vec()).unwrap()
}

fn payloads(v: &[Publish]) -> Vec<String> {
    v.iter().map(payload).collect()
}

fn expected(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("m{i}")).collect()
}

fn assert_offsets_increase(v: &[Publish]) {
    let offs: Vec<u64> = v.iter().map(stream_offset_of).collect();
    assert!(
        offs.windows(2).all(|w| w[0] < w[1]),
        "stream-offset not strictly increasing: {offs:?}"
    );
}

/// Receive `n` PUBLISH packets, acknowledging QoS 1/2 ones; every packet within [`RECV_MS`].
async fn recv_n(c: &mut RawClient, n: usize) -> Vec<Publish> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(c.recv_publish_ack().await);
    }
    v
}

/// Subscribe to one stream filter with user properties; asserts the SUBACK code.
async fn sub_stream(
    c: &mut RawClient,
    filter: &str,
    qos: QoS,
    sub_id: Option<u32>,
    props: &[(&str, &str)],
) {
    let ack = c
        .subscribe_props(&[(filter, sub_opts(qos))], sub_id, props)
        .await;
    assert_eq!(
        ack.reason_codes,
        vec![qos.as_u8()],
        "SUBACK for {filter}: {ack:?}"
    );
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

// --- replay and start offsets -------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_from_earliest_then_live_has_no_gap_and_no_duplicate() {
    const N: usize = 40;
    const M: usize = 60;
    let s = events_server().await;
    let mut p = s.v5("pub").await;
    publish_range(&mut p, 0..N, t0).await;
    let mut c = s.v5("reader").await;
    sub_stream(&mut c, "$stream/events", QoS::AtLeastOnce, None, EARLIEST).await;
    // Publish the live part while the replay is being received.
    let live = tokio::spawn(async move {
        publish_range(&mut p, N..N + M, t0).await;
        p
    });
    let got = recv_n(&mut c, N + M).await;
    let p = live.await.unwrap();
    assert_eq!(payloads(&got), expected(0..N + M));
    assert_offsets_increase(&got);
    c.expect_nothing(QUIET_MS).await;
    p.disconnect().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_offset_latest_delivers_only_new_messages() {
    let s = events_server().await;
    let mut p = s.v5("pub").await;
    publish_range(&mut p, 0..5, t0).await;
    // No wait for the indexer: `latest` means "after what was published before SUBSCRIBE".
    let mut c = s.v5("reader").await;
    sub_stream(&mut c, "$stream/events", QoS::AtLeastOnce, None, &[]).await;
    let mut c2 = s.v5("reader2").await;
    sub_stream(
        &mut c2,
        "$stream/events",
        QoS::AtLeastOnce,
        None,
        &[("stream-offset", "latest")],
    )
    .await;
    publish_range(&mut p, 5..8, t0).await;
    assert_eq!(payloads(&recv_n(&mut c, 3).await), expected(5..8));
    assert_eq!(payloads(&recv_n(&mut c2, 3).await), expected(5..8));
    c.expect_nothing(QUIET_MS).await;
    c2.expect_nothing(QUIET_MS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timestamp_offset_skips_older_messages_inclusive() {
    let s = events_server().await;
    let mut p = s.v5("pub").await;
    publish_range(&mut p, 0..10, t0).await;
    // The arrival times, from a full replay.
    let mut probe = s.v5("probe").await;
    sub_stream(
        &mut probe,
        "$stream/events",
        QoS::AtLeastOnce,
        None,
        EARLIEST,
    )
    .await;
    let all = recv_n(&mut probe, 10).await;
    let ts: Vec<u64> = all
        .iter()
        .map(|m| user_prop(m, "ts").unwrap().parse().unwrap())
        .collect();
    assert!(
        ts.windows(2).all(|w| w[0] <= w[1]),
        "ts not ordered: {ts:?}"
    );
    let (lo, hi) = (ts[0], ts[9]);
    let now = now_us();
    assert!(
        lo > now - 60_000_000 && hi <= now + 1_000_000,
        "ts {ts:?} is not µs now ({now})"
    );
    // Start exactly at the 5th message's timestamp: inclusive.
    let t = ts[4];
    let want: Vec<String> = all
        .iter()
        .zip(&ts)
        .filter(|(_, &x)| x >= t)
        .map(|(m, _)| payload(m))
        .collect();
    assert_eq!(want.first().map(String::as_str), Some("m4"));
    let mut c = s.v5("reader").await;
    let t_s = t.to_string();
    sub_stream(
        &mut c,
        "$stream/events",
        QoS::AtLeastOnce,
        None,
        &[("stream-offset", t_s.as_str())],
    )
    .await;
    assert_eq!(payloads(&recv_n(&mut c, want.len()).await), want);
    c.expect_nothing(QUIET_MS).await;
    // A timestamp after everything: only new messages.
    let mut late = s.v5("late").await;
    let future = (hi + 1).to_string();
    sub_stream(
        &mut late,
        "$stream/events",
        QoS::AtLeastOnce,
        None,
        &[("stream-offset", future.as_str())],
    )
    .await;
    late.expect_nothing(QUIET_MS).await;
    publish_range(&mut p, 10..11, t0).await;
    assert_eq!(payloads(&recv_n(&mut late, 1).await), expected(10..11));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn position_offset_resumes_after_that_position() {
    let s = events_server().await;
    let mut p = s.v5("pub").await;
    publish_range(&mut p, 0..10, t0).await;
    let mut probe = s.v5("probe").await;
    sub_stream(
        &mut probe,
        "$stream/events",
        QoS::AtMostOnce,
        None,
        EARLIEST,
    )
    .await;
    let all = recv_n(&mut probe, 10).await;
    let at = format!("@{}", stream_offset_of(&all[3]));
    let mut c = s.v5("reader").await;
    sub_stream(
        &mut c,
        "$stream/events",
        QoS::AtLeastOnce,
        None,
        &[("stream-offset", at.as_str())],
    )
    .await;
    let got = recv_n(&mut c, 6).await;
    assert_eq!(payloads(&got), expected(4..10));
    assert_eq!(
        got.iter().map(stream_offset_of).collect::<Vec<_>>(),
        all[4..].iter().map(stream_offset_of).collect::<Vec<_>>()
    );
    c.expect_nothing(QUIET_MS).await;
    // And then live.
    publish_range(&mut p, 10..12, t0).await;
    assert_eq!(payloads(&recv_n(&mut c, 2).await), expected(10..12));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_start_from_property_and_s_prefix_topic() {
    let s = events_server().await;
    let mut p = s.v5("pub").await;
    publish_range(&mut p, 0..3, t0).await;
    // EMQX's legacy user property.
    let mut c = s.v5("legacy-prop").await;
    sub_stream(
        &mut c,
        "$stream/events",
        QoS::AtLeastOnce,
        None,
        &[("$stream.start-from", "earliest")],
    )
    .await;
    assert_eq!(payloads(&recv_n(&mut c, 3).await), expected(0..3));
    // `$s/<offset>/<filter>`: auto-creates the stream `/<filter>` (captures from now on).
    let mut l = s.v5("legacy-topic").await;
    sub_stream(&mut l, "$s/earliest/leg/#", QoS::AtLeastOnce, None, &[]).await;
    assert!(
        engine(&s).lookup("/leg/#").is_some(),
        "stream /leg/# created"
    );
    // The auto-created stream is a last-value one keyed by the publisher (the default
    // `auto_create`): a reader that falls behind gets only the newest message per publisher,
    // so each message is awaited before the next is published.
    let mut got = Vec::new();
    for i in 0..2 {
        publish_range(&mut p, i..i + 1, |i| format!("leg/{i}")).await;
        got.extend(recv_n(&mut l, 1).await);
    }
    assert_eq!(payloads(&got), expected(0..2));
    assert_eq!(got[0].topic, "leg/0");
    assert_eq!(got[1].topic, "leg/1");
    l.expect_nothing(QUIET_MS).await;
}

// --- SUBACK errors ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_offset_is_refused_with_0x83_and_a_reason() {
    let s = events_server().await;
    let mut c = s.v5("c").await;
    for bad in ["yesterday", "@", "@x", "-5", "", "99999999999999999999999"] {
        let ack = c
            .subscribe_props(
                &[("$stream/events", sub_opts(QoS::AtLeastOnce))],
                None,
                &[("stream-offset", bad)],
            )
            .await;
        assert_eq!(
            ack.reason_codes,
            vec![rc::IMPLEMENTATION_SPECIFIC_ERROR],
            "offset {bad:?}: {ack:?}"
        );
        let why = ack.properties.reason_string.unwrap_or_default();
        assert!(
            why.contains("$stream/events") && why.to_lowercase().contains("offset"),
            "reason string for {bad:?}: {why:?}"
        );
    }
    // Nothing was subscribed: an UNSUBSCRIBE finds no subscription.
    let u = c.unsubscribe("$stream/events").await;
    assert_eq!(u.reason_codes, vec![rc::NO_SUBSCRIPTION_EXISTED]);
    s.assert_alive().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_stream_name_is_refused_with_0x8f() {
    let s = events_server().await;
    let mut c = s.v5("c").await;
    for bad in [
        "$stream/bad name",
        "$stream/-x",
        "$stream/a*b",
        "$stream/",
        "$stream/x/a/#/b",
    ] {
        let ack = c
            .subscribe_props(&[(bad, sub_opts(QoS::AtLeastOnce))], None, &[])
            .await;
        assert_eq!(
            ack.reason_codes,
            vec![rc::TOPIC_FILTER_INVALID],
            "{bad:?}: {ack:?}"
        );
    }
    let ack = c
        .subscribe_props(
            &[("$stream/bad name", sub_opts(QoS::AtLeastOnce))],
            None,
            &[],
        )
        .await;
    let why = ack.properties.reason_string.unwrap_or_default();
    assert!(why.contains("bad name"), "reason string: {why:?}");
    c.disconnect().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt311_client_gets_0x80() {
    let s = events_server().await;
    let mut c = s.v311("old").await;
    let ack = c
        .subscribe_with(&[("$stream/events", sub_opts(QoS::AtLeastOnce))], None)
        .await;
    assert_eq!(ack.reason_codes, vec![rc::UNSPECIFIED_ERROR]);
    // The 3.1.1 client is not fed anything.
    let mut p = s.v5("pub").await;
    publish_range(&mut p, 0..1, t0).await;
    c.expect_nothing(QUIET_MS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_with_same_filter_works_and_different_filter_is_refused() {
    let s = events_server().await;
    let mut c = s.v5("c").await;
    sub_stream(&mut c, "$stream/events/t/#", QoS::AtLeastOnce, Some(3), &[]).await;
    let ack = c
        .subscribe_props(
            &[("$stream/events/x/#", sub_opts(QoS::AtLeastOnce))],
            None,
            &[],
        )
        .await;
    assert_eq!(ack.reason_codes.len(), 1);
    assert!(ack.reason_codes[0] >= 0x80, "{ack:?}");
    let why = ack.properties.reason_string.unwrap_or_default();
    assert!(
        why.contains("stream_bound_to_different_topic_filter"),
        "reason string: {why:?}"
    );
    // The stream was not changed, and no second stream was made.
    assert_eq!(engine(&s).lookup("events").unwrap().topic_filter(), "t/#");
    assert_eq!(engine(&s).stream_count(), 1);
    let mut p = s.v5("pub").await;
    publish_range(&mut p, 0..2, |i| format!("t/{i}")).await;
    publish_range(&mut p, 2..3, |_| "x/1".to_string()).await;
    let got = recv_n(&mut c, 2).await;
    assert_eq!(payloads(&got), expected(0..2));
    assert!(got
        .iter()
        .all(|m| m.properties.subscription_identifiers == vec![3]));
    c.expect_nothing(QUIET_MS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_stream_subscription_is_refused_with_0x9e() {
    let s = events_server().await;
    let mut c = s.v5("c").await;
    let ack = c
        .subscribe_props(
            &[("$share/g/$stream/events", sub_opts(QoS::AtLeastOnce))],
            None,
            EARLIEST,
        )
        .await;
    assert_eq!(
        ack.reason_codes,
        vec![rc::SHARED_SUBSCRIPTIONS_NOT_SUPPORTED]
    );
    let mut p = s.v5("pub").await;
    publish_range(&mut p, 0..1, t0).await;
    c.expect_nothing(QUIET_MS).await;
}

// --- auto-create, pending subscriptions, deletion -----------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_with_filter_auto_creates_a_lastvalue_stream() {
    let s = server_with(Vec::new()).await;
    let mut c = s.v5("c").await;
    sub_stream(&mut c, "$stream/new/n/#", QoS::AtLeastOnce, None, &[]).await;
    let h = engine(&s).lookup("new").expect("stream auto-created");
    assert_eq!(h.topic_filter(), "n/#");
    let def = h.def();
    assert!(def.is_lastvalue, "{def:?}");
    assert_eq!(def.key_expression, "message.from");
    let mut a = s.v5("pubA").await;
    let mut b = s.v5("pubB").await;
    publish_range(&mut a, 0..1, |_| "n/1".to_string()).await;
    publish_range(&mut b, 1..2, |_| "n/2/x".to_string()).await;
    let got = recv_n(&mut c, 2).await;
    assert_eq!(payloads(&got), expected(0..2));
    assert_eq!(got[0].topic, "n/1");
    assert_eq!(user_prop(&got[0], "key"), Some("pubA"));
    assert_eq!(user_prop(&got[1], "key"), Some("pubB"));
    // Subscribing again by the bare name reads the same stream.
    let mut d = s.v5("d").await;
    sub_stream(&mut d, "$stream/new", QoS::AtLeastOnce, None, EARLIEST).await;
    assert_eq!(payloads(&recv_n(&mut d, 2).await), expected(0..2));
    c.expect_nothing(QUIET_MS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_to_missing_stream_starts_when_it_is_created() {
    let s = server_with(Vec::new()).await;
    let mut c = s.v5("c").await;
    let ack = c
        .subscribe_props(
            &[("$stream/later", sub_opts(QoS::AtLeastOnce))],
            Some(5),
            &[],
        )
        .await;
    assert_eq!(ack.reason_codes, vec![1], "{ack:?}");
    let mut p = s.v5("pub").await;
    // Before the stream exists nothing is captured.
    publish_range(&mut p, 0..2, |_| "l/1".to_string()).await;
    c.expect_nothing(QUIET_MS).await;
    create_stream(&s, StreamDef::new("later", "l/#")).await;
    publish_range(&mut p, 2..5, |_| "l/1".to_string()).await;
    let got = recv_n(&mut c, 3).await;
    assert_eq!(payloads(&got), expected(2..5));
    assert!(got
        .iter()
        .all(|m| m.properties.subscription_identifiers == vec![5]));
    c.expect_nothing(QUIET_MS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_stream_stops_delivery_and_keeps_the_connection() {
    let s = events_server().await;
    let mut c = s.v5("c").await;
    sub_stream(&mut c, "$stream/events", QoS::AtLeastOnce, None, &[]).await;
    c.subscribe("plain/#", QoS::AtLeastOnce).await;
    let mut p = s.v5("pub").await;
    publish_range(&mut p, 0..2, t0).await;
    assert_eq!(payloads(&recv_n(&mut c, 2).await), expected(0..2));
    delete_stream(&s, "events").await;
    assert!(engine(&s).lookup("events").is_none());
    publish_range(&mut p, 2..5, t0).await;
    c.expect_nothing(500).await;
    // The connection is alive: ordinary subscriptions still deliver, PINGREQ is answered.
    publish_range(&mut p, 5..6, |_| "plain/x".to_string()).await;
    let m = c.recv_publish_ack().await;
    assert_eq!((m.topic.as_str(), payload(&m).as_str()), ("plain/x", "m5"));
    assert!(c.sync().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recreated_stream_feeds_a_subscription_left_pending_by_deletion() {
    let s = events_server().await;
    let mut c = s.v5("c").await;
    sub_stream(&mut c, "$stream/events", QoS::AtLeastOnce, None, &[]).await;
    let mut p = s.v5("pub").await;
    publish_range(&mut p, 0..1, t0).await;
    assert_eq!(payloads(&recv_n(&mut c, 1).await), expected(0..1));
    delete_stream(&s, "events").await;
    publish_range(&mut p, 1..2, t0).await;
    c.expect_nothing(QUIET_MS).await;
    create_stream(&s, StreamDef::new("events", "t/#")).await;
    publish_range(&mut p, 2..4, t0).await;
    assert_eq!(payloads(&recv_n(&mut c, 2).await), expected(2..4));
    c.expect_nothing(QUIET_MS).await;
}

// --- what a delivery looks like -----------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_identifier_and_qos0_grant_downgrade_qos1_publishes() {
    let s = events_server().await;
    let mut c = s.v5("c").await;
    sub_stream(&mut c, "$stream/events", QoS::AtMostOnce, Some(7), &[]).await;
    let mut p = s.v5("pub").await;
    publish_range(&mut p, 0..3, t0).await;
    for i in 0..3 {
        let m = c.recv_publish().await;
        assert_eq!(payload(&m), format!("m{i}"));
        assert_eq!(m.qos, QoS::AtMostOnce);
        assert_eq!(m.packet_id, 0);
        assert_eq!(m.properties.subscription_identifiers, vec![7]);
        assert!(!m.retain);
    }
    c.expect_nothing(QUIET_MS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos1_subscription_delivers_qos1_with_puback_flow() {
    let s = events_server().await;
    let mut c = s.v5("c").await;
    sub_stream(&mut c, "$stream/events", QoS::AtLeastOnce, Some(9), &[]).await;
    let mut p = s.v5("pub").await;
    // A QoS 0 publish stays QoS 0 (min of published and granted).
    p.publish_qos0("t/0", b"q0").await;
    publish_range(&mut p, 0..3, t0).await;
    let m = c.recv_publish().await;
    assert_eq!((payload(&m).as_str(), m.qos), ("q0", QoS::AtMostOnce));
    let mut pids = Vec::new();
    for i in 0..3 {
        let m = c.recv_publish().await;
        assert_eq!(payload(&m), format!("m{i}"));
        assert_eq!(m.qos, QoS::AtLeastOnce);
        assert_ne!(m.packet_id, 0);
        assert_eq!(m.properties.subscription_identifiers, vec![9]);
        pids.push(m.packet_id);
    }
    let mut sorted = pids.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), 3, "distinct packet ids: {pids:?}");
    for pid in pids {
        c.send(Packet::PubAck(PubResp::new(pid, 0))).await;
    }
    // Acknowledged: no resend; the next message flows.
    assert!(c.sync().await.is_empty());
    publish_range(&mut p, 3..4, t0).await;
    let m = c.recv_publish_ack().await;
    assert_eq!(
        (payload(&m).as_str(), m.qos, m.dup),
        ("m3", QoS::AtLeastOnce, false)
    );
    c.expect_nothing(QUIET_MS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_keep_their_original_topics_and_carry_stream_properties() {
    let s = events_server().await;
    let mut c = s.v5("c").await;
    sub_stream(&mut c, "$stream/events", QoS::AtLeastOnce, None, &[]).await;
    let mut p = s.v5("publisher-1").await;
    let topics = ["t/a", "t/a/b/c", "t", "t/ü/ñ"];
    let before = now_us();
    publish_range(&mut p, 0..topics.len(), |i| topics[i].to_string()).await;
    let got = recv_n(&mut c, topics.len()).await;
    assert_eq!(
        got.iter().map(|m| m.topic.as_str()).collect::<Vec<_>>(),
        topics.to_vec()
    );
    for m in &got {
        assert_eq!(user_prop(m, "key"), Some("publisher-1"));
        let ts: u64 = user_prop(m, "ts").unwrap().parse().unwrap();
        assert!(
            ts >= before - 1_000_000 && ts <= now_us() + 1_000_000,
            "ts {ts}"
        );
        assert!(user_prop(m, "stream-offset").unwrap().starts_with('@'));
        assert!(!m.topic.starts_with('$'));
    }
    assert_offsets_increase(&got);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_matching_two_streams_arrives_once_per_stream_subscription() {
    let s = server_with(vec![StreamDef::new("a", "t/#"), StreamDef::new("b", "t/+")]).await;
    let mut c = s.v5("c").await;
    sub_stream(&mut c, "$stream/a", QoS::AtLeastOnce, Some(1), &[]).await;
    sub_stream(&mut c, "$stream/b", QoS::AtLeastOnce, Some(2), &[]).await;
    let mut p = s.v5("pub").await;
    publish_range(&mut p, 0..1, |_| "t/1".to_string()).await;
    // Only stream a captures t/1/2.
    publish_range(&mut p, 1..2, |_| "t/1/2".to_string()).await;
    let got = recv_n(&mut c, 3).await;
    let mut seen: Vec<(u32, String)> = got
        .iter()
        .map(|m| {
            assert_eq!(m.properties.subscription_identifiers.len(), 1, "{m:?}");
            (m.properties.subscription_identifiers[0], payload(m))
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![(1, "m0".into()), (1, "m1".into()), (2, "m0".into())]
    );
    c.expect_nothing(QUIET_MS).await;
    // Unsubscribing one stream leaves the other.
    assert_eq!(c.unsubscribe("$stream/b").await.reason_codes, vec![0]);
    publish_range(&mut p, 2..3, |_| "t/1".to_string()).await;
    let m = c.recv_publish_ack().await;
    assert_eq!(
        (m.properties.subscription_identifiers.clone(), payload(&m)),
        (vec![1], "m2".into())
    );
    c.expect_nothing(QUIET_MS).await;
}

// --- last-value streams -------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lastvalue_stream_replays_only_the_newest_message_per_topic_key() {
    let mut def = StreamDef::new("lv", "lv/#");
    def.is_lastvalue = true;
    def.key_expression = "message.topic".into();
    let s = server_with(vec![def]).await;
    let mut p = s.v5("pub").await;
    let seq = ["lv/a", "lv/b", "lv/a", "lv/c", "lv/b", "lv/a"];
    publish_range(&mut p, 0..seq.len(), |i| seq[i].to_string()).await;
    wait_indexed(&s).await;
    let mut c = s.v5("c").await;
    sub_stream(&mut c, "$stream/lv", QoS::AtLeastOnce, None, EARLIEST).await;
    let got = recv_n(&mut c, 3).await;
    let pairs: Vec<(String, String)> = got.iter().map(|m| (m.topic.clone(), payload(m))).collect();
    assert_eq!(
        pairs,
        vec![
            ("lv/c".into(), "m3".into()),
            ("lv/b".into(), "m4".into()),
            ("lv/a".into(), "m5".into())
        ]
    );
    for m in &got {
        assert_eq!(user_prop(m, "key"), Some(m.topic.as_str()));
    }
    assert_offsets_increase(&got);
    c.expect_nothing(QUIET_MS).await;
    // A live update of a key arrives.
    publish_range(&mut p, 6..7, |_| "lv/b".to_string()).await;
    let m = c.recv_publish_ack().await;
    assert_eq!((m.topic.as_str(), payload(&m).as_str()), ("lv/b", "m6"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lastvalue_stream_keyed_by_client_id_keeps_the_newest_per_publisher() {
    let mut def = StreamDef::new("lvc", "dev/#");
    def.is_lastvalue = true;
    let s = server_with(vec![def]).await;
    let mut a = s.v5("dev-a").await;
    let mut b = s.v5("dev-b").await;
    publish_range(&mut a, 0..1, |_| "dev/x".to_string()).await;
    publish_range(&mut b, 1..2, |_| "dev/y".to_string()).await;
    publish_range(&mut a, 2..3, |_| "dev/z".to_string()).await;
    publish_range(&mut b, 3..4, |_| "dev/x".to_string()).await;
    publish_range(&mut a, 4..5, |_| "dev/x".to_string()).await;
    wait_indexed(&s).await;
    let mut c = s.v5("c").await;
    sub_stream(&mut c, "$stream/lvc", QoS::AtLeastOnce, None, EARLIEST).await;
    let got = recv_n(&mut c, 2).await;
    let keyed: Vec<(String, String)> = got
        .iter()
        .map(|m| (user_prop(m, "key").unwrap().to_string(), payload(m)))
        .collect();
    assert_eq!(
        keyed,
        vec![("dev-b".into(), "m3".into()), ("dev-a".into(), "m4".into())]
    );
    c.expect_nothing(QUIET_MS).await;
}

// --- flow control ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_max_unacked_bounds_unacknowledged_deliveries() {
    const N: usize = 50;
    let s = server_with(Vec::new()).await;
    let mut def = StreamDef::new("slow", "s/#");
    def.read_max_unacked = 5;
    create_stream(&s, def).await;
    let mut p = s.v5("pub").await;
    publish_range(&mut p, 0..N, |_| "s/1".to_string()).await;
    wait_indexed(&s).await;
    let mut c = s.v5("c").await;
    sub_stream(&mut c, "$stream/slow", QoS::AtLeastOnce, None, EARLIEST).await;
    let mut got: Vec<Publish> = Vec::new();
    for round in 0..N / 5 {
        let mut batch = Vec::new();
        for _ in 0..5 {
            batch.push(c.recv_publish().await);
        }
        // Exactly 5 unacknowledged: nothing more until acks.
        let quiet = if round == 0 { QUIET_MS } else { 100 };
        c.expect_nothing(quiet).await;
        for m in &batch {
            assert_eq!(m.qos, QoS::AtLeastOnce);
            c.send(Packet::PubAck(PubResp::new(m.packet_id, 0))).await;
        }
        got.extend(batch);
    }
    assert_eq!(payloads(&got), expected(0..N));
    assert_offsets_increase(&got);
    c.expect_nothing(QUIET_MS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_maximum_is_honoured() {
    const N: usize = 20;
    let s = events_server().await;
    let mut p = s.v5("pub").await;
    publish_range(&mut p, 0..N, t0).await;
    let mut conn = connect_v5("c");
    conn.properties.receive_maximum = Some(3);
    let mut c = RawClient::connect_ok(s.addr, conn).await;
    sub_stream(&mut c, "$stream/events", QoS::AtLeastOnce, None, EARLIEST).await;
    let mut got: Vec<Publish> = Vec::new();
    let mut unacked: std::collections::VecDeque<u16> = Default::default();
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < N {
        assert!(
            Instant::now() < deadline,
            "only {} of {N} arrived",
            got.len()
        );
        if unacked.len() == 3 {
            // The window is full: nothing more may arrive.
            let quiet = if got.len() <= 3 { QUIET_MS } else { 50 };
            c.expect_nothing(quiet).await;
            let pid = unacked.pop_front().unwrap();
            c.send(Packet::PubAck(PubResp::new(pid, 0))).await;
            continue;
        }
        let m = c.recv_publish().await;
        assert_eq!(m.qos, QoS::AtLeastOnce);
        unacked.push_back(m.packet_id);
        got.push(m);
    }
    assert_eq!(payloads(&got), expected(0..N));
    for pid in unacked {
        c.send(Packet::PubAck(PubResp::new(pid, 0))).await;
    }
    c.expect_nothing(QUIET_MS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsubscribe_stops_delivery() {
    let s = events_server().await;
    let mut c = s.v5("c").await;
    sub_stream(&mut c, "$stream/events", QoS::AtLeastOnce, None, &[]).await;
    let mut p = s.v5("pub").await;
    publish_range(&mut p, 0..2, t0).await;
    assert_eq!(payloads(&recv_n(&mut c, 2).await), expected(0..2));
    assert_eq!(c.unsubscribe("$stream/events").await.reason_codes, vec![0]);
    publish_range(&mut p, 2..5, t0).await;
    c.expect_nothing(500).await;
    // A second UNSUBSCRIBE finds nothing.
    assert_eq!(
        c.unsubscribe("$stream/events").await.reason_codes,
        vec![rc::NO_SUBSCRIPTION_EXISTED]
    );
}

// --- streams are not topics -----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_subscriber_never_sees_stream_topics() {
    let s = events_server().await;
    let mut all = s.v5("all").await;
    all.subscribe("#", QoS::AtLeastOnce).await;
    let mut reader = s.v5("reader").await;
    sub_stream(
        &mut reader,
        "$stream/events",
        QoS::AtLeastOnce,
        None,
        EARLIEST,
    )
    .await;
    let mut p = s.v5("pub").await;
    publish_range(&mut p, 0..3, |i| format!("t/{i}")).await;
    // Publishing to a $stream topic is not a way into a stream.
    let _ = p.publish_qos1("$stream/events", b"fake").await;
    let _ = p.publish_qos1("$s/earliest/t/0", b"fake").await;
    let got = recv_n(&mut all, 3).await;
    assert_eq!(
        got.iter().map(|m| m.topic.as_str()).collect::<Vec<_>>(),
        vec!["t/0", "t/1", "t/2"]
    );
    assert!(got.iter().all(|m| user_prop(m, "stream-offset").is_none()));
    all.expect_nothing(QUIET_MS).await;
    assert_eq!(payloads(&recv_n(&mut reader, 3).await), expected(0..3));
    reader.expect_nothing(QUIET_MS).await;
}

// --- volume ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_replay_of_20000_messages_is_complete_and_in_order() {
    const N: usize = 20_000;
    let s = events_server().await;
    let mut p = s.v5("pub").await;
    // QoS 0 in large writes, then a QoS 1 publish: its PUBACK follows all of them.
    let mut buf = Vec::new();
    for i in 0..N {
        buf.extend(bytes_of(
            &Packet::Publish(publish(
                "t/big",
                QoS::AtMostOnce,
                0,
                format!("m{i}").as_bytes(),
            )),
            p.version,
        ));
        if buf.len() > 64 * 1024 {
            p.send_raw(&buf).await;
            buf.clear();
        }
    }
    p.send_raw(&buf).await;
    assert!(p.publish_qos1("sync", b"").await < 0x80);
    let mut c = s.v5("reader").await;
    sub_stream(&mut c, "$stream/events", QoS::AtMostOnce, None, EARLIEST).await;
    let started = Instant::now();
    let all = tokio::time::timeout(Duration::from_secs(60), async {
        let mut last: Option<u64> = None;
        for i in 0..N {
            let m = c.recv_publish().await;
            assert_eq!(payload(&m), format!("m{i}"), "message {i}");
            let o = stream_offset_of(&m);
            assert!(last.is_none_or(|l| l < o), "offset {o} after {last:?}");
            last = Some(o);
        }
    })
    .await;
    assert!(all.is_ok(), "20000 messages not replayed within 60 s");
    eprintln!("replayed {N} messages in {:?}", started.elapsed());
    c.expect_nothing(QUIET_MS).await;
}

/// A subscription `$stream/<name>/<filter>` left pending (stream missing, auto-create off)
/// does not bind to a stream of that name created later with another filter: the ACL
/// authorized `<filter>`, not what the new stream captures. One created with the filter binds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_filtered_subscription_ignores_a_stream_with_another_filter() {
    let mut cfg = stream_config();
    cfg.streams_config.auto_create.regular = false;
    cfg.streams_config.auto_create.lastvalue = None;
    let s = TestServer::start(cfg).await;
    let mut c = s.v5("c").await;
    let ack = c
        .subscribe_props(
            &[("$stream/later/ac/#", sub_opts(QoS::AtLeastOnce))],
            None,
            EARLIEST,
        )
        .await;
    assert_eq!(ack.reason_codes, vec![1], "pending: {ack:?}");
    create_stream(&s, StreamDef::new("later", "zz/#")).await;
    let mut p = s.v5("pub").await;
    publish_range(&mut p, 0..3, |_| "zz/1".to_string()).await;
    c.expect_nothing(800).await;
    delete_stream(&s, "later").await;
    create_stream(&s, StreamDef::new("later", "ac/#")).await;
    publish_range(&mut p, 3..5, |_| "ac/1".to_string()).await;
    assert_eq!(payloads(&recv_n(&mut c, 2).await), expected(3..5));
}
