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
pub mod client;
mod clients;
mod dashboard;
mod lanes;
mod metrics;
pub mod openapi;
mod publish;
mod retainer;
mod shape;
mod stream_messages;
mod token;

pub use api::{
    router, router_with, serve, AdminBackend, RouterOptions, API_PREFIX, BODY_LIMIT,
    LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX, REQUEST_TIMEOUT, ROUTES,
};
pub use clients::{ClientInfo, Kicked, SubscriptionInfo};
pub use lanes::{LaneDetail, LiteMetrics, METRICS_CONTENT_TYPE};
pub use metrics::{
    render as render_metrics, BrokerMetrics, GroupFigures, HistogramFigures, LogFigures,
    ParentFigures, ProcessFigures, QosFigures, StreamFigures, OPENMETRICS_TEXT, PROMETHEUS_TEXT,
};
pub use publish::{ApiPublish, PublishError, Published, BULK_MAX};
pub use retainer::RetainedInfo;
pub use stream_messages::{StreamMessageView, StreamPage, READ_LIMIT_DEFAULT, READ_LIMIT_MAX};
pub use token::{load_or_create_token, TOKEN_FILE};
