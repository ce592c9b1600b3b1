//! The lanes REST API (`/api/v5/lite/...`, docs/admin-api.md#lanes) over real TCP and HTTP
//! against a real in-process broker with the API on `127.0.0.1:0`, and the real `lanemq lanes`
//! command line against it.
//!
//! ```sh
//! cargo build -p lanemq          # the command-line test runs the binary
//! cargo nextest run -p lanemq-tests --test it lanes_admin::
//! ```
//!
//! The binary: `LANEMQ_BIN`, else the newest of target/{release,debug}/lanemq and
//! `$CARGO_TARGET_DIR`/{release,debug}/lanemq.
#![allow(clippy::unwrap_used)]

use crate::common;

use crate::child;

use common::*;
use lanemq_admin::client;
use lanemq_broker::Config;
use lanemq_protocol::{Packet, PubResp, Publish, QoS};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const TOKEN: &str = "lanes-admin-test-token";

// --- helpers ------------------------------------------------------------------------------

fn admin_config() -> Config {
    let mut cfg = stream_config();
    cfg.admin.enable = true;
    cfg.admin.bind = SocketAddr::from(([127, 0, 0, 1], 0));
    cfg.admin.token = Some(TOKEN.to_string());
    cfg
}

#[derive(Clone)]
struct Api {
    addr: String,
}

impl Api {
    fn of(s: &TestServer) -> Api {
        Api {
            addr: s.server().admin_addr().expect("admin API on").to_string(),
        }
    }

    /// A request with exactly these headers; the whole response.
    async fn raw(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> client::Response {
        let (addr, method, path) = (self.addr.clone(), method.to_string(), path.to_string());
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

    /// With the token and a JSON content type; status and parsed body (`Null` when empty).
    async fn call_text(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let auth = format!("Bearer {TOKEN}");
        let r = self
            .raw(
                method,
                path,
                &[
                    ("Authorization", &auth),
                    ("Content-Type", "application/json"),
                ],
                body,
            )
            .await;
        let v = if r.body.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&r.body)
                .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {:?}", r.body))
        };
        (r.status, v)
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_text(method, path, body.map(|b| b.to_string()).as_deref())
            .await
    }

    async fn ok(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (status, v) = self.call(method, path, body).await;
        assert_eq!(status, 200, "{method} {path}: {v}");
        v
    }

    /// Every item of a cursor-paginated listing (`?limit=` pages, following `meta.cursor`
    /// with `after`); also returns the page sizes.
    async fn all_pages(&self, base: &str, limit: usize) -> (Vec<Value>, Vec<usize>) {
        let mut items = Vec::new();
        let mut sizes = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..1000 {
            let mut path = format!("{base}?limit={limit}");
            if let Some(c) = &cursor {
                path.push_str(&format!("&after={}", enc(c)));
            }
            let page = self.ok("GET", &path, None).await;
            let data = page["data"].as_array().unwrap();
            assert_eq!(page["meta"]["count"], data.len(), "{page}");
            assert_eq!(page["meta"]["limit"], limit, "{page}");
            sizes.push(data.len());
            items.extend(data.iter().cloned());
            if !page["meta"]["hasnext"].as_bool().unwrap() {
                assert!(page["meta"].get("cursor").is_none(), "{page}");
                return (items, sizes);
            }
            let c = page["meta"]["cursor"].as_str().unwrap().to_string();
            assert_eq!(
                data.last().unwrap()["lane"],
                c.as_str(),
                "cursor = last key"
            );
            cursor = Some(c);
        }
        panic!("the cursor never ended");
    }

    /// GET `path` until `pred` holds (bounded: 10 s); returns the last answer.
    async fn wait(&self, path: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let v = self.ok("GET", path, None).await;
            if pred(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "{path}: never {what}; last: {v}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn metrics_text(&self) -> client::Response {
        let auth = format!("Bearer {TOKEN}");
        self.raw(
            "GET",
            "/api/v5/lite/metrics",
            &[("Authorization", &auth), ("Accept", "text/plain")],
            None,
        )
        .await
    }
}

/// Percent-encodes a path segment or query value.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// An error answer: status, `{"code", "message"}` and nothing else; returns the message.
fn assert_error(status: u16, v: &Value, want_status: u16, code: &str) -> String {
    assert_eq!(status, want_status, "status of {v}");
    assert_eq!(v["code"], code, "code of {v}");
    let msg = v["message"].as_str().unwrap_or_else(|| panic!("{v}"));
    assert!(!msg.is_empty(), "{v}");
    assert_eq!(
        v.as_object().unwrap().len(),
        2,
        "only code and message: {v}"
    );
    msg.to_string()
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

async fn server() -> (TestServer, Api) {
    let s = TestServer::start(admin_config()).await;
    let api = Api::of(&s);
    (s, api)
}

async fn publish_all(c: &mut RawClient, topic: &str, n: usize) {
    for i in 0..n {
        let code = c.publish_qos1(topic, format!("m{i}").as_bytes()).await;
        assert!(code == 0 || code == 0x10, "PUBACK 0x{code:02X} for {topic}");
    }
}

/// The value of one sample (`name value` line) of a Prometheus text.
fn sample(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            let (n, v) = l.split_once(' ')?;
            (n == name).then(|| v.trim().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no sample {name} in\n{text}"))
}

/// Receives `n` lane deliveries without acknowledging them.
async fn recv_unacked(c: &mut RawClient, n: usize) -> Vec<Publish> {
    let mut v = Vec::new();
    for _ in 0..n {
        let p = c.recv_publish().await;
        assert_eq!(p.qos, QoS::AtLeastOnce);
        assert!(user_prop(&p, "lane").is_some(), "no lane property: {p:?}");
        assert!(user_prop(&p, "lane-offset").is_some(), "{p:?}");
        v.push(p);
    }
    v
}

// --- parents: CRUD and errors ---------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parents_are_created_listed_shown_updated_and_deleted_with_json_errors() {
    let (_s, api) = server().await;
    let list = api.ok("GET", "/api/v5/lite/parents", None).await;
    assert_eq!(list["data"], json!([]), "{list}");
    assert_eq!(list["meta"]["count"], 0);

    let created = api
        .ok(
            "POST",
            "/api/v5/lite/parents",
            Some(json!({ "name": "agents", "pattern": "agents/{lane}/#" })),
        )
        .await;
    assert_eq!(
        created,
        json!({
            "name": "agents", "pattern": "agents/{lane}/#", "key_levels": 1, "ttl_s": 3600,
            "mode": "shared", "max_attempts": 16, "max_lanes": 10_000_000, "max_key_bytes": 64,
            "batch": 32, "ack_timeout_ms": 10_000, "lanes": 0
        })
    );
    let full = json!({
        "name": "jobs", "pattern": "jobs/+/{lane}", "key_levels": 2, "ttl_s": 60,
        "mode": "exclusive", "max_attempts": 3, "max_lanes": 5, "max_key_bytes": 16, "batch": 4,
        "ack_timeout_ms": 500
    });
    let mut want = full.clone();
    want["lanes"] = json!(0);
    assert_eq!(
        api.ok("POST", "/api/v5/lite/parents", Some(full)).await,
        want
    );

    // Listed in creation order; shown one by one.
    let list = api.ok("GET", "/api/v5/lite/parents", None).await;
    let names: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["agents", "jobs"]);
    assert_eq!(list["meta"]["count"], 2);
    assert_eq!(api.ok("GET", "/api/v5/lite/parents/jobs", None).await, want);

    // 409: the same name, or the same pattern under another name.
    let (st, v) = api
        .call(
            "POST",
            "/api/v5/lite/parents",
            Some(json!({ "name": "agents", "pattern": "other/{lane}" })),
        )
        .await;
    let msg = assert_error(st, &v, 409, "ALREADY_EXISTS");
    assert!(msg.contains("agents"), "{msg}");
    let (st, v) = api
        .call(
            "POST",
            "/api/v5/lite/parents",
            Some(json!({ "name": "agents2", "pattern": "agents/{lane}/#" })),
        )
        .await;
    let msg = assert_error(st, &v, 409, "CONFLICT");
    assert!(msg.contains("agents/{lane}/#"), "{msg}");

    // 400: every failing field is named; unknown fields, bad values and types, not JSON.
    let (st, v) = api
        .call(
            "POST",
            "/api/v5/lite/parents",
            Some(json!({
                "name": "a b", "pattern": "no-lane/#", "ttl_s": 0, "batch": 0, "ack_timeout_ms": 10
            })),
        )
        .await;
    let msg = assert_error(st, &v, 400, "BAD_REQUEST");
    for field in ["name:", "pattern:", "ttl_s:", "batch:", "ack_timeout_ms:"] {
        assert!(msg.contains(field), "{field} in {msg}");
    }
    for (body, needle) in [
        (
            json!({ "name": "x", "pattern": "x/{lane}", "colour": 1 }),
            "colour",
        ),
        (
            json!({ "name": "x", "pattern": "x/{lane}", "mode": "round-robin" }),
            "round-robin",
        ),
        (
            json!({ "name": "x", "pattern": "x/{lane}", "ttl_s": "1h" }),
            "ttl_s: expected an integer",
        ),
        (json!({ "name": "x", "pattern": "$SYS/{lane}" }), "pattern"),
        (
            json!({ "name": "x", "pattern": "x/{lane}/{lane}" }),
            "pattern",
        ),
        (json!({}), "name"),
    ] {
        let (st, v) = api
            .call("POST", "/api/v5/lite/parents", Some(body.clone()))
            .await;
        let msg = assert_error(st, &v, 400, "BAD_REQUEST");
        assert!(msg.contains(needle), "{body}: {needle} in {msg}");
    }
    let (st, v) = api
        .call_text("POST", "/api/v5/lite/parents", Some("{\"name\": "))
        .await;
    assert_error(st, &v, 400, "BAD_REQUEST");
    let r = api
        .raw(
            "POST",
            "/api/v5/lite/parents",
            &[("Authorization", &format!("Bearer {TOKEN}"))],
            Some(r#"{"name":"x","pattern":"x/{lane}"}"#),
        )
        .await;
    assert_eq!(r.status, 400, "no content type: {}", r.body);

    // 404 for unknown parents on every parent route.
    for (m, p) in [
        ("GET", "/api/v5/lite/parents/nope"),
        ("DELETE", "/api/v5/lite/parents/nope"),
        ("GET", "/api/v5/lite/parents/nope/lanes"),
        ("GET", "/api/v5/lite/parents/nope/lanes/k"),
        ("GET", "/api/v5/lite/parents/nope/groups"),
        ("GET", "/api/v5/lite/parents/nope/groups/g/lag"),
    ] {
        let (st, v) = api.call(m, p, None).await;
        let msg = assert_error(st, &v, 404, "NOT_FOUND");
        assert!(msg.contains("nope"), "{m} {p}: {msg}");
    }
    let (st, v) = api
        .call(
            "PUT",
            "/api/v5/lite/parents/nope",
            Some(json!({ "pattern": "nope/{lane}" })),
        )
        .await;
    assert_error(st, &v, 404, "NOT_FOUND");

    // PUT replaces the definition (omitted fields: defaults; name optional).
    let upd = api
        .ok(
            "PUT",
            "/api/v5/lite/parents/agents",
            Some(json!({ "pattern": "agents/{lane}/#", "ttl_s": 60, "mode": "exclusive" })),
        )
        .await;
    assert_eq!(upd["name"], "agents");
    assert_eq!(upd["ttl_s"], 60);
    assert_eq!(upd["mode"], "exclusive");
    assert_eq!(upd["batch"], 32);
    assert_eq!(upd["ack_timeout_ms"], 10_000);
    let upd = api
        .ok(
            "PUT",
            "/api/v5/lite/parents/jobs",
            Some(json!({ "name": "jobs", "pattern": "jobs/+/{lane}", "key_levels": 2 })),
        )
        .await;
    assert_eq!(upd["ttl_s"], 3600);
    assert_eq!(upd["mode"], "shared");
    // A parent without lanes may change its pattern.
    let upd = api
        .ok(
            "PUT",
            "/api/v5/lite/parents/jobs",
            Some(json!({ "pattern": "work/{lane}" })),
        )
        .await;
    assert_eq!(upd["pattern"], "work/{lane}");
    let (st, v) = api
        .call(
            "PUT",
            "/api/v5/lite/parents/jobs",
            Some(json!({ "name": "other", "pattern": "work/{lane}" })),
        )
        .await;
    let msg = assert_error(st, &v, 400, "BAD_REQUEST");
    assert!(msg.contains("name"), "{msg}");
    let (st, v) = api
        .call(
            "PUT",
            "/api/v5/lite/parents/jobs",
            Some(json!({ "pattern": "work/{lane}", "max_attempts": 0 })),
        )
        .await;
    let msg = assert_error(st, &v, 400, "BAD_REQUEST");
    assert!(msg.contains("max_attempts"), "{msg}");
    let (st, v) = api
        .call(
            "PUT",
            "/api/v5/lite/parents/jobs",
            Some(json!({ "pattern": "work/{lane}", "nope": true })),
        )
        .await;
    assert_error(st, &v, 400, "BAD_REQUEST");

    // DELETE: 204 without a body, then 404.
    let r = api
        .raw(
            "DELETE",
            "/api/v5/lite/parents/jobs",
            &[("Authorization", &format!("Bearer {TOKEN}"))],
            None,
        )
        .await;
    assert_eq!(r.status, 204, "{}", r.body);
    assert!(r.body.is_empty());
    let (st, v) = api.call("GET", "/api/v5/lite/parents/jobs", None).await;
    assert_error(st, &v, 404, "NOT_FOUND");
    let (st, v) = api.call("DELETE", "/api/v5/lite/parents/jobs", None).await;
    assert_error(st, &v, 404, "NOT_FOUND");
    let list = api.ok("GET", "/api/v5/lite/parents", None).await;
    assert_eq!(list["data"].as_array().unwrap().len(), 1, "{list}");

    // A wrong method is 405.
    let (st, v) = api
        .call("POST", "/api/v5/lite/parents/agents", Some(json!({})))
        .await;
    assert_error(st, &v, 405, "METHOD_NOT_ALLOWED");
    let (st, v) = api.call("DELETE", "/api/v5/lite/metrics", None).await;
    assert_error(st, &v, 405, "METHOD_NOT_ALLOWED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lanes_route_is_401_without_or_with_a_wrong_token() {
    let (_s, api) = server().await;
    for (m, p) in lanemq_admin::ROUTES
        .iter()
        .filter(|(_, p)| p.starts_with("/api/v5/lite/"))
    {
        let path = p
            .replace("{name}", "agents")
            .replace("{lane}", "k")
            .replace("{group}", "g");
        let body = matches!(*m, "POST" | "PUT").then_some("{}");
        for headers in [
            vec![],
            vec![("Authorization", "Bearer wrong")],
            vec![("Authorization", "Basic bGFuZW1xOg==")],
        ] {
            let r = api.raw(m, &path, &headers, body).await;
            assert_eq!(r.status, 401, "{m} {path} {headers:?}: {}", r.body);
            let v: Value = serde_json::from_str(&r.body).unwrap();
            assert_error(r.status, &v, 401, "BAD_TOKEN");
            assert!(r.header("www-authenticate").is_some());
        }
    }
    // Nothing was created by the refused POST.
    let list = api.ok("GET", "/api/v5/lite/parents", None).await;
    assert_eq!(list["data"], json!([]));
}

// --- lanes, groups, lag, metrics ------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_are_listed_by_cursor_shown_with_group_figures_and_counted_in_metrics() {
    let (s, api) = server().await;
    api.ok(
        "POST",
        "/api/v5/lite/parents",
        Some(json!({ "name": "agents", "pattern": "agents/{lane}/#" })),
    )
    .await;
    api.ok(
        "POST",
        "/api/v5/lite/parents",
        Some(json!({ "name": "deep", "pattern": "deep/{lane}", "key_levels": 2, "ttl_s": 120 })),
    )
    .await;

    // No lanes yet.
    let page = api
        .ok("GET", "/api/v5/lite/parents/agents/lanes", None)
        .await;
    assert_eq!(page["data"], json!([]));
    assert_eq!(page["meta"]["hasnext"], false);
    let text = api.metrics_text().await.body;
    assert_eq!(sample(&text, "lanemq_lite_lanes"), 0, "{text}");

    // 12 lanes agents/k00..k11/x; k03 gets 3 messages; one lane of two levels in `deep`.
    let before = now_us();
    let mut p = s.v5("producer").await;
    for i in 0..12 {
        let n = if i == 3 { 3 } else { 1 };
        publish_all(&mut p, &format!("agents/k{i:02}/x"), n).await;
    }
    publish_all(&mut p, "deep/s/42", 2).await;
    // Not in a parent: no lane.
    publish_all(&mut p, "elsewhere/k/x", 1).await;
    let after = now_us();

    // Pages of 5 follow the cursor: 5 + 5 + 2, every lane once, sorted by key.
    let (lanes, sizes) = api.all_pages("/api/v5/lite/parents/agents/lanes", 5).await;
    assert_eq!(sizes, [5, 5, 2]);
    let keys: Vec<&str> = lanes.iter().map(|l| l["lane"].as_str().unwrap()).collect();
    let want: Vec<String> = (0..12).map(|i| format!("k{i:02}")).collect();
    assert_eq!(keys, want);
    let ids: BTreeSet<u64> = lanes.iter().map(|l| l["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), 12, "distinct lane ids");
    for l in &lanes {
        let next = if l["lane"] == "k03" { 3 } else { 1 };
        assert_eq!(l["next_offset"], next, "{l}");
        let last = l["last_publish_us"].as_u64().unwrap();
        assert!((before..=after).contains(&last), "{l}");
        assert_eq!(
            l["expires_at_us"].as_u64().unwrap(),
            last + 3600 * 1_000_000,
            "{l}"
        );
    }
    // One big page; `cursor` is an alias of `after`; an empty `after` starts at the beginning.
    let (all, sizes) = api
        .all_pages("/api/v5/lite/parents/agents/lanes", 100)
        .await;
    assert_eq!((all.len(), sizes), (12, vec![12]));
    let page = api
        .ok(
            "GET",
            "/api/v5/lite/parents/agents/lanes?limit=2&cursor=k09",
            None,
        )
        .await;
    let keys: Vec<&str> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["lane"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["k10", "k11"]);
    assert_eq!(page["meta"]["hasnext"], false);
    let page = api
        .ok(
            "GET",
            "/api/v5/lite/parents/agents/lanes?limit=1&after=",
            None,
        )
        .await;
    assert_eq!(page["data"][0]["lane"], "k00");
    assert_eq!(page["meta"]["cursor"], "k00");
    assert_eq!(page["meta"]["hasnext"], true);
    // Bad page queries are 400.
    for q in [
        "limit=0",
        "limit=10001",
        "limit=x",
        "colour=red",
        "after=a&cursor=b",
    ] {
        let (st, v) = api
            .call(
                "GET",
                &format!("/api/v5/lite/parents/agents/lanes?{q}"),
                None,
            )
            .await;
        assert_error(st, &v, 400, "BAD_REQUEST");
    }

    // The first offset comes from the index (written once the records are durable).
    let k03 = api
        .wait("/api/v5/lite/parents/agents/lanes/k03", "indexed", |v| {
            v["first_offset"] == 0
        })
        .await;
    assert_eq!(k03["lane"], "k03");
    assert_eq!(k03["next_offset"], 3);
    assert_eq!(k03["groups"], json!([]), "no group yet: {k03}");
    // A key of two levels: url-encoded or not.
    let deep = api
        .ok("GET", "/api/v5/lite/parents/deep/lanes/s%2F42", None)
        .await;
    assert_eq!(deep["lane"], "s/42");
    assert_eq!(deep["next_offset"], 2);
    assert_eq!(
        deep["expires_at_us"].as_u64().unwrap(),
        deep["last_publish_us"].as_u64().unwrap() + 120 * 1_000_000
    );
    let deep2 = api
        .ok("GET", "/api/v5/lite/parents/deep/lanes/s/42", None)
        .await;
    assert_eq!(deep2["id"], deep["id"]);
    let (lanes, _) = api.all_pages("/api/v5/lite/parents/deep/lanes", 10).await;
    assert_eq!(lanes.len(), 1);
    let (st, v) = api
        .call("GET", "/api/v5/lite/parents/agents/lanes/k99", None)
        .await;
    let msg = assert_error(st, &v, 404, "NOT_FOUND");
    assert!(msg.contains("k99") && msg.contains("agents"), "{msg}");
    let (st, v) = api
        .call("GET", "/api/v5/lite/parents/deep/lanes/s", None)
        .await;
    assert_error(st, &v, 404, "NOT_FOUND");

    // The parent counts its lanes; with lanes its pattern cannot change (409).
    let agents = api.ok("GET", "/api/v5/lite/parents/agents", None).await;
    assert_eq!(agents["lanes"], 12);
    let (st, v) = api
        .call(
            "PUT",
            "/api/v5/lite/parents/agents",
            Some(json!({ "pattern": "agents/+/{lane}" })),
        )
        .await;
    assert_error(st, &v, 409, "CONFLICT");
    // Other fields may change.
    let upd = api
        .ok(
            "PUT",
            "/api/v5/lite/parents/agents",
            Some(json!({ "pattern": "agents/{lane}/#", "ttl_s": 600 })),
        )
        .await;
    assert_eq!(
        (upd["ttl_s"].clone(), upd["lanes"].clone()),
        (json!(600), json!(12))
    );
    let k00 = api
        .ok("GET", "/api/v5/lite/parents/agents/lanes/k00", None)
        .await;
    assert_eq!(
        k00["expires_at_us"].as_u64().unwrap(),
        k00["last_publish_us"].as_u64().unwrap() + 600 * 1_000_000,
        "the new TTL applies: {k00}"
    );

    // No groups yet; an unknown group is 404.
    let groups = api
        .ok("GET", "/api/v5/lite/parents/agents/groups", None)
        .await;
    assert_eq!(groups["data"], json!([]));
    let (st, v) = api
        .call(
            "GET",
            "/api/v5/lite/parents/agents/groups/workers/lag",
            None,
        )
        .await;
    let msg = assert_error(st, &v, 404, "NOT_FOUND");
    assert!(msg.contains("workers"), "{msg}");

    // A group of one member takes all 14 messages and acknowledges none yet.
    let mut w = s.v5("w1").await;
    let ack = w
        .subscribe_with(
            &[("$share/workers/agents/+/#", sub_opts(QoS::AtLeastOnce))],
            None,
        )
        .await;
    assert_eq!(ack.reason_codes, vec![1]);
    let got = recv_unacked(&mut w, 14).await;

    let groups = api
        .wait("/api/v5/lite/parents/agents/groups", "in flight", |v| {
            v["data"][0]["inflight"] == 14
        })
        .await;
    assert_eq!(groups["meta"]["count"], 1);
    let g = &groups["data"][0];
    assert_eq!(g["group"], "workers");
    assert_eq!(g["members"], json!(["w1"]));
    assert_eq!(g["online_members"], 1);
    assert_eq!(g["active_lanes"], 12);

    // Lag per lane, paginated like the lanes: nothing committed.
    let (rows, sizes) = api
        .all_pages("/api/v5/lite/parents/agents/groups/workers/lag", 5)
        .await;
    assert_eq!(sizes, [5, 5, 2]);
    for r in &rows {
        let next = if r["lane"] == "k03" { 3 } else { 1 };
        assert_eq!(r["committed"], 0, "{r}");
        assert_eq!(r["next_offset"], next, "{r}");
        assert_eq!(r["lag"], next, "{r}");
        assert_eq!(r["inflight"], next, "{r}");
        assert_eq!(r["holder"], "w1", "{r}");
    }
    let page = api
        .ok(
            "GET",
            "/api/v5/lite/parents/agents/groups/workers/lag?limit=1&after=k02",
            None,
        )
        .await;
    assert_eq!(page["group"], "workers");
    assert_eq!(page["data"][0]["lane"], "k03");
    assert_eq!(page["meta"]["cursor"], "k03");
    let (st, v) = api
        .call(
            "GET",
            "/api/v5/lite/parents/agents/groups/workers/lag?limit=0",
            None,
        )
        .await;
    assert_error(st, &v, 400, "BAD_REQUEST");

    // The lane detail shows the group.
    let k03 = api
        .ok("GET", "/api/v5/lite/parents/agents/lanes/k03", None)
        .await;
    let gs = k03["groups"].as_array().unwrap();
    assert_eq!(gs.len(), 1, "{k03}");
    assert_eq!(gs[0]["group"], "workers");
    assert_eq!(gs[0]["lane"], "k03");
    assert_eq!(gs[0]["committed"], 0);
    assert_eq!(gs[0]["lag"], 3);
    assert_eq!(gs[0]["inflight"], 3);
    assert_eq!(gs[0]["holder"], "w1");

    // Acknowledge everything: committed reaches the next offset, the lag is 0.
    for p in &got {
        w.send(Packet::PubAck(PubResp::new(p.packet_id, 0))).await;
    }
    let k03 = api
        .wait("/api/v5/lite/parents/agents/lanes/k03", "committed", |v| {
            v["groups"][0]["committed"] == 3
        })
        .await;
    assert_eq!(k03["groups"][0]["lag"], 0);
    assert_eq!(k03["groups"][0]["inflight"], 0);
    let (rows, _) = api
        .all_pages("/api/v5/lite/parents/agents/groups/workers/lag", 100)
        .await;
    for r in &rows {
        assert_eq!(r["lag"], 0, "{r}");
        assert_eq!(r["committed"], r["next_offset"], "{r}");
    }

    // New messages show up as lag on their lane.
    w.unsubscribe("$share/workers/agents/+/#").await;
    publish_all(&mut p, "agents/k05/y", 2).await;
    let row = api
        .wait(
            "/api/v5/lite/parents/agents/groups/workers/lag?limit=1&after=k04",
            "lagging",
            |v| v["data"][0]["lag"] == 2,
        )
        .await;
    assert_eq!(row["data"][0]["lane"], "k05");
    assert_eq!(row["data"][0]["next_offset"], 3);
    assert_eq!(row["data"][0]["committed"], 1);

    // Metrics: Prometheus text with HELP and TYPE for every family.
    let r = api.metrics_text().await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-type"),
        Some(lanemq_admin::METRICS_CONTENT_TYPE),
        "{:?}",
        r.headers
    );
    let text = r.body;
    assert_eq!(sample(&text, "lanemq_lite_lanes"), 13, "{text}");
    assert_eq!(sample(&text, "lanemq_lite_parents"), 2, "{text}");
    assert!(
        text.contains("lanemq_lite_parent_lanes{parent=\"agents\"} 12\n"),
        "{text}"
    );
    assert!(
        text.contains("lanemq_lite_parent_lanes{parent=\"deep\"} 1\n"),
        "{text}"
    );
    assert_eq!(sample(&text, "lanemq_lite_lanes_created_total"), 13);
    assert_eq!(sample(&text, "lanemq_lite_lanes_expired_total"), 0);
    assert_eq!(sample(&text, "lanemq_lite_dead_lettered_total"), 0);
    assert_eq!(sample(&text, "lanemq_lite_publish_refused_total"), 0);
    assert!(sample(&text, "lanemq_lite_committed_total") >= 14, "{text}");
    assert!(sample(&text, "lanemq_lite_indexed_total") >= 16, "{text}");
    assert!(text.contains("# TYPE lanemq_lite_lanes gauge\n"), "{text}");
    for c in [
        "lanes_created",
        "lanes_expired",
        "suspended",
        "retried",
        "redelivered",
        "dead_lettered",
        "committed",
        "publish_refused",
        "indexed",
    ] {
        let name = format!("lanemq_lite_{c}_total");
        assert!(text.contains(&format!("# HELP {name} ")), "{name}: {text}");
        assert!(
            text.contains(&format!("# TYPE {name} counter\n")),
            "{name}: {text}"
        );
        sample(&text, &name);
    }
    // Every non-comment line is `name[{labels}] value`.
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let (n, v) = l.rsplit_once(' ').unwrap();
        assert!(n.starts_with("lanemq_lite_"), "{l}");
        v.parse::<u64>().unwrap();
    }
    // A scraper's Accept gets text; an explicit JSON Accept gets JSON.
    let auth = format!("Bearer {TOKEN}");
    let r = api
        .raw(
            "GET",
            "/api/v5/lite/metrics",
            &[
                ("Authorization", &auth),
                (
                    "Accept",
                    "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
                ),
            ],
            None,
        )
        .await;
    assert!(r.body.starts_with("# HELP"), "{}", r.body);
    let j = api.ok("GET", "/api/v5/lite/metrics", None).await;
    assert_eq!(j["lanemq_lite_lanes"], 13, "{j}");
    assert_eq!(j["lanemq_lite_lanes_created_total"], 13, "{j}");
    assert_eq!(j["lanemq_lite_parent_lanes"]["agents"], 12, "{j}");

    // A refused publish (key longer than max_key_bytes) is counted.
    let long = "k".repeat(65);
    let code = p.publish_qos1(&format!("agents/{long}/x"), b"x").await;
    assert_eq!(code, 0x90);
    let text = api.metrics_text().await.body;
    assert_eq!(
        sample(&text, "lanemq_lite_publish_refused_total"),
        1,
        "{text}"
    );
    // The REST publish gets the same refusal (a 400 saying why), and nothing is stored.
    let (st, v) = api
        .call(
            "POST",
            "/api/v5/publish",
            Some(json!({ "topic": format!("agents/{long}/x"), "payload": "x", "qos": 1 })),
        )
        .await;
    assert_error(st, &v, 400, "BAD_REQUEST");
    assert!(
        v["message"]
            .as_str()
            .unwrap_or("")
            .contains("max_key_bytes"),
        "{v}"
    );
    let text = api.metrics_text().await.body;
    assert_eq!(
        sample(&text, "lanemq_lite_publish_refused_total"),
        2,
        "{text}"
    );

    // Deleting the parent removes its lanes and groups.
    let (st, _) = api
        .call("DELETE", "/api/v5/lite/parents/agents", None)
        .await;
    assert_eq!(st, 204);
    let (st, v) = api
        .call("GET", "/api/v5/lite/parents/agents/lanes", None)
        .await;
    assert_error(st, &v, 404, "NOT_FOUND");
    let (st, v) = api
        .call("GET", "/api/v5/lite/parents/agents/groups", None)
        .await;
    assert_error(st, &v, 404, "NOT_FOUND");
    let text = api.metrics_text().await.body;
    assert_eq!(sample(&text, "lanemq_lite_lanes"), 1, "{text}");
    assert_eq!(sample(&text, "lanemq_lite_parents"), 1, "{text}");
    // Re-created, it starts without lanes or groups; a publish starts a lane at offset 0.
    api.ok(
        "POST",
        "/api/v5/lite/parents",
        Some(json!({ "name": "agents", "pattern": "agents/{lane}/#" })),
    )
    .await;
    let groups = api
        .ok("GET", "/api/v5/lite/parents/agents/groups", None)
        .await;
    assert_eq!(groups["data"], json!([]), "{groups}");
    publish_all(&mut p, "agents/k03/x", 1).await;
    let k03 = api
        .ok("GET", "/api/v5/lite/parents/agents/lanes/k03", None)
        .await;
    assert_eq!(k03["next_offset"], 1, "{k03}");
    assert_eq!(k03["groups"], json!([]), "{k03}");
}

// --- the command line -----------------------------------------------------------------------

/// `lanemq lanes --url ADDR --token TOKEN <args>`.
async fn cli(api: &Api, args: &[&str]) -> Output {
    let mut cmd = Command::new(child::lanemq_bin());
    cmd.arg("lanes")
        .args(["--url", &api.addr, "--token", TOKEN])
        .args(args)
        .env_remove("LANEMQ_ADMIN_TOKEN")
        .env_remove("LANEMQ_ADMIN_ADDR")
        .stdin(Stdio::null());
    tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap()
}

async fn cli_ok(api: &Api, args: &[&str]) -> String {
    let out = cli(api, args).await;
    assert!(
        out.status.success(),
        "lanemq lanes {args:?}: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

async fn cli_err(api: &Api, args: &[&str]) -> String {
    let out = cli(api, args).await;
    assert!(
        !out.status.success(),
        "lanemq lanes {args:?} should fail; stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr).unwrap()
}

fn rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanemq_lanes_cli_manages_parents_and_reads_lanes_groups_lag_and_metrics() {
    let (s, api) = server().await;
    let dir = child::TempDir::new("lanes-cli");
    let toml_file = dir.0.join("agents.toml");
    std::fs::write(
        &toml_file,
        "# a lite parent\nname = \"agents\"\npattern = \"agents/{lane}/#\"\nttl_s = 900\nmode = \"exclusive\"\n",
    )
    .unwrap();
    let json_file = dir.0.join("jobs.json");
    std::fs::write(
        &json_file,
        r#"{"name":"jobs","pattern":"jobs/{lane}","batch":8}"#,
    )
    .unwrap();
    let bad_file = dir.0.join("bad.json");
    std::fs::write(&bad_file, r#"{"name":"bad name","pattern":"x/#"}"#).unwrap();
    let (toml_f, json_f, bad_f) = (
        toml_file.to_str().unwrap(),
        json_file.to_str().unwrap(),
        bad_file.to_str().unwrap(),
    );

    // create: TOML and JSON bodies.
    let v: Value =
        serde_json::from_str(&cli_ok(&api, &["create", "--file", toml_f]).await).unwrap();
    assert_eq!(v["name"], "agents");
    assert_eq!(v["ttl_s"], 900);
    assert_eq!(v["mode"], "exclusive");
    let v: Value =
        serde_json::from_str(&cli_ok(&api, &["create", "--file", json_f]).await).unwrap();
    assert_eq!(v["batch"], 8);
    let err = cli_err(&api, &["create", "--file", json_f]).await;
    assert!(err.contains("HTTP 409 ALREADY_EXISTS"), "{err}");
    let err = cli_err(&api, &["create", "--file", bad_f]).await;
    assert!(err.contains("HTTP 400 BAD_REQUEST"), "{err}");
    assert!(err.contains("name:") && err.contains("pattern:"), "{err}");
    let err = cli_err(&api, &["create", "--file", "/nonexistent/x.toml"]).await;
    assert!(err.contains("cannot read"), "{err}");

    // parents, parent.
    let t = cli_ok(&api, &["parents"]).await;
    assert_eq!(
        rows(&t),
        vec![
            vec!["NAME", "PATTERN", "MODE", "TTL_S", "LANES"],
            vec!["agents", "agents/{lane}/#", "exclusive", "900", "0"],
            vec!["jobs", "jobs/{lane}", "shared", "3600", "0"],
        ],
        "{t}"
    );
    let v: Value = serde_json::from_str(&cli_ok(&api, &["parents", "--json"]).await).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);
    let v: Value = serde_json::from_str(&cli_ok(&api, &["parent", "jobs"]).await).unwrap();
    assert_eq!(v["pattern"], "jobs/{lane}");
    let err = cli_err(&api, &["parent", "nope"]).await;
    assert!(err.contains("HTTP 404 NOT_FOUND"), "{err}");

    // update: the file replaces the definition.
    std::fs::write(&json_file, r#"{"pattern":"jobs/{lane}","ttl_s":30}"#).unwrap();
    let v: Value =
        serde_json::from_str(&cli_ok(&api, &["update", "jobs", "--file", json_f]).await).unwrap();
    assert_eq!(
        (v["ttl_s"].clone(), v["batch"].clone()),
        (json!(30), json!(32))
    );

    // Lanes to list: agents/a0..a4, a2 with 2 messages; one lane of jobs.
    let mut p = s.v5("cli-producer").await;
    for i in 0..5 {
        publish_all(
            &mut p,
            &format!("agents/a{i}/req"),
            if i == 2 { 2 } else { 1 },
        )
        .await;
    }
    publish_all(&mut p, "jobs/j1", 1).await;

    let out = cli(&api, &["list", "agents", "--limit", "2"]).await;
    assert!(out.status.success());
    let t = String::from_utf8(out.stdout).unwrap();
    let r = rows(&t);
    assert_eq!(
        r[0],
        ["LANE", "FIRST", "NEXT", "LAST_PUBLISH", "EXPIRES"],
        "{t}"
    );
    let keys: Vec<&str> = r[1..].iter().map(|c| c[0].as_str()).collect();
    assert_eq!(keys, ["a0", "a1"], "{t}");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("--after \"a1\""), "the next cursor: {err}");
    let t = cli_ok(&api, &["list", "agents", "--after", "a1"]).await;
    let keys: Vec<String> = rows(&t)[1..].iter().map(|c| c[0].clone()).collect();
    assert_eq!(keys, ["a2", "a3", "a4"], "{t}");
    assert_eq!(rows(&t)[1][2], "2", "a2 next offset: {t}");
    // --json, with a limit above the page size: every lane, once.
    let v: Value =
        serde_json::from_str(&cli_ok(&api, &["list", "agents", "--json"]).await).unwrap();
    let keys: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["lane"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["a0", "a1", "a2", "a3", "a4"]);
    let err = cli_err(&api, &["list", "nope"]).await;
    assert!(err.contains("HTTP 404 NOT_FOUND"), "{err}");

    // show.
    let v: Value = serde_json::from_str(&cli_ok(&api, &["show", "agents", "a2"]).await).unwrap();
    assert_eq!(v["lane"], "a2");
    assert_eq!(v["next_offset"], 2);
    assert_eq!(v["groups"], json!([]));
    let err = cli_err(&api, &["show", "agents", "zz"]).await;
    assert!(err.contains("HTTP 404 NOT_FOUND"), "{err}");

    // groups and lag with a group that holds everything unacknowledged.
    let mut w = s.v5("cli-worker").await;
    w.subscribe_with(
        &[("$share/crew/agents/+/#", sub_opts(QoS::AtLeastOnce))],
        None,
    )
    .await;
    let got = recv_unacked(&mut w, 6).await;
    api.wait("/api/v5/lite/parents/agents/groups", "in flight", |v| {
        v["data"][0]["inflight"] == 6
    })
    .await;
    let t = cli_ok(&api, &["groups", "agents"]).await;
    assert_eq!(
        rows(&t),
        vec![
            vec!["GROUP", "MEMBERS", "ONLINE", "ACTIVE_LANES", "INFLIGHT"],
            vec!["crew", "1", "1", "5", "6"],
        ],
        "{t}"
    );
    let t = cli_ok(&api, &["lag", "agents", "crew"]).await;
    let r = rows(&t);
    assert_eq!(
        r[0],
        ["LANE", "COMMITTED", "NEXT", "LAG", "INFLIGHT", "HOLDER"],
        "{t}"
    );
    assert_eq!(r[3], ["a2", "0", "2", "2", "2", "cli-worker"], "{t}");
    assert_eq!(
        r.last().unwrap().join(" "),
        "total lag 6 over 5 lanes",
        "{t}"
    );
    for p in &got {
        w.send(Packet::PubAck(PubResp::new(p.packet_id, 0))).await;
    }
    api.wait("/api/v5/lite/parents/agents/lanes/a2", "committed", |v| {
        v["groups"][0]["lag"] == 0
    })
    .await;
    let v: Value =
        serde_json::from_str(&cli_ok(&api, &["lag", "agents", "crew", "--json"]).await).unwrap();
    assert!(v.as_array().unwrap().iter().all(|r| r["lag"] == 0), "{v}");
    let err = cli_err(&api, &["lag", "agents", "nobody"]).await;
    assert!(err.contains("HTTP 404 NOT_FOUND"), "{err}");

    // metrics: the Prometheus text as is.
    let t = cli_ok(&api, &["metrics"]).await;
    assert_eq!(sample(&t, "lanemq_lite_lanes"), 6, "{t}");
    assert_eq!(sample(&t, "lanemq_lite_lanes_created_total"), 6, "{t}");
    assert!(
        t.contains("# TYPE lanemq_lite_committed_total counter"),
        "{t}"
    );

    // delete.
    assert_eq!(
        cli_ok(&api, &["delete", "jobs"]).await.trim(),
        "lite parent jobs deleted"
    );
    let err = cli_err(&api, &["delete", "jobs"]).await;
    assert!(err.contains("HTTP 404 NOT_FOUND"), "{err}");
    let t = cli_ok(&api, &["parents"]).await;
    assert_eq!(rows(&t).len(), 2, "{t}");
    assert_eq!(rows(&t)[1][4], "5", "agents has 5 lanes: {t}");

    // The connection options: a wrong token is 401.
    let out = Command::new(child::lanemq_bin())
        .args(["lanes", "parents", "--url", &api.addr, "--token", "wrong"])
        .env_remove("LANEMQ_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("HTTP 401 BAD_TOKEN"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parents_lanes_and_group_offsets_made_over_rest_survive_a_restart() {
    let port = child::free_port();
    let mut b = child::Broker::start_with_acl(
        "lanes-restart",
        "default allow\n",
        &format!("[admin]\nenable = true\nbind = \"127.0.0.1:{port}\"\ntoken = \"{TOKEN}\"\n\n"),
    )
    .await;
    let api = Api {
        addr: format!("127.0.0.1:{port}"),
    };
    for (name, pattern) in [("agents", "agents/{lane}/#"), ("gone", "gone/{lane}")] {
        api.ok(
            "POST",
            "/api/v5/lite/parents",
            Some(json!({ "name": name, "pattern": pattern, "ttl_s": 600 })),
        )
        .await;
    }
    let mut p = RawClient::connect_ok(b.addr, connect_v5("producer")).await;
    publish_all(&mut p, "agents/r1/x", 3).await;
    publish_all(&mut p, "agents/r2/x", 1).await;
    publish_all(&mut p, "gone/g1", 1).await;
    let mut w = RawClient::connect_ok(b.addr, connect_v5("w1")).await;
    w.subscribe_with(
        &[("$share/workers/agents/+/#", sub_opts(QoS::AtLeastOnce))],
        None,
    )
    .await;
    for p in recv_unacked(&mut w, 4).await {
        w.send(Packet::PubAck(PubResp::new(p.packet_id, 0))).await;
    }
    api.wait("/api/v5/lite/parents/agents/lanes/r1", "committed", |v| {
        v["groups"][0]["committed"] == 3
    })
    .await;
    w.unsubscribe("$share/workers/agents/+/#").await;
    publish_all(&mut p, "agents/r2/x", 1).await;
    let (st, _) = api.call("DELETE", "/api/v5/lite/parents/gone", None).await;
    assert_eq!(st, 204);
    p.disconnect().await;
    w.disconnect().await;
    let status = b.terminate().await;
    assert!(status.success(), "{status}: {}", b.log_tail(40));
    b.restart().await;
    let list = api.ok("GET", "/api/v5/lite/parents", None).await;
    let names: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["agents"], "{list}");
    assert_eq!(list["data"][0]["ttl_s"], 600);
    assert_eq!(list["data"][0]["lanes"], 2);
    let (lanes, _) = api.all_pages("/api/v5/lite/parents/agents/lanes", 10).await;
    let figures: Vec<(String, u64, u64)> = lanes
        .iter()
        .map(|l| {
            (
                l["lane"].as_str().unwrap().to_string(),
                l["first_offset"].as_u64().unwrap(),
                l["next_offset"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        figures,
        [("r1".to_string(), 0, 3), ("r2".to_string(), 0, 2)],
        "{lanes:?}"
    );
    let groups = api
        .ok("GET", "/api/v5/lite/parents/agents/groups", None)
        .await;
    assert_eq!(groups["data"][0]["group"], "workers", "{groups}");
    assert_eq!(groups["data"][0]["members"], json!([]), "{groups}");
    let (rows, _) = api
        .all_pages("/api/v5/lite/parents/agents/groups/workers/lag", 10)
        .await;
    let lag: Vec<(u64, u64)> = rows
        .iter()
        .map(|r| (r["committed"].as_u64().unwrap(), r["lag"].as_u64().unwrap()))
        .collect();
    assert_eq!(lag, [(3, 0), (1, 1)], "{rows:?}");
    let text = api.metrics_text().await.body;
    assert_eq!(sample(&text, "lanemq_lite_lanes"), 2, "{text}");
    assert_eq!(sample(&text, "lanemq_lite_parents"), 1, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_created_after_a_shared_subscription_turns_it_into_a_lane_group() {
    let s = TestServer::start(admin_config()).await;
    let api = Api::of(&s);
    // Two members of `$share/late/jobs/+/#` while no parent covers `jobs/+/#`: a plain
    // round-robin group in the router.
    let mut members = Vec::new();
    for i in 0..2 {
        let mut m = s.v5(&format!("late-{i}")).await;
        m.subscribe("$share/late/jobs/+/#", QoS::AtLeastOnce).await;
        members.push(m);
    }
    let mut p = s.v5("late-pub").await;
    p.publish_qos1("jobs/a/x", b"before").await;
    let mut before = Vec::new();
    for m in &mut members {
        if let Ok(Packet::Publish(d)) = m.try_recv(Duration::from_millis(300)).await {
            m.send(Packet::PubAck(PubResp::new(d.packet_id, 0))).await;
            before.push(d);
        }
    }
    assert_eq!(before.len(), 1, "one member got it");
    assert_eq!(user_prop(&before[0], "lane"), None, "not a lane yet");

    // The parent appears: the group becomes a lane group (lanes, offsets, one member per
    // batch), without anyone subscribing again.
    api.ok(
        "POST",
        "/api/v5/lite/parents",
        Some(json!({"name": "jobs", "pattern": "jobs/{lane}/#"})),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    for i in 0..3 {
        p.publish_qos1("jobs/a/x", format!("a{i}").as_bytes()).await;
        p.publish_qos1("jobs/b/x", format!("b{i}").as_bytes()).await;
    }
    let mut got: Vec<(usize, Publish)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < 6 && Instant::now() < deadline {
        for (i, m) in members.iter_mut().enumerate() {
            if let Ok(Packet::Publish(d)) = m.try_recv(Duration::from_millis(50)).await {
                m.send(Packet::PubAck(PubResp::new(d.packet_id, 0))).await;
                got.push((i, d));
            }
        }
    }
    assert_eq!(got.len(), 6, "{got:?}");
    for lane in ["a", "b"] {
        let ds: Vec<&Publish> = got
            .iter()
            .map(|(_, d)| d)
            .filter(|d| user_prop(d, "lane") == Some(lane))
            .collect();
        let payloads: Vec<String> = ds
            .iter()
            .map(|d| String::from_utf8_lossy(&d.payload).into_owned())
            .collect();
        assert_eq!(
            payloads,
            [0, 1, 2].map(|i| format!("{lane}{i}")),
            "lane {lane} in order"
        );
        let offsets: Vec<&str> = ds
            .iter()
            .filter_map(|d| user_prop(d, "lane-offset"))
            .collect();
        assert_eq!(
            offsets.len(),
            3,
            "lane {lane}: every delivery carries lane-offset"
        );
        assert!(ds.iter().all(|d| d.qos == QoS::AtLeastOnce));
    }
}
