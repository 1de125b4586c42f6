//! `trainyard`: the control plane's binary.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tokio::net::TcpListener;
use trainyard_server::cmd::cluster::{self, ExecutorKind, KubeExecutorArgs};
use trainyard_server::cmd::dev::{self, DevOptions, LocalExecutorArgs};
use trainyard_server::control::reconciler::ReconcilerSettings;
use trainyard_server::oidc::{Oidc, OidcArgs};
use trainyard_server::storage::StorageArgs;
use trainyard_store::Store;
use trainyard_store::embedded::{Durability, EmbeddedPostgres};

#[derive(Parser)]
#[command(name = "trainyard", version, about = "The Trainyard control plane for shared deep-learning clusters")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// A Postgres URL that never shows its password in `Debug` output or logs.
#[derive(Clone)]
struct DatabaseUrl(String);

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.split_once('@') {
            Some((_, host)) => write!(f, "postgres://<redacted>@{host}"),
            None => f.write_str(&self.0),
        }
    }
}

/// Where the Postgres URL comes from: a file, or the environment; never a flag, which `ps`
/// shows to every user of the machine (the URL holds the password).
#[derive(clap::Args, Debug, Clone)]
struct DatabaseArgs {
    /// A file holding the Postgres URL (its first line); without it, the URL is read from
    /// TRAINYARD_DATABASE_URL.
    #[arg(long, env = "TRAINYARD_DATABASE_URL_FILE", value_name = "FILE")]
    database_url_file: Option<PathBuf>,
}

impl DatabaseArgs {
    fn url(&self) -> anyhow::Result<DatabaseUrl> {
        let url = match &self.database_url_file {
            Some(file) => std::fs::read_to_string(file)
                .with_context(|| format!("reading the database URL from {}", file.display()))?
                .lines()
                .next()
                .unwrap_or_default()
                .trim()
                .to_string(),
            None => std::env::var("TRAINYARD_DATABASE_URL").map_err(|_| {
                anyhow::anyhow!(
                    "no database: set TRAINYARD_DATABASE_URL, or --database-url-file FILE (never a flag: \
                     a URL on the command line shows its password to every user of the machine)"
                )
            })?,
        };
        anyhow::ensure!(!url.is_empty(), "the database URL is empty");
        Ok(DatabaseUrl(url))
    }
}

// Parsed once at start and moved into `run`: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Everything on this machine: a private Postgres in the data directory, the local executor,
    /// the API and dashboard on 127.0.0.1:8080. Prints the admin token on first start.
    Dev {
        #[arg(long, default_value = ".trainyard")]
        data_dir: PathBuf,
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        #[command(flatten)]
        local: LocalExecutorArgs,
        #[command(flatten)]
        storage: StorageArgs,
        #[command(flatten)]
        oidc: OidcArgs,
        /// Print a new token for the platform admin at start (when the first one is lost).
        #[arg(long)]
        new_admin_token: bool,
    },
    /// Production mode: Postgres by URL; applies pending migrations first.
    Serve {
        #[command(flatten)]
        database: DatabaseArgs,
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// Where the local executor keeps job folders and logs (the Kubernetes executor: the
        /// kept logs of ended attempts).
        #[arg(long, default_value = ".trainyard")]
        data_dir: PathBuf,
        /// Which backend runs the jobs: `local` processes, or `kubernetes` (in-cluster config or
        /// KUBECONFIG).
        #[arg(long, value_enum, default_value_t = ExecutorKind::Local)]
        executor: ExecutorKind,
        #[command(flatten)]
        local: LocalExecutorArgs,
        #[command(flatten)]
        kube: KubeExecutorArgs,
        #[command(flatten)]
        storage: StorageArgs,
        #[command(flatten)]
        oidc: OidcArgs,
        /// Database connections in the pool.
        #[arg(long, default_value_t = 16)]
        max_connections: u32,
        /// Seconds between SIGTERM and SIGKILL when stopping a job.
        #[arg(long, default_value_t = 10)]
        grace_seconds: u64,
        /// The API's URL as jobs reach it (their TRAINYARD_URL); the listening address by default.
        #[arg(long)]
        public_url: Option<String>,
        /// Milliseconds readers may share one computed answer to "why is my job pending, when
        /// will it start" (0: every request simulates afresh). This server's own changes make
        /// it recompute at once; another replica's show within this time.
        #[arg(long, default_value_t = 2000)]
        schedule_max_age_ms: u64,
        /// Seconds after which the leader answers 503 on /readyz when its control loop has not
        /// completed a pass (a stuck loop takes the server out of a load balancer's rotation).
        #[arg(long, default_value_t = 30)]
        ready_max_pass_age_seconds: u64,
        /// Seconds the control loops' leadership lease lasts unless renewed: a standby takes over
        /// within about this long after the leader dies, hangs or loses the database.
        #[arg(long, default_value_t = 3.0)]
        lease_seconds: f64,
        /// Milliseconds between the starts of two control-loop passes at the most: how long a
        /// change may wait when the loop is busy, and what bounds its cost under many submits.
        #[arg(long, default_value_t = 100)]
        min_pass_interval_ms: u64,
        /// Seconds a failed job waits before its first restart; each later restart waits twice as
        /// long, at most 5 minutes.
        #[arg(long, default_value_t = 10.0)]
        restart_backoff_seconds: f64,
        /// Launches in flight at once in one pass (each is a few requests to the executor, e.g.
        /// the Kubernetes API server): more start jobs faster, fewer spare a slow executor.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
        launch_concurrency: u16,
        /// Nodes may be added to the cluster (an autoscaler): queue a job larger than the cluster
        /// is today instead of refusing it at submit.
        #[arg(long)]
        cluster_grows: bool,
        /// Let notification webhooks go to loopback, private and link-local addresses (a
        /// receiver inside the cluster's network). Off by default: a tenant's subscription
        /// could otherwise reach services only the server can (cloud metadata, databases).
        #[arg(long)]
        notify_allow_private_addresses: bool,
        /// A file holding the bearer token Prometheus scrapes `/metrics` with. Without it (or
        /// when the file is missing) only platform admins' API tokens read the metrics.
        #[arg(long, env = "TRAINYARD_METRICS_TOKEN_FILE")]
        metrics_token_file: Option<PathBuf>,
        /// Read the built-in templates from this folder (one sub-folder per template, like the
        /// source tree's `templates/`) instead of those built into the binary: for developing
        /// templates without a rebuild.
        #[arg(long)]
        builtin_templates_dir: Option<PathBuf>,
    },
    /// Applies pending migrations and exits.
    Migrate {
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// On an empty database: creates the first tenant, a platform admin and its token (printed;
    /// it expires in 30 days like every admin token, and `admin-token` makes another).
    Bootstrap {
        #[command(flatten)]
        database: DatabaseArgs,
        #[arg(long, default_value = dev::DEFAULT_TENANT)]
        tenant: String,
        #[arg(long, default_value = dev::DEFAULT_ADMIN)]
        admin: String,
    },
    /// A new API token for a platform admin, printed once (30 days): the way back in when every
    /// admin token is lost. Needs the database, which is trusted with everything already.
    AdminToken {
        #[command(flatten)]
        database: DatabaseArgs,
        #[arg(long, default_value = dev::DEFAULT_ADMIN)]
        user: String,
        /// The token's name, as `yard tokens ls` shows it.
        #[arg(long, default_value = "recovery")]
        name: String,
    },
    /// Prints the OpenAPI document of the REST API.
    Openapi,
    /// Lists every route path the server serves (the authorization coverage test walks them).
    #[command(hide = true)]
    Routes,
    /// A private Postgres cluster in a directory, without the server (used by tests/run).
    Postgres {
        #[command(subcommand)]
        action: PostgresAction,
    },
    /// The shard cache of one Kubernetes node, shared by every job on it (run by the platform as
    /// a DaemonSet: deploy/kubernetes/cache-agent). Pods read dataset files from it
    /// (`--kube-cache-agent-url`); it asks the server, with each job's own token, whether the
    /// job may read a file, and fetches what the node lacks.
    CacheAgent {
        /// The node's cache folder.
        #[arg(long, env = "TRAINYARD_CACHE_AGENT_DIR", default_value = "/var/lib/trainyard/shard-cache")]
        dir: PathBuf,
        #[arg(long, env = "TRAINYARD_CACHE_AGENT_LISTEN", default_value = "0.0.0.0:8470")]
        listen: SocketAddr,
        /// The Trainyard server's URL as the agent reaches it.
        #[arg(long, env = "TRAINYARD_URL")]
        server: String,
        /// The most bytes the cache keeps of copies no job is reading (least recently used go
        /// first).
        #[arg(long, env = "TRAINYARD_CACHE_AGENT_BUDGET_BYTES")]
        budget_bytes: u64,
        /// The most one tenant's copies may take of the cache (its own least recently used go
        /// first), so that no tenant's data evicts all the others'. Default: no share of its own.
        #[arg(long, env = "TRAINYARD_CACHE_AGENT_TENANT_BUDGET_BYTES")]
        tenant_budget_bytes: Option<u64>,
    },
}

#[derive(Subcommand)]
enum PostgresAction {
    /// Starts (creating on first use) and prints the URL of its `postgres` database.
    Start {
        #[arg(long)]
        dir: PathBuf,
        /// No fsync: for throwaway test clusters.
        #[arg(long)]
        throwaway: bool,
    },
    Stop {
        #[arg(long)]
        dir: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,sqlx=warn,tower_http=warn".into()),
        )
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal, never into a log file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run(cli.command))
}

/// The metrics token from its file: none when no file is named or the file is absent (an
/// optional Secret not created), an error when it is there but empty or unreadable.
fn metrics_token(file: Option<&std::path::Path>) -> anyhow::Result<Option<String>> {
    let Some(file) = file else { return Ok(None) };
    match std::fs::read_to_string(file) {
        Ok(text) if text.trim().len() >= 16 => Ok(Some(text.trim().to_string())),
        Ok(_) => anyhow::bail!("the metrics token in {} must be at least 16 characters", file.display()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            tracing::warn!(file = %file.display(), "no metrics token file; only platform admins may read /metrics");
            Ok(None)
        }
        Err(err) => Err(anyhow::Error::new(err).context(format!("reading the metrics token {}", file.display()))),
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Dev { data_dir, listen, local, storage, oidc, new_admin_token } => {
            dev::run(DevOptions { data_dir, listen, local, storage, oidc, new_admin_token }).await
        }
        Command::Serve {
            database,
            listen,
            data_dir,
            executor,
            local,
            kube,
            storage,
            oidc,
            max_connections,
            grace_seconds,
            public_url,
            schedule_max_age_ms,
            ready_max_pass_age_seconds,
            lease_seconds,
            min_pass_interval_ms,
            restart_backoff_seconds,
            launch_concurrency,
            cluster_grows,
            notify_allow_private_addresses,
            metrics_token_file,
            builtin_templates_dir,
        } => {
            let store = Store::connect(&database.url()?.0, max_connections).await.context("connecting to Postgres")?;
            store.migrate().await.context("running migrations")?;
            std::fs::create_dir_all(&data_dir)?;
            let settings = ReconcilerSettings {
                grace: Duration::from_secs(grace_seconds),
                api_url: public_url,
                schedule_max_age: Duration::from_millis(schedule_max_age_ms),
                ready_max_pass_age: Duration::from_secs(ready_max_pass_age_seconds),
                lease: Duration::from_secs_f64(lease_seconds.clamp(0.5, 300.0)),
                min_pass_interval: Duration::from_millis(min_pass_interval_ms),
                restart_backoff: Duration::from_secs_f64(restart_backoff_seconds.clamp(0.0, 300.0)),
                launch_concurrency: usize::from(launch_concurrency),
                builtin_templates_dir,
                ..Default::default()
            };
            let data_dir = data_dir.canonicalize()?;
            let oidc = Oidc::from_args(&oidc)?;
            let server = match executor {
                ExecutorKind::Local => dev::local_server(store, &data_dir, &local, &storage, settings)?,
                ExecutorKind::Kubernetes => cluster::kube_server(store, &data_dir, &kube, &storage, settings).await?,
            }
            .with_oidc(oidc)
            .with_cluster_grows(cluster_grows)
            .with_notify_allow_private(notify_allow_private_addresses)
            .with_metrics_token(metrics_token(metrics_token_file.as_deref())?);
            let listener = TcpListener::bind(listen).await.with_context(|| format!("listening on {listen}"))?;
            // Tests and scripts read this line to find the port when listening on port 0.
            println!("trainyard: listening on http://{}", listener.local_addr()?);
            server.serve(listener, dev::shutdown_signal(), dev::DRAIN).await?;
            Ok(())
        }
        Command::Migrate { database } => {
            let store = Store::connect(&database.url()?.0, 2).await.context("connecting to Postgres")?;
            store.migrate().await.context("running migrations")?;
            println!("migrations applied");
            Ok(())
        }
        Command::Bootstrap { database, tenant, admin } => {
            let store = Store::connect(&database.url()?.0, 2).await.context("connecting to Postgres")?;
            store.migrate().await.context("running migrations")?;
            match store.bootstrap(&tenant, &admin).await? {
                Some(token) => println!("{}", token.token),
                None => anyhow::bail!("the database has users already; bootstrap is only for an empty one"),
            }
            Ok(())
        }
        Command::AdminToken { database, user, name } => {
            let store = Store::connect(&database.url()?.0, 2).await.context("connecting to Postgres")?;
            store.migrate().await.context("running migrations")?;
            println!("{}", store.admin_token_mint(&user, &name).await?.token);
            Ok(())
        }
        Command::Openapi => {
            print!("{}", trainyard_server::http::api::openapi_document());
            Ok(())
        }
        Command::Routes => {
            for path in trainyard_server::http::route_table().into_parts().1 {
                println!("{path}");
            }
            Ok(())
        }
        Command::Postgres { action: PostgresAction::Start { dir, throwaway } } => {
            let durability = if throwaway { Durability::Throwaway } else { Durability::Durable };
            let postgres = EmbeddedPostgres::start(&dir, durability).await?;
            println!("{}", postgres.url("postgres"));
            Ok(())
        }
        Command::Postgres { action: PostgresAction::Stop { dir } } => {
            EmbeddedPostgres::stop_in(&dir).await?;
            Ok(())
        }
        Command::CacheAgent { dir, listen, server, budget_bytes, tenant_budget_bytes } => {
            let agent = trainyard_server::cache_agent::Agent::new(trainyard_server::cache_agent::AgentConfig {
                dir,
                server,
                budget_bytes,
                tenant_budget_bytes,
            })?;
            let listener = TcpListener::bind(listen).await.with_context(|| format!("listening on {listen}"))?;
            println!("trainyard: cache agent listening on http://{}", listener.local_addr()?);
            axum::serve(listener, agent.router()).with_graceful_shutdown(dev::shutdown_signal()).await?;
            Ok(())
        }
    }
}
