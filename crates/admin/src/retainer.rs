//! Retained messages (EMQX v5 paths): `GET /api/v5/mqtt/retainer/messages` (paged, `topic`
//! filter), `GET` and `DELETE /api/v5/mqtt/retainer/message/{topic}` (the topic url-encoded or
//! with its `/` as they are).

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::http::{blocking, page_limit, paged, path_name, ApiError, AppState};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RetainedQuery {
    page: Option<usize>,
    limit: Option<usize>,
    /// An MQTT topic filter the topics must match.
    topic: Option<String>,
}

fn not_found(topic: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
        format!("no retained message on {topic:?}"),
    )
}

async fn list(
    State(st): State<AppState>,
    q: Result<Query<RetainedQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let (page, limit) = page_limit(q.page, q.limit)?;
    let b = st.backend;
    let filter = q.topic;
    let mut items = blocking(move || b.retained(filter.as_deref()))
        .await?
        .map_err(ApiError::bad_request)?;
    items.sort_by(|a, b| a.topic.cmp(&b.topic));
    Ok(Json(paged(items, page, limit)))
}

async fn get_one(
    State(st): State<AppState>,
    p: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let topic = path_name(p)?;
    let b = st.backend;
    let key = topic.clone();
    let (info, payload) = blocking(move || b.retained_message(&key))
        .await?
        .ok_or_else(|| not_found(&topic))?;
    let mut v = serde_json::to_value(info).unwrap_or(Value::Null);
    v["payload"] = json!(base64::engine::general_purpose::STANDARD.encode(payload));
    Ok(Json(v))
}

async fn delete_one(
    State(st): State<AppState>,
    p: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let topic = path_name(p)?;
    let b = st.backend;
    let key = topic.clone();
    if blocking(move || b.delete_retained(&key)).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(not_found(&topic))
    }
}

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/v5/mqtt/retainer/messages", get(list))
        .route(
            "/api/v5/mqtt/retainer/message/{*topic}",
            get(get_one).delete(delete_one),
        )
}
