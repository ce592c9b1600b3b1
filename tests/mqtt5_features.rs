//! MQTT 5.0: server limits and optional features announced in CONNACK (3.2.2.3), and further
//! acknowledgement / session corner cases (4.3.3, 4.4).
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use common::*;
use lanemq_protocol::reason as rc;
use lanemq_protocol::{Packet, PubResp, QoS, Will};
use std::time::Duration;

fn will(qos: QoS, retain: bool) -> Will {
    Will {
        topic: "feat/will".into(),
        payload: Bytes::from_static(b"w"),
        qos,
        retain,
        properties: Default::default(),
    }
}

async fn refused(srv: &TestServer, c: lanemq_protocol::Connect) -> u8 {
    let (mut client, first) = RawClient::connect(srv.addr, c).await;
    let code = match first {
        Ok(Packet::ConnAck(a)) => {
            assert!(
                !a.session_present,
                "[MQTT-3.2.2-6] session present 0 on refusal"
            );
            a.reason_code
        }
        other => panic!("expected CONNACK, got {other:?}"),
    };
    client.expect_closed().await;
    code
}

#[tokio::test]
async fn mqtt5_3_2_2_2_max_connections_quota_exceeded() {
    let mut cfg = config();
    cfg.mqtt.max_connections = 1;
    let srv = TestServer::start(cfg).await;
    let first = srv.v5("one").await;
    assert_eq!(refused(&srv, connect_v5("two")).await, rc::QUOTA_EXCEEDED);
    first.disconnect().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let again = srv.v5("three").await;
    again.disconnect().await;
}

#[tokio::test]
async fn mqtt5_3_1_3_5_anonymous_refused_when_disabled() {
    let mut cfg = config();
    cfg.server.allow_anonymous = false;
    let srv = TestServer::start(cfg).await;
    let code = refused(&srv, connect_v5("anon")).await;
    assert!(
        code == rc::BAD_USER_NAME_OR_PASSWORD || code == rc::NOT_AUTHORIZED,
        "CONNACK 0x{code:02X}"
    );
    let mut c = connect_v5("named");
    c.username = Some("user".into());
    let (c, _) = RawClient::connect_ack(srv.addr, c).await;
    c.disconnect().await;
}

#[tokio::test]
async fn mqtt5_3_2_2_3_4_will_qos_above_maximum_qos() {
    let mut cfg = config();
    cfg.mqtt.maximum_qos = 1;
    let srv = TestServer::start(cfg).await;
    let mut c = connect_v5("wq");
    c.will = Some(will(QoS::ExactlyOnce, false));
    // [MQTT-3.2.2-12] CONNACK 0x9B.
    assert_eq!(refused(&srv, c).await, rc::QOS_NOT_SUPPORTED);
}

#[tokio::test]
async fn mqtt5_3_8_4_granted_qos_capped_by_maximum_qos() {
    let mut cfg = config();
    cfg.mqtt.maximum_qos = 1;
    let srv = TestServer::start(cfg).await;
    let mut c = srv.v5("cap").await;
    let ack = c
        .subscribe_with(&[("cap/t", sub_opts(QoS::ExactlyOnce))], None)
        .await;
    assert_eq!(ack.reason_codes, vec![1]);
}

#[tokio::test]
async fn mqtt5_3_2_2_3_5_retain_not_available() {
    let mut cfg = config();
    cfg.mqtt.retain_available = false;
    let srv = TestServer::start(cfg).await;
    let mut c = connect_v5("wr");
    c.will = Some(will(QoS::AtMostOnce, true));
    // [MQTT-3.2.2-13] will retain with Retain Available 0: CONNACK 0x9A.
    assert_eq!(refused(&srv, c).await, rc::RETAIN_NOT_SUPPORTED);
    let (mut c, ack) = RawClient::connect_ack(srv.addr, connect_v5("pr")).await;
    assert_eq!(ack.properties.retain_available, Some(false));
    let mut p = publish("feat/r", QoS::AtMostOnce, 0, b"x");
    p.retain = true;
    c.send(Packet::Publish(p)).await;
    // [MQTT-3.2.2-14] PUBLISH with RETAIN 1: DISCONNECT 0x9A.
    c.expect_disconnect(rc::RETAIN_NOT_SUPPORTED).await;
}

#[tokio::test]
async fn mqtt5_3_2_2_3_15_response_information() {
    let mut cfg = config();
    cfg.mqtt.response_information = Some("reply/{client_id}".into());
    let srv = TestServer::start(cfg).await;
    let mut c = connect_v5("ri");
    c.properties.request_response_information = Some(true);
    let (c, ack) = RawClient::connect_ack(srv.addr, c).await;
    assert_eq!(
        ack.properties.response_information.as_deref(),
        Some("reply/ri")
    );
    c.disconnect().await;
    // Not requested: [MQTT-3.1.2-28] no Response Information.
    let (c, ack) = RawClient::connect_ack(srv.addr, connect_v5("ri2")).await;
    assert_eq!(ack.properties.response_information, None);
    c.disconnect().await;
}

#[tokio::test]
async fn mqtt5_4_3_3_pubrec_error_ends_qos2_flow() {
    let srv = TestServer::default().await;
    let mut conn = connect_v5("recerr");
    conn.properties.receive_maximum = Some(1);
    let mut sub = RawClient::connect_ok(srv.addr, conn).await;
    sub.subscribe("re/t", QoS::ExactlyOnce).await;
    let mut publ = srv.v5("pub").await;
    for i in 0..2u8 {
        let pid = publ.next_pid();
        publ.publish_acked(publish("re/t", QoS::ExactlyOnce, pid, &[i]))
            .await;
    }
    let p = sub.recv_publish().await;
    // PUBREC with a failure code (>= 0x80): the flow is complete, no PUBREL, and the
    // send quota is returned (4.9): the next message follows.
    sub.send(Packet::PubRec(PubResp::new(
        p.packet_id,
        rc::UNSPECIFIED_ERROR,
    )))
    .await;
    let next = sub.recv_publish().await;
    assert_eq!(&next.payload[..], &[1]);
}

#[tokio::test]
async fn mqtt5_4_3_3_inbound_qos2_state_survives_reconnect() {
    let srv = TestServer::default().await;
    let mut sub = srv.v5("sub").await;
    sub.subscribe("iq/t", QoS::AtLeastOnce).await;
    let mut conn = connect_v5("ipub");
    conn.properties.session_expiry_interval = Some(60);
    let mut publ = RawClient::connect_ok(srv.addr, conn.clone()).await;
    let p = publish("iq/t", QoS::ExactlyOnce, 5, b"once");
    publ.send(Packet::Publish(p.clone())).await;
    match publ.recv().await {
        Packet::PubRec(r) => assert_eq!(r.packet_id, 5),
        other => panic!("expected PUBREC, got {other:?}"),
    }
    drop(publ);
    assert_eq!(&sub.recv_publish_ack().await.payload[..], b"once");
    tokio::time::sleep(Duration::from_millis(100)).await;
    conn.clean_start = false;
    let (mut publ, ack) = RawClient::connect_ack(srv.addr, conn).await;
    assert!(ack.session_present);
    // [MQTT-4.4.0-1] the client resends the PUBLISH with DUP: PUBREC, no second delivery.
    let mut again = p;
    again.dup = true;
    publ.send(Packet::Publish(again)).await;
    match publ.recv().await {
        Packet::PubRec(r) => assert_eq!(r.packet_id, 5),
        other => panic!("expected PUBREC, got {other:?}"),
    }
    publ.send(Packet::PubRel(PubResp::new(5, 0))).await;
    match publ.recv().await {
        Packet::PubComp(r) => assert_eq!((r.packet_id, r.reason_code), (5, 0)),
        other => panic!("expected PUBCOMP 0x00, got {other:?}"),
    }
    sub.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt5_3_1_4_3_takeover_resends_inflight() {
    let srv = TestServer::default().await;
    let mut conn = connect_v5("tk");
    conn.properties.session_expiry_interval = Some(60);
    let mut old = RawClient::connect_ok(srv.addr, conn.clone()).await;
    old.subscribe("tk/t", QoS::AtLeastOnce).await;
    let mut publ = srv.v5("pub").await;
    publ.publish_qos1("tk/t", b"inflight").await;
    let first = old.recv_publish().await;
    conn.clean_start = false;
    let (mut new, ack) = RawClient::connect_ack(srv.addr, conn).await;
    assert!(ack.session_present);
    old.expect_disconnect(rc::SESSION_TAKEN_OVER).await;
    let again = new.recv_publish().await;
    assert!(again.dup);
    assert_eq!(again.packet_id, first.packet_id);
    assert_eq!(&again.payload[..], b"inflight");
}

#[tokio::test]
async fn mqtt5_3_3_2_3_4_inbound_alias_not_kept_across_connections() {
    let srv = TestServer::default().await;
    let mut conn = connect_v5("alias-r");
    conn.properties.session_expiry_interval = Some(60);
    let mut c = RawClient::connect_ok(srv.addr, conn.clone()).await;
    let mut p = publish("ar/t", QoS::AtMostOnce, 0, b"x");
    p.properties.topic_alias = Some(1);
    c.send(Packet::Publish(p)).await;
    c.disconnect().await;
    conn.clean_start = false;
    let mut c = RawClient::connect_ok(srv.addr, conn).await;
    let mut p = publish("", QoS::AtMostOnce, 0, b"y");
    p.properties.topic_alias = Some(1);
    c.send(Packet::Publish(p)).await;
    // [MQTT-3.3.2-7] alias mappings end with the network connection.
    c.expect_disconnect(rc::PROTOCOL_ERROR).await;
}

#[tokio::test]
async fn mqtt5_3_8_3_1_no_local_with_overlapping_plain_subscription() {
    let srv = TestServer::default().await;
    let mut c = srv.v5("nlo").await;
    let mut o = sub_opts(QoS::AtMostOnce);
    o.no_local = true;
    c.subscribe_with(&[("nlo/#", o)], Some(1)).await;
    c.subscribe_with(&[("nlo/t", sub_opts(QoS::AtMostOnce))], Some(2))
        .await;
    c.publish_qos0("nlo/t", b"x").await;
    let got = c.recv_publish().await;
    assert_eq!(got.properties.subscription_identifiers, vec![2]);
    c.expect_nothing(QUIET_MS).await;
}
