//! Graceful restarts of the real `lanemq` binary (SIGTERM, start again on the same port and
//! data dir): what issue 3 and docs/durability.md promise survives — retained messages,
//! persistent sessions and their subscriptions, queued and inflight messages, inbound QoS 2
//! packet ids — and what must not (an expired session); plus `lanemq log verify`.
//!
//! ```sh
//! cargo build --release -p lanemq
//! cargo test --release -p lanemq-tests --test it durability_restart::
//! ```
//!
//! The binary: `LANEMQ_BIN`, else the newer of `target/release/lanemq` and
//! `target/debug/lanemq`. `KEEP_TMP=1` keeps each test's data dir and broker log (also kept
//! when a test fails).
#![allow(clippy::unwrap_used)]

use crate::common;

use common::{connect_v311, connect_v5, publish, sub_opts, RawClient, RecvError};
use lanemq_protocol::{Connect, Packet, PubResp, Publish, QoS};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const ALWAYS: &str = "[storage]\nfsync = \"always\"\n";
const INTERVAL: &str = "[storage]\nfsync = \"interval\"\nfsync_interval_ms = 50\n";
const NEVER: &str = "[storage]\nfsync = \"never\"\n";

// The child broker (the real binary); the same module as in tests/kill9.rs.

use crate::child;

use child::Broker;

/// SIGTERM, require a clean exit, start again on the same port and data dir.
async fn graceful_restart(b: &mut Broker) {
    let status = b.terminate().await;
    assert!(
        status.success(),
        "broker exit status after SIGTERM: {status}; log tail:\n{}",
        b.log_tail(30)
    );
    b.restart().await;
}

/// MQTT 5 CONNECT with clean start 0 and a session expiry interval.
fn persistent(id: &str, expiry: u32) -> Connect {
    let mut c = connect_v5(id);
    c.clean_start = false;
    c.properties.session_expiry_interval = Some(expiry);
    c
}

fn retained(topic: &str, qos: QoS, pid: u16, payload: &[u8]) -> Publish {
    let mut p = publish(topic, qos, pid, payload);
    p.retain = true;
    p
}

/// Receive until `quiet_ms` of silence (at most `max` PUBLISH packets), acknowledging every
/// PUBLISH (PUBACK, or PUBREC then PUBCOMP on PUBREL) as a normal client does.
async fn collect(c: &mut RawClient, quiet_ms: u64, max: usize) -> Vec<Publish> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while out.len() < max && Instant::now() < deadline {
        match c.try_recv(Duration::from_millis(quiet_ms)).await {
            Ok(Packet::Publish(p)) => {
                match p.qos {
                    QoS::AtMostOnce => {}
                    QoS::AtLeastOnce => c.send(Packet::PubAck(PubResp::new(p.packet_id, 0))).await,
                    QoS::ExactlyOnce => c.send(Packet::PubRec(PubResp::new(p.packet_id, 0))).await,
                }
                out.push(p);
            }
            Ok(Packet::PubRel(r)) => c.send(Packet::PubComp(PubResp::new(r.packet_id, 0))).await,
            Ok(other) => panic!("unexpected {other:?}"),
            Err(RecvError::Timeout) => break,
            Err(e) => panic!("connection ended while collecting: {e:?}"),
        }
    }
    // Complete QoS 2 flows still open (PUBREL after the last PUBLISH).
    while let Ok(Packet::PubRel(r)) = c.try_recv(Duration::from_millis(100)).await {
        c.send(Packet::PubComp(PubResp::new(r.packet_id, 0))).await;
    }
    out
}

fn payloads(ps: &[Publish], topic: &str) -> Vec<String> {
    ps.iter()
        .filter(|p| p.topic == topic)
        .map(|p| String::from_utf8_lossy(&p.payload).to_string())
        .collect()
}

// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_messages_survive_graceful_restart() {
    let mut b = Broker::start("dr-retained", ALWAYS).await;
    let mut p = RawClient::connect_ok(b.addr, connect_v5("dr-ret-pub")).await;
    let mut m1 = retained("dr/ret/q1", QoS::AtLeastOnce, p.next_pid(), b"keep-q1");
    m1.properties.user_properties = vec![("k".into(), "v".into()), ("k".into(), "w".into())];
    m1.properties.content_type = Some("text/plain".into());
    assert!(p.publish_acked(m1).await < 0x80);
    let m2 = retained("dr/ret/q2", QoS::ExactlyOnce, p.next_pid(), b"keep-q2");
    assert!(p.publish_acked(m2).await < 0x80);
    for payload in [&b"old"[..], b"new"] {
        let m = retained("dr/ret/replaced", QoS::AtLeastOnce, p.next_pid(), payload);
        assert!(p.publish_acked(m).await < 0x80);
    }
    for payload in [&b"gone"[..], b""] {
        let m = retained("dr/ret/cleared", QoS::AtLeastOnce, p.next_pid(), payload);
        assert!(p.publish_acked(m).await < 0x80);
    }
    p.disconnect().await;

    graceful_restart(&mut b).await;

    let mut s = RawClient::connect_ok(b.addr, connect_v5("dr-ret-sub")).await;
    s.subscribe("dr/ret/#", QoS::ExactlyOnce).await;
    let got = collect(&mut s, 700, 10).await;
    let by_topic: BTreeMap<&str, &Publish> = got.iter().map(|p| (p.topic.as_str(), p)).collect();
    assert_eq!(
        by_topic.keys().copied().collect::<Vec<_>>(),
        vec!["dr/ret/q1", "dr/ret/q2", "dr/ret/replaced"],
        "retained topics after restart (a cleared one must stay cleared): {got:?}"
    );
    assert_eq!(got.len(), 3, "one retained message per topic: {got:?}");
    let q1 = by_topic["dr/ret/q1"];
    assert!(
        q1.retain,
        "RETAIN=1 on a retained message for a new subscription"
    );
    assert_eq!(&q1.payload[..], b"keep-q1");
    assert_eq!(q1.qos, QoS::AtLeastOnce);
    assert_eq!(
        q1.properties.user_properties,
        vec![("k".into(), "v".into()), ("k".into(), "w".into())],
        "user properties of a retained message survive the restart"
    );
    assert_eq!(q1.properties.content_type.as_deref(), Some("text/plain"));
    let q2 = by_topic["dr/ret/q2"];
    assert!(q2.retain);
    assert_eq!(&q2.payload[..], b"keep-q2");
    assert_eq!(q2.qos, QoS::ExactlyOnce);
    assert_eq!(&by_topic["dr/ret/replaced"].payload[..], b"new");
    s.disconnect().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_qos0_survives_graceful_restart() {
    let mut b = Broker::start("dr-retained0", ALWAYS).await;
    let mut p = RawClient::connect_ok(b.addr, connect_v5("dr-ret0-pub")).await;
    p.send(Packet::Publish(retained(
        "dr/ret0/t",
        QoS::AtMostOnce,
        0,
        b"keep-q0",
    )))
    .await;
    // Same connection, in order: once this PUBACK arrives the QoS 0 publish was accepted.
    assert!(p.publish_qos1("dr/ret0/barrier", b"x").await < 0x80);
    p.disconnect().await;

    graceful_restart(&mut b).await;

    let mut s = RawClient::connect_ok(b.addr, connect_v5("dr-ret0-sub")).await;
    s.subscribe("dr/ret0/t", QoS::AtLeastOnce).await;
    let got = collect(&mut s, 700, 5).await;
    assert_eq!(
        payloads(&got, "dr/ret0/t"),
        vec!["keep-q0"],
        "an accepted retained QoS 0 message survives a graceful restart"
    );
    assert!(got[0].retain);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_session_subscriptions_survive_restart_v5() {
    let mut b = Broker::start("dr-subs", ALWAYS).await;
    // "a" subscribes, then goes offline; "c" stays connected through the shutdown.
    let (mut a, ack) = RawClient::connect_ack(b.addr, persistent("dr-subs-a", 3600)).await;
    assert!(!ack.session_present);
    let suback = a
        .subscribe_with(
            &[
                ("dr/subs/a/+", sub_opts(QoS::AtLeastOnce)),
                ("dr/subs/q2/#", sub_opts(QoS::ExactlyOnce)),
            ],
            Some(5),
        )
        .await;
    assert_eq!(suback.reason_codes, vec![1, 2]);
    a.disconnect().await;
    let mut c = RawClient::connect_ok(b.addr, persistent("dr-subs-c", 3600)).await;
    c.subscribe("dr/subs/c", QoS::AtLeastOnce).await;

    graceful_restart(&mut b).await;
    // "c" was told to go (DISCONNECT 0x8B) or just closed; either way it is gone.
    let _ = c.try_recv(Duration::from_millis(500)).await;
    drop(c);

    let (mut a, ack) = RawClient::connect_ack(b.addr, persistent("dr-subs-a", 3600)).await;
    assert!(
        ack.session_present,
        "session of dr-subs-a (expiry 3600, offline) present after restart"
    );
    let (mut c, ack) = RawClient::connect_ack(b.addr, persistent("dr-subs-c", 3600)).await;
    assert!(
        ack.session_present,
        "session of dr-subs-c (expiry 3600, connected at shutdown) present after restart"
    );
    // No SUBSCRIBE after the restart.
    let mut p = RawClient::connect_ok(b.addr, connect_v5("dr-subs-pub")).await;
    assert!(p.publish_qos1("dr/subs/a/x", b"to-a").await < 0x80);
    let pid = p.next_pid();
    assert!(
        p.publish_acked(publish("dr/subs/q2/y/z", QoS::ExactlyOnce, pid, b"to-a-q2"))
            .await
            < 0x80
    );
    assert!(p.publish_qos1("dr/subs/c", b"to-c").await < 0x80);
    let got_a = collect(&mut a, 700, 10).await;
    assert_eq!(payloads(&got_a, "dr/subs/a/x"), vec!["to-a"], "{got_a:?}");
    assert_eq!(
        payloads(&got_a, "dr/subs/q2/y/z"),
        vec!["to-a-q2"],
        "{got_a:?}"
    );
    assert_eq!(got_a.len(), 2, "{got_a:?}");
    for m in &got_a {
        let want = if m.topic == "dr/subs/a/x" {
            QoS::AtLeastOnce
        } else {
            QoS::ExactlyOnce
        };
        assert_eq!(m.qos, want, "granted QoS kept for {}", m.topic);
        assert_eq!(
            m.properties.subscription_identifiers,
            vec![5],
            "subscription identifier kept for {}",
            m.topic
        );
    }
    let got_c = collect(&mut c, 700, 10).await;
    assert_eq!(payloads(&got_c, "dr/subs/c"), vec!["to-c"], "{got_c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_session_subscriptions_survive_restart_v311() {
    let mut b = Broker::start("dr-subs311", ALWAYS).await;
    let mut c = connect_v311("dr-s311");
    c.clean_start = false;
    let mut s = RawClient::connect_ok(b.addr, c.clone()).await;
    s.subscribe("dr/s311/t", QoS::AtLeastOnce).await;
    s.disconnect().await;
    let mut p = RawClient::connect_ok(b.addr, connect_v311("dr-s311-pub")).await;
    assert!(p.publish_qos1("dr/s311/t", b"before").await < 0x80);
    p.disconnect().await;

    graceful_restart(&mut b).await;

    let (mut s, ack) = RawClient::connect_ack(b.addr, c).await;
    assert!(
        ack.session_present,
        "3.1.1 clean session 0: session present after restart"
    );
    let mut p = RawClient::connect_ok(b.addr, connect_v311("dr-s311-pub")).await;
    assert!(p.publish_qos1("dr/s311/t", b"after").await < 0x80);
    let got = collect(&mut s, 700, 10).await;
    assert_eq!(
        payloads(&got, "dr/s311/t"),
        vec!["before", "after"],
        "queued (before) and new (after, through the stored subscription) messages"
    );
}

/// Messages queued for an offline persistent session survive and arrive after reconnect, in
/// order per topic, once each. A graceful shutdown writes everything under every policy.
async fn offline_queue_survives(tag: &str, storage: &str) {
    let mut b = Broker::start(tag, storage).await;
    let mut s = RawClient::connect_ok(b.addr, persistent("dr-q-sub", 3600)).await;
    let ack = s
        .subscribe_with(
            &[
                ("dr/q/q1", sub_opts(QoS::ExactlyOnce)),
                ("dr/q/q2", sub_opts(QoS::ExactlyOnce)),
            ],
            None,
        )
        .await;
    assert_eq!(ack.reason_codes, vec![2, 2]);
    s.disconnect().await;
    let mut p = RawClient::connect_ok(b.addr, connect_v5("dr-q-pub")).await;
    let mut want1 = Vec::new();
    let mut want2 = Vec::new();
    for i in 0..20 {
        let m = format!("q1-{i:02}");
        assert!(p.publish_qos1("dr/q/q1", m.as_bytes()).await < 0x80);
        want1.push(m);
        if i % 2 == 0 {
            let m = format!("q2-{i:02}");
            let pid = p.next_pid();
            let code = p
                .publish_acked(publish("dr/q/q2", QoS::ExactlyOnce, pid, m.as_bytes()))
                .await;
            assert!(code < 0x80);
            want2.push(m);
        }
    }
    p.disconnect().await;

    graceful_restart(&mut b).await;

    let (mut s, ack) = RawClient::connect_ack(b.addr, persistent("dr-q-sub", 3600)).await;
    assert!(ack.session_present, "[{tag}] session present after restart");
    let got = collect(&mut s, 1_000, 100).await;
    assert_eq!(
        payloads(&got, "dr/q/q1"),
        want1,
        "[{tag}] QoS 1 queue after restart"
    );
    assert_eq!(
        payloads(&got, "dr/q/q2"),
        want2,
        "[{tag}] QoS 2 queue after restart"
    );
    for m in &got {
        let want = if m.topic == "dr/q/q1" {
            QoS::AtLeastOnce
        } else {
            QoS::ExactlyOnce
        };
        assert_eq!(m.qos, want, "[{tag}] QoS of {m:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_queue_survives_restart_in_order_fsync_always() {
    offline_queue_survives("dr-queue-always", ALWAYS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_queue_survives_restart_in_order_fsync_interval() {
    offline_queue_survives("dr-queue-interval", INTERVAL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_queue_survives_restart_in_order_fsync_never() {
    offline_queue_survives("dr-queue-never", NEVER).await;
}

/// MQTT 5 4.4 [MQTT-4.4.0-1]: on resuming a session the server resends unacknowledged
/// PUBLISH packets (DUP=1, original packet ids) and PUBREL packets — across a restart too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inflight_messages_survive_restart() {
    let mut b = Broker::start("dr-inflight", ALWAYS).await;
    let mut s = RawClient::connect_ok(b.addr, persistent("dr-infl-sub", 3600)).await;
    s.subscribe("dr/infl/#", QoS::ExactlyOnce).await;
    let mut p = RawClient::connect_ok(b.addr, connect_v5("dr-infl-pub")).await;
    for m in ["a1", "a2", "a3"] {
        assert!(p.publish_qos1("dr/infl/a", m.as_bytes()).await < 0x80);
    }
    let pid = p.next_pid();
    assert!(
        p.publish_acked(publish("dr/infl/b", QoS::ExactlyOnce, pid, b"b1"))
            .await
            < 0x80
    );
    p.disconnect().await;
    // Receive all four; acknowledge none of the QoS 1; QoS 2 only up to PUBREC.
    let mut q1_pids = Vec::new();
    let mut q2_pid = None;
    for _ in 0..4 {
        let m = s.recv_publish().await;
        match m.qos {
            QoS::AtLeastOnce => q1_pids.push((m.packet_id, m.payload.clone())),
            QoS::ExactlyOnce => q2_pid = Some(m.packet_id),
            QoS::AtMostOnce => panic!("QoS 0 delivery {m:?}"),
        }
    }
    let q2_pid = q2_pid.expect("the QoS 2 message");
    assert_eq!(q1_pids.len(), 3);
    s.send(Packet::PubRec(PubResp::new(q2_pid, 0))).await;
    match s.recv().await {
        Packet::PubRel(r) => assert_eq!(r.packet_id, q2_pid),
        other => panic!("expected PUBREL, got {other:?}"),
    }
    // No PUBCOMP. Leave the session.
    s.disconnect().await;

    graceful_restart(&mut b).await;

    let (mut s, ack) = RawClient::connect_ack(b.addr, persistent("dr-infl-sub", 3600)).await;
    assert!(ack.session_present);
    let mut redelivered = Vec::new();
    let mut pubrels = Vec::new();
    while let Ok(pk) = s.try_recv(Duration::from_millis(1_000)).await {
        match pk {
            Packet::Publish(m) => redelivered.push(m),
            Packet::PubRel(r) => pubrels.push(r.packet_id),
            other => panic!("unexpected {other:?}"),
        }
        if redelivered.len() + pubrels.len() > 10 {
            break;
        }
    }
    let got: Vec<(u16, bytes::Bytes)> = redelivered
        .iter()
        .filter(|m| m.qos == QoS::AtLeastOnce)
        .map(|m| (m.packet_id, m.payload.clone()))
        .collect();
    assert_eq!(
        got, q1_pids,
        "[MQTT-4.4.0-1] unacknowledged QoS 1 PUBLISH resent after restart, original packet ids, in order"
    );
    for m in &redelivered {
        assert!(
            m.dup,
            "[MQTT-3.3.1-1] DUP=1 on a redelivered PUBLISH: {m:?}"
        );
    }
    assert_eq!(
        pubrels,
        vec![q2_pid],
        "[MQTT-4.4.0-1] PUBREL resent for the QoS 2 message whose PUBREC the broker had"
    );
    assert!(
        !redelivered.iter().any(|m| m.qos == QoS::ExactlyOnce),
        "the QoS 2 message already PUBREC'd must not be sent as a PUBLISH again: {redelivered:?}"
    );
    for (pid, _) in &q1_pids {
        s.send(Packet::PubAck(PubResp::new(*pid, 0))).await;
    }
    s.send(Packet::PubComp(PubResp::new(q2_pid, 0))).await;
    s.expect_nothing(500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_messages_not_redelivered_after_restart() {
    let mut b = Broker::start("dr-acked", ALWAYS).await;
    let mut s = RawClient::connect_ok(b.addr, persistent("dr-ack-sub", 3600)).await;
    s.subscribe("dr/ack/#", QoS::ExactlyOnce).await;
    let mut p = RawClient::connect_ok(b.addr, connect_v5("dr-ack-pub")).await;
    for i in 0..5 {
        assert!(
            p.publish_qos1("dr/ack/q1", format!("m{i}").as_bytes())
                .await
                < 0x80
        );
        let pid = p.next_pid();
        let m = publish(
            "dr/ack/q2",
            QoS::ExactlyOnce,
            pid,
            format!("n{i}").as_bytes(),
        );
        assert!(p.publish_acked(m).await < 0x80);
    }
    let got = collect(&mut s, 500, 20).await;
    assert_eq!(got.len(), 10, "{got:?}");
    s.disconnect().await;

    graceful_restart(&mut b).await;

    let (mut s, ack) = RawClient::connect_ack(b.addr, persistent("dr-ack-sub", 3600)).await;
    assert!(ack.session_present);
    match s.try_recv(Duration::from_millis(1_000)).await {
        Err(RecvError::Timeout) => {}
        other => panic!(
            "messages acknowledged before the restart must not be delivered again: {other:?}"
        ),
    }
    let mut p = RawClient::connect_ok(b.addr, connect_v5("dr-ack-pub")).await;
    assert!(p.publish_qos1("dr/ack/q1", b"new").await < 0x80);
    let got = collect(&mut s, 500, 5).await;
    assert_eq!(payloads(&got, "dr/ack/q1"), vec!["new"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expiry_2s_gone_after_restart() {
    let mut b = Broker::start("dr-expiry", ALWAYS).await;
    let mut s2 = RawClient::connect_ok(b.addr, persistent("dr-exp-2", 2)).await;
    s2.subscribe("dr/exp/t", QoS::AtLeastOnce).await;
    s2.disconnect().await;
    let mut s0 = RawClient::connect_ok(b.addr, connect_v5("dr-exp-0")).await;
    s0.subscribe("dr/exp/t", QoS::AtLeastOnce).await;
    s0.disconnect().await;
    let mut keep = RawClient::connect_ok(b.addr, persistent("dr-exp-keep", 3600)).await;
    keep.subscribe("dr/exp/t", QoS::AtLeastOnce).await;
    keep.disconnect().await;
    let mut p = RawClient::connect_ok(b.addr, connect_v5("dr-exp-pub")).await;
    assert!(p.publish_qos1("dr/exp/t", b"queued").await < 0x80);
    p.disconnect().await;

    graceful_restart(&mut b).await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let (mut s2, ack) = RawClient::connect_ack(b.addr, persistent("dr-exp-2", 2)).await;
    assert!(
        !ack.session_present,
        "a session with expiry 2 s must be gone 3 s after the restart"
    );
    s2.expect_nothing(300).await;
    let (s0, ack) = RawClient::connect_ack(b.addr, persistent("dr-exp-0", 60)).await;
    assert!(
        !ack.session_present,
        "a session with expiry 0 must not come back after a restart"
    );
    s0.disconnect().await;
    let mut p = RawClient::connect_ok(b.addr, connect_v5("dr-exp-pub")).await;
    assert!(p.publish_qos1("dr/exp/t", b"after").await < 0x80);
    s2.expect_nothing(500).await;
    let (mut keep, ack) = RawClient::connect_ack(b.addr, persistent("dr-exp-keep", 3600)).await;
    assert!(
        ack.session_present,
        "the expiry-3600 session is still there"
    );
    let got = collect(&mut keep, 700, 10).await;
    assert_eq!(payloads(&got, "dr/exp/t"), vec!["queued", "after"]);
}

/// Inbound QoS 2 state (MQTT 5 4.3.3, method B at the receiver) survives a restart: a
/// resent PUBLISH with the same packet id before PUBREL is acknowledged, not delivered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbound_qos2_dedup_survives_restart() {
    let mut b = Broker::start("dr-qos2-in", ALWAYS).await;
    let mut s = RawClient::connect_ok(b.addr, persistent("dr-q2-sub", 3600)).await;
    s.subscribe("dr/q2d/t", QoS::ExactlyOnce).await;
    let (mut p, ack) = RawClient::connect_ack(b.addr, persistent("dr-q2-pub", 3600)).await;
    assert!(!ack.session_present);
    p.send(Packet::Publish(publish(
        "dr/q2d/t",
        QoS::ExactlyOnce,
        7,
        b"once",
    )))
    .await;
    match p.recv().await {
        Packet::PubRec(r) => {
            assert_eq!(r.packet_id, 7);
            assert!(r.reason_code < 0x80, "PUBREC {r:?}");
        }
        other => panic!("expected PUBREC 7, got {other:?}"),
    }
    let m = s.recv_publish_ack().await;
    assert_eq!(&m.payload[..], b"once");
    s.disconnect().await;
    p.disconnect().await;

    graceful_restart(&mut b).await;

    let (mut s, ack) = RawClient::connect_ack(b.addr, persistent("dr-q2-sub", 3600)).await;
    assert!(ack.session_present);
    let (mut p, ack) = RawClient::connect_ack(b.addr, persistent("dr-q2-pub", 3600)).await;
    assert!(
        ack.session_present,
        "the publisher's session (holding packet id 7) after restart"
    );
    let mut again = publish("dr/q2d/t", QoS::ExactlyOnce, 7, b"once");
    again.dup = true;
    p.send(Packet::Publish(again)).await;
    match p.recv().await {
        Packet::PubRec(r) => {
            assert_eq!(r.packet_id, 7);
            assert!(r.reason_code < 0x80, "PUBREC for the resent PUBLISH: {r:?}");
        }
        other => panic!("expected PUBREC 7 for the resent PUBLISH, got {other:?}"),
    }
    match s.try_recv(Duration::from_millis(700)).await {
        Err(RecvError::Timeout) => {}
        other => panic!(
            "the resent QoS 2 PUBLISH (pid 7, before PUBREL) was delivered again after the \
             restart: {other:?}"
        ),
    }
    p.send(Packet::PubRel(PubResp::new(7, 0))).await;
    match p.recv().await {
        Packet::PubComp(c) => {
            assert_eq!(c.packet_id, 7);
            assert_eq!(
                c.reason_code, 0,
                "PUBCOMP 0x00 (0x92 would mean the packet id was forgotten)"
            );
        }
        other => panic!("expected PUBCOMP 7, got {other:?}"),
    }
    s.expect_nothing(300).await;
    // Packet id 7 is free again: a new message with it is delivered once.
    assert!(
        p.publish_acked(publish("dr/q2d/t", QoS::ExactlyOnce, 7, b"second"))
            .await
            < 0x80
    );
    let got = collect(&mut s, 500, 5).await;
    assert_eq!(payloads(&got, "dr/q2d/t"), vec!["second"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_verify_after_run() {
    let mut b = Broker::start("dr-verify", ALWAYS).await;
    let mut p = RawClient::connect_ok(b.addr, connect_v5("dr-verify-pub")).await;
    for i in 0..10 {
        assert!(
            p.publish_qos1("dr/verify/t", format!("m{i}").as_bytes())
                .await
                < 0x80
        );
    }
    let m = retained("dr/verify/r", QoS::AtLeastOnce, p.next_pid(), b"r");
    assert!(p.publish_acked(m).await < 0x80);
    p.disconnect().await;
    let status = b.terminate().await;
    assert!(status.success(), "exit after SIGTERM: {status}");

    let mut child = std::process::Command::new(&b.bin)
        .args(["log", "verify", "--data-dir"])
        .arg(&b.data_dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run lanemq log verify");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("lanemq log verify did not finish within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "lanemq log verify --data-dir {} exited with {}:\n{text}",
        b.data_dir.display(),
        out.status
    );
    let line = text
        .lines()
        .find(|l| l.to_lowercase().contains("record"))
        .unwrap_or_else(|| panic!("lanemq log verify does not mention records:\n{text}"));
    let counts: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(
        counts.iter().any(|&n| n >= 11),
        "lanemq log verify should count at least the 11 accepted publishes: {line:?}"
    );
    println!("log verify: {}", text.trim());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt5_3_1_3_2_2_delayed_will_cancelled_by_reconnect_after_a_restart() {
    use lanemq_protocol::{Will, WillProperties};
    let mut b = Broker::start("dr-willdelay", ALWAYS).await;
    // A watcher with a persistent session, so a will published while it is away is kept.
    let mut w = RawClient::connect_ok(b.addr, persistent("dr-wd-watch", 3600)).await;
    w.subscribe("dr/wd/#", QoS::AtLeastOnce).await;
    w.disconnect().await;
    // The client goes away without DISCONNECT: its will is due in 4 s.
    let mut c = persistent("dr-wd", 3600);
    c.will = Some(Will {
        topic: "dr/wd/will".into(),
        payload: bytes::Bytes::from_static(b"must-not-come"),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: WillProperties {
            will_delay_interval: Some(4),
            ..Default::default()
        },
    });
    let c = RawClient::connect_ok(b.addr, c).await;
    drop(c);
    tokio::time::sleep(Duration::from_millis(200)).await;
    graceful_restart(&mut b).await;
    // Back within the delay, after the restart [MQTT-3.1.3-9]: the will is never published.
    let (c, ack) = RawClient::connect_ack(b.addr, persistent("dr-wd", 3600)).await;
    assert!(ack.session_present);
    tokio::time::sleep(Duration::from_millis(5_000)).await;
    let (mut w, ack) = RawClient::connect_ack(b.addr, persistent("dr-wd-watch", 3600)).await;
    assert!(ack.session_present);
    let got = collect(&mut w, 500, 10).await;
    assert!(
        got.is_empty(),
        "the delayed will was published although the client came back: {got:?}"
    );
    c.disconnect().await;
}
