//! The application layer: what each operation does, independent of HTTP. The REST handlers
//! (`api`), the dashboard (`web`) and the extractors reach the system only through these
//! operations: `App`'s parts are private to this module, so roles, tenancy and validation are
//! checked in exactly one place. One file per resource:
//!
//! - [`jobs`]: submit, list, show, cancel, events, attempts, metrics and outputs;
//! - [`records`]: run records (what exactly each attempt ran), completed by engines;
//! - [`compare`]: runs compared field by field (`yard diff`, the compare page);
//! - [`logs`]: reading and following replica logs, with tokens masked ([`log_mask`]);
//! - [`templates`]: listing, publishing and running task templates;
//! - [`datasets`]: the dataset registry;
//! - [`tenancy`]: authentication, tenants, members, tokens, sessions;
//! - [`sso`]: single sign-on with OpenID Connect;
//! - [`scheduling`]: why pending and when, what-if, quotas, tenant policies, nodes;
//! - [`storage`]: artefacts, volumes, the storage policy;
//! - [`throttle`]: failed authentication, throttled per client and per token.

pub mod accounting;
pub mod checkpoints;
pub mod code;
pub mod compare;
pub mod datasets;
pub mod experiments;
pub mod interactive;
pub mod jobs;
pub mod lineage;
pub mod log_mask;
pub mod logs;
pub mod notifications;
pub mod records;
pub mod scheduling;
pub mod sso;
pub mod storage;
pub mod templates;
pub mod tenancy;
pub mod throttle;
pub mod tracking;

use std::sync::Arc;

use tokio::sync::Notify;
use trainyard_core::Result;
use trainyard_executor::Executor;
use trainyard_store::Store;
use trainyard_store::audit::Audit;

pub use jobs::MAX_METRIC_POINTS;
pub use templates::{RunMode, TemplateRunOutcome};

use crate::monitoring::Monitoring;
use crate::scheduling::board::ScheduleBoard;
use crate::scheduling::health::{LoopHealth, Readiness};
use crate::storage::Storage;
use crate::templates::Templates;

/// Everything the operations need. Cheap to clone.
#[derive(Clone)]
pub struct App {
    store: Store,
    executor: Arc<dyn Executor>,
    /// Pokes the reconciler so a submit or a cancel is acted on now, not at the next tick.
    reconciler_wake: Arc<Notify>,
    /// Every queued job's reason, positions and estimate, shared by readers (see
    /// [`crate::scheduling::board`]).
    schedule: Arc<ScheduleBoard>,
    templates: Arc<Templates>,
    /// The object store and volumes (see [`crate::storage`]).
    storage: Arc<Storage>,
    /// How the control loop is doing (see [`crate::scheduling::health`]).
    health: Arc<LoopHealth>,
    /// Failed authentication, throttled per client and per token.
    throttle: Arc<throttle::AuthThrottle>,
    /// The identity provider of single sign-on, when it is on.
    oidc: Option<Arc<crate::oidc::Oidc>>,
    /// Nodes may be added (an autoscaled cluster): a job larger than today's cluster is queued,
    /// not refused.
    cluster_grows: bool,
    /// The server's own metrics (see [`crate::monitoring`]).
    monitoring: Arc<Monitoring>,
    /// The bearer token Prometheus scrapes `/metrics` with, when the operator set one.
    metrics_token: Option<Arc<str>>,
    /// Registered pushed datasets' manifests, by object-store prefix (see
    /// [`datasets::ManifestCache`]).
    manifests: Arc<datasets::ManifestCache>,
    /// Pokes the experiments' driver (see [`experiments`]) after a create or a command.
    experiments_wake: Arc<Notify>,
    /// Unfinished experiments' searchers and the events each has taken, so that a pass applies
    /// only what is new (in memory only; rebuilt from the events after a restart).
    searches: Arc<std::sync::Mutex<std::collections::HashMap<uuid::Uuid, (trainyard_searcher::Search, u32)>>>,
    /// Webhooks may go to loopback and private addresses (`--notify-allow-private-addresses`).
    notify_allow_private: bool,
    /// Past run times by kind of job, for the estimates' run-time guesses.
    run_history: Arc<crate::scheduling::history::RunHistory>,
    /// Between SIGTERM and SIGKILL when jobs are stopped: how long a preemptor waits at most.
    stop_grace: std::time::Duration,
}

/// The parts an [`App`] is made of; the server wires them (see `Server::new`).
pub struct AppParts {
    pub store: Store,
    pub executor: Arc<dyn Executor>,
    pub reconciler_wake: Arc<Notify>,
    pub schedule: Arc<ScheduleBoard>,
    pub templates: Arc<Templates>,
    pub storage: Arc<Storage>,
    pub health: Arc<LoopHealth>,
    pub oidc: Option<Arc<crate::oidc::Oidc>>,
    pub monitoring: Arc<Monitoring>,
}

impl App {
    pub fn new(parts: AppParts) -> App {
        let AppParts { store, executor, reconciler_wake, schedule, templates, storage, health, oidc, monitoring } =
            parts;
        App {
            store,
            executor,
            reconciler_wake,
            schedule,
            templates,
            storage,
            health,
            throttle: Default::default(),
            oidc,
            cluster_grows: false,
            monitoring,
            metrics_token: None,
            manifests: Default::default(),
            experiments_wake: Default::default(),
            searches: Default::default(),
            notify_allow_private: false,
            run_history: Default::default(),
            stop_grace: std::time::Duration::from_secs(10),
        }
    }

    /// After a change the scheduler must see (a submit, a cancel, a quota): wakes the
    /// reconciler, and makes the schedule board recompute for the next reader.
    fn scheduling_changed(&self) {
        self.schedule.changed();
        self.reconciler_wake.notify_one();
    }

    /// Runs one audited change. The store appends the audit entry in the transaction of the
    /// change itself; a refusal (by the checks here or by the store) changed nothing and is
    /// appended on its own, with its outcome and message.
    /// Runs `operation` to its end even when the request that asked for it is cancelled (its
    /// client went away, the server drains): an operation of several steps that no retry
    /// repairs, such as a volume's row then the storage it stands for, is never cut between
    /// them. The request still gets the outcome when it waits for it.
    async fn uncancelled<T, F>(&self, operation: impl FnOnce(App) -> F) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        tokio::spawn(operation(self.clone()))
            .await
            .map_err(|err| trainyard_core::Error::internal(format!("an operation run to its end failed: {err}")))?
    }

    async fn audited<T>(&self, audit: &Audit, change: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        let result = change.await;
        if let Err(error) = &result
            && let Err(failed) = self.store.audit_refusal(audit, error).await
        {
            tracing::warn!(action = audit.action, target = %audit.target, "could not record a refusal in the audit log: {failed}");
        }
        result
    }

    /// Whether this server is ready to serve, and how its control loop is doing.
    pub async fn readiness(&self) -> Readiness {
        let mut readiness = self.health.readiness(self.store.ping().await);
        readiness.node_warnings = self.executor.node_warnings();
        readiness
    }
}
