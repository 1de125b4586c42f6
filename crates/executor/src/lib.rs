//! Executors turn an admitted job attempt into running replicas, report what they observe, stop
//! them, and hand out their logs. The reconciler in the server drives them; they hold no intent
//! of their own (that lives in Postgres) and every call is safe to repeat.
//!
//! Backends: [`local`] (child processes on this machine, the embedded default) and the
//! Kubernetes backend in the `trainyard-kube` crate, behind the same trait. The methods with
//! default bodies ([`Executor::replica_details`], [`Executor::nodes`],
//! [`Executor::tenant_ceiling_set`]) carry what only a cluster backend knows; the local backend
//! keeps their defaults.

#![deny(clippy::unwrap_used)]

pub mod local;

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::io::AsyncRead;
use trainyard_core::job::JobSpec;
use uuid::Uuid;

/// What an executor can offer to jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub gpus: Vec<Gpu>,
}

impl Inventory {
    /// The distinct GPU types on offer, sorted.
    pub fn gpu_types(&self) -> Vec<String> {
        let mut types: Vec<String> = self.gpus.iter().map(|g| g.gpu_type.clone()).collect();
        types.sort();
        types.dedup();
        types
    }
}

/// One accelerator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    pub index: u32,
    /// Normalised type, e.g. `nvidia-h100-80gb-hbm3`.
    pub gpu_type: String,
}

/// One attempt of one job, as the executor should launch it. Its `Debug` names the attempt's
/// variables without their values (the job token is one), and the files by path.
#[derive(Clone)]
pub struct LaunchRequest {
    pub job_id: Uuid,
    pub tenant_id: Uuid,
    /// The tenant's name (a DNS label), for names people read: the Kubernetes namespace.
    pub tenant: String,
    pub attempt: i32,
    pub spec: JobSpec,
    /// The template's files, delivered under `template/` in each replica's working directory.
    pub files: BTreeMap<String, Vec<u8>>,
    /// Variables for this attempt only, never stored with the spec (the job token, the API URL).
    pub env: BTreeMap<String, String>,
    /// Variables of one replica, by rank, over `env` (empty: every replica gets `env` alone):
    /// each rank's own MLflow token. The local executor gives them; on Kubernetes, where the
    /// pods of an attempt share one template, every replica gets `env` (docs/tracking.md).
    pub env_by_rank: Vec<BTreeMap<String, String>>,
    /// The code shipped with the job (`spec.code`, unpacked): every replica's working directory
    /// starts with these files.
    pub code: Vec<CodeFile>,
    /// The node the scheduler placed each replica on, by rank (empty when it did not say): a
    /// cluster executor steers the replicas there; replicas see theirs as `TRAINYARD_NODE`.
    pub nodes: Vec<String>,
}

impl std::fmt::Debug for LaunchRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchRequest")
            .field("job_id", &self.job_id)
            .field("tenant_id", &self.tenant_id)
            .field("tenant", &self.tenant)
            .field("attempt", &self.attempt)
            .field("spec", &self.spec)
            .field("files", &self.files.keys().collect::<Vec<_>>())
            .field("env", &self.env.keys().map(|name| (name, "<redacted>")).collect::<BTreeMap<_, _>>())
            .field(
                "env_by_rank",
                &self.env_by_rank.iter().map(|env| env.keys().collect::<Vec<_>>()).collect::<Vec<_>>(),
            )
            .field("code", &self.code.iter().map(|file| &file.path).collect::<Vec<_>>())
            .field("nodes", &self.nodes)
            .finish()
    }
}

/// One file of the code shipped with a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeFile {
    /// Relative, `/`-separated, no `..`.
    pub path: String,
    pub executable: bool,
    pub content: Vec<u8>,
}

/// An attempt the executor launched before, as recorded in Postgres. Enough to find its
/// replicas again after the control plane restarts.
#[derive(Debug, Clone)]
pub struct AttemptRef {
    pub job_id: Uuid,
    pub attempt: i32,
    pub replicas: u32,
    /// What [`Executor::launch`] returned, or `None` if the control plane died mid-launch.
    pub placement: Option<serde_json::Value>,
}

/// What became of one replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaStatus {
    Running,
    /// Ended with this exit code (128 + N when killed by signal N, as shells report it).
    Exited(i32),
    /// Vanished without a recorded exit (killed with its supervisor, machine rebooted).
    Lost,
}

/// Where a replica is in its life, in more detail than [`ReplicaStatus`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaPhase {
    /// Accepted but not running yet: waiting for a node, pulling its image, starting.
    Pending,
    Running,
    Succeeded,
    Failed,
}

/// Why a replica failed when its exit code alone does not say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureReason {
    /// The program exited with a non-zero code of its own.
    Error,
    /// Killed by the kernel for using more memory than its limit.
    OomKilled,
    /// Evicted from its node (node pressure, drain).
    Evicted,
    /// Its image could not be pulled (wrong name, no access), for longer than the executor waits.
    ImagePullBackOff,
    /// No node could take it for longer than the executor waits.
    Unschedulable,
    /// Its node stopped answering or vanished.
    NodeLost,
    /// It vanished without a trace (deleted by someone else).
    Lost,
}

impl FailureReason {
    /// A short stable name for reasons and metrics: `OOMKilled`, `Evicted`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::Error => "Error",
            FailureReason::OomKilled => "OOMKilled",
            FailureReason::Evicted => "Evicted",
            FailureReason::ImagePullBackOff => "ImagePullBackOff",
            FailureReason::Unschedulable => "Unschedulable",
            FailureReason::NodeLost => "NodeLost",
            FailureReason::Lost => "Lost",
        }
    }
}

/// What an executor knows about one replica beyond its [`ReplicaStatus`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaDetail {
    pub rank: u32,
    pub phase: ReplicaPhase,
    pub exit_code: Option<i32>,
    /// Set when `phase` is [`ReplicaPhase::Failed`].
    pub reason: Option<FailureReason>,
    /// A sentence for people, e.g. the scheduler's or the image puller's message.
    pub message: Option<String>,
    /// The image actually run, by digest (`repo@sha256:...`), once known.
    pub image_digest: Option<String>,
    /// The machine it runs on.
    pub node: Option<String>,
}

impl ReplicaDetail {
    /// The detail that a bare status implies (for backends that know no more).
    pub fn from_status(rank: u32, status: ReplicaStatus) -> ReplicaDetail {
        let (phase, exit_code, reason) = match status {
            ReplicaStatus::Running => (ReplicaPhase::Running, None, None),
            ReplicaStatus::Exited(0) => (ReplicaPhase::Succeeded, Some(0), None),
            ReplicaStatus::Exited(code) => (ReplicaPhase::Failed, Some(code), Some(FailureReason::Error)),
            ReplicaStatus::Lost => (ReplicaPhase::Failed, None, Some(FailureReason::Lost)),
        };
        ReplicaDetail { rank, phase, exit_code, reason, message: None, image_digest: None, node: None }
    }

    /// The replica in the words of [`Executor::observe`]: a replica still waiting for its place
    /// counts as running (it holds its place and has not ended); an end without an exit code
    /// counts as lost.
    pub fn status(&self) -> ReplicaStatus {
        match (self.phase, self.exit_code) {
            (ReplicaPhase::Pending | ReplicaPhase::Running, _) => ReplicaStatus::Running,
            (ReplicaPhase::Succeeded, _) => ReplicaStatus::Exited(0),
            (ReplicaPhase::Failed, Some(code)) => ReplicaStatus::Exited(code),
            (ReplicaPhase::Failed, None) => ReplicaStatus::Lost,
        }
    }

    /// Whether the failure has a cause beyond the program's own exit code (OOMKilled, Evicted,
    /// ImagePullBackOff, Unschedulable, NodeLost): then it explains the attempt's end better than
    /// any exit code.
    pub fn has_external_cause(&self) -> bool {
        matches!(self.reason, Some(reason) if !matches!(reason, FailureReason::Error | FailureReason::Lost))
    }

    /// A sentence for the attempt's reason: `replica 1 OOMKilled (exit 137): <message>`.
    pub fn failure_sentence(&self) -> Option<String> {
        let reason = self.reason?;
        let code = self.exit_code.map(|c| format!(" (exit {c})")).unwrap_or_default();
        let message = self.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default();
        Some(format!("replica {} {}{code}{message}", self.rank, reason.as_str()))
    }
}

/// One machine of a cluster, as the scheduler's snapshot needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInventory {
    pub name: String,
    /// Normalised GPU type (the GPU label's value), `None` for CPU-only nodes.
    pub gpu_type: Option<String>,
    /// Allocatable GPUs.
    pub gpus: u32,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    /// False when cordoned, not ready, or tainted against Trainyard's jobs.
    pub schedulable: bool,
}

/// A tenant's shared volume, as an executor provisions it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRequest {
    pub tenant_id: Uuid,
    /// The tenant's name (a DNS label).
    pub tenant: String,
    /// The volume's name (a DNS label, unique in the tenant).
    pub name: String,
    pub size_bytes: u64,
    /// `ReadWriteOnce`, `ReadOnlyMany` or `ReadWriteMany`.
    pub access_mode: String,
    /// `None`: the cluster's default class, or the one the operator named.
    pub storage_class: Option<String>,
}

/// The most a tenant may hold at once, mirrored into the cluster as a second line of defence
/// behind the scheduler.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QuotaCeiling {
    /// GPUs of any type; no limit when `None`.
    pub gpus: Option<u32>,
    pub cpu_millis: Option<u64>,
    pub memory_bytes: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    #[error("cannot launch: {0}")]
    Launch(String),
    /// The backend cannot act right now and nothing is wrong with the job: another launch of
    /// the same attempt is under way, or the cluster's API server is unreachable, overloaded or
    /// failing. The control plane retries; the job is not charged.
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

#[async_trait::async_trait]
pub trait Executor: Send + Sync + 'static {
    /// A short name for logs and placements: `local`, `kubernetes`.
    fn name(&self) -> &'static str;

    /// What jobs can use in total.
    fn inventory(&self) -> Inventory;

    /// The image every replica runs, for backends that run images (the run record names it);
    /// `None` for backends that run the host's programs.
    fn image(&self) -> Option<String> {
        None
    }

    /// Starts every replica of an attempt and returns its placement (stored in Postgres).
    /// Launching the same attempt twice never starts a second set of replicas: the local
    /// backend refuses it with an error, the Kubernetes backend finds the attempt's Job and
    /// returns the same placement without sending anything.
    async fn launch(&self, request: &LaunchRequest) -> Result<serde_json::Value, ExecutorError>;

    /// Told, before the launch of an interrupted attempt is resumed, that it is this attempt's
    /// again: a backend that chose where its replicas run when the launch began (the local
    /// backend's GPUs, in the launch's intent) holds that at once, before any other launch of the
    /// same pass can choose it. The resumed launch runs later, as a task of its own. Backends
    /// that choose nothing themselves keep the default.
    fn launch_resuming(&self, _job_id: Uuid, _attempt: i32) {}

    /// The status of each replica of an attempt, in rank order.
    async fn observe(&self, attempt: &AttemptRef) -> Vec<ReplicaStatus>;

    /// Asks every replica to stop (SIGTERM or its equivalent) and kills what is left after
    /// `grace`. Returns at once; observe to see them go. Repeating it is harmless.
    async fn terminate(&self, attempt: &AttemptRef, grace: Duration);

    /// Frees what an ended attempt still holds (stray processes, reserved GPUs).
    async fn release(&self, attempt: &AttemptRef);

    /// Each replica of an attempt in rank order, with why it failed and what image it ran.
    /// Backends that know only [`Executor::observe`] derive it from that.
    async fn replica_details(&self, attempt: &AttemptRef) -> Vec<ReplicaDetail> {
        let statuses = self.observe(attempt).await;
        statuses.into_iter().enumerate().map(|(rank, status)| ReplicaDetail::from_status(rank as u32, status)).collect()
    }

    /// Told, at every pass of the control loop, which attempts are not over (`live`, from the
    /// database): a backend that keeps its own table of what attempts hold (the local backend's
    /// GPUs) drops what it holds for any other attempt, so that a server that ended attempts
    /// under another leader's watch does not keep their GPUs busy. Backends that hold nothing
    /// themselves keep the default.
    fn holdings_retain(&self, _live: &[(Uuid, i32)]) {}

    /// What an operator must know about how this backend confines jobs on its machine, when it
    /// falls short (replicas not isolated, not confined in cgroups), for `/readyz` and the log.
    fn node_warnings(&self) -> Vec<String> {
        Vec::new()
    }

    /// The machines jobs can run on, one entry each, when the backend knows them (`None`: use
    /// [`Executor::inventory`] as one machine).
    fn nodes(&self) -> Option<Vec<NodeInventory>> {
        None
    }

    /// Removes what the backend still runs or keeps for attempts not in `live` (the current
    /// attempts of unfinished jobs): leftovers of finished, cancelled or unknown jobs, found after
    /// a restart. Returns how many attempts it removed. Backends that leave nothing behind keep
    /// the default.
    async fn garbage_collect(&self, _live: &[(Uuid, i32)]) -> usize {
        0
    }

    /// Records a tenant's quota ceiling so that the backend can enforce it too (a Kubernetes
    /// ResourceQuota). Backends without such a mechanism ignore it.
    async fn tenant_ceiling_set(&self, _tenant_id: Uuid, _ceiling: &QuotaCeiling) -> Result<(), ExecutorError> {
        Ok(())
    }

    /// The last non-empty line a replica wrote (its error, when it failed), if any.
    async fn log_last_line(&self, job_id: Uuid, attempt: i32, replica: u32) -> Option<String> {
        use tokio::io::AsyncReadExt;
        let mut reader = self.log_reader(job_id, attempt, replica, false).await.ok()??;
        let mut text = Vec::new();
        reader.read_to_end(&mut text).await.ok()?;
        last_line(&text)
    }

    /// A replica's log: what it wrote so far, and, when `follow`, more as it writes (the read
    /// waits for it while the replica runs); without `follow` the read ends where the log ends
    /// now. `None` when there is none.
    async fn log_reader(
        &self,
        job_id: Uuid,
        attempt: i32,
        replica: u32,
        follow: bool,
    ) -> Result<Option<Box<dyn AsyncRead + Send + Unpin>>, ExecutorError>;

    /// Where replicas find a tenant's volume: a cluster mounts its claim there, the local
    /// executor binds the server's folder for it there in each replica's mount namespace.
    /// `None` when the server's folder is the path replicas use (no mount namespaces).
    fn volume_path(&self, _name: &str) -> Option<String> {
        None
    }

    /// The largest code archive this backend can deliver to replicas, when it has a limit of
    /// its own below the server's (Kubernetes ships code in the attempt's ConfigMap). A job
    /// over it is refused at submit, not failed at its launch after queueing.
    fn code_bytes_max(&self) -> Option<u64> {
        None
    }

    /// Whether this backend provisions volumes itself ([`Executor::volume_ensure`]); if not, the
    /// server makes a folder for each and hands it to [`Executor::volume_dir_prepare`].
    fn provisions_volumes(&self) -> bool {
        false
    }

    /// Provisions a volume (a PersistentVolumeClaim on Kubernetes). Repeating it is harmless.
    /// Nothing to do by default: the server makes a directory.
    async fn volume_ensure(&self, _volume: &VolumeRequest) -> Result<(), ExecutorError> {
        Ok(())
    }

    /// Makes a volume folder the server created (executors that provision no volumes of their
    /// own) usable by the tenant's replicas and no one else's. Nothing to do by default.
    async fn volume_dir_prepare(&self, _tenant_id: Uuid, _dir: &std::path::Path) -> Result<(), ExecutorError> {
        Ok(())
    }

    /// Why a provisioned volume cannot be used yet (on Kubernetes: its claim is not bound, with
    /// the cluster's last word on why), or `None` when it is ready. Executors that provision no
    /// volumes of their own have nothing to wait for.
    async fn volume_pending_reason(&self, _tenant_id: Uuid, _tenant: &str, _name: &str) -> Option<String> {
        None
    }

    /// Removes a volume and its data. Removing one that is gone is harmless.
    async fn volume_remove(&self, _tenant_id: Uuid, _tenant: &str, _name: &str) -> Result<(), ExecutorError> {
        Ok(())
    }

    /// Removes what the executor holds for a tenant being removed, once none of its jobs runs
    /// (on Kubernetes its namespace, with everything in it). Removing a tenant that is gone is
    /// harmless. Nothing to do by default.
    async fn tenant_remove(&self, _tenant_id: Uuid, _tenant: &str) -> Result<(), ExecutorError> {
        Ok(())
    }

    /// Removes an ended job's logs from wherever the executor keeps them (retention; the
    /// archived copies are in the object store). Nothing to do by default.
    async fn logs_remove(&self, _job_id: Uuid) -> Result<(), ExecutorError> {
        Ok(())
    }

    /// Wakes when something may have changed (a replica exited), so the reconciler need not
    /// wait for its next tick.
    fn changes(&self) -> std::sync::Arc<tokio::sync::Notify>;
}

/// A log file kept on disk, opened for [`Executor::log_reader`]; `None` when there is none.
pub async fn log_file(path: &std::path::Path) -> Result<Option<Box<dyn AsyncRead + Send + Unpin>>, ExecutorError> {
    match tokio::fs::File::open(path).await {
        Ok(file) => Ok(Some(Box::new(file))),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err.into()),
    }
}

/// The last non-empty line of `text`, at most 300 characters.
pub fn last_line(text: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(text);
    let line = text.lines().map(str::trim).rfind(|l| !l.is_empty())?;
    // It becomes the job's reason, and Postgres stores no NUL in text: a job printing one
    // would have its end refused on every pass.
    Some(line.chars().take(300).map(|c| if c == '\0' { char::REPLACEMENT_CHARACTER } else { c }).collect())
}

#[cfg(test)]
mod detail_tests {
    use super::*;

    #[test]
    fn a_last_line_holds_no_nul_for_postgres_to_refuse() {
        assert_eq!(last_line(b"starting\nboom\0 at step 3\n\n").as_deref(), Some("boom\u{FFFD} at step 3"));
        assert_eq!(last_line(b"  \n").as_deref(), None);
    }

    #[test]
    fn a_detail_made_from_a_status_gives_that_status_back() {
        for status in [ReplicaStatus::Running, ReplicaStatus::Exited(0), ReplicaStatus::Exited(3), ReplicaStatus::Lost]
        {
            assert_eq!(ReplicaDetail::from_status(0, status).status(), status);
        }
    }

    #[test]
    fn only_causes_beyond_the_exit_code_count_as_external() {
        let mut detail = ReplicaDetail::from_status(1, ReplicaStatus::Exited(137));
        assert!(!detail.has_external_cause());
        detail.reason = Some(FailureReason::OomKilled);
        assert!(detail.has_external_cause());
        assert_eq!(detail.failure_sentence().as_deref(), Some("replica 1 OOMKilled (exit 137)"));
    }
}
