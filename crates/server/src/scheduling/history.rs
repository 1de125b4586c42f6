//! Run-time guesses from history for start estimates: each unfinished job's class
//! ([`RunClass`]), the past runs of that class read from the store, and the scheduler's pure
//! [`guess_runtime`] over them.
//!
//! A class's runs are cached: the board is computed every few seconds and history moves slowly.
//! They are read again when a job of the class has finished since (it left the unfinished jobs
//! between two calls: the next estimate counts its run), and at the latest after [`FRESH_FOR`].

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use trainyard_core::Result;
use trainyard_core::job::JobSpec;
use trainyard_scheduler::{RuntimeFacts, RuntimeGuess, Settings, guess_runtime};
use trainyard_store::Store;
use trainyard_store::reconcile::{RunClass, UnfinishedJob};
use uuid::Uuid;

/// How long a class's past runs are reused before they are read again.
const FRESH_FOR: Duration = Duration::from_secs(60);

/// Classes read from the store in one board computation at most: a queue of thousands of
/// differently named jobs is read over a few boards, each job guessed from what it declares
/// until its class is read.
const CLASSES_READ_AT_ONCE: usize = 1_000;

/// Past runs by class, newest first: (who submitted it, seconds).
type Runs = Arc<[(Uuid, i64)]>;

/// The past runs of every class seen lately (see the module's documentation).
#[derive(Default)]
pub struct RunHistory {
    classes: Mutex<FxHashMap<RunClass, (Instant, Runs)>>,
    /// The unfinished jobs of the last call, with their classes: one gone since has finished.
    unfinished: Mutex<FxHashMap<Uuid, RunClass>>,
}

/// What a job's run time is guessed from besides history.
struct Declared<'a> {
    class: RunClass,
    /// "pytorch-ddp on 1 x 1 GPU", "job train-resnet on 2 x 8 GPUs".
    label: String,
    time_limit: Option<i64>,
    template_default: Option<(&'a str, i64)>,
}

impl RunHistory {
    /// Each job's run-time guess, by id. Reads the classes not read within [`FRESH_FOR`].
    pub async fn guesses(&self, store: &Store, jobs: &[Arc<UnfinishedJob>]) -> Result<FxHashMap<Uuid, RuntimeGuess>> {
        let declared: Vec<Declared<'_>> = jobs
            .iter()
            .map(|job| declared(job.tenant_id, &job.name, &job.spec, job.expected_runtime_seconds))
            .collect();
        self.forget_finished(jobs, &declared);
        let runs = self.runs_of(store, declared.iter().map(|d| &d.class)).await?;
        Ok(jobs
            .iter()
            .zip(&declared)
            .map(|(job, declared)| (job.id, guess(declared, runs.get(&declared.class), job.created_by)))
            .collect())
    }

    /// The guess for a job not submitted yet (a what-if) of `user`.
    pub async fn guess_for(
        &self,
        store: &Store,
        tenant_id: Uuid,
        user: Uuid,
        name: &str,
        spec: &JobSpec,
        expected_runtime: Option<u32>,
    ) -> Result<RuntimeGuess> {
        let declared = declared(tenant_id, name, spec, expected_runtime.map(|s| s as i32));
        let runs = self.runs_of(store, std::iter::once(&declared.class)).await?;
        Ok(guess(&declared, runs.get(&declared.class), user))
    }

    /// Drops the cached runs of every class a job of which has finished since the last call.
    fn forget_finished(&self, jobs: &[Arc<UnfinishedJob>], declared: &[Declared<'_>]) {
        let now: FxHashMap<Uuid, RunClass> =
            jobs.iter().zip(declared).map(|(job, d)| (job.id, d.class.clone())).collect();
        let before = std::mem::replace(&mut *self.unfinished.lock().unwrap_or_else(PoisonError::into_inner), now);
        let jobs: rustc_hash::FxHashSet<Uuid> = jobs.iter().map(|job| job.id).collect();
        let mut cache = self.classes.lock().unwrap_or_else(PoisonError::into_inner);
        for (id, class) in before {
            if !jobs.contains(&id) {
                cache.remove(&class);
            }
        }
    }

    /// The past runs of `classes`: from the cache when fresh, else read (up to
    /// [`CLASSES_READ_AT_ONCE`] of them).
    async fn runs_of<'a>(
        &self,
        store: &Store,
        classes: impl Iterator<Item = &'a RunClass>,
    ) -> Result<FxHashMap<RunClass, Runs>> {
        let now = Instant::now();
        let mut found: FxHashMap<RunClass, Runs> = FxHashMap::default();
        let mut missing: Vec<RunClass> = Vec::new();
        {
            let cache = self.classes.lock().unwrap_or_else(PoisonError::into_inner);
            for class in classes {
                if found.contains_key(class) || missing.contains(class) {
                    continue;
                }
                match cache.get(class) {
                    Some((read_at, runs)) if now.duration_since(*read_at) < FRESH_FOR => {
                        found.insert(class.clone(), Arc::clone(runs));
                    }
                    Some((_, runs)) => {
                        // Stale: used this time, read again.
                        found.insert(class.clone(), Arc::clone(runs));
                        missing.push(class.clone());
                    }
                    None => missing.push(class.clone()),
                }
                if missing.len() >= CLASSES_READ_AT_ONCE {
                    break;
                }
            }
        }
        if missing.is_empty() {
            return Ok(found);
        }
        let mut read: Vec<Vec<(Uuid, i64)>> = vec![Vec::new(); missing.len()];
        for run in store.runtimes_recent(&missing).await? {
            if let Some(runs) = usize::try_from(run.class).ok().and_then(|i| read.get_mut(i)) {
                runs.push((run.created_by, run.seconds));
            }
        }
        let mut cache = self.classes.lock().unwrap_or_else(PoisonError::into_inner);
        // Classes of jobs long gone are dropped, so the cache holds what the queue needs.
        cache.retain(|_, (read_at, _)| now.duration_since(*read_at) < FRESH_FOR * 10);
        for (class, runs) in missing.into_iter().zip(read) {
            let runs: Runs = runs.into();
            cache.insert(class.clone(), (now, Arc::clone(&runs)));
            found.insert(class, runs);
        }
        Ok(found)
    }
}

/// The class of a job and what it declares of its run time. A template job's stored expected
/// run time is its template's (`expected_runtime` in the manifest); any other job's is its time
/// limit.
fn declared<'a>(tenant_id: Uuid, name: &str, spec: &'a JobSpec, expected: Option<i32>) -> Declared<'a> {
    let (replicas, gpus) = (spec.replicas, spec.resources.gpus);
    let shape = format!("{replicas} x {gpus} GPU{}", if gpus == 1 { "" } else { "s" });
    let template = spec.template.as_ref().map(|t| t.name.as_str());
    let label = match template {
        Some(template) => format!("{template} on {shape}"),
        None => format!("jobs named {name} on {shape}"),
    };
    Declared {
        class: RunClass {
            tenant_id,
            template: template.map(str::to_string),
            name: template.is_none().then(|| name.to_string()),
            replicas: replicas as i32,
            gpus: gpus as i32,
        },
        label,
        time_limit: spec.time_limit_seconds.map(i64::from),
        template_default: template.zip(expected.filter(|_| template.is_some()).map(i64::from)),
    }
}

fn guess(declared: &Declared<'_>, runs: Option<&Runs>, user: Uuid) -> RuntimeGuess {
    let runs: &[(Uuid, i64)] = runs.map_or(&[], |r| r);
    let tenant_runs: Vec<i64> = runs.iter().map(|(_, s)| *s).collect();
    let user_runs: Vec<i64> = runs.iter().filter(|(by, _)| *by == user).map(|(_, s)| *s).collect();
    let facts = RuntimeFacts {
        class: &declared.label,
        user_runs: &user_runs,
        tenant_runs: &tenant_runs,
        time_limit: declared.time_limit,
        template_default: declared.template_default,
    };
    guess_runtime(&facts, Settings::default().default_runtime_secs)
}

/// Sets every job's expected run time in `snapshot` to its guess.
pub fn apply(snapshot: &mut trainyard_scheduler::Snapshot, guesses: &FxHashMap<Uuid, RuntimeGuess>) {
    for job in &mut snapshot.running {
        if let Some(guess) = guesses.get(&job.id) {
            job.expected_runtime = Some(guess.seconds);
        }
    }
    for job in snapshot.pending.iter_mut().chain(snapshot.held.iter_mut().map(|h| &mut h.job)) {
        if let Some(guess) = guesses.get(&job.id) {
            job.expected_runtime = Some(guess.seconds);
        }
    }
}
