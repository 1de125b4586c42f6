//! `yard`: the Trainyard command line. Tables for people, `-o json` for scripts; errors print
//! the server's message and exit non-zero.

mod accounting;
mod checkpoints;
mod client;
mod code;
mod config;
mod datasets;
mod experiments;
mod notify;
mod output;
mod record;
mod storage;
mod templates;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use futures::StreamExt;
use trainyard_core::api::{
    Dataset, DatasetRegister, Job, JobAttempt, JobEvent, JobMetrics, JobPage, Me, MemberAdd, MemberAdded,
    MemberRemoved, MemberToken, MemberTokenReissue, NodeDrain, NodeDrainRequest, QuotaReport, QuotaSet, RerunRequest,
    Schedule, TemplateRun, Tenant, TenantCreate, TenantPolicyUpdate, TokenCreate, TokenCreated, TokenInfo,
};
use trainyard_core::auth::Role;
use trainyard_core::job::{JobState, JobSubmission};
use trainyard_core::resources::{Cpu, Memory, Resources, human_memory};

use crate::client::{ApiFailure, Client};
use crate::config::Config;

#[derive(Parser)]
#[command(
    name = "yard",
    version,
    about = "Submit and watch jobs on a Trainyard cluster",
    after_help = "The server and token come from TRAINYARD_URL and TRAINYARD_TOKEN when set, else from \
                  `yard login` (saved under your config directory). Shell completions: `yard completions bash`."
)]
struct Cli {
    /// Output format: tables fit the terminal ($COLUMNS, else its width, else 80 columns when
    /// piped), one line a row, long values cut with …; `wide` shows every value whole; csv:
    /// `yard usage` only.
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Wide,
    Json,
    Csv,
}

#[derive(Subcommand)]
enum Command {
    /// Check a server URL and token and remember them.
    Login {
        /// The server, as `deploy/dev` printed it: http://127.0.0.1:8080.
        #[arg(long)]
        url: String,
        /// Your API token (tyd_...): printed by `deploy/dev` for the admin, or made on the
        /// dashboard's Tokens page or with `yard tokens create`. Without it, the token is read
        /// from standard input (`yard login --url URL < token-file`), which keeps it out of the
        /// process list and the shell's history.
        #[arg(long)]
        token: Option<String>,
    },
    /// Print a completion script for your shell: `yard completions bash > /etc/bash_completion.d/yard`,
    /// or `source <(yard completions bash)`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Who you are signed in as.
    Whoami,
    /// Submit a job: `yard submit --replicas 2 -- python train.py --lr 3e-4`.
    Submit(SubmitArgs),
    /// List and inspect jobs.
    Jobs {
        #[command(subcommand)]
        command: JobsCommand,
    },
    /// The waiting jobs you may see, in the order the scheduler considers them: position, why
    /// each waits and when it should start (platform admins see every tenant's).
    Queue,
    /// The nodes jobs run on: capacity, what unfinished jobs hold, what is free (like `sinfo`).
    Nodes,
    /// What differs between two or more runs (up to 8), by section: parameters, spec, template,
    /// code, data, environment packages, hardware, outcome, link; only the differences unless
    /// --all (ids and times then too).
    Diff {
        #[arg(num_args = 2..=8, required = true, value_name = "JOB")]
        jobs: Vec<String>,
        /// Also the fields that are the same (and ids and times).
        #[arg(long)]
        all: bool,
    },
    /// Where a job or dataset version came from and what came of it: upstream the dataset
    /// versions a job read, the jobs they were registered from and the job it reran; downstream
    /// the dataset versions registered from its output, its artefacts, its reruns and the jobs
    /// that read those datasets.
    Lineage {
        /// A job (id, short id or name) or a dataset version, NAME@VERSION.
        #[arg(value_name = "JOB|DATASET@VERSION")]
        of: String,
        /// Levels to walk each way (1 to 50).
        #[arg(long, default_value_t = trainyard_core::lineage::DEFAULT_DEPTH)]
        depth: u32,
    },
    /// Print a replica's log; `-f` follows it until the job ends, then says how it ended (on
    /// stderr; exit status 1 when it failed or was cancelled, as `yard wait`).
    Logs {
        id: String,
        #[arg(long, default_value_t = 0)]
        replica: u32,
        /// Attempt number (default: the latest).
        #[arg(long)]
        attempt: Option<i32>,
        #[arg(short, long)]
        follow: bool,
    },
    /// Cancel a job: its processes are stopped and it ends `cancelled`.
    Cancel { id: String },
    /// Wait for a job to end. Exits 0 only if it succeeded.
    Wait {
        id: String,
        /// Give up after this many seconds (exit 124).
        #[arg(long)]
        timeout: Option<u64>,
    },
    /// Run a job from a template: `yard run shell --set command='["echo","hi"]' --wait`.
    Run(RunArgs),
    /// Open a JupyterLab notebook: a job of your tenant, queued under its quota like any job.
    /// Waits until it runs (saying why while it waits), then prints the link to open it in a
    /// browser: once, within a minute (`yard notebook --link ID` makes another).
    Notebook(NotebookArgs),
    /// Run a job again exactly: the template it ran (by digest, even after an upgrade), its
    /// parameters, dataset versions and code; `--set` changes parameters. The new job links to
    /// the original (`rerun of` in `yard jobs show`). What Trainyard cannot pin (a file on the
    /// machine a parameter names, an image tag) is named and refused unless --accept-unpinned.
    Rerun {
        id: String,
        /// A parameter to change, key=value (repeatable); a value starting with '[' is a JSON list.
        #[arg(long = "set", short = 's', value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// Run it even though some of what it ran cannot be pinned (named when refused), as it
        /// is now; the new job lists what was accepted.
        #[arg(long)]
        accept_unpinned: bool,
        /// Say whether it would start now, or its queue position and estimated start; queue nothing.
        #[arg(long)]
        what_if: bool,
        /// Wait for the job to end; exit 0 only if it succeeded.
        #[arg(long)]
        wait: bool,
    },
    /// Browse, scaffold and publish task templates.
    Templates {
        #[command(subcommand)]
        command: TemplatesCommand,
    },
    /// Metrics a job's engine reported: a summary per series, or one series' points.
    Metrics {
        id: String,
        /// Only this series, point by point.
        #[arg(long)]
        name: Option<String>,
    },
    /// Your tenant's GPU quotas and usage: nominal, used, borrowed, lent.
    Quota,
    /// GPU- and CPU-hours held in a window, per tenant, user, GPU type or template:
    /// `yard usage --from 7d --by tenant,user -o csv`.
    Usage(accounting::UsageArgs),
    /// The dataset registry: named, immutable dataset versions.
    Datasets {
        #[command(subcommand)]
        command: DatasetsCommand,
    },
    /// A job's artefacts: list, download (signed link, progress bar), upload.
    Artifacts {
        #[command(subcommand)]
        command: storage::ArtifactsCommand,
    },
    /// A job's checkpoints: list, download (`JOB[:STEP]`, progress bar); fine-tune from one
    /// with `yard run pytorch-ddp --set init_from=JOB[:STEP]`.
    Checkpoints {
        #[command(subcommand)]
        command: checkpoints::CheckpointsCommand,
    },
    /// Hyperparameter searches whose trials are jobs: grid, random, successive halving.
    Experiment {
        #[command(subcommand)]
        command: experiments::ExperimentCommand,
    },
    /// The tenant's named volumes.
    Volumes {
        #[command(subcommand)]
        command: storage::VolumesCommand,
    },
    /// Your tenant's storage policy (retention, quota) and volume use; admins set it.
    Storage {
        #[command(subcommand)]
        command: storage::StorageCommand,
    },
    /// Webhooks when your jobs end, fail, are preempted or wait too long.
    Notify {
        #[command(subcommand)]
        command: notify::NotifyCommand,
    },
    /// Your API tokens.
    Tokens {
        #[command(subcommand)]
        command: TokensCommand,
    },
    /// The audit log, newest first: who changed what, or tried to (tenant admins see their
    /// tenant's, platform admins every tenant's).
    Audit(accounting::AuditArgs),
    /// Tenants and members (admins).
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
    },
}

#[derive(clap::Args)]
struct SubmitArgs {
    /// A name for the job (default: the program's name).
    #[arg(long)]
    name: Option<String>,
    /// How many replicas run together, all or none (each gets RANK and WORLD_SIZE).
    #[arg(long, default_value_t = 1)]
    replicas: u32,
    /// GPUs per replica.
    #[arg(long, default_value_t = 0)]
    gpus: u32,
    /// GPU type, e.g. nvidia-h100-80gb.
    #[arg(long)]
    gpu_type: Option<String>,
    /// CPU cores per replica (2, 0.5 or 500m).
    #[arg(long, default_value = "1")]
    cpu: String,
    /// Memory per replica (4Gi, 512Mi).
    #[arg(long, default_value = "1Gi")]
    memory: String,
    /// Higher runs first within your tenant (-1000 to 1000); a job that asks for GPUs may preempt
    /// lower priorities (quotas and preemption are about GPUs: a CPU-only job waits for room).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i32,
    /// Relaunches after a failed attempt.
    #[arg(long, default_value_t = 0)]
    max_restarts: u32,
    /// Stop the job when an attempt has run this long, without restarting it (like Slurm's
    /// --time); start estimates assume it takes this long: 90m, 2h, 1d 12h.
    #[arg(long, value_name = "DURATION", value_parser = parse_time_limit)]
    time: Option<u32>,
    /// Wait up to this long for room on a node whose cache holds the job's datasets before
    /// taking any node (at most 1h): 5m, 90s. Without it such nodes are only preferred.
    #[arg(long, value_name = "DURATION", value_parser = parse_cache_wait)]
    cache_wait: Option<u32>,
    /// Run on spare room only: GPUs no job within its quota waits for. Counts in no quota, starts
    /// after every other job, and is stopped first (then requeued, to resume from its
    /// checkpoint) when a job within its quota needs the room.
    #[arg(long)]
    spare: bool,
    /// Environment variables, KEY=VALUE (repeatable).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Start only after these jobs succeed (Slurm's afterok); cancelled if one fails.
    #[arg(long, value_name = "ID[,ID]", value_delimiter = ',')]
    after_ok: Vec<String>,
    /// Start only after these jobs end, however they end (afterany).
    #[arg(long, value_name = "ID[,ID]", value_delimiter = ',')]
    after_any: Vec<String>,
    /// Start only after these jobs fail (afternotok); cancelled if one succeeds.
    #[arg(long, value_name = "ID[,ID]", value_delimiter = ',')]
    after_failed: Vec<String>,
    /// A job array: FIRST-LAST[%MAX], e.g. 0-99%8 (the index in TRAINYARD_ARRAY_INDEX, at
    /// most MAX at once).
    #[arg(long, value_name = "FIRST-LAST[%MAX]")]
    array: Option<String>,
    /// Makes a retried submit return the first job instead of a second one.
    #[arg(long)]
    idempotency_key: Option<String>,
    /// Say whether it would start now, or its queue position and estimated start; submit nothing.
    /// Exit status: 0 it would start now, 3 it would wait, 1 it never could (or another error).
    #[arg(long)]
    what_if: bool,
    /// The folder whose files every replica starts in (packed as git would see it: .gitignore and
    /// .yardignore honoured; at most 32 MiB).
    #[arg(long, value_name = "DIR", default_value = ".")]
    code: std::path::PathBuf,
    /// Ship no code: replicas start in an empty folder (the program is on the image or the machine).
    #[arg(long, conflicts_with = "code")]
    no_code: bool,
    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

#[derive(clap::Args)]
struct RunArgs {
    /// NAME or NAME@VERSION (the newest version when absent).
    template: String,
    /// A parameter, key=value (repeatable); a value starting with '[' is a JSON list.
    #[arg(long = "set", short = 's', value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Parameters from a YAML file (--set wins over it).
    #[arg(short = 'f', long = "file", value_name = "PARAMS.yaml")]
    file: Option<std::path::PathBuf>,
    /// Show the exact spec the job would run; queue nothing.
    #[arg(long, conflicts_with = "what_if")]
    dry_run: bool,
    /// Say whether it would start now, or its queue position and estimated start; queue nothing.
    /// Exit status: 0 it would start now, 3 it would wait, 1 it never could (or another error).
    #[arg(long)]
    what_if: bool,
    /// Wait for the job to end; exit 0 only if it succeeded.
    #[arg(long)]
    wait: bool,
    /// A name for the job (default: the template's).
    #[arg(long)]
    name: Option<String>,
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i32,
    #[arg(long, default_value_t = 0)]
    max_restarts: u32,
    #[arg(long)]
    idempotency_key: Option<String>,
    /// Wait up to this long for room on a node whose cache holds the job's datasets before
    /// taking any node (at most 1h): 5m, 90s. Without it such nodes are only preferred.
    #[arg(long, value_name = "DURATION", value_parser = parse_cache_wait)]
    cache_wait: Option<u32>,
    /// Run on spare room only: GPUs no job within its quota waits for. Counts in no quota, starts
    /// after every other job, and is stopped first (then requeued, to resume from its
    /// checkpoint) when a job within its quota needs the room.
    #[arg(long)]
    spare: bool,
}

#[derive(Subcommand)]
enum TemplatesCommand {
    /// Built-in templates and your tenant's.
    Ls,
    /// One template: NAME or NAME@VERSION, its parameters with defaults and help.
    Show { template: String },
    /// Create a folder NAME with a template that validates, ready to edit.
    Init { name: String },
    /// Check a template folder and publish it for your tenant.
    Push { dir: std::path::PathBuf },
}

#[derive(Subcommand)]
enum JobsCommand {
    /// The tenant's jobs, newest first.
    Ls {
        /// Only jobs in this state (queued, running, succeeded, failed, ...).
        #[arg(long)]
        state: Option<String>,
        /// Only jobs with exactly this name.
        #[arg(long)]
        name: Option<String>,
        /// Only jobs whose name contains this text, ignoring case.
        #[arg(long)]
        search: Option<String>,
        /// Only jobs this user submitted.
        #[arg(long)]
        user: Option<String>,
        /// Only jobs from this template.
        #[arg(long)]
        template: Option<String>,
        /// How many jobs per page.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Continue from a previous page's cursor.
        #[arg(long)]
        cursor: Option<String>,
        /// Every tenant's jobs, with a TENANT column (platform admins).
        #[arg(long)]
        all_tenants: bool,
        /// Only this tenant's jobs (platform admins; implies --all-tenants).
        #[arg(long)]
        tenant: Option<String>,
    },
    /// One job: spec, attempts and state history.
    Show {
        id: String,
        /// Its run record instead: what exactly each attempt ran (template, parameters, spec
        /// hash, code, data, every package, hardware, seeds, Trainyard's version).
        #[arg(long)]
        record: bool,
    },
}

#[derive(Subcommand)]
enum DatasetsCommand {
    Ls,
    /// One version: NAME@VERSION.
    Show {
        dataset: String,
    },
    /// Upload a packed folder (data-pack's) to Trainyard's object store and register it as a
    /// new version: NAME takes the next whole-number version, NAME@VERSION that one. Jobs read it
    /// as store:NAME@VERSION.
    Push {
        /// NAME or NAME@VERSION.
        dataset: String,
        /// The packed folder (holding dataset.json).
        folder: std::path::PathBuf,
    },
    /// Register NAME@VERSION from a data-pack job (--from-job) or by description.
    Register {
        /// NAME@VERSION; a version, once registered, never changes.
        dataset: String,
        /// The data-pack job that wrote it: its location, size and content hash come from there.
        #[arg(long)]
        from_job: Option<uuid::Uuid>,
        /// Where it is (a path on shared storage, an object-store URL), when not from a job.
        #[arg(long)]
        uri: Option<String>,
        /// Its content hash (sha256:...), when not from a job.
        #[arg(long)]
        content_hash: Option<String>,
        /// Its format, when not from a job (data-pack writes trainyard-shards-v1).
        #[arg(long)]
        format: Option<String>,
    },
}

#[derive(Subcommand)]
enum TokensCommand {
    Ls,
    /// A new token (its secret is printed once).
    Create {
        name: String,
        /// Days until the token stops working (default: never).
        #[arg(long)]
        expires_in_days: Option<u32>,
        /// Another tenant you are a member of, for the token to act in (default: this token's).
        #[arg(long)]
        tenant: Option<String>,
    },
    Revoke {
        id: String,
    },
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Create a tenant (platform admins).
    TenantCreate { name: String },
    /// List tenants and whether any is being removed (platform admins).
    Tenants,
    /// Remove a tenant (platform admins): it takes nothing new, its tokens are revoked and its
    /// jobs cancelled at once; its namespace and volumes go once they have stopped. Its jobs,
    /// usage and audit entries are kept.
    TenantRemove {
        name: String,
        /// Wait until the removal has finished (its jobs stopped, its namespace gone).
        #[arg(long)]
        wait: bool,
    },
    /// Quotas (platform admins): `yard admin quota set TENANT FLAVOR --nominal N`.
    Quota {
        #[command(subcommand)]
        command: AdminQuotaCommand,
    },
    /// Tenant scheduling policy (platform admins): `yard admin tenant set TENANT --cohort C`.
    Tenant {
        #[command(subcommand)]
        command: AdminTenantCommand,
    },
    /// Add a user to a tenant with a role, and print their first token.
    MemberAdd {
        tenant: String,
        user: String,
        #[arg(long, value_parser = ["viewer", "member", "admin"], default_value = "member")]
        role: String,
    },
    /// A tenant's members (platform admins, and the tenant's admins): remove, reissue a token.
    Member {
        #[command(subcommand)]
        command: AdminMemberCommand,
    },
    /// Drain or undrain a node (platform admins): `yard admin node drain NODE --reason TEXT`.
    Node {
        #[command(subcommand)]
        command: AdminNodeCommand,
    },
}

#[derive(Subcommand)]
enum AdminMemberCommand {
    /// Remove a user from a tenant: their tokens for it are revoked at once; their jobs are kept
    /// (listed, left running) unless --cancel-jobs. The tenant's last admin cannot be removed.
    Rm {
        tenant: String,
        user: String,
        /// Also cancel their unfinished jobs in the tenant.
        #[arg(long)]
        cancel_jobs: bool,
    },
    /// A new token for a member who lost theirs, printed once, for you to hand over.
    Token {
        tenant: String,
        user: String,
        /// Revoke their other tokens in the tenant (the lost one's too).
        #[arg(long)]
        revoke_others: bool,
        /// The new token's label.
        #[arg(long, default_value = "reissued")]
        name: String,
        /// Days until it stops working (default: never).
        #[arg(long)]
        expires_in_days: Option<u32>,
    },
}

#[derive(Subcommand)]
enum AdminNodeCommand {
    /// No new jobs on NODE (as `yard nodes` names it) until undrained; its running jobs stay
    /// unless --preempt, which sends them back to the queue (no restart counted).
    Drain {
        node: String,
        /// Send its running jobs back to the queue now.
        #[arg(long)]
        preempt: bool,
        /// Why, shown in `yard nodes` and in the reason of jobs that wait for it.
        #[arg(long)]
        reason: Option<String>,
    },
    /// NODE takes new jobs again.
    Undrain { node: String },
}

#[derive(Subcommand)]
enum AdminQuotaCommand {
    /// Set a tenant's quota for one GPU type.
    Set {
        tenant: String,
        /// The GPU type, as nodes report it (e.g. nvidia-h100-80gb).
        flavor: String,
        /// GPUs the tenant is guaranteed, reclaimed from borrowers when it needs them.
        #[arg(long)]
        nominal: u64,
        /// How many more it may borrow from its cohort (default: no limit).
        #[arg(long)]
        borrow: Option<u64>,
        /// How many of its idle GPUs others may borrow (default: all).
        #[arg(long)]
        lend: Option<u64>,
        /// Set it even though no node has this GPU type yet (else a type the cluster lacks is
        /// refused: a typo would otherwise be a quota no job can use).
        #[arg(long)]
        allow_unknown: bool,
    },
}

#[derive(Subcommand)]
enum AdminTenantCommand {
    /// Put a tenant in a cohort, set its fair-share weight or preemption policy.
    Set {
        tenant: String,
        /// Cohort to join ("" to leave).
        #[arg(long)]
        cohort: Option<String>,
        #[arg(long)]
        weight: Option<f64>,
        /// Let its higher-priority jobs preempt its lower-priority ones.
        #[arg(long)]
        preempt_lower_priority: Option<bool>,
        /// Stop its notebook sessions after this many seconds without use (warned first); 0: never.
        #[arg(long, value_name = "SECONDS")]
        session_idle_timeout: Option<u32>,
    },
}

/// ": removed at ..." or ": being removed since ...", or nothing for a tenant in use.
fn tenant_removal(tenant: &Tenant) -> String {
    match (tenant.removed_at, tenant.removal_requested_at) {
        (Some(at), _) => format!(": removed at {}", at.format("%Y-%m-%d %H:%M:%S UTC")),
        (None, Some(at)) => {
            format!(": being removed since {} (its jobs are stopping)", at.format("%Y-%m-%d %H:%M:%S UTC"))
        }
        (None, None) => String::new(),
    }
}

/// `yard login`'s token from standard input: its first line, trimmed; a prompt first when a person
/// types it.
fn token_from_stdin() -> anyhow::Result<String> {
    use std::io::IsTerminal;
    if std::io::stdin().is_terminal() {
        eprint!("API token (tyd_...): ");
    }
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).context("reading the token from standard input")?;
    let token = line.trim().to_string();
    if token.is_empty() {
        anyhow::bail!("no token: give --token, or the token on standard input");
    }
    Ok(token)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        // The reader of our output went away (`yard jobs ls | head`): end quietly, as a filter
        // killed by SIGPIPE does.
        Err(err)
            if err.chain().any(|e| {
                e.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitCode::from(141)
        }
        Err(err) => {
            match err.downcast_ref::<ApiFailure>() {
                Some(failure) if failure.problems.len() > 1 => {
                    eprintln!("error: {} problems:", failure.problems.len());
                    for problem in &failure.problems {
                        eprintln!("  {}: {}", problem.field, problem.message);
                    }
                }
                Some(failure) => eprintln!("error: {}", failure.message),
                None => eprintln!("error: {err:#}"),
            }
            ExitCode::FAILURE
        }
    }
}

/// The exit status of a what-if that would wait: scripts tell "starts now" (0) from "waits" (3)
/// from "never" (1, the server's refusal) without reading the text.
const EXIT_WOULD_WAIT: u8 = 3;

/// Prints a what-if's answer; exits 0 when the job would start now, [`EXIT_WOULD_WAIT`] when not.
fn what_if_answer(out: Output, schedule: &Schedule) -> anyhow::Result<ExitCode> {
    output::print(out, schedule, output::schedule)?;
    Ok(if schedule.admitted_now { ExitCode::SUCCESS } else { ExitCode::from(EXIT_WOULD_WAIT) })
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    // `-o wide` is a table whose values are never cut: the one place that differs is `table()`.
    let out = match cli.output {
        Output::Wide => {
            output::WIDE.store(true, std::sync::atomic::Ordering::Relaxed);
            Output::Table
        }
        other => other,
    };
    if out == Output::Csv && !matches!(cli.command, Command::Usage(_)) {
        bail!("-o csv is for `yard usage`; this command prints a table, or JSON with -o json");
    }
    if let Command::Login { url, token } = &cli.command {
        let token = match token {
            Some(token) => token.clone(),
            None => token_from_stdin()?,
        };
        let config = Config { url: url.trim_end_matches('/').to_string(), token };
        let me: Me = Client::new(config.clone())?.get("/api/v1/me").await?;
        let path = config::save(&config)?;
        eprintln!(
            "Signed in to {} as {} in tenant {} ({}); saved to {}",
            config.url,
            me.user,
            me.tenant,
            me.role.as_str(),
            path.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    if let Command::Completions { shell } = &cli.command {
        let mut command = <Cli as clap::CommandFactory>::command();
        let mut script = Vec::new();
        clap_complete::generate(*shell, &mut command, "yard", &mut script);
        match std::io::stdout().write_all(&script) {
            // Piped into `head`: the reader had enough.
            Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => {}
            other => other?,
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Command::Templates { command: TemplatesCommand::Init { name } } = &cli.command {
        templates::init(name)?;
        eprintln!("created {name}/ (template.yaml, engine/main.py); publish it with `yard templates push {name}`");
        return Ok(ExitCode::SUCCESS);
    }
    let client = Client::new(config::load()?)?;
    match cli.command {
        Command::Login { .. } | Command::Completions { .. } => unreachable!("handled above"),
        Command::Whoami => {
            let me: Me = client.get("/api/v1/me").await?;
            output::print(out, &me, |me| {
                format!(
                    "{} in tenant {} ({}{})\n",
                    me.user,
                    me.tenant,
                    me.role.as_str(),
                    if me.platform_admin { ", platform admin" } else { "" }
                )
            })
        }
        Command::Submit(args) if args.what_if => {
            let after = after_of(&client, &args).await?;
            let submission = submission_of(args, after)?;
            let schedule: Schedule = client.post("/api/v1/jobs/what-if", &submission).await?;
            what_if_answer(out, &schedule)
        }
        Command::Submit(args) => {
            let ship = (!args.no_code).then(|| args.code.clone());
            let after = after_of(&client, &args).await?;
            let mut submission = submission_of(args, after)?;
            if let Some(dir) = ship {
                submission.code = Some(code_upload(&client, &dir).await?);
            }
            // Every submit is keyed, so that one sent again (after a 503) makes no second job.
            submission.idempotency_key.get_or_insert_with(templates::idempotency_key);
            let job: Job = client.post_idempotent("/api/v1/jobs", &submission).await?;
            output::print(out, &job, |job| format!("{}\n", job.id))
        }
        Command::Jobs {
            command: JobsCommand::Ls { state, name, search, user, template, limit, cursor, all_tenants, tenant },
        } => {
            let every_tenant = all_tenants || tenant.is_some();
            let mut query = vec![("limit", limit.to_string())];
            query.extend(every_tenant.then(|| ("all_tenants", "true".to_string())));
            query.extend(tenant.map(|v| ("tenant", v)));
            query.extend(state.map(|v| ("state", v)));
            query.extend(name.map(|v| ("name", v)));
            query.extend(search.map(|v| ("search", v)));
            query.extend(user.map(|v| ("user", v)));
            query.extend(template.map(|v| ("template", v)));
            query.extend(cursor.map(|v| ("cursor", v)));
            let query = serde_urlencoded::to_string(&query)?;
            let page: JobPage = client.get(&format!("/api/v1/jobs?{query}")).await?;
            output::print(out, &page, if every_tenant { output::jobs_table_every_tenant } else { output::jobs_table })
        }
        Command::Jobs { command: JobsCommand::Show { id, record: true } } => {
            let id = client.job_id(&id).await?;
            let records: trainyard_core::record::JobRunRecords =
                client.get(&format!("/api/v1/jobs/{id}/record")).await?;
            output::print(out, &records, record::render)
        }
        Command::Jobs { command: JobsCommand::Show { id, record: false } } => {
            let id = client.job_id(&id).await?;
            let job: Job = client.get(&format!("/api/v1/jobs/{id}")).await?;
            let attempts: Vec<JobAttempt> = client.get(&format!("/api/v1/jobs/{id}/attempts")).await?;
            let events: Vec<JobEvent> = client.get(&format!("/api/v1/jobs/{id}/events")).await?;
            let outputs: serde_json::Value = client.get(&format!("/api/v1/jobs/{id}/outputs")).await?;
            let schedule: Option<Schedule> = client.get(&format!("/api/v1/jobs/{id}/schedule")).await?;
            let reruns: JobPage = client.get(&format!("/api/v1/jobs?rerun_of={id}&limit=20")).await?;
            // A folder the server will not read (409) is said, not a failed command.
            let checkpoints: Option<trainyard_core::api::JobCheckpoints> =
                match client.get(&format!("/api/v1/jobs/{id}/checkpoints")).await {
                    Ok(list) => Some(list),
                    Err(err) if err.downcast_ref::<ApiFailure>().is_some_and(|f| f.status.as_u16() == 409) => {
                        eprintln!("yard: checkpoints: {err}");
                        None
                    }
                    Err(err) => return Err(err),
                };
            let detail = serde_json::json!({ "job": job, "attempts": attempts, "events": events, "outputs": outputs,
                "schedule": schedule, "reruns": reruns.items.iter().map(|j| j.id).collect::<Vec<_>>(),
                "checkpoints": checkpoints });
            output::print(out, &detail, |_| {
                let waiting = schedule.as_ref().map(output::schedule).unwrap_or_default();
                let reruns = output::reruns(&reruns.items);
                let checkpoints = checkpoints.as_ref().map(output::checkpoints_brief).unwrap_or_default();
                format!("{}{checkpoints}{reruns}{waiting}", output::job_detail(&job, &attempts, &events, &outputs))
            })
        }
        Command::Diff { jobs, all } => {
            let mut ids = Vec::new();
            for text in &jobs {
                ids.push(client.job_id(text).await?.to_string());
            }
            let query = serde_urlencoded::to_string([("jobs", ids.join(",")), ("all", all.to_string())])?;
            let comparison: trainyard_core::compare::Comparison =
                client.get(&format!("/api/v1/compare?{query}")).await?;
            output::print(out, &comparison, output::diff_table)
        }
        Command::Lineage { of, depth } => {
            let path = if of.contains('@') {
                let dataset = trainyard_core::names::DatasetRef::parse(&of).map_err(anyhow::Error::msg)?;
                format!("/api/v1/datasets/{}/{}/lineage", dataset.name(), dataset.version())
            } else {
                format!("/api/v1/jobs/{}/lineage", client.job_id(&of).await?)
            };
            let lineage: trainyard_core::lineage::Lineage = client.get(&format!("{path}?depth={depth}")).await?;
            output::print(out, &lineage, trainyard_core::lineage::Lineage::render)
        }
        Command::Nodes => {
            let nodes: trainyard_core::api::Nodes = client.get("/api/v1/nodes").await?;
            output::print(out, &nodes, output::nodes_table)
        }
        Command::Queue => {
            let queue: trainyard_core::api::Queue = client.get("/api/v1/queue").await?;
            output::print(out, &queue, output::queue_table)
        }
        Command::Logs { id, replica, attempt, follow } => {
            let mut query = vec![("replica", replica.to_string()), ("follow", follow.to_string())];
            query.extend(attempt.map(|a| ("attempt", a.to_string())));
            let query = serde_urlencoded::to_string(&query)?;
            let id = client.job_id(&id).await?;
            let response = client.get_stream(&format!("/api/v1/jobs/{id}/logs?{query}")).await?;
            let mut body = response.bytes_stream();
            let mut stdout = std::io::stdout().lock();
            while let Some(chunk) = body.next().await {
                stdout.write_all(&chunk.context("the log stream broke off")?)?;
                stdout.flush()?;
            }
            drop(stdout);
            if !follow {
                return Ok(ExitCode::SUCCESS);
            }
            logs_outcome(&client, id).await
        }
        Command::Cancel { id } => {
            let id = client.job_id(&id).await?;
            let job: Job = client.post(&format!("/api/v1/jobs/{id}/cancel"), &serde_json::json!({})).await?;
            output::print(out, &job, |job| {
                if job.state == JobState::Cancelled {
                    format!("{} cancelled\n", job.id)
                } else {
                    format!("{} is being stopped\n", job.id)
                }
            })
        }
        Command::Wait { id, timeout } => wait(&client, out, &id, timeout.map(Duration::from_secs)).await,
        Command::Notebook(args) => notebook(&client, out, args).await,
        Command::Rerun { id, set, accept_unpinned, what_if, wait: wait_for_it } => {
            let id = client.job_id(&id).await?;
            let request = RerunRequest { set: templates::params_of(None, &set)?, what_if, accept_unpinned };
            if what_if {
                let schedule: Schedule = client.post(&format!("/api/v1/jobs/{id}/rerun"), &request).await?;
                return what_if_answer(out, &schedule);
            }
            let job: Job = client.post(&format!("/api/v1/jobs/{id}/rerun"), &request).await?;
            for input in &job.rerun_unpinned {
                eprintln!("accepted unpinned: {input}");
            }
            if wait_for_it {
                eprintln!("submitted {} (rerun of {id})", job.id);
                return wait(&client, out, &job.id.to_string(), None).await;
            }
            output::print(out, &job, |job| format!("{}\n", job.id))
        }
        Command::Run(args) => {
            let params = templates::params_of(args.file.as_deref(), &args.set)?;
            let (_, version) = templates::split_reference(&args.template);
            let run = TemplateRun {
                version: version.map(str::to_string),
                params,
                name: args.name,
                priority: args.priority,
                max_restarts: args.max_restarts,
                idempotency_key: args.idempotency_key,
                cache_wait_seconds: args.cache_wait,
                spare: args.spare,
            };
            if args.what_if {
                let schedule = templates::what_if(&client, &args.template, &run).await?;
                return what_if_answer(out, &schedule);
            }
            match templates::run(&client, &args.template, &run, args.dry_run).await? {
                templates::RunResult::DryRun(dry) => {
                    std::io::stdout().write_all(format!("{}\n", serde_json::to_string_pretty(&dry)?).as_bytes())?;
                    Ok(ExitCode::SUCCESS)
                }
                templates::RunResult::Job(job) if args.wait => {
                    eprintln!("submitted {}", job.id);
                    wait(&client, out, &job.id.to_string(), None).await
                }
                templates::RunResult::Job(job) => output::print(out, &job, |job| format!("{}\n", job.id)),
            }
        }
        Command::Templates { command: TemplatesCommand::Ls } => {
            let list = templates::list(&client).await?;
            output::print(out, &list, output::templates_table)
        }
        Command::Templates { command: TemplatesCommand::Show { template } } => {
            let detail = templates::show(&client, &template).await?;
            output::print(out, &detail, output::template_detail)
        }
        Command::Templates { command: TemplatesCommand::Init { .. } } => unreachable!("handled before signing in"),
        Command::Templates { command: TemplatesCommand::Push { dir } } => {
            let detail = templates::push(&client, &dir).await?;
            output::print(out, &detail, |d| format!("published {}@{} ({})\n", d.name, d.version, d.digest))
        }
        Command::Metrics { id, name } => {
            let id = client.job_id(&id).await?;
            let mut path = format!("/api/v1/jobs/{id}/metrics");
            if let Some(name) = &name {
                path.push('?');
                path.push_str(&serde_urlencoded::to_string([("name", name)])?);
            }
            let metrics: JobMetrics = client.get(&path).await?;
            output::print(out, &metrics, |m| output::metrics(m, name.is_some()))
        }
        Command::Datasets { command: DatasetsCommand::Ls } => {
            let list: Vec<Dataset> = client.get("/api/v1/datasets").await?;
            output::print(out, &list, |list| output::datasets_table(list))
        }
        Command::Datasets { command: DatasetsCommand::Show { dataset } } => {
            let (name, version) = split_dataset(&dataset)?;
            let d: Dataset = client.get(&format!("/api/v1/datasets/{name}/{version}")).await?;
            output::print(out, &d, output::dataset_detail)
        }
        Command::Datasets { command: DatasetsCommand::Push { dataset, folder } } => {
            datasets::push(&client, out, &dataset, &folder).await
        }
        Command::Datasets { command: DatasetsCommand::Register { dataset, from_job, uri, content_hash, format } } => {
            let (name, version) = split_dataset(&dataset)?;
            let body = DatasetRegister {
                name: name.into(),
                version: version.into(),
                from_job,
                uri,
                format,
                content_hash,
                size_bytes: None,
                samples: None,
                from_store: None,
            };
            let d: Dataset = client.post("/api/v1/datasets", &body).await?;
            output::print(out, &d, |d| format!("registered {}@{} ({})\n", d.name, d.version, d.content_hash))
        }
        Command::Artifacts { command } => storage::artifacts(&client, out, command).await,
        Command::Checkpoints { command } => checkpoints::checkpoints(&client, out, command).await,
        Command::Volumes { command } => storage::volumes(&client, out, command).await,
        Command::Experiment { command } => experiments::experiment(&client, out, command).await,
        Command::Storage { command } => storage::storage(&client, out, command).await,
        Command::Notify { command } => notify::notify(&client, out, command).await,
        Command::Quota => {
            let report: QuotaReport = client.get("/api/v1/quota").await?;
            // Without any quota, the nodes say what is true instead: no GPUs here, or which.
            let nodes: Option<trainyard_core::api::Nodes> = match out {
                Output::Table if report.flavors.is_empty() => Some(client.get("/api/v1/nodes").await?),
                _ => None,
            };
            output::print(out, &report, |r| output::quota(r, nodes.as_ref()))
        }
        Command::Usage(args) => accounting::usage(&client, out, args).await,
        Command::Audit(args) => accounting::audit(&client, out, args).await,
        Command::Admin {
            command:
                AdminCommand::Quota {
                    command: AdminQuotaCommand::Set { tenant, flavor, nominal, borrow, lend, allow_unknown },
                },
        } => {
            let body = QuotaSet { nominal, borrowing_limit: borrow, lending_limit: lend, allow_unknown };
            let set: trainyard_core::api::QuotaSetResult =
                client.put_json(&format!("/api/v1/admin/tenants/{tenant}/quotas/{flavor}"), &body).await?;
            eprintln!("quota of {tenant} for {flavor}: nominal {nominal}");
            for warning in set.warnings {
                eprintln!("warning: {warning}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Admin {
            command:
                AdminCommand::Tenant {
                    command:
                        AdminTenantCommand::Set { tenant, cohort, weight, preempt_lower_priority, session_idle_timeout },
                },
        } => {
            let body = TenantPolicyUpdate {
                cohort,
                weight,
                preempt_lower_priority,
                session_idle_timeout_seconds: session_idle_timeout,
            };
            client.patch(&format!("/api/v1/admin/tenants/{tenant}"), &body).await?;
            eprintln!("updated {tenant}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Tokens { command: TokensCommand::Ls } => {
            let tokens: Vec<TokenInfo> = client.get("/api/v1/tokens").await?;
            output::print(out, &tokens, output::tokens_table)
        }
        Command::Tokens { command: TokensCommand::Create { name, expires_in_days, tenant } } => {
            let token: TokenCreated =
                client.post("/api/v1/tokens", &TokenCreate { name, expires_in_days, tenant }).await?;
            output::print(out, &token, |t| format!("{}\n", t.token))
        }
        Command::Tokens { command: TokensCommand::Revoke { id } } => {
            client.delete(&format!("/api/v1/tokens/{id}")).await?;
            eprintln!("revoked {id}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Admin { command: AdminCommand::TenantCreate { name } } => {
            let tenant: Tenant = client.post("/api/v1/admin/tenants", &TenantCreate { name }).await?;
            output::print(out, &tenant, |t| format!("created tenant {}\n", t.name))
        }
        Command::Admin { command: AdminCommand::Tenants } => {
            let tenants: Vec<Tenant> = client.get("/api/v1/admin/tenants").await?;
            output::print(out, &tenants, |ts| ts.iter().map(|t| format!("{}{}\n", t.name, tenant_removal(t))).collect())
        }
        Command::Admin { command: AdminCommand::TenantRemove { name, wait } } => {
            let mut tenant: Tenant = client.delete_json(&format!("/api/v1/admin/tenants/{name}")).await?;
            if wait {
                let spinner = indicatif::ProgressBar::new_spinner();
                spinner.enable_steady_tick(Duration::from_millis(120));
                spinner.set_message(format!("removing tenant {name}: waiting for its jobs to stop"));
                while tenant.removed_at.is_none() {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    let tenants: Vec<Tenant> = client.get("/api/v1/admin/tenants").await?;
                    tenant = tenants.into_iter().find(|t| t.name == name).context("the tenant vanished")?;
                }
                spinner.finish_and_clear();
            }
            output::print(out, &tenant, |t| format!("tenant {}{}\n", t.name, tenant_removal(t)))
        }
        Command::Admin {
            command: AdminCommand::Member { command: AdminMemberCommand::Rm { tenant, user, cancel_jobs } },
        } => {
            let path = format!("/api/v1/admin/tenants/{tenant}/members/{user}?cancel_jobs={cancel_jobs}");
            let removed: MemberRemoved = client.delete_json(&path).await?;
            output::print(out, &removed, |r| {
                format!(
                    "removed {} from {}: {} revoked, {} cancelled\n",
                    r.user,
                    r.tenant,
                    counted(r.tokens_revoked, "token"),
                    counted(r.jobs_cancelled, "job")
                )
            })
        }
        Command::Admin {
            command:
                AdminCommand::Member {
                    command: AdminMemberCommand::Token { tenant, user, revoke_others, name, expires_in_days },
                },
        } => {
            let body = MemberTokenReissue { name: Some(name), expires_in_days, revoke_others };
            let path = format!("/api/v1/admin/tenants/{tenant}/members/{user}/tokens");
            let reissued: MemberToken = client.post(&path, &body).await?;
            if revoke_others {
                eprintln!("revoked {} of {user} in {tenant}", counted(reissued.tokens_revoked, "other token"));
            }
            // The secret on standard output alone, once, as `member-add` prints an invitation's.
            output::print(out, &reissued, |r| format!("{}\n", r.token.token))
        }
        Command::Admin {
            command: AdminCommand::Node { command: AdminNodeCommand::Drain { node, preempt, reason } },
        } => {
            let drain: NodeDrain = client
                .put_json(&format!("/api/v1/admin/nodes/{node}/drain"), &NodeDrainRequest { reason, preempt })
                .await?;
            output::print(out, &drain, |d| {
                let preempted = if preempt {
                    format!("; {} sent back to the queue", counted(d.jobs_preempted, "job"))
                } else {
                    String::new()
                };
                format!("drained {}: no new jobs there{preempted}\n", d.node)
            })
        }
        Command::Admin { command: AdminCommand::Node { command: AdminNodeCommand::Undrain { node } } } => {
            let drain: NodeDrain = client.delete_json(&format!("/api/v1/admin/nodes/{node}/drain")).await?;
            output::print(out, &drain, |d| format!("undrained {}: it takes new jobs again\n", d.node))
        }
        Command::Admin { command: AdminCommand::MemberAdd { tenant, user, role } } => {
            let role = Role::parse(&role).expect("clap checked the role");
            let body = MemberAdd { user, role, token_name: "default".into(), expires_in_days: None };
            let added: MemberAdded = client.post(&format!("/api/v1/admin/tenants/{tenant}/members"), &body).await?;
            output::print(out, &added, |a| match &a.token {
                Some(token) => format!("{}\n", token.token),
                None => format!(
                    "{} already has an account and is now {} in {}; they create their own token with \
                     `yard tokens create NAME --tenant {}`\n",
                    a.user,
                    a.role.as_str(),
                    a.tenant,
                    a.tenant
                ),
            })
        }
    }
}

/// "1 token", "3 tokens".
fn counted(n: u64, noun: &str) -> String {
    if n == 1 { format!("1 {noun}") } else { format!("{n} {noun}s") }
}

/// `NAME@VERSION`.
fn split_dataset(text: &str) -> anyhow::Result<(&str, &str)> {
    text.split_once('@').ok_or_else(|| anyhow::anyhow!("{text:?}: name a dataset as NAME@VERSION"))
}

/// The jobs `--after-ok`, `--after-any`, `--after-failed` name (ids or short ids), resolved.
async fn after_of(client: &Client, args: &SubmitArgs) -> anyhow::Result<[Vec<uuid::Uuid>; 3]> {
    let mut resolved: [Vec<uuid::Uuid>; 3] = Default::default();
    for (list, into) in [&args.after_ok, &args.after_any, &args.after_failed].into_iter().zip(resolved.iter_mut()) {
        for text in list {
            into.push(client.job_id(text).await?);
        }
    }
    Ok(resolved)
}

fn submission_of(args: SubmitArgs, after: [Vec<uuid::Uuid>; 3]) -> anyhow::Result<JobSubmission> {
    let [after_ok, after_any, after_failed] = after;
    let mut env = BTreeMap::new();
    for pair in &args.env {
        let Some((key, value)) = pair.split_once('=') else {
            bail!("--env {pair:?}: expected KEY=VALUE");
        };
        env.insert(key.to_string(), value.to_string());
    }
    let cpu = Cpu::parse(&args.cpu).map_err(|e| anyhow::anyhow!("--cpu: {e}"))?;
    let memory = Memory::parse(&args.memory).map_err(|e| anyhow::anyhow!("--memory: {e}"))?;
    Ok(JobSubmission {
        name: args.name,
        command: args.command,
        args: Vec::new(),
        env,
        resources: Resources { cpu, memory, gpus: args.gpus, gpu_type: args.gpu_type },
        replicas: args.replicas,
        priority: args.priority,
        max_restarts: args.max_restarts,
        idempotency_key: args.idempotency_key,
        code: None,
        time_limit_seconds: args.time,
        cache_wait_seconds: args.cache_wait,
        spare: args.spare,
        after_ok,
        after_any,
        after_failed,
        array: args.array,
    })
}

/// `--cache-wait`: a duration as people write it, at most an hour.
fn parse_cache_wait(text: &str) -> Result<u32, String> {
    let duration = humantime::parse_duration(text).map_err(|err| format!("{err}; for example 5m or 90s"))?;
    let seconds = duration.as_secs();
    if seconds > u64::from(trainyard_core::job::MAX_CACHE_WAIT_SECONDS) {
        return Err("must be at most an hour".into());
    }
    Ok(seconds as u32)
}

/// `--time`: a duration as people write it (90m, 2h, 1d 12h), in whole seconds.
fn parse_time_limit(text: &str) -> Result<u32, String> {
    let duration = humantime::parse_duration(text).map_err(|err| format!("{err}; for example 90m, 2h or 1d 12h"))?;
    let seconds = duration.as_secs();
    if seconds == 0 || seconds > u64::from(trainyard_core::job::MAX_TIME_LIMIT_SECONDS) {
        return Err("must be at least a second and at most 30 days".into());
    }
    Ok(seconds as u32)
}

/// Packs `dir`, uploads it (once per content: the server keeps it by digest) and returns its
/// digest, saying on stderr what was shipped.
async fn code_upload(client: &Client, dir: &std::path::Path) -> anyhow::Result<String> {
    let mut packed = code::pack(dir)?;
    let size = packed.archive.len() as u64;
    let body = reqwest::Body::from(std::mem::take(&mut packed.archive));
    let uploaded: trainyard_core::api::CodeUploaded =
        client.put_body(&format!("/api/v1/code/{}", packed.digest), body, size).await?;
    let shown = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    eprintln!(
        "code: {} files, {} from {} ({}); --no-code ships none",
        packed.files,
        human_memory(uploaded.size_bytes),
        shown.display(),
        &uploaded.digest[..19]
    );
    for skipped in &packed.skipped {
        eprintln!("code: left out {skipped} (only plain files are shipped)");
    }
    Ok(uploaded.digest)
}

/// Polls the job with a spinner until it ends.
/// After `yard logs -f`: how the job came out, on stderr (the log itself is stdout), and as the
/// exit status, as `yard wait` gives it: 0 when it succeeded, 1 when it failed or was cancelled.
/// The log ends with its replica; the job's end is recorded by the next pass, so it is waited
/// for a few seconds.
async fn logs_outcome(client: &Client, id: uuid::Uuid) -> anyhow::Result<ExitCode> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let job = loop {
        let job: Job = client.get(&format!("/api/v1/jobs/{id}")).await?;
        let still = matches!(job.state, JobState::Starting | JobState::Running);
        if !still || std::time::Instant::now() >= deadline {
            break job;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let reason = job.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
    eprintln!("== job {} {}{reason}", job.id, job.state);
    Ok(match job.state {
        JobState::Failed | JobState::Cancelled => ExitCode::FAILURE,
        _ => ExitCode::SUCCESS,
    })
}

#[derive(clap::Args)]
struct NotebookArgs {
    /// GPUs for the notebook.
    #[arg(long)]
    gpus: Option<u32>,
    /// The GPU type, e.g. nvidia-h100-80gb; any when not given.
    #[arg(long)]
    gpu_type: Option<String>,
    /// The Python that has jupyterlab, as the replica runs it (a path such as /opt/venv/bin/python).
    #[arg(long)]
    python: Option<String>,
    #[arg(long)]
    cpu: Option<f64>,
    /// Memory, e.g. 8Gi.
    #[arg(long)]
    memory: Option<String>,
    /// A new link to the notebook session ID (yours), instead of opening another.
    #[arg(long, value_name = "ID")]
    link: Option<String>,
    /// Give up waiting for it to run after this many seconds (exit 124; it stays queued).
    #[arg(long)]
    timeout: Option<u64>,
}

/// `yard notebook`: opens a session (or takes `--link`'s), waits until it runs, prints its link.
async fn notebook(client: &Client, out: Output, args: NotebookArgs) -> anyhow::Result<ExitCode> {
    use trainyard_core::api::{Session, SessionCreate, SessionLink};
    let id = match &args.link {
        Some(id) => client.job_id(id).await?,
        None => {
            let create = SessionCreate {
                kind: "notebook".into(),
                python: args.python,
                gpus: args.gpus,
                gpu_type: args.gpu_type,
                cpu: args.cpu,
                memory: args.memory,
            };
            let session: Session = client.post("/api/v1/sessions", &create).await?;
            eprintln!("opened notebook session {} ({})", session.id, session.state);
            session.id
        }
    };
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.enable_steady_tick(Duration::from_millis(120));
    let started = std::time::Instant::now();
    loop {
        let job: Job = client.get(&format!("/api/v1/jobs/{id}")).await?;
        if job.state == JobState::Running {
            break;
        }
        if job.state.is_terminal() {
            spinner.finish_and_clear();
            let reason = job.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default();
            eprintln!("the notebook session {id} ended {}{reason}; see yard logs {id}", job.state);
            return Ok(ExitCode::FAILURE);
        }
        let reason = job.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
        spinner.set_message(format!("notebook {}{reason} ({}s)", job.state, started.elapsed().as_secs()));
        if args.timeout.is_some_and(|t| started.elapsed() >= Duration::from_secs(t)) {
            spinner.finish_and_clear();
            eprintln!("gave up waiting: {id} is still {}{reason}; yard notebook --link {id} once it runs", job.state);
            return Ok(ExitCode::from(124));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    spinner.finish_and_clear();
    let link: SessionLink = client.post(&format!("/api/v1/sessions/{id}/link"), &serde_json::json!({})).await?;
    eprintln!("running; open this link within a minute (it works once; yard notebook --link {id} for another):");
    output::print(out, &link, |link| format!("{}\n", link.url))
}

async fn wait(client: &Client, out: Output, id: &str, timeout: Option<Duration>) -> anyhow::Result<ExitCode> {
    let spinner = indicatif::ProgressBar::new_spinner();
    spinner.enable_steady_tick(Duration::from_millis(120));
    let started = std::time::Instant::now();
    let id = client.job_id(id).await?;
    let job = loop {
        let job: Job = client.get(&format!("/api/v1/jobs/{id}")).await?;
        if job.state.is_terminal() {
            break job;
        }
        let reason = job.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
        spinner.set_message(format!("{} {}{reason} ({}s)", job.name, job.state, started.elapsed().as_secs()));
        if timeout.is_some_and(|t| started.elapsed() >= t) {
            spinner.finish_and_clear();
            eprintln!("gave up waiting: {} is still {}", job.id, job.state);
            return Ok(ExitCode::from(124));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    spinner.finish_and_clear();
    output::print(out, &job, |job| {
        let reason = job.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default();
        format!("{} {}{reason}\n", job.id, job.state)
    })?;
    Ok(if job.state == JobState::Succeeded { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
