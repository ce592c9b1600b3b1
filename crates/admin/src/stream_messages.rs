//! Reading a named stream over HTTP: `GET /api/v5/stream/{name}/messages?offset=..&limit=..`
//! (the dashboard's stream viewer, and scripts that want a stream's history without an MQTT
//! client).
//!
//! The `offset` takes the values of the MQTT `stream-offset` user property (`earliest`,
//! `latest`, a Unix timestamp in microseconds, `@N` = after position
//! `N`), so a page's `next` value (`@<last position returned>`) continues exactly where the
//! page ended: polling with it follows the stream live. Invariant: the router never holds a
//! reader between requests; every request is one bounded read (at most [`READ_LIMIT_MAX`]
//! messages) on the blocking pool.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::routing::get;
use axum::{Json, Router};
use base64::Engine as _;
use lanemq_streams::subscribe::{parse_offset, StartFrom};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::backend::StreamMessageView;
use crate::http::{blocking, path_name, ApiError, AppState};

/// Default number of messages per page.
pub const READ_LIMIT_DEFAULT: usize = 100;
/// Largest page.
pub const READ_LIMIT_MAX: usize = 1000;
/// The most digits of an `offset` (a timestamp or a position), as the document states.
pub const OFFSET_DIGITS_MAX: usize = 19;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadQuery {
    offset: Option<String>,
    limit: Option<usize>,
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// The JSON of one message: the payload as text when it is UTF-8 (`payload_encoding` says
/// which).
fn view_json(m: &StreamMessageView) -> Value {
    let (payload, enc) = match std::str::from_utf8(&m.payload) {
        Ok(s) => (s.to_string(), "utf8"),
        Err(_) => (b64(&m.payload), "base64"),
    };
    let mut props = Map::new();
    if let Some(v) = m.payload_format_indicator {
        props.insert("payload_format_indicator".into(), json!(v));
    }
    if let Some(v) = m.message_expiry_interval {
        props.insert("message_expiry_interval".into(), json!(v));
    }
    if let Some(v) = &m.content_type {
        props.insert("content_type".into(), json!(v));
    }
    if let Some(v) = &m.response_topic {
        props.insert("response_topic".into(), json!(v));
    }
    if let Some(v) = &m.correlation_data {
        props.insert("correlation_data".into(), json!(b64(v)));
    }
    if !m.user_properties.is_empty() {
        let up: Vec<Value> = m
            .user_properties
            .iter()
            .map(|(k, v)| json!({ "key": k, "value": v }))
            .collect();
        props.insert("user_properties".into(), Value::Array(up));
    }
    json!({
        "offset": format!("@{}", m.offset),
        "topic": m.topic,
        "qos": m.qos,
        "retain": m.retain,
        "ts": m.ts_us / 1000,
        "key": m.key,
        "from_clientid": m.from_clientid,
        "payload": payload,
        "payload_encoding": enc,
        "properties": Value::Object(props),
    })
}

/// The `offset` value that continues after a read whose next position is `next`.
fn continue_from(next: u64) -> String {
    match next.checked_sub(1) {
        Some(last) => format!("@{last}"),
        None => "earliest".into(),
    }
}

async fn read(
    State(st): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    q: Result<Query<ReadQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let name = path_name(name)?;
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let limit = q.limit.unwrap_or(READ_LIMIT_DEFAULT);
    if !(1..=READ_LIMIT_MAX).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit must be between 1 and {READ_LIMIT_MAX}"
        )));
    }
    let start = match q.offset.as_deref() {
        None | Some("") => StartFrom::Earliest,
        Some(o) => {
            // The document's pattern: nothing around the value, at most 19 digits.
            let digits = o.strip_prefix('@').unwrap_or(o);
            if o.trim() != o || digits.len() > OFFSET_DIGITS_MAX {
                return Err(ApiError::bad_request(format!(
                    "offset {o:?}: expected earliest, latest, a Unix timestamp in microseconds \
                     or @<position> (at most {OFFSET_DIGITS_MAX} digits, no spaces)"
                )));
            }
            parse_offset(o).map_err(|e| ApiError::bad_request(format!("offset: {e}")))?
        }
    };
    let b = st.backend;
    let page = blocking(move || b.read_stream(&name, start, limit)).await??;
    let data: Vec<Value> = page.messages.iter().map(view_json).collect();
    Ok(Json(json!({
        "data": data,
        "next": continue_from(page.next),
        "meta": { "count": page.messages.len(), "limit": limit },
    })))
}

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/v5/stream/{name}/messages", get(read))
        .route("/api/v5/message_streams/streams/{name}/messages", get(read))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_from_names_the_last_position_read() {
        assert_eq!(continue_from(0), "earliest");
        assert_eq!(continue_from(1), "@0");
        assert_eq!(continue_from(42), "@41");
        // What it names parses back to the same next position.
        assert_eq!(parse_offset("@41").ok(), Some(StartFrom::After(41)));
    }

    #[test]
    fn binary_payloads_are_base64_and_text_stays_text() {
        let mut m = StreamMessageView {
            offset: 7,
            topic: "a/b".into(),
            qos: 1,
            retain: false,
            ts_us: 1_733_500_000_123_456,
            key: None,
            from_clientid: "c".into(),
            payload: b"hello".to_vec(),
            payload_format_indicator: None,
            message_expiry_interval: None,
            content_type: Some("text/plain".into()),
            response_topic: None,
            correlation_data: None,
            user_properties: vec![("k".into(), "v".into())],
        };
        let v = view_json(&m);
        assert_eq!(v["offset"], "@7");
        assert_eq!(v["ts"], 1_733_500_000_123u64);
        assert_eq!(v["payload"], "hello");
        assert_eq!(v["payload_encoding"], "utf8");
        assert_eq!(v["properties"]["content_type"], "text/plain");
        assert_eq!(v["properties"]["user_properties"][0]["value"], "v");
        m.payload = vec![0xff, 0x00];
        let v = view_json(&m);
        assert_eq!(v["payload"], "/wA=");
        assert_eq!(v["payload_encoding"], "base64");
    }
}
