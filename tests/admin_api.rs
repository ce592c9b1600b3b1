//! The REST admin API (`/api/v5`, docs/admin-api.md) over real TCP and HTTP against a real
//! broker: an in-process [`TestServer`] with `admin.enable = true` on `127.0.0.1:0`, and the
//! real `lanemq` binary for the restart and `lanemq streams ...` tests.
//!
//! ```sh
//! cargo build -p lanemq          # the child-process tests run the binary
//! cargo nextest run -p lanemq-tests --test it admin_api::
//! ```
//!
//! The binary: `LANEMQ_BIN`, else the newest of target/{release,debug}/lanemq and
//! `$CARGO_TARGET_DIR`/{release,debug}/lanemq. `KEEP_TMP=1` keeps data dirs and broker logs.
#![allow(clippy::unwrap_used)]

use crate::common;

use crate::child;

use common::*;
use lanemq_admin::client;
use lanemq_broker::Config;
use lanemq_protocol::reason as rc;
use lanemq_protocol::{Packet, Publish, QoS};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const TOKEN: &str = "admin-api-test-token";
const EARLIEST: &[(&str, &str)] = &[("stream-offset", "earliest")];

// --- helpers ------------------------------------------------------------------------------

/// A stream-friendly test configuration (permissive ACL) with the REST API on 127.0.0.1:0
/// and a configured token.
fn admin_config() -> Config {
    let mut cfg = stream_config();
    cfg.admin.enable = true;
    cfg.admin.bind = SocketAddr::from(([127, 0, 0, 1], 0));
    cfg.admin.token = Some(TOKEN.to_string());
    cfg
}

/// The admin API of a server: address and token.
#[derive(Clone)]
struct Api {
    addr: String,
    token: String,
}

impl Api {
    fn of(s: &TestServer) -> Api {
        let addr = s
            .server()
            .admin_addr()
            .expect("the admin API is enabled")
            .to_string();
        Api {
            addr,
            token: TOKEN.to_string(),
        }
    }

    /// A request with the token and, when given, a JSON body; the status and the parsed
    /// body (`Null` when empty).
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let (status, text) = self
            .call_text(method, path, body.map(|b| b.to_string()))
            .await;
        (status, parse(&text))
    }

    /// Like [`Api::call`] with a body sent as is (not necessarily JSON).
    async fn call_text(&self, method: &str, path: &str, body: Option<String>) -> (u16, String) {
        let (addr, token, method, path) = (
            self.addr.clone(),
            self.token.clone(),
            method.to_string(),
            path.to_string(),
        );
        tokio::task::spawn_blocking(move || {
            client::request(&addr, &token, &method, &path, body.as_deref())
        })
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("admin API request failed: {e}"))
    }

    /// A request with exactly these headers (no token unless given).
    async fn raw(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> client::Response {
        let addr = self.addr.clone();
        let method = method.to_string();
        let path = path.to_string();
        let headers: Vec<(String, String)> = headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        let body = body.map(|b| b.as_bytes().to_vec());
        tokio::task::spawn_blocking(move || {
            let h: Vec<(&str, &str)> = headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            client::request_with_headers(&addr, &method, &path, &h, body.as_deref())
        })
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("admin API request failed: {e}"))
    }

    async fn create(&self, body: Value) -> Value {
        let (status, v) = self.call("POST", "/api/v5/streams", Some(body)).await;
        assert_eq!(status, 200, "POST /api/v5/streams: {v}");
        v
    }

    async fn get_stream(&self, name: &str) -> Value {
        let (status, v) = self
            .call("GET", &format!("/api/v5/stream/{name}"), None)
            .await;
        assert_eq!(status, 200, "GET /api/v5/stream/{name}: {v}");
        v
    }

    /// GET the stream until `pred` holds (bounded: 10 s); returns the last answer.
    async fn wait_stream(&self, name: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let v = self.get_stream(name).await;
            if pred(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "{name}: never {what}; last: {v}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Every stream name, following the cursor with pages of `limit`.
    async fn all_names(&self, limit: usize) -> Vec<String> {
        let mut names = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..10_000 {
            let mut path = format!("/api/v5/streams?limit={limit}");
            if let Some(c) = &cursor {
                path.push_str(&format!("&cursor={c}"));
            }
            let (status, page) = self.call("GET", &path, None).await;
            assert_eq!(status, 200, "GET {path}: {page}");
            for s in page["data"].as_array().unwrap() {
                names.push(s["name"].as_str().unwrap().to_string());
            }
            if !page["meta"]["hasnext"].as_bool().unwrap() {
                return names;
            }
            cursor = Some(page["meta"]["cursor"].as_str().unwrap().to_string());
        }
        panic!("the cursor never ended");
    }
}

fn parse(text: &str) -> Value {
    if text.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
    }
}

/// Asserts an error answer: the status, `{"code": code, "message": <non-empty>}` and nothing
/// else; returns the message.
fn assert_error(status: u16, v: &Value, want_status: u16, code: &str) -> String {
    assert_eq!(status, want_status, "status of {v}");
    assert_eq!(v["code"], code, "code of {v}");
    let msg = v["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no message in {v}"));
    assert!(!msg.is_empty(), "empty message in {v}");
    assert_eq!(
        v.as_object().unwrap().len(),
        2,
        "only code and message: {v}"
    );
    msg.to_string()
}

async fn admin_server() -> (TestServer, Api) {
    let s = TestServer::start(admin_config()).await;
    let api = Api::of(&s);
    (s, api)
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

fn payload(p: &Publish) -> String {
    String::from_utf8(p.payload.to_vec()).unwrap()
}

async fn publish_n(c: &mut RawClient, topic: &str, range: std::ops::Range<usize>) {
    for i in range {
        let code = c.publish_qos1(topic, format!("m{i}").as_bytes()).await;
        assert!(code == 0 || code == 0x10, "PUBACK 0x{code:02X}");
    }
}

/// Subscribes to a stream at QoS 1 with user properties; asserts QoS 1 is granted.
async fn sub_stream(c: &mut RawClient, filter: &str, props: &[(&str, &str)]) {
    let ack = c
        .subscribe_props(&[(filter, sub_opts(QoS::AtLeastOnce))], None, props)
        .await;
    assert_eq!(ack.reason_codes, vec![1], "SUBACK for {filter}: {ack:?}");
}

async fn recv_n(c: &mut RawClient, n: usize) -> Vec<Publish> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(c.recv_publish_ack().await);
    }
    v
}

fn payloads(v: &[Publish]) -> Vec<String> {
    v.iter().map(payload).collect()
}

fn expected(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("m{i}")).collect()
}

// --- create, publish, replay, figures -----------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_created_by_post_captures_mqtt_publishes_and_replays_them_from_earliest() {
    let (s, api) = admin_server().await;
    let created = api
        .create(json!({ "name": "orders", "topic_filter": "orders/#" }))
        .await;
    // Defaults of everything not given, the creation time, empty figures.
    assert_eq!(created["name"], "orders");
    assert_eq!(created["topic_filter"], "orders/#");
    assert_eq!(created["is_lastvalue"], false);
    assert_eq!(created["key_expression"], "message.from");
    assert_eq!(created["data_retention_period"], "7d");
    assert_eq!(
        created["limits"],
        json!({ "max_message_count": "infinity", "max_message_bytes": "infinity" })
    );
    assert_eq!(created["read_max_unacked"], 1000);
    let created_at = created["created_at_us"].as_u64().unwrap();
    assert!(created_at.abs_diff(now_us()) < 60_000_000, "{created}");
    assert_eq!(created["stats"]["message_count"], 0);
    assert_eq!(created["stats"]["subscribers"], 0);

    let mut p = s.v5("pub").await;
    for i in 0..5 {
        let topic = format!("orders/{i}");
        assert!(p.publish_qos1(&topic, format!("m{i}").as_bytes()).await < 0x80);
    }
    // Not captured: outside the filter.
    assert!(p.publish_qos1("other/x", b"nope").await < 0x80);

    let mut c = s.v5("reader").await;
    sub_stream(&mut c, "$stream/orders", EARLIEST).await;
    let got = recv_n(&mut c, 5).await;
    assert_eq!(payloads(&got), expected(0..5));
    let topics: Vec<&str> = got.iter().map(|m| m.topic.as_str()).collect();
    assert_eq!(
        topics,
        ["orders/0", "orders/1", "orders/2", "orders/3", "orders/4"]
    );
    let offs: Vec<u64> = got.iter().map(stream_offset_of).collect();
    assert!(offs.windows(2).all(|w| w[0] < w[1]), "{offs:?}");
    c.expect_nothing(QUIET_MS).await;
    // Then live.
    publish_n(&mut p, "orders/9", 5..6).await;
    assert_eq!(payload(&c.recv_publish_ack().await), "m5");
}

/// `GET /stream/{name}/messages` reads what MQTT replays, with the same positions, and its
/// `next` follows the stream live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_messages_over_http_match_the_mqtt_replay_and_follow_live() {
    let (s, api) = admin_server().await;
    api.create(json!({ "name": "viewer", "topic_filter": "v/#" }))
        .await;
    let mut p = s.v5("pub").await;
    publish_n(&mut p, "v/a", 0..5).await;
    assert!(p.publish_qos1("w/x", b"outside").await < 0x80);
    let mut c = s.v5("reader").await;
    sub_stream(&mut c, "$stream/viewer", EARLIEST).await;
    let replay = recv_n(&mut c, 5).await;
    let mqtt_offsets: Vec<String> = replay
        .iter()
        .map(|m| format!("@{}", stream_offset_of(m)))
        .collect();

    let (st, v) = api
        .call("GET", "/api/v5/stream/viewer/messages?limit=3", None)
        .await;
    assert_eq!(st, 200, "{v}");
    let page1 = v["data"].as_array().unwrap().clone();
    assert_eq!(page1.len(), 3, "{v}");
    let (st, v2) = api
        .call(
            "GET",
            &format!(
                "/api/v5/stream/viewer/messages?offset={}",
                v["next"].as_str().unwrap()
            ),
            None,
        )
        .await;
    assert_eq!(st, 200, "{v2}");
    let all: Vec<Value> = page1
        .into_iter()
        .chain(v2["data"].as_array().unwrap().iter().cloned())
        .collect();
    let http_offsets: Vec<String> = all
        .iter()
        .map(|m| m["offset"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        http_offsets, mqtt_offsets,
        "the same positions as the MQTT replay"
    );
    let texts: Vec<&str> = all.iter().map(|m| m["payload"].as_str().unwrap()).collect();
    assert_eq!(texts, ["m0", "m1", "m2", "m3", "m4"]);
    assert_eq!(all[0]["topic"], "v/a");
    assert_eq!(all[0]["from_clientid"], "pub");
    assert_eq!(all[0]["payload_encoding"], "utf8");
    let ts = all[0]["ts"].as_u64().unwrap();
    assert!(
        (ts * 1000).abs_diff(now_us()) < 60_000_000,
        "ts in ms: {ts}"
    );

    // Nothing new: `next` stays; a new publish then shows up after it.
    let next = v2["next"].as_str().unwrap().to_string();
    let path = format!("/api/v5/stream/viewer/messages?offset={next}");
    let (_, v3) = api.call("GET", &path, None).await;
    assert_eq!(v3["data"], json!([]), "{v3}");
    assert_eq!(v3["next"], next.as_str());
    publish_n(&mut p, "v/b", 5..6).await;
    let mut got = Value::Null;
    for _ in 0..100 {
        let (_, v4) = api.call("GET", &path, None).await;
        if v4["data"].as_array().is_some_and(|a| !a.is_empty()) {
            got = v4;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(got["data"][0]["payload"], "m5", "{got}");
    assert_eq!(got["data"][0]["topic"], "v/b");

    // A binary payload comes back in base64; `latest` gives nothing old.
    assert!(p.publish_qos1("v/bin", &[0xff, 0x00, 0x01]).await < 0x80);
    // The stream indexer runs after the PUBACK: wait (bounded) until it has the message.
    let mut bin = Value::Null;
    for _ in 0..100 {
        let (_, v5) = api
            .call(
                "GET",
                &format!("/api/v5/stream/viewer/messages?offset={next}&limit=10"),
                None,
            )
            .await;
        if let Some(last) = v5["data"]
            .as_array()
            .and_then(|a| a.last())
            .filter(|m| m["topic"] == "v/bin")
        {
            bin = last.clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        (bin["payload"].as_str(), bin["payload_encoding"].as_str()),
        (Some("/wAB"), Some("base64"))
    );
    let (_, v6) = api
        .call("GET", "/api/v5/stream/viewer/messages?offset=latest", None)
        .await;
    assert_eq!(v6["data"], json!([]), "{v6}");
    let (st, v7) = api.call("GET", "/api/v5/stream/none/messages", None).await;
    assert_error(st, &v7, 404, "NOT_FOUND");
    let (st, v8) = api
        .call(
            "GET",
            "/api/v5/stream/viewer/messages?offset=yesterday",
            None,
        )
        .await;
    assert_error(st, &v8, 400, "BAD_REQUEST");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_stream_figures_follow_published_messages_and_subscribers() {
    let (s, api) = admin_server().await;
    api.create(json!({ "name": "figs", "topic_filter": "figs/#" }))
        .await;
    let empty = api.get_stream("figs").await;
    assert_eq!(
        empty["stats"],
        json!({
            "message_count": 0,
            "message_bytes": 0,
            "oldest_timestamp_us": null,
            "newest_timestamp_us": null,
            "subscribers": 0,
            "keyless_messages": 0,
        })
    );

    let before = now_us();
    let mut p = s.v5("pub").await;
    // Topic "figs/a" (6 bytes) + payload "hello" (5 bytes) = 11 bytes per message.
    for _ in 0..3 {
        assert!(p.publish_qos1("figs/a", b"hello").await < 0x80);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let after = now_us();
    let v = api
        .wait_stream("figs", "3 messages", |v| v["stats"]["message_count"] == 3)
        .await;
    let st = &v["stats"];
    assert_eq!(st["message_bytes"], 33, "{v}");
    let oldest = st["oldest_timestamp_us"].as_u64().unwrap();
    let newest = st["newest_timestamp_us"].as_u64().unwrap();
    assert!(
        before <= oldest && oldest < newest && newest <= after,
        "{before} <= {oldest} < {newest} <= {after}"
    );
    assert_eq!(st["subscribers"], 0);

    let mut c = s.v5("reader").await;
    sub_stream(&mut c, "$stream/figs", &[]).await;
    let v = api
        .wait_stream("figs", "1 subscriber", |v| v["stats"]["subscribers"] == 1)
        .await;
    assert_eq!(v["stats"]["message_count"], 3);
    // The list carries the same figures.
    let (status, page) = api.call("GET", "/api/v5/streams", None).await;
    assert_eq!(status, 200);
    assert_eq!(page["data"][0]["name"], "figs");
    assert_eq!(page["data"][0]["stats"]["message_count"], 3);
    assert_eq!(page["data"][0]["stats"]["subscribers"], 1);
    // The broker statistics count the streams too.
    let (status, stats) = api.call("GET", "/api/v5/stats", None).await;
    assert_eq!(status, 200, "{stats}");
    assert_eq!(stats["streams"]["streams"], 1, "{stats}");
    assert_eq!(stats["broker"]["clients_connected"], 2, "{stats}");
    assert!(stats["broker"]["messages_received"].as_u64().unwrap() >= 3);
    assert!(stats["version"].is_string() && stats["uptime_s"].is_u64());

    // A second subscriber (with a filter), then unsubscribe and disconnect.
    let mut c2 = s.v5("reader2").await;
    sub_stream(&mut c2, "$stream/figs/figs/#", &[]).await;
    api.wait_stream("figs", "2 subscribers", |v| v["stats"]["subscribers"] == 2)
        .await;
    c2.unsubscribe("$stream/figs/figs/#").await;
    api.wait_stream("figs", "1 subscriber", |v| v["stats"]["subscribers"] == 1)
        .await;
    c.disconnect().await;
    api.wait_stream("figs", "0 subscribers", |v| v["stats"]["subscribers"] == 0)
        .await;
}

// --- listing ------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_follow_the_cursor_and_see_every_stream_once() {
    let (_s, api) = admin_server().await;
    let mut names: Vec<String> = (0..8).map(|i| format!("page-{i:02}")).collect();
    // Created out of order: the list is sorted by name.
    names.reverse();
    for n in &names {
        api.create(json!({ "name": n, "topic_filter": format!("pg/{n}") }))
            .await;
    }
    names.sort();

    let (status, first) = api.call("GET", "/api/v5/streams?limit=3", None).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(
        first["meta"],
        json!({ "hasnext": true, "limit": 3, "count": 3, "cursor": "page-02" })
    );
    let (_, second) = api
        .call("GET", "/api/v5/streams?limit=3&cursor=page-02", None)
        .await;
    assert_eq!(second["data"][0]["name"], "page-03");
    let (_, last) = api
        .call("GET", "/api/v5/streams?limit=3&cursor=page-05", None)
        .await;
    // The last page has no cursor.
    assert_eq!(
        last["meta"],
        json!({ "hasnext": false, "limit": 3, "count": 2 })
    );

    for limit in [1, 3, 7, 8, 100] {
        let seen = api.all_names(limit).await;
        assert_eq!(seen, names, "pages of {limit}");
    }
    // The default page holds up to 100; the alias path lists the same.
    let (_, all) = api.call("GET", "/api/v5/streams", None).await;
    assert_eq!(all["meta"]["limit"], 100);
    assert_eq!(all["meta"]["count"], 8);
    let (_, alias) = api
        .call("GET", "/api/v5/message_streams/streams?limit=3", None)
        .await;
    assert_eq!(alias, first);
    // A cursor need not name a stream: it is "after this name".
    let (_, mid) = api
        .call("GET", "/api/v5/streams?limit=2&cursor=page-04x", None)
        .await;
    assert_eq!(mid["data"][0]["name"], "page-05");
    let (_, past) = api.call("GET", "/api/v5/streams?cursor=zzz", None).await;
    assert_eq!(past["data"], json!([]));
    assert_eq!(past["meta"]["hasnext"], false);

    for bad in ["limit=0", "limit=10001", "limit=-1", "limit=abc"] {
        let (status, v) = api
            .call("GET", &format!("/api/v5/streams?{bad}"), None)
            .await;
        assert_error(status, &v, 400, "BAD_REQUEST");
    }
    let (status, _) = api.call("GET", "/api/v5/streams?limit=10000", None).await;
    assert_eq!(status, 200);
}

// --- errors -------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_bodies_are_400_with_code_and_message_and_create_nothing() {
    let (_s, api) = admin_server().await;
    let cases: &[(&str, Value, &str)] = &[
        (
            "unknown field",
            json!({ "name": "a", "topic_filter": "t/#", "colour": "red" }),
            "unknown field `colour`",
        ),
        (
            "bad name",
            json!({ "name": "-a", "topic_filter": "t/#" }),
            "name:",
        ),
        (
            "name with a slash",
            json!({ "name": "a/b", "topic_filter": "t/#" }),
            "name:",
        ),
        (
            "bad filter",
            json!({ "name": "a", "topic_filter": "t/#/x" }),
            "topic_filter:",
        ),
        (
            "stream filter",
            json!({ "name": "a", "topic_filter": "$stream/x" }),
            "topic_filter:",
        ),
        (
            "shared filter",
            json!({ "name": "a", "topic_filter": "$share/g/t" }),
            "topic_filter:",
        ),
        (
            "bad key expression",
            json!({ "name": "a", "topic_filter": "t/#", "key_expression": "message.colour" }),
            "key_expression:",
        ),
        (
            "missing filter",
            json!({ "name": "a" }),
            "missing field `topic_filter`",
        ),
        (
            "bad duration",
            json!({ "name": "a", "topic_filter": "t", "data_retention_period": "7 days" }),
            "invalid duration",
        ),
        (
            "zero retention",
            json!({ "name": "a", "topic_filter": "t", "data_retention_period": "0s" }),
            "data_retention_period:",
        ),
        (
            "read_max_unacked 0",
            json!({ "name": "a", "topic_filter": "t", "read_max_unacked": 0 }),
            "read_max_unacked:",
        ),
        (
            "unknown limit field",
            json!({ "name": "a", "topic_filter": "t", "limits": { "max_messages": 1 } }),
            "unknown field `max_messages`",
        ),
        ("not an object", json!([1, 2]), "invalid request body"),
    ];
    for (what, body, needle) in cases {
        let (status, v) = api
            .call("POST", "/api/v5/streams", Some(body.clone()))
            .await;
        let msg = assert_error(status, &v, 400, "BAD_REQUEST");
        assert!(msg.contains(needle), "{what}: {msg:?} lacks {needle:?}");
    }
    // Several problems at once: all reported.
    let (status, v) = api
        .call(
            "POST",
            "/api/v5/streams",
            Some(json!({ "name": "-", "topic_filter": "#/x", "key_expression": "x" })),
        )
        .await;
    let msg = assert_error(status, &v, 400, "BAD_REQUEST");
    for f in ["name:", "topic_filter:", "key_expression:"] {
        assert!(msg.contains(f), "{msg:?} lacks {f}");
    }
    // Not JSON, and no JSON content type.
    let (status, text) = api
        .call_text("POST", "/api/v5/streams", Some("{not json".into()))
        .await;
    assert_error(status, &parse(&text), 400, "BAD_REQUEST");
    let auth = format!("Bearer {TOKEN}");
    let r = api
        .raw(
            "POST",
            "/api/v5/streams",
            &[("Authorization", &auth), ("Content-Type", "text/plain")],
            Some(r#"{"name":"a","topic_filter":"t"}"#),
        )
        .await;
    let msg = assert_error(r.status, &parse(&r.body), 400, "BAD_REQUEST");
    assert!(msg.contains("Content-Type: application/json"), "{msg}");
    // Too large.
    let big = format!(
        r#"{{"name":"a","topic_filter":"t","key_expression":"{}"}}"#,
        "x".repeat(lanemq_admin::BODY_LIMIT)
    );
    let (status, text) = api.call_text("POST", "/api/v5/streams", Some(big)).await;
    assert_error(status, &parse(&text), 413, "PAYLOAD_TOO_LARGE");

    assert!(api.all_names(100).await.is_empty(), "nothing was created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_streams_and_paths_are_404_and_wrong_methods_405() {
    let (_s, api) = admin_server().await;
    for (method, path, body) in [
        ("GET", "/api/v5/stream/nope", None),
        ("DELETE", "/api/v5/stream/nope", None),
        (
            "PUT",
            "/api/v5/stream/nope",
            Some(json!({ "topic_filter": "t" })),
        ),
        ("GET", "/api/v5/message_streams/streams/nope", None),
    ] {
        let (status, v) = api.call(method, path, body).await;
        let msg = assert_error(status, &v, 404, "NOT_FOUND");
        assert!(msg.contains("\"nope\" not found"), "{method} {path}: {msg}");
    }
    for path in [
        "/api/v5/nothing",
        "/api/v4/streams",
        "/nowhere",
        "/api/v5/stream/a/b",
    ] {
        let (status, v) = api.call("GET", path, None).await;
        let msg = assert_error(status, &v, 404, "NOT_FOUND");
        assert!(msg.starts_with("no endpoint GET"), "{path}: {msg}");
    }
    let auth = format!("Bearer {TOKEN}");
    for (method, path, allow) in [
        ("PATCH", "/api/v5/streams", ["GET", "POST"].as_slice()),
        ("POST", "/api/v5/stream/x", &["GET", "PUT", "DELETE"]),
        ("DELETE", "/api/v5/streams/config", &["GET", "PUT"]),
        ("GET", "/api/v5/authorization/reload", &["POST"]),
    ] {
        let r = api
            .raw(method, path, &[("Authorization", &auth)], None)
            .await;
        let msg = assert_error(r.status, &parse(&r.body), 405, "METHOD_NOT_ALLOWED");
        assert!(msg.contains(method), "{msg}");
        let header = r
            .header("allow")
            .unwrap_or_else(|| panic!("{method} {path}: no Allow header"));
        for m in allow {
            assert!(
                header.contains(m),
                "{method} {path}: Allow {header:?} lacks {m}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_an_existing_stream_is_409_and_keeps_the_original() {
    let (_s, api) = admin_server().await;
    api.create(json!({ "name": "dup", "topic_filter": "one/#" }))
        .await;
    for path in ["/api/v5/streams", "/api/v5/message_streams/streams"] {
        let (status, v) = api
            .call(
                "POST",
                path,
                Some(json!({ "name": "dup", "topic_filter": "two/#" })),
            )
            .await;
        let msg = assert_error(status, &v, 409, "ALREADY_EXISTS");
        assert!(msg.contains("\"dup\" already exists"), "{msg}");
    }
    assert_eq!(api.get_stream("dup").await["topic_filter"], "one/#");
    assert_eq!(api.all_names(100).await, ["dup"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_or_with_a_wrong_token_are_401() {
    let (_s, api) = admin_server().await;
    let body = r#"{"name":"sneaky","topic_filter":"t"}"#;
    let wrong = format!("Bearer {TOKEN}x");
    let basic = "Basic YWRtaW46cHVibGlj";
    let bare = TOKEN.to_string();
    let header_sets: Vec<Vec<(&str, &str)>> = vec![
        vec![],
        vec![("Authorization", wrong.as_str())],
        vec![("Authorization", basic)],
        vec![("Authorization", bare.as_str())],
        vec![("Authorization", "Bearer ")],
    ];
    for headers in &header_sets {
        for (method, path) in [
            ("GET", "/api/v5/streams"),
            ("POST", "/api/v5/streams"),
            ("GET", "/api/v5/openapi.json"),
            ("POST", "/api/v5/authorization/reload"),
            ("DELETE", "/api/v5/stream/x"),
            ("GET", "/api/v5/nothing"),
        ] {
            let mut h = headers.clone();
            h.push(("Content-Type", "application/json"));
            let b = (method == "POST").then_some(body);
            let r = api.raw(method, path, &h, b).await;
            assert_error(r.status, &parse(&r.body), 401, "BAD_TOKEN");
            assert_eq!(
                r.header("www-authenticate"),
                Some("Bearer realm=\"lanemq\""),
                "{method} {path} {headers:?}"
            );
        }
    }
    // Nothing was created; the right token (any case of "Bearer") works.
    let lower = format!("bearer {TOKEN}");
    let r = api
        .raw("GET", "/api/v5/streams", &[("Authorization", &lower)], None)
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(parse(&r.body)["data"], json!([]));
}

// --- update, delete -----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_stream_replaces_the_mutable_fields_and_refuses_the_fixed_ones() {
    let (_s, api) = admin_server().await;
    let created = api
        .create(json!({ "name": "upd", "topic_filter": "u/#", "data_retention_period": "2d" }))
        .await;
    let (status, v) = api
        .call(
            "PUT",
            "/api/v5/stream/upd",
            Some(json!({
                "topic_filter": "u/#",
                "key_expression": "message.topic",
                "data_retention_period": "1h",
                "limits": { "max_message_count": 10, "max_message_bytes": "1MB" },
                "read_max_unacked": 5,
            })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["name"], "upd");
    assert_eq!(v["key_expression"], "message.topic");
    assert_eq!(v["data_retention_period"], "1h");
    assert_eq!(
        v["limits"],
        json!({ "max_message_count": 10, "max_message_bytes": 1_048_576 })
    );
    assert_eq!(v["read_max_unacked"], 5);
    assert_eq!(v["created_at_us"], created["created_at_us"]);
    assert_eq!(api.get_stream("upd").await, v);

    // The body replaces the whole definition: what it omits goes back to the default.
    let (status, v) = api
        .call(
            "PUT",
            "/api/v5/message_streams/streams/upd",
            Some(json!({ "name": "upd", "topic_filter": "u/#", "read_max_unacked": 7 })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["read_max_unacked"], 7);
    assert_eq!(v["data_retention_period"], "7d");
    assert_eq!(v["key_expression"], "message.from");
    assert_eq!(v["limits"]["max_message_count"], "infinity");

    // A fixed field that differs conflicts with the stream as it is: 409.
    for (body, needle) in [
        (json!({ "topic_filter": "other/#" }), "topic_filter"),
        (
            json!({ "topic_filter": "u/#", "is_lastvalue": true }),
            "is_lastvalue",
        ),
    ] {
        let (status, e) = api
            .call("PUT", "/api/v5/stream/upd", Some(body.clone()))
            .await;
        let msg = assert_error(status, &e, 409, "CONFLICT");
        assert!(msg.contains(needle), "{body}: {msg:?} lacks {needle:?}");
    }
    let refused: &[(Value, &str)] = &[
        (
            json!({ "name": "renamed", "topic_filter": "u/#" }),
            "cannot be renamed",
        ),
        (
            json!({ "name": 5, "topic_filter": "u/#" }),
            "cannot be renamed",
        ),
        (
            json!({ "topic_filter": "u/#", "read_max_unacked": 70000 }),
            "read_max_unacked:",
        ),
        (
            json!({ "topic_filter": "u/#", "key_expression": "nope" }),
            "key_expression:",
        ),
        (
            json!({ "topic_filter": "u/#", "x": 1 }),
            "unknown field `x`",
        ),
        (
            json!({ "read_max_unacked": 3 }),
            "missing field `topic_filter`",
        ),
        (json!("text"), "expected a JSON object"),
    ];
    for (body, needle) in refused {
        let (status, e) = api
            .call("PUT", "/api/v5/stream/upd", Some(body.clone()))
            .await;
        let msg = assert_error(status, &e, 400, "BAD_REQUEST");
        assert!(msg.contains(needle), "{body}: {msg:?} lacks {needle:?}");
    }
    assert_eq!(
        api.get_stream("upd").await,
        v,
        "refused updates change nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_stream_lowering_a_count_limit_trims_the_oldest_messages_at_once() {
    let (s, api) = admin_server().await;
    api.create(json!({ "name": "trim", "topic_filter": "tr/#" }))
        .await;
    let mut p = s.v5("pub").await;
    publish_n(&mut p, "tr/1", 0..5).await;
    api.wait_stream("trim", "5 messages", |v| v["stats"]["message_count"] == 5)
        .await;
    let (status, v) = api
        .call(
            "PUT",
            "/api/v5/stream/trim",
            Some(json!({ "topic_filter": "tr/#", "limits": { "max_message_count": 2 } })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stats"]["message_count"], 2, "{v}");
    let mut c = s.v5("reader").await;
    sub_stream(&mut c, "$stream/trim", EARLIEST).await;
    assert_eq!(payloads(&recv_n(&mut c, 2).await), expected(3..5));
    c.expect_nothing(QUIET_MS).await;
    // Later publishes keep the newest two.
    publish_n(&mut p, "tr/1", 5..6).await;
    assert_eq!(payload(&c.recv_publish_ack().await), "m5");
    api.wait_stream("trim", "2 messages", |v| {
        v["stats"]["message_count"] == 2
            && v["stats"]["newest_timestamp_us"] != v["stats"]["oldest_timestamp_us"]
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_ends_delivery_to_a_subscriber_that_stays_connected() {
    let (s, api) = admin_server().await;
    api.create(json!({ "name": "gone", "topic_filter": "g/#" }))
        .await;
    let mut c = s.v5("c").await;
    sub_stream(&mut c, "$stream/gone", &[]).await;
    c.subscribe("plain/#", QoS::AtLeastOnce).await;
    let mut p = s.v5("pub").await;
    publish_n(&mut p, "g/1", 0..2).await;
    assert_eq!(payloads(&recv_n(&mut c, 2).await), expected(0..2));

    let (status, text) = api.call_text("DELETE", "/api/v5/stream/gone", None).await;
    assert_eq!((status, text.as_str()), (204, ""));
    let (status, v) = api.call("GET", "/api/v5/stream/gone", None).await;
    assert_error(status, &v, 404, "NOT_FOUND");
    let (status, v) = api.call("DELETE", "/api/v5/stream/gone", None).await;
    assert_error(status, &v, 404, "NOT_FOUND");

    publish_n(&mut p, "g/1", 2..5).await;
    c.expect_nothing(500).await;
    // Still connected: a plain subscription delivers, PINGREQ is answered.
    publish_n(&mut p, "plain/x", 5..6).await;
    let m = c.recv_publish_ack().await;
    assert_eq!((m.topic.as_str(), payload(&m).as_str()), ("plain/x", "m5"));
    assert!(c.sync().await.is_empty());
    // A stream created again under the same name starts empty.
    api.create(json!({ "name": "gone", "topic_filter": "g/#" }))
        .await;
    assert_eq!(api.get_stream("gone").await["stats"]["message_count"], 0);
    let mut r = s.v5("r").await;
    sub_stream(&mut r, "$stream/gone", EARLIEST).await;
    r.expect_nothing(QUIET_MS).await;
    let (status, _) = api.call("DELETE", "/api/v5/stream/gone", None).await;
    assert_eq!(status, 204);
    // The alias path deletes too.
    api.create(json!({ "name": "gone2", "topic_filter": "g2/#" }))
        .await;
    let (status, _) = api
        .call("DELETE", "/api/v5/message_streams/streams/gone2", None)
        .await;
    assert_eq!(status, 204);
    assert!(api.all_names(100).await.is_empty());
}

// --- global settings ----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_config_get_and_put_replace_the_global_settings() {
    let (_s, api) = admin_server().await;
    let defaults = json!({
        "enable": true,
        "max_stream_count": 1000,
        "gc_interval": "1h",
        "regular_stream_retention_period": "7d",
        "check_stream_status_interval": "10s",
        "auto_create": { "regular": false, "lastvalue": { "key_expression": "message.from" } },
    });
    for path in ["/api/v5/streams/config", "/api/v5/message_streams/config"] {
        let (status, v) = api.call("GET", path, None).await;
        assert_eq!((status, &v), (200, &defaults), "{path}");
    }

    let (status, v) = api
        .call(
            "PUT",
            "/api/v5/streams/config",
            Some(json!({
                "max_stream_count": 2,
                "gc_interval": "30s",
                "auto_create": { "regular": true, "lastvalue": false },
            })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let want = json!({
        "enable": true,
        "max_stream_count": 2,
        "gc_interval": "30s",
        "regular_stream_retention_period": "7d",
        "check_stream_status_interval": "10s",
        "auto_create": { "regular": true, "lastvalue": false },
    });
    assert_eq!(v, want);
    let (_, got) = api
        .call("GET", "/api/v5/message_streams/config", None)
        .await;
    assert_eq!(got, want);

    // max_stream_count is in force.
    api.create(json!({ "name": "one", "topic_filter": "a" }))
        .await;
    api.create(json!({ "name": "two", "topic_filter": "b" }))
        .await;
    let (status, e) = api
        .call(
            "POST",
            "/api/v5/streams",
            Some(json!({ "name": "three", "topic_filter": "c" })),
        )
        .await;
    let msg = assert_error(status, &e, 400, "MAX_STREAM_COUNT_REACHED");
    assert!(msg.contains("limit of 2 streams"), "{msg}");

    for (body, needle) in [
        (json!({ "max_stream_count": 0 }), "max_stream_count:"),
        (json!({ "gc_interval": "500ms" }), "gc_interval:"),
        (json!({ "enabled": false }), "unknown field `enabled`"),
        (
            json!({ "auto_create": { "lastvalue": { "key_expression": "bad" } } }),
            "auto_create.lastvalue.key_expression:",
        ),
    ] {
        let (status, e) = api
            .call("PUT", "/api/v5/streams/config", Some(body.clone()))
            .await;
        let msg = assert_error(status, &e, 400, "BAD_REQUEST");
        assert!(msg.contains(needle), "{body}: {msg:?} lacks {needle:?}");
    }
    let (_, got) = api.call("GET", "/api/v5/streams/config", None).await;
    assert_eq!(got, want, "refused settings change nothing");

    // An empty object puts the defaults back.
    let (status, v) = api
        .call("PUT", "/api/v5/message_streams/config", Some(json!({})))
        .await;
    assert_eq!((status, &v), (200, &defaults));

    // Streams off: creating one is 503.
    let (status, v) = api
        .call(
            "PUT",
            "/api/v5/streams/config",
            Some(json!({ "enable": false })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let (status, e) = api
        .call(
            "POST",
            "/api/v5/streams",
            Some(json!({ "name": "three", "topic_filter": "c" })),
        )
        .await;
    assert_error(status, &e, 503, "SERVICE_UNAVAILABLE");
}

// --- authorization reload -----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_reload_applies_a_rewritten_acl_and_keeps_the_old_rules_on_error() {
    let acl_dir = child::TempDir::new("admin-acl");
    let acl = acl_dir.0.join("rules.acl");
    std::fs::write(&acl, "default deny\nallow all publish filter:#\n").unwrap();
    let mut cfg = admin_config();
    cfg.server.acl_file = Some(acl.clone());
    let s = TestServer::start(cfg).await;
    let api = Api::of(&s);

    let mut c = s.v5("c").await;
    let ack = c
        .subscribe_with(&[("room/1", sub_opts(QoS::AtLeastOnce))], None)
        .await;
    assert_eq!(ack.reason_codes, vec![rc::NOT_AUTHORIZED], "{ack:?}");

    std::fs::write(
        &acl,
        "default deny\nallow all publish filter:#\nallow all subscribe filter:room/#\n",
    )
    .unwrap();
    let (status, v) = api.call("POST", "/api/v5/authorization/reload", None).await;
    assert_eq!(status, 200, "{v}");
    let msg = v["message"].as_str().unwrap();
    assert!(
        msg.starts_with("authorization reloaded: ACL ")
            && msg.contains("(2 rules, default deny)")
            && msg.contains("no password file"),
        "{msg}"
    );
    c.subscribe("room/1", QoS::AtLeastOnce).await;

    // A broken file: 400 RELOAD_FAILED with file:line:col, the previous rules stay.
    std::fs::write(
        &acl,
        "default allow\nallow all publish filter:#\nallow everyone subscribe filter:#\n",
    )
    .unwrap();
    let (status, v) = api.call("POST", "/api/v5/authorization/reload", None).await;
    let msg = assert_error(status, &v, 400, "RELOAD_FAILED");
    let at = format!("{}:3:", acl.display());
    assert!(msg.contains(&at), "{msg:?} lacks {at:?}");
    assert!(msg.ends_with("(the previous rules stay in force)"), "{msg}");
    c.subscribe("room/2", QoS::AtLeastOnce).await;
    let ack = c
        .subscribe_with(&[("hall/1", sub_opts(QoS::AtLeastOnce))], None)
        .await;
    assert_eq!(
        ack.reason_codes,
        vec![rc::NOT_AUTHORIZED],
        "old rules: {ack:?}"
    );

    // A deleted file fails the same way.
    std::fs::remove_file(&acl).unwrap();
    let (status, v) = api.call("POST", "/api/v5/authorization/reload", None).await;
    assert_error(status, &v, 400, "RELOAD_FAILED");
    c.subscribe("room/3", QoS::AtLeastOnce).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_reload_revokes_subscriptions_the_new_rules_deny() {
    use lanemq_protocol::Connect;
    let acl_dir = child::TempDir::new("admin-acl-revoke");
    let acl = acl_dir.0.join("rules.acl");
    let before = "default deny\nallow all publish filter:#\n\
                  allow all subscribe filter:$stream/events\n\
                  allow all subscribe filter:room/#\nallow all subscribe filter:keep/#\n";
    std::fs::write(&acl, before).unwrap();
    let mut cfg = admin_config();
    cfg.server.acl_file = Some(acl.clone());
    cfg.streams = vec![lanemq_streams::StreamDef::new("events", "ev/#")];
    let s = TestServer::start(cfg).await;
    let api = Api::of(&s);

    // An MQTT 5 client on a topic and on a stream, an MQTT 3.1.1 client, and a persistent
    // session that is away; each also has a subscription the new rules still allow.
    let mut a = s.v5("rv-a").await;
    a.subscribe("room/a", QoS::AtLeastOnce).await;
    a.subscribe("keep/a", QoS::AtLeastOnce).await;
    let mut r = s.v5("rv-reader").await;
    let ack = r
        .subscribe_props(&[("$stream/events", sub_opts(QoS::AtLeastOnce))], None, &[])
        .await;
    assert_eq!(ack.reason_codes, vec![1], "{ack:?}");
    let mut b = s.v311("rv-b").await;
    b.subscribe("room/b", QoS::AtLeastOnce).await;
    let away = |id: &str| -> Connect {
        let mut c = connect_v5(id);
        c.clean_start = false;
        c.properties.session_expiry_interval = Some(3600);
        c
    };
    let mut p = RawClient::connect_ok(s.addr, away("rv-p")).await;
    p.subscribe("room/p", QoS::AtLeastOnce).await;
    p.subscribe("keep/p", QoS::AtLeastOnce).await;
    p.disconnect().await;

    // The rules lose the room/# and $stream/events grants.
    std::fs::write(
        &acl,
        "default deny\nallow all publish filter:#\nallow all subscribe filter:keep/#\n",
    )
    .unwrap();
    let (status, v) = api.call("POST", "/api/v5/authorization/reload", None).await;
    assert_eq!(status, 200, "{v}");
    let msg = v["message"].as_str().unwrap();
    assert!(msg.ends_with("; 4 subscriptions revoked"), "{msg}");

    // Connected clients that lost one are told (MQTT 5: 0x87) or closed (3.1.1).
    a.expect_disconnect(rc::NOT_AUTHORIZED).await;
    r.expect_disconnect(rc::NOT_AUTHORIZED).await;
    b.expect_closed().await;

    // Nothing more arrives on what was revoked; what is still allowed stays.
    let mut publ = s.v5("rv-pub").await;
    for t in ["room/a", "room/b", "room/p", "ev/1", "keep/a", "keep/p"] {
        publ.publish_qos1(t, t.as_bytes()).await;
    }
    let (mut p, ack) = RawClient::connect_ack(s.addr, away("rv-p")).await;
    assert!(ack.session_present);
    let got = p.recv_publish_ack().await;
    assert_eq!(got.topic, "keep/p");
    p.expect_nothing(QUIET_MS).await;
    let mut a2 = RawClient::connect_ok(s.addr, connect_v5("rv-a")).await;
    a2.expect_nothing(QUIET_MS).await;
    let (status, st) = api.call("GET", "/api/v5/stats", None).await;
    assert_eq!(status, 200);
    assert_eq!(st["broker"]["subscriptions_revoked"], 4, "{st}");
    // Subscribing again follows the new rules.
    let ack = a2
        .subscribe_with(&[("room/a", sub_opts(QoS::AtLeastOnce))], None)
        .await;
    assert_eq!(ack.reason_codes, vec![rc::NOT_AUTHORIZED]);
}

// --- OpenAPI, token -----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_json_lists_every_route_and_every_route_is_served() {
    let (_s, api) = admin_server().await;
    let (status, doc) = api.call("GET", "/api/v5/openapi.json", None).await;
    assert_eq!(status, 200);
    assert_eq!(doc["openapi"], "3.0.3");
    let paths = doc["paths"].as_object().unwrap();
    let mut documented = BTreeSet::new();
    for (p, item) in paths {
        for m in item.as_object().unwrap().keys() {
            documented.insert((m.to_ascii_uppercase(), p.clone()));
        }
    }
    let routes: BTreeSet<(String, String)> = lanemq_admin::ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(documented, routes);
    assert_eq!(
        routes.len(),
        lanemq_admin::ROUTES.len(),
        "no duplicate route"
    );
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());

    // Every route reaches a handler: never the fallback's "no endpoint" 404, never 405.
    for (method, path) in lanemq_admin::ROUTES {
        if *path == "/api/v5/status" {
            // Plain text, no token: `clients_are_listed_kicked_with_0x98_and_discarded`.
            let r = api.raw(method, path, &[], None).await;
            assert_eq!(r.status, 200, "{method} {path}");
            continue;
        }
        if *path == "/metrics" || *path == "/api/v5/prometheus/stats" {
            // Prometheus text: `metrics_follow_connections_messages_streams_and_lanes`.
            let auth = format!("Bearer {TOKEN}");
            let r = api
                .raw(method, path, &[("Authorization", &auth)], None)
                .await;
            assert_eq!(r.status, 200, "{method} {path}");
            continue;
        }
        let path = path.replace("{name}", "missing");
        let body = matches!(*method, "POST" | "PUT").then(|| json!({}));
        let (status, v) = api.call(method, &path, body).await;
        assert_ne!(status, 405, "{method} {path}: {v}");
        assert!(
            !v["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("no endpoint")),
            "{method} {path}: {v}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_configured_token_one_is_generated_in_a_0600_file() {
    let mut cfg = admin_config();
    cfg.admin.token = None;
    let data_dir = cfg.server.data_dir.clone();
    let s = TestServer::start(cfg).await;
    let path = data_dir.join(lanemq_admin::TOKEN_FILE);
    let text = std::fs::read_to_string(&path).unwrap();
    let token = text.trim_end_matches('\n');
    assert_eq!(token.len(), 64, "{text:?}");
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{text:?}");
    assert_eq!(text, format!("{token}\n"));
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "mode {mode:o}");
    }
    let mut api = Api::of(&s);
    let (status, v) = api.call("GET", "/api/v5/streams", None).await;
    assert_error(status, &v, 401, "BAD_TOKEN");
    api.token = token.to_string();
    let (status, v) = api.call("GET", "/api/v5/streams", None).await;
    assert_eq!(status, 200, "{v}");
}

// --- the real binary ----------------------------------------------------------------------

/// `[admin]` for the child broker: on a free port, token generated in the data dir.
fn admin_toml(port: u16) -> String {
    format!("[admin]\nenable = true\nbind = \"127.0.0.1:{port}\"\n\n")
}

/// The generated token. The child counts as ready once its MQTT port is bound, which is
/// before the admin API writes the token file: wait for the file (bounded).
fn read_token(data_dir: &Path) -> String {
    let path = data_dir.join(lanemq_admin::TOKEN_FILE);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match std::fs::read_to_string(&path) {
            Ok(t) if t.ends_with('\n') => return t.trim().to_string(),
            Ok(_) | Err(_) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            r => panic!("no token file {}: {r:?}", path.display()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_and_settings_made_over_rest_survive_a_broker_restart() {
    let port = child::free_port();
    let mut b =
        child::Broker::start_with_acl("admin-restart", "default allow\n", &admin_toml(port)).await;
    let token = read_token(&b.data_dir);
    let api = Api {
        addr: format!("127.0.0.1:{port}"),
        token: token.clone(),
    };
    api.create(json!({
        "name": "kept",
        "topic_filter": "k/#",
        "data_retention_period": "1h",
        "read_max_unacked": 7,
    }))
    .await;
    api.create(json!({
        "name": "kept-lv",
        "topic_filter": "lv/#",
        "is_lastvalue": true,
        "key_expression": "message.topic",
    }))
    .await;
    let (status, _) = api
        .call(
            "PUT",
            "/api/v5/streams/config",
            Some(json!({ "max_stream_count": 50 })),
        )
        .await;
    assert_eq!(status, 200);
    let mut p = RawClient::connect_ok(b.addr, connect_v5("pub")).await;
    publish_n(&mut p, "k/1", 0..3).await;
    publish_n(&mut p, "lv/a", 0..2).await;
    p.disconnect().await;
    let before = api
        .wait_stream("kept", "3 messages", |v| v["stats"]["message_count"] == 3)
        .await;
    let before_lv = api
        .wait_stream("kept-lv", "1 key", |v| v["stats"]["message_count"] == 1)
        .await;

    let status = b.terminate().await;
    assert!(status.success(), "{status}; log:\n{}", b.log_tail(40));
    b.restart().await;

    assert_eq!(read_token(&b.data_dir), token, "the token file is reused");
    assert_eq!(api.all_names(1).await, ["kept", "kept-lv"]);
    assert_eq!(api.get_stream("kept").await, before);
    assert_eq!(api.get_stream("kept-lv").await, before_lv);
    let (_, settings) = api.call("GET", "/api/v5/streams/config", None).await;
    assert_eq!(settings["max_stream_count"], 50, "{settings}");
    let mut c = RawClient::connect_ok(b.addr, connect_v5("reader")).await;
    sub_stream(&mut c, "$stream/kept", EARLIEST).await;
    assert_eq!(payloads(&recv_n(&mut c, 3).await), expected(0..3));
    c.expect_nothing(QUIET_MS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_added_to_the_file_after_streams_were_disabled_over_rest_does_not_block_the_start()
{
    let port = child::free_port();
    let mut b =
        child::Broker::start_with_acl("admin-disabled", "default allow\n", &admin_toml(port)).await;
    let api = Api {
        addr: format!("127.0.0.1:{port}"),
        token: read_token(&b.data_dir),
    };
    let (status, v) = api
        .call(
            "PUT",
            "/api/v5/streams/config",
            Some(json!({ "enable": false })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let status = b.terminate().await;
    assert!(status.success(), "{status}");
    let config = b.dir.0.join("lanemq.toml");
    let mut toml = std::fs::read_to_string(&config).unwrap();
    toml.push_str(
        "[streams_config]\nenable = true\n\n[[streams]]\nname = \"declared\"\ntopic_filter = \"d/#\"\n",
    );
    std::fs::write(&config, toml).unwrap();
    // Panics with the broker's log tail if the broker exits at start.
    b.restart().await;
    // Settings stored over REST win over [streams_config]: the broker runs, the declared
    // stream is skipped with a warning, and enabling streams over REST again is possible.
    let (status, v) = api.call("GET", "/api/v5/stream/declared", None).await;
    assert_eq!(status, 404, "{v}");
    assert!(
        b.log_tail(60)
            .contains("stream of the config file not created"),
        "{}",
        b.log_tail(60)
    );
    let (status, v) = api
        .call(
            "PUT",
            "/api/v5/streams/config",
            Some(json!({ "enable": true })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
}

/// A `lanemq serve --http ADDR` child with no configured token; killed on drop.
struct HttpBroker {
    child: Child,
    admin: String,
    data_dir: PathBuf,
    log: PathBuf,
    _dir: child::TempDir,
}

impl HttpBroker {
    async fn start() -> HttpBroker {
        let dir = child::TempDir::new("admin-cli");
        let config = dir.0.join("lanemq.toml");
        std::fs::write(
            &config,
            "[server]\nsys_interval_s = 0\nshutdown_grace_ms = 1000\n\n[admin]\nenable = false\n",
        )
        .unwrap();
        let data_dir = dir.0.join("data");
        let log = dir.0.join("broker.log");
        let admin = format!("127.0.0.1:{}", child::free_port());
        let mqtt = format!("127.0.0.1:{}", child::free_port());
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(child::lanemq_bin())
            .args(["serve", "--config"])
            .arg(&config)
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["--mqtt", &mqtt, "--http", &admin])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let mut b = HttpBroker {
            child,
            admin,
            data_dir,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        // Ready when the port accepts and our broker logged "lanemq ready" (another test's
        // process may have taken the port between `free_port` and our bind).
        while std::net::TcpStream::connect(&b.admin).is_err()
            || !b.log_text().contains("lanemq ready")
        {
            if let Some(st) = b.child.try_wait().unwrap() {
                panic!("broker exited with {st}:\n{}", b.log_text());
            }
            assert!(Instant::now() < deadline, "no admin API:\n{}", b.log_text());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        b
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `lanemq streams --url ADDR --data-dir DATA <args>` (the token from the data dir).
    async fn cli(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(child::lanemq_bin());
        cmd.arg("streams")
            .args(["--url", &self.admin])
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(args)
            .env_remove("LANEMQ_ADMIN_TOKEN")
            .env_remove("LANEMQ_ADMIN_ADDR")
            .stdin(Stdio::null());
        tokio::task::spawn_blocking(move || cmd.output().unwrap())
            .await
            .unwrap()
    }

    /// Runs the command line, requires success, returns stdout.
    async fn cli_ok(&self, args: &[&str]) -> String {
        let out = self.cli(args).await;
        assert!(
            out.status.success(),
            "lanemq streams {args:?}: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Runs the command line, requires failure, returns stderr.
    async fn cli_err(&self, args: &[&str]) -> String {
        let out = self.cli(args).await;
        assert!(
            !out.status.success(),
            "lanemq streams {args:?} should fail; stdout: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stderr).unwrap()
    }
}

impl Drop for HttpBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanemq_streams_cli_creates_lists_shows_configures_and_deletes_over_http() {
    let b = HttpBroker::start().await;
    // --http enabled the API and the token was generated in the data dir.
    assert_eq!(read_token(&b.data_dir).len(), 64);

    let out = b
        .cli_ok(&[
            "create",
            "--name",
            "cli-one",
            "--filter",
            "cli/#",
            "--retention",
            "1h",
            "--max-messages",
            "100",
            "--max-bytes",
            "10MB",
        ])
        .await;
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["name"], "cli-one");
    assert_eq!(v["topic_filter"], "cli/#");
    assert_eq!(v["data_retention_period"], "1h");
    assert_eq!(
        v["limits"],
        json!({ "max_message_count": 100, "max_message_bytes": 10_485_760 })
    );
    let out = b
        .cli_ok(&[
            "create",
            "--json",
            r#"{"name":"cli-two","topic_filter":"x/+","is_lastvalue":true}"#,
        ])
        .await;
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["is_lastvalue"],
        true
    );

    let table = b.cli_ok(&["list"]).await;
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines,
        vec![
            vec!["NAME", "FILTER", "LASTVALUE", "MESSAGES"],
            vec!["cli-one", "cli/#", "no", "0"],
            vec!["cli-two", "x/+", "yes", "0"],
        ],
        "{table}"
    );
    // --limit 1: the command follows the cursor.
    let all: Value =
        serde_json::from_str(&b.cli_ok(&["list", "--json", "--limit", "1"]).await).unwrap();
    let names: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["cli-one", "cli-two"]);

    let shown: Value = serde_json::from_str(&b.cli_ok(&["show", "cli-one"]).await).unwrap();
    assert_eq!(shown["data_retention_period"], "1h");
    assert_eq!(shown["stats"]["message_count"], 0);

    let cfg: Value = serde_json::from_str(&b.cli_ok(&["config"]).await).unwrap();
    assert_eq!(cfg["max_stream_count"], 1000);
    let cfg: Value = serde_json::from_str(
        &b.cli_ok(&["config", "--json", r#"{"max_stream_count":5}"#])
            .await,
    )
    .unwrap();
    assert_eq!(cfg["max_stream_count"], 5);

    let err = b
        .cli_err(&["create", "--name", "cli-one", "--filter", "y/#"])
        .await;
    assert!(err.contains("HTTP 409 ALREADY_EXISTS"), "{err}");
    let err = b
        .cli_err(&["create", "--name", "bad/name", "--filter", "y/#"])
        .await;
    assert!(err.contains("HTTP 400 BAD_REQUEST"), "{err}");

    assert_eq!(
        b.cli_ok(&["delete", "cli-one"]).await.trim(),
        "stream cli-one deleted"
    );
    let err = b.cli_err(&["show", "cli-one"]).await;
    assert!(err.contains("HTTP 404 NOT_FOUND"), "{err}");
    let err = b.cli_err(&["delete", "cli-one"]).await;
    assert!(err.contains("HTTP 404 NOT_FOUND"), "{err}");
    let err = b.cli_err(&["--token", "wrong", "list"]).await;
    assert!(err.contains("HTTP 401 BAD_TOKEN"), "{err}");

    let table = b.cli_ok(&["list"]).await;
    assert_eq!(table.lines().count(), 2, "{table}");
    assert!(table.contains("cli-two"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_http_off_disables_the_api_configured_in_the_file() {
    let dir = child::TempDir::new("admin-off");
    let config = dir.0.join("lanemq.toml");
    let admin_port = child::free_port();
    let mqtt = SocketAddr::from(([127, 0, 0, 1], child::free_port()));
    std::fs::write(
        &config,
        format!("[server]\nsys_interval_s = 0\n\n{}", admin_toml(admin_port)),
    )
    .unwrap();
    let mut child = Command::new(child::lanemq_bin())
        .args(["serve", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.0.join("data"))
        .args(["--mqtt", &mqtt.to_string(), "--http", "off"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(mqtt).is_err() {
        assert!(child.try_wait().unwrap().is_none(), "the broker exited");
        assert!(Instant::now() < deadline, "the broker did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused = std::net::TcpStream::connect(("127.0.0.1", admin_port));
    let token_file = dir.0.join("data").join(lanemq_admin::TOKEN_FILE).exists();
    let _ = child.kill();
    let _ = child.wait();
    assert!(refused.is_err(), "the admin API answers despite --http off");
    assert!(!token_file, "no token is generated when the API is off");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanemq_streams_cli_update_merges_flags_over_the_current_definition() {
    let b = HttpBroker::start().await;
    b.cli_ok(&[
        "create",
        "--name",
        "cli-up",
        "--filter",
        "up/#",
        "--retention",
        "1h",
    ])
    .await;
    // Flags are merged over the current definition.
    let upd: Value = serde_json::from_str(
        &b.cli_ok(&["update", "cli-up", "--read-max-unacked", "9"])
            .await,
    )
    .unwrap();
    assert_eq!(upd["read_max_unacked"], 9);
    assert_eq!(upd["data_retention_period"], "1h");
    // A JSON body replaces the definition.
    let upd: Value = serde_json::from_str(
        &b.cli_ok(&["update", "cli-up", "--json", r#"{"topic_filter":"up/#"}"#])
            .await,
    )
    .unwrap();
    assert_eq!(upd["read_max_unacked"], 1000);
    assert_eq!(upd["data_retention_period"], "7d");
    let err = b
        .cli_err(&["update", "cli-up", "--filter", "other/#"])
        .await;
    assert!(err.contains("HTTP 409 CONFLICT"), "{err}");
}

/// `GET /api/v5/clients` (EMQX shape) lists real sessions with their username, address and
/// figures, `/subscriptions` their filters; `DELETE /clients/{id}` gives a connected client
/// DISCONNECT 0x98 and keeps its persistent session, and discards a session whose client is
/// away; `GET /status` answers without a token.
#[tokio::test]
async fn clients_are_listed_kicked_with_0x98_and_discarded() {
    let (s, api) = admin_server().await;
    let mut c = connect_v5("mgmt-a");
    c.username = Some("alice".into());
    c.properties.session_expiry_interval = Some(600);
    let mut a = RawClient::connect_ok(s.addr, c).await;
    a.subscribe("m/a/#", QoS::AtLeastOnce).await;
    let mut b = RawClient::connect_ok(s.addr, connect_v311("mgmt-b")).await;
    b.subscribe("m/b", QoS::AtMostOnce).await;

    let (st, v) = api
        .call("GET", "/api/v5/clients?clientid_prefix=mgmt-", None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["meta"]["count"], 2, "{v}");
    let first = &v["data"][0];
    assert_eq!(first["clientid"], "mgmt-a");
    assert_eq!(first["username"], "alice");
    assert_eq!(first["ip_address"], "127.0.0.1");
    assert_eq!(first["connected"], true);
    assert_eq!(first["proto_ver"], 5);
    assert_eq!(first["expiry_interval"], 600);
    assert_eq!(first["subscriptions_cnt"], 1);
    assert!(
        first["connected_at"].as_u64().is_some_and(|t| t > 0),
        "{first}"
    );
    assert_eq!(v["data"][1]["proto_ver"], 4);
    let (_, v) = api
        .call("GET", "/api/v5/clients?username=alice", None)
        .await;
    assert_eq!(v["meta"]["count"], 1, "{v}");

    let (st, v) = api
        .call("GET", "/api/v5/clients/mgmt-b/subscriptions", None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v,
        json!([{"clientid": "mgmt-b", "topic": "m/b", "qos": 0, "nl": 0, "rap": 0, "rh": 0}])
    );
    let (_, v) = api
        .call("GET", "/api/v5/subscriptions?match_topic=m/", None)
        .await;
    assert_eq!(v["meta"]["count"], 2, "{v}");

    // Kick: DISCONNECT 0x98; the persistent session stays, shown as disconnected.
    let (st, _) = api.call("DELETE", "/api/v5/clients/mgmt-a", None).await;
    assert_eq!(st, 204);
    a.expect_disconnect(rc::ADMINISTRATIVE_ACTION).await;
    let mut gone = false;
    for _ in 0..100 {
        let (_, v) = api.call("GET", "/api/v5/clients/mgmt-a", None).await;
        if v["connected"] == false {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone, "the kicked client still shows as connected");
    // A second DELETE discards the stored session.
    let (st, _) = api.call("DELETE", "/api/v5/clients/mgmt-a", None).await;
    assert_eq!(st, 204);
    let (st, v) = api.call("GET", "/api/v5/clients/mgmt-a", None).await;
    assert_error(st, &v, 404, "CLIENTID_NOT_FOUND");
    let (_, ack) = RawClient::connect_ack(s.addr, {
        let mut c = connect_v5("mgmt-a");
        c.clean_start = false;
        c
    })
    .await;
    assert!(!ack.session_present, "a discarded session was resumed");
    // MQTT 3.1.1 has no DISCONNECT from the server: the connection is closed.
    let (st, _) = api.call("DELETE", "/api/v5/clients/mgmt-b", None).await;
    assert_eq!(st, 204);
    b.expect_closed().await;
    let (st, v) = api.call("DELETE", "/api/v5/clients/nobody", None).await;
    assert_error(st, &v, 404, "CLIENTID_NOT_FOUND");
    let r = api.raw("GET", "/api/v5/status", &[], None).await;
    assert_eq!(r.status, 200);
    assert!(r.body.contains("running"), "{}", r.body);
}

/// `POST /api/v5/publish` stores and routes a message as the `api` identity: a subscriber gets
/// it with its properties, a retained one reaches a later subscriber, 202 with reason code 16
/// when nothing matched, 400 for a bad topic; `/publish/bulk` keeps the order. An ACL that
/// denies `user api` makes it 403.
#[tokio::test]
async fn publish_over_http_reaches_mqtt_subscribers() {
    let (s, api) = admin_server().await;
    let mut sub = RawClient::connect_ok(s.addr, connect_v5("http-sub")).await;
    sub.subscribe("http/#", QoS::AtLeastOnce).await;
    let body = json!({
        "topic": "http/a", "payload": "hello", "qos": 1,
        "properties": { "user_properties": { "k": "v" }, "content_type": "text/plain" }
    });
    let (st, v) = api.call("POST", "/api/v5/publish", Some(body)).await;
    assert_eq!(st, 200, "{v}");
    assert!(
        v["id"].as_str().is_some_and(|id| id.parse::<u64>().is_ok()),
        "{v}"
    );
    let p = sub.recv_publish_ack().await;
    assert_eq!(
        (p.topic.as_str(), &p.payload[..]),
        ("http/a", &b"hello"[..])
    );
    assert_eq!(p.qos, QoS::AtLeastOnce);
    assert_eq!(user_prop(&p, "k"), Some("v"));
    assert_eq!(p.properties.content_type.as_deref(), Some("text/plain"));

    let (st, v) = api
        .call(
            "POST",
            "/api/v5/publish",
            Some(json!({"topic": "nobody/here"})),
        )
        .await;
    assert_eq!(st, 202, "{v}");
    assert_eq!(v["reason_code"], 16);
    let (st, v) = api
        .call(
            "POST",
            "/api/v5/publish",
            Some(json!({"topic": "kept/1", "payload": "r", "retain": true, "qos": 1})),
        )
        .await;
    assert_eq!(st, 202, "{v}");
    let mut late = RawClient::connect_ok(s.addr, connect_v5("http-late")).await;
    late.subscribe("kept/#", QoS::AtLeastOnce).await;
    let r = late.recv_publish_ack().await;
    assert!(r.retain && &r.payload[..] == b"r", "{r:?}");
    for bad in [
        json!({"topic": "a/+"}),
        json!({"topic": "$SYS/x"}),
        json!({"topic": ""}),
    ] {
        let (st, v) = api.call("POST", "/api/v5/publish", Some(bad)).await;
        assert_error(st, &v, 400, "BAD_REQUEST");
    }
    let bulk: Vec<Value> = (0..5)
        .map(|i| json!({"topic": "http/bulk", "payload": format!("b{i}"), "qos": 1}))
        .collect();
    let (st, v) = api
        .call("POST", "/api/v5/publish/bulk", Some(Value::Array(bulk)))
        .await;
    assert_eq!(st, 200, "{v}");
    let got: Vec<String> = recv_n(&mut sub, 5).await.iter().map(payload).collect();
    assert_eq!(got, ["b0", "b1", "b2", "b3", "b4"]);

    // An ACL that denies user api.
    let dir = temp_data_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let acl = dir.join("deny-api.acl");
    std::fs::write(&acl, "deny user:api publish filter:#\ndefault allow\n").unwrap();
    let mut cfg = admin_config();
    cfg.server.acl_file = Some(acl);
    let s2 = TestServer::start(cfg).await;
    let api2 = Api::of(&s2);
    let (st, v) = api2
        .call("POST", "/api/v5/publish", Some(json!({"topic": "x"})))
        .await;
    assert_error(st, &v, 403, "NOT_AUTHORIZED");
}

/// The retainer API over a real broker: retained messages published by an MQTT client are
/// listed (filtered by a topic filter), shown with their payload and deleted without anything
/// being published; a later subscriber gets no retained copy.
#[tokio::test]
async fn retained_messages_are_listed_shown_and_deleted() {
    let (s, api) = admin_server().await;
    let mut watcher = RawClient::connect_ok(s.addr, connect_v5("ret-watch")).await;
    watcher.subscribe("ret/#", QoS::AtLeastOnce).await;
    let mut p = RawClient::connect_ok(s.addr, connect_v5("ret-pub")).await;
    for (t, m) in [("ret/a", "one"), ("ret/b/c", "two"), ("other", "three")] {
        let mut msg = publish(t, QoS::AtLeastOnce, p.next_pid(), m.as_bytes());
        msg.retain = true;
        assert_eq!(p.publish_acked(msg).await, 0);
    }
    let _ = recv_n(&mut watcher, 2).await;
    let (st, v) = api
        .call("GET", "/api/v5/mqtt/retainer/messages?topic=ret/%23", None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["meta"]["count"], 2, "{v}");
    assert_eq!(v["data"][0]["topic"], "ret/a");
    assert_eq!(v["data"][0]["from_clientid"], "ret-pub");
    let (st, v) = api
        .call("GET", "/api/v5/mqtt/retainer/message/ret%2Fb%2Fc", None)
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["payload"], "dHdv", "base64 of two");
    let (st, _) = api
        .call("DELETE", "/api/v5/mqtt/retainer/message/ret/b/c", None)
        .await;
    assert_eq!(st, 204);
    watcher.expect_nothing(300).await;
    let mut late = RawClient::connect_ok(s.addr, connect_v5("ret-late")).await;
    late.subscribe("ret/#", QoS::AtLeastOnce).await;
    let got = late.recv_publish_ack().await;
    assert_eq!(got.topic, "ret/a");
    late.expect_nothing(300).await;
    let (st, v) = api
        .call("DELETE", "/api/v5/mqtt/retainer/message/ret/b/c", None)
        .await;
    assert_error(st, &v, 404, "NOT_FOUND");
}

/// One scrape of `GET /metrics` as `name{labels}` → value (comment lines left out).
async fn scrape(api: &Api) -> std::collections::BTreeMap<String, f64> {
    let auth = format!("Bearer {}", api.token);
    let r = api
        .raw("GET", "/metrics", &[("Authorization", &auth)], None)
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    r.body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').expect("name value");
            (k.to_string(), v.parse::<f64>().expect("a number"))
        })
        .collect()
}

fn metric(m: &std::collections::BTreeMap<String, f64>, key: &str) -> f64 {
    *m.get(key)
        .unwrap_or_else(|| panic!("{key} not scraped; have {:?}", m.keys().collect::<Vec<_>>()))
}

/// Prometheus metrics of a real broker follow real traffic: connections accepted and refused
/// by reason, messages and payload bytes per QoS in and out, messages nobody subscribed to,
/// log appends and fsyncs, a stream's records and readers, a lite group's lag, inflight and
/// lanes behind, and the process's memory and open files. Needs the token; the EMQX path
/// answers the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_connections_messages_streams_and_lanes() {
    let (s, api) = admin_server().await;
    let r = api.raw("GET", "/metrics", &[], None).await;
    assert_eq!(r.status, 401, "the token is needed by default");
    let (st, v) = api
        .call(
            "POST",
            "/api/v5/lite/parents",
            Some(json!({ "name": "agents", "pattern": "agents/{lane}/#" })),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    api.create(json!({ "name": "temps", "topic_filter": "temps/#" }))
        .await;
    let before = scrape(&api).await;

    // A refused CONNECT: MQTT 3.1.1, empty client id, persistent session (CONNACK 0x02).
    let mut c = connect_v311("");
    c.clean_start = false;
    let (_refused, first) = RawClient::connect(s.addr, c).await;
    assert!(
        matches!(first, Ok(Packet::ConnAck(ref a)) if a.reason_code != 0),
        "{first:?}"
    );
    let mut sub = s.v5("m-sub").await;
    sub.subscribe("temps/#", QoS::AtLeastOnce).await;
    let mut reader = s.v5("m-reader").await;
    sub_stream(&mut reader, "$stream/temps", EARLIEST).await;
    let mut p = s.v5("m-pub").await;
    for i in 0..3 {
        p.publish_qos0("temps/a", format!("q0-{i}").as_bytes())
            .await;
    }
    for i in 0..2 {
        assert_eq!(
            p.publish_qos1("temps/b", format!("q1-{i}").as_bytes())
                .await,
            0
        );
    }
    assert_eq!(p.publish_qos1("nobody/listens", b"x").await, 0x10);
    for lane in ["a1", "a1", "a2"] {
        assert_eq!(
            p.publish_qos1(&format!("agents/{lane}/job"), b"job").await,
            0,
            "kept for the lane"
        );
    }
    let got = recv_n(&mut sub, 5).await;
    assert_eq!(got.len(), 5);
    // A lane group member that takes the three lane messages and acknowledges none.
    let mut worker = s.v5("m-worker").await;
    worker
        .subscribe("$share/workers/agents/#", QoS::AtLeastOnce)
        .await;
    for _ in 0..3 {
        worker.recv_publish().await;
    }

    let deadline = Instant::now() + Duration::from_secs(10);
    let m = loop {
        let m = scrape(&api).await;
        let settled = metric(&m, "lanemq_stream_records{stream=\"temps\"}") == 5.0
            && metric(
                &m,
                "lanemq_lite_group_inflight_messages{parent=\"agents\",group=\"workers\"}",
            ) == 3.0
            && metric(&m, "lanemq_messages_sent_total{qos=\"1\"}")
                - metric(&before, "lanemq_messages_sent_total{qos=\"1\"}")
                >= 5.0;
        if settled || Instant::now() > deadline {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let delta = |k: &str| metric(&m, k) - metric(&before, k);
    assert_eq!(metric(&m, "lanemq_connections"), 4.0);
    assert_eq!(delta("lanemq_connections_accepted_total"), 4.0);
    assert_eq!(
        metric(
            &m,
            "lanemq_connections_refused_total{reason=\"client_identifier_not_valid\"}"
        ),
        1.0
    );
    assert_eq!(metric(&m, "lanemq_sessions{state=\"online\"}"), 4.0);
    assert_eq!(delta("lanemq_messages_received_total{qos=\"0\"}"), 3.0);
    assert_eq!(delta("lanemq_messages_received_total{qos=\"1\"}"), 6.0);
    assert_eq!(
        delta("lanemq_messages_received_payload_bytes_total{qos=\"0\"}"),
        12.0
    );
    assert_eq!(delta("lanemq_messages_no_subscribers_total"), 1.0);
    // To m-sub and to the stream reader each: 3 at QoS 0 and 2 at QoS 1 (a delivery has
    // the lower of the two QoS); the 3 lane messages to the worker at QoS 1.
    assert_eq!(delta("lanemq_messages_sent_total{qos=\"0\"}"), 6.0);
    assert_eq!(
        delta("lanemq_messages_sent_total{qos=\"1\"}"),
        2.0 + 2.0 + 3.0
    );
    assert!(delta("lanemq_log_appended_records_total") >= 9.0);
    assert!(delta("lanemq_log_fsyncs_total") >= 1.0);
    // A few messages never fill the log's submission queue.
    assert_eq!(delta("lanemq_log_append_waits_total"), 0.0);
    assert!(delta("lanemq_log_fsync_duration_seconds_count") >= 1.0);
    assert!(metric(&m, "lanemq_log_size_bytes") > 0.0);
    assert_eq!(metric(&m, "lanemq_stream_records{stream=\"temps\"}"), 5.0);
    assert_eq!(metric(&m, "lanemq_stream_readers{stream=\"temps\"}"), 1.0);
    assert_eq!(
        metric(&m, "lanemq_lite_parent_lanes{parent=\"agents\"}"),
        2.0
    );
    let g = "{parent=\"agents\",group=\"workers\"}";
    assert_eq!(
        metric(&m, &format!("lanemq_lite_group_inflight_messages{g}")),
        3.0
    );
    assert_eq!(
        metric(&m, &format!("lanemq_lite_group_members_online{g}")),
        1.0
    );
    // Nothing acknowledged: the group is behind on both lanes by all three messages (the
    // offsets the metrics read are the stored ones).
    assert_eq!(
        metric(&m, &format!("lanemq_lite_group_lag_messages{g}")),
        3.0
    );
    assert_eq!(
        metric(&m, &format!("lanemq_lite_group_lanes_behind{g}")),
        2.0
    );
    assert!(metric(&m, "process_resident_memory_bytes") > 1e6);
    assert!(metric(&m, "process_open_fds") >= 5.0);

    let auth = format!("Bearer {TOKEN}");
    let r = api
        .raw(
            "GET",
            "/api/v5/prometheus/stats",
            &[("Authorization", &auth)],
            None,
        )
        .await;
    assert_eq!(r.status, 200);
    assert!(r.body.contains("lanemq_stream_records{stream=\"temps\"} 5"));
}
