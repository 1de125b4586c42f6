//! `trainyard dev`: the whole control plane on one machine, with nothing installed but Postgres's
//! binaries. A private cluster in the data directory, the local executor, the API on loopback.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use trainyard_executor::local::{LocalConfig, LocalExecutor};
use trainyard_store::Store;
use trainyard_store::embedded::{Durability, EmbeddedPostgres};
use trainyard_store::tenancy::ADMIN_TOKEN_DAYS;

use crate::Server;
use crate::control::reconciler::ReconcilerSettings;
use crate::storage::StorageArgs;

pub const DEFAULT_TENANT: &str = "default";
pub const DEFAULT_ADMIN: &str = "admin";
/// How long in-flight requests may take to finish at shutdown.
pub const DRAIN: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct DevOptions {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub local: LocalExecutorArgs,
    pub storage: StorageArgs,
    pub oidc: crate::oidc::OidcArgs,
    /// Print a new token for the platform admin at start (when the first one is lost).
    pub new_admin_token: bool,
}

/// Settings of the local executor, shared by `trainyard dev` and `trainyard serve`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LocalExecutorArgs {
    /// CPU cores offered to jobs (default: this machine's).
    #[arg(long)]
    pub cpus: Option<f64>,
    /// Offer this many simulated GPUs instead of the machine's, to try quotas and scheduling
    /// where there are none (replicas see indices in CUDA_VISIBLE_DEVICES but no device).
    #[arg(long)]
    pub simulate_gpus: Option<u32>,
    /// The type of the simulated GPUs.
    #[arg(long, default_value = "simulated-gpu")]
    pub simulate_gpu_type: String,
    /// The budget of this machine's shard cache (shared by every job here), in bytes: what the
    /// cache may hold before it evicts shards no job is reading. Default: a tenth of the data
    /// directory's file system, at least 1 GiB.
    #[arg(long, value_name = "BYTES")]
    pub shard_cache_bytes: Option<u64>,
    /// What one tenant's shards may take of this machine's shard cache, in bytes (evicting only
    /// that tenant's shards no job is reading). Default: no bound of its own.
    #[arg(long, value_name = "BYTES")]
    pub shard_cache_tenant_bytes: Option<u64>,
    /// Processes and threads one replica may have at once (its cgroup's pids.max), so that a
    /// fork bomb stops there (at least 16: the supervisor and a shell must start).
    #[arg(long, value_name = "N", default_value_t = trainyard_executor::local::DEFAULT_PIDS_LIMIT,
          value_parser = clap::value_parser!(u64).range(16..))]
    pub pids_limit: u64,
    /// Cap each replica's CPU time at its request (a CFS quota), as a Kubernetes limit equal to
    /// the request would. Without it the request is the replica's weight: a replica may use idle
    /// cores, and under contention each gets its share.
    #[arg(long)]
    pub cpu_hard_limit: bool,
    /// Do not confine replicas in cgroups (when something around the server, a container
    /// runtime, confines them): no memory, CPU or process limits of Trainyard's own, and a
    /// process a job leaves behind outlives it. /readyz says so.
    #[arg(long)]
    pub no_cgroups: bool,
    /// Do not give each replica a PID namespace and `/proc` of its own: replicas then see every
    /// process of the machine and their command lines (unless /proc is mounted with
    /// hidepid=invisible). /readyz says so.
    #[arg(long)]
    pub no_pid_namespace: bool,
}

/// The replicas' supervisor, `trainyard-shim`, which is built and installed beside `trainyard`.
fn supervisor_beside_this_binary() -> anyhow::Result<std::path::PathBuf> {
    let this = std::env::current_exe().context("finding the trainyard binary")?;
    let supervisor = this.with_file_name("trainyard-shim");
    anyhow::ensure!(
        supervisor.is_file(),
        "the local executor starts each replica under trainyard-shim, which is not beside {} \
         (cargo build --bins builds it; install it with trainyard)",
        this.display()
    );
    Ok(supervisor)
}

/// A server with the local executor, its job folders under `data_dir`.
pub fn local_server(
    store: Store,
    data_dir: &Path,
    local: &LocalExecutorArgs,
    storage: &StorageArgs,
    settings: ReconcilerSettings,
) -> anyhow::Result<Server> {
    let supervisor = supervisor_beside_this_binary()?;
    let executor = LocalExecutor::new(LocalConfig {
        data_dir: data_dir.to_path_buf(),
        supervisor,
        cpus: local.cpus,
        memory_bytes: None,
        simulated_gpus: local.simulate_gpus.map(|n| (n, local.simulate_gpu_type.clone())),
        shard_cache_bytes: local.shard_cache_bytes,
        shard_cache_tenant_bytes: local.shard_cache_tenant_bytes,
        pids_limit: local.pids_limit,
        cpu_hard_limit: local.cpu_hard_limit,
        cgroups: !local.no_cgroups,
        pid_namespace: !local.no_pid_namespace,
    })
    .with_context(|| format!("preparing the job folders under {}", data_dir.display()))?;
    let storage = storage.open(data_dir).context("opening the object store")?;
    Server::new(store, Arc::new(executor), storage, settings).map_err(anyhow::Error::msg)
}

pub async fn run(options: DevOptions) -> anyhow::Result<()> {
    std::fs::create_dir_all(&options.data_dir)
        .with_context(|| format!("creating the data directory {}", options.data_dir.display()))?;
    let data_dir = options.data_dir.canonicalize()?;
    eprintln!("trainyard: starting the private Postgres in {}", data_dir.join("postgres").display());
    let postgres = EmbeddedPostgres::start(&data_dir.join("postgres"), Durability::Durable)
        .await
        .context("starting the private Postgres")?;
    let result = serve_on(&postgres, &data_dir, &options).await;
    eprintln!("trainyard: stopping Postgres");
    postgres.stop().await.context("stopping the private Postgres")?;
    result
}

async fn serve_on(postgres: &EmbeddedPostgres, data_dir: &Path, options: &DevOptions) -> anyhow::Result<()> {
    postgres.database_ensure("trainyard").await?;
    let store = Store::connect(&postgres.url("trainyard"), 16).await.context("connecting to the private Postgres")?;
    store.migrate().await.context("running migrations")?;
    let first_token = store.bootstrap(DEFAULT_TENANT, DEFAULT_ADMIN).await?;
    let new_token = match (&first_token, options.new_admin_token) {
        (None, true) => Some(store.admin_token_mint(DEFAULT_ADMIN, "recovery").await?),
        _ => None,
    };
    let listener = TcpListener::bind(options.listen)
        .await
        .with_context(|| format!("listening on {} (is another trainyard running?)", options.listen))?;
    let url = format!("http://{}", listener.local_addr()?);
    let server =
        local_server(store.clone(), data_dir, &options.local, &options.storage, ReconcilerSettings::default())?
            .with_oidc(crate::oidc::Oidc::from_args(&options.oidc)?);
    if first_token.is_some() {
        // The default tenant starts with every GPU of this machine as its nominal quota.
        let mut by_type: std::collections::BTreeMap<String, u64> = Default::default();
        for gpu in server.state.app.inventory().gpus {
            *by_type.entry(gpu.gpu_type).or_default() += 1;
        }
        for (gpu_type, count) in by_type {
            let audit = trainyard_store::audit::Audit::local(
                "dev",
                "quota.set",
                format!("tenant:{DEFAULT_TENANT}/quota:{gpu_type}"),
            );
            store.quota_set(DEFAULT_TENANT, &gpu_type, count, None, None, &audit).await?;
        }
    }

    println!();
    println!("  Trainyard is running (local executor, data in {})", data_dir.display());
    println!("  dashboard:  {url}/");
    println!("  API:        {url}/api/v1  (document: {url}/api/v1/openapi.json)");
    match first_token {
        Some(token) => {
            println!("  admin token (shown once, keep it): {}", token.token);
            println!("  sign in:    yard login --url {url} --token {}", token.token);
            if let Some(expires) = token.expires_at {
                println!(
                    "  it expires: {} (then start with --new-admin-token for another)",
                    expires.format("%Y-%m-%d")
                );
            }
        }
        None => match new_token {
            Some(token) => {
                println!("  new admin token ({ADMIN_TOKEN_DAYS} days, shown once): {}", token.token);
                println!("  sign in:    yard login --url {url} --token {}", token.token);
            }
            None => println!(
                "  sign in with the admin token printed at the first start: yard login --url {url} --token <token>\n  \
                 (lost it? start with --new-admin-token for another)"
            ),
        },
    }
    println!("  stop:       Ctrl-C (jobs keep running and are picked up at the next start)");
    println!();
    server.serve(listener, shutdown_signal(), DRAIN).await?;
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
