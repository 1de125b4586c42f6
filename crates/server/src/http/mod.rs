//! The HTTP edge: everything that knows about requests and responses, on top of the operations
//! ([`crate::app`]), which know nothing of HTTP.
//!
//! - [`api`]: routes, thin handlers and the OpenAPI document; [`web`]: the dashboard's pages.
//! - [`error`], [`extract`]: how bad input and failures become typed JSON errors.
//! - [`text`]: the one check that refuses text Postgres cannot store (NUL), on every route.
//! - [`routes`]: the route table every route is added through.
//! - [`mlflow`]: MLflow's tracking API, in MLflow's messages and error shape.
//! - [`proxy`]: interactive sessions' proxy (`/sessions/{id}/...`), HTTP and WebSocket.
//!
//! Here: [`AppState`], what every handler reaches, and [`app`], the router with its edge layers.

pub mod api;
pub mod error;
pub mod extract;
pub mod mlflow;
pub mod proxy;
pub mod routes;
pub mod text;
mod web;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderName, HeaderValue};
use tokio_util::sync::CancellationToken;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::set_header::SetResponseHeaderLayer;
use tower_http::trace::TraceLayer;

use crate::app::App;
use crate::http::error::ApiError;
use crate::monitoring;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub app: App,
    /// Cancelled when the server shuts down, so long-lived responses (log follows) end.
    pub shutdown: CancellationToken,
    /// The client the sessions' proxy forwards with (its connections are reused).
    pub sessions: proxy::SessionClient,
}

/// Every route of the server: the REST API and the dashboard (`trainyard routes` lists them).
pub fn route_table() -> routes::RouteTable {
    routes::RouteTable::new().merge(api::routes()).merge(mlflow::routes()).merge(proxy::routes()).merge(web::routes())
}

/// The HTTP application: API, health checks, landing page.
pub fn app(state: AppState) -> Router {
    let (routes, _) = route_table().into_parts();
    let routes = edge_input_checks(routes)
        .fallback(|| async {
            ApiError::Domain(trainyard_core::Error::NotFound { kind: trainyard_core::error::ObjectKind::Route })
        })
        .layer(axum::middleware::from_fn_with_state(state.app.monitoring(), monitoring::track_requests));
    edge_limits_and_headers(routes)
        .layer(CatchPanicLayer::custom(|_: Box<dyn std::any::Any + Send>| {
            axum::response::IntoResponse::into_response(ApiError::Domain(trainyard_core::Error::internal(
                "a handler panicked",
            )))
        }))
        .layer(TraceLayer::new_for_http().make_span_with(request_span))
        .with_state(state)
}

/// Each request's trace span: its method and path, never its query, which may carry a download's
/// signature or a sign-in's authorization code (no trace at any level holds either). Under
/// tower-http's target and level, as its default span (`RUST_LOG=tower_http=debug` shows it).
fn request_span<B>(request: &axum::http::Request<B>) -> tracing::Span {
    tracing::debug_span!(target: "tower_http::trace", "request", method = %request.method(), path = %request.uri().path())
}

/// The input check every routed request passes before its handler: text Postgres cannot store
/// is refused ([`text::refuse_unstorable`]). After routing, so that it can name the path
/// parameter.
pub fn edge_input_checks<S: Clone + Send + Sync + 'static>(routes: Router<S>) -> Router<S> {
    routes.route_layer(axum::middleware::from_fn(text::refuse_unstorable))
}

/// Around every response: the body limit and the security headers.
pub fn edge_limits_and_headers<S: Clone + Send + Sync + 'static>(router: Router<S>) -> Router<S> {
    router
        .layer(DefaultBodyLimit::max(extract::MAX_BODY_BYTES))
        .layer(security_header("content-security-policy", CONTENT_SECURITY_POLICY))
        .layer(security_header("x-content-type-options", "nosniff"))
        .layer(security_header("referrer-policy", "same-origin"))
}

/// What the dashboard's pages may load and do: only their own scripts and styles (plus inline
/// style attributes), nothing from elsewhere, never inside another site's frame.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
     img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

/// A header every response carries unless its handler set one.
fn security_header(name: &'static str, value: &'static str) -> SetResponseHeaderLayer<HeaderValue> {
    SetResponseHeaderLayer::if_not_present(HeaderName::from_static(name), HeaderValue::from_static(value))
}
