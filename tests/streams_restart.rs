//! Named streams across reconnects and restarts of the real `lanemq` binary: a persistent
//! session resumes its stream subscription after the last acknowledged message (reconnect,
//! graceful restart, kill -9), and the stream registry, the stored messages and last-value
//! state survive a restart.
//!
//! ```sh
//! cargo build -p lanemq
//! cargo test -p lanemq-tests --test it streams_restart::
//! ```
//!
//! The binary: `LANEMQ_BIN`, else the newest of target/{release,debug}/lanemq and
//! `$CARGO_TARGET_DIR`/{release,debug}/lanemq. `KEEP_TMP=1` keeps data dirs and broker logs.
#![allow(clippy::unwrap_used)]

use crate::common;

use crate::child;

use child::Broker;
use common::{connect_v5, stream_offset_of, sub_opts, user_prop, RawClient};
use lanemq_protocol::{
    Connect, Packet, PubResp, Publish, QoS, Subscribe, SubscribeFilter, SubscribeProperties,
};

const ACL: &str = "default allow\n";
const EVENTS: &str = "[[streams]]\nname = \"events\"\ntopic_filter = \"t/#\"\n\n";
const FSYNC_ALWAYS: &str = "[storage]\nfsync = \"always\"\n\n";
const N: usize = 30;
const ACKED: usize = 10;

fn persistent(id: &str, clean_start: bool) -> Connect {
    let mut c = connect_v5(id);
    c.clean_start = clean_start;
    c.properties.session_expiry_interval = Some(3600);
    c
}

fn payload(p: &Publish) -> String {
    String::from_utf8(p.payload.to_vec()).unwrap()
}

/// Index `i` of a payload `m<i>`.
fn index_of(p: &Publish) -> usize {
    payload(p)
        .strip_prefix('m')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected payload {p:?}"))
}

async fn publish_n(b: &Broker, client_id: &str, topic: &str, range: std::ops::Range<usize>) {
    let mut p = RawClient::connect_ok(b.addr, connect_v5(client_id)).await;
    for i in range {
        assert!(p.publish_qos1(topic, format!("m{i}").as_bytes()).await < 0x80);
    }
    p.disconnect().await;
}

async fn sigterm_restart(b: &mut Broker) {
    let status = b.terminate().await;
    assert!(
        status.success(),
        "exit status after SIGTERM: {status}; log tail:\n{}",
        b.log_tail(40)
    );
    b.restart().await;
}

/// A persistent session subscribes `$stream/events` at QoS 1 from earliest over `N` stored
/// messages, receives and acknowledges the first `ACKED` (and does not acknowledge the others),
/// and returns with every acknowledgement processed by the broker.
async fn read_and_ack_first(b: &Broker) -> RawClient {
    publish_n(b, "pub", "t/0", 0..N).await;
    let mut c = RawClient::connect_ok(b.addr, persistent("reader", true)).await;
    let ack = c
        .subscribe_props(
            &[("$stream/events", sub_opts(QoS::AtLeastOnce))],
            Some(4),
            &[("stream-offset", "earliest")],
        )
        .await;
    assert_eq!(ack.reason_codes, vec![1], "{ack:?}");
    for i in 0..ACKED {
        let m = c.recv_publish().await;
        assert_eq!(payload(&m), format!("m{i}"));
        assert_eq!(m.properties.subscription_identifiers, vec![4]);
        c.send(Packet::PubAck(PubResp::new(m.packet_id, 0))).await;
    }
    // PINGRESP: the PUBACKs before it were processed (the rest stay unacknowledged).
    let _unacked = c.sync().await;
    c
}

/// Reconnect the persistent session and receive until `m{N-1}`, acknowledging everything;
/// returns the indexes in arrival order.
async fn resume_and_read_rest(b: &Broker) -> Vec<usize> {
    let (mut c, ack) = RawClient::connect_ack(b.addr, persistent("reader", false)).await;
    assert!(
        ack.session_present,
        "session present after reconnect: {ack:?}"
    );
    let mut got = Vec::new();
    for _ in 0..2 * N {
        let m = c.recv_publish_ack().await;
        assert_eq!(m.topic, "t/0");
        assert!(user_prop(&m, "stream-offset").is_some());
        assert_eq!(m.properties.subscription_identifiers, vec![4]);
        let i = index_of(&m);
        got.push(i);
        if i == N - 1 {
            break;
        }
    }
    c.expect_nothing(300).await;
    c.disconnect().await;
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_stream_subscription_resumes_after_last_ack_on_reconnect() {
    let b = Broker::start_with_acl("streams-reconnect", ACL, EVENTS).await;
    let c = read_and_ack_first(&b).await;
    c.disconnect().await;
    let got = resume_and_read_rest(&b).await;
    assert_eq!(got, (ACKED..N).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_stream_subscription_resumes_after_last_ack_across_graceful_restart() {
    let mut b = Broker::start_with_acl("streams-graceful", ACL, EVENTS).await;
    let c = read_and_ack_first(&b).await;
    // The client stays connected while the broker stops.
    sigterm_restart(&mut b).await;
    drop(c);
    let got = resume_and_read_rest(&b).await;
    assert_eq!(
        got,
        (ACKED..N).collect::<Vec<_>>(),
        "log tail:\n{}",
        b.log_tail(30)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_stream_subscription_never_skips_across_kill9() {
    let mut b =
        Broker::start_with_acl("streams-kill9", ACL, &format!("{FSYNC_ALWAYS}{EVENTS}")).await;
    let c = read_and_ack_first(&b).await;
    b.kill9();
    drop(c);
    b.restart().await;
    let got = resume_and_read_rest(&b).await;
    // At least once: it may start before the 11th (acknowledged but not yet saved), never after.
    let first = got[0];
    assert!(
        first <= ACKED,
        "resumed at m{first}: skipped messages ({got:?})"
    );
    assert_eq!(
        got,
        (first..N).collect::<Vec<_>>(),
        "log tail:\n{}",
        b.log_tail(30)
    );
}

/// Every message of `$stream/<name>` from earliest (QoS 1, acknowledged) until silence.
async fn replay_all(b: &Broker, client_id: &str, name: &str, expect: usize) -> Vec<Publish> {
    let mut c = RawClient::connect_ok(b.addr, connect_v5(client_id)).await;
    let filter = format!("$stream/{name}");
    let ack = c
        .subscribe_props(
            &[(filter.as_str(), sub_opts(QoS::AtLeastOnce))],
            None,
            &[("stream-offset", "earliest")],
        )
        .await;
    assert_eq!(ack.reason_codes, vec![1], "{ack:?}");
    let mut got = Vec::new();
    for _ in 0..expect {
        got.push(c.recv_publish_ack().await);
    }
    c.expect_nothing(300).await;
    c.disconnect().await;
    got
}

fn summary(v: &[Publish]) -> Vec<(String, String, u64)> {
    v.iter()
        .map(|m| (m.topic.clone(), payload(m), stream_offset_of(m)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_registry_and_messages_survive_restart() {
    let mut b = Broker::start_with_acl("streams-registry", ACL, EVENTS).await;
    // A stream created at run time (auto-create: last-value keyed by the publisher's client id).
    let mut c = RawClient::connect_ok(b.addr, connect_v5("creator")).await;
    let ack = c
        .subscribe_props(
            &[("$stream/auto/a/#", sub_opts(QoS::AtLeastOnce))],
            None,
            &[],
        )
        .await;
    assert_eq!(ack.reason_codes, vec![1], "{ack:?}");
    c.disconnect().await;
    publish_n(&b, "pub", "t/x", 0..20).await;
    publish_n(&b, "p1", "a/1", 20..21).await;
    publish_n(&b, "p2", "a/2", 21..22).await;
    let events_before = replay_all(&b, "r1", "events", 20).await;
    let auto_before = replay_all(&b, "r2", "auto", 2).await;
    sigterm_restart(&mut b).await;
    let events_after = replay_all(&b, "r3", "events", 20).await;
    assert_eq!(summary(&events_after), summary(&events_before));
    assert_eq!(
        events_after.iter().map(payload).collect::<Vec<_>>(),
        (0..20).map(|i| format!("m{i}")).collect::<Vec<_>>()
    );
    let auto_after = replay_all(&b, "r4", "auto", 2).await;
    assert_eq!(summary(&auto_after), summary(&auto_before));
    // Both streams keep capturing after the restart.
    publish_n(&b, "pub", "t/x", 22..23).await;
    let again = replay_all(&b, "r5", "events", 21).await;
    assert_eq!(payload(&again[20]), "m22");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_messages_survive_kill9() {
    let mut b = Broker::start_with_acl(
        "streams-registry-kill9",
        ACL,
        &format!("{FSYNC_ALWAYS}{EVENTS}"),
    )
    .await;
    publish_n(&b, "pub", "t/x", 0..20).await;
    b.kill9();
    b.restart().await;
    let after = replay_all(&b, "r", "events", 20).await;
    assert_eq!(
        after.iter().map(payload).collect::<Vec<_>>(),
        (0..20).map(|i| format!("m{i}")).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lastvalue_stream_values_survive_restart() {
    let lv = "[[streams]]\nname = \"lv\"\ntopic_filter = \"lv/#\"\nis_lastvalue = true\n\
              key_expression = \"message.topic\"\n\n";
    let mut b = Broker::start_with_acl("streams-lastvalue", ACL, lv).await;
    let mut p = RawClient::connect_ok(b.addr, connect_v5("pub")).await;
    let seq = ["lv/a", "lv/b", "lv/a", "lv/c", "lv/b", "lv/a"];
    for (i, t) in seq.iter().enumerate() {
        assert!(p.publish_qos1(t, format!("m{i}").as_bytes()).await < 0x80);
    }
    p.disconnect().await;
    let want = vec![
        ("lv/c".to_string(), "m3".to_string()),
        ("lv/b".to_string(), "m4".to_string()),
        ("lv/a".to_string(), "m5".to_string()),
    ];
    let pairs = |v: &[Publish]| -> Vec<(String, String)> {
        v.iter().map(|m| (m.topic.clone(), payload(m))).collect()
    };
    let before = replay_all(&b, "r1", "lv", 3).await;
    assert_eq!(pairs(&before), want);
    sigterm_restart(&mut b).await;
    let after = replay_all(&b, "r2", "lv", 3).await;
    assert_eq!(pairs(&after), want);
    assert_eq!(summary(&after), summary(&before));
    for m in &after {
        assert_eq!(user_prop(m, "key"), Some(m.topic.as_str()));
    }
}

/// `mosquitto_sub -c` sends the same SUBSCRIBE on every run: the persistent session keeps its
/// stream subscription and resumes after the last acknowledged message instead of starting
/// again from `earliest` (and nothing is delivered twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_resubscribe_in_a_resumed_session_keeps_the_position() {
    let b = Broker::start_with_acl("streams-resubscribe", ACL, EVENTS).await;
    let c = read_and_ack_first(&b).await;
    drop(c);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (mut c, ack) = RawClient::connect_ack(b.addr, persistent("reader", false)).await;
    assert!(ack.session_present);
    // The same SUBSCRIBE again; the resent in-flight messages may arrive before the SUBACK.
    c.send(Packet::Subscribe(Subscribe {
        packet_id: 99,
        filters: vec![SubscribeFilter {
            filter: "$stream/events".into(),
            options: sub_opts(QoS::AtLeastOnce),
        }],
        properties: SubscribeProperties {
            subscription_identifier: Some(4),
            user_properties: vec![("stream-offset".into(), "earliest".into())],
        },
    }))
    .await;
    let mut got = Vec::new();
    let mut subacked = false;
    while got.last() != Some(&(N - 1)) || !subacked {
        let m = match c.recv().await {
            Packet::SubAck(a) => {
                assert_eq!(a.reason_codes, vec![1], "{a:?}");
                subacked = true;
                continue;
            }
            Packet::Publish(m) => {
                c.send(Packet::PubAck(PubResp::new(m.packet_id, 0))).await;
                m
            }
            other => panic!("unexpected {other:?}"),
        };
        let i = index_of(&m);
        got.push(i);
    }
    c.expect_nothing(300).await;
    assert_eq!(
        got,
        (ACKED..N).collect::<Vec<_>>(),
        "resumed after the last ack, once each"
    );
}
