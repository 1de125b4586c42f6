//! The schedule board: why every queued job waits, where it stands and when it should start,
//! computed for all of them at once and shared by every reader.
//!
//! Answering one job's "when" means simulating the whole cluster forward (an admission cycle
//! per expected job end), which costs the same for one job as for all. Computing it per request
//! made each open job page (polled every 2 s) and each API client pay for a full simulation; at
//! a queue of tens of thousands that is hundreds of milliseconds of CPU a request. The board
//! computes once, with the queue view ready to serve, and every reader shares it.
//!
//! How fresh an answer is:
//! - A change this server made that scheduling sees (a submit, a cancel, a quota, a reconciler
//!   pass that admitted, ended or preempted something) retires every board computed before it:
//!   the next reader waits for a new one, so a user always sees their own change.
//! - Otherwise a board is fresh for its maximum age (2 s). Past it, for up to
//!   [`STALE_SERVED_FOR`] more, a reader gets it at once, with the time it was computed
//!   (`as_of`), and a new one is computed behind it: stale-while-revalidate, as HTTP caches do.
//!   No reader waits for a simulation only because time passed. A board older than that (no
//!   reader for a while) is not served: the reader waits for a new one.
//! - One computation runs at a time; readers that must wait share it. Changes made by another
//!   server replica show in the next board computed after them: within the maximum age plus
//!   one computation while readers keep coming.

use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use trainyard_core::api::{Blocker, Queue, QueueEntry, Schedule};
use trainyard_core::job::JobState;
use trainyard_core::{Error, Result};
use trainyard_scheduler::{CycleOptions, Pending, RuntimeGuess, Snapshot, estimate_starts_explained, run_cycle};
use trainyard_store::reconcile::UnfinishedJob;
use uuid::Uuid;

/// How long readers may share one answer as fresh by default: the dashboard's polling interval.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(2);

/// How long past its maximum age a board is still served while a newer one is computed.
pub const STALE_SERVED_FOR: Duration = Duration::from_secs(30);

/// One queued job's standing.
#[derive(Debug, Clone)]
pub struct Standing {
    /// Admitted by the very next cycle.
    pub admitted_now: bool,
    /// Why it waits and where it stands, unless admitted now.
    pub pending: Option<Pending>,
    /// Seconds since the epoch; `None` when beyond the simulated horizon.
    pub estimated_start: Option<i64>,
    /// The jobs whose expected end its estimated start waits for (shared by the jobs that
    /// start at the same instant).
    pub after: Arc<[Uuid]>,
    /// Held out of admission (a chain's dependencies, an array's limit), and why.
    pub held: Option<String>,
}

impl Standing {
    pub fn schedule(&self) -> Schedule {
        let mut schedule = schedule_of(self.admitted_now, self.pending.as_ref(), self.estimated_start);
        if let Some(held) = &self.held {
            schedule.reason = Some(held.clone());
        }
        schedule
    }
}

/// The API's answer for a job admitted now or waiting with `pending`, estimated to start at
/// `estimate` (seconds since the epoch).
pub fn schedule_of(admitted_now: bool, pending: Option<&Pending>, estimate: Option<i64>) -> Schedule {
    Schedule {
        admitted_now,
        reason: pending.map(|p| p.reason.to_string()),
        tenant_position: pending.map(|p| p.tenant_position),
        cluster_position: pending.map(|p| p.cluster_position),
        behind_higher_priority: pending.map_or(0, |p| p.behind_higher_priority),
        estimated_start: estimate.and_then(|s| DateTime::from_timestamp(s, 0)),
        ..Schedule::default()
    }
}

/// A job that `tenant`'s waiting job waits for, as that tenant may see it: its own jobs by id
/// and name, another tenant's by the tenant's name only.
pub fn blocker(job: &UnfinishedJob, tenant: Uuid, guess: Option<&RuntimeGuess>) -> Blocker {
    let ours = job.tenant_id == tenant;
    Blocker {
        job: ours.then_some(job.id),
        name: ours.then(|| job.name.clone()),
        tenant: (!ours).then(|| job.tenant.clone()),
        state: job.state.as_str().to_string(),
        assuming: guess.map(ToString::to_string).unwrap_or_default(),
    }
}

/// What a board is computed from: the scheduler's snapshot and the unfinished jobs it was built
/// from (their names and tenants, for the queue view), with each job's run-time guess (already
/// the snapshot's expected run times; kept to say what each estimate assumes).
pub struct BoardInput {
    pub snapshot: Snapshot,
    pub jobs: Vec<Arc<UnfinishedJob>>,
    pub guesses: FxHashMap<Uuid, RuntimeGuess>,
    /// The queued jobs held out of the cycle ([`Snapshot::held`]), with why.
    pub held: FxHashMap<Uuid, String>,
}

/// Every job's standing as of one snapshot.
#[derive(Debug, Default)]
pub struct Board {
    jobs: FxHashMap<Uuid, Standing>,
    /// The queue view, built once per board: every queued job with a standing, those admitted
    /// by the next cycle first, then by position in the cluster's queue; with its tenant's id.
    queue: Vec<(Uuid, QueueEntry)>,
    /// Every unfinished job the snapshot held, for naming what a job waits for.
    unfinished: FxHashMap<Uuid, Arc<UnfinishedJob>>,
    guesses: FxHashMap<Uuid, RuntimeGuess>,
    as_of: DateTime<Utc>,
}

impl Board {
    /// Runs the cycle and the forward simulation over the snapshot. CPU-bound: call it off the
    /// async runtime.
    pub fn compute(input: &BoardInput) -> Board {
        let snapshot = &input.snapshot;
        let result = run_cycle(snapshot, CycleOptions::default());
        let starts = estimate_starts_explained(snapshot);
        let mut jobs = FxHashMap::with_capacity_and_hasher(snapshot.pending.len(), Default::default());
        let none: Arc<[Uuid]> = Arc::from(Vec::new());
        for admission in &result.admissions {
            jobs.insert(
                admission.job,
                Standing {
                    admitted_now: true,
                    pending: None,
                    estimated_start: Some(snapshot.now),
                    after: Arc::clone(&none),
                    held: None,
                },
            );
        }
        for pending in result.pending {
            let start = starts.get(&pending.job).cloned().flatten();
            let (estimated_start, after) = match start {
                Some(start) => (Some(start.at), start.after),
                None => (None, Arc::clone(&none)),
            };
            jobs.insert(
                pending.job,
                Standing { admitted_now: false, pending: Some(pending), estimated_start, after, held: None },
            );
        }
        for held in &snapshot.held {
            let id = held.job.id;
            let (estimated_start, after) = match starts.get(&id).cloned().flatten() {
                Some(start) => (Some(start.at), start.after),
                None => (None, Arc::clone(&none)),
            };
            let reason = input.held.get(&id).cloned().unwrap_or_else(|| "waiting for other jobs".into());
            jobs.insert(
                id,
                Standing { admitted_now: false, pending: None, estimated_start, after, held: Some(reason) },
            );
        }
        let mut queue: Vec<(Uuid, QueueEntry)> = input
            .jobs
            .iter()
            .filter(|job| job.state == JobState::Queued)
            .filter_map(|job| {
                let standing = jobs.get(&job.id)?;
                let entry = QueueEntry {
                    id: job.id,
                    name: job.name.clone(),
                    tenant: job.tenant.clone(),
                    priority: job.priority,
                    created_at: job.created_at,
                    schedule: standing.schedule(),
                };
                Some((job.tenant_id, entry))
            })
            .collect();
        // Held jobs (no place in the cluster's queue yet) last, by their expected start.
        queue.sort_by_key(|(_, e)| {
            (!e.schedule.admitted_now, e.schedule.cluster_position.unwrap_or(usize::MAX), e.schedule.estimated_start)
        });
        Board {
            jobs,
            queue,
            unfinished: input.jobs.iter().map(|job| (job.id, Arc::clone(job))).collect(),
            guesses: input.guesses.clone(),
            as_of: DateTime::from_timestamp(snapshot.now, 0).unwrap_or_default(),
        }
    }

    /// The job's standing; `None` when the snapshot did not hold it (it is not queued, or it
    /// is deeper in its tenant's queue than the scheduler looks).
    pub fn standing(&self, job: Uuid) -> Option<&Standing> {
        self.jobs.get(&job)
    }

    /// The job's schedule, with what its estimate assumes: its own run-time guess, and the jobs
    /// it waits for (another tenant's named by tenant only); `None` as for [`Board::standing`].
    pub fn schedule(&self, job: Uuid) -> Option<Schedule> {
        let standing = self.jobs.get(&job)?;
        let mut schedule = standing.schedule();
        schedule.runtime_assumed = self.guesses.get(&job).map(ToString::to_string);
        let tenant = self.unfinished.get(&job).map(|j| j.tenant_id);
        if !standing.admitted_now {
            schedule.waits_for = standing
                .after
                .iter()
                .take(Schedule::WAITS_FOR_SHOWN)
                .filter_map(|id| Some(blocker(self.unfinished.get(id)?, tenant?, self.guesses.get(id))))
                .collect();
            schedule.waits_for_more = standing.after.len().saturating_sub(schedule.waits_for.len());
        }
        Some(schedule)
    }

    /// The waiting jobs of `tenant` (of every tenant when `every_tenant`), in the scheduler's
    /// order, and how many of other tenants wait.
    pub fn queue_for(&self, tenant: Uuid, every_tenant: bool) -> Queue {
        let mut items = Vec::new();
        let mut others_waiting = 0;
        for (owner, entry) in &self.queue {
            if every_tenant || *owner == tenant {
                items.push(entry.clone());
            } else {
                others_waiting += 1;
            }
        }
        Queue { items, others_waiting, as_of: self.as_of }
    }

    /// When the snapshot it was computed from was taken.
    pub fn as_of(&self) -> DateTime<Utc> {
        self.as_of
    }
}

/// A computed board, with the change epoch and the instant its snapshot was loaded at.
struct Computed {
    epoch: u64,
    loaded: Instant,
    board: Arc<Board>,
}

/// The shared board and what makes it stale.
pub struct ScheduleBoard {
    max_age: Duration,
    /// How long past `max_age` the latest board is served while a new one is computed.
    stale_for: Duration,
    /// Bumped by every change this server makes that scheduling sees.
    epoch: AtomicU64,
    /// The latest board. Read without waiting for a computation in progress.
    latest: Mutex<Option<Arc<Computed>>>,
    /// Held while computing: one computation at a time.
    computing: Arc<tokio::sync::Mutex<()>>,
}

impl ScheduleBoard {
    /// A board fresh for `max_age`, then served for [`STALE_SERVED_FOR`] more while it is
    /// recomputed (zero: every read computes afresh, nothing is served stale).
    pub fn new(max_age: Duration) -> ScheduleBoard {
        ScheduleBoard {
            max_age,
            stale_for: if max_age.is_zero() { Duration::ZERO } else { STALE_SERVED_FOR },
            epoch: AtomicU64::new(0),
            latest: Mutex::new(None),
            computing: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// Serves a board for `stale_for` past its maximum age (instead of [`STALE_SERVED_FOR`]).
    pub fn serving_stale_for(mut self, stale_for: Duration) -> ScheduleBoard {
        self.stale_for = stale_for;
        self
    }

    /// Marks every board computed so far as stale.
    pub fn changed(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }

    fn latest(&self) -> Option<Arc<Computed>> {
        self.latest.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The board to answer with: the latest while fresh, or while aged but within the stale
    /// window (a new one is then computed in the background from `load`'s input); else one
    /// computed now, which the reader waits for.
    pub async fn get<F, Fut>(self: &Arc<Self>, load: F) -> Result<Arc<Board>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<BoardInput>> + Send + 'static,
    {
        let epoch = self.epoch.load(Ordering::SeqCst);
        if let Some(latest) = self.latest()
            && latest.epoch == epoch
        {
            let age = latest.loaded.elapsed();
            if age < self.max_age {
                return Ok(Arc::clone(&latest.board));
            }
            if age < self.max_age + self.stale_for {
                self.refresh_behind(load);
                return Ok(Arc::clone(&latest.board));
            }
        }
        let _one_at_a_time = self.computing.lock().await;
        // Read before loading: a change made while loading leaves the new board stale.
        let epoch = self.epoch.load(Ordering::SeqCst);
        if let Some(latest) = self.latest()
            && latest.epoch == epoch
            && latest.loaded.elapsed() < self.max_age
        {
            // Computed while this reader waited.
            return Ok(Arc::clone(&latest.board));
        }
        self.compute(epoch, load()).await
    }

    /// Computes a new board in the background, unless one is being computed already.
    fn refresh_behind<F, Fut>(self: &Arc<Self>, load: F)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<BoardInput>> + Send + 'static,
    {
        let Ok(one_at_a_time) = Arc::clone(&self.computing).try_lock_owned() else {
            return;
        };
        let epoch = self.epoch.load(Ordering::SeqCst);
        let input = load();
        let board = Arc::clone(self);
        tokio::spawn(async move {
            let _one_at_a_time = one_at_a_time;
            if let Err(err) = board.compute(epoch, input).await {
                // The aged board is served until its stale window ends; then readers wait for
                // (and see the error of) a computation of their own.
                tracing::warn!(%err, "cannot refresh the schedule board");
            }
        });
    }

    /// Loads, computes off the async workers, and keeps the result as the latest board. The
    /// caller holds `computing`.
    async fn compute(&self, epoch: u64, input: impl Future<Output = Result<BoardInput>>) -> Result<Arc<Board>> {
        let loaded = Instant::now();
        let input = input.await?;
        let board = tokio::task::spawn_blocking(move || Board::compute(&input))
            .await
            .map_err(|err| Error::internal(format!("computing the schedule board: {err}")))?;
        let board = Arc::new(board);
        tracing::debug!(jobs = board.jobs.len(), took = ?loaded.elapsed(), "schedule board computed");
        let computed = Arc::new(Computed { epoch, loaded, board: Arc::clone(&board) });
        *self.latest.lock().unwrap_or_else(PoisonError::into_inner) = Some(computed);
        Ok(board)
    }
}

impl Default for ScheduleBoard {
    fn default() -> Self {
        ScheduleBoard::new(DEFAULT_MAX_AGE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Boards told apart by their snapshot's time: the n-th load is at second n.
    fn input(n: usize) -> BoardInput {
        BoardInput {
            snapshot: Snapshot {
                now: n as i64,
                nodes: Vec::new(),
                tenants: Vec::new(),
                running: Vec::new(),
                pending: Vec::new(),
                settings: Default::default(),
                nominated: Vec::new(),
                held: Vec::new(),
                arrays: Vec::new(),
            },
            jobs: Vec::new(),
            guesses: Default::default(),
            held: Default::default(),
        }
    }

    /// Reads the board, counting loads; returns which load the answer came from.
    async fn read(board: &Arc<ScheduleBoard>, loads: &Arc<AtomicUsize>) -> i64 {
        let loads = Arc::clone(loads);
        let answer = board
            .get(move || async move {
                let n = loads.fetch_add(1, Ordering::SeqCst) + 1;
                Ok(input(n))
            })
            .await
            .unwrap();
        answer.as_of().timestamp()
    }

    fn counter() -> Arc<AtomicUsize> {
        Arc::new(AtomicUsize::new(0))
    }

    #[tokio::test]
    async fn readers_share_a_fresh_board_and_a_change_makes_it_stale() {
        let board = Arc::new(ScheduleBoard::new(Duration::from_secs(60)));
        let loads = counter();
        read(&board, &loads).await;
        read(&board, &loads).await;
        assert_eq!(loads.load(Ordering::SeqCst), 1, "the second read reuses the first board");
        board.changed();
        assert_eq!(read(&board, &loads).await, 2, "a change: the reader waits for a new board");
    }

    #[tokio::test]
    async fn concurrent_readers_wait_for_one_computation() {
        let board = Arc::new(ScheduleBoard::new(Duration::from_secs(60)));
        let loads = counter();
        tokio::join!(read(&board, &loads), read(&board, &loads), read(&board, &loads));
        assert_eq!(loads.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_zero_max_age_computes_every_time() {
        let board = Arc::new(ScheduleBoard::new(Duration::ZERO));
        let loads = counter();
        assert_eq!(read(&board, &loads).await, 1);
        assert_eq!(read(&board, &loads).await, 2, "nothing is served stale");
    }

    #[tokio::test]
    async fn a_failed_load_is_an_error_and_keeps_nothing() {
        let board = Arc::new(ScheduleBoard::new(Duration::from_secs(60)));
        let failed = board.get(|| async { Err(Error::internal("database away")) }).await;
        assert!(failed.is_err());
        let loads = counter();
        read(&board, &loads).await;
        assert_eq!(loads.load(Ordering::SeqCst), 1, "the next read loads");
    }

    #[tokio::test]
    async fn an_aged_board_is_served_at_once_and_replaced_behind_it() {
        let board = Arc::new(ScheduleBoard::new(Duration::from_millis(10)).serving_stale_for(Duration::from_secs(60)));
        let loads = counter();
        assert_eq!(read(&board, &loads).await, 1);
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The refresh's load cannot finish until the gate opens: the reader must not wait for it.
        let gate = Arc::new(tokio::sync::Notify::new());
        let (opened, refreshed) = (Arc::clone(&gate), Arc::clone(&loads));
        let aged = tokio::time::timeout(
            Duration::from_secs(5),
            board.get(move || async move {
                opened.notified().await;
                Ok(input(refreshed.fetch_add(1, Ordering::SeqCst) + 1))
            }),
        )
        .await
        .expect("an aged board is served without waiting for the next");
        assert_eq!(aged.unwrap().as_of().timestamp(), 1, "the aged board, with its time");
        gate.notify_one();
        for _ in 0..500 {
            if read(&board, &loads).await >= 2 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the board computed behind the aged one was never served");
    }

    #[tokio::test]
    async fn a_change_is_never_answered_with_an_aged_board() {
        let board = Arc::new(ScheduleBoard::new(Duration::from_millis(10)).serving_stale_for(Duration::from_secs(60)));
        let loads = counter();
        read(&board, &loads).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        board.changed();
        assert_eq!(read(&board, &loads).await, 2);
    }

    #[tokio::test]
    async fn a_board_past_its_stale_window_is_not_served() {
        let board =
            Arc::new(ScheduleBoard::new(Duration::from_millis(10)).serving_stale_for(Duration::from_millis(10)));
        let loads = counter();
        read(&board, &loads).await;
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert_eq!(read(&board, &loads).await, 2, "the reader waits for a new board");
    }
}
