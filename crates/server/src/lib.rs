//! The Trainyard control plane: the REST API, authentication, and the reconciler that drives
//! jobs through the executor. `trainyard` (see `main.rs`) runs it.
//!
//! - [`app`]: the operations, independent of HTTP.
//! - [`api`]: routes, thin handlers and the OpenAPI document.
//! - [`error`], [`extract`]: how bad input and failures become typed JSON errors.
//! - [`text`]: the one check that refuses text Postgres cannot store (NUL), on every route.
//! - [`control`]: the control loops (admission, launch, observation; the schedule board; health).
//! - [`storage`]: the object store, artefacts, volumes, log archiving and retention.
//! - [`dev`]: `trainyard dev`, everything on one machine with a private Postgres.

#![deny(clippy::unwrap_used)]

pub mod api;
pub mod app;
pub mod cache_agent;
pub mod cluster;
pub mod code;
pub mod control;
pub mod dev;
pub mod error;
pub mod extract;
pub mod monitoring;
pub mod oidc;
pub mod routes;
pub mod scheduling;
pub mod storage;
pub mod templates;
pub mod text;
mod web;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderName, HeaderValue};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::set_header::SetResponseHeaderLayer;
use tower_http::trace::TraceLayer;
use trainyard_executor::Executor;
use trainyard_store::Store;

use crate::app::{App, AppParts};
use crate::control::reconciler::{Reconciler, ReconcilerSettings};
use crate::error::ApiError;
use crate::storage::Storage;
use crate::templates::Templates;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub app: App,
    /// Cancelled when the server shuts down, so long-lived responses (log follows) end.
    pub shutdown: CancellationToken,
}

/// Every route of the server: the REST API and the dashboard (`trainyard routes` lists them).
pub fn route_table() -> routes::RouteTable {
    routes::RouteTable::new().merge(api::routes()).merge(web::routes())
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
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
     img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

/// A header every response carries unless its handler set one.
fn security_header(name: &'static str, value: &'static str) -> SetResponseHeaderLayer<HeaderValue> {
    SetResponseHeaderLayer::if_not_present(HeaderName::from_static(name), HeaderValue::from_static(value))
}

/// A running control plane: the store, the executor and the reconciler, ready to serve.
pub struct Server {
    pub state: AppState,
    reconciler: Reconciler,
    /// Closed last, when the server stops.
    store: Store,
}

impl Server {
    /// Loads the built-in templates (a broken one is an error naming it) and wires the parts.
    pub fn new(
        store: Store,
        executor: Arc<dyn Executor>,
        storage: Storage,
        settings: ReconcilerSettings,
    ) -> Result<Server, String> {
        let templates = Arc::new(match &settings.builtin_templates_dir {
            None => Templates::new(store.clone())?,
            Some(dir) => Templates::from_dir(store.clone(), dir)?,
        });
        let wake = Arc::new(Notify::new());
        let storage = Arc::new(storage);
        let board = Arc::new(crate::control::board::ScheduleBoard::new(settings.schedule_max_age));
        let health = Arc::new(crate::control::health::LoopHealth::new(settings.ready_max_pass_age));
        let monitoring = Arc::new(monitoring::Monitoring::new());
        let app = App::new(AppParts {
            store: store.clone(),
            executor: Arc::clone(&executor),
            reconciler_wake: Arc::clone(&wake),
            schedule: Arc::clone(&board),
            templates: Arc::clone(&templates),
            storage: Arc::clone(&storage),
            health: Arc::clone(&health),
            oidc: None,
            monitoring: Arc::clone(&monitoring),
        });
        let reconciler = Reconciler::new(store.clone(), executor, templates, wake, board, health, settings)
            .with_storage(storage)
            .with_monitoring(monitoring);
        Ok(Server { state: AppState { app, shutdown: CancellationToken::new() }, reconciler, store })
    }

    /// Queues jobs larger than today's cluster instead of refusing them (an autoscaled cluster).
    pub fn with_cluster_grows(mut self, grows: bool) -> Server {
        self.state.app.cluster_grows_set(grows);
        self
    }

    /// Lets Prometheus scrape `/metrics` with this bearer token (platform admins' API tokens
    /// are accepted too).
    pub fn with_metrics_token(mut self, token: Option<String>) -> Server {
        self.state.app.metrics_token_set(token);
        self
    }

    /// Turns single sign-on on (with `Some`).
    pub fn with_oidc(mut self, oidc: Option<oidc::Oidc>) -> Server {
        self.state.app.oidc_set(oidc.map(Arc::new));
        self
    }

    /// Serves on `listener` until `shutdown` resolves, then stops in order: stop accepting and
    /// finish requests in flight (at most `drain` long), end log streams, stop the reconciler,
    /// close the database pool. Job processes are left running; the next start re-adopts them.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
        drain: Duration,
    ) -> std::io::Result<()> {
        let Server { state, mut reconciler, store } = self;
        let base = format!("http://{}", listener.local_addr()?);
        state.app.sso_redirect_default(&base);
        reconciler.api_url_default(base);
        // Jobs of this server's built-in template versions can run again after an upgrade.
        if let Err(err) = state.app.builtin_templates_keep().await {
            tracing::warn!(%err, "cannot keep the built-in template versions; retried at the next start");
        }
        let token = state.shutdown.clone();
        let reconciler_task = tokio::spawn(reconciler.run(token.clone()));

        let signal_token = token.clone();
        let http_shutdown = async move {
            shutdown.await;
            tracing::info!("shutting down: no new connections");
            signal_token.cancel();
        };
        let router = app(state);
        let server = axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>())
            .with_graceful_shutdown(http_shutdown);
        let served = tokio::select! {
            result = server => result,
            _ = async { token.cancelled().await; tokio::time::sleep(drain).await } => {
                tracing::warn!("requests still running after {drain:?}; closing them");
                Ok(())
            }
        };
        token.cancel();
        let _ = reconciler_task.await;
        store.close().await;
        served
    }
}
