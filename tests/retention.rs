//! Log retention is never blocked by a few old records (issue 13): a retained message, a
//! last value and messages queued for an offline persistent session that live in the first
//! segments are carried forward, the log shrinks to `retention_max_bytes` plus one segment,
//! and every one of them is still delivered, before and after a kill -9.
//!
//! ```sh
//! cargo build --release -p lanemq
//! cargo test --release -p lanemq-tests --test it retention::
//! ```
#![allow(clippy::unwrap_used)]

use crate::child;
use crate::common;

use child::Broker;
use common::{connect_v5, publish, sub_opts, RawClient};
use lanemq_protocol::QoS;
use std::path::Path;

const SEGMENT: u64 = 1 << 20;
const LIMIT: u64 = 2 << 20;

fn config() -> String {
    format!(
        "[storage]\nsegment_bytes_max = {SEGMENT}\nretention_max_bytes = {LIMIT}\n\
         retention_interval_s = 1\n\n\
         [[streams]]\nname = \"last\"\ntopic_filter = \"rt/last/+\"\nis_lastvalue = true\n\
         key_expression = \"message.topic.2\"\n\n"
    )
}

/// Bytes of the log's segment files.
fn log_bytes(data_dir: &Path) -> u64 {
    std::fs::read_dir(data_dir.join("log"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "seg"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn persistent(id: &str) -> lanemq_protocol::Connect {
    let mut c = connect_v5(id);
    c.clean_start = false;
    c.properties.session_expiry_interval = Some(3600);
    c
}

async fn expect_retained(b: &Broker, id: &str) {
    let mut c = RawClient::connect_ok(b.addr, connect_v5(id)).await;
    c.subscribe("rt/status", QoS::AtLeastOnce).await;
    let m = c.recv_publish_ack().await;
    assert_eq!(
        (m.topic.as_str(), &m.payload[..], m.retain),
        ("rt/status", &b"online"[..], true),
        "retained message after retention; log tail:\n{}",
        b.log_tail(30)
    );
    c.disconnect().await;
}

async fn expect_last_value(b: &Broker, id: &str) {
    let mut c = RawClient::connect_ok(b.addr, connect_v5(id)).await;
    let ack = c
        .subscribe_props(
            &[("$stream/last", sub_opts(QoS::AtLeastOnce))],
            None,
            &[("stream-offset", "earliest")],
        )
        .await;
    assert_eq!(ack.reason_codes, vec![1], "{ack:?}");
    let m = c.recv_publish_ack().await;
    assert_eq!(
        (m.topic.as_str(), &m.payload[..]),
        ("rt/last/dev1", &b"v3"[..]),
        "last value after retention; log tail:\n{}",
        b.log_tail(30)
    );
    c.expect_nothing(300).await;
    c.disconnect().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_carries_retained_last_values_and_queues() {
    let mut b = Broker::start_with_acl("retention-carry", "default allow\n", &config()).await;
    // An offline persistent session with a queue.
    let mut s = RawClient::connect_ok(b.addr, persistent("rt-sub")).await;
    s.subscribe("rt/q", QoS::AtLeastOnce).await;
    s.disconnect().await;

    let mut p = RawClient::connect_ok(b.addr, connect_v5("rt-pub")).await;
    let mut m = publish("rt/status", QoS::AtLeastOnce, p.next_pid(), b"online");
    m.retain = true;
    assert!(p.publish_acked(m).await < 0x80);
    for v in ["v1", "v2", "v3"] {
        assert!(p.publish_qos1("rt/last/dev1", v.as_bytes()).await < 0x80);
    }
    let queued: Vec<String> = (0..5).map(|i| format!("queued-{i}")).collect();
    for q in &queued {
        assert!(p.publish_qos1("rt/q", q.as_bytes()).await < 0x80);
    }
    // Six times the limit of traffic nobody keeps.
    let n = (6 * LIMIT / 1024) as u32;
    let codes = p.publish_qos1_pipelined("rt/bulk", n, 1020, 64).await;
    assert!(codes.iter().all(|&c| c < 0x80), "bulk publishes refused");
    p.disconnect().await;

    let bound = LIMIT + SEGMENT;
    let shrunk = common::eventually(20_000, || log_bytes(&b.data_dir) <= bound).await;
    assert!(
        shrunk,
        "log still {} B after retention (limit {LIMIT} + one segment {SEGMENT}); log tail:\n{}",
        log_bytes(&b.data_dir),
        b.log_tail(30)
    );
    assert!(
        b.log_tail(200).contains("carried"),
        "retention should say what it carried; log tail:\n{}",
        b.log_tail(30)
    );
    expect_retained(&b, "rt-check-1").await;
    expect_last_value(&b, "rt-check-2").await;

    // The carried copies are durable: kill -9, start again, everything is still there.
    b.kill9();
    b.restart().await;
    assert!(log_bytes(&b.data_dir) <= bound + SEGMENT);
    expect_retained(&b, "rt-check-3").await;
    expect_last_value(&b, "rt-check-4").await;
    let (mut s, ack) = RawClient::connect_ack(b.addr, persistent("rt-sub")).await;
    assert!(ack.session_present);
    let mut got = Vec::new();
    for _ in 0..queued.len() {
        let m = s.recv_publish_ack().await;
        got.push(String::from_utf8(m.payload.to_vec()).unwrap());
    }
    assert_eq!(got, queued, "queued messages after retention and kill -9");
    s.expect_nothing(300).await;
    s.disconnect().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_carries_spilled_queue() {
    // A small session buffer: most of the offline session's queue is spilled (log positions).
    let cfg = format!("[mqtt]\noutbound_buffer_bytes_max = 4096\n\n{}", config());
    let mut b = Broker::start_with_acl("retention-spilled", "default allow\n", &cfg).await;
    let mut s = RawClient::connect_ok(b.addr, persistent("rt-slow")).await;
    s.subscribe("rt/q", QoS::AtLeastOnce).await;
    s.disconnect().await;
    let mut p = RawClient::connect_ok(b.addr, connect_v5("rt-pub2")).await;
    let want: Vec<String> = (0..200)
        .map(|i| format!("{i:04}{}", "x".repeat(200)))
        .collect();
    for q in &want {
        assert!(p.publish_qos1("rt/q", q.as_bytes()).await < 0x80);
    }
    let n = (6 * LIMIT / 1024) as u32;
    let codes = p.publish_qos1_pipelined("rt/bulk", n, 1020, 64).await;
    assert!(codes.iter().all(|&c| c < 0x80));
    p.disconnect().await;
    let bound = LIMIT + SEGMENT;
    let shrunk = common::eventually(20_000, || log_bytes(&b.data_dir) <= bound).await;
    assert!(
        shrunk,
        "log still {} B; log tail:\n{}",
        log_bytes(&b.data_dir),
        b.log_tail(30)
    );
    let (mut s, ack) = RawClient::connect_ack(b.addr, persistent("rt-slow")).await;
    assert!(ack.session_present);
    let mut got = Vec::new();
    for _ in 0..want.len() {
        let m = s.recv_publish_ack().await;
        got.push(String::from_utf8(m.payload.to_vec()).unwrap());
    }
    assert_eq!(got, want, "queued messages after retention");
    s.expect_nothing(300).await;
    s.disconnect().await;
    b.kill9();
    b.restart().await;
    let (mut s, _) = RawClient::connect_ack(b.addr, persistent("rt-slow")).await;
    s.expect_nothing(500).await;
    s.disconnect().await;
}
