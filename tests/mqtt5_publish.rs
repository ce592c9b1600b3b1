//! MQTT 5.0 section 3.3 - 3.7 and 4.3: PUBLISH, the QoS flows, properties, topic aliases.
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use common::*;
use lanemq_protocol::reason as rc;
use lanemq_protocol::{Packet, PubResp, Publish, PublishProperties, QoS};
use std::collections::HashMap;
use std::time::Duration;

#[tokio::test]
async fn mqtt5_4_3_1_qos0_delivery() {
    let srv = TestServer::default().await;
    let mut sub = srv.v5("sub").await;
    sub.subscribe("q0/t", QoS::AtMostOnce).await;
    let mut publ = srv.v5("pub").await;
    publ.publish_qos0("q0/t", b"hello").await;
    let p = sub.recv_publish().await;
    assert_eq!(p.topic, "q0/t");
    assert_eq!(p.qos, QoS::AtMostOnce);
    assert_eq!(p.packet_id, 0);
    assert!(!p.dup && !p.retain);
    assert_eq!(&p.payload[..], b"hello");
    sub.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt5_4_3_2_qos1_flow_both_directions() {
    let srv = TestServer::default().await;
    let mut sub = srv.v5("sub").await;
    sub.subscribe("q1/t", QoS::AtLeastOnce).await;
    let mut publ = srv.v5("pub").await;
    // [MQTT-4.3.2-4] PUBACK with the same packet identifier.
    assert_eq!(publ.publish_qos1("q1/t", b"one").await, rc::SUCCESS);
    let p = sub.recv_publish().await;
    assert_eq!(p.qos, QoS::AtLeastOnce);
    assert_ne!(p.packet_id, 0, "[MQTT-2.2.1-3]");
    assert!(!p.dup, "[MQTT-4.3.2-1] first delivery has DUP=0");
    assert_eq!(&p.payload[..], b"one");
    sub.send(Packet::PubAck(PubResp::new(p.packet_id, 0))).await;
    sub.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt5_4_3_3_qos2_flow_both_directions() {
    let srv = TestServer::default().await;
    let mut sub = srv.v5("sub").await;
    sub.subscribe("q2/t", QoS::ExactlyOnce).await;
    let mut publ = srv.v5("pub").await;
    let pid = publ.next_pid();
    let code = publ
        .publish_acked(publish("q2/t", QoS::ExactlyOnce, pid, b"two"))
        .await;
    assert_eq!(code, rc::SUCCESS);
    let p = sub.recv_publish().await;
    assert_eq!(p.qos, QoS::ExactlyOnce);
    assert_ne!(p.packet_id, 0);
    sub.send(Packet::PubRec(PubResp::new(p.packet_id, 0))).await;
    match sub.recv().await {
        Packet::PubRel(r) => {
            assert_eq!(r.packet_id, p.packet_id, "[MQTT-4.3.3-4]");
            assert_eq!(r.reason_code, 0);
        }
        other => panic!("expected PUBREL, got {other:?}"),
    }
    sub.send(Packet::PubComp(PubResp::new(p.packet_id, 0)))
        .await;
    sub.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt5_3_8_4_qos_downgraded_to_granted() {
    let srv = TestServer::default().await;
    let mut sub = srv.v5("sub").await;
    sub.subscribe("dg/t", QoS::AtLeastOnce).await;
    let mut publ = srv.v5("pub").await;
    let pid = publ.next_pid();
    publ.publish_acked(publish("dg/t", QoS::ExactlyOnce, pid, b"x"))
        .await;
    let p = sub.recv_publish_ack().await;
    assert_eq!(p.qos, QoS::AtLeastOnce, "min(published, granted)");
    // And upgraded never: QoS 0 publish stays QoS 0.
    publ.publish_qos0("dg/t", b"y").await;
    let p = sub.recv_publish().await;
    assert_eq!(p.qos, QoS::AtMostOnce);
}

#[tokio::test]
async fn mqtt5_3_4_2_1_puback_no_matching_subscribers() {
    let srv = TestServer::default().await;
    let mut publ = srv.v5("pub").await;
    let code = publ.publish_qos1("nobody/here", b"x").await;
    assert!(
        code == rc::SUCCESS || code == rc::NO_MATCHING_SUBSCRIBERS,
        "PUBACK 0x{code:02X}"
    );
}

#[tokio::test]
async fn mqtt5_4_3_3_qos2_inbound_dedup_by_packet_id() {
    let srv = TestServer::default().await;
    let mut sub = srv.v5("sub").await;
    sub.subscribe("dd/t", QoS::AtLeastOnce).await;
    let mut publ = srv.v5("pub").await;
    let p = publish("dd/t", QoS::ExactlyOnce, 7, b"once");
    publ.send(Packet::Publish(p.clone())).await;
    match publ.recv().await {
        Packet::PubRec(r) => assert_eq!((r.packet_id, r.reason_code), (7, 0)),
        other => panic!("expected PUBREC, got {other:?}"),
    }
    // The same packet id again before PUBREL (a retransmission, DUP=1): PUBREC again, no
    // second delivery [MQTT-4.3.3-10].
    let mut again = p.clone();
    again.dup = true;
    publ.send(Packet::Publish(again)).await;
    match publ.recv().await {
        Packet::PubRec(r) => assert_eq!(r.packet_id, 7),
        other => panic!("expected PUBREC, got {other:?}"),
    }
    publ.send(Packet::PubRel(PubResp::new(7, 0))).await;
    match publ.recv().await {
        Packet::PubComp(r) => assert_eq!((r.packet_id, r.reason_code), (7, 0)),
        other => panic!("expected PUBCOMP, got {other:?}"),
    }
    let got = sub.recv_publish_ack().await;
    assert_eq!(&got.payload[..], b"once");
    sub.expect_nothing(QUIET_MS).await;

    // After PUBCOMP the packet id is free: a new PUBLISH with it is a new message.
    let code = publ
        .publish_acked(publish("dd/t", QoS::ExactlyOnce, 7, b"new"))
        .await;
    assert_eq!(code, 0);
    let got = sub.recv_publish_ack().await;
    assert_eq!(&got.payload[..], b"new");
}

#[tokio::test]
async fn mqtt5_4_3_3_pubrel_unknown_packet_id() {
    let srv = TestServer::default().await;
    let mut c = srv.v5("c").await;
    c.send(Packet::PubRel(PubResp::new(99, 0))).await;
    match c.recv().await {
        Packet::PubComp(r) => {
            assert_eq!(r.packet_id, 99);
            assert_eq!(r.reason_code, rc::PACKET_IDENTIFIER_NOT_FOUND);
        }
        other => panic!("expected PUBCOMP 0x92, got {other:?}"),
    }
}

/// Session with expiry, subscribed to `filter`, then disconnected.
async fn offline_subscriber(srv: &TestServer, id: &str, filter: &str, qos: QoS) {
    let mut conn = connect_v5(id);
    conn.properties.session_expiry_interval = Some(60);
    let mut c = RawClient::connect_ok(srv.addr, conn).await;
    c.subscribe(filter, qos).await;
    c.disconnect().await;
}

async fn resume(srv: &TestServer, id: &str) -> RawClient {
    let mut conn = connect_v5(id);
    conn.clean_start = false;
    conn.properties.session_expiry_interval = Some(60);
    let (c, ack) = RawClient::connect_ack(srv.addr, conn).await;
    assert!(ack.session_present, "session of {id} resumed");
    c
}

#[tokio::test]
async fn mqtt5_3_3_2_3_3_message_expiry() {
    let srv = TestServer::default().await;
    offline_subscriber(&srv, "exp-sub", "exp/#", QoS::AtLeastOnce).await;
    let mut publ = srv.v5("pub").await;
    for (topic, expiry) in [
        ("exp/short", Some(1)),
        ("exp/long", Some(10)),
        ("exp/none", None),
    ] {
        let pid = publ.next_pid();
        let mut p = publish(topic, QoS::AtLeastOnce, pid, topic.as_bytes());
        p.properties.message_expiry_interval = expiry;
        publ.publish_acked(p).await;
    }
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let mut sub = resume(&srv, "exp-sub").await;
    // [MQTT-3.3.2-5] the expired message is not delivered.
    let a = sub.recv_publish_ack().await;
    assert_eq!(a.topic, "exp/long");
    // [MQTT-3.3.2-6] the remaining interval is forwarded.
    let left = a
        .properties
        .message_expiry_interval
        .expect("expiry forwarded");
    assert!(
        (8..=9).contains(&left),
        "remaining expiry {left}, expected 10 - 1.3 s"
    );
    let b = sub.recv_publish_ack().await;
    assert_eq!(b.topic, "exp/none");
    assert_eq!(b.properties.message_expiry_interval, None);
    sub.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt5_3_3_2_3_3_message_expiry_forwarded_online() {
    let srv = TestServer::default().await;
    let mut sub = srv.v5("sub").await;
    sub.subscribe("expo/t", QoS::AtMostOnce).await;
    let mut publ = srv.v5("pub").await;
    let mut p = publish("expo/t", QoS::AtMostOnce, 0, b"x");
    p.properties.message_expiry_interval = Some(60);
    publ.send(Packet::Publish(p)).await;
    let got = sub.recv_publish().await;
    let left = got.properties.message_expiry_interval;
    assert!(matches!(left, Some(59) | Some(60)), "got {left:?}");
}

#[tokio::test]
async fn mqtt5_3_3_2_3_properties_forwarded_unaltered() {
    let srv = TestServer::default().await;
    let mut sub = srv.v5("sub").await;
    sub.subscribe("props/t", QoS::AtLeastOnce).await;
    let mut publ = srv.v5("pub").await;
    let users: Vec<(String, String)> = [("a", "1"), ("b", "2"), ("a", "3"), ("a", "1")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let pid = publ.next_pid();
    let mut p = publish("props/t", QoS::AtLeastOnce, pid, "héllo".as_bytes());
    p.properties = PublishProperties {
        payload_format_indicator: Some(1),
        content_type: Some("text/plain; charset=utf-8".into()),
        response_topic: Some("props/reply".into()),
        correlation_data: Some(Bytes::from_static(b"\x00\x01corr")),
        user_properties: users.clone(),
        ..Default::default()
    };
    publ.publish_acked(p).await;
    let got = sub.recv_publish_ack().await;
    let gp = &got.properties;
    assert_eq!(gp.payload_format_indicator, Some(1), "[MQTT-3.3.2-4]");
    assert_eq!(
        gp.content_type.as_deref(),
        Some("text/plain; charset=utf-8"),
        "[MQTT-3.3.2-20]"
    );
    assert_eq!(
        gp.response_topic.as_deref(),
        Some("props/reply"),
        "[MQTT-3.3.2-15]"
    );
    assert_eq!(
        gp.correlation_data.as_deref(),
        Some(&b"\x00\x01corr"[..]),
        "[MQTT-3.3.2-16]"
    );
    // [MQTT-3.3.2-17] [MQTT-3.3.2-18]: order kept, duplicates kept.
    assert_eq!(gp.user_properties, users);
    assert_eq!(got.payload, "héllo".as_bytes());
}

#[tokio::test]
async fn mqtt5_3_3_2_3_2_payload_format_invalid() {
    let srv = TestServer::default().await;
    let mut sub = srv.v5("sub").await;
    sub.subscribe("pfi/t", QoS::AtLeastOnce).await;
    let mut publ = srv.v5("pub").await;
    let pid = publ.next_pid();
    let mut p = publish("pfi/t", QoS::AtLeastOnce, pid, b"\xff\xfe not utf-8");
    p.properties.payload_format_indicator = Some(1);
    let code = publ.publish_acked(p).await;
    assert_eq!(code, rc::PAYLOAD_FORMAT_INVALID);
    sub.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt5_3_3_2_3_4_topic_alias_client_to_server() {
    let srv = TestServer::default().await;
    let mut sub = srv.v5("sub").await;
    sub.subscribe("ta/#", QoS::AtMostOnce).await;
    let mut publ = srv.v5("pub").await;
    let mut p = publish("ta/1", QoS::AtMostOnce, 0, b"a");
    p.properties.topic_alias = Some(1);
    publ.send(Packet::Publish(p)).await;
    let mut p = publish("", QoS::AtMostOnce, 0, b"b");
    p.properties.topic_alias = Some(1);
    publ.send(Packet::Publish(p)).await;
    // Re-map alias 1 [MQTT-3.3.2-12 .. 3.3.2.3.4].
    let mut p = publish("ta/2", QoS::AtMostOnce, 0, b"c");
    p.properties.topic_alias = Some(1);
    publ.send(Packet::Publish(p)).await;
    let mut p = publish("", QoS::AtMostOnce, 0, b"d");
    p.properties.topic_alias = Some(1);
    publ.send(Packet::Publish(p)).await;
    for (topic, payload) in [("ta/1", "a"), ("ta/1", "b"), ("ta/2", "c"), ("ta/2", "d")] {
        let got = sub.recv_publish().await;
        assert_eq!(
            (got.topic.as_str(), &got.payload[..]),
            (topic, payload.as_bytes())
        );
        assert_eq!(
            got.properties.topic_alias, None,
            "subscriber allows no aliases"
        );
    }
}

#[tokio::test]
async fn mqtt5_3_3_2_3_4_topic_alias_above_maximum() {
    let mut cfg = config();
    cfg.mqtt.topic_alias_max = 4;
    let srv = TestServer::start(cfg).await;
    let mut c = srv.v5("c").await;
    let mut p = publish("big/alias", QoS::AtMostOnce, 0, b"x");
    p.properties.topic_alias = Some(5);
    c.send(Packet::Publish(p)).await;
    // [MQTT-3.3.2-10] 0x94 Topic Alias invalid.
    c.expect_disconnect(rc::TOPIC_ALIAS_INVALID).await;
    srv.assert_alive().await;
}

#[tokio::test]
async fn mqtt5_3_3_2_3_4_topic_alias_disabled() {
    let mut cfg = config();
    cfg.mqtt.topic_alias_max = 0;
    let srv = TestServer::start(cfg).await;
    let (mut c, ack) = RawClient::connect_ack(srv.addr, connect_v5("c")).await;
    assert!(matches!(ack.properties.topic_alias_maximum, None | Some(0)));
    let mut p = publish("no/alias", QoS::AtMostOnce, 0, b"x");
    p.properties.topic_alias = Some(1);
    c.send(Packet::Publish(p)).await;
    // [MQTT-3.2.2-18] Topic Alias Maximum absent or 0: the client must not send any.
    c.expect_disconnect(rc::TOPIC_ALIAS_INVALID).await;
}

#[tokio::test]
async fn mqtt5_3_3_2_3_4_unknown_topic_alias_protocol_error() {
    let srv = TestServer::default().await;
    let mut c = srv.v5("c").await;
    let mut p = publish("", QoS::AtMostOnce, 0, b"x");
    p.properties.topic_alias = Some(3);
    c.send(Packet::Publish(p)).await;
    c.expect_disconnect(rc::PROTOCOL_ERROR).await;
    srv.assert_alive().await;
}

#[tokio::test]
async fn mqtt5_3_3_2_1_empty_topic_without_alias_protocol_error() {
    let srv = TestServer::default().await;
    let mut c = srv.v5("c").await;
    c.send(Packet::Publish(publish("", QoS::AtMostOnce, 0, b"x")))
        .await;
    c.expect_disconnect(rc::PROTOCOL_ERROR).await;
}

#[tokio::test]
async fn mqtt5_3_3_2_3_4_topic_alias_server_to_client() {
    let srv = TestServer::default().await;
    let mut conn = connect_v5("sub");
    conn.properties.topic_alias_maximum = Some(2);
    let mut sub = RawClient::connect_ok(srv.addr, conn).await;
    sub.subscribe("sa/#", QoS::AtMostOnce).await;
    let mut publ = srv.v5("pub").await;
    let topics = ["sa/a", "sa/a", "sa/b", "sa/c", "sa/a", "sa/c", "sa/b"];
    for t in topics {
        publ.publish_qos0(t, t.as_bytes()).await;
    }
    let mut aliases: HashMap<u16, String> = HashMap::new();
    let mut used_empty = false;
    for t in topics {
        let got = sub.recv_publish().await;
        let resolved = match got.properties.topic_alias {
            Some(a) => {
                assert!(
                    (1..=2).contains(&a),
                    "[MQTT-3.3.2-9] alias {a} above maximum 2"
                );
                if got.topic.is_empty() {
                    used_empty = true;
                    aliases.get(&a).cloned().expect("alias was set before use")
                } else {
                    aliases.insert(a, got.topic.clone());
                    got.topic.clone()
                }
            }
            None => got.topic.clone(),
        };
        assert_eq!(resolved, t);
        assert_eq!(&got.payload[..], t.as_bytes());
    }
    assert!(
        used_empty,
        "the broker is configured to use outbound aliases"
    );
}

#[tokio::test]
async fn mqtt5_3_3_2_3_4_no_server_alias_without_client_maximum() {
    let srv = TestServer::default().await;
    let mut sub = srv.v5("sub").await;
    sub.subscribe("na/t", QoS::AtMostOnce).await;
    let mut publ = srv.v5("pub").await;
    for _ in 0..3 {
        publ.publish_qos0("na/t", b"x").await;
    }
    for _ in 0..3 {
        let got = sub.recv_publish().await;
        assert_eq!(got.topic, "na/t");
        assert_eq!(got.properties.topic_alias, None, "[MQTT-3.3.2-9]");
    }
}

#[tokio::test]
async fn mqtt5_3_3_1_4_qos_above_maximum_qos() {
    let mut cfg = config();
    cfg.mqtt.maximum_qos = 1;
    let srv = TestServer::start(cfg).await;
    let (mut c, ack) = RawClient::connect_ack(srv.addr, connect_v5("c")).await;
    assert_eq!(ack.properties.maximum_qos, Some(1), "3.2.2.3.4 Maximum QoS");
    c.send(Packet::Publish(publish("mq/t", QoS::ExactlyOnce, 1, b"x")))
        .await;
    // [MQTT-3.2.2-11] 0x9B QoS not supported.
    c.expect_disconnect(rc::QOS_NOT_SUPPORTED).await;
}

#[tokio::test]
async fn mqtt5_3_3_1_rumqttc_qos_0_1_2_roundtrip() {
    use rumqttc::v5::mqttbytes::QoS as RQ;
    let srv = TestServer::default().await;
    let (sub, mut srx) = rumqttc_v5(srv.addr, "r-sub").await;
    sub.subscribe("rq/#", RQ::ExactlyOnce).await.unwrap();
    rumqttc_v5_suback(&mut srx).await;
    let (publ, _prx) = rumqttc_v5(srv.addr, "r-pub").await;
    for (i, q) in [RQ::AtMostOnce, RQ::AtLeastOnce, RQ::ExactlyOnce]
        .into_iter()
        .enumerate()
    {
        publ.publish(format!("rq/{i}"), q, false, vec![i as u8])
            .await
            .unwrap();
        let p = rumqttc_v5_publish(&mut srx).await;
        assert_eq!(&p.topic[..], format!("rq/{i}").as_bytes());
        assert_eq!(p.qos, q);
        assert_eq!(&p.payload[..], &[i as u8]);
    }
}

#[tokio::test]
async fn mqtt5_4_6_0_ordered_delivery_qos1() {
    let srv = TestServer::default().await;
    let mut sub = srv.v5("sub").await;
    sub.subscribe("ord/t", QoS::AtLeastOnce).await;
    let mut publ = srv.v5("pub").await;
    for i in 0..20u8 {
        let pid = publ.next_pid();
        publ.send(Packet::Publish(publish(
            "ord/t",
            QoS::AtLeastOnce,
            pid,
            &[i],
        )))
        .await;
    }
    for i in 0..20u8 {
        let got: Publish = sub.recv_publish_ack().await;
        assert_eq!(&got.payload[..], &[i], "[MQTT-4.6.0-6] order per topic");
    }
}

/// A subscriber at `qos` holding one delivery of that QoS (not yet acknowledged).
async fn holding(srv: &TestServer, id: &str, qos: QoS) -> (RawClient, u16) {
    let topic = format!("{id}/t");
    let mut sub = srv.v5(id).await;
    sub.subscribe(&topic, qos).await;
    let mut p = srv.v5("").await;
    let pid = p.next_pid();
    p.publish_acked(publish(&topic, qos, pid, b"x")).await;
    let got = sub.recv_publish().await;
    assert_eq!(got.qos, qos);
    (sub, got.packet_id)
}

#[tokio::test]
async fn mqtt5_4_13_pubrec_for_a_qos1_message_is_a_protocol_error() {
    let srv = TestServer::default().await;
    let (mut sub, pid) = holding(&srv, "ack-rec1", QoS::AtLeastOnce).await;
    sub.send(Packet::PubRec(PubResp::new(pid, 0))).await;
    sub.expect_disconnect(rc::PROTOCOL_ERROR).await;
}

#[tokio::test]
async fn mqtt5_4_13_pubcomp_for_a_qos1_message_is_a_protocol_error() {
    let srv = TestServer::default().await;
    let (mut sub, pid) = holding(&srv, "ack-comp1", QoS::AtLeastOnce).await;
    sub.send(Packet::PubComp(PubResp::new(pid, 0))).await;
    sub.expect_disconnect(rc::PROTOCOL_ERROR).await;
}

#[tokio::test]
async fn mqtt5_4_13_puback_for_a_qos2_message_is_a_protocol_error() {
    let srv = TestServer::default().await;
    let (mut sub, pid) = holding(&srv, "ack-ack2", QoS::ExactlyOnce).await;
    sub.send(Packet::PubAck(PubResp::new(pid, 0))).await;
    sub.expect_disconnect(rc::PROTOCOL_ERROR).await;
}

#[tokio::test]
async fn mqtt5_4_13_pubcomp_before_pubrel_is_a_protocol_error() {
    let srv = TestServer::default().await;
    let (mut sub, pid) = holding(&srv, "ack-comp2", QoS::ExactlyOnce).await;
    // No PUBREC yet, so the broker has sent no PUBREL.
    sub.send(Packet::PubComp(PubResp::new(pid, 0))).await;
    sub.expect_disconnect(rc::PROTOCOL_ERROR).await;
}

#[tokio::test]
async fn mqtt5_4_3_3_repeated_pubrec_and_unknown_ids_are_not_errors() {
    let srv = TestServer::default().await;
    let (mut sub, pid) = holding(&srv, "ack-ok2", QoS::ExactlyOnce).await;
    sub.send(Packet::PubRec(PubResp::new(pid, 0))).await;
    assert!(matches!(sub.recv().await, Packet::PubRel(r) if r.packet_id == pid));
    // A PUBREC again (the PUBREL may have been lost): the PUBREL again.
    sub.send(Packet::PubRec(PubResp::new(pid, 0))).await;
    assert!(matches!(sub.recv().await, Packet::PubRel(r) if r.packet_id == pid));
    sub.send(Packet::PubComp(PubResp::new(pid, 0))).await;
    // Acknowledgements for ids not in flight are ignored (or answered with 0x92).
    sub.send(Packet::PubAck(PubResp::new(pid.wrapping_add(7), 0)))
        .await;
    sub.send(Packet::PubComp(PubResp::new(pid.wrapping_add(8), 0)))
        .await;
    srv.assert_alive().await;
    sub.expect_nothing(QUIET_MS).await;
}

/// QoS 0 PUBLISHes that arrive in one read are appended and delivered together; what was
/// published before a SUBSCRIBE in the same read is still delivered before the subscription
/// exists (never to it), and a QoS 1 PUBLISH between QoS 0 ones keeps its place.
#[tokio::test]
async fn qos0_publishes_of_one_read_keep_their_place_around_other_packets() {
    let srv = TestServer::default().await;
    let mut watcher = srv.v5("watcher").await;
    watcher.subscribe("batch/#", QoS::AtLeastOnce).await;
    let mut c = srv.v5("self").await;
    let v = lanemq_protocol::ProtocolVersion::V5;
    let mut wire = Vec::new();
    wire.extend(bytes_of(
        &Packet::Publish(publish("batch/t", QoS::AtMostOnce, 0, b"before")),
        v,
    ));
    wire.extend(bytes_of(
        &Packet::Subscribe(lanemq_protocol::Subscribe {
            packet_id: 7,
            filters: vec![lanemq_protocol::SubscribeFilter {
                filter: "batch/t".into(),
                options: sub_opts(QoS::AtMostOnce),
            }],
            properties: Default::default(),
        }),
        v,
    ));
    for (qos, pid, payload) in [
        (QoS::AtMostOnce, 0, &b"after"[..]),
        (QoS::AtLeastOnce, 1, b"middle"),
        (QoS::AtMostOnce, 0, b"last"),
    ] {
        wire.extend(bytes_of(
            &Packet::Publish(publish("batch/t", qos, pid, payload)),
            v,
        ));
    }
    c.send_raw(&wire).await;
    // The publisher: SUBACK, its PUBACK, and only what was published after its SUBSCRIBE.
    let mut got = Vec::new();
    let mut acks = 0;
    while got.len() < 3 || acks < 2 {
        match c.recv().await {
            Packet::SubAck(_) | Packet::PubAck(_) => acks += 1,
            Packet::Publish(p) => got.push(p.payload),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(got, vec![&b"after"[..], b"middle", b"last"]);
    c.expect_nothing(QUIET_MS).await;
    // Another subscriber: all three, in the order published.
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(watcher.recv_publish_ack().await.payload);
    }
    assert_eq!(seen, vec![&b"before"[..], b"after", b"middle", b"last"]);
}
