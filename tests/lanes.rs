//! The lite-topic layer (`/work/shared/spec/lite.md`, docs/lanes.md) against an in-process
//! server with raw MQTT 5 clients: lanes and their offsets, groups over `$share`, one batch
//! in flight, commits, suspend / retry / reject and the dead-letter topic, redelivery on
//! member loss, on session resume and at the ack timeout (stuck members), exclusive mode,
//! key and quota refusals, TTL expiry, `lane-offset` starts and plain one-lane replays.
//! Restarts and kill -9: tests/lanes_restart.rs.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use lanemq_lite::{Mode, ParentDef};
use lanemq_protocol::{
    AckProperties, Connect, Packet, PubResp, Publish, QoS, Subscribe, SubscribeFilter,
    SubscribeProperties,
};
use std::collections::HashMap;
use std::time::{Duration, Instant};

fn parent(name: &str, pattern: &str) -> ParentDef {
    ParentDef {
        name: name.into(),
        pattern: pattern.into(),
        ..Default::default()
    }
}

fn lite_config(parents: Vec<ParentDef>) -> lanemq_broker::Config {
    let mut cfg = config();
    cfg.lite.parents = parents;
    cfg.lite.sweep_interval_ms = 100;
    cfg.lite.flush_interval_ms = 20;
    cfg
}

async fn server(parents: Vec<ParentDef>) -> TestServer {
    TestServer::start(lite_config(parents)).await
}

async fn agents() -> TestServer {
    server(vec![parent("agents", "agents/{lane}/#")]).await
}

fn persistent(id: &str, clean_start: bool) -> Connect {
    let mut c = connect_v5(id);
    c.clean_start = clean_start;
    c.properties.session_expiry_interval = Some(3600);
    c
}

/// SUBSCRIBE one filter with user properties; returns the SUBACK codes.
async fn subscribe_props(
    c: &mut RawClient,
    filter: &str,
    qos: QoS,
    props: &[(&str, &str)],
) -> Vec<u8> {
    let pid = c.next_pid();
    c.send(Packet::Subscribe(Subscribe {
        packet_id: pid,
        filters: vec![SubscribeFilter {
            filter: filter.into(),
            options: sub_opts(qos),
        }],
        properties: SubscribeProperties {
            subscription_identifier: None,
            user_properties: props
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        },
    }))
    .await;
    match c.recv().await {
        Packet::SubAck(a) => a.reason_codes,
        other => panic!("expected SUBACK, got {other:?}"),
    }
}

async fn join(c: &mut RawClient, filter: &str) {
    assert_eq!(
        subscribe_props(c, filter, QoS::AtLeastOnce, &[]).await,
        vec![1]
    );
}

async fn puback(c: &mut RawClient, pid: u16, code: u8, props: &[(&str, &str)]) {
    c.send(Packet::PubAck(PubResp {
        packet_id: pid,
        reason_code: code,
        properties: AckProperties {
            reason_string: None,
            user_properties: props
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        },
    }))
    .await;
}

fn lane_of(p: &Publish) -> String {
    user_prop(p, "lane")
        .unwrap_or_else(|| panic!("no lane user property on {p:?}"))
        .to_string()
}

fn offset_of(p: &Publish) -> u64 {
    user_prop(p, "lane-offset")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no lane-offset user property on {p:?}"))
}

fn body(p: &Publish) -> String {
    String::from_utf8(p.payload.to_vec()).unwrap()
}

async fn publish(c: &mut RawClient, topic: &str, payload: &str) -> u8 {
    c.publish_qos1(topic, payload.as_bytes()).await
}

#[tokio::test]
async fn group_receives_every_lane_in_order_with_lane_properties() {
    let s = agents().await;
    let mut w = s.v5("w1").await;
    // QoS 2 requested: a lane group grants at most QoS 1.
    assert_eq!(
        subscribe_props(&mut w, "$share/workers/agents/+/#", QoS::ExactlyOnce, &[]).await,
        vec![1]
    );
    let mut p = s.v5("pub").await;
    for i in 0..3 {
        assert!(publish(&mut p, "agents/a/req", &format!("a{i}")).await < 0x80);
        assert!(publish(&mut p, "agents/b/req", &format!("b{i}")).await < 0x80);
    }
    let mut seen: HashMap<String, Vec<u64>> = HashMap::new();
    for _ in 0..6 {
        let m = w.recv_publish_ack().await;
        assert_eq!(m.qos, QoS::AtLeastOnce);
        let lane = lane_of(&m);
        assert_eq!(m.topic, format!("agents/{lane}/req"));
        let off = offset_of(&m);
        assert_eq!(body(&m), format!("{lane}{off}"));
        seen.entry(lane).or_default().push(off);
    }
    assert_eq!(seen["a"], vec![0, 1, 2]);
    assert_eq!(seen["b"], vec![0, 1, 2]);
    w.expect_nothing(QUIET_MS).await;
    // Ordinary subscribers are untouched: a plain subscription still sees live messages.
    let mut plain = s.v5("plain").await;
    plain.subscribe("agents/+/req", QoS::AtLeastOnce).await;
    publish(&mut p, "agents/c/req", "c0").await;
    let m = plain.recv_publish_ack().await;
    assert_eq!(body(&m), "c0");
    assert_eq!(user_prop(&m, "lane"), None);
    let m = w.recv_publish_ack().await;
    assert_eq!((lane_of(&m), offset_of(&m)), ("c".into(), 0));
}

#[tokio::test]
async fn one_batch_in_flight_per_lane_and_commit_survives_member_change() {
    let mut def = parent("agents", "agents/{lane}/#");
    def.batch = 1;
    let s = server(vec![def]).await;
    let mut p = s.v5("pub").await;
    for i in 0..3 {
        publish(&mut p, "agents/a/x", &format!("m{i}")).await;
    }
    let mut w = s.v5("w1").await;
    join(&mut w, "$share/g/agents/+/#").await;
    let m0 = w.recv_publish().await;
    assert_eq!(offset_of(&m0), 0);
    // The next message of the lane waits for the acknowledgement.
    w.expect_nothing(QUIET_MS).await;
    puback(&mut w, m0.packet_id, 0, &[]).await;
    let m1 = w.recv_publish().await;
    assert_eq!(offset_of(&m1), 1);
    puback(&mut w, m1.packet_id, 0, &[]).await;
    let m2 = w.recv_publish().await;
    assert_eq!(offset_of(&m2), 2);
    // m2 is not acknowledged: a new member of the group gets exactly m2 (commit kept).
    w.disconnect().await;
    let mut w2 = s.v5("w2").await;
    join(&mut w2, "$share/g/agents/+/#").await;
    let again = w2.recv_publish_ack().await;
    assert_eq!(offset_of(&again), 2);
    assert!(!again.dup, "handed over as a new PUBLISH");
    w2.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn holder_loss_hands_the_batch_to_another_member() {
    let s = agents().await;
    let mut p = s.v5("pub").await;
    publish(&mut p, "agents/k/x", "m0").await;
    publish(&mut p, "agents/k/x", "m1").await;
    // Both in one batch (they are stored before the group exists).
    let mut a = s.v5("wa").await;
    join(&mut a, "$share/g/agents/+/#").await;
    let first = a.recv_publish().await;
    assert_eq!(offset_of(&first), 0);
    let _second = a.recv_publish().await;
    let mut b = s.v5("wb").await;
    join(&mut b, "$share/g/agents/+/#").await;
    // The holder is connected: never a resend on a timer, the lane stays with it.
    b.expect_nothing(QUIET_MS).await;
    // Its connection goes away without acknowledging: b gets both, in order, as new PUBLISHes.
    drop(a);
    let x = b.recv_publish_ack().await;
    let y = b.recv_publish_ack().await;
    assert_eq!((offset_of(&x), offset_of(&y)), (0, 1));
    assert!(!x.dup && !y.dup);
    b.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn unacknowledged_lane_messages_are_resent_with_dup_on_session_resume() {
    let s = agents().await;
    let mut a = RawClient::connect_ok(s.addr, persistent("wa", true)).await;
    join(&mut a, "$share/g/agents/+/#").await;
    let mut p = s.v5("pub").await;
    publish(&mut p, "agents/k/x", "m0").await;
    let m = a.recv_publish().await;
    drop(a);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut a = RawClient::connect_ok(s.addr, persistent("wa", false)).await;
    let again = a.recv_publish().await;
    assert!(again.dup, "resent with DUP=1 on resume");
    assert_eq!(again.packet_id, m.packet_id);
    assert_eq!(offset_of(&again), 0);
    puback(&mut a, again.packet_id, 0, &[]).await;
    publish(&mut p, "agents/k/x", "m1").await;
    let next = a.recv_publish_ack().await;
    assert_eq!(offset_of(&next), 1);
}

#[tokio::test]
async fn suspend_pauses_only_that_lane_and_redelivers_as_a_new_publish() {
    let s = agents().await;
    let mut w = s.v5("w").await;
    join(&mut w, "$share/g/agents/+/#").await;
    let mut p = s.v5("pub").await;
    publish(&mut p, "agents/slow/x", "s0").await;
    let m = w.recv_publish().await;
    assert_eq!(lane_of(&m), "slow");
    let t0 = Instant::now();
    puback(&mut w, m.packet_id, 0, &[("lane-suspend-ms", "600")]).await;
    // Another lane flows meanwhile.
    publish(&mut p, "agents/fast/x", "f0").await;
    let f = w.recv_publish_ack().await;
    assert_eq!(lane_of(&f), "fast");
    assert!(t0.elapsed() < Duration::from_millis(500));
    let again = w.recv_publish().await;
    assert!(
        t0.elapsed() >= Duration::from_millis(590),
        "came back after {:?}",
        t0.elapsed()
    );
    assert_eq!((lane_of(&again), offset_of(&again)), ("slow".into(), 0));
    assert!(
        !again.dup,
        "a suspended message comes again as a new PUBLISH"
    );
    puback(&mut w, again.packet_id, 0, &[]).await;
    w.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn retries_past_max_attempts_and_rejects_go_to_the_dead_letter_topic() {
    let mut def = parent("agents", "agents/{lane}/#");
    def.max_attempts = 2;
    let s = server(vec![def]).await;
    let mut dlq = s.v5("dlq").await;
    dlq.subscribe("$dlq/#", QoS::AtLeastOnce).await;
    let mut w = s.v5("w").await;
    join(&mut w, "$share/g/agents/+/#").await;
    let mut p = s.v5("pub").await;
    publish(&mut p, "agents/r/x", "retry-me").await;
    let m = w.recv_publish().await;
    puback(&mut w, m.packet_id, 0, &[("lane-retry-ms", "50")]).await;
    let m = w.recv_publish().await;
    assert_eq!(body(&m), "retry-me");
    puback(&mut w, m.packet_id, 0, &[("lane-retry-ms", "50")]).await;
    // Second attempt counted: max_attempts reached, dead-lettered and committed.
    let d = dlq.recv_publish_ack().await;
    assert_eq!(d.topic, "$dlq/g/agents/r/x");
    assert_eq!(body(&d), "retry-me");
    assert_eq!(user_prop(&d, "original-topic"), Some("agents/r/x"));
    assert_eq!(user_prop(&d, "lane"), Some("r"));
    assert_eq!(user_prop(&d, "lane-offset"), Some("0"));
    assert_eq!(user_prop(&d, "attempts"), Some("2"));
    assert_eq!(user_prop(&d, "reason"), Some("max_attempts"));
    w.expect_nothing(QUIET_MS).await;
    // A reject (>= 0x80) dead-letters at once and commits: not sent to another member.
    publish(&mut p, "agents/r/x", "reject-me").await;
    let m = w.recv_publish().await;
    assert_eq!(offset_of(&m), 1);
    puback(&mut w, m.packet_id, 0x80, &[]).await;
    let d = dlq.recv_publish_ack().await;
    assert_eq!(body(&d), "reject-me");
    assert_eq!(user_prop(&d, "reason"), Some("0x80"));
    assert_eq!(user_prop(&d, "lane-offset"), Some("1"));
    w.disconnect().await;
    let mut w2 = s.v5("w2").await;
    join(&mut w2, "$share/g/agents/+/#").await;
    w2.expect_nothing(QUIET_MS).await;
    let c = &s.server().broker().lite.engine.counters;
    assert_eq!(
        c.dead_lettered.load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}

#[tokio::test]
async fn exclusive_lane_moves_to_its_newest_explicit_subscriber() {
    let mut def = parent("agents", "agents/{lane}/#");
    def.mode = Mode::Exclusive;
    let s = server(vec![def]).await;
    let mut a = s.v5("a").await;
    join(&mut a, "$share/g/agents/+/#").await;
    let mut b = s.v5("b").await;
    join(&mut b, "$share/g/agents/+/#").await;
    let mut p = s.v5("pub").await;
    publish(&mut p, "agents/k/x", "m0").await;
    // Whoever got the lane keeps it.
    let (mut owner, mut other) = tokio::select! {
        m = a.recv_publish() => { puback(&mut a, m.packet_id, 0, &[]).await; (a, b) }
        m = b.recv_publish() => { puback(&mut b, m.packet_id, 0, &[]).await; (b, a) }
    };
    for i in 1..4 {
        publish(&mut p, "agents/k/x", &format!("m{i}")).await;
        let m = owner.recv_publish_ack().await;
        assert_eq!(offset_of(&m), i);
    }
    other.expect_nothing(QUIET_MS).await;
    // A member subscribing to that exact lane takes it over; the old owner gets no more.
    let mut c = s.v5("c").await;
    join(&mut c, "$share/g/agents/k/#").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    for i in 4..7 {
        publish(&mut p, "agents/k/x", &format!("m{i}")).await;
        let m = c.recv_publish_ack().await;
        assert_eq!(offset_of(&m), i);
    }
    owner.expect_nothing(QUIET_MS).await;
    other.expect_nothing(50).await;
}

#[tokio::test]
async fn long_keys_and_lane_quota_are_refused() {
    let mut def = parent("agents", "agents/{lane}/#");
    def.max_key_bytes = 4;
    def.max_lanes = 2;
    let s = server(vec![def]).await;
    let mut p = s.v5("pub").await;
    assert_eq!(publish(&mut p, "agents/toolong/x", "m").await, 0x90);
    assert!(publish(&mut p, "agents/k1/x", "m").await < 0x80);
    assert!(publish(&mut p, "agents/k2/x", "m").await < 0x80);
    assert_eq!(publish(&mut p, "agents/k3/x", "m").await, 0x97);
    // Existing lanes still accept.
    assert!(publish(&mut p, "agents/k1/x", "m").await < 0x80);
    // QoS 0 is dropped and counted.
    p.publish_qos0("agents/k4/x", b"m").await;
    let e = s.server().broker().lite.engine.clone();
    assert!(
        eventually(2_000, || e
            .counters
            .publish_refused
            .load(std::sync::atomic::Ordering::Relaxed)
            == 3)
        .await
    );
    assert_eq!(e.lane_count(), 2);
}

#[tokio::test]
async fn a_lane_expires_after_its_ttl_and_starts_again_at_offset_zero() {
    let mut def = parent("agents", "agents/{lane}/#");
    def.ttl_s = 1;
    let s = server(vec![def]).await;
    let e = s.server().broker().lite.engine.clone();
    let mut p = s.v5("pub").await;
    publish(&mut p, "agents/t/x", "m0").await;
    publish(&mut p, "agents/t/x", "m1").await;
    assert!(eventually(1_000, || e.lane_count() == 1).await);
    assert!(
        eventually(4_000, || e.lane_count() == 0).await,
        "the lane did not expire"
    );
    let mut w = s.v5("w").await;
    join(&mut w, "$share/g/agents/+/#").await;
    w.expect_nothing(QUIET_MS).await;
    publish(&mut p, "agents/t/x", "m2").await;
    let m = w.recv_publish_ack().await;
    assert_eq!((body(&m), offset_of(&m)), ("m2".into(), 0));
    assert!(
        e.counters
            .lanes_expired
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
}

#[tokio::test]
async fn lane_offset_latest_and_number_for_new_groups() {
    let s = agents().await;
    let mut p = s.v5("pub").await;
    for i in 0..4 {
        publish(&mut p, "agents/k/x", &format!("m{i}")).await;
    }
    let mut late = s.v5("late").await;
    assert_eq!(
        subscribe_props(
            &mut late,
            "$share/late/agents/+/#",
            QoS::AtLeastOnce,
            &[("lane-offset", "latest")]
        )
        .await,
        vec![1]
    );
    let mut from2 = s.v5("from2").await;
    assert_eq!(
        subscribe_props(
            &mut from2,
            "$share/from2/agents/+/#",
            QoS::AtLeastOnce,
            &[("lane-offset", "2")]
        )
        .await,
        vec![1]
    );
    for want in [2, 3] {
        let m = from2.recv_publish_ack().await;
        assert_eq!(offset_of(&m), want);
    }
    late.expect_nothing(QUIET_MS).await;
    publish(&mut p, "agents/k/x", "m4").await;
    assert_eq!(offset_of(&late.recv_publish_ack().await), 4);
    assert_eq!(offset_of(&from2.recv_publish_ack().await), 4);
    // A bad value is refused with a reason.
    let mut bad = s.v5("bad").await;
    assert_eq!(
        subscribe_props(
            &mut bad,
            "$share/bad/agents/+/#",
            QoS::AtLeastOnce,
            &[("lane-offset", "soon")]
        )
        .await,
        vec![0x83]
    );
}

#[tokio::test]
async fn plain_one_lane_subscription_with_lane_offset_replays_then_goes_live() {
    let s = agents().await;
    let mut p = s.v5("pub").await;
    for i in 0..4 {
        publish(&mut p, "agents/s-42/x", &format!("m{i}")).await;
        publish(&mut p, "agents/other/x", &format!("o{i}")).await;
    }
    let mut r = s.v5("reader").await;
    assert_eq!(
        subscribe_props(
            &mut r,
            "agents/s-42/#",
            QoS::AtLeastOnce,
            &[("lane-offset", "1")]
        )
        .await,
        vec![1]
    );
    for want in 1..4 {
        let m = r.recv_publish_ack().await;
        assert_eq!((lane_of(&m), offset_of(&m)), ("s-42".into(), want));
    }
    publish(&mut p, "agents/s-42/x", "m4").await;
    let m = r.recv_publish_ack().await;
    assert_eq!(offset_of(&m), 4);
    // Not duplicated by the router: exactly one copy.
    r.expect_nothing(QUIET_MS).await;
    // Without the property it is an ordinary subscription (live only, no lane properties).
    let mut o = s.v5("ordinary").await;
    o.subscribe("agents/s-42/#", QoS::AtLeastOnce).await;
    o.expect_nothing(QUIET_MS).await;
    publish(&mut p, "agents/s-42/x", "m5").await;
    let m = o.recv_publish_ack().await;
    assert_eq!(user_prop(&m, "lane"), None);
}

#[tokio::test]
async fn rumqttc_worker_pool_consumes_every_lane_in_order() {
    use rumqttc::v5::mqttbytes::QoS as RQ;
    const LANES: usize = 300;
    const PER_LANE: usize = 4;
    let s = agents().await;
    let mut rxs = Vec::new();
    let mut clients = Vec::new();
    for i in 0..4 {
        let (c, mut rx) = rumqttc_v5(s.addr, &format!("pool-{i}")).await;
        c.subscribe("$share/pool/agents/+/#", RQ::AtLeastOnce)
            .await
            .unwrap();
        let ack = rumqttc_v5_suback(&mut rx).await;
        assert_eq!(ack.return_codes.len(), 1);
        clients.push(c);
        rxs.push(rx);
    }
    let (publ, _prx) = rumqttc_v5(s.addr, "pool-pub").await;
    for i in 0..PER_LANE {
        for l in 0..LANES {
            publ.publish(
                format!("agents/l{l}/task"),
                RQ::AtLeastOnce,
                false,
                format!("{l}:{i}"),
            )
            .await
            .unwrap();
        }
    }
    // rumqttc acknowledges each PUBLISH as it is polled: batches keep moving.
    let mut per_lane: HashMap<String, Vec<u64>> = HashMap::new();
    let mut per_member = [0usize; 4];
    let mut by_member_lane: HashMap<(usize, String), Vec<u64>> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut total = 0;
    while total < LANES * PER_LANE && Instant::now() < deadline {
        for (i, rx) in rxs.iter_mut().enumerate() {
            while let Ok(p) = rx.try_recv() {
                if let rumqttc::v5::mqttbytes::v5::Packet::Publish(p) = p {
                    let props = p.properties.clone().unwrap_or_default().user_properties;
                    let get = |k: &str| {
                        props
                            .iter()
                            .find(|(n, _)| n == k)
                            .map(|(_, v)| v.clone())
                            .unwrap()
                    };
                    let lane = get("lane");
                    let off: u64 = get("lane-offset").parse().unwrap();
                    assert_eq!(&p.topic[..], format!("agents/{lane}/task").as_bytes());
                    assert_eq!(
                        String::from_utf8(p.payload.to_vec()).unwrap(),
                        format!("{}:{off}", &lane[1..])
                    );
                    by_member_lane
                        .entry((i, lane.clone()))
                        .or_default()
                        .push(off);
                    per_lane.entry(lane).or_default().push(off);
                    per_member[i] += 1;
                    total += 1;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(total, LANES * PER_LANE, "every message once");
    for (lane, offs) in &per_lane {
        // Channels of different members are read in turns, so compare the set; each member's
        // own share of a lane must be in order.
        let mut sorted = offs.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            (0..PER_LANE as u64).collect::<Vec<_>>(),
            "lane {lane}"
        );
    }
    for (key, offs) in &by_member_lane {
        assert!(offs.windows(2).all(|w| w[0] < w[1]), "{key:?}: {offs:?}");
    }
    assert_eq!(per_lane.len(), LANES);
    for (i, n) in per_member.iter().enumerate() {
        assert!(*n > 0, "member {i} got no lane: {per_member:?}");
    }
}

fn lite_counter(s: &TestServer, f: impl Fn(&lanemq_lite::engine::Counters) -> u64) -> u64 {
    f(&s.server().broker().lite.engine.counters)
}

fn load(a: &std::sync::atomic::AtomicU64) -> u64 {
    a.load(std::sync::atomic::Ordering::Relaxed)
}

/// The members of group `group` (parent "agents") marked stuck, as the REST API shows them.
async fn stuck_members(s: &TestServer, group: &'static str) -> Vec<String> {
    let lite = &s.server().broker().lite;
    let parent = lite
        .engine
        .parents()
        .iter()
        .find(|p| p.def.name == "agents")
        .unwrap()
        .id;
    let groups = lite.query(move |d| d.groups_of(parent)).unwrap();
    groups
        .into_iter()
        .find(|g| g.group == group)
        .unwrap()
        .stuck_members
}

/// Every PUBLISH that arrives within `ms` (none acknowledged).
async fn collect(c: &mut RawClient, ms: u64) -> Vec<Publish> {
    let deadline = Instant::now() + Duration::from_millis(ms);
    let mut out = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match c.try_recv(left).await {
            Ok(Packet::Publish(p)) => out.push(p),
            Ok(other) => panic!("expected PUBLISH, got {other:?}"),
            Err(_) => return out,
        }
    }
}

#[tokio::test]
async fn ack_timeout_hands_a_stuck_members_batch_to_another_member_with_dup() {
    let mut def = parent("agents", "agents/{lane}/#");
    def.ack_timeout_ms = 300;
    let s = server(vec![def]).await;
    let mut p = s.v5("pub").await;
    for i in 0..3 {
        publish(&mut p, "agents/k/x", &format!("m{i}")).await;
    }
    // The stuck member is alone at first: it gets the whole batch and never acknowledges it.
    let t0 = Instant::now();
    let mut stuck = s.v5("stuck").await;
    join(&mut stuck, "$share/g/agents/+/#").await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(stuck.recv_publish().await);
    }
    assert_eq!(held.iter().map(offset_of).collect::<Vec<_>>(), [0, 1, 2]);
    assert!(held.iter().all(|m| !m.dup));
    let mut ok = s.v5("ok").await;
    join(&mut ok, "$share/g/agents/+/#").await;
    // At the deadline the batch goes to the other member, in lane order, with DUP=1.
    let mut moved = Vec::new();
    for _ in 0..3 {
        moved.push(ok.recv_publish_ack().await);
    }
    assert!(
        t0.elapsed() >= Duration::from_millis(300),
        "taken back after {:?}",
        t0.elapsed()
    );
    assert_eq!(moved.iter().map(offset_of).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(
        moved.iter().map(body).collect::<Vec<_>>(),
        ["m0", "m1", "m2"]
    );
    assert!(moved.iter().all(|m| m.dup), "handed over with DUP=1");
    assert_eq!(lite_counter(&s, |c| load(&c.ack_timeouts)), 1);
    assert_eq!(lite_counter(&s, |c| load(&c.redelivered)), 3);
    assert_eq!(stuck_members(&s, "g").await, ["stuck"]);
    // The lane keeps flowing to the healthy member; the stuck one gets nothing new (neither
    // of this lane nor of others), and nothing of its batch again.
    publish(&mut p, "agents/k/x", "m3").await;
    let m = ok.recv_publish_ack().await;
    assert_eq!((lane_of(&m), offset_of(&m), m.dup), ("k".into(), 3, false));
    for l in ["l1", "l2", "l3", "l4"] {
        publish(&mut p, &format!("agents/{l}/x"), "n0").await;
    }
    let mut lanes: Vec<String> = Vec::new();
    for _ in 0..4 {
        let m = ok.recv_publish_ack().await;
        assert!(!m.dup);
        lanes.push(lane_of(&m));
    }
    lanes.sort();
    assert_eq!(lanes, ["l1", "l2", "l3", "l4"]);
    stuck.expect_nothing(QUIET_MS).await;
    // A PUBACK (here for a packet id that was taken back) shows life: it gets batches again.
    puback(&mut stuck, held[0].packet_id, 0, &[]).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut got_stuck = 0;
    for i in 0..6 {
        publish(&mut p, &format!("agents/n{i}/x"), "n0").await;
    }
    let deadline = Instant::now() + Duration::from_millis(RECV_MS);
    let mut total = 0;
    while total < 6 && Instant::now() < deadline {
        // (recv_publish is cancel-safe; the PUBACK is sent after the select.)
        let (from_stuck, m) = tokio::select! {
            m = stuck.recv_publish() => (true, m),
            m = ok.recv_publish() => (false, m),
        };
        assert!(!m.dup);
        total += 1;
        if from_stuck {
            got_stuck += 1;
            puback(&mut stuck, m.packet_id, 0, &[]).await;
        } else {
            puback(&mut ok, m.packet_id, 0, &[]).await;
        }
    }
    assert_eq!(total, 6);
    assert!(
        got_stuck > 0,
        "the member that showed life got no lane again"
    );
    assert!(stuck_members(&s, "g").await.is_empty());
    // Nothing lost, nothing twice.
    ok.expect_nothing(QUIET_MS).await;
    stuck.expect_nothing(50).await;
}

#[tokio::test]
async fn ack_timeouts_count_attempts_up_to_the_dead_letter_topic() {
    let mut def = parent("agents", "agents/{lane}/#");
    def.ack_timeout_ms = 300;
    def.max_attempts = 2;
    let s = server(vec![def]).await;
    let mut dlq = s.v5("dlq").await;
    dlq.subscribe("$dlq/#", QoS::AtLeastOnce).await;
    let mut members = Vec::new();
    for id in ["ma", "mb", "mc"] {
        let mut c = s.v5(id).await;
        join(&mut c, "$share/g/agents/+/#").await;
        members.push(c);
    }
    let mut p = s.v5("pub").await;
    publish(&mut p, "agents/d/x", "never-acked").await;
    // Nobody acknowledges: one member, then (timeout, attempt 1) another with DUP=1, then
    // (timeout, attempt 2 = max_attempts) the dead-letter topic.
    let d = dlq.recv_publish_ack().await;
    assert_eq!(d.topic, "$dlq/g/agents/d/x");
    assert_eq!(body(&d), "never-acked");
    assert_eq!(user_prop(&d, "lane-offset"), Some("0"));
    assert_eq!(user_prop(&d, "attempts"), Some("2"));
    assert_eq!(user_prop(&d, "reason"), Some("max_attempts"));
    let mut got = Vec::new();
    for (i, c) in members.iter_mut().enumerate() {
        for m in collect(c, 100).await {
            assert_eq!((body(&m), offset_of(&m)), ("never-acked".into(), 0));
            got.push((i, m.dup));
        }
    }
    got.sort_by_key(|(_, dup)| *dup);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!((got[0].1, got[1].1), (false, true), "{got:?}");
    assert_ne!(
        got[0].0, got[1].0,
        "never resent to the same member: {got:?}"
    );
    assert_eq!(lite_counter(&s, |c| load(&c.ack_timeouts)), 2);
    assert_eq!(lite_counter(&s, |c| load(&c.dead_lettered)), 1);
    // Committed: the next message goes to the one member that is not stuck.
    let fresh = (0..3).find(|i| got.iter().all(|(j, _)| j != i)).unwrap();
    publish(&mut p, "agents/d/x", "next").await;
    let m = members[fresh].recv_publish_ack().await;
    assert_eq!((body(&m), offset_of(&m), m.dup), ("next".into(), 1, false));
    for (i, c) in members.iter_mut().enumerate() {
        if i != fresh {
            c.expect_nothing(QUIET_MS).await;
        }
    }
}

#[tokio::test]
async fn a_lone_stuck_member_keeps_its_batch_and_nothing_is_resent_to_it() {
    let mut def = parent("agents", "agents/{lane}/#");
    def.ack_timeout_ms = 300;
    def.max_attempts = 1;
    let s = server(vec![def]).await;
    let mut w = s.v5("w").await;
    join(&mut w, "$share/g/agents/+/#").await;
    let mut p = s.v5("pub").await;
    publish(&mut p, "agents/a/x", "a0").await;
    let m = w.recv_publish().await;
    assert_eq!((body(&m), m.dup), ("a0".into(), false));
    // Well past the deadline: no resend to the connected holder (MQTT-4.4.0-1), no attempt
    // counted (max_attempts = 1 would dead-letter it), and as a stuck member it gets no new
    // lane either.
    w.expect_nothing(700).await;
    assert_eq!(lite_counter(&s, |c| load(&c.ack_timeouts)), 1);
    publish(&mut p, "agents/b/x", "b0").await;
    publish(&mut p, "agents/a/x", "a1").await;
    w.expect_nothing(QUIET_MS).await;
    assert_eq!(lite_counter(&s, |c| load(&c.redelivered)), 0);
    assert_eq!(lite_counter(&s, |c| load(&c.dead_lettered)), 0);
    // Its PUBACK commits the held message and clears the mark: both lanes proceed.
    puback(&mut w, m.packet_id, 0, &[]).await;
    let mut got: Vec<(String, u64)> = Vec::new();
    for _ in 0..2 {
        let m = w.recv_publish_ack().await;
        assert!(!m.dup);
        got.push((lane_of(&m), offset_of(&m)));
    }
    got.sort();
    assert_eq!(got, [("a".into(), 1), ("b".into(), 0)]);
    w.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn a_stuck_member_is_cleared_by_a_new_connection_of_its_session() {
    let mut def = parent("agents", "agents/{lane}/#");
    def.ack_timeout_ms = 300;
    let s = server(vec![def]).await;
    let mut w = RawClient::connect_ok(s.addr, persistent("w", true)).await;
    join(&mut w, "$share/g/agents/+/#").await;
    let mut p = s.v5("pub").await;
    publish(&mut p, "agents/a/x", "a0").await;
    let m = w.recv_publish().await;
    w.expect_nothing(600).await;
    publish(&mut p, "agents/b/x", "b0").await;
    w.expect_nothing(QUIET_MS).await;
    // Reconnect (Clean Start 0): the held message comes again with DUP=1 on the same packet
    // id (the resume path), and the new lane comes too.
    drop(w);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut w = RawClient::connect_ok(s.addr, persistent("w", false)).await;
    let mut got = Vec::new();
    for _ in 0..2 {
        let m = w.recv_publish_ack().await;
        got.push((lane_of(&m), offset_of(&m), m.dup, m.packet_id));
    }
    got.sort();
    assert_eq!(got[0], ("a".into(), 0, true, m.packet_id));
    assert_eq!((&got[1].0[..], got[1].1, got[1].2), ("b", 0, false));
    w.expect_nothing(QUIET_MS).await;
}

#[tokio::test]
async fn exclusive_lane_moves_from_a_stuck_owner_at_the_ack_timeout() {
    let mut def = parent("agents", "agents/{lane}/#");
    def.mode = Mode::Exclusive;
    def.ack_timeout_ms = 300;
    let s = server(vec![def]).await;
    let mut a = s.v5("a").await;
    join(&mut a, "$share/g/agents/+/#").await;
    let mut p = s.v5("pub").await;
    publish(&mut p, "agents/k/x", "m0").await;
    let held = a.recv_publish().await;
    let mut b = s.v5("b").await;
    join(&mut b, "$share/g/agents/+/#").await;
    let m = b.recv_publish_ack().await;
    assert_eq!((offset_of(&m), m.dup), (0, true));
    // b owns the lane now; a keeps getting nothing of it, even once it shows life again.
    puback(&mut a, held.packet_id, 0, &[]).await;
    for i in 1..4 {
        publish(&mut p, "agents/k/x", &format!("m{i}")).await;
        let m = b.recv_publish_ack().await;
        assert_eq!((offset_of(&m), m.dup), (i, false));
    }
    a.expect_nothing(QUIET_MS).await;
}
