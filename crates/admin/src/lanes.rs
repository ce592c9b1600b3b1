//! The lite-topic ("lanes") endpoints: `/api/v5/lite/...` (docs/admin-api.md#lanes).
//!
//! Parents (CRUD), the lanes of a parent (cursor-paginated), one lane with the figures of
//! every group, the groups of a parent, the lag of one group per lane (cursor-paginated) and
//! the Prometheus metrics of the lite layer.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::header::{ACCEPT, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use lanemq_lite::{LiteError, ParentDef, ParentInfo};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::backend::{LaneDetail, LiteMetrics};
use crate::http::{
    blocking, path_name, ApiError, AppState, JsonBody, LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX,
};

/// `Content-Type` of `GET /lite/metrics` (the Prometheus text exposition format).
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

impl LiteMetrics {
    /// `(name, help, value)` of every counter, `lanemq_lite_<name>_total`.
    pub(crate) fn counters(&self) -> [(&'static str, &'static str, u64); 10] {
        [
            (
                "lanes_created",
                "Lanes created by a first publish.",
                self.lanes_created,
            ),
            (
                "lanes_expired",
                "Lanes expired after their parent's TTL without a publish.",
                self.lanes_expired,
            ),
            (
                "suspended",
                "Lane deliveries answered with lane-suspend-ms (lane paused, no attempt counted).",
                self.suspended,
            ),
            (
                "retried",
                "Lane deliveries answered with lane-retry-ms (lane paused, attempt counted).",
                self.retried,
            ),
            (
                "redelivered",
                "Lane messages delivered again (suspend, retry, a holder that went away or did not acknowledge in time).",
                self.redelivered,
            ),
            (
                "ack_timeouts",
                "Lane batches not fully acknowledged within the parent's ack_timeout_ms (holder marked stuck).",
                self.ack_timeouts,
            ),
            (
                "dead_lettered",
                "Lane messages written to $dlq/<group>/<topic>.",
                self.dead_lettered,
            ),
            (
                "committed",
                "Lane messages committed by a group (PUBACK 0x00 or dead-lettered).",
                self.committed,
            ),
            (
                "publish_refused",
                "Publishes refused by the lite layer (lane key too long, max_lanes quota).",
                self.publish_refused,
            ),
            (
                "indexed",
                "Lane entries written to the lane index.",
                self.indexed,
            ),
        ]
    }

    /// The same figures as one JSON object keyed by metric name.
    pub fn to_json(&self) -> Value {
        let mut o = serde_json::Map::new();
        o.insert("lanemq_lite_lanes".into(), self.lanes.into());
        o.insert("lanemq_lite_parents".into(), self.parents.into());
        let per: serde_json::Map<String, Value> = self
            .parent_lanes
            .iter()
            .map(|(p, n)| (p.clone(), Value::from(*n)))
            .collect();
        o.insert("lanemq_lite_parent_lanes".into(), Value::Object(per));
        for (name, _, v) in self.counters() {
            o.insert(format!("lanemq_lite_{name}_total"), v.into());
        }
        Value::Object(o)
    }
}

impl From<LiteError> for ApiError {
    fn from(e: LiteError) -> ApiError {
        let (status, code) = match &e {
            LiteError::Invalid(_) => (StatusCode::BAD_REQUEST, "BAD_REQUEST"),
            LiteError::NotFound(_) => (StatusCode::NOT_FOUND, "NOT_FOUND"),
            LiteError::Exists(_) => (StatusCode::CONFLICT, "ALREADY_EXISTS"),
            LiteError::Conflict(_) => (StatusCode::CONFLICT, "CONFLICT"),
            LiteError::Storage(_) => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL_ERROR"),
        };
        ApiError::new(status, code, e.to_string())
    }
}

/// The page query of the lane listings: `limit`, `after` (alias `cursor`: the `meta.cursor`
/// of the previous page).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PageQuery {
    limit: Option<usize>,
    after: Option<String>,
    cursor: Option<String>,
}

impl PageQuery {
    fn parse(
        q: Result<Query<PageQuery>, QueryRejection>,
    ) -> Result<(Option<String>, usize), ApiError> {
        let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
        let limit = q.limit.unwrap_or(LIST_LIMIT_DEFAULT);
        if !(1..=LIST_LIMIT_MAX).contains(&limit) {
            return Err(ApiError::bad_request(format!(
                "limit must be between 1 and {LIST_LIMIT_MAX}"
            )));
        }
        let after = match (q.after, q.cursor) {
            (Some(a), Some(c)) if a != c => {
                return Err(ApiError::bad_request(
                    "after and cursor are the same parameter: give one of them",
                ))
            }
            (a, c) => a.or(c).filter(|s| !s.is_empty()),
        };
        Ok((after, limit))
    }
}

/// `{"data": items, "meta": {hasnext, limit, count, cursor?}}`; the cursor is `key` of the
/// last item when more follow.
fn page(items: Vec<Value>, more: bool, limit: usize, key: &str) -> Value {
    let mut meta = json!({ "hasnext": more, "limit": limit, "count": items.len() });
    if more {
        if let Some(last) = items.last().and_then(|i| i.get(key)).cloned() {
            meta["cursor"] = last;
        }
    }
    json!({ "data": items, "meta": meta })
}

fn to_values<T: Serialize>(items: Vec<T>) -> Vec<Value> {
    items
        .into_iter()
        .map(|i| serde_json::to_value(i).unwrap_or(Value::Null))
        .collect()
}

fn invalid(def: &ParentDef) -> Result<(), ApiError> {
    let errs = def.validate();
    if errs.is_empty() {
        Ok(())
    } else {
        Err(LiteError::Invalid(errs).into())
    }
}

async fn list_parents(State(st): State<AppState>) -> Result<Json<Value>, ApiError> {
    let b = st.backend;
    let items = blocking(move || b.list_parents()).await?;
    let n = items.len();
    Ok(Json(
        json!({ "data": items, "meta": { "count": n, "hasnext": false } }),
    ))
}

async fn create_parent(
    State(st): State<AppState>,
    JsonBody(def): JsonBody<ParentDef>,
) -> Result<Json<ParentInfo>, ApiError> {
    invalid(&def)?;
    let b = st.backend;
    Ok(Json(blocking(move || b.create_parent(def)).await??))
}

async fn get_parent(
    State(st): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<ParentInfo>, ApiError> {
    let name = path_name(name)?;
    let b = st.backend;
    Ok(Json(blocking(move || b.get_parent(&name)).await??))
}

async fn update_parent(
    State(st): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    JsonBody(mut def): JsonBody<ParentDef>,
) -> Result<Json<ParentInfo>, ApiError> {
    let name = path_name(name)?;
    if def.name.is_empty() {
        def.name = name.clone();
    } else if def.name != name {
        return Err(ApiError::bad_request(format!(
            "name: {:?} in the body differs from the name {name:?} in the path (a lite parent \
             cannot be renamed)",
            def.name
        )));
    }
    invalid(&def)?;
    let b = st.backend;
    Ok(Json(blocking(move || b.update_parent(&name, def)).await??))
}

async fn delete_parent(
    State(st): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let name = path_name(name)?;
    let b = st.backend;
    blocking(move || b.delete_parent(&name)).await??;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_lanes(
    State(st): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let name = path_name(name)?;
    let (after, limit) = PageQuery::parse(q)?;
    let b = st.backend;
    let (items, more) = blocking(move || b.list_lanes(&name, after.as_deref(), limit)).await??;
    Ok(Json(page(to_values(items), more, limit, "lane")))
}

async fn get_lane(
    State(st): State<AppState>,
    p: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<LaneDetail>, ApiError> {
    let (name, lane) = p
        .map(|Path(x)| x)
        .map_err(|e| ApiError::bad_request(format!("invalid path: {}", e.body_text())))?;
    let b = st.backend;
    let (n, l) = (name.clone(), lane.clone());
    match blocking(move || b.get_lane(&n, &l)).await?? {
        Some(d) => Ok(Json(d)),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("lane {lane:?} not found in lite parent {name:?}"),
        )),
    }
}

async fn list_groups(
    State(st): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let name = path_name(name)?;
    let b = st.backend;
    let items = blocking(move || b.lite_groups(&name)).await??;
    let n = items.len();
    Ok(Json(
        json!({ "data": items, "meta": { "count": n, "hasnext": false } }),
    ))
}

async fn group_lag(
    State(st): State<AppState>,
    p: Result<Path<(String, String)>, PathRejection>,
    q: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let (name, group) = p
        .map(|Path(x)| x)
        .map_err(|e| ApiError::bad_request(format!("invalid path: {}", e.body_text())))?;
    let (after, limit) = PageQuery::parse(q)?;
    let b = st.backend;
    let (n, g) = (name.clone(), group.clone());
    match blocking(move || b.group_lag(&n, &g, after.as_deref(), limit)).await?? {
        Some((items, more)) => {
            let mut v = page(items, more, limit, "lane");
            v["group"] = Value::String(group);
            Ok(Json(v))
        }
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("group {group:?} not found on lite parent {name:?}"),
        )),
    }
}

/// JSON only when the client asks for JSON and not for text (a Prometheus scraper sends
/// `text/plain` or `application/openmetrics-text`, curl `*/*`).
fn wants_json(headers: &HeaderMap) -> bool {
    let accept = headers
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",")
        .to_ascii_lowercase();
    let types: Vec<&str> = accept
        .split(',')
        .map(|t| t.split(';').next().unwrap_or("").trim())
        .collect();
    types.contains(&"application/json")
        && !types.iter().any(|t| {
            *t == "text/plain" || *t == "*/*" || *t == "text/*" || t.contains("openmetrics")
        })
}

async fn metrics(State(st): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let b = st.backend;
    let m = blocking(move || b.lite_metrics()).await?;
    if wants_json(&headers) {
        return Ok(Json(m.to_json()).into_response());
    }
    let mut resp = crate::metrics::render_lite(m).into_response();
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(METRICS_CONTENT_TYPE));
    Ok(resp)
}

/// The lanes routes (merged into the admin router).
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/api/v5/lite/parents",
            get(list_parents).post(create_parent),
        )
        .route(
            "/api/v5/lite/parents/{name}",
            get(get_parent).put(update_parent).delete(delete_parent),
        )
        .route("/api/v5/lite/parents/{name}/lanes", get(list_lanes))
        // A lane key may span several topic levels: `a/b` url-encoded (`a%2Fb`) or not.
        .route("/api/v5/lite/parents/{name}/lanes/{*lane}", get(get_lane))
        .route("/api/v5/lite/parents/{name}/groups", get(list_groups))
        .route(
            "/api/v5/lite/parents/{name}/groups/{group}/lag",
            get(group_lag),
        )
        .route("/api/v5/lite/metrics", get(metrics))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lite_errors_map_to_statuses() {
        let cases = [
            (LiteError::Invalid(vec![]), 400, "BAD_REQUEST"),
            (LiteError::NotFound("a".into()), 404, "NOT_FOUND"),
            (LiteError::Exists("a".into()), 409, "ALREADY_EXISTS"),
            (LiteError::Conflict("x".into()), 409, "CONFLICT"),
            (LiteError::Storage("x".into()), 500, "INTERNAL_ERROR"),
        ];
        for (e, status, code) in cases {
            let a = ApiError::from(e);
            assert_eq!(a.status.as_u16(), status);
            assert_eq!(a.code, code);
        }
    }

    #[test]
    fn metrics_text_has_help_type_and_every_counter() {
        let m = LiteMetrics {
            lanes: 3,
            parents: 1,
            lanes_created: 4,
            dead_lettered: 2,
            parent_lanes: vec![("a\"b".into(), 3)],
            ..Default::default()
        };
        let t = crate::metrics::render_lite(m.clone());
        assert!(
            t.contains("# TYPE lanemq_lite_lanes gauge\nlanemq_lite_lanes 3\n"),
            "{t}"
        );
        assert!(
            t.contains("lanemq_lite_parent_lanes{parent=\"a\\\"b\"} 3\n"),
            "{t}"
        );
        assert!(
            t.contains("# TYPE lanemq_lite_lanes_created_total counter\n"),
            "{t}"
        );
        assert!(t.contains("lanemq_lite_dead_lettered_total 2\n"), "{t}");
        for name in [
            "lanes_created",
            "lanes_expired",
            "suspended",
            "retried",
            "redelivered",
            "ack_timeouts",
            "dead_lettered",
            "committed",
            "publish_refused",
            "indexed",
        ] {
            assert!(
                t.contains(&format!("# HELP lanemq_lite_{name}_total ")),
                "{name}"
            );
            assert!(m.to_json()[format!("lanemq_lite_{name}_total")].is_u64());
        }
        assert!(t.ends_with('\n'));
    }

    #[test]
    fn json_metrics_only_when_asked_for_without_text() {
        let mut h = HeaderMap::new();
        assert!(!wants_json(&h));
        h.insert(ACCEPT, HeaderValue::from_static("application/json"));
        assert!(wants_json(&h));
        h.insert(
            ACCEPT,
            HeaderValue::from_static("text/plain;version=0.0.4;q=0.5,*/*;q=0.1"),
        );
        assert!(!wants_json(&h));
        h.insert(ACCEPT, HeaderValue::from_static("application/json, */*"));
        assert!(!wants_json(&h));
    }
}
