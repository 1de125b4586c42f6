//! One admission cycle: who starts now, who is preempted for whom, and why everyone else waits.
//!
//! Order: within a tenant, higher priority first, then submission order. Across tenants, the
//! tenant with the smallest weighted dominant share (usage over nominal quota, its largest flavor,
//! divided by its weight) goes next, DRF style, re-evaluated after every admission, so a tenant
//! using less of its share is served first and a burst from one tenant cannot starve another.
//!
//! A job that does not fit may: preempt (reclaim its tenant's nominal quota from borrowers in the
//! cohort, or, where the tenant allows, stop the tenant's lower-priority jobs), always choosing the
//! smallest sufficient set of the lowest-priority, newest victims, never a higher priority than
//! itself; or, once it has waited past the starvation threshold, reserve the nodes it needs so
//! that later, smaller jobs stop overtaking it. Everything else gets a reason.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use uuid::Uuid;

use crate::decision::{Admission, CycleResult, Pending, PendingReason, Preemption, PreemptionKind};
use crate::model::{PendingJob, RunningJob, Snapshot};
use crate::state::{FlavorId, QuotaCheck, State};

/// Options of one cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CycleOptions {
    /// Consider preemptions (off in forward simulations for estimates).
    pub preempt: bool,
    /// Apply the starvation rule.
    pub reserve: bool,
}

impl Default for CycleOptions {
    fn default() -> Self {
        CycleOptions { preempt: true, reserve: true }
    }
}

/// Decides admissions, preemptions and reasons for a snapshot. Pure: the same snapshot always
/// gives the same result.
pub fn admission_cycle(snap: &Snapshot) -> CycleResult {
    run_cycle(snap, CycleOptions::default())
}

pub fn run_cycle(snap: &Snapshot, options: CycleOptions) -> CycleResult {
    let mut state = State::new(snap);
    let mut result = CycleResult::default();

    // Each tenant's queue, in its own order; tenants without a policy queue too (they get
    // "no quota" for GPU jobs but may run CPU-only ones).
    let mut queues: BTreeMap<Uuid, VecDeque<&PendingJob>> = BTreeMap::new();
    for job in &snap.pending {
        queues.entry(job.tenant).or_default().push_back(job);
    }
    for queue in queues.values_mut() {
        queue.make_contiguous().sort_by_key(|j| (Reverse(j.priority), j.seq, j.id));
    }
    let tenant_position: BTreeMap<Uuid, usize> =
        queues.values().flat_map(|q| q.iter().enumerate().map(|(i, j)| (j.id, i + 1))).collect();

    let mut heap = BinaryHeap::new();
    for (tenant, queue) in &queues {
        if let Some(head) = queue.front() {
            heap.push(Reverse(order_key(&state, *tenant, head)));
        }
    }
    let mut victims_taken: Vec<Uuid> = Vec::new();
    let mut waiting_priorities: BTreeMap<Uuid, Vec<i32>> = BTreeMap::new();
    let mut considered = 0usize;

    while let Some(Reverse(key)) = heap.pop() {
        let tenant = key.tenant;
        let queue = queues.get_mut(&tenant).expect("queue of a queued tenant");
        let job = queue.pop_front().expect("the head that was pushed");
        considered += 1;

        match try_admit(&mut state, job) {
            Ok(admission) => result.admissions.push(admission),
            Err((reason, reclaimable)) => {
                let mut reason = reason;
                if options.preempt
                    && let Some((victims, kind)) = find_victims(&mut state, job, reclaimable, &victims_taken)
                {
                    reason = PendingReason::WaitingForPreemption { victims: victims.len() };
                    for victim in victims {
                        victims_taken.push(victim);
                        result.preemptions.push(Preemption { victim, for_job: job.id, kind });
                    }
                } else if options.reserve
                    && snap.now - job.submitted_at >= snap.settings.starvation_after_secs
                    && matches!(reason, PendingReason::NoRoom { .. })
                    && let Some(flavor) = flavor_for_reservation(&state, job)
                {
                    let nodes = state.reservation_for(&job.demand, flavor);
                    state.reserve(job.id, &nodes);
                }
                let behind =
                    waiting_priorities.get(&tenant).map_or(0, |p| p.iter().filter(|&&p| p > job.priority).count());
                waiting_priorities.entry(tenant).or_default().push(job.priority);
                result.pending.push(Pending {
                    job: job.id,
                    reason,
                    tenant_position: tenant_position[&job.id],
                    cluster_position: considered,
                    behind_higher_priority: behind,
                });
            }
        }
        if let Some(next) = queue.front() {
            heap.push(Reverse(order_key(&state, tenant, next)));
        }
    }
    // Positions count waiting jobs only.
    for (i, pending) in result.pending.iter_mut().enumerate() {
        pending.cluster_position = i + 1;
    }
    let mut tenant_counts: BTreeMap<Uuid, usize> = BTreeMap::new();
    let tenant_of: BTreeMap<Uuid, Uuid> = snap.pending.iter().map(|j| (j.id, j.tenant)).collect();
    let mut by_tenant_order: Vec<(usize, usize)> =
        result.pending.iter().enumerate().map(|(i, p)| (p.tenant_position, i)).collect();
    by_tenant_order.sort();
    for (_, i) in by_tenant_order {
        let count = tenant_counts.entry(tenant_of[&result.pending[i].job]).or_default();
        *count += 1;
        result.pending[i].tenant_position = *count;
    }
    result
}

/// Fair-share order across tenants, then priority, then submission order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct OrderKey {
    share: u64,
    priority: Reverse<i32>,
    seq: u64,
    job: Uuid,
    tenant: Uuid,
}

fn order_key(state: &State<'_>, tenant: Uuid, job: &PendingJob) -> OrderKey {
    OrderKey {
        share: dominant_share(state, tenant),
        priority: Reverse(job.priority),
        seq: job.seq,
        job: job.id,
        tenant,
    }
}

/// The tenant's weighted dominant share, in millionths: its largest usage over nominal quota.
fn dominant_share(state: &State<'_>, tenant: Uuid) -> u64 {
    let Some(t) = state.tenant(tenant) else { return u64::MAX };
    let share = state
        .quota_flavors(Some(t))
        .into_iter()
        .map(|f| state.usage(t, f) as f64 / state.quota(t, f).map_or(1, |q| q.nominal.max(1)) as f64)
        .fold(0.0, f64::max)
        / state.snap.tenants[t].weight.max(1e-6);
    (share * 1e6) as u64
}

/// Flavors a job could use: the one it names, or every flavor its tenant has quota for (every
/// flavor of the cluster, when it has none, so that the reason says so).
fn flavors_for(state: &State<'_>, job: &PendingJob) -> Vec<FlavorId> {
    match &job.demand.gpu_type {
        Some(name) => state.flavor_id(name).into_iter().collect(),
        None => {
            let flavors = state.quota_flavors(state.tenant(job.tenant));
            if flavors.is_empty() { (0..state.flavors.len()).collect() } else { flavors }
        }
    }
}

/// Admits the job if quota and nodes allow; else the most telling reason, and whether the job
/// would fit its nominal quota were borrowers reclaimed.
fn try_admit(state: &mut State<'_>, job: &PendingJob) -> Result<Admission, (PendingReason, bool)> {
    let demand = &job.demand;
    if demand.gpus == 0 {
        return match state.place(demand, None) {
            Some(nodes) => {
                state.allocate(job.tenant, None, demand, &nodes);
                Ok(admission(state, job, None, &nodes))
            }
            None => Err((never_or_no_room(state, job, None), false)),
        };
    }
    let t = state.tenant(job.tenant);
    let mut best: Option<(PendingReason, bool)> = None;
    for flavor in flavors_for(state, job) {
        let reason = match state.quota_check(t, flavor, demand.total_gpus()) {
            Ok(QuotaCheck::Fits) => match state.place(demand, Some(flavor)) {
                Some(nodes) => {
                    state.allocate(job.tenant, Some(flavor), demand, &nodes);
                    return Ok(admission(state, job, Some(flavor), &nodes));
                }
                None => (never_or_no_room(state, job, Some(flavor)), true),
            },
            Ok(QuotaCheck::Reclaimable) => (
                PendingReason::CohortExhausted {
                    flavor: state.flavors[flavor].to_string(),
                    used: t.map_or(0, |t| state.usage(t, flavor)),
                    nominal: t.and_then(|t| state.quota(t, flavor)).map_or(0, |q| q.nominal),
                    lendable: 0,
                    needed: demand.total_gpus(),
                },
                true,
            ),
            Err(reason) => (reason, false),
        };
        // Prefer a reason that says the job will run once something moves over "never".
        let rank = |r: &(PendingReason, bool)| match r.0 {
            PendingReason::NeverFits { .. } | PendingReason::NoQuota { .. } => 0,
            _ => 1 + usize::from(r.1),
        };
        if best.as_ref().is_none_or(|b| rank(&reason) > rank(b)) {
            best = Some(reason);
        }
    }
    let none_offered = || match &demand.gpu_type {
        Some(flavor) => {
            PendingReason::NeverFits { detail: format!("no node of the cluster has GPUs of type {flavor}") }
        }
        None => PendingReason::NeverFits {
            detail: format!("no node of the cluster has GPUs; the job asks for {} per replica", demand.gpus),
        },
    };
    Err(best.unwrap_or_else(|| (none_offered(), false)))
}

fn admission(state: &State<'_>, job: &PendingJob, flavor: Option<FlavorId>, nodes: &[usize]) -> Admission {
    Admission {
        job: job.id,
        flavor: flavor.map(|f| state.flavors[f].to_string()),
        nodes: nodes.iter().map(|&i| state.snap.nodes[i].name.clone()).collect(),
    }
}

/// "Can never fit on this cluster" or "no room now".
fn never_or_no_room(state: &State<'_>, job: &PendingJob, flavor: Option<FlavorId>) -> PendingReason {
    let d = &job.demand;
    let nodes = || (0..state.snap.nodes.len()).filter(|&i| flavor.is_none() || state.node_flavor(i) == flavor);
    let fits_empty = nodes().any(|i| {
        let n = &state.snap.nodes[i];
        n.gpus >= d.gpus && n.cpu_millis >= d.cpu_millis && n.memory_bytes >= d.memory_bytes
    });
    let name = flavor.map(|f| state.flavors[f].to_string());
    if !fits_empty {
        let what = match &name {
            Some(f) => format!(
                "{} GPUs of {f}, {} cpu millicores and {} bytes of memory",
                d.gpus, d.cpu_millis, d.memory_bytes
            ),
            None => format!("{} cpu millicores and {} bytes of memory", d.cpu_millis, d.memory_bytes),
        };
        return PendingReason::NeverFits { detail: format!("no node has {what} for one replica") };
    }
    if flavor.is_some() {
        let total: u64 = nodes().map(|i| u64::from(state.snap.nodes[i].gpus / d.gpus.max(1))).sum();
        if total < u64::from(d.replicas) {
            return PendingReason::NeverFits {
                detail: format!(
                    "the cluster holds at most {total} replicas of {} GPUs of {}; the job needs {}",
                    d.gpus,
                    name.as_deref().unwrap_or_default(),
                    d.replicas
                ),
            };
        }
    }
    if let Some(holder) = nodes().find_map(|i| state.reserved_by(i)).filter(|holder| *holder != job.id) {
        return PendingReason::Reserved { for_job: holder };
    }
    PendingReason::NoRoom {
        flavor: name,
        replicas: d.replicas,
        gpus_per_replica: d.gpus,
        free_gpus: flavor.map_or(0, |f| state.free_of(f)),
    }
}

fn flavor_for_reservation(state: &State<'_>, job: &PendingJob) -> Option<FlavorId> {
    if job.demand.gpus == 0 {
        return None;
    }
    let t = state.tenant(job.tenant);
    flavors_for(state, job).into_iter().find(|&f| state.quota_check(t, f, job.demand.total_gpus()).is_ok())
}

/// The smallest sufficient set of victims for `job`, or `None`. Reclaim first (when the job is
/// within its tenant's nominal quota): other tenants' jobs running on borrowed quota in the same
/// cohort. Then, when the tenant allows it, the tenant's own lower-priority jobs. Victims are
/// never of higher priority than the job, lowest priority and newest go first, and the set is
/// pruned to the smallest that still suffices.
fn find_victims<'a>(
    state: &mut State<'a>,
    job: &PendingJob,
    reclaimable: bool,
    taken: &[Uuid],
) -> Option<(Vec<Uuid>, PreemptionKind)> {
    if job.demand.gpus == 0 {
        return None;
    }
    let snap = state.snap;
    let t = state.tenant(job.tenant)?;
    let cohort = snap.tenants[t].cohort.as_deref();
    let eligible = |r: &RunningJob| !r.stopping && !taken.contains(&r.id) && r.priority <= job.priority;
    for flavor in flavors_for(state, job) {
        let on_flavor = |r: &RunningJob| r.flavor.as_deref() == Some(state.flavors[flavor]);
        let mut tries: Vec<(PreemptionKind, Vec<&'a RunningJob>)> = Vec::new();
        if reclaimable && cohort.is_some() {
            let borrowers = snap
                .running
                .iter()
                .filter(|r| eligible(r) && r.tenant != job.tenant && on_flavor(r))
                .filter(|r| state.tenant(r.tenant).is_some_and(|rt| snap.tenants[rt].cohort.as_deref() == cohort))
                .collect();
            tries.push((PreemptionKind::Reclaim, borrowers));
        }
        if snap.tenants[t].preempt_lower_priority {
            let own = snap
                .running
                .iter()
                .filter(|r| eligible(r) && r.tenant == job.tenant && r.priority < job.priority && on_flavor(r))
                .collect();
            tries.push((PreemptionKind::LowerPriority, own));
        }
        for (kind, mut candidates) in tries {
            candidates.sort_by_key(|r| (r.priority, Reverse(r.started_at), r.id));
            if let Some(victims) = smallest_sufficient(state, job, flavor, kind, &candidates) {
                return Some((victims, kind));
            }
        }
    }
    None
}

fn job_fits(state: &State<'_>, job: &PendingJob, flavor: FlavorId) -> bool {
    matches!(state.quota_check(state.tenant(job.tenant), flavor, job.demand.total_gpus()), Ok(QuotaCheck::Fits))
        && state.place(&job.demand, Some(flavor)).is_some()
}

fn smallest_sufficient<'a>(
    state: &mut State<'a>,
    job: &PendingJob,
    flavor: FlavorId,
    kind: PreemptionKind,
    candidates: &[&'a RunningJob],
) -> Option<Vec<Uuid>> {
    let take = |state: &mut State<'a>, r: &RunningJob, release: bool| {
        let nodes = state.running_nodes(r);
        let f = r.flavor.as_deref().and_then(|f| state.flavor_id(f));
        if release {
            state.release(r.tenant, f, &r.demand, &nodes);
        } else {
            state.allocate(r.tenant, f, &r.demand, &nodes);
        }
    };
    let mut chosen: Vec<&RunningJob> = Vec::new();
    let mut fits = false;
    for &candidate in candidates {
        if kind == PreemptionKind::Reclaim {
            // Only what is borrowed can be reclaimed: skip tenants back within their nominal.
            let rt = state.tenant(candidate.tenant)?;
            let nominal = state.quota(rt, flavor).map_or(0, |q| q.nominal);
            if state.usage(rt, flavor) <= nominal {
                continue;
            }
        }
        take(state, candidate, true);
        chosen.push(candidate);
        if job_fits(state, job, flavor) {
            fits = true;
            break;
        }
    }
    if !fits {
        for &r in chosen.iter().rev() {
            take(state, r, false);
        }
        return None;
    }
    // Prune: put back every victim the job can do without, latest choices first.
    let mut i = chosen.len();
    while i > 0 {
        i -= 1;
        take(state, chosen[i], false);
        if job_fits(state, job, flavor) {
            chosen.remove(i);
        } else {
            take(state, chosen[i], true);
        }
    }
    // The victims keep their resources until they have stopped; the job waits for them.
    for &r in &chosen {
        take(state, r, false);
    }
    Some(chosen.iter().map(|r| r.id).collect())
}
