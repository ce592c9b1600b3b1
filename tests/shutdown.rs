//! Graceful shutdown (DISCONNECT 0x8B, MQTT 5.0 section 3.14.2.1) and `$SYS` statistics.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use lanemq_protocol::reason as rc;
use lanemq_protocol::{Packet, ProtocolVersion, QoS};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

#[tokio::test]
async fn mqtt5_3_14_2_1_shutdown_sends_server_shutting_down() {
    let mut srv = TestServer::default().await;
    let addr = srv.addr;
    let mut v5a = srv.v5("a").await;
    let mut v5b = srv.v5("b").await;
    v5b.subscribe("sd/t", QoS::AtLeastOnce).await;
    let mut v3 = srv.v311("c").await;
    let start = Instant::now();
    let server = srv.server.take().unwrap();
    let stop = tokio::spawn(async move { server.shutdown(Duration::from_secs(2)).await });
    v5a.expect_disconnect(rc::SERVER_SHUTTING_DOWN).await;
    v5b.expect_disconnect(rc::SERVER_SHUTTING_DOWN).await;
    // MQTT 3.1.1 has no server DISCONNECT: just the close.
    v3.expect_closed().await;
    stop.await.unwrap();
    assert!(
        start.elapsed() < Duration::from_millis(1_500),
        "shutdown waits for the connections, not for the whole grace period"
    );
    // No new connections afterwards.
    match tokio::net::TcpStream::connect(addr).await {
        Err(_) => {}
        Ok(s) => {
            let mut c = RawClient::tcp(addr, ProtocolVersion::V5).await;
            drop(s);
            c.send(Packet::Connect(Box::new(connect_v5("late")))).await;
            match c.try_recv(Duration::from_millis(RECV_MS)).await {
                Err(RecvError::Closed) => {}
                Ok(Packet::ConnAck(a)) => assert!(a.reason_code >= 0x80, "{a:?}"),
                other => panic!("expected refusal, got {other:?}"),
            }
        }
    }
}

#[tokio::test]
async fn mqtt5_3_14_2_1_shutdown_with_no_clients_is_prompt() {
    let mut srv = TestServer::default().await;
    let start = Instant::now();
    srv.shutdown(Duration::from_secs(5)).await;
    assert!(start.elapsed() < Duration::from_millis(500));
}

#[tokio::test]
async fn sys_broker_topics_published() {
    let mut cfg = config();
    cfg.server.sys_interval_s = 1;
    let srv = TestServer::start(cfg).await;
    let mut c = srv.v5("sys").await;
    c.subscribe("$SYS/broker/#", QoS::AtMostOnce).await;
    let mut topics = BTreeSet::new();
    // The first publication (live, or the retained snapshot if it came first).
    while let Ok(Packet::Publish(p)) = c.try_recv(Duration::from_millis(1_300)).await {
        topics.insert(p.topic);
        if topics.len() >= 10 {
            break;
        }
    }
    for t in [
        "$SYS/broker/uptime",
        "$SYS/broker/version",
        "$SYS/broker/clients/connected",
        "$SYS/broker/messages/received",
        "$SYS/broker/messages/sent",
    ] {
        assert!(topics.contains(t), "{t} missing from {topics:?}");
    }
    // The values are retained: a later subscriber gets them at once, RETAIN=1.
    let mut late = srv.v5("sys-late").await;
    late.subscribe("$SYS/broker/uptime", QoS::AtMostOnce).await;
    let p = late.recv_publish().await;
    assert!(p.retain, "$SYS values are retained");
    let text = String::from_utf8(p.payload.to_vec()).unwrap();
    assert!(text.ends_with(" seconds"), "uptime payload {text:?}");
    // ... and updates follow every interval.
    let mut updated = false;
    let deadline = Instant::now() + Duration::from_millis(1_800);
    while Instant::now() < deadline {
        if let Ok(Packet::Publish(p)) = c.try_recv(Duration::from_millis(200)).await {
            if p.topic == "$SYS/broker/uptime" {
                updated = true;
                break;
            }
        }
    }
    assert!(updated, "periodic $SYS/broker/uptime update");
}

#[tokio::test]
async fn sys_disabled_with_interval_zero() {
    let srv = TestServer::default().await;
    let mut c = srv.v5("nosys").await;
    c.subscribe("$SYS/#", QoS::AtMostOnce).await;
    c.expect_nothing(QUIET_MS).await;
}
