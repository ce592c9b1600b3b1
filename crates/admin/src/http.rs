//! The HTTP plumbing every handler module shares: the JSON error response ([`ApiError`]),
//! the JSON body extractor that checks a body's types against its documented schema before
//! serde ([`JsonBody`]), the router state, running a backend call on the blocking pool, path
//! and paging helpers, and the size limits.
//!
//! Low level: imports only [`crate::backend`] and [`crate::shape`]; handler modules import
//! it, never the router.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequest, Path, Request};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use lanemq_lite::ParentDef;
use lanemq_streams::{GlobalSettings, StreamDef, StreamError};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use crate::backend::AdminBackend;

/// Largest accepted request body (larger: 413).
pub const BODY_LIMIT: usize = 1 << 20;

/// Default page size of `GET /streams`.
pub const LIST_LIMIT_DEFAULT: usize = 100;

/// Largest page size of `GET /streams` (EMQX: 1–10000).
pub const LIST_LIMIT_MAX: usize = 10_000;

/// An error response: `{"code": "...", "message": "..."}` with its status.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) code: &'static str,
    message: String,
}

impl ApiError {
    pub(crate) fn new(
        status: StatusCode,
        code: &'static str,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "BAD_REQUEST", message)
    }

    fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL_ERROR", message)
    }

    fn too_large() -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "PAYLOAD_TOO_LARGE",
            format!("request body larger than {BODY_LIMIT} bytes"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({ "code": self.code, "message": self.message })),
        )
            .into_response()
    }
}

impl From<StreamError> for ApiError {
    fn from(e: StreamError) -> ApiError {
        let (status, code) = match &e {
            StreamError::NotFound(_) => (StatusCode::NOT_FOUND, "NOT_FOUND"),
            StreamError::AlreadyExists(_) => (StatusCode::CONFLICT, "ALREADY_EXISTS"),
            StreamError::MaxStreamCount(_) => (StatusCode::BAD_REQUEST, "MAX_STREAM_COUNT_REACHED"),
            StreamError::Invalid(_) => (StatusCode::BAD_REQUEST, "BAD_REQUEST"),
            // The request is well formed; it conflicts with what the stream already is.
            StreamError::Immutable(_) => (StatusCode::CONFLICT, "CONFLICT"),
            StreamError::Disabled => (StatusCode::SERVICE_UNAVAILABLE, "SERVICE_UNAVAILABLE"),
            StreamError::Storage(_) => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL_ERROR"),
        };
        ApiError::new(status, code, e.to_string())
    }
}

/// A JSON request body: the content type must be `application/json` (or `...+json`), at most
/// [`BODY_LIMIT`] bytes, its JSON types those of its schema in the OpenAPI document
/// ([`Documented`], [`crate::shape`]); every failure is a JSON error (400 with the reason, or
/// 413).
pub(crate) struct JsonBody<T>(pub(crate) T);

/// A request body type and its schema in the OpenAPI document.
pub(crate) trait Documented {
    fn schema() -> Value;
}

impl Documented for StreamDef {
    fn schema() -> Value {
        crate::shape::schema_ref("StreamDef")
    }
}

impl Documented for GlobalSettings {
    fn schema() -> Value {
        crate::shape::schema_ref("GlobalSettings")
    }
}

impl Documented for ParentDef {
    fn schema() -> Value {
        crate::shape::schema_ref("LiteParentDef")
    }
}

/// Any JSON: the handler checks it against the schema it needs.
impl Documented for Value {
    fn schema() -> Value {
        json!({})
    }
}

impl<T: Documented> Documented for Vec<T> {
    fn schema() -> Value {
        json!({ "type": "array", "items": T::schema() })
    }
}

fn is_json_content_type(headers: &HeaderMap) -> bool {
    let Some(v) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let mime = v
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
}

impl<S: Send + Sync, T: DeserializeOwned + Documented> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        if !is_json_content_type(req.headers()) {
            return Err(ApiError::bad_request(
                "the request body must be JSON with Content-Type: application/json",
            ));
        }
        let declared = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > BODY_LIMIT as u64) {
            return Err(ApiError::too_large());
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|r| {
            if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large()
            } else {
                ApiError::bad_request(format!("cannot read the request body: {}", r.body_text()))
            }
        })?;
        let invalid = |e: String| ApiError::bad_request(format!("invalid request body: {e}"));
        let value: Value = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
        crate::shape::check(&value, &T::schema()).map_err(invalid)?;
        serde_json::from_value(value)
            .map(JsonBody)
            .map_err(|e| invalid(e.to_string()))
    }
}

#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) backend: Arc<dyn AdminBackend>,
}

/// Runs a backend call on the blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("backend call failed: {e}")))
}

pub(crate) fn path_name(p: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    p.map(|Path(n)| n)
        .map_err(|e| ApiError::bad_request(format!("invalid path: {}", e.body_text())))
}

pub(crate) fn page_limit(
    page: Option<usize>,
    limit: Option<usize>,
) -> Result<(usize, usize), ApiError> {
    let limit = limit.unwrap_or(LIST_LIMIT_DEFAULT);
    if !(1..=LIST_LIMIT_MAX).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit must be between 1 and {LIST_LIMIT_MAX}"
        )));
    }
    let page = page.unwrap_or(1);
    if page == 0 {
        return Err(ApiError::bad_request("page starts at 1"));
    }
    Ok((page, limit))
}

/// EMQX's page shape: `{"data": [...], "meta": {page, limit, count, hasnext}}`, `count`
/// being the number of matching items on all pages.
pub(crate) fn paged<T: Serialize>(items: Vec<T>, page: usize, limit: usize) -> Value {
    let count = items.len();
    let start = (page - 1).saturating_mul(limit).min(count);
    let end = start.saturating_add(limit).min(count);
    let data: Vec<Value> = items
        .into_iter()
        .skip(start)
        .take(end - start)
        .map(|i| serde_json::to_value(i).unwrap_or(Value::Null))
        .collect();
    json!({
        "data": data,
        "meta": { "page": page, "limit": limit, "count": count, "hasnext": end < count }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn json_content_types() {
        let mut h = HeaderMap::new();
        assert!(!is_json_content_type(&h));
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        );
        assert!(is_json_content_type(&h));
        h.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        assert!(!is_json_content_type(&h));
    }

    #[test]
    fn stream_errors_map_to_statuses() {
        let cases = [
            (StreamError::NotFound("a".into()), 404, "NOT_FOUND"),
            (
                StreamError::AlreadyExists("a".into()),
                409,
                "ALREADY_EXISTS",
            ),
            (
                StreamError::MaxStreamCount(3),
                400,
                "MAX_STREAM_COUNT_REACHED",
            ),
            (StreamError::Invalid(vec![]), 400, "BAD_REQUEST"),
            (StreamError::Immutable("topic_filter"), 409, "CONFLICT"),
            (StreamError::Disabled, 503, "SERVICE_UNAVAILABLE"),
            (StreamError::Storage("x".into()), 500, "INTERNAL_ERROR"),
        ];
        for (e, status, code) in cases {
            let a = ApiError::from(e);
            assert_eq!(a.status.as_u16(), status);
            assert_eq!(a.code, code);
        }
    }
}
