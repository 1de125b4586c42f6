//! Postgres persistence for Trainyard.
//!
//! Everything durable lives here: tenants, users, memberships, token hashes, jobs with their
//! state, attempts and events, datasets, storage, audit, sessions. The database is the truth:
//! any number of server processes share one, and a restarted server picks up exactly where the
//! last one stopped. The one thing kept in memory is a cache of the unfinished jobs' decoded
//! rows ([`reconcile::Store::jobs_unfinished`]), checked against each row's version at every
//! read.
//!
//! Two kinds of queries:
//! - Those that answer requests ([`tenancy`], [`jobs`], [`datasets`], [`storage`], ...). Every
//!   query of tenant data takes the caller's tenant id and filters by it; an id from another
//!   tenant finds nothing.
//! - [`reconcile`], the control loops' queries, across tenants by job id. Their writes carry the
//!   leader's fencing epoch (`control_fence`), so a deposed leader's are refused. Requests use
//!   only its reads: the scheduling board and "why pending" read the same snapshot the
//!   scheduler decides on (`app/scheduling.rs`).
//!
//! [`embedded`] runs a private Postgres cluster for `trainyard dev` and the tests.

#![deny(clippy::unwrap_used)]

pub mod audit;
pub mod chains;
pub mod datasets;
pub mod embedded;
pub mod experiments;
pub mod interactive;
pub mod jobs;
pub mod lineage;
pub mod members;
pub mod metrics;
pub mod nodes;
pub mod notifications;
pub mod reconcile;
pub mod records;
pub mod sessions;
pub mod sso;
pub mod storage;
pub mod templates;
pub mod tenancy;
pub mod tracking;
pub mod usage;

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};
use trainyard_core::Error;

/// The migrations in the workspace's top-level `migrations/` folder, embedded at build time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// A handle on the database. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    pool: PgPool,
    /// The leadership epoch this process holds (0: none), shared by every clone. Every write of
    /// the control loops (`reconcile`) is fenced by it in the database.
    control_epoch: std::sync::Arc<std::sync::atomic::AtomicI64>,
    /// The unfinished jobs last read, decoded, by row versions, shared by every clone (see
    /// [`Store::jobs_unfinished`]).
    unfinished_rows: std::sync::Arc<reconcile::RowCache>,
}

impl Store {
    /// Connects with a pool sized for `max_connections` and a short acquire timeout, so that an
    /// overloaded or absent database turns into a quick 503 rather than a hung request.
    ///
    /// Sessions run with `jit = off`: every query here is short, and Postgres's JIT compiles
    /// any whose estimated cost passes `jit_above_cost`, as the unfinished jobs' read does with
    /// the small `tenants` table not yet analysed (570 rows assumed): 67 ms of compiling for a
    /// 20 ms query, in every reconciler pass and every schedule read (issue 19).
    pub async fn connect(url: &str, max_connections: u32) -> Result<Store, sqlx::Error> {
        let options: PgConnectOptions =
            url.parse::<PgConnectOptions>()?.options([("jit", "off")]).disable_statement_logging();
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await?;
        Ok(Store::from_pool(pool))
    }

    pub fn from_pool(pool: PgPool) -> Store {
        Store { pool, control_epoch: Default::default(), unfinished_rows: Default::default() }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Begins a transaction, safely even when the caller is cancelled (a launch aborted when
    /// leadership is lost, a request whose client went away). Every transaction here begins
    /// through this, never with `Pool::begin`.
    ///
    /// sqlx 0.9.0's `Pool::begin` is not cancellation-safe on Postgres (transact-rs/sqlx#4393,
    /// fixed by #4394, not released yet): dropped while its `BEGIN` is on the wire, it counts
    /// no transaction, queues no `ROLLBACK`, and the pool takes the connection back inside an
    /// open transaction. Whoever gets it next writes into that transaction, which is never
    /// committed: the writes are lost and their row locks held until the connection closes.
    /// A chaos test hit it (a launch aborted by lost leadership; every later write to that
    /// job's row waited forever, and with it the control loops). Here the begin runs as a
    /// task of its own, which finishes even when its caller is gone: the transaction is then
    /// dropped counted, and its `ROLLBACK` goes out as the connection returns to the pool.
    pub async fn begin(&self) -> trainyard_core::Result<sqlx::Transaction<'static, sqlx::Postgres>> {
        let pool = self.pool.clone();
        #[allow(clippy::disallowed_methods)] // the one place it is used, made safe here
        tokio::spawn(async move { pool.begin().await }).await.map_err(Error::internal)?.map_err(db_error)
    }

    pub async fn migrate(&self) -> Result<(), sqlx::migrate::MigrateError> {
        MIGRATOR.run(&self.pool).await
    }

    /// True when the database answers a trivial query.
    pub async fn ping(&self) -> bool {
        sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// Maps a database error to the domain error. Named constraints become user errors in the
/// modules that know what they mean; what reaches here is either unavailability or a bug.
/// What `control_fence` raises when a control-loop write carries an epoch that no longer leads.
const FENCED_SQLSTATE: &str = "TYF01";

/// What the database raises for a write that would add to a tenant being removed.
const TENANT_REMOVED_SQLSTATE: &str = "TYR01";

pub(crate) fn db_error(err: sqlx::Error) -> Error {
    match err {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => {
            Error::Unavailable("the database is not answering; try again shortly".into())
        }
        sqlx::Error::Database(db) if db.code().as_deref() == Some(FENCED_SQLSTATE) => {
            Error::Fenced(db.message().to_string())
        }
        // Anything new for a tenant being removed (migration 18's triggers), whatever the path.
        sqlx::Error::Database(db) if db.code().as_deref() == Some(TENANT_REMOVED_SQLSTATE) => {
            Error::Conflict(db.message().to_string())
        }
        other => Error::internal(other),
    }
}

/// The name of the constraint a database error violated, if any.
pub(crate) fn violated_constraint(err: &sqlx::Error) -> Option<&str> {
    match err {
        sqlx::Error::Database(db) => db.constraint(),
        _ => None,
    }
}
