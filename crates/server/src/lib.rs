//! The Trainyard control plane: the REST API, authentication, and the reconciler that drives
//! jobs through the executor. `trainyard` (see `main.rs`) runs it.
//!
//! - [`cmd`]: the commands' wiring (`trainyard dev`, `serve` on each executor).
//! - [`http`]: the HTTP edge: the REST API, the dashboard, extractors, errors, the router.
//! - [`app`]: the operations, independent of HTTP.
//! - [`control`]: the control loops (admission, launch, observation, archiving).
//! - [`scheduling`]: the read model the loops write and requests read (snapshot, board, health).
//! - [`storage`]: the object store, artefacts, volumes, log archiving and retention.
//!
//! Here: [`Server`], which wires the parts and serves.

#![deny(clippy::unwrap_used)]

pub mod app;
pub mod cache_agent;
pub mod cmd;
pub mod code;
pub mod control;
pub mod http;
pub mod monitoring;
pub mod oidc;
pub mod scheduling;
pub mod storage;
pub mod templates;
pub mod webhooks;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use trainyard_executor::Executor;
use trainyard_store::Store;

use crate::app::{App, AppParts};
use crate::control::reconciler::{Reconciler, ReconcilerSettings};
use crate::http::{AppState, app};
use crate::storage::Storage;
use crate::templates::Templates;

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
        let board = Arc::new(crate::scheduling::board::ScheduleBoard::new(settings.schedule_max_age));
        let health = Arc::new(crate::scheduling::health::LoopHealth::new(settings.ready_max_pass_age));
        let monitoring = Arc::new(monitoring::Monitoring::new());
        let mut app = App::new(AppParts {
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
        app.stop_grace_set(settings.grace);
        let reconciler = Reconciler::new(store.clone(), executor, templates, wake, board, health, settings)
            .with_storage(storage)
            .with_monitoring(monitoring);
        Ok(Server {
            state: AppState { app, shutdown: CancellationToken::new(), sessions: http::proxy::session_client() },
            reconciler,
            store,
        })
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

    /// Lets notification webhooks go to loopback and private addresses (see [`webhooks`]).
    pub fn with_notify_allow_private(mut self, allow: bool) -> Server {
        self.state.app.notify_allow_private_set(allow);
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
        let experiments_task = tokio::spawn(state.app.clone().experiments_drive(token.clone()));
        let notifications_task = tokio::spawn(state.app.clone().notifications_deliver(token.clone()));

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
        let _ = experiments_task.await;
        let _ = notifications_task.await;
        store.close().await;
        served
    }
}
