//! MQTT 5.0 section 4.8.2: shared subscriptions.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use lanemq_protocol::reason as rc;
use lanemq_protocol::{Packet, PubResp, QoS};
use std::collections::BTreeSet;
use std::time::Duration;

async fn member(srv: &TestServer, id: &str, filter: &str, expiry: Option<u32>) -> RawClient {
    let mut c = connect_v5(id);
    c.properties.session_expiry_interval = expiry;
    let mut c = RawClient::connect_ok(srv.addr, c).await;
    c.subscribe(filter, QoS::AtLeastOnce).await;
    c
}

/// Receive and acknowledge everything that arrives within `ms`.
async fn drain(c: &mut RawClient, ms: u64) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(p) = c.try_recv(Duration::from_millis(ms)).await {
        match p {
            Packet::Publish(p) => {
                if p.qos == QoS::AtLeastOnce {
                    c.send(Packet::PubAck(PubResp::new(p.packet_id, 0))).await;
                }
                out.push(String::from_utf8(p.payload.to_vec()).unwrap());
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    out
}

#[tokio::test]
async fn mqtt5_4_8_2_shared_subscription_load_balanced() {
    let srv = TestServer::default().await;
    let mut a = member(&srv, "a", "$share/g/sh/#", None).await;
    let mut b = member(&srv, "b", "$share/g/sh/#", None).await;
    let mut other_group = member(&srv, "c", "$share/h/sh/#", None).await;
    let mut plain = member(&srv, "d", "sh/#", None).await;
    let mut publ = srv.v5("pub").await;
    for i in 0..6 {
        publ.publish_qos1(&format!("sh/{i}"), i.to_string().as_bytes())
            .await;
    }
    let got_a = drain(&mut a, QUIET_MS).await;
    let got_b = drain(&mut b, QUIET_MS).await;
    // Each message goes to exactly one member of the group.
    assert_eq!(got_a.len() + got_b.len(), 6, "a={got_a:?} b={got_b:?}");
    let all: BTreeSet<String> = got_a.iter().chain(got_b.iter()).cloned().collect();
    assert_eq!(all.len(), 6, "no duplicates");
    assert!(
        !got_a.is_empty() && !got_b.is_empty(),
        "load balanced: a={got_a:?} b={got_b:?}"
    );
    // Every group and every plain subscription gets its own copy.
    assert_eq!(drain(&mut other_group, QUIET_MS).await.len(), 6);
    assert_eq!(drain(&mut plain, QUIET_MS).await.len(), 6);
}

#[tokio::test]
async fn mqtt5_4_8_2_shared_redelivered_when_member_session_ends() {
    let srv = TestServer::default().await;
    let mut a = member(&srv, "a", "$share/g/rd/t", None).await;
    let mut publ = srv.v5("pub").await;
    publ.publish_qos1("rd/t", b"pending").await;
    let p = a.recv_publish().await; // never acknowledged
    assert_eq!(&p.payload[..], b"pending");
    let mut b = member(&srv, "b", "$share/g/rd/t", None).await;
    // a's session (expiry 0) ends with the QoS 1 message unacknowledged: it goes to b.
    drop(a);
    let got = b.recv_publish_ack().await;
    assert_eq!(&got.payload[..], b"pending");
    b.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt5_4_8_2_shared_queued_redelivered_when_member_session_ends() {
    let srv = TestServer::default().await;
    let mut conn = connect_v5("a");
    conn.properties.receive_maximum = Some(1);
    let mut a = RawClient::connect_ok(srv.addr, conn).await;
    a.subscribe("$share/g/rq/t", QoS::AtLeastOnce).await;
    let mut publ = srv.v5("pub").await;
    publ.publish_qos1("rq/t", b"1").await;
    publ.publish_qos1("rq/t", b"2").await;
    let p = a.recv_publish().await; // "1" inflight, "2" queued behind the window
    assert_eq!(&p.payload[..], b"1");
    let mut b = member(&srv, "b", "$share/g/rq/t", None).await;
    a.disconnect().await;
    let mut got = drain(&mut b, 500).await;
    got.sort();
    assert_eq!(got, vec!["1".to_string(), "2".to_string()]);
}

#[tokio::test]
async fn mqtt5_3_8_3_4_no_local_on_shared_subscription_protocol_error() {
    let srv = TestServer::default().await;
    let mut c = srv.v5("nl").await;
    let mut o = sub_opts(QoS::AtMostOnce);
    o.no_local = true;
    let pid = c.next_pid();
    c.send(Packet::Subscribe(lanemq_protocol::Subscribe {
        packet_id: pid,
        filters: vec![lanemq_protocol::SubscribeFilter {
            filter: "$share/g/nl/t".into(),
            options: o,
        }],
        properties: Default::default(),
    }))
    .await;
    // [MQTT-3.8.3-4]
    c.expect_disconnect(rc::PROTOCOL_ERROR).await;
    srv.assert_alive().await;
}

#[tokio::test]
async fn mqtt5_4_8_2_shared_subscription_gets_no_retained() {
    let srv = TestServer::default().await;
    let mut publ = srv.v5("pub").await;
    let mut p = publish("shr/t", QoS::AtLeastOnce, publ.next_pid(), b"r");
    p.retain = true;
    publ.publish_acked(p).await;
    let mut a = member(&srv, "a", "$share/g/shr/t", None).await;
    a.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn mqtt5_4_8_2_unsubscribe_shared() {
    let srv = TestServer::default().await;
    let mut a = member(&srv, "a", "$share/g/us/t", None).await;
    let mut b = member(&srv, "b", "$share/g/us/t", None).await;
    assert_eq!(a.unsubscribe("$share/g/us/t").await.reason_codes, vec![0]);
    let mut publ = srv.v5("pub").await;
    for _ in 0..3 {
        publ.publish_qos1("us/t", b"x").await;
    }
    assert_eq!(drain(&mut b, QUIET_MS).await.len(), 3);
    a.expect_nothing(50).await;
}
