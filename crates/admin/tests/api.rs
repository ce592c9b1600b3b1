//! The admin API over real HTTP: a fake in-memory backend, the router served on 127.0.0.1:0,
//! driven with the crate's own blocking client.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lanemq_admin::client::{request, request_with_headers};
use lanemq_admin::{
    router_with, serve, AdminBackend, ClientInfo, Kicked, LaneDetail, LiteMetrics, RouterOptions,
    SubscriptionInfo, ROUTES,
};
use lanemq_lite::{LaneInfo, LiteError, ParentDef, ParentInfo};
use lanemq_streams::{GlobalSettings, StreamDef, StreamError, StreamInfo, StreamStats};
use serde_json::{json, Value};

const TOKEN: &str = "test-token-0123456789";

#[derive(Default)]
struct Fake {
    streams: Mutex<BTreeMap<String, StreamInfo>>,
    settings: Mutex<GlobalSettings>,
    reload_error: Mutex<Option<String>>,
    parents: Mutex<BTreeMap<String, ParentInfo>>,
    kicked: Mutex<Vec<String>>,
}

/// The fake's sessions: (client id, username, connected).
const CLIENTS: [(&str, &str, bool); 4] = [
    ("dev-2", "alice", true),
    ("dev-1", "alice", false),
    ("app-1", "bob", true),
    ("dev-10", "carol", true),
];

fn fake_retained(topic: &str) -> lanemq_admin::RetainedInfo {
    lanemq_admin::RetainedInfo {
        topic: topic.to_string(),
        msgid: "1".into(),
        qos: 1,
        from_clientid: "c".into(),
        from_username: None,
        publish_at: 5,
        payload_bytes: 2,
    }
}

fn fake_client(id: &str, user: &str, connected: bool) -> ClientInfo {
    ClientInfo {
        clientid: id.to_string(),
        username: Some(user.to_string()),
        ip_address: Some("127.0.0.1".into()),
        connected,
        connected_at: Some(1),
        proto_ver: 5,
        proto_name: "MQTT",
        expiry_interval: 0,
        subscriptions_cnt: 1,
        mqueue_len: 0,
        inflight_cnt: 0,
        mqueue_dropped: 0,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn invalid_or_ok(def: &StreamDef) -> Result<(), StreamError> {
    let errs = def.validate();
    if errs.is_empty() {
        Ok(())
    } else {
        Err(StreamError::Invalid(errs))
    }
}

impl AdminBackend for Fake {
    fn list_streams(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<StreamInfo>, bool), StreamError> {
        let m = lock(&self.streams);
        let lower = match after {
            Some(a) => Bound::Excluded(a.to_string()),
            None => Bound::Unbounded,
        };
        let mut page: Vec<StreamInfo> = m
            .range((lower, Bound::Unbounded))
            .take(limit + 1)
            .map(|(_, v)| v.clone())
            .collect();
        let more = page.len() > limit;
        page.truncate(limit);
        Ok((page, more))
    }

    fn get_stream(&self, name: &str) -> Result<StreamInfo, StreamError> {
        if name == "slow" {
            std::thread::sleep(Duration::from_millis(1500));
        }
        lock(&self.streams)
            .get(name)
            .cloned()
            .ok_or_else(|| StreamError::NotFound(name.to_string()))
    }

    fn create_stream(&self, def: StreamDef) -> Result<StreamInfo, StreamError> {
        invalid_or_ok(&def)?;
        let settings = lock(&self.settings).clone();
        if !settings.enable {
            return Err(StreamError::Disabled);
        }
        let mut m = lock(&self.streams);
        if m.contains_key(&def.name) {
            return Err(StreamError::AlreadyExists(def.name));
        }
        if m.len() >= settings.max_stream_count as usize {
            return Err(StreamError::MaxStreamCount(settings.max_stream_count));
        }
        let info = StreamInfo {
            def: def.clone(),
            created_at_us: 1_700_000_000_000_000 + m.len() as u64,
            stats: StreamStats::default(),
        };
        m.insert(def.name, info.clone());
        Ok(info)
    }

    fn update_stream(&self, name: &str, def: StreamDef) -> Result<StreamInfo, StreamError> {
        invalid_or_ok(&def)?;
        let mut m = lock(&self.streams);
        let cur = m
            .get_mut(name)
            .ok_or_else(|| StreamError::NotFound(name.to_string()))?;
        if cur.def.topic_filter != def.topic_filter {
            return Err(StreamError::Immutable("topic_filter"));
        }
        if cur.def.is_lastvalue != def.is_lastvalue {
            return Err(StreamError::Immutable("is_lastvalue"));
        }
        cur.def = def;
        Ok(cur.clone())
    }

    fn delete_stream(&self, name: &str) -> Result<(), StreamError> {
        lock(&self.streams)
            .remove(name)
            .map(|_| ())
            .ok_or_else(|| StreamError::NotFound(name.to_string()))
    }

    fn get_settings(&self) -> GlobalSettings {
        lock(&self.settings).clone()
    }

    fn put_settings(&self, s: GlobalSettings) -> Result<GlobalSettings, StreamError> {
        let errs = s.validate();
        if !errs.is_empty() {
            return Err(StreamError::Invalid(errs));
        }
        *lock(&self.settings) = s.clone();
        Ok(s)
    }

    fn reload_authorization(&self) -> Result<String, String> {
        match lock(&self.reload_error).clone() {
            Some(e) => Err(e),
            None => Ok("12 rules loaded".to_string()),
        }
    }

    fn stats(&self) -> Value {
        json!({ "connections": 3, "streams": lock(&self.streams).len() })
    }

    // Lite parents: an in-memory registry without lanes (the real ones: tests/lanes_admin.rs).

    fn list_parents(&self) -> Vec<ParentInfo> {
        lock(&self.parents).values().cloned().collect()
    }

    fn get_parent(&self, name: &str) -> Result<ParentInfo, LiteError> {
        lock(&self.parents)
            .get(name)
            .cloned()
            .ok_or_else(|| LiteError::NotFound(name.to_string()))
    }

    fn create_parent(&self, def: ParentDef) -> Result<ParentInfo, LiteError> {
        let mut m = lock(&self.parents);
        if m.contains_key(&def.name) {
            return Err(LiteError::Exists(def.name));
        }
        let info = ParentInfo {
            def: def.clone(),
            lanes: 0,
        };
        m.insert(def.name, info.clone());
        Ok(info)
    }

    fn update_parent(&self, name: &str, def: ParentDef) -> Result<ParentInfo, LiteError> {
        let mut m = lock(&self.parents);
        let cur = m
            .get_mut(name)
            .ok_or_else(|| LiteError::NotFound(name.to_string()))?;
        cur.def = def;
        Ok(cur.clone())
    }

    fn delete_parent(&self, name: &str) -> Result<(), LiteError> {
        lock(&self.parents)
            .remove(name)
            .map(|_| ())
            .ok_or_else(|| LiteError::NotFound(name.to_string()))
    }

    fn list_lanes(
        &self,
        parent: &str,
        _after: Option<&str>,
        _limit: usize,
    ) -> Result<(Vec<LaneInfo>, bool), LiteError> {
        self.get_parent(parent).map(|_| (Vec::new(), false))
    }

    fn get_lane(&self, parent: &str, _lane: &str) -> Result<Option<LaneDetail>, LiteError> {
        self.get_parent(parent).map(|_| None)
    }

    fn lite_groups(&self, parent: &str) -> Result<Vec<Value>, LiteError> {
        self.get_parent(parent).map(|_| Vec::new())
    }

    fn group_lag(
        &self,
        parent: &str,
        _group: &str,
        _after: Option<&str>,
        _limit: usize,
    ) -> Result<Option<(Vec<Value>, bool)>, LiteError> {
        self.get_parent(parent).map(|_| None)
    }

    fn clients(&self) -> Vec<ClientInfo> {
        let kicked = lock(&self.kicked);
        CLIENTS
            .iter()
            .filter(|(id, ..)| !kicked.iter().any(|k| k == id))
            .map(|(id, u, c)| fake_client(id, u, *c))
            .collect()
    }

    fn client(&self, clientid: &str) -> Option<ClientInfo> {
        self.clients().into_iter().find(|c| c.clientid == clientid)
    }

    fn kick(&self, clientid: &str) -> Kicked {
        match self.client(clientid) {
            Some(c) => {
                lock(&self.kicked).push(clientid.to_string());
                if c.connected {
                    Kicked::Disconnected
                } else {
                    Kicked::Discarded
                }
            }
            None => Kicked::NotFound,
        }
    }

    fn client_subscriptions(&self, clientid: &str) -> Option<Vec<SubscriptionInfo>> {
        self.client(clientid)?;
        Some(
            self.subscriptions()
                .into_iter()
                .filter(|s| s.clientid == clientid)
                .collect(),
        )
    }

    fn subscriptions(&self) -> Vec<SubscriptionInfo> {
        self.clients()
            .iter()
            .map(|c| SubscriptionInfo {
                clientid: c.clientid.clone(),
                topic: format!("t/{}", c.clientid),
                qos: 1,
                nl: 0,
                rap: 0,
                rh: 0,
            })
            .collect()
    }

    fn running(&self) -> bool {
        true
    }

    fn retained(&self, filter: Option<&str>) -> Result<Vec<lanemq_admin::RetainedInfo>, String> {
        if filter == Some("a/#/b") {
            return Err("not a valid filter".into());
        }
        Ok(["r/2", "r/1/x"]
            .iter()
            .filter(|t| filter.is_none_or(|f| t.starts_with(f.trim_end_matches('#'))))
            .map(|t| fake_retained(t))
            .collect())
    }

    fn retained_message(&self, topic: &str) -> Option<(lanemq_admin::RetainedInfo, Vec<u8>)> {
        (topic == "r/1/x").then(|| (fake_retained(topic), b"hi".to_vec()))
    }

    fn delete_retained(&self, topic: &str) -> bool {
        topic == "r/1/x"
    }

    fn read_stream(
        &self,
        name: &str,
        start: lanemq_streams::subscribe::StartFrom,
        limit: usize,
    ) -> Result<lanemq_admin::StreamPage, StreamError> {
        use lanemq_streams::subscribe::StartFrom;
        if name != "events" {
            return Err(StreamError::NotFound(name.into()));
        }
        // Positions 10, 11, 12 hold messages.
        let first = match start {
            StartFrom::Earliest => 10,
            StartFrom::Latest => 13,
            StartFrom::After(n) => n + 1,
            StartFrom::TimestampUs(_) => 11,
        };
        let messages: Vec<_> = (first.max(10)..13)
            .take(limit)
            .map(|o| lanemq_admin::StreamMessageView {
                offset: o,
                topic: format!("ev/{o}"),
                qos: 1,
                retain: false,
                ts_us: 1_000_000 * o,
                key: None,
                from_clientid: "pub".into(),
                payload: format!("m{o}").into_bytes(),
                payload_format_indicator: None,
                message_expiry_interval: None,
                content_type: None,
                response_topic: None,
                correlation_data: None,
                user_properties: vec![],
            })
            .collect();
        let next = messages.last().map_or(first.max(10), |m| m.offset + 1);
        Ok(lanemq_admin::StreamPage { messages, next })
    }

    fn publish(
        &self,
        msg: lanemq_admin::ApiPublish,
    ) -> Result<lanemq_admin::Published, lanemq_admin::PublishError> {
        match msg.topic.as_str() {
            "denied" => Err(lanemq_admin::PublishError::NotAuthorized("no".into())),
            "nobody" => Ok(lanemq_admin::Published::NoSubscribers(7)),
            _ => Ok(lanemq_admin::Published::Delivered(msg.payload.len() as u64)),
        }
    }

    fn lite_metrics(&self) -> LiteMetrics {
        LiteMetrics {
            parents: lock(&self.parents).len() as u64,
            ..Default::default()
        }
    }

    fn metrics(&self) -> lanemq_admin::BrokerMetrics {
        lanemq_admin::BrokerMetrics {
            connections: 2,
            streams: lock(&self.streams)
                .keys()
                .map(|name| lanemq_admin::StreamFigures {
                    name: name.clone(),
                    ..Default::default()
                })
                .collect(),
            lite: self.lite_metrics(),
            ..Default::default()
        }
    }
}

/// The router served on a background runtime; shut down on drop.
struct Server {
    addr: String,
    fake: Arc<Fake>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Server {
    fn start() -> Server {
        Server::start_with(RouterOptions::default())
    }

    fn start_with(opts: RouterOptions) -> Server {
        let fake = Arc::new(Fake::default());
        let backend: Arc<dyn AdminBackend> = fake.clone();
        let router = router_with(backend, TOKEN.to_string(), opts);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                let _ = addr_tx.send(listener.local_addr()?.to_string());
                serve(listener, router, async move {
                    let _ = rx.await;
                })
                .await
            })
        });
        let addr = addr_rx.recv().expect("server address");
        Server {
            addr,
            fake,
            stop: Some(tx),
            thread: Some(thread),
        }
    }

    fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let (status, text) =
            request(&self.addr, TOKEN, method, path, body).expect("request succeeds");
        let v = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
        };
        (status, v)
    }

    fn create(&self, name: &str, filter: &str) {
        let body = json!({ "name": name, "topic_filter": filter }).to_string();
        let (s, v) = self.call("POST", "/api/v5/streams", Some(&body));
        assert_eq!(s, 200, "{v}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn assert_error(got: (u16, Value), status: u16, code: &str) -> String {
    assert_eq!(got.0, status, "{}", got.1);
    assert_eq!(got.1["code"], code, "{}", got.1);
    got.1["message"].as_str().expect("message").to_string()
}

#[test]
fn create_returns_200_with_the_stream_and_defaults() {
    let s = Server::start();
    let (st, v) = s.call(
        "POST",
        "/api/v5/streams",
        Some(r#"{"name":"events","topic_filter":"t/#","limits":{"max_message_count":10}}"#),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["name"], "events");
    assert_eq!(v["topic_filter"], "t/#");
    assert_eq!(v["key_expression"], "message.from");
    assert_eq!(v["data_retention_period"], "7d");
    assert_eq!(v["read_max_unacked"], 1000);
    assert_eq!(v["limits"]["max_message_count"], 10);
    assert_eq!(v["limits"]["max_message_bytes"], "infinity");
    assert_eq!(v["stats"]["message_count"], 0);
    assert!(v["created_at_us"].is_u64());
}

#[test]
fn get_returns_the_stream_and_404_when_unknown() {
    let s = Server::start();
    s.create("a.b-c_d", "x/+/y");
    let (st, v) = s.call("GET", "/api/v5/stream/a.b-c_d", None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["topic_filter"], "x/+/y");
    let msg = assert_error(s.call("GET", "/api/v5/stream/nope", None), 404, "NOT_FOUND");
    assert!(msg.contains("nope"), "{msg}");
}

#[test]
fn duplicate_create_is_409_already_exists() {
    let s = Server::start();
    s.create("dup", "t");
    let body = r#"{"name":"dup","topic_filter":"u"}"#;
    assert_error(
        s.call("POST", "/api/v5/streams", Some(body)),
        409,
        "ALREADY_EXISTS",
    );
}

#[test]
fn list_paginates_250_streams_with_a_cursor() {
    let s = Server::start();
    for i in 0..250 {
        s.create(&format!("s{i:03}"), &format!("t/{i}"));
    }
    let mut names = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/v5/streams?limit=100&cursor={c}"),
            None => "/api/v5/streams?limit=100".to_string(),
        };
        let (st, v) = s.call("GET", &path, None);
        assert_eq!(st, 200, "{v}");
        pages += 1;
        let data = v["data"].as_array().expect("data");
        names.extend(
            data.iter()
                .map(|d| d["name"].as_str().expect("name").to_string()),
        );
        assert_eq!(v["meta"]["limit"], 100);
        if v["meta"]["hasnext"] == json!(true) {
            assert_eq!(data.len(), 100);
            let c = v["meta"]["cursor"].as_str().expect("cursor").to_string();
            assert_eq!(Some(&c), names.last());
            cursor = Some(c);
        } else {
            assert_eq!(v["meta"]["hasnext"], json!(false));
            assert!(v["meta"].get("cursor").is_none(), "{v}");
            assert_eq!(data.len(), 50);
            break;
        }
    }
    assert_eq!(pages, 3);
    let expected: Vec<String> = (0..250).map(|i| format!("s{i:03}")).collect();
    assert_eq!(names, expected);
}

#[test]
fn list_defaults_to_100_and_rejects_out_of_range_limits() {
    let s = Server::start();
    s.create("one", "t");
    let (st, v) = s.call("GET", "/api/v5/streams", None);
    assert_eq!(st, 200);
    assert_eq!(v["meta"]["limit"], 100);
    assert_eq!(v["meta"]["hasnext"], false);
    assert_eq!(v["data"].as_array().map(Vec::len), Some(1));
    for bad in ["0", "10001", "-1", "abc"] {
        let path = format!("/api/v5/streams?limit={bad}");
        assert_error(s.call("GET", &path, None), 400, "BAD_REQUEST");
    }
    let (st, _) = s.call("GET", "/api/v5/streams?limit=10000", None);
    assert_eq!(st, 200);
}

#[test]
fn update_replaces_the_definition_and_keeps_the_filter_fixed() {
    let s = Server::start();
    s.create("u", "t/#");
    let (st, v) = s.call(
        "PUT",
        "/api/v5/stream/u",
        Some(r#"{"name":"u","topic_filter":"t/#","read_max_unacked":5,"data_retention_period":"1h"}"#),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["read_max_unacked"], 5);
    assert_eq!(v["data_retention_period"], "1h");
    let (_, v) = s.call("GET", "/api/v5/stream/u", None);
    assert_eq!(v["read_max_unacked"], 5);

    let msg = assert_error(
        s.call(
            "PUT",
            "/api/v5/stream/u",
            Some(r#"{"topic_filter":"other"}"#),
        ),
        409,
        "CONFLICT",
    );
    assert!(msg.contains("topic_filter"), "{msg}");
}

#[test]
fn update_without_a_name_uses_the_path_name() {
    let s = Server::start();
    s.create("n", "t");
    let (st, v) = s.call(
        "PUT",
        "/api/v5/stream/n",
        Some(r#"{"topic_filter":"t","key_expression":"message.topic"}"#),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["name"], "n");
    assert_eq!(v["key_expression"], "message.topic");
}

#[test]
fn update_with_a_different_body_name_is_400() {
    let s = Server::start();
    s.create("n", "t");
    let msg = assert_error(
        s.call(
            "PUT",
            "/api/v5/stream/n",
            Some(r#"{"name":"m","topic_filter":"t"}"#),
        ),
        400,
        "BAD_REQUEST",
    );
    assert!(msg.contains("name"), "{msg}");
    assert_error(
        s.call("PUT", "/api/v5/stream/n", Some(r#"[1,2]"#)),
        400,
        "BAD_REQUEST",
    );
}

#[test]
fn update_of_an_unknown_stream_is_404() {
    let s = Server::start();
    assert_error(
        s.call(
            "PUT",
            "/api/v5/stream/ghost",
            Some(r#"{"topic_filter":"t"}"#),
        ),
        404,
        "NOT_FOUND",
    );
}

#[test]
fn delete_is_204_then_404() {
    let s = Server::start();
    s.create("d", "t");
    let (st, v) = s.call("DELETE", "/api/v5/stream/d", None);
    assert_eq!((st, v), (204, Value::Null));
    assert_error(s.call("GET", "/api/v5/stream/d", None), 404, "NOT_FOUND");
    assert_error(s.call("DELETE", "/api/v5/stream/d", None), 404, "NOT_FOUND");
}

#[test]
fn bad_name_and_bad_filter_are_400_with_every_reason() {
    let s = Server::start();
    let msg = assert_error(
        s.call(
            "POST",
            "/api/v5/streams",
            Some(r#"{"name":"-bad","topic_filter":"a/#/b"}"#),
        ),
        400,
        "BAD_REQUEST",
    );
    assert!(msg.contains("name:"), "{msg}");
    assert!(msg.contains("topic_filter:"), "{msg}");
    let msg = assert_error(
        s.call(
            "POST",
            "/api/v5/streams",
            Some(r#"{"name":"ok","topic_filter":"$share/g/t"}"#),
        ),
        400,
        "BAD_REQUEST",
    );
    assert!(msg.contains("topic_filter"), "{msg}");
    assert!(lock(&s.fake.streams).is_empty());
}

#[test]
fn unknown_field_is_400_naming_it() {
    let s = Server::start();
    let msg = assert_error(
        s.call(
            "POST",
            "/api/v5/streams",
            Some(r#"{"name":"a","topic_filter":"t","colour":"red"}"#),
        ),
        400,
        "BAD_REQUEST",
    );
    assert!(msg.contains("colour"), "{msg}");
}

#[test]
fn malformed_json_is_400_json_error() {
    let s = Server::start();
    let msg = assert_error(
        s.call("POST", "/api/v5/streams", Some(r#"{"name":"a","#)),
        400,
        "BAD_REQUEST",
    );
    assert!(msg.contains("line 1"), "{msg}");
    assert_error(
        s.call("POST", "/api/v5/streams", Some("")),
        400,
        "BAD_REQUEST",
    );
}

#[test]
fn wrong_types_are_400() {
    let s = Server::start();
    for body in [
        r#"{"name":1,"topic_filter":"t"}"#,
        r#"{"name":"a","topic_filter":"t","is_lastvalue":"yes"}"#,
        r#"{"name":"a","topic_filter":"t","read_max_unacked":-3}"#,
        r#"{"name":"a","topic_filter":"t","data_retention_period":"soon"}"#,
        r#"{"name":"a"}"#,
    ] {
        assert_error(
            s.call("POST", "/api/v5/streams", Some(body)),
            400,
            "BAD_REQUEST",
        );
    }
}

#[test]
fn missing_content_type_is_400_json() {
    let s = Server::start();
    let auth = format!("Bearer {TOKEN}");
    let r = request_with_headers(
        &s.addr,
        "POST",
        "/api/v5/streams",
        &[("Authorization", &auth)],
        Some(br#"{"name":"a","topic_filter":"t"}"#),
    )
    .expect("request");
    assert_eq!(r.status, 400, "{}", r.body);
    let v: Value = serde_json::from_str(&r.body).expect("json");
    assert_eq!(v["code"], "BAD_REQUEST");
    assert!(r
        .header("content-type")
        .is_some_and(|c| c.starts_with("application/json")));
}

#[test]
fn max_stream_count_is_400_max_stream_count_reached() {
    let s = Server::start();
    lock(&s.fake.settings).max_stream_count = 2;
    s.create("a", "t");
    s.create("b", "t");
    let body = r#"{"name":"c","topic_filter":"t"}"#;
    assert_error(
        s.call("POST", "/api/v5/streams", Some(body)),
        400,
        "MAX_STREAM_COUNT_REACHED",
    );
}

#[test]
fn disabled_streams_are_503() {
    let s = Server::start();
    lock(&s.fake.settings).enable = false;
    let body = r#"{"name":"c","topic_filter":"t"}"#;
    assert_error(
        s.call("POST", "/api/v5/streams", Some(body)),
        503,
        "SERVICE_UNAVAILABLE",
    );
}

#[test]
fn missing_or_wrong_token_is_401_bad_token_with_www_authenticate() {
    let s = Server::start();
    for headers in [
        vec![],
        vec![("Authorization", "Bearer wrong")],
        vec![("Authorization", "Bearer test-token-012345678")],
        vec![("Authorization", "Basic dGVzdDp0ZXN0")],
        vec![("Authorization", "Bearer")],
    ] {
        for path in ["/api/v5/streams", "/api/v5/openapi.json", "/api/v5/nowhere"] {
            let r = request_with_headers(&s.addr, "GET", path, &headers, None).expect("request");
            assert_eq!(r.status, 401, "{headers:?} {path}: {}", r.body);
            assert!(r
                .header("www-authenticate")
                .is_some_and(|h| h.starts_with("Bearer")));
            let v: Value = serde_json::from_str(&r.body).expect("json");
            assert_eq!(v["code"], "BAD_TOKEN");
            assert!(!r.body.contains("test-token"), "{}", r.body);
        }
    }
    let (st, _) = request(&s.addr, "wrong", "GET", "/api/v5/streams", None).expect("request");
    assert_eq!(st, 401);
    // The scheme is case-insensitive.
    let auth = format!("bearer {TOKEN}");
    let r = request_with_headers(
        &s.addr,
        "GET",
        "/api/v5/streams",
        &[("Authorization", &auth)],
        None,
    )
    .expect("request");
    assert_eq!(r.status, 200);
}

#[test]
fn body_over_1_mib_is_413_json() {
    let s = Server::start();
    let big = format!(
        r#"{{"name":"a","topic_filter":"t","key_expression":"{}"}}"#,
        "x".repeat(2 << 20)
    );
    assert_error(
        s.call("POST", "/api/v5/streams", Some(&big)),
        413,
        "PAYLOAD_TOO_LARGE",
    );
    // Still serving.
    let (st, _) = s.call("GET", "/api/v5/streams", None);
    assert_eq!(st, 200);
}

#[test]
fn chunked_body_over_1_mib_is_413_json() {
    let s = Server::start();
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(&s.addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let head = format!(
        "POST /api/v5/streams HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    let _ = c.write_all(head.as_bytes());
    let chunk = vec![b' '; 64 << 10];
    for _ in 0..40 {
        if c.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
            .is_err()
            || c.write_all(&chunk).is_err()
            || c.write_all(b"\r\n").is_err()
        {
            break;
        }
    }
    let _ = c.write_all(b"0\r\n\r\n");
    let mut resp = Vec::new();
    let _ = c.read_to_end(&mut resp);
    let text = String::from_utf8_lossy(&resp);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("PAYLOAD_TOO_LARGE"), "{text}");
}

#[test]
fn wrong_method_is_405_json_and_unknown_path_is_404_json() {
    let s = Server::start();
    let msg = assert_error(
        s.call("PATCH", "/api/v5/streams", None),
        405,
        "METHOD_NOT_ALLOWED",
    );
    assert!(msg.contains("PATCH"), "{msg}");
    assert_error(
        s.call("POST", "/api/v5/stream/x", Some("{}")),
        405,
        "METHOD_NOT_ALLOWED",
    );
    assert_error(
        s.call("DELETE", "/api/v5/stats", None),
        405,
        "METHOD_NOT_ALLOWED",
    );
    let msg = assert_error(s.call("GET", "/api/v5/nowhere", None), 404, "NOT_FOUND");
    assert!(msg.contains("no endpoint"), "{msg}");
    assert_error(s.call("GET", "/nowhere", None), 404, "NOT_FOUND");
    // `/` is the dashboard's page (no token needed), not an API 404.
    let (status, page) = request(&s.addr, TOKEN, "GET", "/", None).expect("request");
    assert_eq!(status, 200);
    assert!(page.starts_with("<!doctype html>"), "{page}");
    let auth = format!("Bearer {TOKEN}");
    let r = request_with_headers(
        &s.addr,
        "PATCH",
        "/api/v5/stream/x",
        &[("Authorization", &auth)],
        None,
    )
    .expect("request");
    assert_eq!(r.status, 405);
    let allow = r.header("allow").unwrap_or("");
    assert!(
        allow.contains("GET") && allow.contains("PUT") && allow.contains("DELETE"),
        "{allow:?}"
    );
}

#[test]
fn openapi_json_lists_every_route_and_only_those() {
    let s = Server::start();
    let (st, doc) = s.call("GET", "/api/v5/openapi.json", None);
    assert_eq!(st, 200);
    assert!(doc["openapi"]
        .as_str()
        .is_some_and(|v| v.starts_with("3.0")));
    let paths = doc["paths"].as_object().expect("paths");
    for (method, path) in ROUTES {
        let op = &paths[*path][method.to_ascii_lowercase()];
        assert!(op.is_object(), "{method} {path} is not documented");
        if *path == "/api/v5/status" {
            // The health check is the one path without a token.
            assert_eq!(op["security"], json!([]));
            continue;
        }
        assert!(op["responses"]["401"].is_object(), "{method} {path}");
    }
    let documented: usize = paths
        .values()
        .map(|p| p.as_object().map_or(0, |o| o.len()))
        .sum();
    assert_eq!(documented, ROUTES.len());
    assert!(paths["/api/v5/streams"]["post"]["responses"]["409"].is_object());
    assert!(paths["/api/v5/stream/{name}"]["delete"]["responses"]["204"].is_object());
    assert!(paths["/api/v5/streams/config"]["put"]["responses"]["200"].is_object());
    assert!(
        paths["/api/v5/authorization/reload"]["post"]["responses"]["400"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("RELOAD_FAILED"))
    );

    // ROUTES is what the router serves: every listed route answers (not a routing 404/405),
    // and every other method on those paths is 405.
    s.create("probe", "t");
    for (method, path) in ROUTES {
        if *path == "/api/v5/status" {
            // Plain text, no token.
            for m in ["GET", "POST", "PUT", "DELETE", "PATCH"] {
                let r = request_with_headers(&s.addr, m, path, &[], None).expect("status");
                assert_eq!(r.status, if m == "GET" { 200 } else { 405 }, "{m} {path}");
            }
            continue;
        }
        if *path == "/metrics" || *path == "/api/v5/prometheus/stats" {
            // Prometheus text, with the token.
            let auth = format!("Bearer {TOKEN}");
            for m in ["GET", "POST", "PUT", "DELETE", "PATCH"] {
                let r = request_with_headers(&s.addr, m, path, &[("Authorization", &auth)], None)
                    .expect("metrics");
                assert_eq!(r.status, if m == "GET" { 200 } else { 405 }, "{m} {path}");
            }
            continue;
        }
        let path = path.replace("{name}", "probe");
        for m in ["GET", "POST", "PUT", "DELETE", "PATCH"] {
            let body = matches!(m, "POST" | "PUT").then_some("{}");
            let (st, v) = s.call(m, &path, body);
            let listed = ROUTES
                .iter()
                .any(|(rm, rp)| *rm == m && rp.replace("{name}", "probe") == path);
            if listed {
                assert_ne!(st, 405, "{m} {path}: {v}");
                let routing_404 = st == 404
                    && v["message"]
                        .as_str()
                        .is_some_and(|t| t.starts_with("no endpoint"));
                assert!(!routing_404, "{m} {path}: {v}");
            } else {
                assert_eq!(st, 405, "{m} {path} answers but is not in ROUTES: {v}");
            }
        }
        let _ = method;
        // Recreate the probe if a DELETE removed it.
        if lock(&s.fake.streams).get("probe").is_none() {
            s.create("probe", "t");
        }
    }
}

#[test]
fn config_get_put_roundtrip_returns_200_with_the_new_settings() {
    let s = Server::start();
    let (st, v) = s.call("GET", "/api/v5/streams/config", None);
    assert_eq!(st, 200);
    assert_eq!(v["enable"], true);
    assert_eq!(v["max_stream_count"], 1000);
    let body = json!({
        "enable": true,
        "max_stream_count": 7,
        "gc_interval": "30m",
        "auto_create": { "regular": true, "lastvalue": false }
    })
    .to_string();
    let (st, put) = s.call("PUT", "/api/v5/streams/config", Some(&body));
    assert_eq!(st, 200, "{put}");
    assert_eq!(put["max_stream_count"], 7);
    assert_eq!(put["gc_interval"], "30m");
    assert_eq!(put["auto_create"]["lastvalue"], false);
    let (_, got) = s.call("GET", "/api/v5/streams/config", None);
    assert_eq!(got, put);
    assert_eq!(lock(&s.fake.settings).max_stream_count, 7);
}

#[test]
fn invalid_config_is_400() {
    let s = Server::start();
    let msg = assert_error(
        s.call(
            "PUT",
            "/api/v5/streams/config",
            Some(r#"{"max_stream_count":0,"gc_interval":"10ms"}"#),
        ),
        400,
        "BAD_REQUEST",
    );
    assert!(
        msg.contains("max_stream_count") && msg.contains("gc_interval"),
        "{msg}"
    );
    assert_error(
        s.call("PUT", "/api/v5/streams/config", Some(r#"{"bogus":true}"#)),
        400,
        "BAD_REQUEST",
    );
    assert_error(
        s.call("PUT", "/api/v5/streams/config", Some(r#"{"enable":"no"}"#)),
        400,
        "BAD_REQUEST",
    );
    assert_eq!(lock(&s.fake.settings).max_stream_count, 1000);
}

#[test]
fn message_streams_aliases_behave_like_the_main_paths() {
    let s = Server::start();
    let (st, v) = s.call(
        "POST",
        "/api/v5/message_streams/streams",
        Some(r#"{"name":"al","topic_filter":"a/#"}"#),
    );
    assert_eq!(st, 200, "{v}");
    let (st, v) = s.call("GET", "/api/v5/message_streams/streams", None);
    assert_eq!(st, 200);
    assert_eq!(v["data"][0]["name"], "al");
    let (st, v) = s.call("GET", "/api/v5/message_streams/streams/al", None);
    assert_eq!((st, v["topic_filter"].clone()), (200, json!("a/#")));
    let (st, v) = s.call(
        "PUT",
        "/api/v5/message_streams/streams/al",
        Some(r#"{"topic_filter":"a/#","read_max_unacked":9}"#),
    );
    assert_eq!((st, v["read_max_unacked"].clone()), (200, json!(9)));
    let (st, _) = s.call("GET", "/api/v5/stream/al", None);
    assert_eq!(st, 200);
    let (st, _) = s.call("DELETE", "/api/v5/message_streams/streams/al", None);
    assert_eq!(st, 204);
    assert_error(
        s.call("GET", "/api/v5/message_streams/streams/al", None),
        404,
        "NOT_FOUND",
    );
    let (st, v) = s.call(
        "PUT",
        "/api/v5/message_streams/config",
        Some(r#"{"max_stream_count":3}"#),
    );
    assert_eq!((st, v["max_stream_count"].clone()), (200, json!(3)));
    let (st, v) = s.call("GET", "/api/v5/message_streams/config", None);
    assert_eq!((st, v["max_stream_count"].clone()), (200, json!(3)));
}

#[test]
fn authorization_reload_returns_the_summary_or_400_reload_failed() {
    let s = Server::start();
    let (st, v) = s.call("POST", "/api/v5/authorization/reload", None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["message"], "12 rules loaded");
    *lock(&s.fake.reload_error) = Some("acl.toml:3:7: unknown action \"pub\"".to_string());
    let msg = assert_error(
        s.call("POST", "/api/v5/authorization/reload", None),
        400,
        "RELOAD_FAILED",
    );
    assert!(msg.contains("acl.toml:3:7"), "{msg}");
}

#[test]
fn stats_returns_the_backend_json() {
    let s = Server::start();
    s.create("x", "t");
    let (st, v) = s.call("GET", "/api/v5/stats", None);
    assert_eq!(st, 200);
    assert_eq!(v, json!({ "connections": 3, "streams": 1 }));
}

#[test]
fn slow_request_times_out_with_503() {
    let s = Server::start_with(RouterOptions {
        request_timeout: Duration::from_millis(200),
        ..Default::default()
    });
    assert_error(
        s.call("GET", "/api/v5/stream/slow", None),
        503,
        "SERVICE_UNAVAILABLE",
    );
    let (st, _) = s.call("GET", "/api/v5/streams", None);
    assert_eq!(st, 200);
}

#[test]
fn empty_router_token_refuses_every_request() {
    let fake: Arc<dyn AdminBackend> = Arc::new(Fake::default());
    let router = lanemq_admin::router(fake, String::new());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = rt.spawn(serve(listener, router, async move {
        let _ = rx.await;
    }));
    let r = std::thread::spawn(move || {
        request_with_headers(
            &addr,
            "GET",
            "/api/v5/streams",
            &[("Authorization", "Bearer ")],
            None,
        )
    });
    let r = rt
        .block_on(async {
            loop {
                if r.is_finished() {
                    break r.join();
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .expect("client thread")
        .expect("request");
    assert_eq!(r.status, 401);
    let _ = tx.send(());
    rt.block_on(server).expect("join").expect("serve");
}

#[test]
fn clients_are_paged_and_filtered_like_emqx() {
    let s = Server::start();
    let ids = |v: &Value| -> Vec<String> {
        v["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|c| c["clientid"].as_str().expect("clientid").to_string())
            .collect()
    };
    let (st, v) = s.call("GET", "/api/v5/clients?limit=2", None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(ids(&v), ["app-1", "dev-1"], "sorted by client id");
    assert_eq!(
        v["meta"],
        json!({"page": 1, "limit": 2, "count": 4, "hasnext": true})
    );
    let (_, v) = s.call("GET", "/api/v5/clients?limit=2&page=2", None);
    assert_eq!(ids(&v), ["dev-10", "dev-2"]);
    assert_eq!(v["meta"]["hasnext"], false);
    let (_, v) = s.call("GET", "/api/v5/clients?username=alice", None);
    assert_eq!(ids(&v), ["dev-1", "dev-2"]);
    let (_, v) = s.call(
        "GET",
        "/api/v5/clients?conn_state=connected&clientid_prefix=dev",
        None,
    );
    assert_eq!(ids(&v), ["dev-10", "dev-2"]);
    let (_, v) = s.call("GET", "/api/v5/clients?like_clientid=-1", None);
    assert_eq!(ids(&v), ["app-1", "dev-1", "dev-10"]);
    for bad in [
        "/api/v5/clients?conn_state=maybe",
        "/api/v5/clients?page=0",
        "/api/v5/clients?limit=0",
        "/api/v5/clients?colour=blue",
        "/api/v5/subscriptions?qos=3",
    ] {
        let msg = assert_error(s.call("GET", bad, None), 400, "BAD_REQUEST");
        assert!(!msg.is_empty(), "{bad}");
    }
}

#[test]
fn one_client_its_subscriptions_and_kick() {
    let s = Server::start();
    let (st, v) = s.call("GET", "/api/v5/clients/dev-2", None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["username"], "alice");
    assert_eq!(v["connected"], true);
    assert_error(
        s.call("GET", "/api/v5/clients/nobody", None),
        404,
        "CLIENTID_NOT_FOUND",
    );
    let (st, v) = s.call("GET", "/api/v5/clients/dev-2/subscriptions", None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v,
        json!([{"clientid": "dev-2", "topic": "t/dev-2", "qos": 1, "nl": 0, "rap": 0, "rh": 0}])
    );
    assert_error(
        s.call("GET", "/api/v5/clients/nobody/subscriptions", None),
        404,
        "CLIENTID_NOT_FOUND",
    );
    let (_, v) = s.call("GET", "/api/v5/subscriptions?clientid=app-1", None);
    assert_eq!(v["meta"]["count"], 1);
    let (_, v) = s.call("GET", "/api/v5/subscriptions?match_topic=dev&limit=1", None);
    assert_eq!(v["meta"]["count"], 3);
    assert_eq!(v["data"][0]["clientid"], "dev-1");
    assert_eq!(s.call("DELETE", "/api/v5/clients/dev-2", None).0, 204);
    assert_eq!(lock(&s.fake.kicked).as_slice(), ["dev-2"]);
    assert_error(
        s.call("DELETE", "/api/v5/clients/dev-2", None),
        404,
        "CLIENTID_NOT_FOUND",
    );
}

#[test]
fn status_needs_no_token_and_the_rest_does() {
    let s = Server::start();
    let r = request_with_headers(&s.addr, "GET", "/api/v5/status", &[], None).expect("status");
    assert_eq!(r.status, 200);
    assert!(r.body.contains("running"), "{}", r.body);
    let r = request_with_headers(&s.addr, "GET", "/api/v5/clients", &[], None).expect("clients");
    assert_eq!(r.status, 401);
}

#[test]
fn metrics_need_the_token_unless_public_and_speak_both_formats() {
    let s = Server::start();
    s.create("temps", "t/#");
    for path in ["/metrics", "/api/v5/prometheus/stats"] {
        let r = request_with_headers(&s.addr, "GET", path, &[], None).expect("no token");
        assert_eq!(r.status, 401, "{path}");
        let auth = format!("Bearer {TOKEN}");
        let r = request_with_headers(&s.addr, "GET", path, &[("Authorization", &auth)], None)
            .expect("metrics");
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        assert_eq!(
            r.header("content-type"),
            Some(lanemq_admin::PROMETHEUS_TEXT),
            "{path}"
        );
        assert!(
            r.body.lines().any(|l| l == "lanemq_connections 2"),
            "{}",
            r.body
        );
        assert!(
            r.body.contains("lanemq_stream_records{stream=\"temps\"} 0"),
            "{}",
            r.body
        );
        assert!(r
            .body
            .contains("# TYPE process_resident_memory_bytes gauge"));
        let r = request_with_headers(
            &s.addr,
            "GET",
            path,
            &[
                ("Authorization", &auth),
                (
                    "Accept",
                    "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
                ),
            ],
            None,
        )
        .expect("openmetrics");
        assert_eq!(
            r.header("content-type"),
            Some(lanemq_admin::OPENMETRICS_TEXT)
        );
        assert!(r.body.ends_with("# EOF\n"), "{}", r.body);
    }
    let public = Server::start_with(RouterOptions {
        metrics_public: true,
        ..Default::default()
    });
    let r = request_with_headers(&public.addr, "GET", "/metrics", &[], None).expect("public");
    assert_eq!(r.status, 200, "{}", r.body);
    let r = request_with_headers(&public.addr, "GET", "/api/v5/stats", &[], None).expect("stats");
    assert_eq!(r.status, 401, "only the metrics are public");
}

#[test]
fn publish_and_bulk_check_the_body() {
    let s = Server::start();
    let (st, v) = s.call(
        "POST",
        "/api/v5/publish",
        Some(r#"{"topic":"t","payload":"abc","qos":1}"#),
    );
    assert_eq!((st, v), (200, json!({"id": "3"})));
    let (st, v) = s.call(
        "POST",
        "/api/v5/publish",
        Some(r#"{"topic":"t","payload":"AAEC","payload_encoding":"base64"}"#),
    );
    assert_eq!(
        (st, v),
        (200, json!({"id": "3"})),
        "base64 decoded to 3 bytes"
    );
    let (st, v) = s.call("POST", "/api/v5/publish", Some(r#"{"topic":"nobody"}"#));
    assert_eq!(st, 202);
    assert_eq!(v["reason_code"], 16);
    assert_error(
        s.call("POST", "/api/v5/publish", Some(r#"{"topic":"denied"}"#)),
        403,
        "NOT_AUTHORIZED",
    );
    for bad in [
        r#"{"topic":"t","qos":3}"#,
        r#"{"payload":"x"}"#,
        r#"{"topic":"t","payload":"!!","payload_encoding":"base64"}"#,
        r#"{"topic":"t","payload_encoding":"hex"}"#,
        r#"{"topic":"t","colour":1}"#,
        r#"{"topic":"t","properties":{"user_properties":{"a":1}}}"#,
    ] {
        assert_error(
            s.call("POST", "/api/v5/publish", Some(bad)),
            400,
            "BAD_REQUEST",
        );
    }
    let (st, v) = s.call(
        "POST",
        "/api/v5/publish/bulk",
        Some(r#"[{"topic":"t","payload":"ab"},{"topic":"nobody"},{"topic":"denied"}]"#),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v[0], json!({"id": "2"}));
    assert_eq!(v[1]["reason_code"], 16);
    assert_eq!(v[2]["code"], "NOT_AUTHORIZED");
    let msg = assert_error(
        s.call(
            "POST",
            "/api/v5/publish/bulk",
            Some(r#"[{"topic":"t"},{"topic":"t","qos":9}]"#),
        ),
        400,
        "BAD_REQUEST",
    );
    assert!(msg.starts_with("[1]"), "{msg}");
    assert_error(
        s.call("POST", "/api/v5/publish/bulk", Some("[]")),
        400,
        "BAD_REQUEST",
    );
}

#[test]
fn retainer_lists_shows_and_deletes() {
    let s = Server::start();
    let (st, v) = s.call("GET", "/api/v5/mqtt/retainer/messages", None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["data"][0]["topic"], "r/1/x", "sorted by topic");
    assert_eq!(v["meta"]["count"], 2);
    let (_, v) = s.call("GET", "/api/v5/mqtt/retainer/messages?topic=r/1/%23", None);
    assert_eq!(v["meta"]["count"], 1, "{v}");
    assert_error(
        s.call("GET", "/api/v5/mqtt/retainer/messages?topic=a/%23/b", None),
        400,
        "BAD_REQUEST",
    );
    let (st, v) = s.call("GET", "/api/v5/mqtt/retainer/message/r/1/x", None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["payload"], "aGk=");
    let (st, _) = s.call("GET", "/api/v5/mqtt/retainer/message/r%2F1%2Fx", None);
    assert_eq!(st, 200, "url-encoded slashes");
    assert_error(
        s.call("GET", "/api/v5/mqtt/retainer/message/none", None),
        404,
        "NOT_FOUND",
    );
    assert_eq!(
        s.call("DELETE", "/api/v5/mqtt/retainer/message/r/1/x", None)
            .0,
        204
    );
    assert_error(
        s.call("DELETE", "/api/v5/mqtt/retainer/message/none", None),
        404,
        "NOT_FOUND",
    );
}

#[test]
fn stream_messages_page_and_continue_from_next() {
    let s = Server::start();
    let (st, v) = s.call("GET", "/api/v5/stream/events/messages?limit=2", None);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["data"][0]["offset"], "@10", "earliest is the default");
    assert_eq!(v["data"][1]["payload"], "m11");
    assert_eq!(v["next"], "@11");
    let (_, v) = s.call("GET", "/api/v5/stream/events/messages?offset=%4011", None);
    assert_eq!(v["meta"]["count"], 1, "{v}");
    assert_eq!(v["data"][0]["topic"], "ev/12");
    assert_eq!(v["next"], "@12");
    let (_, v) = s.call("GET", "/api/v5/stream/events/messages?offset=@12", None);
    assert_eq!(v["meta"]["count"], 0, "{v}");
    assert_eq!(v["next"], "@12", "nothing new: the same offset again");
    let (st, v) = s.call(
        "GET",
        "/api/v5/message_streams/streams/events/messages?offset=latest",
        None,
    );
    assert_eq!((st, &v["meta"]["count"]), (200, &json!(0)), "{v}");
    for bad in [
        "offset=soon",
        "offset=@x",
        "limit=0",
        "limit=1001",
        "other=1",
    ] {
        let msg = assert_error(
            s.call(
                "GET",
                &format!("/api/v5/stream/events/messages?{bad}"),
                None,
            ),
            400,
            "BAD_REQUEST",
        );
        assert!(!msg.is_empty(), "{bad}");
    }
    assert_error(
        s.call("GET", "/api/v5/stream/nope/messages", None),
        404,
        "NOT_FOUND",
    );
}
