//! Hibernation of idle plain-TCP connections (`mqtt.idle_hibernate_ms`): a connection with
//! nothing to do leaves its task for the broker's parking lot and comes back on its next
//! input, delivery, kick or keep-alive deadline; the client sees no difference.

use crate::common::*;
use lanemq_protocol::{Packet, PubResp, QoS};
use std::time::{Duration, Instant};

/// A server whose connections hibernate after 50 ms with nothing to do.
async fn server() -> TestServer {
    let mut cfg = config();
    cfg.mqtt.idle_hibernate_ms = 50;
    TestServer::start(cfg).await
}

async fn parked(srv: &TestServer, n: usize) -> bool {
    let lot = &srv.server().broker().lot;
    eventually(2_000, || lot.parked() == n).await
}

#[tokio::test]
async fn an_idle_subscriber_hibernates_and_still_gets_every_message_in_order() {
    let srv = server().await;
    let mut sub = srv.v5("hib-sub").await;
    sub.subscribe("hib/#", QoS::AtLeastOnce).await;
    assert!(parked(&srv, 1).await, "the idle subscriber hibernates");
    let mut publ = srv.v5("hib-pub").await;
    for round in 0..3u8 {
        // Both idle: both parked; a publish wakes the publisher (input) and the subscriber
        // (a delivery), which parks again afterwards.
        assert!(
            parked(&srv, 2).await,
            "both idle connections hibernate (round {round})"
        );
        for i in 0..5u8 {
            assert_eq!(publ.publish_qos1("hib/t", &[round, i]).await, 0);
        }
        for i in 0..5u8 {
            let p = sub.recv_publish_ack().await;
            assert_eq!(
                (p.topic.as_str(), &p.payload[..]),
                ("hib/t", &[round, i][..])
            );
        }
    }
}

#[tokio::test]
async fn a_hibernating_connection_answers_ping_and_finishes_a_qos2_exchange() {
    let srv = server().await;
    let mut c = srv.v5("hib-q2").await;
    c.send(Packet::Publish(publish(
        "hib2/x",
        QoS::ExactlyOnce,
        7,
        b"once",
    )))
    .await;
    match c.recv().await {
        Packet::PubRec(r) => assert_eq!((r.packet_id, r.reason_code), (7, 0x10)),
        other => panic!("expected PUBREC, got {other:?}"),
    }
    assert!(parked(&srv, 1).await);
    c.send(Packet::PingReq).await;
    assert_eq!(c.recv().await, Packet::PingResp);
    assert!(parked(&srv, 1).await, "parks again after the ping");
    c.send(Packet::PubRel(PubResp::new(7, 0))).await;
    match c.recv().await {
        Packet::PubComp(r) => assert_eq!((r.packet_id, r.reason_code), (7, 0)),
        other => panic!("expected PUBCOMP, got {other:?}"),
    }
}

#[tokio::test]
async fn keep_alive_holds_while_hibernating() {
    let srv = server().await;
    let mut w = srv.v5("hib-watch").await;
    w.subscribe("hibka/#", QoS::AtLeastOnce).await;
    let mut cn = connect_v5("hib-ka");
    cn.keep_alive = 1;
    cn.will = Some(lanemq_protocol::Will {
        topic: "hibka/gone".into(),
        payload: bytes::Bytes::from_static(b"bye"),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: Default::default(),
    });
    let mut c = RawClient::connect_ok(srv.addr, cn).await;
    let start = Instant::now();
    assert!(parked(&srv, 2).await, "both hibernate before the deadline");
    // [MQTT-3.1.2-22] closed after 1.5 x the keep alive without a packet, parked or not.
    c.expect_disconnect(0x8D).await;
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(1_400) && took <= Duration::from_millis(2_300),
        "closed after {took:?}"
    );
    let will = w.recv_publish_ack().await;
    assert_eq!(will.topic, "hibka/gone");
}

#[tokio::test]
async fn a_ping_while_hibernating_keeps_the_connection_alive() {
    let srv = server().await;
    let mut cn = connect_v5("hib-ping");
    cn.keep_alive = 1;
    let mut c = RawClient::connect_ok(srv.addr, cn).await;
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        c.send(Packet::PingReq).await;
        assert_eq!(c.recv().await, Packet::PingResp);
    }
}

#[tokio::test]
async fn take_over_admin_kick_and_shutdown_reach_a_hibernating_connection() {
    let mut srv = server().await;
    let mut old = srv.v5("hib-same").await;
    assert!(parked(&srv, 1).await);
    let mut new = srv.v5("hib-same").await;
    // [MQTT-3.1.4-3] the existing connection is closed with 0x8E.
    old.expect_disconnect(0x8E).await;
    assert!(parked(&srv, 1).await, "the new connection hibernates");
    let mut other = srv.v5("hib-other").await;
    assert!(parked(&srv, 2).await);
    // An administrative kick (REST `DELETE /api/v5/clients/{id}`) reaches it too: 0x98.
    let mut kicked = srv.v5("hib-kicked").await;
    assert!(parked(&srv, 3).await);
    srv.server().broker().kick_client("hib-kicked");
    kicked.expect_disconnect(0x98).await;
    assert!(parked(&srv, 2).await);
    let start = Instant::now();
    srv.shutdown(Duration::from_secs(5)).await;
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "shutdown waited for the parked connections: {:?}",
        start.elapsed()
    );
    new.expect_disconnect(0x8B).await;
    other.expect_disconnect(0x8B).await;
}

#[tokio::test]
async fn a_client_that_goes_away_while_hibernating_leaves_no_connection_behind() {
    let srv = server().await;
    let c = srv.v5("hib-gone").await;
    assert!(parked(&srv, 1).await);
    drop(c);
    assert!(
        parked(&srv, 0).await,
        "the closed socket resumes and ends the connection"
    );
    let broker = srv.server().broker().clone();
    assert!(
        eventually(2_000, || broker
            .get_session("hib-gone")
            .is_none_or(|s| !s.is_online()))
        .await
    );
    srv.assert_alive().await;
}
