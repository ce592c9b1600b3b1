//! Clients and subscriptions (EMQX v5 paths and shapes) and the health check:
//! `GET /api/v5/clients`, `GET|DELETE /api/v5/clients/{clientid}`,
//! `GET /api/v5/clients/{clientid}/subscriptions`, `GET /api/v5/subscriptions` and
//! `GET /api/v5/status` (the only path that needs no token: load balancers probe it).
//!
//! The backend returns every session as a [`ClientInfo`]; filtering and paging (EMQX's
//! `page`/`limit`, sorted by client id so pages are stable) happen here.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::Value;

use crate::backend::{ClientInfo, Kicked, SubscriptionInfo};
use crate::http::{blocking, page_limit, paged, path_name, ApiError, AppState};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientQuery {
    page: Option<usize>,
    limit: Option<usize>,
    username: Option<String>,
    /// Substring of the client id (EMQX's name).
    like_clientid: Option<String>,
    clientid_prefix: Option<String>,
    /// `connected` or `disconnected`.
    conn_state: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubscriptionQuery {
    page: Option<usize>,
    limit: Option<usize>,
    clientid: Option<String>,
    /// The exact filter.
    topic: Option<String>,
    qos: Option<u8>,
    /// Filters that contain this substring.
    match_topic: Option<String>,
}

fn not_found(clientid: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "CLIENTID_NOT_FOUND",
        format!("no session with client id {clientid:?}"),
    )
}

async fn list_clients(
    State(st): State<AppState>,
    q: Result<Query<ClientQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let (page, limit) = page_limit(q.page, q.limit)?;
    let connected = match q.conn_state.as_deref() {
        None => None,
        Some("connected") => Some(true),
        Some("disconnected") => Some(false),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "conn_state {other:?}: expected connected or disconnected"
            )))
        }
    };
    let b = st.backend;
    let mut items = blocking(move || b.clients()).await?;
    items.retain(|c| {
        connected.is_none_or(|want| c.connected == want)
            && q.username
                .as_deref()
                .is_none_or(|u| c.username.as_deref() == Some(u))
            && q.like_clientid
                .as_deref()
                .is_none_or(|s| c.clientid.contains(s))
            && q.clientid_prefix
                .as_deref()
                .is_none_or(|p| c.clientid.starts_with(p))
    });
    items.sort_by(|a, b| a.clientid.cmp(&b.clientid));
    Ok(Json(paged(items, page, limit)))
}

async fn get_client(
    State(st): State<AppState>,
    p: Result<Path<String>, PathRejection>,
) -> Result<Json<ClientInfo>, ApiError> {
    let id = path_name(p)?;
    let b = st.backend;
    let key = id.clone();
    blocking(move || b.client(&key))
        .await?
        .map(Json)
        .ok_or_else(|| not_found(&id))
}

async fn kick_client(
    State(st): State<AppState>,
    p: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let id = path_name(p)?;
    let b = st.backend;
    let key = id.clone();
    match blocking(move || b.kick(&key)).await? {
        Kicked::Disconnected | Kicked::Discarded => Ok(StatusCode::NO_CONTENT.into_response()),
        Kicked::NotFound => Err(not_found(&id)),
    }
}

async fn client_subscriptions(
    State(st): State<AppState>,
    p: Result<Path<String>, PathRejection>,
) -> Result<Json<Vec<SubscriptionInfo>>, ApiError> {
    let id = path_name(p)?;
    let b = st.backend;
    let key = id.clone();
    let mut subs = blocking(move || b.client_subscriptions(&key))
        .await?
        .ok_or_else(|| not_found(&id))?;
    subs.sort_by(|a, b| a.topic.cmp(&b.topic));
    Ok(Json(subs))
}

async fn list_subscriptions(
    State(st): State<AppState>,
    q: Result<Query<SubscriptionQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let (page, limit) = page_limit(q.page, q.limit)?;
    if q.qos.is_some_and(|x| x > 2) {
        return Err(ApiError::bad_request("qos must be 0, 1 or 2"));
    }
    let b = st.backend;
    let mut items = blocking(move || b.subscriptions()).await?;
    items.retain(|s| {
        q.clientid.as_deref().is_none_or(|c| s.clientid == c)
            && q.topic.as_deref().is_none_or(|t| s.topic == t)
            && q.qos.is_none_or(|x| s.qos == x)
            && q.match_topic.as_deref().is_none_or(|t| s.topic.contains(t))
    });
    items.sort_by(|a, b| (&a.clientid, &a.topic).cmp(&(&b.clientid, &b.topic)));
    Ok(Json(paged(items, page, limit)))
}

/// `GET /api/v5/status`: 200 and a line of text while the broker serves; 503 and why while it
/// shuts down, or once its log refuses writes after a storage error (a supervisor reading it
/// restarts the broker). No token.
async fn status(State(st): State<AppState>) -> Response {
    if !st.backend.running() {
        return (StatusCode::SERVICE_UNAVAILABLE, "lanemq is shutting down\n").into_response();
    }
    match st.backend.storage_failure() {
        None => (StatusCode::OK, "lanemq is running\n").into_response(),
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("lanemq cannot store messages (restart it once the cause is fixed): {why}\n"),
        )
            .into_response(),
    }
}

/// The routes behind the token.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/v5/clients", get(list_clients))
        .route(
            "/api/v5/clients/{clientid}",
            get(get_client).delete(kick_client),
        )
        .route(
            "/api/v5/clients/{clientid}/subscriptions",
            get(client_subscriptions),
        )
        .route("/api/v5/subscriptions", get(list_subscriptions))
}

/// The routes without a token.
pub(crate) fn public_routes() -> Router<AppState> {
    Router::new().route("/api/v5/status", get(status))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pages() {
        let v = paged((0..5).collect::<Vec<u32>>(), 2, 2);
        assert_eq!(v["data"], json!([2, 3]));
        assert_eq!(v["meta"]["hasnext"], json!(true));
        assert_eq!(v["meta"]["count"], json!(5));
        let v = paged((0..5).collect::<Vec<u32>>(), 3, 2);
        assert_eq!(v["data"], json!([4]));
        assert_eq!(v["meta"]["hasnext"], json!(false));
        let v = paged((0..5).collect::<Vec<u32>>(), 9, 2);
        assert_eq!(v["data"], json!([]));
        assert!(page_limit(Some(0), None).is_err());
        assert!(page_limit(None, Some(0)).is_err());
    }
}
