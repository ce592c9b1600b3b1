//! `POST /api/v5/publish` and `POST /api/v5/publish/bulk` (EMQX v5 shapes): publish from a
//! script over HTTP. The body is parsed and checked here; the broker stores the message (an
//! answer for QoS 1/2 means it is durable, as a PUBACK would), applies the ACL to the `api`
//! identity and routes it.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::backend::{ApiPublish, PublishError, Published};
use crate::http::{blocking, ApiError, AppState, JsonBody};

/// Most messages in one `POST /publish/bulk`.
pub const BULK_MAX: usize = 1000;

impl From<PublishError> for ApiError {
    fn from(e: PublishError) -> ApiError {
        match e {
            PublishError::Invalid(m) => ApiError::bad_request(m),
            PublishError::NotAuthorized(m) => {
                ApiError::new(StatusCode::FORBIDDEN, "NOT_AUTHORIZED", m)
            }
            PublishError::Unavailable(m) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "SERVICE_UNAVAILABLE", m)
            }
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Properties {
    payload_format_indicator: Option<u8>,
    message_expiry_interval: Option<u32>,
    content_type: Option<String>,
    response_topic: Option<String>,
    correlation_data: Option<String>,
    #[serde(default)]
    user_properties: serde_json::Map<String, Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    topic: String,
    #[serde(default)]
    payload: String,
    /// `plain` (default) or `base64`.
    payload_encoding: Option<String>,
    #[serde(default)]
    qos: u8,
    #[serde(default)]
    retain: bool,
    properties: Option<Properties>,
    /// Accepted for EMQX compatibility; the publisher is always the `api` identity.
    clientid: Option<String>,
}

impl crate::http::Documented for Body {
    fn schema() -> Value {
        crate::shape::schema_ref("PublishRequest")
    }
}

impl Body {
    fn check(self) -> Result<ApiPublish, String> {
        if self.qos > 2 {
            return Err(format!("qos {}: must be 0, 1 or 2", self.qos));
        }
        // What the document's pattern states (the broker checks it again with the rest).
        if self.topic.is_empty() || self.topic.contains(['+', '#', '\0']) {
            return Err(format!("{:?} is not a valid topic name", self.topic));
        }
        if self.topic == "$SYS" || self.topic.starts_with("$SYS/") {
            return Err("$SYS topics are the broker's own".into());
        }
        let payload = match self.payload_encoding.as_deref().unwrap_or("plain") {
            "plain" => self.payload.into_bytes(),
            "base64" => base64::engine::general_purpose::STANDARD
                .decode(self.payload.as_bytes())
                .map_err(|e| format!("payload is not valid base64: {e}"))?,
            other => {
                return Err(format!(
                    "payload_encoding {other:?}: expected plain or base64"
                ))
            }
        };
        let _ = self.clientid;
        let p = self.properties;
        let mut user_properties = Vec::new();
        if let Some(p) = &p {
            for (k, v) in &p.user_properties {
                let Some(v) = v.as_str() else {
                    return Err(format!("user_properties.{k}: must be a string"));
                };
                user_properties.push((k.clone(), v.to_string()));
            }
            if p.payload_format_indicator.is_some_and(|x| x > 1) {
                return Err("payload_format_indicator must be 0 or 1".into());
            }
        }
        Ok(ApiPublish {
            topic: self.topic,
            payload,
            qos: self.qos,
            retain: self.retain,
            payload_format_indicator: p.as_ref().and_then(|p| p.payload_format_indicator),
            message_expiry_interval: p.as_ref().and_then(|p| p.message_expiry_interval),
            content_type: p.as_ref().and_then(|p| p.content_type.clone()),
            response_topic: p.as_ref().and_then(|p| p.response_topic.clone()),
            correlation_data: p
                .as_ref()
                .and_then(|p| p.correlation_data.clone())
                .map(String::into_bytes),
            user_properties,
        })
    }
}

fn result_json(r: Published) -> (StatusCode, Value) {
    match r {
        Published::Delivered(id) => (StatusCode::OK, json!({ "id": id.to_string() })),
        Published::NoSubscribers(id) => (
            StatusCode::ACCEPTED,
            json!({ "id": id.to_string(), "message": "no_matched_subscribers", "reason_code": 16 }),
        ),
    }
}

async fn publish_one(
    State(st): State<AppState>,
    JsonBody(body): JsonBody<Body>,
) -> Result<Response, ApiError> {
    let msg = body.check().map_err(ApiError::bad_request)?;
    let b = st.backend;
    let r = blocking(move || b.publish(msg)).await??;
    let (status, v) = result_json(r);
    Ok((status, Json(v)).into_response())
}

async fn publish_bulk(
    State(st): State<AppState>,
    JsonBody(bodies): JsonBody<Vec<Body>>,
) -> Result<Json<Value>, ApiError> {
    if bodies.is_empty() || bodies.len() > BULK_MAX {
        return Err(ApiError::bad_request(format!(
            "a bulk publish takes 1 to {BULK_MAX} messages"
        )));
    }
    // Every message is checked before any is published.
    let mut msgs = Vec::with_capacity(bodies.len());
    for (i, b) in bodies.into_iter().enumerate() {
        msgs.push(
            b.check()
                .map_err(|e| ApiError::bad_request(format!("[{i}]: {e}")))?,
        );
    }
    let b = st.backend;
    let results =
        blocking(move || msgs.into_iter().map(|m| b.publish(m)).collect::<Vec<_>>()).await?;
    let out: Vec<Value> = results
        .into_iter()
        .map(|r| match r {
            Ok(p) => result_json(p).1,
            Err(e) => {
                let a = ApiError::from(e);
                json!({ "code": a.code, "message": a.message() })
            }
        })
        .collect();
    Ok(Json(Value::Array(out)))
}

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/v5/publish", post(publish_one))
        .route("/api/v5/publish/bulk", post(publish_bulk))
}
