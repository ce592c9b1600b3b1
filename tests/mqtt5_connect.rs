//! MQTT 5.0 section 3.1 / 3.2: CONNECT and CONNACK.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use lanemq_protocol::reason as rc;
use lanemq_protocol::{Packet, ProtocolVersion};
use std::time::{Duration, Instant};

#[tokio::test]
async fn mqtt5_3_2_2_3_connack_properties_from_config() {
    let mut cfg = config();
    cfg.mqtt.receive_maximum = 10;
    cfg.mqtt.max_packet_size_bytes = 4096;
    cfg.mqtt.topic_alias_max = 5;
    let srv = TestServer::start(cfg).await;
    let (c, ack) = RawClient::connect_ack(srv.addr, connect_v5("props")).await;
    assert!(!ack.session_present);
    let p = &ack.properties;
    assert_eq!(p.receive_maximum, Some(10), "3.2.2.3.3 Receive Maximum");
    assert_eq!(
        p.maximum_packet_size,
        Some(4096),
        "3.2.2.3.6 Maximum Packet Size"
    );
    assert_eq!(
        p.topic_alias_maximum,
        Some(5),
        "3.2.2.3.8 Topic Alias Maximum"
    );
    assert_eq!(p.assigned_client_identifier, None, "client id was given");
    assert_eq!(p.server_keep_alive, None, "no server keep alive configured");
    assert_eq!(
        p.session_expiry_interval, None,
        "requested expiry not clamped"
    );
    // Features the broker supports are either absent (= available) or explicitly true.
    assert_ne!(p.maximum_qos, Some(0));
    assert_ne!(p.maximum_qos, Some(1));
    assert_ne!(p.retain_available, Some(false));
    assert_ne!(p.wildcard_subscription_available, Some(false));
    assert_ne!(p.subscription_identifiers_available, Some(false));
    assert_ne!(p.shared_subscription_available, Some(false));
    c.disconnect().await;
}

#[tokio::test]
async fn mqtt5_3_2_2_3_connack_properties_defaults() {
    let srv = TestServer::default().await;
    let (c, ack) = RawClient::connect_ack(srv.addr, connect_v5("defaults")).await;
    let p = &ack.properties;
    assert_eq!(p.receive_maximum, Some(1024));
    assert_eq!(p.maximum_packet_size, Some(1024 * 1024));
    assert_eq!(p.topic_alias_maximum, Some(64));
    c.disconnect().await;
}

#[tokio::test]
async fn mqtt5_3_2_2_3_7_assigned_client_identifier() {
    let srv = TestServer::default().await;
    let (c1, a1) = RawClient::connect_ack(srv.addr, connect_v5("")).await;
    let (c2, a2) = RawClient::connect_ack(srv.addr, connect_v5("")).await;
    let id1 = a1
        .properties
        .assigned_client_identifier
        .clone()
        .expect("[MQTT-3.2.2-16] Assigned Client Identifier for an empty client id");
    let id2 = a2.properties.assigned_client_identifier.clone().unwrap();
    assert!(!id1.is_empty());
    assert_ne!(id1, id2, "assigned identifiers are unique");
    c1.disconnect().await;
    c2.disconnect().await;
}

#[tokio::test]
async fn mqtt5_3_2_2_3_2_session_expiry_clamped() {
    let mut cfg = config();
    cfg.mqtt.max_session_expiry_s = 10;
    let srv = TestServer::start(cfg).await;
    let mut conn = connect_v5("clamp");
    conn.properties.session_expiry_interval = Some(100);
    let (c, ack) = RawClient::connect_ack(srv.addr, conn).await;
    assert_eq!(ack.properties.session_expiry_interval, Some(10));
    c.disconnect().await;

    // Within the limit: the client's value stands (absent or equal).
    let mut conn = connect_v5("noclamp");
    conn.properties.session_expiry_interval = Some(5);
    let (c, ack) = RawClient::connect_ack(srv.addr, conn).await;
    assert!(matches!(
        ack.properties.session_expiry_interval,
        None | Some(5)
    ));
    c.disconnect().await;
}

#[tokio::test]
async fn mqtt5_3_2_2_3_14_server_keep_alive() {
    let mut cfg = config();
    cfg.mqtt.server_keep_alive_s = Some(1);
    let srv = TestServer::start(cfg).await;
    let (mut c, ack) = RawClient::connect_ack(srv.addr, connect_v5("ska")).await;
    assert_eq!(ack.properties.server_keep_alive, Some(1));
    // [MQTT-3.2.2-22] the server uses its own value: 1.5 s, not the client's 60 s.
    let start = Instant::now();
    match c.try_recv(Duration::from_millis(3_000)).await {
        Ok(Packet::Disconnect(d)) => assert_eq!(d.reason_code, rc::KEEP_ALIVE_TIMEOUT),
        other => panic!("expected DISCONNECT 0x8D, got {other:?}"),
    }
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(1_200), "too early: {took:?}");
    assert!(took <= Duration::from_millis(2_500), "too late: {took:?}");
}

#[tokio::test]
async fn mqtt5_3_1_2_10_keep_alive_enforced_at_1_5x() {
    let srv = TestServer::default().await;
    let mut conn = connect_v5("ka");
    conn.keep_alive = 1;
    let (mut c, _) = RawClient::connect_ack(srv.addr, conn).await;
    let start = Instant::now();
    // Not before 1 x keep alive (the spec allows up to 1.5 x).
    c.expect_nothing(1_100).await;
    match c.try_recv(Duration::from_millis(1_500)).await {
        Ok(Packet::Disconnect(d)) => assert_eq!(d.reason_code, rc::KEEP_ALIVE_TIMEOUT),
        other => panic!("[MQTT-3.1.2-22] expected DISCONNECT 0x8D, got {other:?}"),
    }
    let took = start.elapsed();
    assert!(took <= Duration::from_millis(2_300), "too late: {took:?}");
    c.expect_closed().await;
    srv.assert_alive().await;
}

#[tokio::test]
async fn mqtt5_3_1_2_10_keep_alive_reset_by_pingreq() {
    let srv = TestServer::default().await;
    let mut conn = connect_v5("ka-ping");
    conn.keep_alive = 1;
    let (mut c, _) = RawClient::connect_ack(srv.addr, conn).await;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        c.send(Packet::PingReq).await;
        assert_eq!(c.recv().await, Packet::PingResp, "3.12.4 PINGRESP");
    }
    c.disconnect().await;
}

#[tokio::test]
async fn mqtt5_3_1_2_2_unsupported_protocol_version() {
    let srv = TestServer::default().await;
    let mut bytes = bytes_of(
        &Packet::Connect(Box::new(connect_v5("lvl6"))),
        ProtocolVersion::V5,
    );
    // [0x10, len, 0x00, 0x04, 'M', 'Q', 'T', 'T', level, ...]
    assert_eq!(bytes[8], 5);
    bytes[8] = 6;
    let mut c = RawClient::tcp(srv.addr, ProtocolVersion::V5).await;
    c.send_raw(&bytes).await;
    match c.recv().await {
        Packet::ConnAck(a) => {
            assert_eq!(
                a.reason_code,
                rc::UNSUPPORTED_PROTOCOL_VERSION,
                "[MQTT-3.1.2-2]"
            );
            assert!(!a.session_present);
        }
        other => panic!("expected CONNACK 0x84, got {other:?}"),
    }
    c.expect_closed().await;
    srv.assert_alive().await;
}

#[tokio::test]
async fn mqtt5_3_1_0_1_first_packet_must_be_connect() {
    let srv = TestServer::default().await;
    let mut c = RawClient::tcp(srv.addr, ProtocolVersion::V5).await;
    c.send(Packet::PingReq).await;
    c.expect_closed().await;
    srv.assert_alive().await;
}

#[tokio::test]
async fn mqtt5_3_1_0_2_second_connect_is_protocol_error() {
    let srv = TestServer::default().await;
    let mut c = srv.v5("twice").await;
    c.send(Packet::Connect(Box::new(connect_v5("twice")))).await;
    c.expect_disconnect(rc::PROTOCOL_ERROR).await;
    srv.assert_alive().await;
}

#[tokio::test]
async fn mqtt5_3_1_4_connect_timeout_closes() {
    let mut cfg = config();
    cfg.mqtt.connect_timeout_ms = 200;
    let srv = TestServer::start(cfg).await;
    let mut c = RawClient::tcp(srv.addr, ProtocolVersion::V5).await;
    let start = Instant::now();
    match c.try_recv(Duration::from_millis(1_500)).await {
        Err(RecvError::Closed) => {}
        other => panic!("expected a close without any packet, got {other:?}"),
    }
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(150),
        "closed too early: {took:?}"
    );
    srv.assert_alive().await;
}

#[tokio::test]
async fn mqtt5_3_1_4_3_session_takeover_disconnects_old() {
    let srv = TestServer::default().await;
    let mut old = srv.v5("dup-id").await;
    let (mut new, ack) = RawClient::connect_ack(srv.addr, connect_v5("dup-id")).await;
    assert!(!ack.session_present);
    // [MQTT-3.1.4-3] the existing connection is closed, with 0x8E in MQTT 5.
    old.expect_disconnect(rc::SESSION_TAKEN_OVER).await;
    new.send(Packet::PingReq).await;
    assert_eq!(new.recv().await, Packet::PingResp);
    new.disconnect().await;
}

#[tokio::test]
async fn mqtt5_3_1_4_3_session_takeover_keeps_session() {
    let srv = TestServer::default().await;
    let mut conn = connect_v5("takeover-resume");
    conn.properties.session_expiry_interval = Some(60);
    let mut old = RawClient::connect_ok(srv.addr, conn.clone()).await;
    old.subscribe("to/r", lanemq_protocol::QoS::AtLeastOnce)
        .await;
    conn.clean_start = false;
    let (mut new, ack) = RawClient::connect_ack(srv.addr, conn).await;
    assert!(ack.session_present, "session resumed by the new connection");
    old.expect_disconnect(rc::SESSION_TAKEN_OVER).await;
    let mut p = srv.v5("takeover-pub").await;
    p.publish_qos1("to/r", b"x").await;
    let got = new.recv_publish_ack().await;
    assert_eq!(got.topic, "to/r");
    new.disconnect().await;
}

#[tokio::test]
async fn mqtt5_3_1_3_1_authentication_method_unsupported() {
    let srv = TestServer::default().await;
    let mut conn = connect_v5("auth");
    conn.properties.authentication_method = Some("SCRAM-SHA-1".into());
    let (mut c, first) = RawClient::connect(srv.addr, conn).await;
    match first {
        Ok(Packet::ConnAck(a)) => assert_eq!(a.reason_code, rc::BAD_AUTHENTICATION_METHOD),
        other => panic!("expected CONNACK 0x8C, got {other:?}"),
    }
    c.expect_closed().await;
}

#[tokio::test]
async fn mqtt5_3_1_2_24_no_connack_over_the_clients_maximum_packet_size() {
    let mut cfg = config();
    cfg.mqtt.response_information = Some("reply/{client_id}".into());
    let srv = TestServer::start(cfg).await;
    // What a CONNACK with the optional Response Information costs.
    let mut want = connect_v5("mps-probe");
    want.properties.request_response_information = Some(true);
    let (c, full) = RawClient::connect_ack(srv.addr, want).await;
    assert!(full.properties.response_information.is_some());
    let full_len =
        lanemq_protocol::encoded_len(&Packet::ConnAck(full.clone()), ProtocolVersion::V5);
    c.disconnect().await;
    // A limit just below that: the optional property is left out, the CONNACK fits.
    let mut tight = connect_v5("mps-tight");
    tight.properties.request_response_information = Some(true);
    tight.properties.maximum_packet_size = Some((full_len - 1) as u32);
    let (c, ack) = RawClient::connect_ack(srv.addr, tight).await;
    assert_eq!(ack.properties.response_information, None);
    assert!(
        lanemq_protocol::encoded_len(&Packet::ConnAck(ack), ProtocolVersion::V5) < full_len,
        "[MQTT-3.1.2-24]"
    );
    c.disconnect().await;
    // A limit below any CONNACK: none is sent [MQTT-3.1.2-24]; the connection closes.
    let mut tiny = connect_v5("mps-tiny");
    tiny.properties.maximum_packet_size = Some(8);
    let (mut c, first) = RawClient::connect(srv.addr, tiny).await;
    assert!(
        matches!(first, Err(RecvError::Closed)),
        "expected the connection closed without a CONNACK, got {first:?}"
    );
    c.expect_closed().await;
    srv.assert_alive().await;
}
