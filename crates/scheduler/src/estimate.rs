//! Start-time estimates: simulate forward from now on a virtual clock. Running jobs end at their
//! expected end (start plus declared run time, or the default); at each end, an admission cycle
//! (without preemption) runs over what still waits; a job's estimate is the first simulated
//! cycle that admits it. Estimates assume no new submissions and jobs that end on time, like
//! Slurm's: a forecast, recomputed whenever asked.

use std::collections::BTreeMap;
use std::sync::Arc;

use uuid::Uuid;

use crate::cycle::{CycleOptions, run_cycle};
use crate::decision::Pending;
use crate::model::{PendingJob, RunningJob, Snapshot};

/// When each waiting job is expected to start (`None`: not within the simulated horizon).
pub fn estimate_starts(snap: &Snapshot) -> BTreeMap<Uuid, Option<i64>> {
    estimate_starts_explained(snap).into_iter().map(|(job, start)| (job, start.map(|s| s.at))).collect()
}

/// A waiting job's expected start, and what it waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedStart {
    /// Seconds since the epoch.
    pub at: i64,
    /// The jobs whose expected end makes the room it starts in (all that end at that instant;
    /// jobs queued now among them when it waits down a line of them); empty when it is
    /// admitted by the next cycle. Shared by the jobs that start at the same instant.
    pub after: Arc<[Uuid]>,
}

/// [`estimate_starts`], with each start's reason: the jobs whose end it waits for.
pub fn estimate_starts_explained(snap: &Snapshot) -> BTreeMap<Uuid, Option<ExpectedStart>> {
    let mut sim = snap.clone();
    let mut starts: BTreeMap<Uuid, Option<ExpectedStart>> = snap.pending.iter().map(|j| (j.id, None)).collect();
    let options = CycleOptions { preempt: false, reserve: true };
    let end_of = |r: &RunningJob, now: i64| {
        (r.started_at + r.expected_runtime.unwrap_or(snap.settings.default_runtime_secs)).max(now)
    };
    let mut ended: Arc<[Uuid]> = Arc::from(Vec::new());
    for _ in 0..snap.settings.estimate_steps {
        let result = run_cycle(&sim, options);
        for admission in &result.admissions {
            starts.insert(admission.job, Some(ExpectedStart { at: sim.now, after: Arc::clone(&ended) }));
        }
        sim.apply(&result, u64::MAX);
        if sim.pending.is_empty() {
            break;
        }
        let Some(next) = sim.running.iter().map(|r| end_of(r, sim.now)).min() else { break };
        sim.now = next.max(sim.now + 1);
        let now = sim.now;
        let (gone, running): (Vec<RunningJob>, Vec<RunningJob>) =
            sim.running.drain(..).partition(|r| end_of(r, now) <= now);
        sim.running = running;
        ended = gone.iter().map(|r| r.id).collect();
    }
    starts
}

/// An answer to "if I submitted this now".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Estimate {
    /// Admitted by the very next cycle.
    pub admitted_now: bool,
    /// Where it would wait and why, when not admitted at once.
    pub pending: Option<Pending>,
    /// Seconds since the epoch; `None` when no start is within the simulated horizon.
    pub estimated_start: Option<i64>,
    /// The running jobs it would preempt: it starts once they have stopped, within their grace
    /// period ([`crate::Settings::stop_grace_secs`]).
    pub preempts: Vec<Uuid>,
    /// The jobs whose expected end it would wait for (see [`ExpectedStart::after`]).
    pub waits_for: Arc<[Uuid]>,
}

/// What would happen to `job` were it submitted into `snap` now. Queues nothing.
pub fn what_if(snap: &Snapshot, job: PendingJob) -> Estimate {
    let id = job.id;
    let mut with_job = snap.clone();
    with_job.pending.push(job);
    let result = run_cycle(&with_job, CycleOptions::default());
    let admitted_now = result.admissions.iter().any(|a| a.job == id);
    let preempts: Vec<Uuid> = result.preemptions.iter().filter(|p| p.for_job == id).map(|p| p.victim).collect();
    let pending = result.pending.into_iter().find(|p| p.job == id);
    let (estimated_start, waits_for) = if admitted_now {
        (Some(snap.now), Arc::from(Vec::new()))
    } else if !preempts.is_empty() {
        // The victims stop within their grace period, and the room is this job's meanwhile.
        (Some(snap.now + snap.settings.stop_grace_secs), Arc::from(Vec::new()))
    } else {
        match estimate_starts_explained(&with_job).remove(&id).flatten() {
            Some(start) => (Some(start.at), start.after),
            None => (None, Arc::from(Vec::new())),
        }
    };
    Estimate { admitted_now, pending, estimated_start, preempts, waits_for }
}
