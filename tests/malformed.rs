//! MQTT 5.0 sections 1.5, 2.1.3, 2.2, 4.13: malformed packets and protocol errors end the
//! connection with the right DISCONNECT reason code; the broker keeps serving everyone else.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use lanemq_protocol::reason as rc;
use lanemq_protocol::{Packet, ProtocolVersion};

/// Connect an MQTT 5 client, send `bytes`, expect DISCONNECT `code` and the close, then check
/// that another client is still served.
async fn expect_reason(bytes: &[u8], code: u8) {
    let srv = TestServer::default().await;
    let mut c = srv.v5("bad").await;
    c.send_raw(bytes).await;
    c.expect_disconnect(code).await;
    srv.assert_alive().await;
}

/// A PUBLISH QoS 0 frame with the given raw topic bytes and raw property block.
fn raw_publish(first: u8, topic: &[u8], pid: Option<u16>, props: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&(topic.len() as u16).to_be_bytes());
    body.extend_from_slice(topic);
    if let Some(pid) = pid {
        body.extend_from_slice(&pid.to_be_bytes());
    }
    body.push(props.len() as u8);
    body.extend_from_slice(props);
    body.extend_from_slice(payload);
    let mut out = vec![first, body.len() as u8];
    out.extend_from_slice(&body);
    out
}

#[tokio::test]
async fn mqtt5_2_1_3_1_reserved_flags_subscribe() {
    // SUBSCRIBE must have flags 0010 [MQTT-3.8.1-1]; here 0000.
    let mut ok = bytes_of(
        &Packet::Subscribe(lanemq_protocol::Subscribe {
            packet_id: 1,
            filters: vec![lanemq_protocol::SubscribeFilter {
                filter: "a".into(),
                options: Default::default(),
            }],
            properties: Default::default(),
        }),
        ProtocolVersion::V5,
    );
    assert_eq!(ok[0], 0x82);
    ok[0] = 0x80;
    expect_reason(&ok, rc::MALFORMED_PACKET).await;
}

#[tokio::test]
async fn mqtt5_2_1_3_1_reserved_flags_pingreq() {
    expect_reason(&[0xC1, 0x00], rc::MALFORMED_PACKET).await;
}

#[tokio::test]
async fn mqtt5_2_1_3_1_reserved_flags_pubrel() {
    // PUBREL with flags 0000 instead of 0010 [MQTT-3.6.1-1].
    expect_reason(&[0x60, 0x02, 0x00, 0x01], rc::MALFORMED_PACKET).await;
}

#[tokio::test]
async fn mqtt5_3_3_1_2_publish_qos_3() {
    expect_reason(
        &raw_publish(0x36, b"a", Some(1), &[], b"x"),
        rc::MALFORMED_PACKET,
    )
    .await;
}

#[tokio::test]
async fn mqtt5_3_3_1_1_dup_with_qos0() {
    // [MQTT-3.3.1-2] DUP must be 0 for QoS 0.
    expect_reason(
        &raw_publish(0x38, b"a", None, &[], b"x"),
        rc::MALFORMED_PACKET,
    )
    .await;
}

#[tokio::test]
async fn mqtt5_1_5_5_remaining_length_more_than_4_bytes() {
    expect_reason(
        &[0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01, 0x00],
        rc::MALFORMED_PACKET,
    )
    .await;
}

#[tokio::test]
async fn mqtt5_1_5_4_1_invalid_utf8_topic() {
    // [MQTT-1.5.4-1] ill-formed UTF-8 is a Malformed Packet.
    expect_reason(
        &raw_publish(0x30, b"a/\xC3\x28", None, &[], b"x"),
        rc::MALFORMED_PACKET,
    )
    .await;
}

#[tokio::test]
async fn mqtt5_1_5_4_2_null_character_in_topic() {
    // [MQTT-1.5.4-2] U+0000 is a Malformed Packet.
    expect_reason(
        &raw_publish(0x30, b"a\x00b", None, &[], b"x"),
        rc::MALFORMED_PACKET,
    )
    .await;
}

#[tokio::test]
async fn mqtt5_1_5_4_1_utf16_surrogate_in_topic() {
    // U+D800 encoded in "UTF-8" (ED A0 80) is not valid UTF-8 [MQTT-1.5.4-1].
    expect_reason(
        &raw_publish(0x30, b"a\xED\xA0\x80", None, &[], b"x"),
        rc::MALFORMED_PACKET,
    )
    .await;
}

#[tokio::test]
async fn mqtt5_3_3_2_1_wildcard_in_publish_topic() {
    // [MQTT-3.3.2-2] 0x90 Topic Name invalid.
    expect_reason(
        &raw_publish(0x30, b"a/+", None, &[], b"x"),
        rc::TOPIC_NAME_INVALID,
    )
    .await;
    expect_reason(
        &raw_publish(0x30, b"a/#", None, &[], b"x"),
        rc::TOPIC_NAME_INVALID,
    )
    .await;
}

#[tokio::test]
async fn mqtt5_2_2_1_3_packet_id_zero_on_qos1() {
    // [MQTT-2.2.1-3] non-zero packet identifier for QoS > 0.
    expect_reason(
        &raw_publish(0x32, b"a", Some(0), &[], b"x"),
        rc::PROTOCOL_ERROR,
    )
    .await;
}

#[tokio::test]
async fn mqtt5_2_2_2_2_duplicate_property() {
    // Payload Format Indicator twice: "It is a Protocol Error to include ... more than once".
    expect_reason(
        &raw_publish(0x30, b"a", None, &[0x01, 0x00, 0x01, 0x00], b"x"),
        rc::PROTOCOL_ERROR,
    )
    .await;
}

#[tokio::test]
async fn mqtt5_2_2_2_2_unknown_property_identifier() {
    expect_reason(
        &raw_publish(0x30, b"a", None, &[0x7F, 0x00], b"x"),
        rc::MALFORMED_PACKET,
    )
    .await;
    // 0x05 is an unassigned identifier as well.
    expect_reason(
        &raw_publish(0x30, b"a", None, &[0x05, 0x00], b"x"),
        rc::MALFORMED_PACKET,
    )
    .await;
}

#[tokio::test]
async fn mqtt5_2_2_2_2_property_not_valid_for_packet_type() {
    // Session Expiry Interval (0x11) in PUBLISH: "A Control Packet which contains an
    // Identifier which is not valid for its packet type ... is a Malformed Packet."
    expect_reason(
        &raw_publish(0x30, b"a", None, &[0x11, 0, 0, 0, 1], b"x"),
        rc::MALFORMED_PACKET,
    )
    .await;
}

#[tokio::test]
async fn mqtt5_3_3_2_3_4_topic_alias_zero() {
    // [MQTT-3.3.2-8] Topic Alias 0 is not permitted.
    let bytes = raw_publish(0x30, b"a", None, &[0x23, 0x00, 0x00], b"x");
    let srv = TestServer::default().await;
    let mut c = srv.v5("bad").await;
    c.send_raw(&bytes).await;
    match c.recv().await {
        Packet::Disconnect(d) => assert!(
            d.reason_code == rc::PROTOCOL_ERROR || d.reason_code == rc::TOPIC_ALIAS_INVALID,
            "reason 0x{:02X}",
            d.reason_code
        ),
        other => panic!("expected DISCONNECT, got {other:?}"),
    }
    c.expect_closed().await;
    srv.assert_alive().await;
}

#[tokio::test]
async fn mqtt5_3_8_3_2_subscribe_without_filters() {
    // [MQTT-3.8.3-2] at least one filter; no payload is a Protocol Error.
    expect_reason(&[0x82, 0x03, 0x00, 0x01, 0x00], rc::PROTOCOL_ERROR).await;
}

#[tokio::test]
async fn mqtt5_3_10_3_2_unsubscribe_without_filters() {
    // [MQTT-3.10.3-2]
    expect_reason(&[0xA2, 0x03, 0x00, 0x01, 0x00], rc::PROTOCOL_ERROR).await;
}

#[tokio::test]
async fn mqtt5_3_8_3_5_subscription_options_reserved_bits() {
    // [MQTT-3.8.3-5] bits 6 and 7 of the subscription options are reserved.
    expect_reason(
        &[0x82, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, b'a', 0xC0],
        rc::MALFORMED_PACKET,
    )
    .await;
}

#[tokio::test]
async fn mqtt5_3_8_3_1_retain_handling_3() {
    // Retain Handling 3 is a Protocol Error.
    expect_reason(
        &[0x82, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, b'a', 0x30],
        rc::PROTOCOL_ERROR,
    )
    .await;
}

#[tokio::test]
async fn mqtt5_2_1_2_reserved_packet_type_0() {
    expect_reason(&[0x00, 0x00], rc::MALFORMED_PACKET).await;
}

#[tokio::test]
async fn mqtt5_4_13_garbage_bytes_after_connect() {
    expect_reason(
        &[0xFF, 0x13, 0x37, 0xDE, 0xAD, 0xBE, 0xEF],
        rc::MALFORMED_PACKET,
    )
    .await;
}

#[tokio::test]
async fn mqtt5_2_1_trailing_bytes_in_pingreq() {
    expect_reason(&[0xC0, 0x01, 0x00], rc::MALFORMED_PACKET).await;
}

#[tokio::test]
async fn mqtt5_3_15_auth_without_authentication_method() {
    // AUTH without an Authentication Method in CONNECT: Protocol Error (4.12).
    expect_reason(&[0xF0, 0x00], rc::PROTOCOL_ERROR).await;
}

#[tokio::test]
async fn mqtt5_3_3_4_subscription_identifier_from_client() {
    // [MQTT-3.3.4-6] a PUBLISH from a client must not contain a Subscription Identifier.
    expect_reason(
        &raw_publish(0x30, b"a", None, &[0x0B, 0x01], b"x"),
        rc::PROTOCOL_ERROR,
    )
    .await;
}

#[tokio::test]
async fn mqtt5_4_13_garbage_instead_of_connect() {
    let srv = TestServer::default().await;
    let mut c = RawClient::tcp(srv.addr, ProtocolVersion::V5).await;
    c.send_raw(&[0xDE, 0xAD, 0xBE, 0xEF, 0x00, 0x01, 0x02])
        .await;
    // Either closed straight away or a CONNACK with a failure code first [MQTT-4.13.1-1].
    match c.try_recv(std::time::Duration::from_millis(RECV_MS)).await {
        Err(RecvError::Closed) => {}
        Ok(Packet::ConnAck(a)) if a.reason_code >= 0x80 => c.expect_closed().await,
        other => panic!("expected a close, got {other:?}"),
    }
    srv.assert_alive().await;
}

#[tokio::test]
async fn mqtt5_3_1_2_3_connect_reserved_flag() {
    let srv = TestServer::default().await;
    let mut bytes = bytes_of(
        &Packet::Connect(Box::new(connect_v5("rsv"))),
        ProtocolVersion::V5,
    );
    // [0x10, len, 0, 4, M, Q, T, T, 5, flags, ...]
    bytes[9] |= 0x01;
    let mut c = RawClient::tcp(srv.addr, ProtocolVersion::V5).await;
    c.send_raw(&bytes).await;
    // [MQTT-3.1.2-3] Malformed Packet: CONNACK 0x81 or just a close.
    match c.try_recv(std::time::Duration::from_millis(RECV_MS)).await {
        Err(RecvError::Closed) => {}
        Ok(Packet::ConnAck(a)) => {
            assert_eq!(a.reason_code, rc::MALFORMED_PACKET);
            c.expect_closed().await;
        }
        other => panic!("expected a close, got {other:?}"),
    }
    srv.assert_alive().await;
}

#[tokio::test]
async fn mqtt311_4_8_0_malformed_closes_without_disconnect() {
    let srv = TestServer::default().await;
    let mut c = srv.v311("bad311").await;
    c.send_raw(&[0xC1, 0x00]).await;
    // 3.1.1 has no server DISCONNECT: the connection is just closed.
    c.expect_closed().await;
    srv.assert_alive().await;
}

#[tokio::test]
async fn mqtt5_4_13_1_partial_packet_then_close_keeps_broker_alive() {
    let srv = TestServer::default().await;
    let mut c = srv.v5("partial").await;
    c.send_raw(&[0x30, 0x7F, 0x00, 0x01]).await;
    drop(c);
    srv.assert_alive().await;
}
