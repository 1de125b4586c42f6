//! Start-time estimates: simulate forward from now on a virtual clock. Running jobs end at their
//! expected end (start plus declared run time, or the default); at each end, an admission cycle
//! (without preemption) runs over what still waits; a job's estimate is the first simulated
//! cycle that admits it. Estimates assume no new submissions and jobs that end on time, like
//! Slurm's: a forecast, recomputed whenever asked.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use uuid::Uuid;

use crate::cycle::{CycleOptions, run_cycle};
use crate::decision::Pending;
use crate::model::{HeldJob, PendingJob, RunningJob, Snapshot};

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

/// [`estimate_starts`], with each start's reason: the jobs whose end it waits for. Held jobs
/// ([`Snapshot::held`]) are estimated too: each joins the queue when its dependencies have
/// ended (and its array has room) in the simulation, so a chain's estimates run down the chain.
pub fn estimate_starts_explained(snap: &Snapshot) -> BTreeMap<Uuid, Option<ExpectedStart>> {
    let mut sim = snap.clone();
    sim.held = Vec::new();
    let mut holds = Holds::new(snap);
    let mut starts: BTreeMap<Uuid, Option<ExpectedStart>> =
        snap.pending.iter().chain(snap.held.iter().map(|h| &h.job)).map(|j| (j.id, None)).collect();
    let options = CycleOptions { preempt: false, reserve: true };
    let end_of = |r: &RunningJob, now: i64| {
        (r.started_at + r.expected_runtime.unwrap_or(snap.settings.default_runtime_secs)).max(now)
    };
    let mut ended: Arc<[Uuid]> = Arc::from(Vec::new());
    // When each released job joined the queue, and what released it.
    let mut released: FxHashMap<Uuid, (i64, Arc<[Uuid]>)> = FxHashMap::default();
    for _ in 0..snap.settings.estimate_steps {
        for (job, after) in holds.release(&mut sim.pending, &ended) {
            released.insert(job, (sim.now, after));
        }
        let result = run_cycle(&sim, options);
        for admission in &result.admissions {
            // Admitted as it was released: it waited for what released it.
            let after = match released.get(&admission.job) {
                Some((at, after)) if *at == sim.now => Arc::clone(after),
                _ => Arc::clone(&ended),
            };
            starts.insert(admission.job, Some(ExpectedStart { at: sim.now, after }));
        }
        sim.apply(&result, u64::MAX);
        if sim.pending.is_empty() && holds.is_empty() {
            break;
        }
        let Some(next) = sim.running.iter().map(|r| end_of(r, sim.now)).min() else { break };
        sim.now = next.max(sim.now + 1);
        let now = sim.now;
        let (gone, running): (Vec<RunningJob>, Vec<RunningJob>) =
            sim.running.drain(..).partition(|r| end_of(r, now) <= now);
        sim.running = running;
        for job in &gone {
            holds.ended(job.id);
        }
        ended = gone.iter().map(|r| r.id).collect();
    }
    starts
}

/// The held jobs of a simulation and what releases each: its dependencies' ends, counted down
/// as they happen (a dependency the snapshot does not hold is never seen to end), and room in
/// its array's window.
struct Holds {
    held: Vec<Option<HeldJob>>,
    /// Per held job, its dependencies that have not ended (`usize::MAX`: one never will here).
    unmet: Vec<usize>,
    /// The held jobs waiting for each job's end.
    dependents: FxHashMap<Uuid, Vec<usize>>,
    /// Held jobs whose dependencies have all ended, not yet released.
    met: Vec<usize>,
    arrays: FxHashMap<Uuid, Window>,
    /// The array each member counting against a window belongs to.
    array_of: FxHashMap<Uuid, Uuid>,
    left: usize,
}

/// An array's window: its members counting against the limit, and its held members free to go
/// once there is room, in the order they are released (by index).
struct Window {
    limit: usize,
    active: FxHashSet<Uuid>,
    ready: BTreeSet<usize>,
}

impl Holds {
    fn new(snap: &Snapshot) -> Holds {
        let known: FxHashSet<Uuid> = (snap.running.iter().map(|r| r.id))
            .chain(snap.pending.iter().map(|j| j.id))
            .chain(snap.held.iter().map(|h| h.job.id))
            .collect();
        let mut dependents: FxHashMap<Uuid, Vec<usize>> = FxHashMap::default();
        let mut unmet = Vec::with_capacity(snap.held.len());
        let mut met = Vec::new();
        for (i, held) in snap.held.iter().enumerate() {
            for dependency in &held.after {
                dependents.entry(*dependency).or_default().push(i);
            }
            let waits = if held.after.iter().all(|d| known.contains(d)) { held.after.len() } else { usize::MAX };
            if waits == 0 {
                met.push(i);
            }
            unmet.push(waits);
        }
        let mut array_of = FxHashMap::default();
        let arrays = (snap.arrays.iter())
            .map(|a| {
                array_of.extend(a.members.iter().map(|m| (*m, a.id)));
                let window = Window {
                    limit: a.limit as usize,
                    active: a.members.iter().copied().collect(),
                    ready: BTreeSet::new(),
                };
                (a.id, window)
            })
            .collect();
        Holds {
            held: snap.held.iter().cloned().map(Some).collect(),
            unmet,
            dependents,
            met,
            arrays,
            array_of,
            left: snap.held.len(),
        }
    }

    fn is_empty(&self) -> bool {
        self.left == 0
    }

    /// `job` ended in the simulation.
    fn ended(&mut self, job: Uuid) {
        if let Some(array) = self.array_of.remove(&job)
            && let Some(window) = self.arrays.get_mut(&array)
        {
            window.active.remove(&job);
        }
        for i in self.dependents.remove(&job).unwrap_or_default() {
            if self.unmet[i] != usize::MAX {
                self.unmet[i] -= 1;
                if self.unmet[i] == 0 {
                    self.met.push(i);
                }
            }
        }
    }

    /// Moves the held jobs now free to go into `pending`; returns each with what released it
    /// (its dependencies, or for an array's member the jobs that `just_ended`).
    fn release(&mut self, pending: &mut Vec<PendingJob>, just_ended: &Arc<[Uuid]>) -> Vec<(Uuid, Arc<[Uuid]>)> {
        let mut out = Vec::new();
        for i in std::mem::take(&mut self.met) {
            match self.held[i].as_ref().and_then(|h| h.array).filter(|a| self.arrays.contains_key(a)) {
                Some(array) => {
                    self.arrays.get_mut(&array).map(|w| w.ready.insert(i));
                }
                None => out.push(i),
            }
        }
        for (array, window) in &mut self.arrays {
            while window.active.len() < window.limit
                && let Some(i) = window.ready.pop_first()
            {
                if let Some(held) = &self.held[i] {
                    window.active.insert(held.job.id);
                    self.array_of.insert(held.job.id, *array);
                }
                out.push(i);
            }
        }
        out.sort_unstable();
        let mut released = Vec::with_capacity(out.len());
        for i in out {
            let Some(held) = self.held[i].take() else { continue };
            self.left -= 1;
            let after: Arc<[Uuid]> = if held.after.is_empty() { Arc::clone(just_ended) } else { Arc::from(held.after) };
            released.push((held.job.id, after));
            pending.push(held.job);
        }
        released
    }
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

/// [`what_if`] for a job that is to start after `after` (its dependencies that have not ended,
/// by id): held until they end in the simulation, it is never admitted now.
pub fn what_if_after(snap: &Snapshot, job: PendingJob, after: Vec<Uuid>) -> Estimate {
    if after.is_empty() {
        return what_if(snap, job);
    }
    let id = job.id;
    let mut with_job = snap.clone();
    with_job.held.push(HeldJob { job, after, array: None });
    let (estimated_start, waits_for) = match estimate_starts_explained(&with_job).remove(&id).flatten() {
        Some(start) => (Some(start.at), start.after),
        None => (None, Arc::from(Vec::new())),
    };
    Estimate { admitted_now: false, pending: None, estimated_start, preempts: Vec::new(), waits_for }
}
