//! Key expressions: which part of a message is its key (`docs/streams.md`).
//!
//! A stream's `key_expression` is parsed once, when the stream is created (a bad expression is
//! an HTTP 400 with the reason), and evaluated on every message the stream indexes. The key
//! orders delivery per key and chooses what a last-value stream overwrites; a message whose key
//! cannot be extracted ([`KeyExpr::eval`] returns `None`) is stored as a regular message.
//!
//! Supported forms:
//!
//! | expression | key |
//! |---|---|
//! | `message.from` | the publisher's client id (the EMQX default) |
//! | `message.topic` | the topic name |
//! | `message.username` | the publisher's user name (none when absent) |
//! | `message.qos` | `"0"`, `"1"` or `"2"` |
//! | `message.topic.<n>` | topic level `n` (0-based; `-1` is the last level) |
//! | `message.headers.properties.User-Property.<name>` | the first user property `<name>` (EMQX) |
//! | `message.user_property.<name>` | the same, short form |
//! | `payload.$<jsonpath>`, `message.payload.$<jsonpath>` | a JSON path (RFC 9535, jsonpath-rust) into a JSON payload |
//! | `json_value(message.payload,'a.b')` | a dotted path into a JSON payload (EMQX); numeric segments also index arrays |
//!
//! JSON results: a string gives that string, a number or a boolean its JSON text; `null`, an
//! object, an array, no match, several matches or a payload that is not JSON give no key. An
//! empty key is no key.

use jsonpath_rust::parser::model::JpQuery;
use serde_json::Value;

/// What a key expression can look at.
#[derive(Debug, Clone, Copy)]
pub struct KeyInput<'a> {
    pub topic: &'a str,
    /// Publisher's client id.
    pub client_id: &'a str,
    pub username: Option<&'a str>,
    pub qos: u8,
    pub user_properties: &'a [(String, String)],
    pub payload: &'a [u8],
}

/// A parsed key expression.
#[derive(Debug, Clone)]
pub struct KeyExpr {
    src: String,
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    From,
    Topic,
    Username,
    Qos,
    /// First user property with this name.
    UserProperty(String),
    /// Topic level; negative counts from the end.
    TopicLevel(i64),
    /// RFC 9535 JSON path into the payload.
    JsonPath(Box<JpQuery>),
    /// EMQX `json_value(message.payload,'a.b')`: object keys, or array indexes.
    Dotted(Vec<String>),
}

const SUPPORTED: &str = "supported forms: message.from, message.topic, message.username, \
message.qos, message.topic.<n> (0-based level, negative counts from the end), \
message.headers.properties.User-Property.<name>, message.user_property.<name>, \
payload.$.<json path> (or message.payload.$.<json path>), json_value(message.payload,'a.b')";

const USER_PROPERTY_PREFIXES: [&str; 3] = [
    "message.headers.properties.User-Property.",
    "message.headers.properties.user_property.",
    "message.user_property.",
];

impl KeyExpr {
    /// Parse; the error is the reason, for a 400 response.
    pub fn parse(src: &str) -> Result<KeyExpr, String> {
        let kind = parse_kind(src.trim())?;
        Ok(KeyExpr {
            src: src.to_string(),
            kind,
        })
    }

    /// The expression as it was written.
    pub fn source(&self) -> &str {
        &self.src
    }

    /// The key of a message, or `None` when it cannot be extracted.
    pub fn eval(&self, m: &KeyInput<'_>) -> Option<String> {
        let key = match &self.kind {
            Kind::From => Some(m.client_id.to_string()),
            Kind::Topic => Some(m.topic.to_string()),
            Kind::Username => m.username.map(str::to_string),
            Kind::Qos => Some(m.qos.to_string()),
            Kind::UserProperty(name) => m
                .user_properties
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone()),
            Kind::TopicLevel(n) => topic_level(m.topic, *n).map(str::to_string),
            Kind::JsonPath(path) => {
                let doc = payload_json(m.payload)?;
                let found = jsonpath_rust::query::js_path_process(path, &doc).ok()?;
                match found.as_slice() {
                    [one] => scalar_text(one.val),
                    _ => None,
                }
            }
            Kind::Dotted(segments) => {
                let doc = payload_json(m.payload)?;
                let mut cur = &doc;
                for seg in segments {
                    cur = match cur {
                        Value::Object(map) => map.get(seg)?,
                        Value::Array(items) => items.get(seg.parse::<usize>().ok()?)?,
                        _ => return None,
                    };
                }
                scalar_text(cur)
            }
        }?;
        if key.is_empty() {
            None
        } else {
            Some(key)
        }
    }
}

fn parse_kind(s: &str) -> Result<Kind, String> {
    if s.is_empty() {
        return Err(format!("the key expression is empty; {SUPPORTED}"));
    }
    match s {
        "message.from" => return Ok(Kind::From),
        "message.topic" => return Ok(Kind::Topic),
        "message.username" => return Ok(Kind::Username),
        "message.qos" => return Ok(Kind::Qos),
        _ => {}
    }
    for prefix in USER_PROPERTY_PREFIXES {
        if let Some(name) = s.strip_prefix(prefix) {
            if name.is_empty() {
                return Err(format!(
                    "key expression {s:?} lacks the user property name after {prefix:?}"
                ));
            }
            return Ok(Kind::UserProperty(name.to_string()));
        }
    }
    if let Some(n) = s.strip_prefix("message.topic.") {
        let digits = n.strip_prefix('-').unwrap_or(n);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!(
                "key expression {s:?}: the topic level must be an integer \
                 (0 is the first level, -1 the last)"
            ));
        }
        let n: i64 = n
            .parse()
            .map_err(|_| format!("key expression {s:?}: the topic level index is too large"))?;
        return Ok(Kind::TopicLevel(n));
    }
    let json_path = s
        .strip_prefix("message.payload.")
        .or_else(|| s.strip_prefix("payload."));
    if let Some(path) = json_path {
        if !path.starts_with('$') {
            return Err(format!(
                "key expression {s:?}: a payload path must be a JSON path starting with '$', \
                 e.g. payload.$.device.id"
            ));
        }
        let query = jsonpath_rust::parser::parse_json_path(path)
            .map_err(|e| format!("key expression {s:?}: invalid JSON path {path:?}: {e}"))?;
        return Ok(Kind::JsonPath(Box::new(query)));
    }
    if let Some(args) = s.strip_prefix("json_value(") {
        return parse_json_value(s, args);
    }
    Err(format!("unsupported key expression {s:?}; {SUPPORTED}"))
}

/// `json_value(message.payload,'a.b')`, `args` being what follows `json_value(`.
fn parse_json_value(s: &str, args: &str) -> Result<Kind, String> {
    let usage = || {
        format!(
            "key expression {s:?}: expected json_value(message.payload,'a.b') \
             with a quoted, dotted path"
        )
    };
    let args = args.trim_end().strip_suffix(')').ok_or_else(usage)?;
    let (what, path) = args.split_once(',').ok_or_else(usage)?;
    if !matches!(what.trim(), "message.payload" | "payload") {
        return Err(format!(
            "key expression {s:?}: json_value reads only message.payload"
        ));
    }
    let path = path.trim();
    let inner = path
        .strip_prefix('\'')
        .and_then(|p| p.strip_suffix('\''))
        .or_else(|| path.strip_prefix('"').and_then(|p| p.strip_suffix('"')))
        .ok_or_else(usage)?;
    if inner.is_empty() {
        return Err(format!(
            "key expression {s:?}: the json_value path is empty"
        ));
    }
    let segments: Vec<String> = inner.split('.').map(str::to_string).collect();
    if segments.iter().any(String::is_empty) {
        return Err(format!(
            "key expression {s:?}: the json_value path {inner:?} has an empty segment"
        ));
    }
    Ok(Kind::Dotted(segments))
}

fn topic_level(topic: &str, n: i64) -> Option<&str> {
    if n >= 0 {
        topic.split('/').nth(usize::try_from(n).ok()?)
    } else {
        let back = usize::try_from(n.checked_neg()?).ok()?;
        topic.rsplit('/').nth(back - 1)
    }
}

fn payload_json(payload: &[u8]) -> Option<Value> {
    serde_json::from_slice(payload).ok()
}

fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn props() -> Vec<(String, String)> {
        vec![
            ("stream-key".to_string(), "k1".to_string()),
            ("other".to_string(), "o".to_string()),
            ("stream-key".to_string(), "k2".to_string()),
            ("empty".to_string(), String::new()),
        ]
    }

    fn eval_with(expr: &str, topic: &str, payload: &[u8]) -> Option<String> {
        let p = props();
        let m = KeyInput {
            topic,
            client_id: "dev-1",
            username: Some("alice"),
            qos: 1,
            user_properties: &p,
            payload,
        };
        KeyExpr::parse(expr).unwrap().eval(&m)
    }

    fn eval(expr: &str, payload: &[u8]) -> Option<String> {
        eval_with(expr, "sensors/room1/temp", payload)
    }

    const DOC: &[u8] = br#"{"device":{"id":"d-42","n":7,"f":1.5,"on":true,"nil":null,
        "obj":{"x":1},"arr":[1,2],"empty":""},
        "items":[{"id":"i0"},{"id":"i1"}],"top":"t"}"#;

    #[test]
    fn message_fields() {
        assert_eq!(eval("message.from", b""), Some("dev-1".into()));
        assert_eq!(
            eval("message.topic", b""),
            Some("sensors/room1/temp".into())
        );
        assert_eq!(eval("message.username", b""), Some("alice".into()));
        assert_eq!(eval("message.qos", b""), Some("1".into()));
        assert_eq!(eval("  message.from  ", b""), Some("dev-1".into()));
    }

    #[test]
    fn username_absent_and_empty_client_id() {
        let m = KeyInput {
            topic: "t",
            client_id: "",
            username: None,
            qos: 0,
            user_properties: &[],
            payload: b"",
        };
        assert_eq!(KeyExpr::parse("message.username").unwrap().eval(&m), None);
        assert_eq!(KeyExpr::parse("message.from").unwrap().eval(&m), None);
        assert_eq!(
            KeyExpr::parse("message.qos").unwrap().eval(&m),
            Some("0".into())
        );
    }

    #[test]
    fn user_properties() {
        for e in [
            "message.headers.properties.User-Property.stream-key",
            "message.headers.properties.user_property.stream-key",
            "message.user_property.stream-key",
        ] {
            assert_eq!(eval(e, b""), Some("k1".into()), "{e}");
        }
        assert_eq!(eval("message.user_property.other", b""), Some("o".into()));
        assert_eq!(eval("message.user_property.missing", b""), None);
        assert_eq!(eval("message.user_property.empty", b""), None);
        assert_eq!(eval("message.user_property.Stream-Key", b""), None);
    }

    #[test]
    fn topic_levels() {
        assert_eq!(eval("message.topic.0", b""), Some("sensors".into()));
        assert_eq!(eval("message.topic.1", b""), Some("room1".into()));
        assert_eq!(eval("message.topic.2", b""), Some("temp".into()));
        assert_eq!(eval("message.topic.3", b""), None);
        assert_eq!(eval("message.topic.-1", b""), Some("temp".into()));
        assert_eq!(eval("message.topic.-3", b""), Some("sensors".into()));
        assert_eq!(eval("message.topic.-4", b""), None);
        // Empty levels are levels, but an empty key is no key.
        assert_eq!(eval_with("message.topic.0", "/a/", b""), None);
        assert_eq!(eval_with("message.topic.1", "/a/", b""), Some("a".into()));
        assert_eq!(eval_with("message.topic.-1", "/a/", b""), None);
        assert_eq!(
            eval_with(&format!("message.topic.{}", i64::MIN), "a", b""),
            None
        );
    }

    #[test]
    fn json_paths() {
        assert_eq!(eval("payload.$.device.id", DOC), Some("d-42".into()));
        assert_eq!(
            eval("message.payload.$.device.id", DOC),
            Some("d-42".into())
        );
        assert_eq!(eval("payload.$.top", DOC), Some("t".into()));
        assert_eq!(eval("payload.$['device']['id']", DOC), Some("d-42".into()));
        assert_eq!(eval("payload.$.device.n", DOC), Some("7".into()));
        assert_eq!(eval("payload.$.device.f", DOC), Some("1.5".into()));
        assert_eq!(eval("payload.$.device.on", DOC), Some("true".into()));
    }

    #[test]
    fn json_array_index() {
        assert_eq!(eval("payload.$.items[0].id", DOC), Some("i0".into()));
        assert_eq!(eval("payload.$.items[1].id", DOC), Some("i1".into()));
        assert_eq!(eval("payload.$.items[-1].id", DOC), Some("i1".into()));
        assert_eq!(eval("payload.$.items[5].id", DOC), None);
    }

    #[test]
    fn json_non_scalar_or_ambiguous() {
        assert_eq!(eval("payload.$.device.nil", DOC), None);
        assert_eq!(eval("payload.$.device.obj", DOC), None);
        assert_eq!(eval("payload.$.device.arr", DOC), None);
        assert_eq!(eval("payload.$.device.empty", DOC), None);
        assert_eq!(eval("payload.$.missing", DOC), None);
        // Two matches: no key.
        assert_eq!(eval("payload.$.items[*].id", DOC), None);
        assert_eq!(eval("payload.$..id", DOC), None);
    }

    #[test]
    fn json_root_scalar_payload() {
        assert_eq!(eval("payload.$", br#""abc""#), Some("abc".into()));
        assert_eq!(eval("payload.$", b"12"), Some("12".into()));
        assert_eq!(eval("payload.$", DOC), None);
    }

    #[test]
    fn non_json_and_non_utf8_payloads() {
        assert_eq!(eval("payload.$.device.id", b"not json"), None);
        assert_eq!(eval("payload.$.device.id", b""), None);
        assert_eq!(eval("payload.$.device.id", &[0xff, 0xfe, 0x00, 0x80]), None);
        assert_eq!(
            eval("payload.$.device.id", b"{\"device\":{\"id\":\"\xff\"}}"),
            None
        );
        assert_eq!(eval("json_value(message.payload,'a')", &[0xc3, 0x28]), None);
        // Non-JSON payloads do not matter to the other forms.
        assert_eq!(eval("message.from", &[0xff]), Some("dev-1".into()));
    }

    #[test]
    fn emqx_json_value() {
        assert_eq!(
            eval("json_value(message.payload,'device.id')", DOC),
            Some("d-42".into())
        );
        assert_eq!(
            eval("json_value( message.payload , \"device.n\" )", DOC),
            Some("7".into())
        );
        assert_eq!(
            eval("json_value(payload,'items.1.id')", DOC),
            Some("i1".into())
        );
        assert_eq!(
            eval("json_value(message.payload,'top')", DOC),
            Some("t".into())
        );
        assert_eq!(eval("json_value(message.payload,'device.obj')", DOC), None);
        assert_eq!(eval("json_value(message.payload,'device.nil')", DOC), None);
        assert_eq!(eval("json_value(message.payload,'top.x')", DOC), None);
        assert_eq!(eval("json_value(message.payload,'items.x')", DOC), None);
        assert_eq!(eval("json_value(message.payload,'nope')", b"[1"), None);
    }

    #[test]
    fn source_is_kept() {
        let e = KeyExpr::parse("payload.$.device.id").unwrap();
        assert_eq!(e.source(), "payload.$.device.id");
        let e2 = e.clone();
        assert_eq!(e2.source(), e.source());
    }

    #[test]
    fn bad_expressions() {
        for bad in [
            "",
            "   ",
            "message",
            "message.fro",
            "message.From",
            "clientid",
            "message.topic.",
            "message.topic.x",
            "message.topic.1.2",
            "message.topic.+1",
            "message.topic.99999999999999999999999",
            "message.user_property.",
            "message.headers.properties.User-Property.",
            "payload",
            "payload.device.id",
            "payload.$.",
            "payload.$[",
            "payload.$.items[?(@.id ==]",
            "message.payload.$$",
            "json_value(message.payload)",
            "json_value(message.payload,'')",
            "json_value(message.payload,'a..b')",
            "json_value(message.payload,a.b)",
            "json_value(message.topic,'a')",
            "json_value(message.payload,'a'",
        ] {
            let err = KeyExpr::parse(bad).err();
            assert!(err.is_some(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn unknown_lists_supported_forms() {
        let err = KeyExpr::parse("message.nonsense").unwrap_err();
        assert!(err.contains("message.nonsense"), "{err}");
        assert!(err.contains("message.from"), "{err}");
        assert!(err.contains("payload.$"), "{err}");
        assert!(err.contains("json_value"), "{err}");
    }

    #[test]
    fn bad_json_path_reason() {
        let err = KeyExpr::parse("payload.$[").unwrap_err();
        assert!(err.contains("invalid JSON path"), "{err}");
    }

    #[test]
    fn deep_nesting_is_rejected_not_overflowing() {
        let deep = format!("payload.${}", "[".repeat(10_000));
        assert!(KeyExpr::parse(&deep).is_err());
    }
}
