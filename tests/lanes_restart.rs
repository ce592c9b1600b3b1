//! Lanes across restarts of the real `lanemq` binary (docs/lanes.md): group offsets and lanes
//! survive a graceful restart and a kill -9; nothing acknowledged to a publisher is lost and
//! nothing committed by a consumer is delivered again.
//!
//! ```sh
//! cargo build --release -p lanemq
//! cargo test -p lanemq-tests --test it lanes_restart::
//! ```
//!
//! The binary: `LANEMQ_BIN`, else the newest of target/{release,debug}/lanemq and
//! `$CARGO_TARGET_DIR`/{release,debug}/lanemq. `KEEP_TMP=1` keeps data dirs and broker logs.
#![allow(clippy::unwrap_used)]

use crate::common;

use crate::child;

use child::Broker;
use common::{connect_v5, sub_opts, user_prop, RawClient, RecvError};
use lanemq_protocol::{
    Connect, Packet, PubResp, Publish, QoS, Subscribe, SubscribeFilter, SubscribeProperties,
};
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

const LITE: &str = "[lite]\nflush_interval_ms = 20\n\n[[lite.parents]]\nname = \"agents\"\n\
                    pattern = \"agents/{lane}/#\"\n\n";
const FSYNC_ALWAYS: &str = "[storage]\nfsync = \"always\"\n\n";

fn persistent(id: &str, clean_start: bool) -> Connect {
    let mut c = connect_v5(id);
    c.clean_start = clean_start;
    c.properties.session_expiry_interval = Some(3600);
    c
}

fn offset_of(p: &Publish) -> u64 {
    user_prop(p, "lane-offset").unwrap().parse().unwrap()
}

fn lane_of(p: &Publish) -> String {
    user_prop(p, "lane").unwrap().to_string()
}

async fn join(c: &mut RawClient, filter: &str) {
    let pid = c.next_pid();
    c.send(Packet::Subscribe(Subscribe {
        packet_id: pid,
        filters: vec![SubscribeFilter {
            filter: filter.into(),
            options: sub_opts(QoS::AtLeastOnce),
        }],
        properties: SubscribeProperties::default(),
    }))
    .await;
    match c.recv().await {
        Packet::SubAck(a) => assert_eq!(a.reason_codes, vec![1]),
        other => panic!("expected SUBACK, got {other:?}"),
    }
}

/// Everything that arrives until `quiet_ms` pass without a packet; acknowledged when `ack`.
async fn drain(c: &mut RawClient, quiet_ms: u64, ack: bool) -> Vec<Publish> {
    let mut out = Vec::new();
    loop {
        match c.try_recv(Duration::from_millis(quiet_ms)).await {
            Ok(Packet::Publish(p)) => {
                if ack {
                    c.send(Packet::PubAck(PubResp::new(p.packet_id, 0))).await;
                }
                out.push(p);
            }
            Ok(_) => {}
            Err(RecvError::Timeout) | Err(RecvError::Closed) => return out,
            Err(e) => panic!("{e:?}"),
        }
    }
}

async fn publish_lanes(b: &Broker, lanes: usize, per_lane: usize, tag: &str) -> usize {
    let mut p = RawClient::connect_ok(b.addr, connect_v5(&format!("pub-{tag}"))).await;
    let mut acked = 0;
    for i in 0..per_lane {
        for l in 0..lanes {
            let code = p
                .publish_qos1(&format!("agents/l{l}/x"), format!("{tag}{i}").as_bytes())
                .await;
            assert!(code < 0x80, "PUBACK 0x{code:02X}");
            acked += 1;
        }
    }
    p.disconnect().await;
    acked
}

#[tokio::test]
async fn group_offsets_and_lanes_survive_a_graceful_restart() {
    let mut b = Broker::start("lanes-restart", LITE).await;
    publish_lanes(&b, 1, 5, "m").await;
    let mut w = RawClient::connect_ok(b.addr, persistent("w", true)).await;
    join(&mut w, "$share/g/agents/+/#").await;
    for want in 0..5 {
        let m = w.recv_publish().await;
        assert_eq!(offset_of(&m), want);
        if want < 2 {
            w.send(Packet::PubAck(PubResp::new(m.packet_id, 0))).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(w);
    let status = b.terminate().await;
    assert!(status.success(), "{status:?}");
    b.restart().await;
    let mut w = RawClient::connect_ok(b.addr, persistent("w", false)).await;
    let got = drain(&mut w, 1_000, true).await;
    let offsets: Vec<u64> = got.iter().map(offset_of).collect();
    assert_eq!(
        offsets,
        vec![2, 3, 4],
        "committed 0 and 1 must not come again"
    );
    // The lane continues its offsets after the restart.
    publish_lanes(&b, 1, 1, "n").await;
    let m = w.recv_publish().await;
    assert_eq!(offset_of(&m), 5);
}

#[tokio::test]
async fn kill9_keeps_lanes_and_commits_and_loses_nothing_acknowledged() {
    const LANES: usize = 10;
    let mut b = Broker::start("lanes-kill9", &format!("{FSYNC_ALWAYS}{LITE}")).await;
    let mut acked_pub = publish_lanes(&b, LANES, 10, "a").await;
    // Joining after the publishes: each lane's 10 messages come as one batch.
    let mut w = RawClient::connect_ok(b.addr, persistent("w", true)).await;
    join(&mut w, "$share/g/agents/+/#").await;
    // The consumer acknowledges the first 60 deliveries, then holds the rest unanswered.
    let mut got = Vec::new();
    while got.len() < 100 {
        match w.try_recv(Duration::from_secs(5)).await {
            Ok(Packet::Publish(p)) => got.push(p),
            other => panic!("expected 100 deliveries, got {} then {other:?}", got.len()),
        }
    }
    let mut committed: HashSet<(String, u64)> = HashSet::new();
    for p in &got[..60] {
        w.send(Packet::PubAck(PubResp::new(p.packet_id, 0))).await;
        committed.insert((lane_of(p), offset_of(p)));
    }
    // Commits are made durable within flush_interval_ms (20 ms).
    tokio::time::sleep(Duration::from_millis(400)).await;
    acked_pub += publish_lanes(&b, LANES, 5, "b").await;
    b.kill9();
    drop(w);
    b.restart().await;
    let mut w = RawClient::connect_ok(b.addr, persistent("w", false)).await;
    let after = drain(&mut w, 1_500, true).await;
    let mut per_lane: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for p in &after {
        let key = (lane_of(p), offset_of(p));
        assert!(
            !committed.contains(&key),
            "committed message {key:?} delivered again after kill -9"
        );
        per_lane.entry(key.0).or_default().push(key.1);
    }
    // Every message acknowledged to the publisher and not committed arrives, in lane order.
    assert_eq!(acked_pub, 150);
    for l in 0..LANES {
        let lane = format!("l{l}");
        let done = committed.iter().filter(|(k, _)| *k == lane).count() as u64;
        let want: Vec<u64> = (done..15).collect();
        assert_eq!(
            per_lane.get(&lane).cloned().unwrap_or_default(),
            want,
            "lane {lane}"
        );
    }
    // Lanes survived: offsets continue.
    publish_lanes(&b, 1, 1, "c").await;
    let m = w.recv_publish().await;
    assert_eq!((lane_of(&m), offset_of(&m)), ("l0".into(), 15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lane_deliveries_in_flight_come_again_with_dup_and_pauses_and_attempts_survive_a_restart() {
    let cfg = format!(
        "{FSYNC_ALWAYS}[lite]\nflush_interval_ms = 20\n\n[[lite.parents]]\nname = \"agents\"\n\
         pattern = \"agents/{{lane}}/#\"\nmax_attempts = 2\n\n"
    );
    let mut b = Broker::start("lanes-dup-restart", &cfg).await;
    let mut m = RawClient::connect_ok(b.addr, persistent("dup-m", true)).await;
    join(&mut m, "$share/g/agents/+/#").await;
    let mut p = RawClient::connect_ok(b.addr, connect_v5("dup-p")).await;
    for i in 0..3 {
        p.publish_qos1("agents/a/x", format!("a{i}").as_bytes())
            .await;
    }
    p.publish_qos1("agents/b/x", b"b0").await;
    let first = drain(&mut m, 300, false).await;
    let a_first: Vec<&Publish> = first.iter().filter(|d| lane_of(d) == "a").collect();
    assert!(!a_first.is_empty(), "{first:?}");
    assert!(
        a_first.iter().all(|d| !d.dup),
        "first deliveries carry DUP=0"
    );
    // Lane b: the member asks to retry in 2 s (one attempt; max_attempts is 2).
    let bd = first.iter().find(|d| lane_of(d) == "b").unwrap();
    let mut ack = PubResp::new(bd.packet_id, 0);
    ack.properties
        .user_properties
        .push(("lane-retry-ms".into(), "2000".into()));
    m.send(Packet::PubAck(ack)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(m);
    let status = b.terminate().await;
    assert!(status.success(), "{}", b.log_tail(20));
    b.restart().await;

    // Lane a: what was delivered and not acknowledged comes again with DUP=1 [MQTT-4.4.0-1].
    let (mut m, ack) = RawClient::connect_ack(b.addr, persistent("dup-m", false)).await;
    assert!(ack.session_present);
    let again = drain(&mut m, 500, true).await;
    let a_again: Vec<&Publish> = again.iter().filter(|d| lane_of(d) == "a").collect();
    let offs = |v: &[&Publish]| v.iter().map(|d| offset_of(d)).collect::<Vec<_>>();
    assert_eq!(
        offs(&a_again)[..a_first.len()],
        offs(&a_first)[..],
        "{again:?}"
    );
    for d in &a_again[..a_first.len()] {
        assert!(d.dup, "redelivered after the restart without DUP=1: {d:?}");
    }
    // Lane b stays paused until its 2 s are over, then comes again.
    assert!(
        again.iter().all(|d| lane_of(d) != "b"),
        "lane b was delivered during its pause: {again:?}"
    );
    let mut later = Vec::new();
    for _ in 0..40 {
        later.extend(drain(&mut m, 100, false).await);
        if !later.is_empty() {
            break;
        }
    }
    let b_again = later
        .iter()
        .find(|d| lane_of(d) == "b")
        .expect("lane b after its pause");
    // A second retry is the second attempt: with max_attempts 2 it is dead-lettered, so the
    // attempt before the restart was kept.
    let mut w = RawClient::connect_ok(b.addr, connect_v5("dup-dlq")).await;
    w.subscribe("$dlq/#", QoS::AtLeastOnce).await;
    let mut ack = PubResp::new(b_again.packet_id, 0);
    ack.properties
        .user_properties
        .push(("lane-retry-ms".into(), "2000".into()));
    m.send(Packet::PubAck(ack)).await;
    let dead = w.recv_publish_ack().await;
    assert_eq!(dead.topic, "$dlq/g/agents/b/x");
    assert_eq!(user_prop(&dead, "attempts"), Some("2"), "{dead:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lane_deliveries_in_flight_come_again_with_dup_after_kill_9() {
    let mut b = Broker::start("lanes-dup-kill9", &format!("{FSYNC_ALWAYS}{LITE}")).await;
    let mut m = RawClient::connect_ok(b.addr, persistent("dup9-m", true)).await;
    join(&mut m, "$share/g9/agents/+/#").await;
    let mut p = RawClient::connect_ok(b.addr, connect_v5("dup9-p")).await;
    for i in 0..3 {
        p.publish_qos1("agents/k/x", format!("k{i}").as_bytes())
            .await;
    }
    let first = drain(&mut m, 300, false).await;
    assert!(
        !first.is_empty() && first.iter().all(|d| !d.dup),
        "{first:?}"
    );
    // More than flush_interval_ms (20 ms) later: the delivery is journaled.
    tokio::time::sleep(Duration::from_millis(200)).await;
    b.kill9();
    b.restart().await;
    drop(m);
    let (mut m, ack) = RawClient::connect_ack(b.addr, persistent("dup9-m", false)).await;
    assert!(ack.session_present);
    let again = drain(&mut m, 500, true).await;
    let first_offs: Vec<u64> = first.iter().map(offset_of).collect();
    let again_offs: Vec<u64> = again.iter().take(first.len()).map(offset_of).collect();
    assert_eq!(again_offs, first_offs, "{again:?}");
    assert!(
        again.iter().take(first.len()).all(|d| d.dup),
        "redelivered after kill -9 without DUP=1: {again:?}"
    );
}

/// Subscribe to one lane without a group, with `lane-offset` (a private replay).
async fn replay(c: &mut RawClient, filter: &str, offset: &str) {
    let pid = c.next_pid();
    let mut properties = SubscribeProperties::default();
    properties
        .user_properties
        .push(("lane-offset".into(), offset.into()));
    c.send(Packet::Subscribe(Subscribe {
        packet_id: pid,
        filters: vec![SubscribeFilter {
            filter: filter.into(),
            options: sub_opts(QoS::AtLeastOnce),
        }],
        properties,
    }))
    .await;
    match c.recv().await {
        Packet::SubAck(a) => assert_eq!(a.reason_codes, vec![1]),
        other => panic!("expected SUBACK, got {other:?}"),
    }
}

/// A private one-lane replay of a persistent session is restored with the session after a
/// restart: it goes on after the last acknowledged offset, what was delivered and not
/// acknowledged comes again with DUP=1 [MQTT-4.4.0-1], and then it follows the lane live. A
/// new SUBSCRIBE with another `lane-offset` starts over from there; after an UNSUBSCRIBE
/// nothing of it comes back.
#[tokio::test]
async fn private_lane_replay_is_restored_with_its_session() {
    let cfg = format!("{FSYNC_ALWAYS}{LITE}");
    let mut b = Broker::start("lanes-private-restart", &cfg).await;
    let mut p = RawClient::connect_ok(b.addr, connect_v5("priv-p")).await;
    for i in 0..6 {
        p.publish_qos1("agents/s1/x", format!("m{i}").as_bytes())
            .await;
    }
    p.disconnect().await;
    let mut r = RawClient::connect_ok(b.addr, persistent("priv-r", true)).await;
    replay(&mut r, "agents/s1/#", "1").await;
    let first = drain(&mut r, 300, false).await;
    let offs: Vec<u64> = first.iter().map(offset_of).collect();
    assert_eq!(offs, vec![1, 2, 3, 4, 5], "{first:?}");
    // Acknowledge 1 and 2 only.
    for d in &first[..2] {
        r.send(Packet::PubAck(PubResp::new(d.packet_id, 0))).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(r);
    let status = b.terminate().await;
    assert!(status.success(), "{}", b.log_tail(20));
    b.restart().await;

    let (mut r, ack) = RawClient::connect_ack(b.addr, persistent("priv-r", false)).await;
    assert!(ack.session_present);
    let again = drain(&mut r, 500, true).await;
    let offs: Vec<u64> = again.iter().map(offset_of).collect();
    assert_eq!(
        offs,
        vec![3, 4, 5],
        "acknowledged 1 and 2 must not come again: {again:?}"
    );
    assert!(
        again.iter().all(|d| d.dup),
        "redelivered without DUP=1: {again:?}"
    );
    // It follows the lane live.
    let mut p = RawClient::connect_ok(b.addr, connect_v5("priv-p")).await;
    p.publish_qos1("agents/s1/x", b"m6").await;
    let live = r.recv_publish().await;
    assert_eq!(offset_of(&live), 6);
    assert!(!live.dup);
    r.send(Packet::PubAck(PubResp::new(live.packet_id, 0)))
        .await;
    // Subscribing again with another offset starts over there, also after a restart.
    replay(&mut r, "agents/s1/#", "5").await;
    let over = drain(&mut r, 300, true).await;
    assert_eq!(over.iter().map(offset_of).collect::<Vec<_>>(), vec![5, 6]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(r);
    let status = b.terminate().await;
    assert!(status.success(), "{}", b.log_tail(20));
    b.restart().await;
    let mut r = RawClient::connect_ok(b.addr, persistent("priv-r", false)).await;
    assert!(
        drain(&mut r, 400, true).await.is_empty(),
        "all of it was acknowledged"
    );
    p = RawClient::connect_ok(b.addr, connect_v5("priv-p")).await;
    p.publish_qos1("agents/s1/x", b"m7").await;
    assert_eq!(offset_of(&r.recv_publish().await), 7);
    // After an UNSUBSCRIBE the replay is gone, also after a restart.
    r.unsubscribe("agents/s1/#").await;
    drop(r);
    let status = b.terminate().await;
    assert!(status.success(), "{}", b.log_tail(20));
    b.restart().await;
    let mut r = RawClient::connect_ok(b.addr, persistent("priv-r", false)).await;
    let mut p = RawClient::connect_ok(b.addr, connect_v5("priv-p")).await;
    p.publish_qos1("agents/s1/x", b"m8").await;
    assert!(
        drain(&mut r, 400, true).await.is_empty(),
        "an unsubscribed replay came back"
    );
}
