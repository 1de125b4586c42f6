//! The control loop's part of storage: archiving the logs of ended attempts to the object store
//! in the background (retried with backoff while the store is away, never holding up the loop),
//! and the retention sweep of logs and artefacts past their tenant's retention.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::io::ReaderStream;
use trainyard_core::{Error, Result};
use trainyard_executor::Executor;
use trainyard_storage::{Key, StorageError, keys};
use trainyard_store::Store;
use trainyard_store::storage::RetentionDue;
use uuid::Uuid;

use crate::storage::{Storage, storage_error};

/// How long a log's copy to the store may go without reading a byte of the log: a stalled
/// reader fails the copy (and the upload is aborted), while a large log taking minutes to
/// stream goes on. (A bound on the whole copy failed every log too large to copy within it,
/// again at each retry, and never archived it.) The store's own requests have their timeouts.
const ARCHIVE_IDLE: Duration = Duration::from_secs(60);
/// Attempts archived per query of the archiver's working set.
const ARCHIVE_BATCH: i64 = 50;
/// Failed tries after which an attempt's logs are no longer archived (about 2.5 hours of backoff).
pub const ARCHIVE_MAX_FAILURES: i32 = 12;
/// How often the archiver looks for retries that have come due, when no attempt ends.
const ARCHIVE_RECHECK: Duration = Duration::from_secs(5);

/// Jobs the retention sweep handles per pass.
const RETENTION_BATCH: i64 = 200;

/// The control loop's part of storage: archiving the logs of ended attempts in the background,
/// and the retention sweep when it is due. Held by the reconciler (so it runs only on the leader).
pub struct StorageLoop {
    storage: std::sync::Arc<Storage>,
    swept: Option<std::time::Instant>,
    /// The archiver's current round, while one runs, and when the last one started.
    archiving: Option<tokio::task::JoinHandle<()>>,
    archive_started: Option<std::time::Instant>,
    monitoring: Option<Arc<crate::monitoring::Monitoring>>,
}

impl StorageLoop {
    pub fn new(storage: std::sync::Arc<Storage>) -> StorageLoop {
        StorageLoop { storage, swept: None, archiving: None, archive_started: None, monitoring: None }
    }

    /// Reports the archiving backlog in these metrics.
    pub fn with_monitoring(mut self, monitoring: Arc<crate::monitoring::Monitoring>) -> StorageLoop {
        self.monitoring = Some(monitoring);
        self
    }

    /// Starts an archiving round in the background ([`archive_round`]) when attempts have just
    /// ended (`ended`) or a retry may be due, unless a round is still running. Never waits for
    /// the object store: an unreachable store must not hold up the control loop.
    pub fn archive_in_background(&mut self, store: &Store, executor: &Arc<dyn Executor>, ended: bool) {
        if self.archiving.as_ref().is_some_and(|round| !round.is_finished()) {
            return;
        }
        let retry_due = self.archive_started.is_none_or(|at| at.elapsed() >= ARCHIVE_RECHECK);
        if !ended && !retry_due {
            return;
        }
        self.archive_started = Some(std::time::Instant::now());
        let (storage, store, executor) = (Arc::clone(&self.storage), store.clone(), Arc::clone(executor));
        let monitoring = self.monitoring.clone();
        self.archiving = Some(tokio::spawn(async move {
            if let Err(err) = archive_round(&store, &storage, &*executor).await {
                tracing::warn!(%err, "archiving logs failed; retrying at the next round");
            }
            if let Some(monitoring) = monitoring {
                // What is left after the round: attempts whose archiving failed and waits a retry.
                match store.attempts_unarchived(ARCHIVE_MAX_FAILURES, ARCHIVE_BATCH).await {
                    Ok(due) => {
                        monitoring.log_archive_backlog.set(due.len() as i64);
                    }
                    Err(err) => tracing::debug!(%err, "cannot count the archiving backlog"),
                }
            }
        }));
    }

    /// Runs the retention sweep when it is due; a failure is logged and retried next time.
    pub async fn retention_sweep_when_due(&mut self, store: &Store, executor: &dyn Executor) {
        if self.swept.is_some_and(|at| at.elapsed() < self.storage.retention_every) {
            return;
        }
        self.swept = Some(std::time::Instant::now());
        if let Err(err) = retention_sweep(store, &self.storage, executor).await {
            tracing::warn!(%err, "retention sweep failed; retrying at the next one");
        }
    }
}

/// Archives the logs of every ended attempt that waits for it, a batch at a time, until none is
/// due. A failed attempt is retried later with exponential backoff (10 s doubling, at most 30
/// minutes apart), [`ARCHIVE_MAX_FAILURES`] times at most; the executor keeps its own copy
/// meanwhile, so nothing is lost while the object store is away. Returns how many were archived.
pub async fn archive_round(store: &Store, storage: &Storage, executor: &dyn Executor) -> Result<usize> {
    let mut archived = 0;
    loop {
        let due = store.attempts_unarchived(ARCHIVE_MAX_FAILURES, ARCHIVE_BATCH).await?;
        if due.is_empty() {
            return Ok(archived);
        }
        // Recorded together at the end of the batch (one commit, not one per attempt); a crash
        // before that archives them again next time, over the same keys.
        let mut done = Vec::with_capacity(due.len());
        for attempt in &due {
            let (job, number) = (attempt.job_id, attempt.attempt);
            if logs_archive(storage, executor, attempt.tenant_id, job, number, attempt.replicas).await {
                done.push((job, number));
            } else {
                let retry_in = archive_backoff(attempt.failures);
                store.attempt_logs_archive_failed(job, number, retry_in).await?;
                if attempt.failures + 1 >= ARCHIVE_MAX_FAILURES {
                    tracing::error!(%job, attempt = number, "giving up archiving the logs; the executor's copy is all there is");
                } else {
                    tracing::warn!(%job, attempt = number, ?retry_in, "archiving the logs failed; retrying later");
                }
            }
        }
        store.attempts_logs_archived(&done).await?;
        archived += done.len();
    }
}

/// How long to wait before the next try after `failures` failed ones.
fn archive_backoff(failures: i32) -> Duration {
    let seconds = 10u64.saturating_mul(1 << failures.clamp(0, 20));
    Duration::from_secs(seconds.min(30 * 60))
}

/// Copies each replica's log of an ended attempt to the object store; true when every replica's
/// log is there (or the executor has none to copy). Failures are logged.
pub async fn logs_archive(
    storage: &Storage,
    executor: &dyn Executor,
    tenant_id: Uuid,
    job_id: Uuid,
    attempt: i32,
    replicas: u32,
) -> bool {
    let mut complete = true;
    for replica in 0..replicas {
        let copy = async {
            let Some(reader) = executor.log_reader(job_id, attempt, replica, false).await.map_err(Error::internal)?
            else {
                return Ok::<_, Error>(None);
            };
            let key = keys::log_key(tenant_id, job_id, attempt, replica);
            let chunks = stalls_fail(ReaderStream::new(reader), ARCHIVE_IDLE);
            let uploaded = storage.objects.upload(&key, chunks, u64::MAX).await;
            Ok(Some(uploaded.map_err(storage_error)?))
        };
        match copy.await {
            Ok(Some(uploaded)) => {
                tracing::debug!(job = %job_id, attempt, replica, bytes = uploaded.size, "log archived")
            }
            Ok(None) => {}
            Err(err) => {
                tracing::warn!(job = %job_id, attempt, replica, %err, "archiving a log failed");
                complete = false;
            }
        }
    }
    complete
}

/// The chunks of `stream`, or an error (and the end) when the next one takes longer than `idle`.
fn stalls_fail<S>(
    stream: S,
    idle: Duration,
) -> impl futures::Stream<Item = std::io::Result<axum::body::Bytes>> + Send + Unpin
where
    S: futures::Stream<Item = std::io::Result<axum::body::Bytes>> + Send + Unpin,
{
    use futures::StreamExt;
    Box::pin(futures::stream::unfold(Some(stream), move |stream| async move {
        let mut stream = stream?;
        match tokio::time::timeout(idle, stream.next()).await {
            Ok(Some(chunk)) => Some((chunk, Some(stream))),
            Ok(None) => None,
            Err(_) => {
                let stalled =
                    std::io::Error::new(std::io::ErrorKind::TimedOut, format!("no byte of the log in {idle:?}"));
                Some((Err(stalled), None))
            }
        }
    }))
}

/// One retention pass: removes the archived logs and the artefacts of jobs that ended longer
/// ago than their tenant keeps them, then records it, and forgets nodes' cache reports no longer
/// trusted. Idempotent: a job whose objects are gone but whose record failed is simply swept
/// again.
pub async fn retention_sweep(store: &Store, storage: &Storage, executor: &dyn Executor) -> Result<usize> {
    // Each record below is fenced, but the objects go first: a deposed leader deletes nothing.
    store.control_fence_check().await?;
    store.node_datasets_forget_stale().await?;
    let due = store.retention_due(chrono::Utc::now(), RETENTION_BATCH).await?;
    for job in &due {
        retention_apply(storage, executor, job).await.map_err(storage_error)?;
        store.retention_done(job).await?;
        tracing::info!(job = %job.job_id, logs = job.logs, artifacts = job.artifacts, "retention removed storage");
    }
    let abandoned = store.dataset_pushes_abandoned(PUSH_ABANDONED_AFTER, RETENTION_BATCH).await?;
    for prefix in &abandoned {
        // The row is gone first: a crash here leaves objects no row counts, which a push of the
        // same content replaces; nothing can register on them meanwhile.
        let key = Key::parse(prefix).map_err(Error::internal)?;
        storage.objects.delete_prefix(&key).await.map_err(storage_error)?;
        tracing::info!(%prefix, "removed a dataset push on which no version was registered");
    }
    let removed = store.tenants_objects_to_remove(RETENTION_BATCH).await?;
    for tenant_id in &removed {
        let objects = storage.objects.delete_prefix(&keys::tenant_prefix(*tenant_id)).await.map_err(storage_error)?;
        store.tenant_objects_removed(*tenant_id).await?;
        tracing::info!(tenant = %tenant_id, objects, "removed a removed tenant's objects");
    }
    Ok(due.len() + abandoned.len() + removed.len())
}

/// How long a push on which no version is registered is kept after its last upload.
const PUSH_ABANDONED_AFTER: chrono::Duration = chrono::Duration::days(1);

async fn retention_apply(
    storage: &Storage,
    executor: &dyn Executor,
    job: &RetentionDue,
) -> std::result::Result<(), StorageError> {
    if job.logs {
        storage.objects.delete_prefix(&keys::logs_prefix(job.tenant_id, job.job_id)).await?;
        executor.logs_remove(job.job_id).await.map_err(|e| StorageError::Io(std::io::Error::other(e.to_string())))?;
    }
    if job.artifacts {
        storage.objects.delete_prefix(&keys::artifacts_prefix(job.tenant_id, job.job_id)).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn chunk() -> std::io::Result<axum::body::Bytes> {
        Ok(axum::body::Bytes::from_static(b"a line\n"))
    }

    /// A reader that keeps delivering, however long in all, is copied whole; one that stops
    /// delivering fails after the idle bound, and the copy ends there.
    #[tokio::test(start_paused = true)]
    async fn a_slow_log_is_copied_whole_and_a_stalled_one_fails() {
        let idle = Duration::from_secs(60);
        // 100 chunks, 50 s apart: 83 minutes in all.
        let steady = futures::stream::iter(0..100).then(|_| async {
            tokio::time::sleep(Duration::from_secs(50)).await;
            chunk()
        });
        let copied: Vec<_> = stalls_fail(Box::pin(steady), idle).collect().await;
        assert_eq!(copied.len(), 100);
        assert!(copied.iter().all(Result::is_ok));

        let stalling = futures::stream::iter(0..3).then(|i| async move {
            tokio::time::sleep(Duration::from_secs(if i == 2 { 61 } else { 1 })).await;
            chunk()
        });
        let copied: Vec<_> = stalls_fail(Box::pin(stalling), idle).collect().await;
        assert_eq!(copied.len(), 3, "two chunks, then the error, then nothing");
        assert!(copied[..2].iter().all(Result::is_ok));
        assert_eq!(copied[2].as_ref().unwrap_err().kind(), std::io::ErrorKind::TimedOut);
    }
}
