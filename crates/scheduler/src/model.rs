//! What the scheduler looks at: one snapshot of the cluster, taken at one instant.

use std::collections::BTreeMap;

use uuid::Uuid;

/// A GPU type (`nvidia-h100-80gb`): the resources quotas are counted in.
pub type Flavor = String;

/// A machine jobs run on.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub name: String,
    /// Rack or zone, when known: gangs prefer one.
    pub rack: Option<String>,
    /// The type of this node's GPUs (one type per node); `None` for CPU-only nodes.
    pub gpu_type: Option<Flavor>,
    pub gpus: u32,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    /// Drained by an admin, with the reason given (empty when none): it takes no new
    /// placements; what runs there keeps its resources until it ends or is preempted.
    pub drained: Option<String>,
}

/// A tenant's quota for one flavor, in GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Guaranteed: always available to the tenant, reclaimed from borrowers when needed.
    pub nominal: u64,
    /// How much more than nominal it may use from its cohort's idle quota; unlimited when `None`.
    pub borrowing_limit: Option<u64>,
    /// How much of its idle nominal others may use; all of it when `None`.
    pub lending_limit: Option<u64>,
}

impl Quota {
    /// What a tenant with this quota (or none) adds to its cohort at usage `used`: what it
    /// borrows (use beyond nominal; all of it without a quota) and what it can lend (idle
    /// nominal, within its lending limit). The one statement of that rule: admission and the
    /// quota report both count with it.
    pub fn contribution(quota: Option<&Quota>, used: u64) -> (u64, u64) {
        match quota {
            None => (used, 0),
            Some(q) => {
                let idle = q.nominal.saturating_sub(used);
                (used.saturating_sub(q.nominal), q.lending_limit.map_or(idle, |l| idle.min(l)))
            }
        }
    }

    /// What each member of a cohort lends of one flavor, given every member's quota and use
    /// (in the order given, by convention the members' names): the cohort's borrowing is
    /// attributed to the lenders in turn, each up to what it can lend.
    pub fn lent_by(members: &[(Option<Quota>, u64)]) -> Vec<u64> {
        let mut borrowed: u64 = members.iter().map(|(q, used)| Quota::contribution(q.as_ref(), *used).0).sum();
        members
            .iter()
            .map(|(q, used)| {
                let share = Quota::contribution(q.as_ref(), *used).1.min(borrowed);
                borrowed -= share;
                share
            })
            .collect()
    }
}

/// A tenant as the scheduler sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantPolicy {
    pub id: Uuid,
    pub name: String,
    /// Tenants in the same cohort lend each other idle quota; `None`: a cohort of its own.
    pub cohort: Option<String>,
    /// Fair-share weight (default 1): a tenant of weight 2 is entitled to twice the share.
    pub weight: f64,
    pub quotas: BTreeMap<Flavor, Quota>,
    /// Whether a job of this tenant may preempt the tenant's own lower-priority jobs.
    pub preempt_lower_priority: bool,
}

/// What a job asks for: `replicas` copies, each of which must fit on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demand {
    pub replicas: u32,
    pub gpus: u32,
    /// A specific GPU type, or any the tenant has quota for.
    pub gpu_type: Option<Flavor>,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

impl Demand {
    pub fn total_gpus(&self) -> u64 {
        u64::from(self.replicas) * u64::from(self.gpus)
    }
}

/// A job waiting for admission.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingJob {
    pub id: Uuid,
    pub tenant: Uuid,
    pub priority: i32,
    /// Submission order (ties in everything else go to the smaller).
    pub seq: u64,
    /// Seconds since the epoch.
    pub submitted_at: i64,
    pub demand: Demand,
    /// Expected run time in seconds (from the template or the job), for start estimates.
    pub expected_runtime: Option<i64>,
    /// Nodes whose shard cache holds its datasets, by name: preferred when they have room.
    pub warm_nodes: Vec<String>,
    /// How long after submission it waits for room on a warm node, when one is in the
    /// cluster, before it takes any node (0: never waits; the job asked for it).
    pub cache_wait_secs: u32,
    /// Runs on spare room only: GPUs no job within its tenant's quota is waiting for. Not
    /// counted in any quota, placed after every other job, never preempts, and is the first
    /// victim when a job with quota needs the room (an experiment's trials, by default).
    pub spare: bool,
}

/// A waiting job kept out of admission until other jobs end: a chain's dependencies
/// (`--after-ok` and kin) or its array's limit of jobs at once. No cycle admits it; start
/// estimates release it once what it waits for has ended in their simulation, assuming each
/// dependency ends as it must for it to run.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldJob {
    pub job: PendingJob,
    /// Its dependencies that have not ended.
    pub after: Vec<Uuid>,
    /// The array whose limit holds it back ([`Snapshot::arrays`]), if one does.
    pub array: Option<Uuid>,
}

/// A job array with a limit of jobs at once (`--array 0-99%8`), as estimates need it: its
/// members that count against the limit now (admitted, running, or queued within the limit).
#[derive(Debug, Clone, PartialEq)]
pub struct ArrayWindow {
    pub id: Uuid,
    pub limit: u32,
    pub members: Vec<Uuid>,
}

/// A job holding resources: admitted, starting, running, or being stopped.
#[derive(Debug, Clone, PartialEq)]
pub struct RunningJob {
    pub id: Uuid,
    pub tenant: Uuid,
    pub priority: i32,
    pub demand: Demand,
    /// The flavor its GPUs are counted in (`None` for CPU-only jobs).
    pub flavor: Option<Flavor>,
    /// The node of each replica, by name.
    pub nodes: Vec<String>,
    pub started_at: i64,
    pub expected_runtime: Option<i64>,
    /// Being stopped (preempted or cancelled): still holds its resources, not a victim again.
    pub stopping: bool,
    /// The job a preemption is stopping it for: the room it frees is that job's alone while it
    /// stops. `None` when it is stopped for another reason (cancelled, out of time), or its
    /// preemptor is not known: its room is then anyone's.
    pub stopping_for: Option<Uuid>,
    /// Runs on spare room ([`PendingJob::spare`]): outside quota, preempted first.
    pub spare: bool,
    /// When it last saved its progress (a checkpoint it reported), seconds since the epoch:
    /// of spare jobs, the one that saved last loses least when stopped.
    pub saved_at: Option<i64>,
}

impl RunningJob {
    /// When the work it would lose if stopped now began: its last checkpoint, or its start
    /// when it saved nothing since (a resumed attempt starts from its checkpoint).
    pub fn unsaved_since(&self) -> i64 {
        self.saved_at.map_or(self.started_at, |saved| saved.max(self.started_at))
    }
}

/// Knobs of the scheduling policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// A job that has waited this long and cannot be placed reserves the nodes it needs, so
    /// that smaller jobs stop overtaking it (the starvation rule).
    pub starvation_after_secs: i64,
    /// Run time assumed for estimates when a job declares none.
    pub default_runtime_secs: i64,
    /// Forward-simulation steps at most, when estimating start times.
    pub estimate_steps: usize,
    /// Between SIGTERM and SIGKILL when a job is stopped: a preemptor's what-if expects to start
    /// this long after it is submitted, when its victims have stopped at the latest.
    pub stop_grace_secs: i64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            starvation_after_secs: 30 * 60,
            default_runtime_secs: 60 * 60,
            estimate_steps: 5_000,
            stop_grace_secs: 10,
        }
    }
}

/// Everything the scheduler looks at, taken at `now` (seconds since the epoch).
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub now: i64,
    pub nodes: Vec<Node>,
    pub tenants: Vec<TenantPolicy>,
    pub running: Vec<RunningJob>,
    pub pending: Vec<PendingJob>,
    pub settings: Settings,
    /// Waiting jobs whose preemption's victims have just ended (in the pass that recorded their
    /// end): each goes first when its tenant's turn is due, ahead of the tenants' fair-share
    /// order, so that the room goes to the job it was taken for. Otherwise tenants served
    /// before it (using less of their share) take it, and it preempts again, round after round.
    pub nominated: Vec<Uuid>,
    /// Waiting jobs no cycle admits yet, in the order they are to be released (an array's
    /// members by index): only start estimates look at them.
    pub held: Vec<HeldJob>,
    /// The arrays that hold some of `held` back.
    pub arrays: Vec<ArrayWindow>,
}

impl Snapshot {
    /// Plays a cycle's decisions forward: admitted jobs start now; preemption victims go back
    /// to the queue (as newly submitted, with `requeue_seq`). Used by estimates, the simulator
    /// and the tests to step a cluster from one cycle to the next.
    pub fn apply(&mut self, result: &crate::CycleResult, requeue_seq: u64) {
        use std::collections::{BTreeMap, BTreeSet};
        let admitted: BTreeMap<Uuid, &crate::Admission> = result.admissions.iter().map(|a| (a.job, a)).collect();
        let victims: BTreeSet<Uuid> = result.preemptions.iter().map(|p| p.victim).collect();
        let now = self.now;
        let (started, waiting): (Vec<PendingJob>, Vec<PendingJob>) =
            self.pending.drain(..).partition(|j| admitted.contains_key(&j.id));
        let (stopped, running): (Vec<RunningJob>, Vec<RunningJob>) =
            self.running.drain(..).partition(|r| victims.contains(&r.id));
        self.running = running;
        self.running.extend(started.into_iter().map(|job| {
            let admission = admitted[&job.id];
            RunningJob {
                id: job.id,
                tenant: job.tenant,
                priority: job.priority,
                demand: job.demand,
                flavor: admission.flavor.clone(),
                nodes: admission.nodes.clone(),
                started_at: now,
                expected_runtime: job.expected_runtime,
                stopping: false,
                stopping_for: None,
                spare: job.spare,
                saved_at: None,
            }
        }));
        self.pending = waiting;
        self.pending.extend(stopped.into_iter().map(|r| PendingJob {
            id: r.id,
            tenant: r.tenant,
            priority: r.priority,
            seq: requeue_seq,
            submitted_at: now,
            demand: r.demand,
            expected_runtime: r.expected_runtime,
            warm_nodes: Vec::new(),
            cache_wait_secs: 0,
            spare: r.spare,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::Quota;

    fn quota(nominal: u64, lending_limit: Option<u64>) -> Option<Quota> {
        Some(Quota { nominal, borrowing_limit: None, lending_limit })
    }

    #[test]
    fn a_cohorts_borrowing_is_attributed_to_its_lenders_in_turn_within_their_limits() {
        // a: 8, uses 2 (6 idle, lends at most 4); b: 8, uses 8 (lends 0); c: 4, uses 10 (borrows
        // 6); d: no quota, uses 1 (borrows 1). 7 borrowed: a lends 4, the next idle lender...
        let members =
            [(quota(8, Some(4)), 2), (quota(8, None), 8), (quota(4, None), 10), (None, 1), (quota(6, None), 0)];
        assert_eq!(Quota::lent_by(&members), [4, 0, 0, 0, 3]);
        assert_eq!(Quota::contribution(None, 5), (5, 0));
        assert_eq!(Quota::contribution(quota(8, Some(2)).as_ref(), 3), (0, 2));
        assert_eq!(Quota::lent_by(&[(quota(8, None), 0)]), [0], "nothing borrowed, nothing lent");
    }
}
