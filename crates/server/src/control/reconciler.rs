//! The control loop: compares intent (jobs in Postgres) with what the executor observes, and
//! moves each job along its state machine. Level-triggered and idempotent: every pass looks at
//! the whole picture again, so a pass after a crash of the server does the right thing with no
//! memory of the last one. That is how running jobs are re-adopted after a restart, and how a
//! job whose processes vanished meanwhile is found and marked `lost`.
//!
//! One pass:
//! 1. observe every launched attempt and record what ended (succeeded, failed, restarting,
//!    cancelled, lost); stop the attempts of cancelled jobs and the rest of a failed gang;
//! 2. admission: ask the scheduler which queued jobs fit, admit them, and keep each waiting
//!    job's reason current;
//! 3. hand admitted and due restarting jobs to the launcher, which launches them beside the
//!    passes, up to `launch_concurrency` at once (see [`crate::control::launcher`]); a job whose
//!    launch is under way is left alone by the passes until it ends.

use std::collections::{HashMap, HashSet};

// Maps over a pass's thousands of jobs hash with FxHash (the keys are the server's own ids).
use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use trainyard_core::Result;
use trainyard_core::job::JobState;
use trainyard_executor::{AttemptRef, Executor, ReplicaDetail, ReplicaPhase, ReplicaStatus};
use trainyard_scheduler::{PreemptionKind, admission_cycle};
use trainyard_store::Store;
use trainyard_store::audit::Audit;
use trainyard_store::reconcile::{
    Admission, AttemptEnd, Leadership, Started, TenantPolicyRow, Unfinished, UnfinishedJob, UnhandledJob, Victim,
};

use crate::control::launcher::{Launch, LaunchContext, Launcher};
use crate::control::outcome::{
    EndCause, Failure, JobFacts, REASON_LOST, Verdict, attempt_verdict, deterministic_failure, exit_description,
    restart_delay, shell_hint,
};
use crate::monitoring::{Monitoring, TenantGpu, TenantReason};
use crate::scheduling::health::{LoopHealth, panic_message};
use crate::scheduling::snapshot::{LOCAL_NODE, ceiling_of, running_unreadable, snapshot_now};
use crate::templates::Templates;
use uuid::Uuid;

pub(crate) const ACTOR_EXECUTOR: &str = "executor";
pub(crate) const ACTOR_RECONCILER: &str = "reconciler";

/// Which of this server's own launches [`Reconciler::attempts_live`] counts beside the snapshot.
#[derive(Debug, Clone, Copy)]
enum LaunchesCounted {
    InFlight,
    InFlightAndFinished,
}

/// How often the executor is asked to remove leftovers of attempts that are not live.
const GARBAGE_COLLECT_EVERY: Duration = Duration::from_secs(60);
/// How often the quotas behind the quota gauges are read again.
const QUOTA_GAUGES_EVERY: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct ReconcilerSettings {
    /// The longest wait between passes when nothing wakes the loop.
    pub tick: Duration,
    /// Between SIGTERM and SIGKILL when stopping replicas.
    pub grace: Duration,
    /// The API's URL as replicas reach it (`TRAINYARD_URL`); the listening address when unset.
    pub api_url: Option<String>,
    /// How long readers share one answer to "why pending, when" (see [`crate::scheduling::board`]).
    pub schedule_max_age: Duration,
    /// The leader is unready (`/readyz` answers 503) when its loop completed no pass for this long.
    pub ready_max_pass_age: Duration,
    /// Fault injection for tests (`TRAINYARD_FAULT_PANIC_ON_LAUNCH`): launching a job whose
    /// argv holds exactly this string panics, as a bug in one job's handling would.
    pub fault_panic_on_launch: Option<String>,
    /// How long the leader's lease lasts unless renewed (every quarter of it): a standby takes
    /// over within about this long (plus one tick) after the leader dies or hangs.
    pub lease: Duration,
    /// The shortest time between the starts of two passes: the most a change waits to be acted
    /// on when the loop is busy, and what bounds the loop's cost under a stream of submits.
    pub min_pass_interval: Duration,
    /// The wait before a failed job's first restart; each later one waits twice as long (see
    /// [`restart_delay`]).
    pub restart_backoff: Duration,
    /// Launches in flight at once (they run beside the passes, see [`crate::control::launcher`]).
    pub launch_concurrency: usize,
    /// Where the built-in templates are read from; `None`: those built into the binary.
    pub builtin_templates_dir: Option<std::path::PathBuf>,
}

impl Default for ReconcilerSettings {
    fn default() -> Self {
        ReconcilerSettings {
            tick: Duration::from_secs(1),
            grace: Duration::from_secs(10),
            api_url: None,
            schedule_max_age: crate::scheduling::board::DEFAULT_MAX_AGE,
            ready_max_pass_age: Duration::from_secs(30),
            lease: Duration::from_secs(3),
            min_pass_interval: Duration::from_millis(100),
            restart_backoff: Duration::from_secs(10),
            launch_concurrency: 8,
            builtin_templates_dir: None,
            fault_panic_on_launch: std::env::var("TRAINYARD_FAULT_PANIC_ON_LAUNCH").ok().filter(|v| !v.is_empty()),
        }
    }
}

pub struct Reconciler {
    store: Store,
    executor: Arc<dyn Executor>,
    templates: Arc<Templates>,
    wake: Arc<Notify>,
    /// Told when a pass changed what the scheduler sees, so readers get a fresh answer.
    board: Arc<crate::scheduling::board::ScheduleBoard>,
    settings: ReconcilerSettings,
    /// Attempts we asked to stop, and when; only to avoid re-signalling every pass. Losing
    /// this on restart is harmless: the next pass signals again.
    stopping: HashMap<(Uuid, i32), Instant>,
    /// Preemptors whose victims had not launched yet, so went back to the queue at once: the
    /// room is theirs in the next cycle (`Snapshot::nominated`; victims that run are stopped,
    /// and their preemptor goes first in the pass that records their end). Lost on a restart:
    /// only that precedence, once.
    nominated_next: Vec<Uuid>,
    /// When leftovers were last collected; `None` until the first pass (after a restart).
    collected: Option<Instant>,
    /// Archives ended attempts' logs and sweeps by retention (see [`crate::storage`]).
    storage: Option<crate::control::archiving::StorageLoop>,
    /// Where jobs' code archives are read from at launch.
    code_storage: Option<Arc<crate::storage::Storage>>,
    /// How the loop is doing, for `/readyz`.
    health: Arc<LoopHealth>,
    /// Jobs whose handling panicked: left alone until the instant, for a back-off that doubles
    /// with each panic (the count). In memory: a restart tries them again at once.
    quarantined: HashMap<Uuid, (Instant, u32)>,
    /// Undecodable jobs already reported in the log, so that each is logged once.
    reported_unhandled: HashSet<Uuid>,
    /// Launches under way beside the passes; made at the first pass, once the builder methods
    /// have said where code and metrics go.
    launcher: Option<Launcher>,
    /// The metrics the loop feeds (see [`crate::monitoring`]).
    monitoring: Arc<Monitoring>,
    /// The tenants' quotas as last read for the quota gauges, and when (read every
    /// [`QUOTA_GAUGES_EVERY`]).
    quota_policies: Option<(Instant, Vec<TenantPolicyRow>)>,
    /// When the GPU-hours counter was last advanced.
    gpu_hours_lap: Option<Instant>,
}

/// This server's leadership while it leads: the lease, and the task renewing it every quarter
/// of its duration (independently of passes, which may take long).
struct Leading {
    lease: Arc<Leadership>,
    lost: Arc<std::sync::atomic::AtomicBool>,
    renewer: tokio::task::JoinHandle<()>,
}

impl Leading {
    fn start(lease: Leadership, duration: Duration) -> Leading {
        let lease = Arc::new(lease);
        let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let renewer = tokio::spawn({
            let (lease, lost) = (Arc::clone(&lease), Arc::clone(&lost));
            async move {
                loop {
                    tokio::time::sleep(duration / 4).await;
                    match lease.renew().await {
                        Ok(true) => {}
                        Ok(false) => break,
                        // The database is away: keep trying; if this outlasts the lease, the
                        // next answer is "lost" and the fence refuses writes meanwhile.
                        Err(err) => tracing::warn!(%err, "cannot renew the leadership lease"),
                    }
                }
                lost.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        });
        Leading { lease, lost, renewer }
    }

    fn is_lost(&self) -> bool {
        self.lost.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Hands the lease back at once (a clean shutdown).
    async fn stop(self) {
        self.renewer.abort();
        self.lease.release().await;
    }
}

impl Drop for Leading {
    /// Leadership given up (lost, or a write fenced): stop renewing, and forget the epoch so
    /// that this process's writes are refused.
    fn drop(&mut self) {
        self.renewer.abort();
        self.lease.lost();
    }
}

/// How one job's step of a pass went.
pub(crate) enum Step<T> {
    Done(T),
    Failed(trainyard_core::Error),
    Panicked(String),
}

/// Runs one job's step and catches its panic, so that the pass can go on with the other jobs.
pub(crate) async fn guarded<T>(step: impl std::future::Future<Output = Result<T>>) -> Step<T> {
    match std::panic::AssertUnwindSafe(step).catch_unwind().await {
        Ok(Ok(value)) => Step::Done(value),
        Ok(Err(err)) => Step::Failed(err),
        Err(payload) => Step::Panicked(panic_message(&*payload)),
    }
}

/// How many jobs a pass observes at once. An observation writes nothing (the pass records the
/// starts and ends it found together), but an ended job's may wait for the executor to free
/// what its attempt held: on Kubernetes, keeping its pod's log and deleting its Job, two API
/// requests. (32 at once shortened the Kubernetes replay's observing, 71 -> 58 ms a pass, but
/// not its wall: launches waited twice as long for the API server.)
const OBSERVE_AT_ONCE: usize = 8;

/// What observing one job found. Observing writes nothing: the pass records every start and
/// every end it found in one statement each (see [`Reconciler::record_starts`] and
/// [`Reconciler::record_ends`]), and applies the rest to the loop's own state, in order.
enum Observed {
    /// Nothing changed.
    Unchanged,
    /// Every replica of the attempt started: the job is running, its replicas run these images.
    Started { attempt: i32, images: Vec<String> },
    /// The attempt's replicas wait (for a node, an image): the job's reason says why, in the
    /// cluster's words.
    Waiting { reason: String },
    /// The attempt ended and what it held is released: its end is to be recorded.
    Ended(Ending),
    /// A launch that was interrupted: launch attempt (its number) again.
    Resume(i32),
    /// Stop this attempt's replicas (cancelled, or a failed replica fails the gang).
    Stop(AttemptRef),
}

/// How an attempt ended, as the pass records it.
struct Ending {
    attempt: i32,
    exit_codes: Vec<Option<i32>>,
    images: Vec<String>,
    to: JobState,
    reason: String,
}

impl Ending {
    fn record<'e>(&'e self, job_id: Uuid) -> AttemptEnd<'e> {
        AttemptEnd {
            job_id,
            attempt: self.attempt,
            exit_codes: &self.exit_codes,
            image_digests: &self.images,
            to: self.to,
            reason: Some(&self.reason),
            actor: ACTOR_EXECUTOR,
        }
    }
}

/// The longest a job whose handling panics is left alone between tries.
const QUARANTINE_MAX: Duration = Duration::from_secs(300);
/// The longest the loop waits after a pass that panicked outside any one job's step.
const PASS_BACKOFF_MAX: Duration = Duration::from_secs(30);

impl Reconciler {
    pub fn new(
        store: Store,
        executor: Arc<dyn Executor>,
        templates: Arc<Templates>,
        wake: Arc<Notify>,
        board: Arc<crate::scheduling::board::ScheduleBoard>,
        health: Arc<LoopHealth>,
        settings: ReconcilerSettings,
    ) -> Self {
        Reconciler {
            store,
            executor,
            templates,
            wake,
            board,
            settings,
            stopping: HashMap::new(),
            nominated_next: Vec::new(),
            collected: None,
            storage: None,
            code_storage: None,
            health,
            quarantined: HashMap::new(),
            reported_unhandled: HashSet::new(),
            launcher: None,
            monitoring: Arc::new(Monitoring::new()),
            quota_policies: None,
            gpu_hours_lap: None,
        }
    }

    /// Feeds these metrics (the server's, exported on `/metrics`) rather than a private set.
    pub fn with_monitoring(mut self, monitoring: Arc<Monitoring>) -> Self {
        self.storage = self.storage.map(|s| s.with_monitoring(Arc::clone(&monitoring)));
        self.monitoring = monitoring;
        self
    }

    /// Archives logs to this store when attempts end, and sweeps it by the tenants' retention.
    pub fn with_storage(mut self, storage: Arc<crate::storage::Storage>) -> Self {
        self.code_storage = Some(Arc::clone(&storage));
        self.storage = Some(crate::control::archiving::StorageLoop::new(storage));
        self
    }

    /// Where replicas reach the API, unless configured: the address the server listens on.
    pub fn api_url_default(&mut self, url: String) {
        self.settings.api_url.get_or_insert(url);
    }

    /// Runs passes until `shutdown`, while this server leads: one leader across server replicas
    /// (a lease with a fencing epoch in Postgres, [`Leadership`]), the others wait as standbys
    /// and take over when it expires. A
    /// failed pass (database away) is logged and retried; a pass that panics outside any one
    /// job's step is logged with its message, counted, and retried after a back-off that
    /// doubles (1 s to 30 s) — the loop itself never stops before `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let executor_changes = self.executor.changes();
        // Who this process is in the lease table: a new holder every start.
        let holder = Uuid::now_v7();
        let mut leading: Option<Leading> = None;
        let mut backoff = Duration::ZERO;
        let mut last_pass: Option<Instant> = None;
        loop {
            if leading.is_none() {
                match self.store.leadership_try(holder, self.settings.lease).await {
                    Ok(Some(lease)) => {
                        tracing::info!(epoch = lease.epoch(), "leading the control loops");
                        self.monitoring.leader.set(1);
                        leading = Some(Leading::start(lease, self.settings.lease));
                    }
                    Ok(None) => tracing::debug!("another server leads; standing by"),
                    Err(err) => tracing::warn!(%err, "cannot try for leadership"),
                }
            }
            if let Some(current) = leading.as_ref() {
                if current.is_lost() || self.store.control_epoch() != current.lease.epoch() {
                    tracing::warn!(epoch = current.lease.epoch(), "lost leadership (the lease expired or was taken)");
                    if let Some(launcher) = &self.launcher {
                        // Its launches' writes would be refused anyway (fencing); stopping them
                        // also stops what they would still ask of the executor.
                        let abandoned = launcher.abort_all();
                        if abandoned > 0 {
                            tracing::warn!(abandoned, "launches left for the next leader to resume");
                        }
                        self.health.launches_abandoned(abandoned);
                    }
                    self.health.leading(false);
                    self.monitoring.leader.set(0);
                    leading = None;
                } else {
                    self.health.leading(true);
                    // Under a stream of wake-ups (a submit wakes the loop) passes come at most
                    // every `min_pass_interval`: each pass then takes in many changes at once,
                    // instead of one pass over the whole queue per submit.
                    if let Some(wait) =
                        last_pass.and_then(|at| self.settings.min_pass_interval.checked_sub(at.elapsed()))
                    {
                        tokio::time::sleep(wait).await;
                    }
                    let started = Instant::now();
                    last_pass = Some(started);
                    match guarded(self.pass()).await {
                        Step::Done(()) => {
                            backoff = Duration::ZERO;
                            self.monitoring.pass_completed(started.elapsed());
                        }
                        Step::Failed(trainyard_core::Error::Fenced(err)) => {
                            tracing::warn!(%err, "a write was refused: this server no longer leads");
                            current.lease.lost();
                        }
                        Step::Failed(err) => tracing::warn!(%err, "reconciler pass failed; retrying"),
                        Step::Panicked(message) => {
                            backoff = (backoff * 2).clamp(Duration::from_secs(1), PASS_BACKOFF_MAX);
                            tracing::error!(panic = %message, retry_in = ?backoff, "reconciler pass panicked; the loop goes on");
                            self.health.panicked(message);
                        }
                    }
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(backoff), if !backoff.is_zero() => {}
                _ = self.wake.notified(), if backoff.is_zero() => {}
                _ = executor_changes.notified(), if backoff.is_zero() => {}
                _ = tokio::time::sleep(self.settings.tick), if backoff.is_zero() => {}
            }
        }
        if let Some(current) = leading {
            // A clean stop hands the lease over at once.
            current.stop().await;
        }
        tracing::info!("reconciler stopped");
    }

    /// One full pass over every unfinished job. Each job's step (observe, launch) is isolated:
    /// its error is logged and retried next pass, its panic marks the job as one that cannot be
    /// handled and leaves it alone for a while; every other job goes on. A job row that does
    /// not decode is marked the same way and skipped.
    pub async fn pass(&mut self) -> Result<()> {
        // How the launches that ended since the last pass went: each is one job's step.
        let mut launched = false;
        for (job_id, outcome) in self.launcher().finished() {
            match outcome {
                Step::Done(()) => launched = true,
                // Counted by the launcher when it happened.
                Step::Failed(err @ trainyard_core::Error::Fenced(_)) => return Err(err),
                Step::Failed(err) => self.step_failed(job_id, "launch", err)?,
                Step::Panicked(message) => self.job_panicked(job_id, "launching it", message).await,
            }
        }
        // A launch under way when the snapshot is read may end (its placement stored) while this
        // pass runs, and the snapshot would still show its job `starting` with no placement, as
        // an interrupted launch looks: its job is left to the next pass, whose snapshot has what
        // the launch stored. (Resuming it here would start again a rank that already exited.)
        let launching = self.launcher.as_ref().map(Launcher::launching).unwrap_or_default();
        // Idle sessions are warned, then stopped, before this pass reads the jobs: a stop is
        // acted on in this same pass.
        self.sessions_idle().await?;
        let phase = Instant::now();
        let Unfinished { jobs, unhandled } = self.store.jobs_unfinished().await?;
        self.monitoring.pass_phase("read", phase.elapsed());
        let phase = Instant::now();
        self.report_unhandled(&unhandled).await;
        self.cancel_unhandled(&unhandled).await?;
        self.gauges_update(&jobs).await;
        // A quarantined job's count is kept while it is unfinished, so its back-off keeps doubling.
        let live: FxHashSet<Uuid> = jobs.iter().map(|j| j.id).collect();
        self.quarantined.retain(|id, _| live.contains(id));
        let mut ended = HashSet::new();
        // A job being launched is looked at once its launch has ended: until then what the
        // executor reports of it is half a launch.
        let observed: Vec<&UnfinishedJob> = jobs
            .iter()
            .map(|j| &**j)
            .filter(|j| matches!(j.state, JobState::Starting | JobState::Running))
            .filter(|j| !self.is_quarantined(j.id) && !launching.contains(&j.id) && !self.is_launching(j.id))
            .collect();
        // Each job's observation is its own (its rows, its attempt): several at once, so that a
        // pass in which hundreds of attempts end or start waits for their writes side by side
        // rather than one after the other. What they change of the loop's own state is applied
        // below, in order.
        let mut outcomes = Vec::with_capacity(observed.len());
        {
            let mut waiting = observed.into_iter();
            let mut under_way = futures::stream::FuturesUnordered::new();
            under_way.extend(waiting.by_ref().take(OBSERVE_AT_ONCE).map(|job| self.observe_step(job)));
            while let Some(outcome) = under_way.next().await {
                outcomes.push(outcome);
                under_way.extend(waiting.next().map(|job| self.observe_step(job)));
            }
        }
        let mut starts = Vec::new();
        let mut waits = Vec::new();
        let mut ends = Vec::new();
        for (job, outcome) in outcomes {
            match outcome {
                Step::Done(Observed::Unchanged) => {}
                Step::Done(Observed::Started { attempt, images }) => starts.push((job, attempt, images)),
                Step::Done(Observed::Waiting { reason }) => waits.push((job, reason)),
                Step::Done(Observed::Ended(ending)) => ends.push((job, ending)),
                Step::Done(Observed::Resume(attempt)) => self.launcher().start(job, Launch::Resume(attempt)),
                Step::Done(Observed::Stop(attempt)) => self.stop(&attempt),
                Step::Failed(err) => self.step_failed(job.id, "observe", err)?,
                Step::Panicked(message) => self.job_panicked(job.id, "observing it", message).await,
            }
        }
        self.record_starts(&starts).await?;
        if !waits.is_empty() {
            let (ids, reasons): (Vec<Uuid>, Vec<String>) =
                waits.into_iter().map(|(job, reason)| (job.id, reason)).unzip();
            self.store.job_pending_reasons_set(&ids, &reasons).await?;
        }
        for (job, attempt) in self.record_ends(&ends).await? {
            self.stopping.remove(&(job, attempt));
            ended.insert(job);
        }
        for job in jobs.iter().filter(|j| {
            j.state == JobState::Restarting
                && (j.cancel_requested || j.preempt_requested)
                && !launching.contains(&j.id)
                && !self.is_launching(j.id)
        }) {
            // Between attempts nothing runs: a cancel or a preemption takes effect at once.
            let to = if job.cancel_requested { JobState::Cancelled } else { JobState::Queued };
            match self
                .store
                .job_transition(job.id, &[JobState::Restarting], to, ACTOR_RECONCILER, job.reason.as_deref())
                .await
            {
                Ok(_) => {
                    ended.insert(job.id);
                    if to.is_terminal() {
                        self.monitoring.job_finished(&job.tenant, to.as_str());
                    }
                }
                Err(err) => self.step_failed(job.id, "end between attempts", err)?,
            }
        }
        self.monitoring.pass_phase("observe", phase.elapsed());
        // What the executor holds (GPUs) follows the attempts that are not over, as the
        // database has them (and the launches under way): a server that led before, lost the
        // lead while other servers ended its attempts, and leads again, frees what it still held
        // for them before it admits. (Not this server's own finished launches, which may be
        // such attempts: one of those that the snapshot misses still runs, and the executor
        // keeps what runs.)
        let live = self.attempts_live(&jobs, &unhandled, LaunchesCounted::InFlight);
        self.executor.holdings_retain(&live);
        self.garbage_collect(&jobs, &unhandled).await;
        self.tenants_finish_removal(&jobs).await?;
        let phase = Instant::now();
        let admitted = self.admit(&jobs, &unhandled, &ended).await;
        self.monitoring.pass_phase("admit", phase.elapsed());
        let phase = Instant::now();
        if let Err(trainyard_core::Error::Fenced(err)) = &admitted {
            self.health.fenced_write();
            return Err(trainyard_core::Error::Fenced(err.clone()));
        }
        let now = chrono::Utc::now();
        let backoff = self.settings.restart_backoff;
        let launchable = jobs
            .iter()
            .map(|j| &**j)
            // A job whose launch was under way when the snapshot was read shows a state from
            // before that launch: if the launch ended since, launching it again would only find it
            // moved on (a wasted transaction a job, under a stream of launches).
            .filter(|j| {
                matches!(j.state, JobState::Admitted | JobState::Restarting)
                    && !ended.contains(&j.id)
                    && !launching.contains(&j.id)
            })
            .filter(|j| j.state != JobState::Restarting || restart_due(j, backoff, now))
            .chain(admitted.as_deref().unwrap_or_default())
            .filter(|j| !self.is_quarantined(j.id))
            .collect::<Vec<&UnfinishedJob>>();
        // Launches run beside the passes, a bounded number at once (see `launcher`): this pass
        // hands them over and ends; each launch that ends wakes the next pass.
        for job in launchable {
            self.launcher().start(job, Launch::Next);
        }
        if let Some(storage) = self.storage.as_mut() {
            storage.archive_in_background(&self.store, &self.executor, !ended.is_empty());
            storage.retention_sweep_when_due(&self.store, &*self.executor).await;
        }
        if !ended.is_empty() {
            self.board.changed();
        }
        if launched || !ended.is_empty() {
            // Capacity was freed, a restart is due, or new replicas should be seen running: go
            // again now rather than at the next tick.
            self.wake.notify_one();
        }
        self.monitoring.pass_phase("rest", phase.elapsed());
        admitted?;
        let skipped = self.quarantined.keys().filter(|id| self.is_quarantined(**id)).count();
        self.health.pass_completed(unhandled.len() + skipped);
        Ok(())
    }

    /// Finishes the removal of each tenant being removed whose jobs have all ended: first what
    /// the executor holds for it (its namespace) and its volumes' folders on this machine, then
    /// the record. A crash between the two repeats the first, which is harmless; a tenant being
    /// removed takes no new job, so none can start in between. An executor that fails is tried
    /// again at the next pass.
    async fn tenants_finish_removal(&self, jobs: &[Arc<UnfinishedJob>]) -> Result<()> {
        for (tenant_id, name) in self.store.tenants_being_removed().await? {
            if jobs.iter().any(|j| j.tenant_id == tenant_id) {
                continue;
            }
            // The record below is fenced, but the namespace and folders go first.
            self.store.control_fence_check().await?;
            if let Err(err) = self.executor.tenant_remove(tenant_id, &name).await {
                tracing::warn!(tenant = %name, %err, "removing a tenant's namespace; trying again at the next pass");
                continue;
            }
            if let Some(storage) = &self.code_storage {
                let dir = storage.tenant_volumes_dir(tenant_id);
                if let Err(err) = tokio::fs::remove_dir_all(&dir).await
                    && err.kind() != std::io::ErrorKind::NotFound
                {
                    tracing::warn!(tenant = %name, %err, dir = %dir.display(), "removing a tenant's volumes; trying again at the next pass");
                    continue;
                }
            }
            let audit =
                Audit::control_loop("tenant.removed", format!("tenant:{name}")).on_tenant(Some(tenant_id), &name);
            if self.store.tenant_removed(tenant_id, &audit).await? {
                tracing::info!(tenant = %name, "tenant removed");
            }
        }
        Ok(())
    }

    /// Sets the gauges that describe the unfinished jobs (by state, quota use per tenant and GPU
    /// type) and advances the GPU-hours counter, from what the pass read anyway (the quotas are
    /// read again every [`QUOTA_GAUGES_EVERY`]).
    async fn gauges_update(&mut self, jobs: &[Arc<UnfinishedJob>]) {
        if self.quota_policies.as_ref().is_none_or(|(at, _)| at.elapsed() >= QUOTA_GAUGES_EVERY) {
            match self.store.tenant_policies().await {
                Ok(policies) => self.quota_policies = Some((Instant::now(), policies)),
                Err(err) => tracing::debug!(%err, "cannot read quotas for the quota gauges"),
            }
        }
        let policies = self.quota_policies.as_ref().map(|(_, p)| p.as_slice()).unwrap_or_default();
        let gauges = crate::monitoring::job_gauges(jobs, policies);
        Monitoring::gauges_set(&self.monitoring.jobs, gauges.by_state);
        Monitoring::gauges_set(&self.monitoring.quota_nominal, gauges.nominal);
        Monitoring::gauges_set(&self.monitoring.quota_used, gauges.used);
        Monitoring::gauges_set(&self.monitoring.quota_borrowed, gauges.borrowed);
        Monitoring::gauges_set(&self.monitoring.quota_lent, gauges.lent);
        let now = Instant::now();
        let seconds = self.gpu_hours_lap.replace(now).map_or(0.0, |at| (now - at).as_secs_f64());
        for (labels, gpus) in gauges.running_gpus {
            crate::monitoring::add_hours(
                &self.monitoring.gpu_hours.get_or_create(&labels),
                gpus as f64 * seconds / 3600.0,
            );
        }
    }

    /// Records an admission cycle: its duration, every job it considered, and why the waiting
    /// ones wait (by reason class).
    fn cycle_observed(&self, took: Duration, result: &trainyard_scheduler::CycleResult, jobs: &[Arc<UnfinishedJob>]) {
        let m = &self.monitoring;
        m.admission_cycle_duration.observe(took.as_secs_f64());
        let result_label = |r: &str| crate::monitoring::ResultLabel { result: r.into() };
        m.admission_attempts.get_or_create(&result_label("success")).inc_by(result.admissions.len() as u64);
        m.admission_attempts.get_or_create(&result_label("inadmissible")).inc_by(result.pending.len() as u64);
        let tenant_of: FxHashMap<Uuid, &str> = jobs.iter().map(|j| (j.id, j.tenant.as_str())).collect();
        // Counted by borrowed names (thousands of pending jobs, a few tenants), labelled after.
        let mut counts: FxHashMap<(&str, &'static str), i64> = FxHashMap::default();
        for p in &result.pending {
            let tenant = tenant_of.get(&p.job).copied().unwrap_or("unknown");
            *counts.entry((tenant, crate::monitoring::reason_class(&p.reason))).or_default() += 1;
        }
        let pending = counts
            .into_iter()
            .map(|((tenant, reason), count)| (TenantReason { tenant: tenant.into(), reason: reason.into() }, count))
            .collect();
        Monitoring::gauges_set(&m.pending_jobs, pending);
    }

    /// The launcher, made at the first pass (see [`Reconciler::launcher`]'s field).
    fn launcher(&mut self) -> &mut Launcher {
        if self.launcher.is_none() {
            let context = LaunchContext {
                store: self.store.clone(),
                executor: Arc::clone(&self.executor),
                templates: Arc::clone(&self.templates),
                code_storage: self.code_storage.clone(),
                monitoring: Arc::clone(&self.monitoring),
                health: Arc::clone(&self.health),
                api_url: self.settings.api_url.clone().unwrap_or_default(),
                fault_panic_on_launch: self.settings.fault_panic_on_launch.clone(),
                interrupted: Default::default(),
                recording: tokio::sync::Semaphore::new(self.settings.launch_concurrency.max(1)),
                writes: crate::control::launcher::LaunchWrites::new(&self.store),
            };
            self.launcher = Some(Launcher::new(context, self.settings.launch_concurrency, Arc::clone(&self.wake)));
        }
        self.launcher.as_mut().expect("made above")
    }

    /// Whether a launch of the job is under way.
    fn is_launching(&self, job_id: Uuid) -> bool {
        self.launcher.as_ref().is_some_and(|launcher| launcher.is_launching(job_id))
    }

    /// A job's step failed: logged and retried next pass; a refused (fenced) write is counted
    /// and ends the pass, since this server no longer leads.
    fn step_failed(&self, job_id: Uuid, step: &str, err: trainyard_core::Error) -> Result<()> {
        if let trainyard_core::Error::Fenced(_) = err {
            self.health.fenced_write();
            return Err(err);
        }
        tracing::warn!(job = %job_id, step, %err, "a job's step failed; trying again next pass");
        Ok(())
    }

    fn is_quarantined(&self, job_id: Uuid) -> bool {
        self.quarantined.get(&job_id).is_some_and(|(until, _)| Instant::now() < *until)
    }

    /// A job's step panicked: logged with the message, counted, recorded on the job (its state
    /// unchanged), and the job left alone for a back-off that doubles with each panic.
    async fn job_panicked(&mut self, job_id: Uuid, step: &str, message: String) {
        let count = self.quarantined.get(&job_id).map_or(0, |(_, count)| *count) + 1;
        let wait = Duration::from_secs(1u64 << count.min(16)).min(QUARANTINE_MAX);
        self.quarantined.insert(job_id, (Instant::now() + wait, count));
        tracing::error!(job = %job_id, step, panic = %message, panics = count, retry_in = ?wait,
            "handling a job panicked; it is skipped and every other job goes on");
        self.health.panicked(format!("job {job_id}, {step}: {message}"));
        let reason =
            format!("cannot be handled: {step} failed unexpectedly ({message}); retried in {}s", wait.as_secs());
        if let Err(err) = self.store.job_note(job_id, &reason, ACTOR_RECONCILER).await {
            tracing::warn!(job = %job_id, %err, "cannot record on the job that it cannot be handled");
        }
    }

    /// Job rows that do not decode: each is marked (reason and event, state unchanged) and
    /// logged once; they are left out of the pass.
    async fn report_unhandled(&mut self, unhandled: &[UnhandledJob]) {
        for job in unhandled {
            let reason = format!("cannot be handled: {}", job.problem);
            if self.reported_unhandled.insert(job.id) {
                tracing::error!(job = %job.id, problem = %job.problem, "a job cannot be handled; it is skipped");
            }
            if let Err(err) = self.store.job_note(job.id, &reason, ACTOR_RECONCILER).await {
                tracing::warn!(job = %job.id, %err, "cannot record on the job that it cannot be handled");
            }
        }
    }

    /// Undecodable jobs that are cancelled still stop: the live attempt's replicas are
    /// terminated (how many there are is read from the stored spec as plain JSON), and once
    /// none runs the attempt ends and the job is `cancelled`, its processes and GPUs released. One
    /// with no live attempt is `cancelled` at once.
    /// The idle step of interactive sessions (fenced writes): a running session of a tenant with
    /// an idle timeout is warned (an event on its job) and, idle for all of it, stopped (its job
    /// cancelled, its GPUs given back). See docs/sessions.md.
    async fn sessions_idle(&mut self) -> Result<()> {
        let (warned, stopped) = self.store.sessions_idle_sweep().await?;
        if warned + stopped > 0 {
            tracing::info!(warned, stopped, "idle sessions warned and stopped");
        }
        Ok(())
    }

    async fn cancel_unhandled(&mut self, unhandled: &[UnhandledJob]) -> Result<()> {
        for job in unhandled.iter().filter(|j| j.cancel_requested) {
            if self.is_quarantined(job.id) {
                continue;
            }
            let reason = format!("cancelled; its stored row cannot be read: {}", job.problem);
            let Some(record) = job.live_attempt() else {
                let from = [JobState::Queued, JobState::Admitted, JobState::Starting, JobState::Restarting];
                let to = JobState::Cancelled;
                match self.store.job_transition(job.id, &from, to, ACTOR_RECONCILER, Some(&reason)).await {
                    Ok(_) => {}
                    Err(err) => self.step_failed(job.id, "cancel an unreadable job", err)?,
                }
                continue;
            };
            let Some(replicas) = job.replicas else {
                tracing::error!(job = %job.id, "cannot stop an unreadable job: its stored spec names no replica count");
                continue;
            };
            let attempt =
                AttemptRef { job_id: job.id, attempt: record.number, replicas, placement: record.placement.clone() };
            let statuses = self.executor.observe(&attempt).await;
            if statuses.contains(&ReplicaStatus::Running) {
                self.stop(&attempt);
                continue;
            }
            let exit_codes = exit_codes_of(&statuses);
            self.executor.release(&attempt).await;
            let end = AttemptEnd {
                job_id: job.id,
                attempt: record.number,
                exit_codes: &exit_codes,
                image_digests: &[],
                to: JobState::Cancelled,
                reason: Some(&reason),
                actor: ACTOR_RECONCILER,
            };
            match self.store.attempts_end(&[end]).await {
                Ok(_) => {
                    self.stopping.remove(&(job.id, record.number));
                    tracing::info!(job = %job.id, "an unreadable job was cancelled and its replicas stopped");
                }
                Err(err) => self.step_failed(job.id, "cancel an unreadable job", err)?,
            }
        }
        Ok(())
    }

    /// The attempts that are not over: the current attempt of each unfinished job (also of one
    /// whose row does not decode: it still holds what it runs on), and those of this server's
    /// launches since this pass read its snapshot (`launches`: the ones under way, or also the
    /// finished ones).
    fn attempts_live(
        &mut self,
        jobs: &[Arc<UnfinishedJob>],
        unhandled: &[UnhandledJob],
        launches: LaunchesCounted,
    ) -> Vec<(Uuid, i32)> {
        let mut live: Vec<(Uuid, i32)> =
            jobs.iter().filter_map(|j| j.attempt.as_ref().map(|a| (j.id, a.number))).collect();
        live.extend(unhandled.iter().filter_map(|j| j.live_attempt().map(|a| (j.id, a.number))));
        let current: FxHashMap<Uuid, i32> =
            jobs.iter().map(|j| (j.id, j.attempt.as_ref().map_or(0, |a| a.number))).collect();
        let current = |job| current.get(&job).copied().unwrap_or(0);
        live.extend(match launches {
            LaunchesCounted::InFlight => self.launcher().attempts_in_flight(current),
            LaunchesCounted::InFlightAndFinished => self.launcher().attempts_live(current),
        });
        live
    }

    /// Asks the executor, now and then, to remove what attempts that are not live left behind
    /// (a cluster's Jobs of finished or unknown jobs, found after a restart).
    async fn garbage_collect(&mut self, jobs: &[Arc<UnfinishedJob>], unhandled: &[UnhandledJob]) {
        if self.collected.is_some_and(|at| at.elapsed() < GARBAGE_COLLECT_EVERY) {
            return;
        }
        let live = self.attempts_live(jobs, unhandled, LaunchesCounted::InFlightAndFinished);
        let collected = self.executor.garbage_collect(&live).await;
        if collected > 0 {
            tracing::info!(collected, "removed the leftovers of ended or unknown attempts");
        }
        // Quota changes are pushed when made (`App::quota_set`); this catches the rest (a
        // restart, another server's change).
        match self.store.tenant_policies().await {
            Ok(tenants) => {
                for tenant in &tenants {
                    if let Err(err) = self.executor.tenant_ceiling_set(tenant.id, &ceiling_of(tenant)).await {
                        tracing::warn!(tenant = %tenant.name, %err, "cannot mirror the quota ceiling");
                    }
                }
            }
            Err(err) => tracing::warn!(%err, "cannot read tenant quotas to mirror them"),
        }
        self.collected = Some(Instant::now());
    }

    /// Looks at a launched job's current attempt (never one whose launch is under way: the pass
    /// leaves those alone); records its end when it has ended. True when the job ended or left
    /// its attempt (so it holds no capacity any more).
    /// One job's observation, its panic caught.
    async fn observe_step<'j>(&self, job: &'j UnfinishedJob) -> (&'j UnfinishedJob, Step<Observed>) {
        (job, guarded(self.observe(job)).await)
    }

    async fn observe(&self, job: &UnfinishedJob) -> Result<Observed> {
        let Some(record) = &job.attempt else {
            return Ok(Observed::Unchanged);
        };
        if job.state == JobState::Starting
            && record.placement.is_none()
            && !record.ended
            && !job.cancel_requested
            && !job.preempt_requested
        {
            // Begun but never recorded as launched: a crash or a control-plane error interrupted
            // the launch. Launch it again; only the ranks that did not start are started. What
            // the launch chose (its GPUs) is held now, before this pass admits and launches
            // other jobs beside it.
            self.executor.launch_resuming(job.id, record.number);
            return Ok(Observed::Resume(record.number));
        }
        let attempt = AttemptRef {
            job_id: job.id,
            attempt: record.number,
            replicas: job.spec.replicas,
            placement: record.placement.clone(),
        };
        let details = self.executor.replica_details(&attempt).await;
        let statuses: Vec<ReplicaStatus> = details.iter().map(ReplicaDetail::status).collect();
        // Replicas still waiting for a node or their image count as running (not ended) but
        // keep the job `starting`. A cause beyond an exit code (OOMKilled, Evicted, NodeLost,
        // ...) explains the failure better than the exit codes of the replicas stopped after it.
        let pending = details.iter().any(|d| d.phase == ReplicaPhase::Pending);
        let external = details.iter().find(|d| d.has_external_cause()).and_then(ReplicaDetail::failure_sentence);
        let time_limit_reached = job.spec.time_limit_seconds.filter(|limit| {
            record
                .started_at
                .is_some_and(|started| chrono::Utc::now() - started >= chrono::TimeDelta::seconds(i64::from(*limit)))
        });
        let facts = JobFacts {
            cancel_requested: job.cancel_requested,
            preempt_requested: job.preempt_requested,
            time_limit_reached,
            restart_count: job.restart_count,
            max_restarts: job.max_restarts,
            stop_sent: self.stopping.contains_key(&(job.id, record.number)),
        };
        let (mut to, cause) = match attempt_verdict(facts, &statuses, pending, external) {
            Verdict::Stop => {
                // Cancelled, or one replica failed so the gang fails: its end is recorded when
                // no replica runs any more.
                return Ok(Observed::Stop(attempt));
            }
            Verdict::Running { all_started } => {
                if job.state == JobState::Starting && all_started {
                    // Every container started: the images they run are known now.
                    return Ok(Observed::Started { attempt: record.number, images: image_digests(&details) });
                }
                if job.state == JobState::Starting
                    && let Some(reason) = waiting_reason(&details)
                    && job.reason.as_deref() != Some(reason.as_str())
                {
                    return Ok(Observed::Waiting { reason });
                }
                return Ok(Observed::Unchanged);
            }
            Verdict::Ended { to, cause } => (to, cause),
        };
        let reason = match cause {
            EndCause::Cancelled => job.reason.clone().unwrap_or_else(|| "cancelled".into()),
            EndCause::Preempted => job.reason.clone().unwrap_or_else(|| "preempted".into()),
            EndCause::TimedOut(limit) => format!(
                "stopped at its time limit of {} (not restarted)",
                humantime::format_duration(std::time::Duration::from_secs(u64::from(limit)))
            ),
            EndCause::Succeeded => "every replica exited with code 0".to_string(),
            EndCause::Failed(Failure::External(sentence)) => sentence,
            EndCause::Failed(Failure::Lost { .. }) => REASON_LOST.to_string(),
            EndCause::Failed(Failure::Exited { rank, code }) => {
                // Its last words (a Python traceback ends with the exception) make the reason.
                let line = self.executor.log_last_line(job.id, record.number, rank as u32).await;
                let mut reason = match &line {
                    Some(line) => format!("replica {rank} {}: {line}", exit_description(code)),
                    None => format!("replica {rank} {}", exit_description(code)),
                };
                if let Some(hint) = shell_hint(code, &job.spec.command) {
                    reason.push_str(&hint);
                }
                if to == JobState::Restarting
                    && let Some(why) = deterministic_failure(code, line.as_deref())
                {
                    to = JobState::Failed;
                    reason.push_str(&format!(" (not restarted: {why} fails the same way every time)"));
                }
                reason
            }
        };
        let exit_codes = exit_codes_of(&statuses);
        // Free what the attempt still holds first, so that once the state says it ended, none
        // of its processes is left. Repeating this after a failed write is harmless.
        self.executor.release(&attempt).await;
        Ok(Observed::Ended(Ending { attempt: record.number, exit_codes, images: image_digests(&details), to, reason }))
    }

    /// Records a pass's starts (jobs whose every replica started are `running`), in one
    /// statement (see [`Reconciler::batch_or_each`]).
    async fn record_starts(&self, starts: &[(&UnfinishedJob, i32, Vec<String>)]) -> Result<()> {
        let batch: Vec<Started> = starts
            .iter()
            .map(|(job, attempt, images)| Started { job_id: job.id, attempt: *attempt, image_digests: images })
            .collect();
        let write = |some| self.store.jobs_running(some, ACTOR_EXECUTOR);
        let (_, moved) = self.batch_or_each("starts", &batch, |start| start.job_id, write).await?;
        for (job, _, _) in starts.iter().filter(|(job, _, _)| moved.contains(&job.id)) {
            if let Some(admitted_at) = job.admitted_at {
                let waited = (chrono::Utc::now() - admitted_at).num_milliseconds().max(0) as f64 / 1000.0;
                self.monitoring.launch_time.get_or_create(&labels_of(job)).observe(waited);
            }
        }
        Ok(())
    }

    /// Records a pass's ends (each attempt closed, its job moved on), in one transaction (see
    /// [`Reconciler::batch_or_each`]); an end not recorded is observed again next pass. Returns
    /// the jobs and attempts whose end is recorded.
    async fn record_ends(&self, ends: &[(&UnfinishedJob, Ending)]) -> Result<Vec<(Uuid, i32)>> {
        let batch: Vec<AttemptEnd> = ends.iter().map(|(job, ending)| ending.record(job.id)).collect();
        let write = |some| self.store.attempts_end(some);
        let (recorded, _) = self.batch_or_each("ends", &batch, |end| end.job_id, write).await?;
        Ok(ends
            .iter()
            .filter(|(job, _)| recorded.contains(&job.id))
            .map(|(job, ending)| {
                if ending.to.is_terminal() {
                    self.monitoring.job_finished(&job.tenant, ending.to.as_str());
                }
                tracing::info!(job = %job.id, attempt = ending.attempt, state = %ending.to, reason = %ending.reason, "attempt ended");
                (job.id, ending.attempt)
            })
            .collect())
    }

    /// Writes a pass's batch (its starts, its ends) at once. If the database refuses it, each
    /// item is written on its own, so that one the database refuses fails alone and the others
    /// are recorded; if it is away or this server no longer leads, the pass ends there (the
    /// next observes the same jobs again). Returns the jobs written and the jobs the writes
    /// moved.
    async fn batch_or_each<'b, T, W>(
        &self,
        what: &str,
        batch: &'b [T],
        job_of: impl Fn(&T) -> Uuid,
        write: impl Fn(&'b [T]) -> W,
    ) -> Result<(HashSet<Uuid>, HashSet<Uuid>)>
    where
        W: std::future::Future<Output = Result<HashSet<Uuid>>>,
    {
        match write(batch).await {
            Ok(moved) => Ok((batch.iter().map(&job_of).collect(), moved)),
            Err(err @ trainyard_core::Error::Fenced(_)) => {
                self.health.fenced_write();
                Err(err)
            }
            // The database is away: one at a time would only wait for it once per item. The
            // pass ends; the next observes these jobs again.
            Err(err @ trainyard_core::Error::Unavailable(_)) => Err(err),
            Err(err) => {
                tracing::warn!(%err, jobs = batch.len(), "recording a pass's {what} at once failed; recording them one at a time");
                let (mut written, mut moved) = (HashSet::new(), HashSet::new());
                for item in batch {
                    match write(std::slice::from_ref(item)).await {
                        Ok(one) => {
                            written.insert(job_of(item));
                            moved.extend(one);
                        }
                        Err(err) => self.step_failed(job_of(item), "observe", err)?,
                    }
                }
                Ok((written, moved))
            }
        }
    }

    fn stop(&mut self, attempt: &AttemptRef) {
        let key = (attempt.job_id, attempt.attempt);
        let due =
            self.stopping.get(&key).is_none_or(|asked| asked.elapsed() > self.settings.grace + Duration::from_secs(5));
        if due {
            self.stopping.insert(key, Instant::now());
            let executor = Arc::clone(&self.executor);
            let attempt = attempt.clone();
            let grace = self.settings.grace;
            tokio::spawn(async move { executor.terminate(&attempt, grace).await });
        }
    }

    /// Runs an admission cycle: admits what the scheduler admits (with its placement), asks
    /// preemption victims to stop, and keeps every waiting job's reason current. Returns the jobs
    /// admitted in this pass, as admitted (their flavor and nodes set). Jobs whose rows do not
    /// decode (`unhandled`) count with what they hold, as far as their stored spec tells.
    /// Chains and arrays (`store/src/chains.rs`), before the cycle: cancels the queued jobs
    /// whose dependency can never be met, and returns them with those that sit this cycle out
    /// (a dependency not met yet, or beyond their array's limit), whose reasons it sets.
    async fn chains_hold(&mut self, jobs: &[Arc<UnfinishedJob>]) -> Result<HashSet<Uuid>> {
        let by_id: FxHashMap<Uuid, &UnfinishedJob> = jobs.iter().map(|j| (j.id, &**j)).collect();
        let mut held: HashSet<Uuid> = self.store.jobs_dependency_doomed_cancel().await?.into_iter().collect();
        if !held.is_empty() {
            self.board.changed();
        }
        for job in held.iter().filter_map(|id| by_id.get(id)) {
            self.monitoring.job_finished(&job.tenant, "cancelled");
        }
        let (ids, reasons): (Vec<Uuid>, Vec<String>) = self
            .store
            .jobs_held()
            .await?
            .into_iter()
            .filter(|(id, _)| held.insert(*id))
            .filter(|(id, reason)| by_id.get(id).is_some_and(|j| j.reason.as_deref() != Some(reason.as_str())))
            .unzip();
        if !ids.is_empty() {
            self.store.job_pending_reasons_set(&ids, &reasons).await?;
        }
        Ok(held)
    }

    async fn admit(
        &mut self,
        jobs: &[Arc<UnfinishedJob>],
        unhandled: &[UnhandledJob],
        ended: &HashSet<Uuid>,
    ) -> Result<Vec<UnfinishedJob>> {
        if !jobs.iter().any(|j| j.state == JobState::Queued) {
            self.monitoring.pending_jobs.clear();
            return Ok(Vec::new());
        }
        let held = self.chains_hold(jobs).await?;
        let gated: Vec<Arc<UnfinishedJob>>;
        let jobs: &[Arc<UnfinishedJob>] = if held.is_empty() {
            jobs
        } else {
            gated = jobs.iter().filter(|j| !held.contains(&j.id)).cloned().collect();
            &gated
        };
        let mut snapshot = snapshot_now(&self.store, self.executor.as_ref(), jobs, ended).await?;
        let default_node = snapshot.nodes.first().map(|n| n.name.clone()).unwrap_or_else(|| LOCAL_NODE.into());
        snapshot.running.extend(unhandled.iter().filter_map(|j| running_unreadable(j, &default_node)));
        snapshot.nominated.append(&mut self.nominated_next);
        // CPU-bound (tens of milliseconds at a queue of 100,000): off the async workers.
        let cycle_started = Instant::now();
        let result = tokio::task::spawn_blocking(move || admission_cycle(&snapshot))
            .await
            .map_err(|err| trainyard_core::Error::internal(format!("running the admission cycle: {err}")))?;
        self.cycle_observed(cycle_started.elapsed(), &result, jobs);
        let by_id: FxHashMap<Uuid, &UnfinishedJob> = jobs.iter().map(|j| (j.id, &**j)).collect();
        let admissions: Vec<Admission> = result
            .admissions
            .iter()
            .map(|a| Admission { id: a.job, flavor: a.flavor.as_deref(), nodes: &a.nodes })
            .collect();
        let admitted_ids = self.store.jobs_admit(&admissions).await?;
        let mut admitted = Vec::new();
        for admission in result.admissions.iter().filter(|a| admitted_ids.contains(&a.job)) {
            let job = by_id[&admission.job];
            // Launched with the placement just decided (a cluster executor steers replicas there).
            let mut launching = job.clone();
            launching.flavor = admission.flavor.clone();
            launching.assigned_nodes = Some(admission.nodes.clone());
            admitted.push(launching);
            let waited = (chrono::Utc::now() - job.created_at).num_milliseconds().max(0) as f64 / 1000.0;
            let labels = TenantGpu {
                tenant: job.tenant.clone(),
                gpu_type: admission.flavor.clone().unwrap_or_else(|| "none".into()),
            };
            self.monitoring.admission_wait.get_or_create(&labels).observe(waited);
        }
        let victims: Vec<Victim> = result
            .preemptions
            .iter()
            .map(|preemption| {
                let why = match preemption.kind {
                    PreemptionKind::Reclaim => "to return borrowed quota to its owner",
                    PreemptionKind::LowerPriority => "for a higher-priority job of the same tenant",
                    PreemptionKind::Spare => "to give spare room back to a job within its quota",
                };
                let reason = format!("preempted {why} (job {})", preemption.for_job);
                Victim { id: preemption.victim, reason, for_job: preemption.for_job }
            })
            .collect();
        let preempted = self.store.jobs_preempt(&victims).await?;
        for preemption in result.preemptions.iter().filter(|p| preempted.contains(&p.victim)) {
            if by_id.get(&preemption.victim).is_some_and(|v| v.state == JobState::Admitted) {
                self.nominated_next.push(preemption.for_job);
            }
            tracing::info!(victim = %preemption.victim, for_job = %preemption.for_job, ?preemption.kind, "preempting");
            if let Some(victim) = by_id.get(&preemption.victim) {
                let class = match preemption.kind {
                    PreemptionKind::Reclaim => "reclaim",
                    PreemptionKind::LowerPriority => "priority",
                    PreemptionKind::Spare => "spare",
                };
                let labels = TenantReason { tenant: victim.tenant.clone(), reason: class.into() };
                self.monitoring.preempted_jobs.get_or_create(&labels).inc();
            }
        }
        if !admitted.is_empty() || !result.preemptions.is_empty() {
            self.board.changed();
        }
        // Reasons that changed, in one statement: a change of usage rewords thousands at once.
        let (ids, reasons): (Vec<Uuid>, Vec<String>) = result
            .pending
            .iter()
            .map(|pending| (pending.job, pending.reason.to_string()))
            .filter(|(id, reason)| by_id.get(id).is_some_and(|j| j.reason.as_deref() != Some(reason.as_str())))
            .unzip();
        if !ids.is_empty() {
            self.store.job_pending_reasons_set(&ids, &reasons).await?;
        }
        Ok(admitted)
    }
}

/// Why a starting attempt waits, from the first replica the cluster says something about
/// (`0/3 nodes are available: 3 Insufficient cpu`, a pull back-off): the job's reason until
/// every replica runs, so that `yard jobs show` and the dashboard say what the pod says.
fn waiting_reason(details: &[ReplicaDetail]) -> Option<String> {
    details
        .iter()
        .filter(|d| d.phase == ReplicaPhase::Pending)
        .find_map(|d| d.message.as_deref().filter(|m| !m.is_empty()).map(|m| format!("replica {} waits: {m}", d.rank)))
}

/// The distinct images an attempt's replicas ran, by digest, in rank order of first use.
fn image_digests(details: &[ReplicaDetail]) -> Vec<String> {
    let mut digests: Vec<String> = Vec::new();
    for digest in details.iter().filter_map(|d| d.image_digest.as_ref()) {
        if !digests.contains(digest) {
            digests.push(digest.clone());
        }
    }
    digests
}

/// Whether a restarting job's back-off ([`restart_delay`] from `base`) has passed since its last
/// attempt ended (a later pass looks again: the loop ticks every second).
fn restart_due(job: &UnfinishedJob, base: Duration, now: chrono::DateTime<chrono::Utc>) -> bool {
    let Some(ended_at) = job.attempt.as_ref().and_then(|a| a.ended_at) else { return true };
    chrono::Duration::from_std(restart_delay(base, job.restart_count)).is_ok_and(|delay| ended_at + delay <= now)
}

/// The tenant and GPU type a job's metrics are labelled with.
fn labels_of(job: &UnfinishedJob) -> TenantGpu {
    TenantGpu { tenant: job.tenant.clone(), gpu_type: job.flavor.clone().unwrap_or_else(|| "none".into()) }
}

/// Each replica's exit code, in rank order; `None` for one that did not exit (lost).
fn exit_codes_of(statuses: &[ReplicaStatus]) -> Vec<Option<i32>> {
    statuses
        .iter()
        .map(|s| match s {
            ReplicaStatus::Exited(code) => Some(*code),
            _ => None,
        })
        .collect()
}
