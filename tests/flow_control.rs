//! MQTT 5.0 section 4.9 (flow control), 3.1.2.11.3 / 3.1.2.11.4 (Receive Maximum, Maximum
//! Packet Size) and session queue limits.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use lanemq_protocol::reason as rc;
use lanemq_protocol::{Packet, PubResp, QoS};
use std::sync::atomic::Ordering;
use std::time::Duration;

#[tokio::test]
async fn mqtt5_4_9_0_2_client_receive_maximum_respected() {
    let srv = TestServer::default().await;
    let mut conn = connect_v5("rm");
    conn.properties.receive_maximum = Some(2);
    let mut sub = RawClient::connect_ok(srv.addr, conn).await;
    sub.subscribe("rm/t", QoS::AtLeastOnce).await;
    let mut publ = srv.v5("pub").await;
    for i in 0..5u8 {
        publ.publish_qos1("rm/t", &[i]).await;
    }
    // [MQTT-3.3.4-7] never more than Receive Maximum unacknowledged QoS 1/2 PUBLISH.
    let p0 = sub.recv_publish().await;
    let p1 = sub.recv_publish().await;
    assert_eq!((&p0.payload[..], &p1.payload[..]), (&[0u8][..], &[1u8][..]));
    sub.expect_nothing(QUIET_MS).await;
    sub.send(Packet::PubAck(PubResp::new(p0.packet_id, 0)))
        .await;
    let p2 = sub.recv_publish().await;
    assert_eq!(&p2.payload[..], &[2]);
    sub.expect_nothing(QUIET_MS).await;
    for p in [p1, p2] {
        sub.send(Packet::PubAck(PubResp::new(p.packet_id, 0))).await;
    }
    let p3 = sub.recv_publish_ack().await;
    let p4 = sub.recv_publish_ack().await;
    assert_eq!((&p3.payload[..], &p4.payload[..]), (&[3u8][..], &[4u8][..]));
}

#[tokio::test]
async fn mqtt5_4_9_0_2_qos2_counts_until_pubcomp() {
    let srv = TestServer::default().await;
    let mut conn = connect_v5("rm2");
    conn.properties.receive_maximum = Some(1);
    let mut sub = RawClient::connect_ok(srv.addr, conn).await;
    sub.subscribe("rm2/t", QoS::ExactlyOnce).await;
    let mut publ = srv.v5("pub").await;
    for i in 0..2u8 {
        let pid = publ.next_pid();
        publ.publish_acked(publish("rm2/t", QoS::ExactlyOnce, pid, &[i]))
            .await;
    }
    let p = sub.recv_publish().await;
    assert_eq!(&p.payload[..], &[0]);
    sub.send(Packet::PubRec(PubResp::new(p.packet_id, 0))).await;
    match sub.recv().await {
        Packet::PubRel(r) => assert_eq!(r.packet_id, p.packet_id),
        other => panic!("expected PUBREL, got {other:?}"),
    }
    // The send quota comes back with PUBCOMP, not PUBREC (4.9).
    sub.expect_nothing(QUIET_MS).await;
    sub.send(Packet::PubComp(PubResp::new(p.packet_id, 0)))
        .await;
    let p = sub.recv_publish_ack().await;
    assert_eq!(&p.payload[..], &[1]);
}

#[tokio::test]
async fn mqtt5_4_9_0_qos0_not_limited_by_receive_maximum() {
    let srv = TestServer::default().await;
    let mut conn = connect_v5("rm0");
    conn.properties.receive_maximum = Some(1);
    let mut sub = RawClient::connect_ok(srv.addr, conn).await;
    sub.subscribe("rm0/t", QoS::AtMostOnce).await;
    let mut publ = srv.v5("pub").await;
    for i in 0..5u8 {
        publ.publish_qos0("rm0/t", &[i]).await;
    }
    for i in 0..5u8 {
        assert_eq!(&sub.recv_publish().await.payload[..], &[i]);
    }
}

#[tokio::test]
async fn mqtt5_3_3_4_9_server_receive_maximum_exceeded() {
    let mut cfg = config();
    cfg.mqtt.receive_maximum = 2;
    let srv = TestServer::start(cfg).await;
    let mut c = srv.v5("flood").await;
    for pid in 1..=2u16 {
        c.send(Packet::Publish(publish(
            "rx/t",
            QoS::ExactlyOnce,
            pid,
            b"x",
        )))
        .await;
        match c.recv().await {
            Packet::PubRec(r) => assert_eq!(r.packet_id, pid),
            other => panic!("expected PUBREC, got {other:?}"),
        }
    }
    // A third QoS 2 PUBLISH without PUBREL: more than Receive Maximum unacknowledged.
    c.send(Packet::Publish(publish("rx/t", QoS::ExactlyOnce, 3, b"x")))
        .await;
    c.expect_disconnect(rc::RECEIVE_MAXIMUM_EXCEEDED).await;
    srv.assert_alive().await;
}

#[tokio::test]
async fn mqtt5_3_1_2_25_client_maximum_packet_size() {
    let srv = TestServer::default().await;
    let mut conn = connect_v5("mps");
    conn.properties.maximum_packet_size = Some(100);
    let mut sub = RawClient::connect_ok(srv.addr, conn).await;
    sub.subscribe("mps/t", QoS::AtLeastOnce).await;
    let mut publ = srv.v5("pub").await;
    publ.publish_qos1("mps/t", &[b'x'; 200]).await;
    publ.publish_qos0("mps/t", &[b'y'; 200]).await;
    publ.publish_qos1("mps/t", b"small").await;
    // [MQTT-3.1.2-25] too large for the client: discarded; later small ones delivered.
    let got = sub.recv_publish_ack().await;
    assert_eq!(&got.payload[..], b"small");
    sub.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt5_3_2_2_3_6_server_maximum_packet_size() {
    let mut cfg = config();
    cfg.mqtt.max_packet_size_bytes = 128;
    let srv = TestServer::start(cfg).await;
    let (mut c, ack) = RawClient::connect_ack(srv.addr, connect_v5("big")).await;
    assert_eq!(ack.properties.maximum_packet_size, Some(128));
    // A packet just at the limit is fine.
    let small = publish("mps/t", QoS::AtLeastOnce, 1, &[0u8; 100]);
    let len = bytes_of(&Packet::Publish(small.clone()), c.version).len();
    let mut at_limit = small.clone();
    at_limit.payload = vec![0u8; 100 + 128 - len].into();
    assert_eq!(
        bytes_of(&Packet::Publish(at_limit.clone()), c.version).len(),
        128
    );
    c.publish_acked(at_limit).await;
    // [MQTT-3.2.2-15] larger: DISCONNECT 0x95.
    let mut over = small;
    over.packet_id = 2;
    over.payload = vec![0u8; 300].into();
    c.send(Packet::Publish(over)).await;
    c.expect_disconnect(rc::PACKET_TOO_LARGE).await;
    srv.assert_alive().await;
}

#[tokio::test]
async fn mqtt5_4_1_offline_queue_limit_drops_and_counts() {
    let mut cfg = config();
    cfg.mqtt.max_queued_messages = 3;
    let srv = TestServer::start(cfg).await;
    let mut conn = connect_v5("q");
    conn.properties.session_expiry_interval = Some(60);
    let mut c = RawClient::connect_ok(srv.addr, conn.clone()).await;
    c.subscribe("q/t", QoS::AtLeastOnce).await;
    c.disconnect().await;
    let stats = &srv.server().broker().stats;
    let dropped_before = stats.messages_dropped.load(Ordering::Relaxed);
    let mut publ = srv.v5("pub").await;
    for i in 0..5u8 {
        publ.publish_qos1("q/t", &[i]).await;
    }
    let dropped = stats.messages_dropped.load(Ordering::Relaxed) - dropped_before;
    assert_eq!(
        dropped, 2,
        "two messages beyond the queue limit are dropped and counted"
    );
    conn.clean_start = false;
    let (mut c, ack) = RawClient::connect_ack(srv.addr, conn).await;
    assert!(ack.session_present);
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(c.recv_publish_ack().await.payload[0]);
    }
    assert!(
        got.windows(2).all(|w| w[0] < w[1]),
        "queued messages keep their order: {got:?}"
    );
    c.expect_nothing(QUIET_MS).await;
}

// --- Slow consumers (docs/configuration.md#slow-consumers) -----------------------------------

/// The index carried in the first four payload bytes by `publish_qos1_pipelined`.
fn index_of(p: &lanemq_protocol::Publish) -> u32 {
    u32::from_be_bytes(p.payload[..4].try_into().unwrap())
}

/// A healthy subscriber in its own task: receives (and acknowledges) until it has seen `n`
/// distinct indexes; returns them in arrival order of their first delivery.
fn healthy_reader(mut c: RawClient, n: usize) -> tokio::task::JoinHandle<Vec<u32>> {
    tokio::spawn(async move {
        let mut seen = std::collections::HashSet::new();
        let mut order = Vec::with_capacity(n);
        while seen.len() < n {
            let p = c.recv_publish_ack().await;
            let i = index_of(&p);
            if seen.insert(i) {
                order.push(i);
            }
        }
        order
    })
}

/// A healthy subscriber on `iso/t` and a publisher sending `n` QoS 1 messages there (payload
/// 4 + `pad` bytes, `window` unacknowledged): every PUBACK is 0x00 and the healthy subscriber
/// gets every message in order. Returns how long publishing took.
async fn publish_past_stuck(srv: &TestServer, n: u32, pad: usize, window: usize) -> Duration {
    let mut healthy = srv.v5("healthy").await;
    healthy.subscribe("iso/t", QoS::AtLeastOnce).await;
    let reader = healthy_reader(healthy, n as usize);
    let mut publ = srv.v5("pub").await;
    let t0 = std::time::Instant::now();
    let codes = publ.publish_qos1_pipelined("iso/t", n, pad, window).await;
    let took = t0.elapsed();
    assert!(codes.iter().all(|&c| c == 0), "every PUBACK is 0x00");
    let got = tokio::time::timeout(Duration::from_secs(60), reader)
        .await
        .expect("the healthy subscriber received everything")
        .unwrap();
    assert_eq!(got, (0..n).collect::<Vec<_>>(), "in order, nothing lost");
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_qos0_subscriber_does_not_hold_publishers_or_other_subscribers() {
    const N: u32 = 40_000;
    let mut cfg = config();
    cfg.mqtt.outbound_buffer_bytes_max = 64 * 1024;
    let srv = TestServer::start(cfg).await;
    // Subscribes to everything, then never reads again (a SIGSTOPped client).
    let mut stuck = RawClient::connect_small_rcvbuf(srv.addr, connect_v5("stuck")).await;
    stuck.subscribe("#", QoS::AtMostOnce).await;
    let took = publish_past_stuck(&srv, N, 252, 256).await;
    let budget = &srv.server().broker().queue_budget;
    assert!(
        budget.dropped_qos0.load(Ordering::Relaxed) > 0,
        "the stuck subscriber reached its byte budget (10 MB sent to it)"
    );
    assert!(
        budget.used() <= 64 * 1024 + 4096,
        "queued bytes held in memory stay within the stuck session's budget: {}",
        budget.used()
    );
    // A publisher waiting for the stuck subscriber (1 s per 1,000 messages before this was
    // fixed) would take 40 s; 15 s leaves room for a loaded machine.
    assert!(
        took < std::time::Duration::from_secs(15),
        "publishing {N} messages took {took:?}"
    );
    srv.assert_alive().await;
    drop(stuck);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_persistent_qos1_subscriber_keeps_its_queue_in_the_log_and_loses_nothing() {
    const N: u32 = 3_000;
    let mut cfg = config();
    cfg.mqtt.outbound_buffer_bytes_max = 16 * 1024;
    cfg.mqtt.queued_bytes_max_total = 64 * 1024;
    cfg.mqtt.max_inflight_messages = 16;
    let srv = TestServer::start(cfg).await;
    let mut conn = connect_v5("stuck-p");
    conn.properties.session_expiry_interval = Some(600);
    let mut stuck = RawClient::connect_small_rcvbuf(srv.addr, conn.clone()).await;
    stuck.subscribe("iso/#", QoS::AtLeastOnce).await;
    publish_past_stuck(&srv, N, 1020, 128).await;
    let budget = &srv.server().broker().queue_budget;
    assert!(
        budget.spilled.load(Ordering::Relaxed) > 0,
        "beyond its byte budget the stuck session's queue holds log positions"
    );
    assert!(
        budget.used() <= 64 * 1024 + 2048,
        "bytes in memory within queued_bytes_max_total: {}",
        budget.used()
    );
    assert_eq!(budget.dropped_queue_full.load(Ordering::Relaxed), 0);
    // The stuck client comes back: its session resumes and every message arrives, in order.
    drop(stuck);
    conn.clean_start = false;
    let (c, ack) = RawClient::connect_ack(srv.addr, conn).await;
    assert!(ack.session_present);
    let got = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        healthy_reader(c, N as usize),
    )
    .await
    .expect("the resumed session received every message")
    .unwrap();
    assert_eq!(got, (0..N).collect::<Vec<_>>(), "in order, nothing lost");
}

#[tokio::test]
async fn queue_overflow_drop_oldest_keeps_the_newest() {
    let mut cfg = config();
    cfg.mqtt.max_queued_messages = 3;
    cfg.mqtt.queue_overflow = lanemq_broker::config::QueueOverflow::DropOldest;
    let srv = TestServer::start(cfg).await;
    let mut conn = connect_v5("q");
    conn.properties.session_expiry_interval = Some(60);
    let mut c = RawClient::connect_ok(srv.addr, conn.clone()).await;
    c.subscribe("q/t", QoS::AtLeastOnce).await;
    c.disconnect().await;
    let mut publ = srv.v5("pub").await;
    for i in 0..5u8 {
        publ.publish_qos1("q/t", &[i]).await;
    }
    let budget = &srv.server().broker().queue_budget;
    assert_eq!(budget.dropped_queue_full.load(Ordering::Relaxed), 2);
    conn.clean_start = false;
    let mut c = RawClient::connect_ok(srv.addr, conn).await;
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(c.recv_publish_ack().await.payload[0]);
    }
    assert_eq!(got, vec![2, 3, 4], "the two oldest were dropped");
    c.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn queue_overflow_disconnects_a_connected_slow_consumer_with_0x97() {
    let mut cfg = config();
    cfg.mqtt.max_queued_messages = 5;
    cfg.mqtt.max_inflight_messages = 1;
    let srv = TestServer::start(cfg).await;
    let mut c = srv.v5("slow").await;
    c.subscribe("q/t", QoS::AtLeastOnce).await;
    let mut publ = srv.v5("pub").await;
    // One in flight, five queued, the seventh overflows: the publisher is still acknowledged.
    for i in 0..7u8 {
        assert_eq!(publ.publish_qos1("q/t", &[i]).await, 0);
    }
    let first = c.recv_publish().await;
    assert_eq!(first.payload[0], 0);
    c.expect_disconnect(rc::QUOTA_EXCEEDED).await;
    let budget = &srv.server().broker().queue_budget;
    assert_eq!(
        budget.slow_consumers_disconnected.load(Ordering::Relaxed),
        1
    );
}

#[tokio::test]
async fn publish_rate_limit_paces_one_connection() {
    let mut cfg = config();
    cfg.mqtt.max_publish_rate_per_s = 200;
    let srv = TestServer::start(cfg).await;
    let mut publ = srv.v5("fast").await;
    let t0 = std::time::Instant::now();
    // A full bucket (200) plus 200 more: the second half waits about a second.
    let codes = publ.publish_qos1_pipelined("r/t", 400, 0, 400).await;
    assert!(codes
        .iter()
        .all(|&c| c == 0 || c == rc::NO_MATCHING_SUBSCRIBERS));
    let took = t0.elapsed();
    assert!(
        took >= std::time::Duration::from_millis(700),
        "400 publishes at 200/s took only {took:?}"
    );
}
