//! The lanemq REST admin API (`/api/v5`, EMQX-compatible paths) for named streams, the global
//! stream settings, authorization reload, broker statistics and the lite-topic layer (lite
//! parents, lanes, groups, metrics: `/api/v5/lite/...`), clients and subscriptions
//! (`/api/v5/clients`, `/api/v5/subscriptions`, kick) and the health check (`/api/v5/status`,
//! no token), Prometheus metrics of the whole broker (`/metrics`, `/api/v5/prometheus/stats`)
//! and the web dashboard at `/`, plus a minimal blocking
//! HTTP/1.1 [`client`] used by the `lanemq streams ...` command line and by tests.
//!
//! - [`AdminBackend`]: what the API needs from the broker (the registry lives elsewhere);
//! - [`router`]: the axum router (bearer-token authentication, JSON errors, body limit,
//!   request timeout, debug request log);
//! - [`serve`]: runs a router on a listener until a shutdown future completes;
//! - [`load_or_create_token`]: the API token (configured, or `<data_dir>/admin.token`);
//! - [`openapi`]: the OpenAPI 3.0 description served at `GET /api/v5/openapi.json`.

mod api;
mod backend;
pub mod client;
mod clients;
mod dashboard;
mod http;
mod lanes;
mod metrics;
pub mod openapi;
mod publish;
mod retainer;
mod shape;
mod stream_messages;
mod token;

pub use api::{router, router_with, serve, RouterOptions, API_PREFIX, REQUEST_TIMEOUT, ROUTES};
pub use backend::{
    AdminBackend, ApiPublish, BrokerMetrics, ClientInfo, ClusterFigures, GroupFigures,
    HistogramFigures, Kicked, LaneDetail, LiteMetrics, LogFigures, ParentFigures, PublishError,
    Published, QosFigures, RetainedInfo, StreamFigures, StreamMessageView, StreamPage,
    SubscriptionInfo,
};
pub use http::{BODY_LIMIT, LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX};
pub use lanes::METRICS_CONTENT_TYPE;
pub use metrics::{render as render_metrics, ProcessFigures, OPENMETRICS_TEXT, PROMETHEUS_TEXT};
pub use publish::BULK_MAX;
pub use stream_messages::{READ_LIMIT_DEFAULT, READ_LIMIT_MAX};
pub use token::{load_or_create_token, TOKEN_FILE};
