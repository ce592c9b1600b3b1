//! The router, its handlers and middleware.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::AdminBackend;
use crate::http::{
    blocking, path_name, ApiError, AppState, JsonBody, BODY_LIMIT, LIST_LIMIT_DEFAULT,
    LIST_LIMIT_MAX,
};
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::{from_fn, from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lanemq_streams::{GlobalSettings, StreamDef, StreamError, StreamInfo};
use serde::Deserialize;
use serde_json::{json, Value};

/// Every endpoint lives under this prefix.
pub const API_PREFIX: &str = "/api/v5";
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
}
