//! Launches, beside the passes. A pass hands each job it would launch (an admitted job, a due
//! restart, a launch a crash or a control-plane error interrupted) to the [`Launcher`] and goes
//! on at once: a slow API server delays that job's launch, not the observation of every other
//! job, and a job is marked running by the first pass after its replicas run rather than after
//! the slowest launch of its pass. At most `launch_concurrency` launches run at once (a slot
//! covers opening the attempt and the executor's launch; storing where it runs comes after, in
//! a slot of its own kind, so that the next launch does not wait for that write), and one job
//! is launched by one task at a time. A launch is one job's step, as in a pass: its error or
//! panic comes back to the next pass ([`Launcher::finished`]), which handles it like any step's.
//!
//! Nothing here is durable. A launch cut short (a crash, lost leadership: [`Launcher::abort_all`])
//! leaves its attempt `starting` with no placement, and the next leader's pass resumes it: the
//! executors start only the ranks that did not start.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use trainyard_core::Result;
use trainyard_core::record::ServerRecord;
use trainyard_executor::{Executor, ExecutorError, LaunchRequest};
use trainyard_store::Store;
use trainyard_store::reconcile::{AttemptEnd, AttemptToOpen, Held, UnfinishedJob};

use crate::control::gather::{Gather, all_or_each};
use crate::control::outcome::state_after_failure;
use crate::control::reconciler::{ACTOR_EXECUTOR, ACTOR_RECONCILER, Step, guarded};
use crate::monitoring::Monitoring;
use crate::scheduling::health::LoopHealth;
use crate::templates::Templates;
use uuid::Uuid;

/// How long a launch that ended is remembered for garbage collection (see
/// [`Launcher::attempts_live`]): longer than the collection interval.
const REMEMBER_FINISHED: Duration = Duration::from_secs(180);

/// What a launch needs, shared by every launch task.
pub(crate) struct LaunchContext {
    pub(crate) store: Store,
    pub(crate) executor: Arc<dyn Executor>,
    pub(crate) templates: Arc<Templates>,
    /// Where jobs' code archives are read from.
    pub(crate) code_storage: Option<Arc<crate::storage::Storage>>,
    pub(crate) monitoring: Arc<Monitoring>,
    /// Told of writes refused because this server no longer leads.
    pub(crate) health: Arc<LoopHealth>,
    /// `TRAINYARD_URL` for replicas.
    pub(crate) api_url: String,
    /// Fault injection for tests (`TRAINYARD_FAULT_PANIC_ON_LAUNCH`, see the settings).
    pub(crate) fault_panic_on_launch: Option<String>,
    /// Launches interrupted by a control-plane error, with the error: noted on the job once the
    /// launch goes through (the database may be what was away). Empty at first.
    pub(crate) interrupted: Mutex<HashMap<Uuid, String>>,
    /// Launches storing their outcome (where the attempt runs, or its failure) after their slot:
    /// as many at once as there are slots, so a slow database cannot pile them up.
    pub(crate) recording: Semaphore,
    /// Attempts opened, and placements stored, by launches side by side: one statement each.
    pub(crate) writes: LaunchWrites,
}

/// The writes of launches running side by side, gathered into one statement each (see
/// [`crate::control::gather`]).
pub(crate) struct LaunchWrites {
    opens: Gather<AttemptToOpen, Option<(i32, String)>>,
    placements: Gather<(Uuid, i32, serde_json::Value), ()>,
}

impl LaunchWrites {
    pub(crate) fn new(store: &Store) -> LaunchWrites {
        let (for_opens, for_placements) = (store.clone(), store.clone());
        let opens = Gather::new("opening attempts", move |batch: Vec<AttemptToOpen>| {
            let (all, each) = (for_opens.clone(), for_opens.clone());
            all_or_each(
                batch,
                move |batch| async move {
                    let mut opened = all.attempts_open(&batch, ACTOR_EXECUTOR).await?;
                    Ok(batch.iter().map(|open| opened.remove(&open.job_id)).collect())
                },
                move |open| {
                    let store = each.clone();
                    async move {
                        Ok(store.attempts_open(std::slice::from_ref(&open), ACTOR_EXECUTOR).await?.remove(&open.job_id))
                    }
                },
            )
        });
        let placements = Gather::new("storing placements", move |batch: Vec<(Uuid, i32, serde_json::Value)>| {
            let (all, each) = (for_placements.clone(), for_placements.clone());
            all_or_each(
                batch,
                move |batch| async move {
                    let refs: Vec<_> =
                        batch.iter().map(|(job, attempt, placement)| (*job, *attempt, placement)).collect();
                    all.attempts_placement_set(&refs).await?;
                    Ok(vec![(); batch.len()])
                },
                move |(job, attempt, placement)| {
                    let store = each.clone();
                    async move { store.attempt_placement_set(job, attempt, &placement).await }
                },
            )
        });
        LaunchWrites { opens, placements }
    }
}

/// Which launch: a job's next attempt, or the rest of one begun before.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Launch {
    /// Open the job's next attempt (admitted, or restarting and due) and start it.
    Next,
    /// Start what did not start of this attempt, which is `starting` with no placement.
    Resume(i32),
}

/// One launch under way.
struct InFlight {
    /// The attempt once opened (or the one resumed).
    attempt: Option<i32>,
    abort: tokio::task::AbortHandle,
}

#[derive(Default)]
struct Launches {
    in_flight: HashMap<Uuid, InFlight>,
    /// Attempts whose launch ended, and when: until the snapshot of every pass has them.
    finished: Vec<(Uuid, i32, Instant)>,
}

pub(crate) struct Launcher {
    context: Arc<LaunchContext>,
    permits: Arc<Semaphore>,
    launches: Arc<Mutex<Launches>>,
    done: mpsc::UnboundedSender<(Uuid, Step<()>)>,
    results: mpsc::UnboundedReceiver<(Uuid, Step<()>)>,
    /// Woken when a launch ends, so that a pass observes the new attempt (or the error) now.
    wake: Arc<Notify>,
}

impl Launcher {
    pub(crate) fn new(context: LaunchContext, concurrency: usize, wake: Arc<Notify>) -> Launcher {
        let (done, results) = mpsc::unbounded_channel();
        Launcher {
            context: Arc::new(context),
            permits: Arc::new(Semaphore::new(concurrency.max(1))),
            launches: Arc::default(),
            done,
            results,
            wake,
        }
    }

    fn launches(&self) -> std::sync::MutexGuard<'_, Launches> {
        self.launches.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The jobs whose launch is under way now.
    pub(crate) fn launching(&self) -> std::collections::HashSet<Uuid> {
        self.launches().in_flight.keys().copied().collect()
    }

    /// Whether a launch of the job is under way.
    pub(crate) fn is_launching(&self, job_id: Uuid) -> bool {
        self.launches().in_flight.contains_key(&job_id)
    }

    /// Starts launching the job unless a launch of it is under way already. Returns at once.
    pub(crate) fn start(&self, job: &UnfinishedJob, launch: Launch) {
        let mut launches = self.launches();
        if launches.in_flight.contains_key(&job.id) {
            return;
        }
        let (context, permits, registry, done, wake) = (
            Arc::clone(&self.context),
            Arc::clone(&self.permits),
            Arc::clone(&self.launches),
            self.done.clone(),
            Arc::clone(&self.wake),
        );
        let job = job.clone();
        let job_id = job.id;
        let resumed = match launch {
            Launch::Resume(attempt) => Some(attempt),
            Launch::Next => None,
        };
        // The registry's lock is held until the entry exists, so the task cannot finish (and
        // remove it) before it is there.
        let handed_over = Instant::now();
        let task = tokio::spawn(async move {
            let Ok(slot) = permits.acquire_owned().await else { return };
            context.monitoring.launch_phase_observe("wait", handed_over.elapsed());
            let outcome = guarded(context.launch(&job, launch, &registry, slot)).await;
            if let Step::Failed(trainyard_core::Error::Fenced(_)) = &outcome {
                // Counted now: a server that no longer leads runs no pass to hear of it.
                context.health.fenced_write();
            }
            {
                let mut launches = registry.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(InFlight { attempt: Some(attempt), .. }) = launches.in_flight.remove(&job_id) {
                    launches.finished.push((job_id, attempt, Instant::now()));
                }
                launches.finished.retain(|(_, _, at)| at.elapsed() < REMEMBER_FINISHED);
            }
            let _ = done.send((job_id, outcome));
            wake.notify_one();
        });
        launches.in_flight.insert(job_id, InFlight { attempt: resumed, abort: task.abort_handle() });
    }

    /// The launches that ended since the last call, with how each went.
    pub(crate) fn finished(&mut self) -> Vec<(Uuid, Step<()>)> {
        let mut finished = Vec::new();
        while let Ok(result) = self.results.try_recv() {
            finished.push(result);
        }
        finished
    }

    /// Attempts this process is launching or launched recently, which a pass's snapshot (read
    /// before they were opened) may not have: garbage collection must not take them for
    /// leftovers. A launch not yet past opening its attempt counts with both its job's current
    /// attempt and the next.
    pub(crate) fn attempts_live(&self, current: impl Fn(Uuid) -> i32) -> Vec<(Uuid, i32)> {
        let mut live: Vec<(Uuid, i32)> =
            self.launches().finished.iter().map(|(job, attempt, _)| (*job, *attempt)).collect();
        live.extend(self.attempts_in_flight(current));
        live
    }

    /// The attempts of the launches under way (both an unfinished job's current attempt and
    /// the next, while the launch has not said which it opens).
    pub(crate) fn attempts_in_flight(&self, current: impl Fn(Uuid) -> i32) -> Vec<(Uuid, i32)> {
        let launches = self.launches();
        let mut live = Vec::new();
        for (job, in_flight) in &launches.in_flight {
            match in_flight.attempt {
                Some(attempt) => live.push((*job, attempt)),
                None => {
                    let current = current(*job);
                    live.extend([(*job, current), (*job, current + 1)]);
                }
            }
        }
        live
    }

    /// Stops every launch under way (this server no longer leads, or it stops): each is left
    /// as a crash would leave it, for the next leader to resume. Returns how many.
    pub(crate) fn abort_all(&self) -> usize {
        let mut launches = self.launches();
        let count = launches.in_flight.len();
        for (_, in_flight) in launches.in_flight.drain() {
            in_flight.abort.abort();
        }
        count
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        self.abort_all();
    }
}

/// What an attempt's launch needs besides its token: read before the attempt is opened, so that
/// opening it and writing its record are one commit.
struct LaunchInputs {
    files: std::collections::BTreeMap<String, Vec<u8>>,
    code: Vec<trainyard_executor::CodeFile>,
    record: ServerRecord,
}

impl LaunchContext {
    /// One launch, from its slot: the attempt opened (or the one resumed) and the executor's
    /// launch in the slot, then the slot freed and the outcome stored.
    async fn launch(
        &self,
        job: &UnfinishedJob,
        launch: Launch,
        registry: &Mutex<Launches>,
        slot: OwnedSemaphorePermit,
    ) -> Result<()> {
        let in_slot = Instant::now();
        let opened = self.open_and_start(job, launch, registry).await;
        drop(slot);
        self.monitoring.launch_phase_observe("launch", in_slot.elapsed());
        let Some((attempt, started)) = opened? else {
            return Ok(());
        };
        let _recording = self.recording.acquire().await.expect("the recording semaphore is never closed");
        self.launch_ended(job, attempt, started).await
    }

    /// A launch's part in its slot: the attempt it launches and how its start went, or nothing
    /// when no attempt was opened (the job was cancelled or moved meanwhile, or a control-plane
    /// error came first: the next pass tries again).
    async fn open_and_start(
        &self,
        job: &UnfinishedJob,
        launch: Launch,
        registry: &Mutex<Launches>,
    ) -> Result<Option<(i32, std::result::Result<serde_json::Value, LaunchFailure>)>> {
        if let Launch::Resume(attempt) = launch {
            return Ok(Some((attempt, self.resume(job, attempt).await)));
        }
        if let Some(marker) = &self.fault_panic_on_launch
            && job.spec.command.iter().chain(&job.spec.args).any(|arg| arg == marker)
        {
            panic!("fault injected by TRAINYARD_FAULT_PANIC_ON_LAUNCH into job {}", job.id);
        }
        let held = Held::of(&job.spec);
        let opening = Instant::now();
        match self.inputs(job).await {
            Ok(inputs) => {
                // The attempt, its ledger row, its run record and its job token: one commit
                // (shared with the launches beside it).
                let server = serde_json::to_value(&inputs.record).map_err(trainyard_core::Error::internal)?;
                let Some((attempt, token)) =
                    self.writes.opens.ask(AttemptToOpen { job_id: job.id, held, server }).await?
                else {
                    return Ok(None); // cancelled or moved meanwhile
                };
                self.monitoring.launch_phase_observe("open", opening.elapsed());
                registry_attempt_set(registry, job.id, attempt);
                let starting = Instant::now();
                let started = self.start(job, attempt, inputs, token).await;
                self.monitoring.launch_phase_observe("start", starting.elapsed());
                Ok(Some((attempt, started)))
            }
            // Nothing was opened: the job stays admitted and the next pass tries again.
            Err(LaunchFailure::ControlPlane(error)) => {
                self.control_plane_interrupted(job, None, error).await;
                Ok(None)
            }
            // The job's own inputs are unusable: an attempt is opened to fail, as any launch the
            // executor refuses.
            Err(failure @ LaunchFailure::Job(_)) => {
                let Some(attempt) = self.store.attempt_begin(job.id, ACTOR_EXECUTOR, held).await? else {
                    return Ok(None);
                };
                registry_attempt_set(registry, job.id, attempt);
                Ok(Some((attempt, Err(failure))))
            }
        }
    }

    /// The template's files, the job's code and the server's part of its run record.
    async fn inputs(&self, job: &UnfinishedJob) -> std::result::Result<LaunchInputs, LaunchFailure> {
        let files = match &job.spec.template {
            Some(reference) => self
                .templates
                .files_for(job.tenant_id, reference)
                .await
                .map_err(|e| LaunchFailure::of_control_plane(e, "reading the template's files"))?,
            None => Default::default(),
        };
        let code = match (&job.spec.code, &self.code_storage) {
            (None, _) => Vec::new(),
            (Some(code), Some(storage)) => {
                use crate::code::{CodeUnavailable, code_files};
                code_files(storage, job.tenant_id, &code.digest).await.map_err(|problem| match problem {
                    CodeUnavailable::Store(why) => LaunchFailure::ControlPlane(why),
                    CodeUnavailable::Archive(why) => LaunchFailure::Job(why),
                })?
            }
            (Some(_), None) => {
                return Err(LaunchFailure::Job("this server has no storage to read the job's code from".into()));
            }
        };
        // The image the replicas run: the rerun's pinned digest, else the executor's.
        let image = job.spec.image.clone().or_else(|| self.executor.image());
        let record = ServerRecord::new(&job.spec, &files, self.executor.name(), image.as_deref());
        Ok(LaunchInputs { files, code, record })
    }

    /// Starts what did not start of an attempt begun before (a launch that a crash or a
    /// control-plane error interrupted: executors make launching the same attempt again start
    /// only what is missing). Its run record was written then and stays as it was; it gets
    /// another job token (the replicas started before keep theirs; all of them die with the
    /// attempt).
    async fn resume(&self, job: &UnfinishedJob, attempt: i32) -> std::result::Result<serde_json::Value, LaunchFailure> {
        let inputs = self.inputs(job).await?;
        let token = self
            .store
            .attempt_prepare(job.id, job.tenant_id, attempt, &inputs.record)
            .await
            .map_err(|e| LaunchFailure::of_control_plane(e, "writing the run record and the job token"))?;
        self.start(job, attempt, inputs, token).await
    }

    /// Asks the executor to start the attempt's replicas; returns where they run.
    async fn start(
        &self,
        job: &UnfinishedJob,
        attempt: i32,
        inputs: LaunchInputs,
        token: String,
    ) -> std::result::Result<serde_json::Value, LaunchFailure> {
        let mut env = std::collections::BTreeMap::new();
        env.insert("TRAINYARD_URL".to_string(), self.api_url.clone());
        // MLflow's client logs into the job's own run (made with its first attempt, its id the
        // job's) with the job token, which reaches that run only (docs/tracking.md).
        env.insert("MLFLOW_TRACKING_URI".to_string(), self.api_url.clone());
        env.insert("MLFLOW_RUN_ID".to_string(), job.id.simple().to_string());
        env.insert("MLFLOW_TRACKING_TOKEN".to_string(), token.clone());
        // Every other rank logs with a token of its own, which tells the server its rank: rank
        // 0's writes are kept, the others' answered and dropped (docs/tracking.md, "Ranks").
        let env_by_rank = match &self.code_storage {
            Some(storage) => (0..job.spec.replicas)
                .map(|rank| match rank {
                    0 => Default::default(),
                    _ => [("MLFLOW_TRACKING_TOKEN".to_string(), storage.replica_token(&token, rank))].into(),
                })
                .collect(),
            None => Vec::new(),
        };
        env.insert("TRAINYARD_TOKEN".to_string(), token);
        // A session's program accepts only the secret the proxy sends (docs/sessions.md).
        if job.spec.template.as_ref().is_some_and(|t| t.name == crate::templates::NOTEBOOK_TEMPLATE)
            && let Some(storage) = &self.code_storage
        {
            env.insert("TRAINYARD_SESSION_SECRET".to_string(), storage.session_upstream_secret(job.id));
        }
        let request = LaunchRequest {
            job_id: job.id,
            tenant_id: job.tenant_id,
            tenant: job.tenant.clone(),
            attempt,
            spec: (*job.spec).clone(),
            files: inputs.files,
            env,
            env_by_rank,
            code: inputs.code,
            nodes: job.assigned_nodes.clone().unwrap_or_default(),
        };
        self.executor.launch(&request).await.map_err(|e| match e {
            ExecutorError::Unavailable(_) => LaunchFailure::ControlPlane(e.to_string()),
            other => LaunchFailure::Job(other.to_string()),
        })
    }

    fn interrupted(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, String>> {
        self.interrupted.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A control-plane error stopped a launch (of `attempt`, or before any was opened): nothing
    /// is charged to the job; a note says what is retried, and the next pass tries again.
    async fn control_plane_interrupted(&self, job: &UnfinishedJob, attempt: Option<i32>, error: String) {
        self.monitoring.executor_error("launch");
        tracing::warn!(job = %job.id, attempt, %error, "launch interrupted by a control-plane error; retrying");
        self.interrupted().insert(job.id, error.clone());
        // Best effort: with the database away this fails too, and the note is written when the
        // launch goes through.
        let note = format!("launch interrupted by a control-plane error, retrying: {error}");
        let _ = self.store.job_note(job.id, &note, ACTOR_RECONCILER).await;
    }

    /// Records how the launch of an attempt that is `starting` went: where it runs, once
    /// started. A failure of the launch itself (the executor refused it, the job's inputs are
    /// unusable) ends the attempt like a failed run; a control-plane error charges nothing to
    /// the job: it stays `starting`, a note says what is retried, and the next pass resumes the
    /// launch.
    async fn launch_ended(
        &self,
        job: &UnfinishedJob,
        attempt: i32,
        started: std::result::Result<serde_json::Value, LaunchFailure>,
    ) -> Result<()> {
        match started {
            Ok(placement) => {
                let recording = Instant::now();
                if let Err(err) = self.writes.placements.ask((job.id, attempt, placement)).await {
                    // Started but not recorded: the next pass resumes the launch and adopts it.
                    self.interrupted().insert(job.id, format!("storing where the attempt runs: {err}"));
                    return Err(err);
                }
                self.monitoring.launch_phase_observe("record", recording.elapsed());
                let interrupted = self.interrupted().remove(&job.id);
                if let Some(error) = interrupted {
                    let note = format!("launch resumed after a control-plane error: {error}");
                    self.store.job_note(job.id, &note, ACTOR_RECONCILER).await?;
                }
                tracing::info!(job = %job.id, attempt, "attempt launched");
            }
            Err(LaunchFailure::ControlPlane(error)) => self.control_plane_interrupted(job, Some(attempt), error).await,
            Err(LaunchFailure::Job(reason)) => {
                self.monitoring.executor_error("launch");
                let to = state_after_failure(job.restart_count, job.max_restarts);
                tracing::warn!(job = %job.id, attempt, %reason, "launch failed");
                self.store
                    .attempt_end(AttemptEnd {
                        job_id: job.id,
                        attempt,
                        exit_codes: &[],
                        image_digests: &[],
                        to,
                        reason: Some(&reason),
                        actor: ACTOR_EXECUTOR,
                    })
                    .await?;
            }
        }
        Ok(())
    }
}

/// Notes the attempt a launch opened, for garbage collection ([`Launcher::attempts_live`]).
fn registry_attempt_set(registry: &Mutex<Launches>, job_id: Uuid, attempt: i32) {
    if let Some(in_flight) = registry.lock().unwrap_or_else(PoisonError::into_inner).in_flight.get_mut(&job_id) {
        in_flight.attempt = Some(attempt);
    }
}

/// Why a launch did not go through.
enum LaunchFailure {
    /// The control plane could not prepare it (database, object store): retried, never charged
    /// to the job.
    ControlPlane(String),
    /// The executor refused or failed to start it: the attempt fails.
    Job(String),
}

impl LaunchFailure {
    fn of_control_plane(err: trainyard_core::Error, doing: &str) -> LaunchFailure {
        LaunchFailure::ControlPlane(format!("{doing}: {err}"))
    }
}
