//! Executors turn an admitted job attempt into running replicas, report what they observe, stop
//! them, and hand out their logs. The reconciler in the server drives them; they hold no intent
//! of their own (that lives in Postgres) and every call is safe to repeat.
//!
//! Backends: [`local`] (child processes on this machine, the embedded default). The Kubernetes
//! backend comes behind the same trait.

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

/// One attempt of one job, as the executor should launch it.
#[derive(Debug, Clone)]
pub struct LaunchRequest {
    pub job_id: Uuid,
    pub tenant_id: Uuid,
    pub attempt: i32,
    pub spec: JobSpec,
    /// The template's files, delivered under `template/` in each replica's working directory.
    pub files: BTreeMap<String, Vec<u8>>,
    /// Variables for this attempt only, never stored with the spec (the job token, the API URL).
    pub env: BTreeMap<String, String>,
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

#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    #[error("cannot launch: {0}")]
    Launch(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

#[async_trait::async_trait]
pub trait Executor: Send + Sync + 'static {
    /// A short name for logs and placements: `local`, `kubernetes`.
    fn name(&self) -> &'static str;

    /// What jobs can use in total.
    fn inventory(&self) -> Inventory;

    /// Starts every replica of an attempt and returns its placement (stored in Postgres).
    /// Launching the same attempt twice is an error, never a second set of processes.
    async fn launch(&self, request: &LaunchRequest) -> Result<serde_json::Value, ExecutorError>;

    /// The status of each replica of an attempt, in rank order.
    async fn observe(&self, attempt: &AttemptRef) -> Vec<ReplicaStatus>;

    /// Asks every replica to stop (SIGTERM or its equivalent) and kills what is left after
    /// `grace`. Returns at once; observe to see them go. Repeating it is harmless.
    async fn terminate(&self, attempt: &AttemptRef, grace: Duration);

    /// Frees what an ended attempt still holds (stray processes, reserved GPUs).
    async fn release(&self, attempt: &AttemptRef);

    /// The last non-empty line a replica wrote (its error, when it failed), if any.
    async fn log_last_line(&self, job_id: Uuid, attempt: i32, replica: u32) -> Option<String> {
        use tokio::io::AsyncReadExt;
        let mut reader = self.log_reader(job_id, attempt, replica).await.ok()??;
        let mut text = Vec::new();
        reader.read_to_end(&mut text).await.ok()?;
        last_line(&text)
    }

    /// A replica's log: what it wrote so far, and more as it writes. `None` when there is none.
    async fn log_reader(
        &self,
        job_id: Uuid,
        attempt: i32,
        replica: u32,
    ) -> Result<Option<Box<dyn AsyncRead + Send + Unpin>>, ExecutorError>;

    /// Removes an ended job's logs from wherever the executor keeps them (retention; the
    /// archived copies are in the object store). Nothing to do by default.
    async fn logs_remove(&self, _job_id: Uuid) -> Result<(), ExecutorError> {
        Ok(())
    }

    /// Wakes when something may have changed (a replica exited), so the reconciler need not
    /// wait for its next tick.
    fn changes(&self) -> std::sync::Arc<tokio::sync::Notify>;
}

/// The last non-empty line of `text`, at most 300 characters.
pub fn last_line(text: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(text);
    let line = text.lines().map(str::trim).rfind(|l| !l.is_empty())?;
    Some(line.chars().take(300).collect())
}
