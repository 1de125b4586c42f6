//! What a cycle decides, and why a job waits.

use std::fmt;

use trainyard_core::resources::{human_cpus, human_gpus, human_memory};
use uuid::Uuid;

use std::sync::Arc;

use crate::model::Flavor;

/// A flavor's name in a reason: shared, so that the thousands of reasons of one cycle do not
/// each copy it.
pub type FlavorName = Arc<str>;

/// A job admitted now, with where each replica goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    pub job: Uuid,
    /// Counted against this flavor's quota (`None` for CPU-only jobs).
    pub flavor: Option<Flavor>,
    /// The node of each replica, by name.
    pub nodes: Vec<String>,
}

/// A running job to stop so that a waiting one can start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preemption {
    pub victim: Uuid,
    pub for_job: Uuid,
    pub kind: PreemptionKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreemptionKind {
    /// The victim's tenant was borrowing; the preemptor's tenant asks for its own nominal quota.
    Reclaim,
    /// Same tenant, lower priority, and the tenant allows it.
    LowerPriority,
    /// The victim ran on spare room, which a job within its quota needs.
    Spare,
}

/// A job that stays queued, where it stands, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub job: Uuid,
    pub reason: PendingReason,
    /// 1-based position among its tenant's waiting jobs.
    pub tenant_position: usize,
    /// 1-based position among all waiting jobs, in the order the scheduler considers them.
    pub cluster_position: usize,
    /// Higher-priority jobs of the same tenant still waiting ahead of it.
    pub behind_higher_priority: usize,
}

/// Why a job is not running yet: structured, so the API can show it and tests can match it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PendingReason {
    /// The tenant has no quota for this flavor.
    NoQuota { flavor: FlavorName },
    /// No node of the cluster could ever hold one replica.
    NeverFits { detail: String },
    /// Nominal plus the borrowing limit would be exceeded.
    QuotaExceeded { flavor: FlavorName, used: u64, nominal: u64, borrowing_limit: Option<u64>, needed: u64 },
    /// Within the tenant's limits, but the cohort has no idle quota to lend.
    CohortExhausted { flavor: FlavorName, used: u64, nominal: u64, lendable: u64, needed: u64 },
    /// Quota allows it, but no set of nodes has room for every replica now.
    NoRoom {
        flavor: Option<FlavorName>,
        replicas: u32,
        gpus_per_replica: u32,
        /// What one replica needs besides GPUs.
        cpu_millis: u64,
        memory_bytes: u64,
        free_gpus: u64,
    },
    /// Nodes are held for a job that has waited long (the starvation rule).
    Reserved { for_job: Uuid },
    /// Jobs are being preempted to make room for this one.
    WaitingForPreemption { victims: usize },
    /// The job asked to wait for room on a node whose cache holds its data, until `until`
    /// (seconds since the epoch); `nodes` of the cluster's nodes hold it.
    WaitingForCache { nodes: usize, until: i64 },
    /// Room enough for it is on drained nodes only (an admin's drain): it waits for room
    /// elsewhere or for the nodes' undrain. `nodes`: the drained nodes it would take, by name.
    Drained { nodes: Vec<String>, reason: String },
    /// A job on spare room: no set of nodes has room for it that no job with quota waits for.
    NoSpareRoom { flavor: Option<FlavorName>, replicas: u32, gpus_per_replica: u32, free_gpus: u64 },
}

/// Every amount in a reason is in the units people use (`2.5 CPUs`, `16 GiB`, `8 GPUs of
/// nvidia-h100-80gb`), through `trainyard_core::resources`' `human_*`: never millicores or bytes.
impl fmt::Display for PendingReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PendingReason::NoQuota { flavor } => write!(f, "the tenant has no quota for {flavor}"),
            PendingReason::NeverFits { detail } => write!(f, "{detail}"),
            PendingReason::QuotaExceeded { flavor, used, nominal, borrowing_limit, needed } => {
                write!(f, "tenant quota for {flavor}: {used} of {} in use", human_gpus(*nominal, None))?;
                match borrowing_limit {
                    Some(limit) => write!(f, ", may borrow {limit} more")?,
                    None => write!(f, ", may borrow without limit")?,
                }
                write!(f, "; the job needs {}", human_gpus(*needed, None))
            }
            PendingReason::CohortExhausted { flavor, used, nominal, lendable, needed } => write!(
                f,
                "tenant quota for {flavor}: {used} of {} in use, the cohort lends {lendable}; the job needs {}",
                human_gpus(*nominal, None),
                human_gpus(*needed, None)
            ),
            PendingReason::NoRoom { flavor, replicas, gpus_per_replica, cpu_millis, memory_bytes, free_gpus } => {
                match flavor {
                    Some(flavor) => write!(
                        f,
                        "no set of nodes has {replicas} x {} free now ({free_gpus} free in all)",
                        human_gpus(u64::from(*gpus_per_replica), Some(flavor))
                    ),
                    None => write!(
                        f,
                        "no node has room now for {replicas} {} of {} and {} of memory",
                        if *replicas == 1 { "replica" } else { "replicas" },
                        human_cpus(*cpu_millis),
                        human_memory(*memory_bytes)
                    ),
                }
            }
            PendingReason::Reserved { for_job } => {
                write!(f, "the nodes it fits on are held for job {for_job}, which has waited longest")
            }
            PendingReason::WaitingForPreemption { victims: 0 } => {
                write!(f, "jobs are being stopped to make room; starts when they have stopped")
            }
            PendingReason::WaitingForPreemption { victims } => {
                write!(f, "preempting {victims} job(s) to make room; starts when they have stopped")
            }
            PendingReason::NoSpareRoom { flavor, replicas, gpus_per_replica, free_gpus } => {
                let gpus = human_gpus(u64::from(*gpus_per_replica), flavor.as_deref());
                write!(
                    f,
                    "runs on spare room only (GPUs no job within its quota waits for): no set of nodes has \
                     {replicas} x {gpus} free now ({free_gpus} free in all)"
                )
            }
            PendingReason::Drained { nodes, reason } => {
                let (noun, verb) = if nodes.len() == 1 { ("node", "is") } else { ("nodes", "are") };
                write!(f, "{noun} {} {verb} drained", nodes.join(", "))?;
                if !reason.is_empty() {
                    write!(f, ": {reason}")?;
                }
                write!(f, "; no other node has room for the job now")
            }
            PendingReason::WaitingForCache { nodes, until } => {
                let until = chrono::DateTime::from_timestamp(*until, 0)
                    .map_or_else(|| until.to_string(), |t| t.format("%H:%M:%S UTC").to_string());
                write!(
                    f,
                    "waiting for room on the {} that {} its data, as the job asked, until {until}; then on any node",
                    if *nodes == 1 { "node".to_string() } else { format!("{nodes} nodes") },
                    if *nodes == 1 { "caches" } else { "cache" },
                )
            }
        }
    }
}

/// Everything one admission cycle decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CycleResult {
    pub admissions: Vec<Admission>,
    pub preemptions: Vec<Preemption>,
    pub pending: Vec<Pending>,
}
