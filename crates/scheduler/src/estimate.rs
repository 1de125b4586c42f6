//! Start-time estimates: simulate forward from now on a virtual clock. Running jobs end at their
//! expected end (start plus declared run time, or the default); at each end, an admission cycle
//! (without preemption) runs over what still waits; a job's estimate is the first simulated
//! cycle that admits it. Estimates assume no new submissions and jobs that end on time, like
//! Slurm's: a forecast, recomputed whenever asked.

use std::collections::BTreeMap;

use uuid::Uuid;

use crate::cycle::{CycleOptions, run_cycle};
use crate::decision::Pending;
use crate::model::{PendingJob, RunningJob, Snapshot};

/// When each waiting job is expected to start (`None`: not within the simulated horizon).
pub fn estimate_starts(snap: &Snapshot) -> BTreeMap<Uuid, Option<i64>> {
    let mut sim = snap.clone();
    let mut starts: BTreeMap<Uuid, Option<i64>> = snap.pending.iter().map(|j| (j.id, None)).collect();
    let options = CycleOptions { preempt: false, reserve: true };
    let end_of = |r: &RunningJob, now: i64| {
        (r.started_at + r.expected_runtime.unwrap_or(snap.settings.default_runtime_secs)).max(now)
    };
    for _ in 0..snap.settings.estimate_steps {
        let result = run_cycle(&sim, options);
        for admission in &result.admissions {
            starts.insert(admission.job, Some(sim.now));
        }
        sim.apply(&result, u64::MAX);
        if sim.pending.is_empty() {
            break;
        }
        let Some(next) = sim.running.iter().map(|r| end_of(r, sim.now)).min() else { break };
        sim.now = next.max(sim.now + 1);
        let now = sim.now;
        sim.running.retain(|r| end_of(r, now) > now);
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
}

/// What would happen to `job` were it submitted into `snap` now. Queues nothing.
pub fn what_if(snap: &Snapshot, job: PendingJob) -> Estimate {
    let id = job.id;
    let mut with_job = snap.clone();
    with_job.pending.push(job);
    let result = run_cycle(&with_job, CycleOptions::default());
    let admitted_now = result.admissions.iter().any(|a| a.job == id);
    let pending = result.pending.into_iter().find(|p| p.job == id);
    let estimated_start =
        if admitted_now { Some(snap.now) } else { estimate_starts(&with_job).get(&id).copied().flatten() };
    Estimate { admitted_now, pending, estimated_start }
}
