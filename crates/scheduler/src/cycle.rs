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
//!
//! Jobs on spare room (`PendingJob::spare`, an experiment's trials by default) come after every
//! other job, take only what is left, count in no quota and preempt nothing; a job within its
//! quota that finds no room stops them before anyone else, the one that would lose least first.

use std::cmp::Reverse;
use std::collections::binary_heap::PeekMut;
use std::collections::{BTreeSet, BinaryHeap};

use rustc_hash::FxHashMap;
use trainyard_core::resources::{human_cpus, human_gpus, human_memory};
use uuid::Uuid;

use crate::decision::{Admission, CycleResult, FlavorName, Pending, PendingReason, Preemption, PreemptionKind};
use crate::model::{PendingJob, RunningJob, Snapshot};
use crate::state::{FlavorId, Free, QuotaCheck, Shape, ShapeId, State};

/// Preemption searches per cycle at most (one per tenant, for its first waiting job).
const MAX_PREEMPTION_SEARCHES: usize = 32;

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
    let mut result = CycleResult { pending: Vec::with_capacity(snap.pending.len()), ..CycleResult::default() };
    let queue = Queue::new(&mut state);
    let tenants = queue.tenants.len();

    // Each tenant's next job in the fair-share heap, keyed by (dominant share, order): a
    // tenant using less of its share goes first, ties in the order of `Queued::order`.
    let mut share: Vec<u64> = queue.policy_of.iter().map(|&t| dominant_share(&state, t)).collect();
    // A preemptor whose victims have just ended goes first when its tenant's turn is due
    // (`Snapshot::nominated`): a share of zero. Jobs on spare room come after every other job
    // (a tenant's own come last in its order).
    let key = |share: u64, job: &Queued| {
        let share = if job.nominated { 0 } else { share.min(u64::from(u32::MAX)) };
        (job.spare, (share << 32) | u64::from(job.order))
    };
    let mut heap: BinaryHeap<Reverse<((bool, u64), u32)>> = (0..tenants)
        .filter(|&t| !queue.range[t].is_empty())
        .map(|t| Reverse((key(share[t], &queue.jobs[queue.range[t].start]), t as u32)))
        .collect();
    let mut next: Vec<usize> = queue.range.iter().map(|r| r.start).collect();

    let mut victims_taken: BTreeSet<Uuid> = BTreeSet::new();
    // Tenants whose first waiting job was searched for preemption victims, and how many.
    let mut searched = vec![false; tenants];
    let mut searches = 0;
    let running_by_flavor = running_by_flavor(&state);
    // Per tenant: jobs left waiting so far, and how many of them share the latest priority (a
    // tenant's jobs come in priority order, so the rest had a higher one).
    let mut waiting: Vec<(usize, i32, usize)> = vec![(0, i32::MIN, 0); tenants];

    while let Some(mut top) = heap.peek_mut() {
        let tenant = top.0.1 as usize;
        let job = &queue.jobs[next[tenant]];
        next[tenant] += 1;
        let t = queue.policy_of[tenant];

        let admitted = if job.spare {
            try_admit_spare(&mut state, job, queue.flavors(job)).map_err(|reason| (reason, false))
        } else {
            try_admit(&mut state, job, t, queue.flavors(job))
        };
        match admitted {
            Ok(admission) => {
                result.admissions.push(admission);
                share[tenant] = dominant_share(&state, t);
            }
            Err((reason, quota_allows)) => {
                let mut reason = reason;
                // Preemption is searched for the first waiting job of each tenant only, and for at
                // most a few jobs per cycle: bounded work, and the next cycle serves the rest.
                // A job waiting by choice for a node that caches its data preempts nothing.
                // A job on spare room preempts nothing either.
                let by_choice = matches!(reason, PendingReason::WaitingForCache { .. }) || job.spare;
                let may_search =
                    options.preempt && !by_choice && searches < MAX_PREEMPTION_SEARCHES && !searched[tenant];
                if may_search {
                    searched[tenant] = true;
                    searches += 1;
                }
                let pending_job = &snap.pending[job.index as usize];
                if may_search
                    && let Some((victims, kind)) = find_victims(
                        &mut state,
                        pending_job,
                        queue.flavors(job),
                        quota_allows,
                        &victims_taken,
                        &running_by_flavor,
                    )
                {
                    reason = PendingReason::WaitingForPreemption { victims: victims.len() };
                    for victim in victims {
                        victims_taken.insert(victim);
                        result.preemptions.push(Preemption { victim, for_job: job.id, kind });
                    }
                } else if options.reserve
                    && !job.spare
                    && snap.now - job.submitted_at >= snap.settings.starvation_after_secs
                    && matches!(reason, PendingReason::NoRoom { .. })
                    && let Some(flavor) = flavor_for_reservation(&state, job, t, queue.flavors(job))
                {
                    let nodes = state.reservation_for(state.shape(job.shape), flavor);
                    state.reserve(job.id, &nodes);
                }
                let entry = &mut waiting[tenant];
                if entry.1 != job.priority {
                    *entry = (entry.0, job.priority, 0);
                }
                let behind_higher_priority = entry.0 - entry.2;
                entry.0 += 1;
                entry.2 += 1;
                result.pending.push(Pending {
                    job: job.id,
                    reason,
                    tenant_position: entry.0,
                    cluster_position: result.pending.len() + 1,
                    behind_higher_priority,
                });
            }
        }
        // The tenant's next job takes its place in the heap (one sift), or the tenant leaves it.
        if next[tenant] < queue.range[tenant].end {
            top.0 = (key(share[tenant], &queue.jobs[next[tenant]]), tenant as u32);
        } else {
            PeekMut::pop(top);
        }
    }
    result
}

/// A queued job as the cycle reads it: copied once out of the snapshot into queue order, so
/// that the loop walks memory in order instead of jumping across the snapshot's jobs.
struct Queued {
    id: Uuid,
    submitted_at: i64,
    /// Its index in `snap.pending`.
    index: u32,
    /// Its place in the order that breaks ties between tenants of equal share: priority
    /// (descending), submission order, tenant (first seen first), id.
    order: u32,
    priority: i32,
    shape: ShapeId,
    /// The flavors it may use: where their list starts in `Queue::flavor_lists`, and its length.
    flavors: (u32, u32),
    /// Its preemption's victims have just ended (`Snapshot::nominated`).
    nominated: bool,
    /// On spare room: after every other job, outside quota.
    spare: bool,
}

/// The cycle's queue: every pending job, grouped by tenant, each tenant's jobs in its own
/// order (priority descending, submission order, id).
struct Queue {
    jobs: Vec<Queued>,
    /// The tenants with queued jobs, in order of first appearance.
    tenants: Vec<Uuid>,
    /// Each queued tenant's index in the state (`None`: a tenant without a policy; it gets
    /// "no quota" for GPU jobs but may run CPU-only ones).
    policy_of: Vec<Option<usize>>,
    /// Each queued tenant's jobs in `jobs`.
    range: Vec<std::ops::Range<usize>>,
    /// The lists of flavors jobs may use, one after the other: every flavor first, then each
    /// queued tenant's quota flavors.
    flavor_lists: Vec<FlavorId>,
}

impl Queue {
    fn new(state: &mut State<'_>) -> Queue {
        let snap = state.snap;
        let mut tenants: Vec<Uuid> = Vec::new();
        let mut tenant_of: FxHashMap<Uuid, u32> = FxHashMap::default();
        let job_tenant: Vec<u32> = snap
            .pending
            .iter()
            .map(|j| {
                *tenant_of.entry(j.tenant).or_insert_with(|| {
                    tenants.push(j.tenant);
                    (tenants.len() - 1) as u32
                })
            })
            .collect();
        let policy_of: Vec<Option<usize>> = tenants.iter().map(|id| state.tenant(*id)).collect();

        // The cross-tenant order: priority (descending), submission order, tenant, then id.
        let mut order: Vec<(u128, u32)> = snap
            .pending
            .iter()
            .enumerate()
            .map(|(i, j)| {
                let priority_desc = u32::MAX - (i64::from(j.priority) - i64::from(i32::MIN)) as u32;
                let key = (u128::from(priority_desc) << 96) | (u128::from(j.seq) << 32) | u128::from(job_tenant[i]);
                (key, i as u32)
            })
            .collect();
        order.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0).then_with(|| snap.pending[a.1 as usize].id.cmp(&snap.pending[b.1 as usize].id))
        });
        // Jobs on spare room after every other, in the same order among themselves.
        if snap.pending.iter().any(|j| j.spare) {
            let (mut first, spare): (Vec<_>, Vec<_>) =
                order.into_iter().partition(|&(_, i)| !snap.pending[i as usize].spare);
            first.extend(spare);
            order = first;
        }

        // Grouped by tenant (a counting sort, which keeps that order within each tenant).
        let mut range: Vec<std::ops::Range<usize>> = vec![0..0; tenants.len()];
        for &t in &job_tenant {
            range[t as usize].end += 1;
        }
        let mut start = 0;
        for r in &mut range {
            *r = start..start + r.end;
            start = r.end;
        }
        let mut fill: Vec<usize> = range.iter().map(|r| r.start).collect();
        let mut slots: Vec<u32> = vec![0; snap.pending.len()];
        let all = state.flavors.len() as u32;
        let mut flavor_lists: Vec<FlavorId> = (0..state.flavors.len()).collect();
        // The flavors a job could use: the one it names (none when the cluster does not know
        // it), or every flavor its tenant has quota for (every flavor of the cluster when it
        // has none, so that the reason says so).
        let tenant_lists: Vec<(u32, u32)> = policy_of
            .iter()
            .map(|&t| match t.map(|t| state.quota_flavors(t)) {
                Some(flavors) if !flavors.is_empty() => {
                    flavor_lists.extend_from_slice(flavors);
                    ((flavor_lists.len() - flavors.len()) as u32, flavors.len() as u32)
                }
                _ => (0, all),
            })
            .collect();
        for (place, &(_, i)) in order.iter().enumerate() {
            let t = job_tenant[i as usize] as usize;
            slots[fill[t]] = place as u32;
            fill[t] += 1;
        }
        let nominated: rustc_hash::FxHashSet<Uuid> = snap.nominated.iter().copied().collect();
        let jobs = slots
            .into_iter()
            .map(|place| {
                let index = order[place as usize].1;
                let job = &snap.pending[index as usize];
                // Spare room is any GPU type's: no quota says which.
                let flavors = match job.demand.gpu_type.as_deref() {
                    Some(name) => state.flavor_id(name).map_or((0, 0), |f| (f as u32, 1)),
                    None if job.spare => (0, all),
                    None => tenant_lists[job_tenant[index as usize] as usize],
                };
                Queued {
                    id: job.id,
                    submitted_at: job.submitted_at,
                    index,
                    order: place,
                    priority: job.priority,
                    shape: state.intern(Shape::of(&job.demand)),
                    flavors,
                    nominated: nominated.contains(&job.id),
                    spare: job.spare,
                }
            })
            .collect();
        Queue { jobs, tenants, policy_of, range, flavor_lists }
    }

    /// The flavors `job` may use.
    fn flavors(&self, job: &Queued) -> &[FlavorId] {
        let (start, len) = job.flavors;
        &self.flavor_lists[start as usize..(start + len) as usize]
    }
}

/// The tenant's weighted dominant share, in millionths: its largest usage over nominal quota.
fn dominant_share(state: &State<'_>, tenant: Option<usize>) -> u64 {
    let Some(t) = tenant else { return u64::MAX };
    let share = (0..state.flavors.len())
        .filter_map(|f| state.quota(t, f).map(|q| state.usage(t, f) as f64 / q.nominal.max(1) as f64))
        .fold(0.0, f64::max)
        / state.snap.tenants[t].weight.max(1e-6);
    (share * 1e6) as u64
}

/// Admits the job if quota and nodes allow; else the most telling reason, and whether the job
/// would fit its nominal quota were borrowers reclaimed.
/// `t` is the job's tenant's index in the state (`None`: a tenant without a policy); `flavors`
/// the ones it may use.
fn try_admit(
    state: &mut State<'_>,
    job: &Queued,
    t: Option<usize>,
    flavors: &[FlavorId],
) -> Result<Admission, (PendingReason, bool)> {
    let demand = *state.shape(job.shape);
    let pending = &state.snap.pending[job.index as usize];
    let warm = &pending.warm_nodes;
    // The job asked to wait for room on a node that caches its data, and such a node is in the
    // cluster: until its wait is over, only those nodes will do. Otherwise they are preferred
    // when they have room, never waited for.
    let holding = (pending.cache_wait_secs > 0
        && state.snap.now < pending.submitted_at + i64::from(pending.cache_wait_secs))
    .then(|| state.nodes_known(warm))
    .filter(|&nodes| nodes > 0)
    .map(|nodes| PendingReason::WaitingForCache {
        nodes,
        until: pending.submitted_at + i64::from(pending.cache_wait_secs),
    });
    if demand.gpus == 0 {
        let nodes = match &holding {
            Some(waiting) => state.place_warm(&demand, None, warm).ok_or_else(|| (waiting.clone(), false)),
            None => match state.place_remembered(job.shape, None) {
                Some(nodes) => Ok(state.place_warm(&demand, None, warm).unwrap_or(nodes)),
                None => Err((never_or_no_room(state, job.id, &demand, None), false)),
            },
        }?;
        state.allocate(t, None, &demand, &nodes);
        return Ok(admission(state, job.id, None, &nodes));
    }
    let mut best: Option<(PendingReason, bool)> = None;
    for &flavor in flavors {
        let reason = match (state.quota_check(t, flavor, demand.total_gpus()), &holding) {
            (Ok(QuotaCheck::Fits), Some(waiting)) => match state.place_warm(&demand, Some(flavor), warm) {
                Some(nodes) => {
                    state.allocate(t, Some(flavor), &demand, &nodes);
                    return Ok(admission(state, job.id, Some(flavor), &nodes));
                }
                // Nothing is preempted for it, and it reserves nothing, while it waits by choice.
                None => (waiting.clone(), false),
            },
            (Ok(QuotaCheck::Fits), None) => match state.place_remembered(job.shape, Some(flavor)) {
                Some(nodes) => {
                    // Nodes holding its data when they have room; never waits for them.
                    let nodes = state.place_warm(&demand, Some(flavor), warm).unwrap_or(nodes);
                    state.allocate(t, Some(flavor), &demand, &nodes);
                    return Ok(admission(state, job.id, Some(flavor), &nodes));
                }
                None => (never_or_no_room(state, job.id, &demand, Some(flavor)), true),
            },
            // Reclaiming quota for it is worth it only when a warm node has room for it.
            (Ok(QuotaCheck::Reclaimable), Some(waiting)) if state.place_warm(&demand, Some(flavor), warm).is_none() => {
                (waiting.clone(), false)
            }
            (Ok(QuotaCheck::Reclaimable), _) => (
                PendingReason::CohortExhausted {
                    flavor: state.flavor_names[flavor].clone(),
                    used: t.map_or(0, |t| state.usage(t, flavor)),
                    nominal: t.and_then(|t| state.quota(t, flavor)).map_or(0, |q| q.nominal),
                    lendable: 0,
                    needed: demand.total_gpus(),
                },
                true,
            ),
            (Err(reason), _) => (reason, false),
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
    let none_offered = || match &state.snap.pending[job.index as usize].demand.gpu_type {
        Some(flavor) => {
            PendingReason::NeverFits { detail: format!("no node of the cluster has GPUs of type {flavor}") }
        }
        None => PendingReason::NeverFits {
            detail: format!(
                "no node of the cluster has GPUs; the job asks for {} per replica",
                human_gpus(u64::from(demand.gpus), None)
            ),
        },
    };
    Err(best.unwrap_or_else(|| (none_offered(), false)))
}

/// Admits a job on spare room where nodes have room for it, in no quota; else why not.
fn try_admit_spare(state: &mut State<'_>, job: &Queued, flavors: &[FlavorId]) -> Result<Admission, PendingReason> {
    let demand = *state.shape(job.shape);
    let warm = &state.snap.pending[job.index as usize].warm_nodes;
    if demand.gpus == 0 {
        let Some(nodes) = state.place_remembered(job.shape, None) else {
            return Err(never_or_no_room(state, job.id, &demand, None));
        };
        let nodes = state.place_warm(&demand, None, warm).unwrap_or(nodes);
        state.allocate(None, None, &demand, &nodes);
        return Ok(admission(state, job.id, None, &nodes));
    }
    let mut best: Option<PendingReason> = None;
    for &flavor in flavors {
        if let Some(nodes) = state.place_remembered(job.shape, Some(flavor)) {
            let nodes = state.place_warm(&demand, Some(flavor), warm).unwrap_or(nodes);
            state.allocate(None, Some(flavor), &demand, &nodes);
            return Ok(admission(state, job.id, Some(flavor), &nodes));
        }
        let reason = match never_or_no_room(state, job.id, &demand, Some(flavor)) {
            PendingReason::NoRoom { flavor, replicas, gpus_per_replica, free_gpus, .. } => {
                PendingReason::NoSpareRoom { flavor, replicas, gpus_per_replica, free_gpus }
            }
            other => other,
        };
        // "No spare room now" over "never" and over a reservation's hold.
        let rank = |r: &PendingReason| match r {
            PendingReason::NeverFits { .. } => 0,
            PendingReason::Reserved { .. } => 1,
            _ => 2,
        };
        if best.as_ref().is_none_or(|b| rank(&reason) > rank(b)) {
            best = Some(reason);
        }
    }
    Err(best.unwrap_or_else(|| PendingReason::NeverFits {
        detail: match &state.snap.pending[job.index as usize].demand.gpu_type {
            Some(flavor) => format!("no node of the cluster has GPUs of type {flavor}"),
            None => "no node of the cluster has GPUs".to_string(),
        },
    }))
}

fn admission(state: &State<'_>, job: Uuid, flavor: Option<FlavorId>, nodes: &[usize]) -> Admission {
    Admission {
        job,
        flavor: flavor.map(|f| state.flavors[f].to_string()),
        nodes: nodes.iter().map(|&i| state.snap.nodes[i].name.clone()).collect(),
    }
}

/// "Can never fit on this cluster" or "no room now".
fn never_or_no_room(state: &State<'_>, job: Uuid, d: &Shape, flavor: Option<FlavorId>) -> PendingReason {
    let no_room = |flavor: Option<FlavorName>, free_gpus: u64| PendingReason::NoRoom {
        flavor,
        replicas: d.replicas,
        gpus_per_replica: d.gpus,
        cpu_millis: d.cpu_millis,
        memory_bytes: d.memory_bytes,
        free_gpus,
    };
    let drained = |state: &State<'_>| {
        state.drained_placement(d, flavor).map(|nodes| {
            let reason = state.snap.nodes.iter().find(|n| n.name == nodes[0]).and_then(|n| n.drained.clone());
            PendingReason::Drained { nodes, reason: reason.unwrap_or_default() }
        })
    };
    let Some(f) = flavor else {
        let fits = state.snap.nodes.iter().any(|n| n.cpu_millis >= d.cpu_millis && n.memory_bytes >= d.memory_bytes);
        return if fits {
            drained(state).unwrap_or_else(|| no_room(None, 0))
        } else {
            PendingReason::NeverFits {
                detail: format!(
                    "no node has {} and {} of memory for one replica",
                    human_cpus(d.cpu_millis),
                    human_memory(d.memory_bytes)
                ),
            }
        };
    };
    let name = state.flavors[f];
    let (one, total) = state.fits_ever(d, f);
    if !one {
        return PendingReason::NeverFits {
            detail: format!(
                "no node has {}, {} and {} of memory for one replica",
                human_gpus(u64::from(d.gpus), Some(name)),
                human_cpus(d.cpu_millis),
                human_memory(d.memory_bytes)
            ),
        };
    }
    if total < u64::from(d.replicas) {
        return PendingReason::NeverFits {
            detail: format!(
                "the cluster holds at most {total} replicas of {}; the job needs {}",
                human_gpus(u64::from(d.gpus), Some(name)),
                d.replicas
            ),
        };
    }
    if let Some(holder) = state.reserved_for(f).filter(|holder| *holder != job) {
        return PendingReason::Reserved { for_job: holder };
    }
    drained(state).unwrap_or_else(|| no_room(Some(state.flavor_names[f].clone()), state.free_of(f)))
}

fn flavor_for_reservation(state: &State<'_>, job: &Queued, t: Option<usize>, flavors: &[FlavorId]) -> Option<FlavorId> {
    let demand = state.shape(job.shape);
    if demand.gpus == 0 {
        return None;
    }
    flavors.iter().copied().find(|&f| state.quota_check(t, f, demand.total_gpus()).is_ok())
}

/// Running jobs by the flavor their quota is counted in.
fn running_by_flavor<'a>(state: &State<'a>) -> Vec<Vec<&'a RunningJob>> {
    let mut by_flavor = vec![Vec::new(); state.flavors.len()];
    for job in &state.snap.running {
        if let Some(flavor) = job.flavor.as_deref().and_then(|f| state.flavor_id(f)) {
            by_flavor[flavor].push(job);
        }
    }
    by_flavor
}

/// The smallest sufficient set of victims for `job`, or `None`. Reclaim first (when the job
/// stays within its tenant's nominal quota): other tenants' jobs running on borrowed quota in
/// the same cohort. Then, when the tenant allows it, the tenant's own lower-priority jobs.
/// Victims are never of higher priority than the job, lowest priority and newest go first, and
/// the set is pruned to the smallest that still suffices.
fn find_victims<'a>(
    state: &mut State<'a>,
    job: &PendingJob,
    flavors: &[FlavorId],
    quota_allows: bool,
    taken: &BTreeSet<Uuid>,
    running_by_flavor: &[Vec<&'a RunningJob>],
) -> Option<(Vec<Uuid>, PreemptionKind)> {
    if job.demand.gpus == 0 {
        return None;
    }
    let snap = state.snap;
    let t = state.tenant(job.tenant)?;
    let cohort = snap.tenants[t].cohort.as_deref();
    let need = job.demand.total_gpus();
    for &flavor in flavors {
        let on_flavor = &running_by_flavor[flavor];
        // Jobs already being stopped will free their resources: count them as gone, so that no
        // one is preempted twice over for the same room. The room of a preemption's victim is
        // its preemptor's alone: another job counting on it would preempt no one, wait for the
        // whole stop and then race the preemptor for it (on a cluster whose pods take their
        // grace period to stop, one such wait after another); it finds victims of its own.
        let stopping: Vec<&RunningJob> = on_flavor
            .iter()
            .copied()
            .filter(|r| r.stopping && r.stopping_for.is_none_or(|for_job| for_job == job.id))
            .collect();
        for r in &stopping {
            take(state, r, true);
        }
        let found = victims_on(state, job, flavor, t, cohort, need, quota_allows, on_flavor, taken, stopping.len());
        // What the job leaves free, node by node, once its victims (and those stopping for it)
        // have gone, where it will run then (`left_after`): held for it in this cycle. The
        // victims are released once more for it; searches are few per cycle (at most 32).
        let left = found.as_ref().map(|(victims, _)| {
            let chosen: Vec<&RunningJob> = on_flavor.iter().copied().filter(|r| victims.contains(&r.id)).collect();
            chosen.iter().for_each(|r| take(state, r, true));
            let left = left_after(state, job, flavor, chosen.iter().chain(&stopping));
            chosen.iter().for_each(|r| take(state, r, false));
            left
        });
        for r in &stopping {
            take(state, r, false);
        }
        if let Some(found) = found {
            // Were the free part of that room handed to a job further down the queue, the
            // preemptor would find its victims' room short when they have gone, and preempt
            // again (round after round, as the replays showed).
            for (node, left) in left.into_iter().flatten() {
                state.hold(node, left);
            }
            return Some(found);
        }
    }
    None
}

#[allow(clippy::too_many_arguments)]
fn victims_on<'a>(
    state: &mut State<'a>,
    job: &PendingJob,
    flavor: FlavorId,
    t: usize,
    cohort: Option<&str>,
    need: u64,
    quota_allows: bool,
    on_flavor: &[&'a RunningJob],
    taken: &BTreeSet<Uuid>,
    stopping: usize,
) -> Option<(Vec<Uuid>, PreemptionKind)> {
    let snap = state.snap;
    if stopping > 0 && job_fits(state, job, flavor) {
        // What is being stopped already makes room: wait for it, preempt no one else.
        return Some((Vec::new(), PreemptionKind::Reclaim));
    }
    let free_to_stop = |r: &RunningJob| !r.stopping && !taken.contains(&r.id);
    // Jobs on spare room make way for any job within its quota, whatever their priorities;
    // the other kinds choose among jobs counted in quotas.
    let eligible = |r: &RunningJob| free_to_stop(r) && !r.spare && r.priority <= job.priority;
    {
        let within_nominal = state.quota(t, flavor).is_some_and(|q| state.usage(t, flavor) + need <= q.nominal);
        let mut tries: Vec<(PreemptionKind, Vec<&'a RunningJob>)> = Vec::new();
        if matches!(state.quota_check(Some(t), flavor, need), Ok(QuotaCheck::Fits)) {
            let mut spare: Vec<&'a RunningJob> =
                on_flavor.iter().copied().filter(|r| r.spare && free_to_stop(r)).collect();
            // The one that would lose least first: saved most recently (or started most
            // recently, having saved nothing since), then the newest.
            spare.sort_by_key(|r| (Reverse(r.unsaved_since()), Reverse(r.started_at), Reverse(r.id)));
            tries.push((PreemptionKind::Spare, spare));
        }
        if quota_allows && within_nominal && cohort.is_some() {
            let borrowers = on_flavor
                .iter()
                .copied()
                .filter(|r| eligible(r) && r.tenant != job.tenant)
                .filter(|r| {
                    state.tenant(r.tenant).is_some_and(|rt| {
                        snap.tenants[rt].cohort.as_deref() == cohort
                            && state.usage(rt, flavor) > state.quota(rt, flavor).map_or(0, |q| q.nominal)
                    })
                })
                .collect();
            tries.push((PreemptionKind::Reclaim, borrowers));
        }
        if snap.tenants[t].preempt_lower_priority {
            let own = on_flavor
                .iter()
                .copied()
                .filter(|r| eligible(r) && r.tenant == job.tenant && r.priority < job.priority)
                .collect();
            tries.push((PreemptionKind::LowerPriority, own));
        }
        for (kind, mut candidates) in tries {
            // Not enough to free even with every candidate gone: do not search.
            let freeable: u64 = candidates.iter().map(|r| r.demand.total_gpus()).sum();
            if freeable + state.free_of(flavor) < need {
                continue;
            }
            // Ties in start time (seconds) go to the larger id: Trainyard's ids are time-ordered (UUIDv7).
            if kind != PreemptionKind::Spare {
                candidates.sort_by_key(|r| (r.priority, Reverse(r.started_at), Reverse(r.id)));
            }
            if let Some(victims) = smallest_sufficient(state, job, flavor, kind, &candidates) {
                return Some((victims, kind));
            }
        }
    }
    None
}

/// Where `job` would run now, with its victims' resources released in `state`, and what it
/// would leave free on each of those nodes: on its victims' nodes when they can hold it, so that
/// it takes as little as possible of what is free beside them.
fn left_after<'r>(
    state: &mut State<'_>,
    job: &PendingJob,
    flavor: FlavorId,
    victims: impl Iterator<Item = &'r &'r RunningJob>,
) -> Vec<(usize, Free)> {
    let shape = Shape::of(&job.demand);
    let their_nodes: Vec<String> = victims.flat_map(|r| r.nodes.iter().cloned()).collect();
    let Some(nodes) =
        state.place_warm(&shape, Some(flavor), &their_nodes).or_else(|| state.place(&shape, Some(flavor)))
    else {
        return Vec::new();
    };
    state.allocate(None, Some(flavor), &shape, &nodes);
    let mut left: Vec<(usize, Free)> = nodes.iter().map(|&node| (node, state.free_on(node))).collect();
    state.release(None, Some(flavor), &shape, &nodes);
    left.sort_unstable_by_key(|(node, _)| *node);
    left.dedup_by_key(|(node, _)| *node);
    left
}

/// Releases (`release`) or takes back a running job's resources in the cycle's bookkeeping.
fn take<'a>(state: &mut State<'a>, r: &RunningJob, release: bool) {
    let nodes = state.running_nodes(r);
    let f = r.flavor.as_deref().and_then(|f| state.flavor_id(f));
    let (t, shape) = (state.quota_tenant(r), Shape::of(&r.demand));
    if release {
        state.release(t, f, &shape, &nodes);
    } else {
        state.allocate(t, f, &shape, &nodes);
    }
}

fn job_fits(state: &State<'_>, job: &PendingJob, flavor: FlavorId) -> bool {
    matches!(state.quota_check(state.tenant(job.tenant), flavor, job.demand.total_gpus()), Ok(QuotaCheck::Fits))
        && state.place(&Shape::of(&job.demand), Some(flavor)).is_some()
}

fn smallest_sufficient<'a>(
    state: &mut State<'a>,
    job: &PendingJob,
    flavor: FlavorId,
    kind: PreemptionKind,
    candidates: &[&'a RunningJob],
) -> Option<Vec<Uuid>> {
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
