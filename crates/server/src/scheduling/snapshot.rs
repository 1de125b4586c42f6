//! The bridge between Postgres rows and the pure scheduler: builds a [`Snapshot`] from what the
//! store holds and what the executor offers.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use trainyard_core::job::JobState;
use trainyard_executor::{Executor, Inventory, NodeInventory};
use trainyard_scheduler::{
    ArrayWindow, Demand, HeldJob, Node, PendingJob, Quota, RunningJob, Settings, Snapshot, TenantPolicy,
};
use trainyard_store::reconcile::{TenantPolicyRow, UnfinishedJob};
use uuid::Uuid;

pub use trainyard_executor::local::LOCAL_NODE;

/// The nodes the scheduler may place on: the executor's own machines when it knows them (a
/// cluster: only schedulable nodes), else its inventory as [`nodes_of`] splits it.
pub fn nodes_for(executor: &dyn Executor) -> Vec<Node> {
    match executor.nodes() {
        Some(nodes) => nodes_of_cluster(&nodes),
        None => nodes_of(&executor.inventory()),
    }
}

/// A cluster's schedulable nodes as the scheduler's nodes (cordoned, not ready or tainted ones
/// are left out, so nothing is placed there).
pub fn nodes_of_cluster(nodes: &[NodeInventory]) -> Vec<Node> {
    nodes
        .iter()
        .filter(|n| n.schedulable)
        .map(|n| Node {
            name: n.name.clone(),
            rack: None,
            gpu_type: n.gpu_type.clone(),
            gpus: n.gpus,
            cpu_millis: n.cpu_millis,
            memory_bytes: n.memory_bytes,
            drained: None,
        })
        .collect()
}

/// The executor's inventory as nodes. The local machine is one node; with GPUs of several types
/// it becomes one node per type (a node has one GPU type), sharing CPU and memory evenly.
pub fn nodes_of(inventory: &Inventory) -> Vec<Node> {
    let mut by_type: BTreeMap<&str, u32> = BTreeMap::new();
    for gpu in &inventory.gpus {
        *by_type.entry(gpu.gpu_type.as_str()).or_default() += 1;
    }
    if by_type.is_empty() {
        return vec![Node {
            name: LOCAL_NODE.into(),
            rack: None,
            gpu_type: None,
            gpus: 0,
            cpu_millis: inventory.cpu_millis,
            memory_bytes: inventory.memory_bytes,
            drained: None,
        }];
    }
    let parts = by_type.len() as u64;
    by_type
        .iter()
        .enumerate()
        .map(|(i, (gpu_type, count))| Node {
            name: if i == 0 { LOCAL_NODE.into() } else { format!("{LOCAL_NODE}-{gpu_type}") },
            rack: None,
            gpu_type: Some(gpu_type.to_string()),
            gpus: *count,
            cpu_millis: inventory.cpu_millis / parts,
            memory_bytes: inventory.memory_bytes / parts,
            drained: None,
        })
        .collect()
}

/// The other nodes of one machine (see [`nodes_of`]) that share `node`'s shard cache: all of
/// them, when `node` is one.
pub fn nodes_sharing_a_cache(machine: &[Node], node: &str) -> Vec<String> {
    if !machine.iter().any(|n| n.name == node) {
        return Vec::new();
    }
    machine.iter().filter(|n| n.name != node).map(|n| n.name.clone()).collect()
}

pub fn policies(rows: &[TenantPolicyRow]) -> Vec<TenantPolicy> {
    rows.iter()
        .map(|t| TenantPolicy {
            id: t.id,
            name: t.name.clone(),
            cohort: t.cohort.clone(),
            weight: t.weight,
            quotas: t
                .quotas
                .iter()
                .map(|q| {
                    let quota = Quota {
                        nominal: q.nominal.max(0) as u64,
                        borrowing_limit: q.borrowing_limit.map(|v| v.max(0) as u64),
                        lending_limit: q.lending_limit.map(|v| v.max(0) as u64),
                    };
                    (q.flavor.clone(), quota)
                })
                .collect(),
            preempt_lower_priority: t.preempt_lower_priority,
        })
        .collect()
}

fn demand_of(job: &UnfinishedJob) -> Demand {
    demand_of_spec(&job.spec)
}

/// What a job's spec asks of the cluster, as the scheduler counts it.
pub fn demand_of_spec(spec: &trainyard_core::job::JobSpec) -> Demand {
    demand(spec.replicas, &spec.resources)
}

/// What `replicas` replicas that each take `r` ask of the cluster.
fn demand(replicas: u32, r: &trainyard_core::resources::Resources) -> Demand {
    Demand {
        replicas,
        gpus: r.gpus,
        gpu_type: r.gpu_type.clone(),
        cpu_millis: r.cpu.millis(),
        memory_bytes: r.memory.bytes(),
    }
}

/// What the replicas of jobs holding capacity take of each node (by the node each replica was
/// placed on), beside what the node has. Replicas placed on a node that is gone are not shown.
pub fn node_usage(nodes: &[Node], jobs: &[Arc<UnfinishedJob>]) -> Vec<trainyard_core::api::NodeUsage> {
    let mut usage: Vec<trainyard_core::api::NodeUsage> = nodes
        .iter()
        .map(|n| trainyard_core::api::NodeUsage {
            name: n.name.clone(),
            gpu_type: n.gpu_type.clone(),
            gpus: n.gpus,
            gpus_allocated: 0,
            cpu_millis: n.cpu_millis,
            cpu_millis_allocated: 0,
            memory_bytes: n.memory_bytes,
            memory_bytes_allocated: 0,
            replicas: 0,
            cached_datasets: Vec::new(),
            drained: None,
        })
        .collect();
    usage.sort_by(|a, b| a.name.cmp(&b.name));
    // By name, so that a cluster of thousands of nodes is one pass over the replicas.
    let index: std::collections::HashMap<String, usize> =
        usage.iter().enumerate().map(|(i, n)| (n.name.clone(), i)).collect();
    for job in jobs.iter().filter(|j| j.state.holds_capacity()) {
        let demand = demand_of_spec(&job.spec);
        for node in job.assigned_nodes.iter().flatten() {
            if let Some(n) = index.get(node).map(|&i| &mut usage[i]) {
                n.gpus_allocated += demand.gpus;
                n.cpu_millis_allocated += demand.cpu_millis;
                n.memory_bytes_allocated += demand.memory_bytes;
                n.replicas += 1;
            }
        }
    }
    usage
}

fn seconds(at: DateTime<Utc>) -> i64 {
    at.timestamp()
}

/// The scheduler's view now, read where it lives: `jobs` (the caller read them), every tenant's
/// policy from the store, the executor's nodes. The one place a snapshot is assembled, for the
/// control loop's admission and for readers (the schedule board, what-if, the quota report).
pub async fn snapshot_now(
    store: &trainyard_store::Store,
    executor: &dyn Executor,
    jobs: &[Arc<UnfinishedJob>],
    ended: &HashSet<Uuid>,
) -> trainyard_core::Result<Snapshot> {
    let tenants = policies(&store.tenant_policies().await?);
    let mut nodes = nodes_for(executor);
    drains_apply(&mut nodes, &store.node_drains().await?);
    Ok(snapshot(Utc::now(), nodes, tenants, jobs, ended))
}

/// Marks the drained nodes among `nodes` (Trainyard's drains, by node name, whichever executor
/// reports the node): the scheduler places nothing new on them.
pub fn drains_apply(nodes: &mut [Node], drains: &[trainyard_core::api::NodeDrain]) {
    for node in nodes {
        node.drained = drains.iter().find(|d| d.node == node.name).map(|d| d.reason.clone());
    }
}

/// The names of every node the executor reports, schedulable or not: what a drain may name.
pub fn node_names(executor: &dyn Executor) -> Vec<String> {
    match executor.nodes() {
        Some(nodes) => nodes.into_iter().map(|n| n.name).collect(),
        None => nodes_of(&executor.inventory()).into_iter().map(|n| n.name).collect(),
    }
}

/// The snapshot the scheduler decides on. Jobs in `ended` (finished in this pass) hold nothing.
pub fn snapshot(
    now: DateTime<Utc>,
    nodes: Vec<Node>,
    tenants: Vec<TenantPolicy>,
    jobs: &[Arc<UnfinishedJob>],
    ended: &HashSet<Uuid>,
) -> Snapshot {
    let default_node = nodes.first().map(|n| n.name.clone()).unwrap_or_else(|| LOCAL_NODE.into());
    let running = jobs
        .iter()
        .filter(|j| j.state.holds_capacity() && !ended.contains(&j.id))
        .map(|j| RunningJob {
            id: j.id,
            tenant: j.tenant_id,
            priority: j.priority,
            demand: demand_of(j),
            flavor: j.flavor.clone(),
            nodes: j.assigned_nodes.clone().unwrap_or_else(|| vec![default_node.clone(); j.spec.replicas as usize]),
            started_at: seconds(j.admitted_at.unwrap_or(j.created_at)),
            expected_runtime: j.expected_runtime_seconds.map(i64::from),
            stopping: j.cancel_requested || j.preempt_requested,
            stopping_for: room_promised_to(j),
            spare: j.spec.spare,
            saved_at: j.saved_at.map(seconds),
        })
        .collect();
    let pending = jobs.iter().filter(|j| j.state == JobState::Queued).map(|j| pending_of(j)).collect();
    // The preemptors whose victims ended in this pass: the room is theirs now.
    let mut nominated: Vec<Uuid> =
        jobs.iter().filter(|j| ended.contains(&j.id)).filter_map(|j| room_promised_to(j)).collect();
    nominated.sort_unstable();
    nominated.dedup();
    Snapshot {
        now: seconds(now),
        nodes,
        tenants,
        running,
        pending,
        settings: Settings::default(),
        nominated,
        held: Vec::new(),
        arrays: Vec::new(),
    }
}

/// A queued job as the scheduler sees it.
fn pending_of(j: &UnfinishedJob) -> PendingJob {
    PendingJob {
        id: j.id,
        tenant: j.tenant_id,
        priority: j.priority,
        // Time-ordered ids: submission order.
        seq: j.created_at.timestamp_micros().max(0) as u64,
        submitted_at: seconds(j.created_at),
        demand: demand_of(j),
        expected_runtime: j.expected_runtime_seconds.map(i64::from),
        warm_nodes: j.warm_nodes.clone(),
        cache_wait_secs: j.spec.cache_wait_seconds.unwrap_or(0),
        spare: j.spec.spare,
    }
}

/// Adds the queued jobs held out of the cycle (`held`: a chain's or an array's, as
/// `Store::jobs_held` says) to the snapshot for start estimates, with their dependencies and
/// their arrays' windows from `chains`. A member of an array counts against its window unless
/// it is held.
pub fn held_add(snapshot: &mut Snapshot, held: &[Arc<UnfinishedJob>], chains: &trainyard_store::chains::ChainsNow) {
    let is_held: HashSet<Uuid> = held.iter().map(|j| j.id).collect();
    let mut after: HashMap<Uuid, Vec<Uuid>> = HashMap::new();
    for (job, dependency) in &chains.dependencies {
        after.entry(*job).or_default().push(*dependency);
    }
    let mut windows: Vec<ArrayWindow> = Vec::new();
    let mut array_of: HashMap<Uuid, Uuid> = HashMap::new();
    for (array, limit, member) in &chains.arrays {
        if windows.last().is_none_or(|w| w.id != *array) {
            windows.push(ArrayWindow { id: *array, limit: (*limit).max(1) as u32, members: Vec::new() });
        }
        if let Some(window) = windows.last_mut() {
            if is_held.contains(member) {
                array_of.insert(*member, *array);
            } else {
                window.members.push(*member);
            }
        }
    }
    // Released in the order the store lists an array's members (by index), the rest by
    // submission.
    let rank: HashMap<Uuid, usize> = chains.arrays.iter().enumerate().map(|(i, (_, _, m))| (*m, i)).collect();
    let mut jobs: Vec<&Arc<UnfinishedJob>> = held.iter().filter(|j| j.state == JobState::Queued).collect();
    jobs.sort_by_key(|j| (rank.get(&j.id).copied().unwrap_or(usize::MAX), j.created_at));
    snapshot.held = jobs
        .into_iter()
        .map(|j| HeldJob {
            job: pending_of(j),
            after: after.remove(&j.id).unwrap_or_default(),
            array: array_of.get(&j.id).copied(),
        })
        .collect();
    let holding: HashSet<Uuid> = array_of.values().copied().collect();
    windows.retain(|w| holding.contains(&w.id));
    snapshot.arrays = windows;
}

/// A job whose row does not decode, as the scheduler counts it while it holds capacity: what its
/// replicas take (read from its stored spec field by field), on the nodes it was placed on.
/// `None` when it holds nothing or what it takes cannot be read (then it is not counted, and
/// `/readyz` counts it among the unhandled jobs).
pub fn running_unreadable(job: &trainyard_store::reconcile::UnhandledJob, default_node: &str) -> Option<RunningJob> {
    if !job.state.is_some_and(|state| state.holds_capacity()) {
        return None;
    }
    let (replicas, resources) = (job.replicas?, job.resources.as_ref()?);
    Some(RunningJob {
        id: job.id,
        tenant: job.tenant_id,
        priority: job.priority,
        demand: demand(replicas, resources),
        flavor: job.flavor.clone(),
        nodes: job.assigned_nodes.clone().unwrap_or_else(|| vec![default_node.to_string(); replicas as usize]),
        started_at: seconds(job.since),
        expected_runtime: None,
        stopping: job.cancel_requested,
        stopping_for: None,
        // Its spec does not decode: counted in its tenant's quota, which is the safe side.
        spare: false,
        saved_at: None,
    })
}

/// The job a preemption is stopping `job` for, while it stops: the room it frees is that job's.
/// A cancel frees the room for anyone, whatever preemption came before it.
fn room_promised_to(job: &UnfinishedJob) -> Option<Uuid> {
    (job.preempt_requested && !job.cancel_requested).then_some(job.preempted_for).flatten()
}

/// An unfinished job of `gpus` GPUs (type `h100`) for the tests of the server's modules.
#[cfg(test)]
pub(crate) fn job_for_tests(tenant: &str, state: JobState, gpus: u32) -> UnfinishedJob {
    let spec = serde_json::from_value(serde_json::json!({
        "command": ["x"], "args": [], "env": {}, "replicas": 1, "resources": {"gpus": gpus}
    }))
    .expect("a spec");
    UnfinishedJob {
        id: Uuid::now_v7(),
        tenant_id: Uuid::nil(),
        tenant: tenant.into(),
        name: "j".into(),
        created_by: Uuid::nil(),
        state,
        reason: None,
        spec: Arc::new(spec),
        priority: 0,
        max_restarts: 0,
        restart_count: 0,
        cancel_requested: false,
        preempt_requested: false,
        preempted_for: None,
        created_at: Utc::now(),
        admitted_at: None,
        flavor: Some("h100".into()),
        assigned_nodes: None,
        warm_nodes: Vec::new(),
        expected_runtime_seconds: None,
        attempt: None,
        saved_at: None,
    }
}

#[cfg(test)]
mod nomination_tests {
    use super::*;

    #[test]
    fn a_preemptor_goes_first_in_the_pass_that_records_its_victims_end() {
        let preemptor = job_for_tests("a", JobState::Queued, 4);
        let victim = |cancelled: bool| {
            let mut victim = job_for_tests("a", JobState::Running, 2);
            victim.preempt_requested = true;
            victim.preempted_for = Some(preemptor.id);
            victim.cancel_requested = cancelled;
            Arc::new(victim)
        };
        let (stopped, still_stopping, cancelled) = (victim(false), victim(false), victim(true));
        let jobs = vec![Arc::new(preemptor.clone()), Arc::clone(&stopped), still_stopping, Arc::clone(&cancelled)];
        let nominated = |ended: &[&Arc<UnfinishedJob>]| {
            let ended: HashSet<Uuid> = ended.iter().map(|j| j.id).collect();
            snapshot(Utc::now(), Vec::new(), Vec::new(), &jobs, &ended).nominated
        };
        assert!(nominated(&[]).is_empty(), "its victims are still stopping");
        assert_eq!(nominated(&[&stopped]), [preemptor.id], "one victim ended in this pass: the room is its");
        // A cancel frees the room for anyone, whatever preemption came before it.
        assert!(nominated(&[&cancelled]).is_empty());
    }
}

#[cfg(test)]
mod cluster_tests {
    use super::*;

    fn node(name: &str, gpus: u32, schedulable: bool) -> NodeInventory {
        NodeInventory {
            name: name.into(),
            gpu_type: (gpus > 0).then(|| "nvidia-h100-80gb-hbm3".to_string()),
            gpus,
            cpu_millis: 64_000,
            memory_bytes: 512 << 30,
            schedulable,
        }
    }

    #[test]
    fn the_local_machines_nodes_share_its_cache_and_a_stranger_shares_none() {
        let gpu = |gpu_type: &str| trainyard_executor::Gpu { index: 0, gpu_type: gpu_type.into() };
        let inventory =
            Inventory { gpus: vec![gpu("a100"), gpu("h100"), gpu("h100")], cpu_millis: 8000, memory_bytes: 1 << 34 };
        let machine = nodes_of(&inventory);
        let names: Vec<&str> = machine.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["local", "local-h100"]);
        assert_eq!(nodes_sharing_a_cache(&machine, "local-h100"), ["local"]);
        assert_eq!(nodes_sharing_a_cache(&machine, "local"), ["local-h100"]);
        assert!(nodes_sharing_a_cache(&machine, "gpu-7").is_empty(), "not a node of this machine");
        let one = nodes_of(&Inventory { gpus: vec![], cpu_millis: 8000, memory_bytes: 1 << 34 });
        assert!(nodes_sharing_a_cache(&one, "local").is_empty());
    }

    #[test]
    fn each_schedulable_cluster_node_is_a_scheduler_node_and_cordoned_ones_are_left_out() {
        let nodes = nodes_of_cluster(&[node("gpu-1", 8, true), node("gpu-2", 8, false), node("cpu-1", 0, true)]);
        let names: Vec<(&str, u32, Option<&str>)> =
            nodes.iter().map(|n| (n.name.as_str(), n.gpus, n.gpu_type.as_deref())).collect();
        assert_eq!(names, [("gpu-1", 8, Some("nvidia-h100-80gb-hbm3")), ("cpu-1", 0, None)]);
    }
}

/// The most GPUs a tenant can ever hold under its quotas, mirrored into the executor as a
/// second line of defence (a Kubernetes ResourceQuota): its nominal quotas plus what it may
/// borrow. Unlimited when it may borrow without limit from a cohort. CPU and memory have no
/// quota in Trainyard, so no ceiling either.
pub fn ceiling_of(tenant: &TenantPolicyRow) -> trainyard_executor::QuotaCeiling {
    let mut gpus: Option<u64> = Some(0);
    for quota in &tenant.quotas {
        let borrow = match (&tenant.cohort, quota.borrowing_limit) {
            (None, _) => Some(0),
            (Some(_), limit) => limit.map(|l| l.max(0) as u64),
        };
        gpus = match (gpus, borrow) {
            (Some(total), Some(borrow)) => Some(total + quota.nominal.max(0) as u64 + borrow),
            _ => None,
        };
    }
    trainyard_executor::QuotaCeiling {
        gpus: gpus.map(|g| g.min(u64::from(u32::MAX)) as u32),
        cpu_millis: None,
        memory_bytes: None,
    }
}

#[cfg(test)]
mod ceiling_tests {
    use trainyard_store::reconcile::QuotaRow;

    use super::*;

    fn tenant(cohort: Option<&str>, quotas: &[(i64, Option<i64>)]) -> TenantPolicyRow {
        TenantPolicyRow {
            id: Uuid::nil(),
            name: "team".into(),
            cohort: cohort.map(str::to_string),
            weight: 1.0,
            preempt_lower_priority: false,
            quotas: quotas
                .iter()
                .enumerate()
                .map(|(i, (nominal, borrowing_limit))| QuotaRow {
                    flavor: format!("gpu-{i}"),
                    nominal: *nominal,
                    borrowing_limit: *borrowing_limit,
                    lending_limit: None,
                })
                .collect(),
        }
    }

    #[test]
    fn the_ceiling_is_nominal_plus_what_may_be_borrowed() {
        // Alone, nothing can be borrowed, whatever the limits say.
        assert_eq!(ceiling_of(&tenant(None, &[(8, None), (4, Some(2))])).gpus, Some(12));
        assert_eq!(ceiling_of(&tenant(Some("c"), &[(8, Some(8)), (4, Some(2))])).gpus, Some(22));
        // Unlimited borrowing from a cohort: no ceiling, never a ceiling of zero.
        assert_eq!(ceiling_of(&tenant(Some("c"), &[(8, None)])).gpus, None);
        assert_eq!(ceiling_of(&tenant(None, &[])).gpus, Some(0));
    }
}
