//! MQTT 5.0 sections 3.1.2.4, 3.1.2.5, 3.1.2.11.2, 3.14.2.2, 4.1, 4.4: session state, session
//! expiry, redelivery on resume, and will messages.
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use common::*;
use lanemq_protocol::reason as rc;
use lanemq_protocol::{Connect, Packet, PubResp, QoS, Will, WillProperties};
use std::time::{Duration, Instant};

fn conn(id: &str, expiry: Option<u32>, clean_start: bool) -> Connect {
    let mut c = connect_v5(id);
    c.clean_start = clean_start;
    c.properties.session_expiry_interval = expiry;
    c
}

fn will(topic: &str, payload: &str, delay: Option<u32>) -> Will {
    Will {
        topic: topic.into(),
        payload: Bytes::from(payload.to_string()),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: WillProperties {
            will_delay_interval: delay,
            ..Default::default()
        },
    }
}

/// A watcher subscribed to `filter` at QoS 1.
async fn watcher(srv: &TestServer, filter: &str) -> RawClient {
    let mut w = srv.v5("").await;
    w.subscribe(filter, QoS::AtLeastOnce).await;
    w
}

#[tokio::test]
async fn mqtt5_3_1_2_4_clean_start_discards_session() {
    let srv = TestServer::default().await;
    let mut c = RawClient::connect_ok(srv.addr, conn("cs", Some(60), true)).await;
    c.subscribe("cs/t", QoS::AtLeastOnce).await;
    c.disconnect().await;
    // [MQTT-3.1.2-4] Clean Start 1: existing session discarded, Session Present 0.
    let (mut c, ack) = RawClient::connect_ack(srv.addr, conn("cs", Some(60), true)).await;
    assert!(!ack.session_present, "[MQTT-3.2.2-2]");
    let mut publ = srv.v5("pub").await;
    publ.publish_qos1("cs/t", b"x").await;
    c.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt5_3_1_2_4_clean_start_false_resumes_session() {
    let srv = TestServer::default().await;
    let mut c = RawClient::connect_ok(srv.addr, conn("rs", Some(60), true)).await;
    c.subscribe("rs/t", QoS::AtLeastOnce).await;
    c.disconnect().await;
    let mut publ = srv.v5("pub").await;
    publ.publish_qos1("rs/t", b"while-offline").await;
    // [MQTT-3.1.2-5] session resumed, [MQTT-3.2.2-3] Session Present 1.
    let (mut c, ack) = RawClient::connect_ack(srv.addr, conn("rs", Some(60), false)).await;
    assert!(ack.session_present);
    let got = c.recv_publish_ack().await;
    assert_eq!(&got.payload[..], b"while-offline");
    // Subscriptions are part of the session.
    publ.publish_qos1("rs/t", b"online").await;
    assert_eq!(&c.recv_publish_ack().await.payload[..], b"online");
}

#[tokio::test]
async fn mqtt5_3_1_2_4_clean_start_false_without_session() {
    let srv = TestServer::default().await;
    let (c, ack) = RawClient::connect_ack(srv.addr, conn("fresh", Some(60), false)).await;
    assert!(!ack.session_present, "[MQTT-3.2.2-3] no session existed");
    c.disconnect().await;
}

#[tokio::test]
async fn mqtt5_3_1_2_11_2_session_expiry_zero_ends_with_connection() {
    let srv = TestServer::default().await;
    let mut c = RawClient::connect_ok(srv.addr, conn("z", None, true)).await;
    c.subscribe("z/t", QoS::AtLeastOnce).await;
    c.disconnect().await;
    let (c, ack) = RawClient::connect_ack(srv.addr, conn("z", None, false)).await;
    assert!(!ack.session_present, "absent Session Expiry Interval = 0");
    c.disconnect().await;
}

#[tokio::test]
async fn mqtt5_3_1_2_11_2_session_expires_after_interval() {
    let srv = TestServer::default().await;
    let mut c = RawClient::connect_ok(srv.addr, conn("ex", Some(1), true)).await;
    c.subscribe("ex/t", QoS::AtLeastOnce).await;
    c.disconnect().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (c, ack) = RawClient::connect_ack(srv.addr, conn("ex", Some(1), false)).await;
    assert!(ack.session_present, "still within the interval");
    c.disconnect().await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (mut c, ack) = RawClient::connect_ack(srv.addr, conn("ex", Some(1), false)).await;
    assert!(
        !ack.session_present,
        "[MQTT-3.1.2-23] session gone after the interval"
    );
    let mut publ = srv.v5("pub").await;
    publ.publish_qos1("ex/t", b"x").await;
    c.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt5_3_14_2_2_disconnect_session_expiry_after_zero_is_protocol_error() {
    let srv = TestServer::default().await;
    let mut c = RawClient::connect_ok(srv.addr, conn("pe", None, true)).await;
    let mut d = lanemq_protocol::Disconnect::new(0);
    d.properties.session_expiry_interval = Some(30);
    c.send(Packet::Disconnect(d)).await;
    // [MQTT-3.14.2-2]
    c.expect_disconnect(rc::PROTOCOL_ERROR).await;
    srv.assert_alive().await;
}

#[tokio::test]
async fn mqtt5_3_14_2_2_disconnect_sets_session_expiry() {
    let srv = TestServer::default().await;
    // Expiry 60 at CONNECT, lowered to 0 at DISCONNECT: the session ends.
    let c = RawClient::connect_ok(srv.addr, conn("dz", Some(60), true)).await;
    c.disconnect_with(0, Some(0)).await;
    let (c, ack) = RawClient::connect_ack(srv.addr, conn("dz", Some(60), false)).await;
    assert!(!ack.session_present);
    // Expiry 1 at CONNECT, raised to 60 at DISCONNECT: still there after 1.3 s.
    c.disconnect_with(0, Some(60)).await;
    let c = RawClient::connect_ok(srv.addr, conn("dr", Some(1), true)).await;
    c.disconnect_with(0, Some(60)).await;
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let (c, ack) = RawClient::connect_ack(srv.addr, conn("dr", Some(60), false)).await;
    assert!(ack.session_present);
    c.disconnect().await;
}

#[tokio::test]
async fn mqtt5_4_4_0_1_qos1_redelivered_with_dup_on_resume() {
    let srv = TestServer::default().await;
    let mut c = RawClient::connect_ok(srv.addr, conn("dup1", Some(60), true)).await;
    c.subscribe("dup1/t", QoS::AtLeastOnce).await;
    let mut publ = srv.v5("pub").await;
    publ.publish_qos1("dup1/t", b"unacked").await;
    let first = c.recv_publish().await;
    assert!(!first.dup);
    drop(c); // no PUBACK
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (mut c, ack) = RawClient::connect_ack(srv.addr, conn("dup1", Some(60), false)).await;
    assert!(ack.session_present);
    // [MQTT-4.4.0-1] resent with DUP=1 and the same packet identifier.
    let again = c.recv_publish().await;
    assert!(again.dup, "[MQTT-3.3.1-1] DUP=1 on redelivery");
    assert_eq!(again.packet_id, first.packet_id);
    assert_eq!(&again.payload[..], b"unacked");
    c.send(Packet::PubAck(PubResp::new(again.packet_id, 0)))
        .await;
    c.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt5_4_4_0_1_qos2_publish_and_pubrel_resent_on_resume() {
    let srv = TestServer::default().await;
    let mut c = RawClient::connect_ok(srv.addr, conn("dup2", Some(60), true)).await;
    c.subscribe("dup2/t", QoS::ExactlyOnce).await;
    let mut publ = srv.v5("pub").await;
    let pid = publ.next_pid();
    publ.publish_acked(publish("dup2/t", QoS::ExactlyOnce, pid, b"a"))
        .await;
    let pid = publ.next_pid();
    publ.publish_acked(publish("dup2/t", QoS::ExactlyOnce, pid, b"b"))
        .await;
    let a = c.recv_publish().await;
    let b = c.recv_publish().await;
    // "a" gets PUBREC (then PUBREL from the broker); "b" nothing.
    c.send(Packet::PubRec(PubResp::new(a.packet_id, 0))).await;
    match c.recv().await {
        Packet::PubRel(r) => assert_eq!(r.packet_id, a.packet_id),
        other => panic!("expected PUBREL, got {other:?}"),
    }
    drop(c);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (mut c, ack) = RawClient::connect_ack(srv.addr, conn("dup2", Some(60), false)).await;
    assert!(ack.session_present);
    let mut saw_pubrel = false;
    let mut saw_publish = false;
    for _ in 0..2 {
        match c.recv().await {
            Packet::PubRel(r) => {
                assert_eq!(r.packet_id, a.packet_id, "[MQTT-4.4.0-1] PUBREL resent");
                saw_pubrel = true;
                c.send(Packet::PubComp(PubResp::new(r.packet_id, 0))).await;
            }
            Packet::Publish(p) => {
                assert_eq!(p.packet_id, b.packet_id);
                assert!(p.dup, "DUP=1 on redelivery");
                assert_eq!(&p.payload[..], b"b");
                saw_publish = true;
                c.send(Packet::PubRec(PubResp::new(p.packet_id, 0))).await;
                match c.recv().await {
                    Packet::PubRel(r) => assert_eq!(r.packet_id, p.packet_id),
                    other => panic!("expected PUBREL, got {other:?}"),
                }
                c.send(Packet::PubComp(PubResp::new(p.packet_id, 0))).await;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(saw_pubrel && saw_publish);
    c.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt5_3_1_2_5_will_published_on_abnormal_close() {
    let srv = TestServer::default().await;
    let mut w = watcher(&srv, "will/#").await;
    let mut c = connect_v5("dies");
    let mut wl = will("will/dies", "gone", None);
    wl.properties.content_type = Some("text/plain".into());
    wl.properties.user_properties = vec![("k".into(), "v".into()), ("k".into(), "w".into())];
    c.will = Some(wl);
    let c = RawClient::connect_ok(srv.addr, c).await;
    drop(c);
    let got = w.recv_publish_ack().await;
    assert_eq!(got.topic, "will/dies");
    assert_eq!(&got.payload[..], b"gone");
    assert_eq!(got.qos, QoS::AtLeastOnce);
    assert_eq!(got.properties.content_type.as_deref(), Some("text/plain"));
    assert_eq!(
        got.properties.user_properties,
        vec![("k".to_string(), "v".to_string()), ("k".into(), "w".into())]
    );
}

#[tokio::test]
async fn mqtt5_3_1_2_5_will_published_on_protocol_error() {
    let srv = TestServer::default().await;
    let mut w = watcher(&srv, "willpe/#").await;
    let mut c = connect_v5("bad");
    c.will = Some(will("willpe/bad", "bye", None));
    let mut c = RawClient::connect_ok(srv.addr, c).await;
    c.send(Packet::Connect(Box::new(connect_v5("bad")))).await;
    c.expect_disconnect(rc::PROTOCOL_ERROR).await;
    assert_eq!(w.recv_publish_ack().await.topic, "willpe/bad");
}

#[tokio::test]
async fn mqtt5_3_14_4_no_will_on_normal_disconnect() {
    let srv = TestServer::default().await;
    let mut w = watcher(&srv, "willn/#").await;
    let mut c = connect_v5("polite");
    c.will = Some(will("willn/polite", "x", None));
    let c = RawClient::connect_ok(srv.addr, c).await;
    // [MQTT-3.14.4-3] DISCONNECT 0x00: the will is discarded.
    c.disconnect().await;
    w.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt5_3_14_2_1_will_on_disconnect_with_will_message() {
    let srv = TestServer::default().await;
    let mut w = watcher(&srv, "will4/#").await;
    let mut c = connect_v5("w4");
    c.will = Some(will("will4/w4", "x", None));
    let c = RawClient::connect_ok(srv.addr, c).await;
    c.disconnect_with(rc::DISCONNECT_WITH_WILL, None).await;
    assert_eq!(w.recv_publish_ack().await.topic, "will4/w4");
}

#[tokio::test]
async fn mqtt5_3_1_3_2_2_will_delay() {
    let srv = TestServer::default().await;
    let mut w = watcher(&srv, "willd/#").await;
    let mut c = conn("wd", Some(30), true);
    c.will = Some(will("willd/wd", "late", Some(1)));
    let c = RawClient::connect_ok(srv.addr, c).await;
    let closed = Instant::now();
    drop(c);
    // [MQTT-3.1.3-9] not before the delay ...
    w.expect_nothing(700).await;
    // ... then published.
    let got = w.recv_publish_ack().await;
    assert_eq!(&got.payload[..], b"late");
    let took = closed.elapsed();
    assert!(took >= Duration::from_millis(950), "too early: {took:?}");
}

#[tokio::test]
async fn mqtt5_3_1_3_2_2_will_delay_cancelled_by_reconnect() {
    let srv = TestServer::default().await;
    let mut w = watcher(&srv, "willc/#").await;
    let mut c = conn("wc", Some(30), true);
    c.will = Some(will("willc/wc", "never", Some(1)));
    let c = RawClient::connect_ok(srv.addr, c).await;
    drop(c);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (c, ack) = RawClient::connect_ack(srv.addr, conn("wc", Some(30), false)).await;
    assert!(ack.session_present);
    // [MQTT-3.1.3-9] reconnected before the delay passed: no will.
    w.expect_nothing(1_200).await;
    c.disconnect().await;
}

/// A new connection for the client id cancels a delayed will even when it starts a new session
/// (Clean Start 1) [MQTT-3.1.2-8] (mosquitto's `07-will-delay-recover`).
#[tokio::test]
async fn mqtt5_3_1_2_8_will_delay_cancelled_by_a_clean_start_reconnect() {
    let srv = TestServer::default().await;
    let mut w = watcher(&srv, "willcs/#").await;
    let mut c = conn("wcs", Some(30), true);
    c.will = Some(will("willcs/wcs", "never", Some(1)));
    let c = RawClient::connect_ok(srv.addr, c).await;
    drop(c);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (c, ack) = RawClient::connect_ack(srv.addr, conn("wcs", Some(30), true)).await;
    assert!(!ack.session_present);
    w.expect_nothing(1_500).await;
    c.disconnect().await;
}

#[tokio::test]
async fn mqtt5_3_1_2_5_will_delay_bounded_by_session_expiry() {
    let srv = TestServer::default().await;
    let mut w = watcher(&srv, "willse/#").await;
    let mut c = conn("wse", Some(1), true);
    c.will = Some(will("willse/wse", "session-ended", Some(30)));
    let c = RawClient::connect_ok(srv.addr, c).await;
    drop(c);
    // Published when the session ends (1 s), not after the 30 s delay.
    let got = w.recv_publish_ack().await;
    assert_eq!(&got.payload[..], b"session-ended");
}

#[tokio::test]
async fn mqtt5_3_1_2_5_will_retain() {
    let srv = TestServer::default().await;
    let mut c = connect_v5("wr");
    let mut wl = will("willr/wr", "retained-will", None);
    wl.retain = true;
    c.will = Some(wl);
    let c = RawClient::connect_ok(srv.addr, c).await;
    drop(c);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut late = srv.v5("late").await;
    late.subscribe("willr/#", QoS::AtLeastOnce).await;
    let got = late.recv_publish_ack().await;
    assert!(
        got.retain,
        "[MQTT-3.1.2-17] will retain 1: published as retained"
    );
    assert_eq!(&got.payload[..], b"retained-will");
}

#[tokio::test]
async fn mqtt5_3_2_2_1_1_session_present_0_after_alternating_clean_start() {
    let srv = TestServer::default().await;
    let (c, ack) = RawClient::connect_ack(srv.addr, conn("alt", Some(60), false)).await;
    assert!(!ack.session_present);
    c.disconnect().await;
    // Clean Start 1 with Session Expiry 0: the old session is discarded, and the new one
    // ends with its connection...
    let mut old = stalled(srv.addr, conn("alt", None, true), "fill/alt", &[]).await;
    old.send(Packet::Disconnect(lanemq_protocol::Disconnect::new(0)))
        .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    // ... so Clean Start 0 right after finds no session, although the old connection is
    // still closing [MQTT-3.2.2-3].
    let (c, ack) = RawClient::connect_ack(srv.addr, conn("alt", Some(60), false)).await;
    assert!(!ack.session_present, "[MQTT-3.2.2-3]");
    c.disconnect().await;
    drop(old);
}

#[tokio::test]
async fn mqtt5_3_2_2_1_1_session_present_0_after_disconnect_with_session_expiry_0() {
    let srv = TestServer::default().await;
    let mut old = stalled(srv.addr, conn("dz", Some(60), false), "fill/dz", &["dz/t"]).await;
    // [MQTT-3.14.2.2.2] the DISCONNECT sets the expiry to 0: the session ends with it.
    let mut d = lanemq_protocol::Disconnect::new(0);
    d.properties.session_expiry_interval = Some(0);
    old.send(Packet::Disconnect(d)).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (mut c, ack) = RawClient::connect_ack(srv.addr, conn("dz", Some(60), false)).await;
    assert!(!ack.session_present, "[MQTT-3.2.2-3]");
    let mut p = srv.v5("").await;
    p.publish_qos1("dz/t", b"to-nobody").await;
    c.expect_nothing(QUIET_MS).await;
    c.disconnect().await;
    drop(old);
}

#[tokio::test]
async fn mqtt5_3_1_2_4_take_over_of_a_clean_session_starts_a_new_session() {
    let srv = TestServer::default().await;
    // A live connection whose session ends with it (Session Expiry 0).
    let mut a = RawClient::connect_ok(srv.addr, conn("tko", None, true)).await;
    a.subscribe("tko/t", QoS::AtLeastOnce).await;
    // Another connection with the same client id and Clean Start 0: the old connection ends,
    // and with it its session [MQTT-3.1.4-3]: nothing to resume.
    let (mut b, ack) = RawClient::connect_ack(srv.addr, conn("tko", Some(60), false)).await;
    assert!(!ack.session_present, "[MQTT-3.2.2-3]");
    a.expect_disconnect(rc::SESSION_TAKEN_OVER).await;
    let mut p = srv.v5("").await;
    p.publish_qos1("tko/t", b"old-subscription").await;
    b.expect_nothing(QUIET_MS).await;
    // A session with an expiry is resumed by a take-over as before.
    let (_c, ack) = RawClient::connect_ack(srv.addr, conn("tko", Some(60), false)).await;
    assert!(ack.session_present);
    b.expect_disconnect(rc::SESSION_TAKEN_OVER).await;
}

#[tokio::test]
async fn mqtt5_3_1_3_2_2_delayed_will_cancelled_by_reconnect_before_the_old_connection_closed() {
    let srv = TestServer::default().await;
    let mut w = watcher(&srv, "willrace/#").await;
    let mut c = conn("wrace", Some(60), true);
    c.will = Some(will("willrace/wrace", "must-not-come", Some(2)));
    let mut old = stalled(srv.addr, c, "fill/wrace", &[]).await;
    // Half-close: the broker reads EOF (a close that publishes the will) but cannot flush.
    tokio::io::AsyncWriteExt::shutdown(&mut old.stream)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (c, ack) = RawClient::connect_ack(srv.addr, conn("wrace", Some(60), false)).await;
    assert!(ack.session_present);
    // [MQTT-3.1.3-9] a new connection to the session came within the delay: no will, not
    // when the old connection finishes closing, nor after the delay.
    w.expect_nothing(3_000).await;
    c.disconnect().await;
    drop(old);
}
