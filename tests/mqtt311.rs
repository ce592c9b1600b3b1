//! MQTT 3.1.1 (OASIS 2014): CONNECT/CONNACK, sessions, QoS flows, retained, wills, SUBACK.
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use common::*;
use lanemq_protocol::{Packet, ProtocolVersion, PubResp, QoS, Will};
use std::time::{Duration, Instant};

fn conn(id: &str, clean: bool) -> lanemq_protocol::Connect {
    let mut c = connect_v311(id);
    c.clean_start = clean;
    c
}

#[tokio::test]
async fn mqtt311_3_1_2_2_unacceptable_protocol_level() {
    let srv = TestServer::default().await;
    let mut bytes = bytes_of(
        &Packet::Connect(Box::new(connect_v311("lvl3"))),
        ProtocolVersion::V311,
    );
    assert_eq!(bytes[8], 4);
    bytes[8] = 3; // "MQTT" with level 3 is not a valid combination
    let mut c = RawClient::tcp(srv.addr, ProtocolVersion::V311).await;
    c.send_raw(&bytes).await;
    // [MQTT-3.1.2-2] CONNACK return code 0x01, 3.1.1 encoding, then close.
    let mut raw = [0u8; 4];
    tokio::time::timeout(
        Duration::from_millis(RECV_MS),
        tokio::io::AsyncReadExt::read_exact(&mut c.stream, &mut raw),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(raw, [0x20, 0x02, 0x00, 0x01]);
    c.expect_closed().await;
    srv.assert_alive().await;
}

#[tokio::test]
async fn mqtt311_3_1_3_8_empty_client_id_without_clean_session() {
    let srv = TestServer::default().await;
    let (mut c, first) = RawClient::connect(srv.addr, conn("", false)).await;
    match first {
        Ok(Packet::ConnAck(a)) => {
            // Decoded back to the MQTT 5 code; on the wire it is 0x02.
            assert_eq!(
                a.reason_code,
                lanemq_protocol::reason::CLIENT_IDENTIFIER_NOT_VALID
            );
            assert!(!a.session_present);
        }
        other => panic!("expected CONNACK 0x02, got {other:?}"),
    }
    c.expect_closed().await;
}

#[tokio::test]
async fn mqtt311_3_1_3_7_empty_client_id_with_clean_session() {
    let srv = TestServer::default().await;
    let (c, ack) = RawClient::connect_ack(srv.addr, conn("", true)).await;
    assert!(!ack.session_present);
    c.disconnect().await;
}

#[tokio::test]
async fn mqtt311_3_1_2_4_clean_session_false_resume() {
    let srv = TestServer::default().await;
    let mut c = RawClient::connect_ok(srv.addr, conn("p311", false)).await;
    c.subscribe("p311/t", QoS::AtLeastOnce).await;
    c.disconnect().await;
    let mut publ = srv.v311("pub").await;
    publ.publish_qos1("p311/t", b"stored").await;
    let (mut c, ack) = RawClient::connect_ack(srv.addr, conn("p311", false)).await;
    assert!(ack.session_present, "[MQTT-3.2.2-2]");
    let got = c.recv_publish_ack().await;
    assert_eq!(&got.payload[..], b"stored");
    // Subscriptions survive as well.
    publ.publish_qos1("p311/t", b"live").await;
    assert_eq!(&c.recv_publish_ack().await.payload[..], b"live");
}

#[tokio::test]
async fn mqtt311_3_1_2_6_clean_session_true_discards() {
    let srv = TestServer::default().await;
    let mut c = RawClient::connect_ok(srv.addr, conn("c311", false)).await;
    c.subscribe("c311/t", QoS::AtLeastOnce).await;
    c.disconnect().await;
    let (mut c, ack) = RawClient::connect_ack(srv.addr, conn("c311", true)).await;
    assert!(!ack.session_present, "[MQTT-3.2.2-1]");
    let mut publ = srv.v311("pub").await;
    publ.publish_qos1("c311/t", b"x").await;
    c.expect_nothing(QUIET_MS).await;
    c.disconnect().await;
    // [MQTT-3.1.2-6] a clean session ends with the connection.
    let (c, ack) = RawClient::connect_ack(srv.addr, conn("c311", false)).await;
    assert!(!ack.session_present);
    c.disconnect().await;
}

#[tokio::test]
async fn mqtt311_4_4_0_1_dup_redelivery_on_resume() {
    let srv = TestServer::default().await;
    let mut c = RawClient::connect_ok(srv.addr, conn("d311", false)).await;
    c.subscribe("d311/t", QoS::AtLeastOnce).await;
    let mut publ = srv.v311("pub").await;
    publ.publish_qos1("d311/t", b"again").await;
    let first = c.recv_publish().await;
    drop(c);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (mut c, ack) = RawClient::connect_ack(srv.addr, conn("d311", false)).await;
    assert!(ack.session_present);
    let again = c.recv_publish().await;
    assert!(again.dup, "[MQTT-3.3.1-1]");
    assert_eq!(again.packet_id, first.packet_id);
    c.send(Packet::PubAck(PubResp::new(again.packet_id, 0)))
        .await;
}

#[tokio::test]
async fn mqtt311_4_3_qos_flows_rumqttc() {
    use rumqttc::QoS as RQ;
    let srv = TestServer::default().await;
    let (sub, mut srx) = rumqttc_v311(srv.addr, "r311-sub", true).await;
    sub.subscribe("r311/#", RQ::ExactlyOnce).await.unwrap();
    let ack = rumqttc_v311_suback(&mut srx).await;
    assert_eq!(ack.return_codes.len(), 1);
    let (publ, _prx) = rumqttc_v311(srv.addr, "r311-pub", true).await;
    for (i, q) in [RQ::AtMostOnce, RQ::AtLeastOnce, RQ::ExactlyOnce]
        .into_iter()
        .enumerate()
    {
        publ.publish(format!("r311/{i}"), q, false, vec![i as u8])
            .await
            .unwrap();
        let p = rumqttc_v311_publish(&mut srx).await;
        assert_eq!(p.topic, format!("r311/{i}"));
        assert_eq!(p.qos, q);
        assert_eq!(&p.payload[..], &[i as u8]);
    }
}

#[tokio::test]
async fn mqtt311_4_3_3_qos2_raw_flow() {
    let srv = TestServer::default().await;
    let mut sub = srv.v311("s").await;
    sub.subscribe("q2/t", QoS::ExactlyOnce).await;
    let mut publ = srv.v311("p").await;
    let pid = publ.next_pid();
    publ.publish_acked(publish("q2/t", QoS::ExactlyOnce, pid, b"x"))
        .await;
    let got = sub.recv_publish_ack().await;
    assert_eq!(got.qos, QoS::ExactlyOnce);
    sub.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt311_3_3_1_9_retain_flag_for_new_and_established_subscriptions() {
    let srv = TestServer::default().await;
    let mut live = srv.v311("live").await;
    live.subscribe("r311/t", QoS::AtMostOnce).await;
    let mut publ = srv.v311("pub").await;
    let pid = publ.next_pid();
    let mut p = publish("r311/t", QoS::AtLeastOnce, pid, b"kept");
    p.retain = true;
    publ.publish_acked(p).await;
    // [MQTT-3.3.1-9] established subscription: RETAIN 0.
    assert!(!live.recv_publish().await.retain);
    // [MQTT-3.3.1-8] new subscription: RETAIN 1.
    let mut late = srv.v311("late").await;
    late.subscribe("r311/t", QoS::AtLeastOnce).await;
    let got = late.recv_publish_ack().await;
    assert!(got.retain);
    assert_eq!(&got.payload[..], b"kept");
    // [MQTT-3.3.1-10] empty retained payload clears it.
    let mut p = publish("r311/t", QoS::AtMostOnce, 0, b"");
    p.retain = true;
    publ.send(Packet::Publish(p)).await;
    publ.send(Packet::PingReq).await;
    assert_eq!(publ.recv().await, Packet::PingResp);
    let mut later = srv.v311("later").await;
    later.subscribe("r311/t", QoS::AtLeastOnce).await;
    later.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt311_3_9_3_invalid_filter_failure_0x80() {
    let srv = TestServer::default().await;
    let mut c = srv.v311("bad").await;
    let ack = c
        .subscribe_with(
            &[
                ("a/#/b", sub_opts(QoS::AtMostOnce)),
                ("ok", sub_opts(QoS::ExactlyOnce)),
            ],
            None,
        )
        .await;
    assert_eq!(ack.reason_codes, vec![0x80, 2]);
}

#[tokio::test]
async fn mqtt311_3_9_3_deny_subscribe_failure_0x80() {
    let mut cfg = config();
    cfg.mqtt.deny_subscribe = vec!["secret/#".into()];
    let srv = TestServer::start(cfg).await;
    let mut c = srv.v311("deny").await;
    let ack = c
        .subscribe_with(&[("secret/#", sub_opts(QoS::AtMostOnce))], None)
        .await;
    assert_eq!(ack.reason_codes, vec![0x80]);
}

#[tokio::test]
async fn mqtt311_3_1_2_10_keep_alive_closes_without_disconnect() {
    let srv = TestServer::default().await;
    let mut cn = conn("ka311", true);
    cn.keep_alive = 1;
    let mut c = RawClient::connect_ok(srv.addr, cn).await;
    let start = Instant::now();
    c.expect_nothing(1_100).await;
    match c.try_recv(Duration::from_millis(1_500)).await {
        Err(RecvError::Closed) => {}
        other => panic!("[MQTT-3.1.2-24] expected a close, got {other:?}"),
    }
    assert!(start.elapsed() <= Duration::from_millis(2_300));
}

#[tokio::test]
async fn mqtt311_3_1_4_2_takeover_closes_old_connection() {
    let srv = TestServer::default().await;
    let mut old = srv.v311("same").await;
    let mut new = RawClient::connect_ok(srv.addr, conn("same", true)).await;
    // [MQTT-3.1.4-2] the old connection is closed, no DISCONNECT in 3.1.1.
    old.expect_closed().await;
    new.send(Packet::PingReq).await;
    assert_eq!(new.recv().await, Packet::PingResp);
}

#[tokio::test]
async fn mqtt311_3_1_0_2_second_connect_closes() {
    let srv = TestServer::default().await;
    let mut c = srv.v311("twice").await;
    c.send(Packet::Connect(Box::new(connect_v311("twice"))))
        .await;
    c.expect_closed().await;
    srv.assert_alive().await;
}

fn will311(topic: &str) -> Will {
    Will {
        topic: topic.into(),
        payload: Bytes::from_static(b"bye"),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: Default::default(),
    }
}

#[tokio::test]
async fn mqtt311_3_1_2_8_will_on_abnormal_close() {
    let srv = TestServer::default().await;
    let mut w = srv.v311("watch").await;
    w.subscribe("w311/#", QoS::AtLeastOnce).await;
    let mut cn = conn("w311", true);
    cn.will = Some(will311("w311/gone"));
    let c = RawClient::connect_ok(srv.addr, cn).await;
    drop(c);
    let got = w.recv_publish_ack().await;
    assert_eq!(
        (got.topic.as_str(), &got.payload[..]),
        ("w311/gone", &b"bye"[..])
    );
}

#[tokio::test]
async fn mqtt311_3_1_2_10_will_on_keep_alive_timeout() {
    let srv = TestServer::default().await;
    let mut w = srv.v311("watch").await;
    w.subscribe("wka/#", QoS::AtLeastOnce).await;
    let mut cn = conn("wka", true);
    cn.keep_alive = 1;
    cn.will = Some(will311("wka/gone"));
    let _c = RawClient::connect_ok(srv.addr, cn).await;
    match w.try_recv(Duration::from_millis(2_500)).await {
        Ok(Packet::Publish(p)) => assert_eq!(p.topic, "wka/gone"),
        other => panic!("expected the will, got {other:?}"),
    }
}

#[tokio::test]
async fn mqtt311_3_14_4_3_no_will_on_disconnect() {
    let srv = TestServer::default().await;
    let mut w = srv.v311("watch").await;
    w.subscribe("wn311/#", QoS::AtLeastOnce).await;
    let mut cn = conn("wn311", true);
    cn.will = Some(will311("wn311/gone"));
    let c = RawClient::connect_ok(srv.addr, cn).await;
    c.disconnect().await;
    w.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt311_v5_publisher_to_v311_subscriber() {
    let srv = TestServer::default().await;
    let mut sub = srv.v311("s311").await;
    sub.subscribe("mix/t", QoS::AtLeastOnce).await;
    let mut publ = srv.v5("p5").await;
    let pid = publ.next_pid();
    let mut p = publish("mix/t", QoS::AtLeastOnce, pid, b"cross");
    p.properties.user_properties = vec![("a".into(), "b".into())];
    p.properties.message_expiry_interval = Some(30);
    publ.publish_acked(p).await;
    let got = sub.recv_publish_ack().await;
    assert_eq!(&got.payload[..], b"cross");
    assert_eq!(got.topic, "mix/t");
}

#[tokio::test]
async fn mqtt31_mqisdp_level_3_accepted() {
    let srv = TestServer::default().await;
    let mut cn = connect_v311("old31");
    cn.protocol = ProtocolVersion::V31;
    let (mut c, ack) = RawClient::connect_ack(srv.addr, cn).await;
    assert!(!ack.session_present);
    c.subscribe("v31/t", QoS::AtLeastOnce).await;
    c.publish_qos1("v31/t", b"x").await;
    assert_eq!(&c.recv_publish_ack().await.payload[..], b"x");
}

#[tokio::test]
async fn mqtt31_connack_never_sets_session_present_but_the_session_resumes() {
    let srv = TestServer::default().await;
    let mut cn = conn("old31p", false);
    cn.protocol = ProtocolVersion::V31;
    let (mut c, ack) = RawClient::connect_ack(srv.addr, cn.clone()).await;
    assert!(!ack.session_present);
    c.subscribe("v31p/t", QoS::AtLeastOnce).await;
    c.disconnect().await;
    // MQTT 3.1 has no Session Present flag: the second byte of the CONNACK is reserved (0),
    // although the session (and its subscription) is there.
    let (mut c, ack) = RawClient::connect_ack(srv.addr, cn).await;
    assert!(!ack.session_present, "3.1 CONNACK with Session Present set");
    let mut publ = srv.v311("old31p-pub").await;
    publ.publish_qos1("v31p/t", b"kept").await;
    assert_eq!(&c.recv_publish_ack().await.payload[..], b"kept");
}

#[tokio::test]
async fn mqtt311_3_2_2_2_session_present_0_after_a_clean_session_even_at_once() {
    let srv = TestServer::default().await;
    let mut old = stalled(srv.addr, conn("c311f", true), "fill/c311f", &["c311f/t"]).await;
    old.send(Packet::Disconnect(lanemq_protocol::Disconnect::new(0)))
        .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    // [MQTT-3.1.2-6] the clean session ended with its connection, although that connection
    // is still closing [MQTT-3.2.2-2].
    let (mut c, ack) = RawClient::connect_ack(srv.addr, conn("c311f", false)).await;
    assert!(!ack.session_present);
    let mut publ = srv.v311("c311f-pub").await;
    publ.publish_qos1("c311f/t", b"x").await;
    c.expect_nothing(QUIET_MS).await;
    c.disconnect().await;
    drop(old);
}

#[tokio::test]
async fn mqtt31_3_1_3_empty_client_id_is_rejected_with_rc_2() {
    let srv = TestServer::default().await;
    let mut c = conn("", true);
    c.protocol = ProtocolVersion::V31;
    // MQTT 3.1 (protocol name MQIsdp) requires a client id of 1 to 23 characters; clean
    // session or not, an empty one gets CONNACK 2 (identifier rejected).
    let (mut c, first) = RawClient::connect(srv.addr, c).await;
    match first {
        Ok(Packet::ConnAck(a)) => assert_eq!(
            a.reason_code,
            lanemq_protocol::reason::CLIENT_IDENTIFIER_NOT_VALID
        ),
        other => panic!("expected CONNACK 0x02, got {other:?}"),
    }
    c.expect_closed().await;
    // A non-empty one is fine.
    let mut ok = conn("v31-client", true);
    ok.protocol = ProtocolVersion::V31;
    let (c, ack) = RawClient::connect_ack(srv.addr, ok).await;
    assert!(!ack.session_present);
    c.disconnect().await;
}

#[tokio::test]
async fn mqtt311_4_3_wrong_kind_of_acknowledgement_closes_the_connection() {
    let srv = TestServer::default().await;
    let mut sub = srv.v311("wrongack").await;
    sub.subscribe("wrongack/t", QoS::AtLeastOnce).await;
    let mut publ = srv.v311("wrongack-p").await;
    publ.publish_qos1("wrongack/t", b"x").await;
    let got = sub.recv_publish().await;
    assert_eq!(got.qos, QoS::AtLeastOnce);
    // PUBREC for a QoS 1 message: a protocol violation; MQTT 3.1.1 closes the connection.
    sub.send(Packet::PubRec(PubResp::new(got.packet_id, 0)))
        .await;
    sub.expect_closed().await;
}
