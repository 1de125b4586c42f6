//! The schedule board: why every queued job waits, where it stands and when it should start,
//! computed for all of them at once and shared by every reader for a short while.
//!
//! Answering one job's "when" means simulating the whole cluster forward (an admission cycle
//! per expected job end), which costs the same for one job as for all. Computing it per request
//! made each open job page (polled every 2 s) and each API client pay for a full simulation; at
//! a queue of tens of thousands that is hundreds of milliseconds of CPU a request. The board
//! computes once and serves everyone until it is stale: older than its maximum age, or older
//! than a change this server made that scheduling sees (a submit, a cancel, a quota, a
//! reconciler pass that admitted, ended or preempted something). Requests that arrive while it
//! is being computed wait for that one computation instead of starting their own. Changes made
//! by another server replica show within the maximum age.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use trainyard_core::{Error, Result};
use trainyard_scheduler::{CycleOptions, Pending, Snapshot, estimate_starts, run_cycle};
use uuid::Uuid;

/// How long readers may share one answer by default: the dashboard's polling interval.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(2);

/// One queued job's standing.
#[derive(Debug, Clone)]
pub struct Standing {
    /// Admitted by the very next cycle.
    pub admitted_now: bool,
    /// Why it waits and where it stands, unless admitted now.
    pub pending: Option<Pending>,
    /// Seconds since the epoch; `None` when beyond the simulated horizon.
    pub estimated_start: Option<i64>,
}

/// Every job's standing as of one snapshot.
#[derive(Debug, Default)]
pub struct Board {
    jobs: HashMap<Uuid, Standing>,
}

impl Board {
    /// Runs the cycle and the forward simulation over `snapshot`. CPU-bound: call it off the
    /// async runtime.
    pub fn compute(snapshot: &Snapshot) -> Board {
        let result = run_cycle(snapshot, CycleOptions::default());
        let starts = estimate_starts(snapshot);
        let mut jobs = HashMap::with_capacity(snapshot.pending.len());
        for admission in &result.admissions {
            jobs.insert(
                admission.job,
                Standing { admitted_now: true, pending: None, estimated_start: Some(snapshot.now) },
            );
        }
        for pending in result.pending {
            let estimated_start = starts.get(&pending.job).copied().flatten();
            jobs.insert(pending.job, Standing { admitted_now: false, pending: Some(pending), estimated_start });
        }
        Board { jobs }
    }

    /// The job's standing; `None` when the snapshot did not hold it (it is not queued, or it
    /// is deeper in its tenant's queue than the scheduler looks).
    pub fn standing(&self, job: Uuid) -> Option<&Standing> {
        self.jobs.get(&job)
    }
}

/// The shared board and what makes it stale.
pub struct ScheduleBoard {
    max_age: Duration,
    /// Bumped by every change this server makes that scheduling sees.
    epoch: AtomicU64,
    /// The latest board, with the epoch and instant it was computed at. The lock is held
    /// while computing: concurrent readers wait for one computation.
    current: tokio::sync::Mutex<Option<(u64, Instant, Arc<Board>)>>,
}

impl ScheduleBoard {
    /// A board reused for at most `max_age` (zero: every read computes afresh).
    pub fn new(max_age: Duration) -> ScheduleBoard {
        ScheduleBoard { max_age, epoch: AtomicU64::new(0), current: tokio::sync::Mutex::new(None) }
    }

    /// Marks every board computed so far as stale.
    pub fn changed(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// The current board: the shared one while fresh, else one computed from `load`'s snapshot.
    pub async fn get<F>(&self, load: F) -> Result<Arc<Board>>
    where
        F: Future<Output = Result<Snapshot>>,
    {
        let mut current = self.current.lock().await;
        // Read before loading: a change made while loading leaves this board stale.
        let epoch = self.epoch.load(Ordering::SeqCst);
        if let Some((at_epoch, at, board)) = current.as_ref()
            && *at_epoch == epoch
            && at.elapsed() < self.max_age
        {
            return Ok(Arc::clone(board));
        }
        let started = Instant::now();
        let snapshot = load.await?;
        let board = tokio::task::spawn_blocking(move || Board::compute(&snapshot))
            .await
            .map_err(|err| Error::internal(format!("computing the schedule board: {err}")))?;
        let board = Arc::new(board);
        tracing::debug!(jobs = board.jobs.len(), took = ?started.elapsed(), "schedule board computed");
        *current = Some((epoch, Instant::now(), Arc::clone(&board)));
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

    fn snapshot() -> Snapshot {
        Snapshot {
            now: 1_000,
            nodes: Vec::new(),
            tenants: Vec::new(),
            running: Vec::new(),
            pending: Vec::new(),
            settings: Default::default(),
        }
    }

    /// Counts how often the board loads a snapshot.
    async fn read(board: &ScheduleBoard, loads: &AtomicUsize) {
        board
            .get(async {
                loads.fetch_add(1, Ordering::SeqCst);
                Ok(snapshot())
            })
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn readers_share_a_fresh_board_and_a_change_makes_it_stale() {
        let board = ScheduleBoard::new(Duration::from_secs(60));
        let loads = AtomicUsize::new(0);
        read(&board, &loads).await;
        read(&board, &loads).await;
        assert_eq!(loads.load(Ordering::SeqCst), 1, "the second read reuses the first board");
        board.changed();
        read(&board, &loads).await;
        assert_eq!(loads.load(Ordering::SeqCst), 2, "a change forces a new board");
    }

    #[tokio::test]
    async fn concurrent_readers_wait_for_one_computation() {
        let board = ScheduleBoard::new(Duration::from_secs(60));
        let loads = AtomicUsize::new(0);
        tokio::join!(read(&board, &loads), read(&board, &loads), read(&board, &loads));
        assert_eq!(loads.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_zero_max_age_computes_every_time() {
        let board = ScheduleBoard::new(Duration::ZERO);
        let loads = AtomicUsize::new(0);
        read(&board, &loads).await;
        read(&board, &loads).await;
        assert_eq!(loads.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_failed_load_is_an_error_and_keeps_nothing() {
        let board = ScheduleBoard::new(Duration::from_secs(60));
        let failed = board.get(async { Err(Error::internal("database away")) }).await;
        assert!(failed.is_err());
        let loads = AtomicUsize::new(0);
        read(&board, &loads).await;
        assert_eq!(loads.load(Ordering::SeqCst), 1, "the next read loads");
    }
}
