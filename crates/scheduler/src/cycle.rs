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
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};

use smallvec::SmallVec;
use uuid::Uuid;

use crate::decision::{Admission, CycleResult, Pending, PendingReason, Preemption, PreemptionKind};
use crate::model::{PendingJob, RunningJob, Snapshot};
use crate::state::{FlavorId, QuotaCheck, State};

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
    let mut result = CycleResult::default();

    // Each tenant's queue, in its own order; tenants without a policy queue too (they get
    // "no quota" for GPU jobs but may run CPU-only ones).
    // Tenants by small index, queues of job positions: the hot loop compares integers.
    let mut tenant_ids: Vec<Uuid> = Vec::new();
    let mut tenant_of: std::collections::HashMap<Uuid, u32> = std::collections::HashMap::new();
    let job_tenant: Vec<u32> = snap
        .pending
        .iter()
        .map(|j| {
            *tenant_of.entry(j.tenant).or_insert_with(|| {
                tenant_ids.push(j.tenant);
                (tenant_ids.len() - 1) as u32
            })
        })
        .collect();
    // The flavor each job names, looked up once (names are strings; the loop compares ids).
    let job_flavor: Vec<NamedFlavor> = snap.pending.iter().map(|j| named_flavor(&state, j)).collect();
    // Each queued tenant's index in the state (None: a tenant without a policy).
    let policy_of: Vec<Option<usize>> = tenant_ids.iter().map(|id| state.tenant(*id)).collect();
    // Sorted by tenant, priority (descending), submission order, then id; packed for speed.
    let mut sorted: Vec<(u64, u64, u32)> = snap
        .pending
        .iter()
        .enumerate()
        .map(|(i, j)| {
            let priority_desc = u64::from(u32::MAX - (i64::from(j.priority) - i64::from(i32::MIN)) as u32);
            ((u64::from(job_tenant[i]) << 32) | priority_desc, j.seq, i as u32)
        })
        .collect();
    sorted.sort_unstable_by(|a, b| {
        (a.0, a.1).cmp(&(b.0, b.1)).then_with(|| snap.pending[a.2 as usize].id.cmp(&snap.pending[b.2 as usize].id))
    });
    let mut queues: Vec<VecDeque<usize>> = vec![VecDeque::new(); tenant_ids.len()];
    for (rank, &(key, ..)) in sorted.iter().enumerate() {
        queues[(key >> 32) as usize].push_back(rank);
    }

    let mut heap = BinaryHeap::with_capacity(queues.len());
    for (tenant, queue) in queues.iter().enumerate() {
        if let Some(&head) = queue.front() {
            heap.push(Reverse(order_key(&state, &policy_of, tenant as u32, &sorted, head)));
        }
    }
    let mut victims_taken: BTreeSet<Uuid> = BTreeSet::new();
    // Tenants whose first waiting job was searched for preemption victims, and how many.
    let mut searched = vec![false; tenant_ids.len()];
    let mut searches = 0;
    let running_by_flavor = running_by_flavor(snap);
    // Per tenant: jobs left waiting so far, and how many of them share the latest priority (a
    // tenant's jobs come in priority order, so the rest had a higher one).
    let mut waiting: Vec<(usize, i32, usize)> = vec![(0, i32::MIN, 0); tenant_ids.len()];

    while let Some(Reverse(key)) = heap.pop() {
        let queue = &mut queues[key.tenant() as usize];
        let rank = queue.pop_front().expect("the head that was pushed");
        let job = &snap.pending[sorted[rank].2 as usize];

        match try_admit(&mut state, job, policy_of[key.tenant() as usize], job_flavor[sorted[rank].2 as usize]) {
            Ok(admission) => result.admissions.push(admission),
            Err((reason, quota_allows)) => {
                let mut reason = reason;
                // Preemption is searched for the first waiting job of each tenant only, and for at
                // most a few jobs per cycle: bounded work, and the next cycle serves the rest.
                let may_search =
                    options.preempt && searches < MAX_PREEMPTION_SEARCHES && !searched[key.tenant() as usize];
                if may_search {
                    searched[key.tenant() as usize] = true;
                    searches += 1;
                }
                if may_search
                    && let Some((victims, kind)) =
                        find_victims(&mut state, job, quota_allows, &victims_taken, &running_by_flavor)
                {
                    reason = PendingReason::WaitingForPreemption { victims: victims.len() };
                    for victim in victims {
                        victims_taken.insert(victim);
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
                let entry = &mut waiting[key.tenant() as usize];
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
        if let Some(&next) = queues[key.tenant() as usize].front() {
            heap.push(Reverse(order_key(&state, &policy_of, key.tenant(), &sorted, next)));
        }
    }
    result
}

/// Fair-share order across tenants, then priority, then submission order, then the job's place
/// in the cycle's sorted queue (which breaks ties by tenant, then job id). Packed into two
/// integers, compared as such: the heap compares these millions of times a cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct OrderKey {
    /// Dominant share (millionths, saturating at u32), priority (descending), seq.
    order: u128,
    /// The job's rank in the sorted queue, then its tenant's queue.
    place: u64,
}

impl OrderKey {
    fn tenant(&self) -> u32 {
        self.place as u32
    }
}

fn order_key(
    state: &State<'_>,
    policy_of: &[Option<usize>],
    tenant: u32,
    sorted: &[(u64, u64, u32)],
    rank: usize,
) -> OrderKey {
    let job = &state.snap.pending[sorted[rank].2 as usize];
    let share = dominant_share(state, policy_of[tenant as usize]).min(u64::from(u32::MAX));
    let priority_desc = u64::from(u32::MAX - (i64::from(job.priority) - i64::from(i32::MIN)) as u32);
    OrderKey {
        order: (u128::from((share << 32) | priority_desc) << 64) | u128::from(job.seq),
        place: ((rank as u64) << 32) | u64::from(tenant),
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

/// Flavors a job could use: the one it names, or every flavor its tenant has quota for (every
/// flavor of the cluster, when it has none, so that the reason says so).
/// `named` is [`named_flavor`] of the job, looked up once per cycle by the hot path.
fn flavors_for(state: &State<'_>, named: NamedFlavor, t: Option<usize>) -> SmallVec<[FlavorId; 4]> {
    match named {
        Some(id) => id.into_iter().collect(),
        None => {
            let flavors = state.quota_flavors(t);
            if flavors.is_empty() { (0..state.flavors.len()).collect() } else { flavors }
        }
    }
}

/// Admits the job if quota and nodes allow; else the most telling reason, and whether the job
/// would fit its nominal quota were borrowers reclaimed.
/// The flavor a job names: `None` when it names none (any will do), `Some(None)` when it names
/// one the cluster does not know.
type NamedFlavor = Option<Option<FlavorId>>;

fn named_flavor(state: &State<'_>, job: &PendingJob) -> NamedFlavor {
    job.demand.gpu_type.as_deref().map(|name| state.flavor_id(name))
}

/// `t` is the job's tenant's index in the state (`None`: a tenant without a policy); `named`
/// its [`named_flavor`].
fn try_admit(
    state: &mut State<'_>,
    job: &PendingJob,
    t: Option<usize>,
    named: NamedFlavor,
) -> Result<Admission, (PendingReason, bool)> {
    let demand = &job.demand;
    if demand.gpus == 0 {
        return match state.place_remembered(demand, None) {
            Some(nodes) => {
                state.allocate(job.tenant, None, demand, &nodes);
                Ok(admission(state, job, None, &nodes))
            }
            None => Err((never_or_no_room(state, job, None), false)),
        };
    }
    let mut best: Option<(PendingReason, bool)> = None;
    for flavor in flavors_for(state, named, t) {
        let reason = match state.quota_check(t, flavor, demand.total_gpus()) {
            Ok(QuotaCheck::Fits) => match state.place_remembered(demand, Some(flavor)) {
                Some(nodes) => {
                    state.allocate(job.tenant, Some(flavor), demand, &nodes);
                    return Ok(admission(state, job, Some(flavor), &nodes));
                }
                None => (never_or_no_room(state, job, Some(flavor)), true),
            },
            Ok(QuotaCheck::Reclaimable) => (
                PendingReason::CohortExhausted {
                    flavor: state.flavor_names[flavor].clone(),
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
    let Some(f) = flavor else {
        let fits = state.snap.nodes.iter().any(|n| n.cpu_millis >= d.cpu_millis && n.memory_bytes >= d.memory_bytes);
        return if fits {
            PendingReason::NoRoom { flavor: None, replicas: d.replicas, gpus_per_replica: 0, free_gpus: 0 }
        } else {
            PendingReason::NeverFits {
                detail: format!(
                    "no node has {} cpu millicores and {} bytes of memory for one replica",
                    d.cpu_millis, d.memory_bytes
                ),
            }
        };
    };
    let name = state.flavors[f];
    let (one, total) = state.fits_ever(d, f);
    if !one {
        return PendingReason::NeverFits {
            detail: format!(
                "no node has {} GPUs of {name}, {} cpu millicores and {} bytes of memory for one replica",
                d.gpus, d.cpu_millis, d.memory_bytes
            ),
        };
    }
    if total < u64::from(d.replicas) {
        return PendingReason::NeverFits {
            detail: format!(
                "the cluster holds at most {total} replicas of {} GPUs of {name}; the job needs {}",
                d.gpus, d.replicas
            ),
        };
    }
    if let Some(holder) = state.reserved_for(f).filter(|holder| *holder != job.id) {
        return PendingReason::Reserved { for_job: holder };
    }
    PendingReason::NoRoom {
        flavor: Some(state.flavor_names[f].clone()),
        replicas: d.replicas,
        gpus_per_replica: d.gpus,
        free_gpus: state.free_of(f),
    }
}

fn flavor_for_reservation(state: &State<'_>, job: &PendingJob) -> Option<FlavorId> {
    if job.demand.gpus == 0 {
        return None;
    }
    let t = state.tenant(job.tenant);
    flavors_for(state, named_flavor(state, job), t)
        .into_iter()
        .find(|&f| state.quota_check(t, f, job.demand.total_gpus()).is_ok())
}

/// Running jobs by the flavor their quota is counted in.
fn running_by_flavor(snap: &Snapshot) -> BTreeMap<&str, Vec<&RunningJob>> {
    let mut by_flavor: BTreeMap<&str, Vec<&RunningJob>> = BTreeMap::new();
    for job in &snap.running {
        if let Some(flavor) = job.flavor.as_deref() {
            by_flavor.entry(flavor).or_default().push(job);
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
    quota_allows: bool,
    taken: &BTreeSet<Uuid>,
    running_by_flavor: &BTreeMap<&str, Vec<&'a RunningJob>>,
) -> Option<(Vec<Uuid>, PreemptionKind)> {
    if job.demand.gpus == 0 {
        return None;
    }
    let snap = state.snap;
    let t = state.tenant(job.tenant)?;
    let cohort = snap.tenants[t].cohort.as_deref();
    let need = job.demand.total_gpus();
    let eligible = |r: &RunningJob| !r.stopping && !taken.contains(&r.id) && r.priority <= job.priority;
    for flavor in flavors_for(state, named_flavor(state, job), Some(t)) {
        let Some(on_flavor) = running_by_flavor.get(state.flavors[flavor]) else { continue };
        // Jobs already being stopped (victims of an earlier cycle) will free their resources:
        // count them as gone, so that no one is preempted twice over for the same room.
        let stopping: Vec<&RunningJob> = on_flavor.iter().copied().filter(|r| r.stopping).collect();
        for r in &stopping {
            take(state, r, true);
        }
        let found = victims_on(state, job, flavor, t, cohort, need, quota_allows, on_flavor, &eligible, stopping.len());
        for r in &stopping {
            take(state, r, false);
        }
        if found.is_some() {
            return found;
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
    eligible: &dyn Fn(&RunningJob) -> bool,
    stopping: usize,
) -> Option<(Vec<Uuid>, PreemptionKind)> {
    let snap = state.snap;
    if stopping > 0 && job_fits(state, job, flavor) {
        // What is being stopped already makes room: wait for it, preempt no one else.
        return Some((Vec::new(), PreemptionKind::Reclaim));
    }
    {
        let within_nominal = state.quota(t, flavor).is_some_and(|q| state.usage(t, flavor) + need <= q.nominal);
        let mut tries: Vec<(PreemptionKind, Vec<&'a RunningJob>)> = Vec::new();
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
            candidates.sort_by_key(|r| (r.priority, Reverse(r.started_at), Reverse(r.id)));
            if let Some(victims) = smallest_sufficient(state, job, flavor, kind, &candidates) {
                return Some((victims, kind));
            }
        }
    }
    None
}

/// Releases (`release`) or takes back a running job's resources in the cycle's bookkeeping.
fn take<'a>(state: &mut State<'a>, r: &RunningJob, release: bool) {
    let nodes = state.running_nodes(r);
    let f = r.flavor.as_deref().and_then(|f| state.flavor_id(f));
    if release {
        state.release(r.tenant, f, &r.demand, &nodes);
    } else {
        state.allocate(r.tenant, f, &r.demand, &nodes);
    }
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
