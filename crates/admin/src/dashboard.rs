//! The web dashboard: `GET /` (the page) and `GET /dashboard/{file}` (its scripts, styles and
//! the vendored uPlot chart library), served by the admin listener next to `/api/v5`.
//!
//! What it owns: the static files under `crates/admin/assets/dashboard/`, embedded in the
//! binary at compile time (no Node toolchain, no files on disk at run time), and the headers
//! they are served with. What it does not own: data. The page is a plain-JS client of the
//! existing `/api/v5/...` endpoints; it sends `Authorization: Bearer <token>` (the token is
//! typed in by the user and kept in the tab's `sessionStorage`) on every call.
//!
//! Invariants:
//! - the files carry no data and no secret, so they are served without a token (the router is
//!   merged outside the bearer-token layer, like `/api/v5/status`); every data call still goes
//!   through that layer;
//! - every response has a `Content-Security-Policy` that allows only same-origin scripts,
//!   styles and connections (`default-src 'self'`, no inline script or style element, no
//!   framing), `X-Content-Type-Options: nosniff` and `Cache-Control: no-cache` (the browser
//!   revalidates, so a broker upgrade never runs a stale script against a newer API);
//! - only the files listed in [`ASSETS`] exist: any other name is 404 `text/plain`, and no
//!   path is ever joined to a file-system path.

use axum::extract::Path;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// The policy sent with every dashboard response.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
    img-src 'self'; connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; \
    form-action 'self'; frame-ancestors 'none'";

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";
const SVG: &str = "image/svg+xml";

/// The page served at `/`.
const INDEX: &str = include_str!("../assets/dashboard/index.html");

/// Every file under `/dashboard/`: (name, content type, content).
pub const ASSETS: &[(&str, &str, &str)] = &[
    ("app.js", JS, include_str!("../assets/dashboard/app.js")),
    (
        "style.css",
        CSS,
        include_str!("../assets/dashboard/style.css"),
    ),
    (
        "favicon.svg",
        SVG,
        include_str!("../assets/dashboard/favicon.svg"),
    ),
    (
        "vendor/uPlot.iife.min.js",
        JS,
        include_str!("../assets/dashboard/vendor/uPlot.iife.min.js"),
    ),
    (
        "vendor/uPlot.min.css",
        CSS,
        include_str!("../assets/dashboard/vendor/uPlot.min.css"),
    ),
    (
        "vendor/uPlot.LICENSE",
        TEXT,
        include_str!("../assets/dashboard/vendor/uPlot.LICENSE"),
    ),
    (
        "vendor/VERSION",
        TEXT,
        include_str!("../assets/dashboard/vendor/VERSION"),
    ),
];

/// The dashboard routes; they need no state and no token (see the module invariants).
pub(crate) fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(index))
        .route("/dashboard/{*file}", get(asset))
}

fn respond(status: StatusCode, content_type: &'static str, body: &'static str) -> Response {
    let headers = [
        (CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (
            HeaderName::from_static("content-security-policy"),
            HeaderValue::from_static(CSP),
        ),
        (
            HeaderName::from_static("x-content-type-options"),
            HeaderValue::from_static("nosniff"),
        ),
        (
            HeaderName::from_static("referrer-policy"),
            HeaderValue::from_static("no-referrer"),
        ),
    ];
    (status, headers, body).into_response()
}

async fn index() -> Response {
    respond(StatusCode::OK, HTML, INDEX)
}

async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, _, _)| *name == file) {
        Some((_, content_type, body)) => respond(StatusCode::OK, content_type, body),
        None => respond(
            StatusCode::NOT_FOUND,
            TEXT,
            "no such dashboard file (see crates/admin/assets/dashboard/)\n",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{request_with_headers, Response as ClientResponse};

    /// Serves `router` on 127.0.0.1:0 in a thread; returns the address and a stop handle.
    fn serve_in_thread(router: Router) -> (String, tokio::sync::oneshot::Sender<()>) {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind");
                let _ = addr_tx.send(listener.local_addr().expect("addr").to_string());
                let _ = crate::serve(listener, router, async move {
                    let _ = rx.await;
                })
                .await;
            });
        });
        (addr_rx.recv().expect("address"), tx)
    }

    fn get(addr: &str, path: &str) -> ClientResponse {
        request_with_headers(addr, "GET", path, &[("Accept", "*/*")], None).expect("request")
    }

    fn assert_common_headers(r: &ClientResponse) {
        assert_eq!(r.header("cache-control"), Some("no-cache"));
        assert_eq!(r.header("content-security-policy"), Some(CSP));
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    }

    #[test]
    fn csp_is_strict() {
        assert!(CSP.starts_with("default-src 'self';"));
        assert!(!CSP.contains("unsafe"));
        assert!(!CSP.contains('*'));
        assert!(CSP.contains("frame-ancestors 'none'"));
    }

    #[test]
    fn index_is_html_with_the_csp_and_no_inline_script_or_style() {
        let (addr, _stop) = serve_in_thread(router());
        let r = get(&addr, "/");
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-type"), Some(HTML));
        assert_common_headers(&r);
        assert!(r.body.starts_with("<!doctype html>"), "{}", &r.body[..40]);
        // Every script is a same-origin file: no inline code, no handler attributes.
        assert!(!r.body.contains("<script>"));
        assert!(!r.body.contains("<style"));
        assert!(!r.body.contains(" style="));
        assert!(!r.body.contains(" onclick="));
        assert!(r
            .body
            .contains("<script src=\"/dashboard/vendor/uPlot.iife.min.js\"></script>"));
        assert!(r
            .body
            .contains("<script src=\"/dashboard/app.js\"></script>"));
    }

    #[test]
    fn assets_are_served_with_their_types() {
        let (addr, _stop) = serve_in_thread(router());
        for (name, content_type, body) in ASSETS {
            let r = get(&addr, &format!("/dashboard/{name}"));
            assert_eq!(r.status, 200, "{name}");
            assert_eq!(r.header("content-type"), Some(*content_type), "{name}");
            assert_eq!(r.body, *body, "{name}");
            assert_common_headers(&r);
        }
        let r = get(&addr, "/dashboard/app.js");
        assert_eq!(r.header("content-type"), Some(JS));
        let r = get(&addr, "/dashboard/vendor/uPlot.min.css");
        assert_eq!(r.header("content-type"), Some(CSS));
        assert!(get(&addr, "/dashboard/vendor/uPlot.iife.min.js")
            .body
            .starts_with("/*! https://github.com/leeoniya/uPlot (v1.6.32) */"));
    }

    #[test]
    fn every_file_the_page_references_exists() {
        for line in INDEX.lines() {
            for attr in ["src=\"/dashboard/", "href=\"/dashboard/"] {
                if let Some((_, rest)) = line.split_once(attr) {
                    let name = rest.split('"').next().unwrap_or_default();
                    assert!(
                        ASSETS.iter().any(|(n, _, _)| *n == name),
                        "index.html references {name:?}, which is not in ASSETS"
                    );
                }
            }
        }
    }

    #[test]
    fn unknown_files_are_404_text() {
        let (addr, _stop) = serve_in_thread(router());
        for path in [
            "/dashboard/nope.js",
            "/dashboard/vendor/",
            "/dashboard/../Cargo.toml",
            "/dashboard/%2e%2e/src/lib.rs",
            "/dashboard/APP.JS",
        ] {
            let r = get(&addr, path);
            assert_eq!(r.status, 404, "{path}");
            assert_eq!(r.header("content-type"), Some(TEXT), "{path}");
            assert!(r.body.contains("no such dashboard file"), "{path}");
        }
    }
}
