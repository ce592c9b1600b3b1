//! The router, its handlers and middleware.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clients::{ClientInfo, Kicked, SubscriptionInfo};
use crate::publish::{ApiPublish, PublishError, Published};
use crate::retainer::RetainedInfo;
use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, FromRequest, Path, Query, Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::{from_fn, from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lanemq_lite::{LaneInfo, LiteError, ParentDef, ParentInfo};
use lanemq_streams::{GlobalSettings, StreamDef, StreamError, StreamInfo};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

pub use crate::lanes::{LaneDetail, LiteMetrics};

/// Every endpoint lives under this prefix.
pub const API_PREFIX: &str = "/api/v5";
/// Largest accepted request body (larger: 413).
pub const BODY_LIMIT: usize = 1 << 20;
/// Default page size of `GET /streams`.
pub const LIST_LIMIT_DEFAULT: usize = 100;
/// Largest page size of `GET /streams` (EMQX: 1–10000).
pub const LIST_LIMIT_MAX: usize = 10_000;
/// Default time a request may take before it is answered with 503.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Every `(method, path)` the router serves; the OpenAPI document describes exactly these.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/api/v5/streams"),
    ("POST", "/api/v5/streams"),
    ("GET", "/api/v5/stream/{name}"),
    ("PUT", "/api/v5/stream/{name}"),
    ("DELETE", "/api/v5/stream/{name}"),
    ("GET", "/api/v5/stream/{name}/messages"),
    ("GET", "/api/v5/streams/config"),
    ("PUT", "/api/v5/streams/config"),
    ("GET", "/api/v5/message_streams/streams"),
    ("POST", "/api/v5/message_streams/streams"),
    ("GET", "/api/v5/message_streams/streams/{name}"),
    ("PUT", "/api/v5/message_streams/streams/{name}"),
    ("DELETE", "/api/v5/message_streams/streams/{name}"),
    ("GET", "/api/v5/message_streams/streams/{name}/messages"),
    ("GET", "/api/v5/message_streams/config"),
    ("PUT", "/api/v5/message_streams/config"),
    ("POST", "/api/v5/authorization/reload"),
    ("GET", "/api/v5/stats"),
    ("GET", "/api/v5/openapi.json"),
    ("GET", "/api/v5/lite/parents"),
    ("POST", "/api/v5/lite/parents"),
    ("GET", "/api/v5/lite/parents/{name}"),
    ("PUT", "/api/v5/lite/parents/{name}"),
    ("DELETE", "/api/v5/lite/parents/{name}"),
    ("GET", "/api/v5/lite/parents/{name}/lanes"),
    ("GET", "/api/v5/lite/parents/{name}/lanes/{lane}"),
    ("GET", "/api/v5/lite/parents/{name}/groups"),
    ("GET", "/api/v5/lite/parents/{name}/groups/{group}/lag"),
    ("GET", "/api/v5/lite/metrics"),
    ("GET", "/api/v5/clients"),
    ("GET", "/api/v5/clients/{clientid}"),
    ("DELETE", "/api/v5/clients/{clientid}"),
    ("GET", "/api/v5/clients/{clientid}/subscriptions"),
    ("GET", "/api/v5/subscriptions"),
    ("GET", "/api/v5/status"),
    ("POST", "/api/v5/publish"),
    ("POST", "/api/v5/publish/bulk"),
    ("GET", "/api/v5/mqtt/retainer/messages"),
    ("GET", "/api/v5/mqtt/retainer/message/{topic}"),
    ("DELETE", "/api/v5/mqtt/retainer/message/{topic}"),
    ("GET", "/api/v5/prometheus/stats"),
    ("GET", "/metrics"),
];

/// What the admin API needs from the broker. The methods are synchronous; the router calls
/// them in [`tokio::task::spawn_blocking`].
pub trait AdminBackend: Send + Sync + 'static {
    /// Up to `limit` streams sorted by name, all strictly after `after` (when given), and
    /// whether more follow.
    fn list_streams(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<StreamInfo>, bool), StreamError>;
    fn get_stream(&self, name: &str) -> Result<StreamInfo, StreamError>;
    fn create_stream(&self, def: StreamDef) -> Result<StreamInfo, StreamError>;
    /// Replaces the whole definition (the name, `topic_filter` and `is_lastvalue` are fixed:
    /// [`StreamError::Immutable`]).
    fn update_stream(&self, name: &str, def: StreamDef) -> Result<StreamInfo, StreamError>;
    fn delete_stream(&self, name: &str) -> Result<(), StreamError>;
    fn get_settings(&self) -> GlobalSettings;
    /// Replaces the global settings; returns them as now in force.
    fn put_settings(&self, s: GlobalSettings) -> Result<GlobalSettings, StreamError>;
    /// Re-reads the authorization rules. `Ok`: a summary; `Err`: what is wrong, with
    /// `file:line:col`.
    fn reload_authorization(&self) -> Result<String, String>;
    /// Broker statistics, returned as is by `GET /stats`.
    fn stats(&self) -> Value;

    // --- lite parents and lanes (`/api/v5/lite/...`, docs/admin-api.md#lanes) ---

    /// Every lite parent, in creation order.
    fn list_parents(&self) -> Vec<ParentInfo>;
    fn get_parent(&self, name: &str) -> Result<ParentInfo, LiteError>;
    fn create_parent(&self, def: ParentDef) -> Result<ParentInfo, LiteError>;
    /// Replaces the whole definition (an empty `name` means the path name).
    fn update_parent(&self, name: &str, def: ParentDef) -> Result<ParentInfo, LiteError>;
    /// Deletes the parent with its lanes, their index and the group offsets.
    fn delete_parent(&self, name: &str) -> Result<(), LiteError>;
    /// Up to `limit` lanes of `parent` sorted by key, all strictly after `after` (when
    /// given), and whether more follow.
    fn list_lanes(
        &self,
        parent: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<LaneInfo>, bool), LiteError>;
    /// One lane with the figures of every group of its parent (`None`: no such lane).
    fn get_lane(&self, parent: &str, lane: &str) -> Result<Option<LaneDetail>, LiteError>;
    /// The consumer groups of `parent` (JSON objects, one per group, sorted by name).
    fn lite_groups(&self, parent: &str) -> Result<Vec<Value>, LiteError>;
    /// The figures of `group` on up to `limit` lanes of `parent` sorted by key, strictly
    /// after `after`, and whether more follow (`None`: no such group).
    fn group_lag(
        &self,
        parent: &str,
        group: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Option<(Vec<Value>, bool)>, LiteError>;
    /// The lite layer's gauges and counters (`GET /lite/metrics`).
    fn lite_metrics(&self) -> LiteMetrics;

    // --- clients and subscriptions (`/api/v5/clients`, `/api/v5/subscriptions`) ---

    /// Every session, connected or not (filtered and paged by the router).
    fn clients(&self) -> Vec<ClientInfo>;
    fn client(&self, clientid: &str) -> Option<ClientInfo>;
    /// Disconnect the client with 0x98 Administrative action (its session stays if it has an
    /// expiry), or discard the stored session of a client that is not connected.
    fn kick(&self, clientid: &str) -> Kicked;
    /// The subscriptions of one session (`None`: no such session).
    fn client_subscriptions(&self, clientid: &str) -> Option<Vec<SubscriptionInfo>>;
    /// Every subscription of every session.
    fn subscriptions(&self) -> Vec<SubscriptionInfo>;
    /// Serving (false once a shutdown began): `GET /status`.
    fn running(&self) -> bool;
    /// Publish as the `api` identity (`POST /publish`): the ACL applies; for QoS 1/2 the
    /// answer comes once the message is durable.
    fn publish(&self, msg: ApiPublish) -> Result<Published, PublishError>;
    /// Retained messages whose topic matches `filter` (every one without it); `Err`: the
    /// filter is not a valid MQTT filter.
    fn retained(&self, filter: Option<&str>) -> Result<Vec<RetainedInfo>, String>;
    /// One retained message with its payload.
    fn retained_message(&self, topic: &str) -> Option<(RetainedInfo, Vec<u8>)>;
    /// Remove a retained message (nothing is published); false if there was none.
    fn delete_retained(&self, topic: &str) -> bool;
    /// The figures of the whole broker for `GET /metrics`.
    fn metrics(&self) -> crate::metrics::BrokerMetrics;
    /// Up to `limit` messages of stream `name` from `start` (`GET /stream/{name}/messages`).
    fn read_stream(
        &self,
        name: &str,
        start: lanemq_streams::subscribe::StartFrom,
        limit: usize,
    ) -> Result<crate::stream_messages::StreamPage, StreamError>;
}

/// Tunables of [`router_with`].
#[derive(Debug, Clone)]
pub struct RouterOptions {
    /// A request still running after this is answered with 503 `SERVICE_UNAVAILABLE`.
    pub request_timeout: Duration,
    /// `GET /metrics` and `/api/v5/prometheus/stats` without the token (`[admin]
    /// metrics_public`).
    pub metrics_public: bool,
}

impl Default for RouterOptions {
    fn default() -> Self {
        RouterOptions {
            request_timeout: REQUEST_TIMEOUT,
            metrics_public: false,
        }
    }
}

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
            StreamError::Invalid(_) | StreamError::Immutable(_) => {
                (StatusCode::BAD_REQUEST, "BAD_REQUEST")
            }
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

fn invalid(errs: Vec<lanemq_streams::ValidationError>) -> Result<(), ApiError> {
    if errs.is_empty() {
        Ok(())
    } else {
        Err(StreamError::Invalid(errs).into())
    }
}

#[derive(Deserialize)]
struct ListQuery {
    limit: Option<usize>,
    cursor: Option<String>,
}

async fn list_streams(
    State(st): State<AppState>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let limit = q.limit.unwrap_or(LIST_LIMIT_DEFAULT);
    if !(1..=LIST_LIMIT_MAX).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit must be between 1 and {LIST_LIMIT_MAX}"
        )));
    }
    let cursor = q.cursor.filter(|c| !c.is_empty());
    let b = st.backend;
    let (items, more) = blocking(move || b.list_streams(cursor.as_deref(), limit)).await??;
    let mut meta = json!({ "hasnext": more, "limit": limit, "count": items.len() });
    if more {
        if let Some(last) = items.last() {
            meta["cursor"] = Value::String(last.def.name.clone());
        }
    }
    Ok(Json(json!({ "data": items, "meta": meta })))
}

async fn create_stream(
    State(st): State<AppState>,
    JsonBody(def): JsonBody<StreamDef>,
) -> Result<Json<StreamInfo>, ApiError> {
    invalid(def.validate())?;
    let b = st.backend;
    Ok(Json(blocking(move || b.create_stream(def)).await??))
}

async fn get_stream(
    State(st): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<StreamInfo>, ApiError> {
    let name = path_name(name)?;
    let b = st.backend;
    Ok(Json(blocking(move || b.get_stream(&name)).await??))
}

async fn update_stream(
    State(st): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    JsonBody(body): JsonBody<Value>,
) -> Result<Json<StreamInfo>, ApiError> {
    let name = path_name(name)?;
    let Value::Object(mut obj) = body else {
        return Err(ApiError::bad_request(
            "invalid request body: expected a JSON object",
        ));
    };
    match obj.get("name") {
        None => {
            obj.insert("name".into(), Value::String(name.clone()));
        }
        Some(Value::String(n)) if *n == name => {}
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "name: {other} in the body differs from the name {name:?} in the path (a stream cannot be renamed)"
            )))
        }
    }
    let body = Value::Object(obj);
    crate::shape::check(&body, &crate::shape::schema_ref("StreamUpdate"))
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))?;
    let def: StreamDef = serde_json::from_value(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))?;
    invalid(def.validate())?;
    let b = st.backend;
    Ok(Json(blocking(move || b.update_stream(&name, def)).await??))
}

async fn delete_stream(
    State(st): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let name = path_name(name)?;
    let b = st.backend;
    blocking(move || b.delete_stream(&name)).await??;
    Ok(StatusCode::NO_CONTENT)
}

async fn get_settings(State(st): State<AppState>) -> Result<Json<GlobalSettings>, ApiError> {
    let b = st.backend;
    Ok(Json(blocking(move || b.get_settings()).await?))
}

async fn put_settings(
    State(st): State<AppState>,
    JsonBody(s): JsonBody<GlobalSettings>,
) -> Result<Json<GlobalSettings>, ApiError> {
    invalid(s.validate())?;
    let b = st.backend;
    Ok(Json(blocking(move || b.put_settings(s)).await??))
}

async fn reload_authorization(State(st): State<AppState>) -> Result<Json<Value>, ApiError> {
    let b = st.backend;
    match blocking(move || b.reload_authorization()).await? {
        Ok(summary) => Ok(Json(json!({ "message": summary }))),
        Err(e) => Err(ApiError::new(StatusCode::BAD_REQUEST, "RELOAD_FAILED", e)),
    }
}

async fn stats(State(st): State<AppState>) -> Result<Json<Value>, ApiError> {
    let b = st.backend;
    Ok(Json(blocking(move || b.stats()).await?))
}

async fn openapi_doc() -> Json<Value> {
    Json(crate::openapi::document())
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
        format!("no endpoint {method} {}", uri.path()),
    )
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "METHOD_NOT_ALLOWED",
        format!("method {method} is not allowed on {}", uri.path()),
    )
}

/// Compares without an early exit on the first differing byte.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, rest) = v.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

async fn auth_mw(State(token): State<Arc<str>>, req: Request, next: Next) -> Response {
    let ok = !token.is_empty()
        && bearer(req.headers()).is_some_and(|t| ct_eq(t.as_bytes(), token.as_bytes()));
    if ok {
        return next.run(req).await;
    }
    let mut resp = ApiError::new(
        StatusCode::UNAUTHORIZED,
        "BAD_TOKEN",
        "missing or wrong API token (send Authorization: Bearer <token>)",
    )
    .into_response();
    resp.headers_mut().insert(
        WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"lanemq\""),
    );
    resp
}

async fn timeout_mw(State(limit): State<Duration>, req: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "SERVICE_UNAVAILABLE",
            format!("request not answered within {} ms", limit.as_millis()),
        )
        .into_response(),
    }
}

async fn log_mw(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let start = Instant::now();
    let resp = next.run(req).await;
    tracing::debug!(
        %method,
        %path,
        status = resp.status().as_u16(),
        elapsed_ms = start.elapsed().as_millis() as u64,
        "admin request"
    );
    resp
}

/// The admin router with the default [`RouterOptions`].
///
/// Every request must carry `Authorization: Bearer <token>` (an empty `token` refuses all),
/// except `GET /api/v5/status`.
pub fn router(backend: Arc<dyn AdminBackend>, token: String) -> Router {
    router_with(backend, token, RouterOptions::default())
}

/// The admin router; see [`ROUTES`] and [`crate::openapi::document`].
pub fn router_with(backend: Arc<dyn AdminBackend>, token: String, opts: RouterOptions) -> Router {
    let state = AppState { backend };
    let stream_one = || get(get_stream).put(update_stream).delete(delete_stream);
    let streams = || get(list_streams).post(create_stream);
    let config = || get(get_settings).put(put_settings);
    Router::new()
        .route("/api/v5/streams", streams())
        .route("/api/v5/stream/{name}", stream_one())
        .route("/api/v5/streams/config", config())
        .route("/api/v5/message_streams/streams", streams())
        .route("/api/v5/message_streams/streams/{name}", stream_one())
        .route("/api/v5/message_streams/config", config())
        .route("/api/v5/authorization/reload", post(reload_authorization))
        .route("/api/v5/stats", get(stats))
        .route("/api/v5/openapi.json", get(openapi_doc))
        .merge(crate::lanes::routes())
        .merge(crate::clients::routes())
        .merge(crate::publish::routes())
        .merge(crate::retainer::routes())
        .merge(crate::stream_messages::routes())
        .merge(if opts.metrics_public {
            Router::new()
        } else {
            crate::metrics::routes()
        })
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .with_state(state.clone())
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(from_fn_with_state(opts.request_timeout, timeout_mw))
        .layer(from_fn_with_state(Arc::<str>::from(token), auth_mw))
        // The health check needs no token (load balancers probe it).
        .merge(crate::clients::public_routes().with_state(state.clone()))
        .merge(if opts.metrics_public {
            crate::metrics::routes().with_state(state)
        } else {
            Router::new()
        })
        .merge(crate::dashboard::router())
        .layer(from_fn(log_mw))
}

/// Serves `router` on `listener` until `shutdown` completes, then lets running requests finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_compare() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
        assert!(ct_eq(b"", b""));
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_static("bearer  tok "));
        assert_eq!(bearer(&h), Some("tok"));
        h.insert(AUTHORIZATION, HeaderValue::from_static("Basic dG9rOg=="));
        assert_eq!(bearer(&h), None);
    }

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
            (StreamError::Immutable("topic_filter"), 400, "BAD_REQUEST"),
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
