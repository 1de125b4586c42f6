//! Storage in the control plane: the configured object store, and the operations on it that
//! requests reach (artefacts, volumes, the storage policy) or the control loop runs (archiving
//! an ended attempt's logs, the retention sweep). Keys and path checks live in
//! `trainyard-storage`; every operation here takes the tenant from the caller, never from input.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::body::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use tokio::sync::OnceCell;
use tokio_util::io::ReaderStream;
use trainyard_core::api::{
    Artifact, ArtifactLink, ArtifactUploaded, StoragePolicy, StorageReport, Volume, VolumeCreate,
};
use trainyard_core::auth::{Action, Caller};
use trainyard_core::error::ObjectKind;
use trainyard_core::resources::Memory;
use trainyard_core::{Error, Result};
use trainyard_executor::Executor;
use trainyard_storage::{Key, ObjectStorage, StorageConfig, StorageError, UrlSigner, keys, relative_path};
use trainyard_store::Store;
use trainyard_store::metrics::JobCaller;
use trainyard_store::storage::{NewVolume, RetentionDue};
use uuid::Uuid;

use crate::app::App;

/// The name of the URL-signing key in `server_secrets`.
const SIGNING_SECRET: &str = "artifact-download-urls";
/// How long an attempt's end may wait for its logs to reach the store.
const ARCHIVE_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts archived per query of the archiver's working set.
const ARCHIVE_BATCH: i64 = 50;
/// Failed tries after which an attempt's logs are no longer archived (about 2.5 hours of backoff).
pub const ARCHIVE_MAX_FAILURES: i32 = 12;
/// How often the archiver looks for retries that have come due, when no attempt ends.
const ARCHIVE_RECHECK: Duration = Duration::from_secs(5);
/// Download links live this long unless the caller asks for less (or more, up to a day).
const LINK_SECONDS_DEFAULT: u64 = 300;
const LINK_SECONDS_MAX: u64 = 86_400;
/// Jobs the retention sweep handles per pass.
const RETENTION_BATCH: i64 = 200;

/// Storage settings of `trainyard dev` and `trainyard serve`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct StorageArgs {
    /// Where logs and artefacts are kept: `file:///path` or `s3://bucket/prefix` (S3
    /// credentials from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION). Default:
    /// `file://<data-dir>/objects`.
    #[arg(long, env = "TRAINYARD_OBJECT_STORE")]
    pub object_store: Option<String>,
    /// An S3-compatible endpoint (MinIO, Ceph, ...), e.g. `http://127.0.0.1:9000`.
    #[arg(long, env = "TRAINYARD_OBJECT_STORE_ENDPOINT")]
    pub object_store_endpoint: Option<String>,
    /// The part size of multipart uploads (at least 5Mi).
    #[arg(long, default_value = "8Mi", value_parser = parse_size)]
    pub object_store_part_size: u64,
    /// The largest artefact one upload may write.
    #[arg(long, default_value = "64Gi", value_parser = parse_size)]
    pub max_artifact_size: u64,
    /// Seconds between retention sweeps.
    #[arg(long, default_value_t = 300)]
    pub retention_sweep_seconds: u64,
}

fn parse_size(text: &str) -> std::result::Result<u64, String> {
    Memory::parse(text).map(Memory::bytes)
}

impl StorageArgs {
    /// Opens the object store and prepares the volumes folder under `data_dir`.
    pub fn open(&self, data_dir: &Path) -> anyhow::Result<Storage> {
        let url = match &self.object_store {
            Some(url) => url.clone(),
            None => url_of_dir(&data_dir.join("objects"))?,
        };
        let config = StorageConfig {
            url,
            endpoint: self.object_store_endpoint.clone(),
            part_size: usize::try_from(self.object_store_part_size).context("part size")?,
        };
        let objects = ObjectStorage::open(&config)?;
        let volumes_dir = data_dir.join("volumes");
        std::fs::create_dir_all(&volumes_dir)
            .with_context(|| format!("creating the volumes folder {}", volumes_dir.display()))?;
        tracing::info!(store = objects.url(), "object store");
        Ok(Storage {
            objects,
            volumes_dir,
            signer: OnceCell::new(),
            max_artifact_bytes: self.max_artifact_size,
            retention_every: Duration::from_secs(self.retention_sweep_seconds.max(1)),
        })
    }
}

fn url_of_dir(dir: &Path) -> anyhow::Result<String> {
    std::fs::create_dir_all(dir)?;
    let dir = dir.canonicalize()?;
    let url = url::Url::from_directory_path(&dir).map_err(|()| anyhow::anyhow!("{} is not absolute", dir.display()))?;
    Ok(url.to_string())
}

/// The object store and the volumes folder, as the server uses them.
#[derive(Debug)]
pub struct Storage {
    pub objects: ObjectStorage,
    volumes_dir: PathBuf,
    /// Loaded from Postgres at first use, so that every replica signs with the same key.
    signer: OnceCell<UrlSigner>,
    max_artifact_bytes: u64,
    pub retention_every: Duration,
}

impl Storage {
    async fn signer(&self, store: &Store) -> Result<&UrlSigner> {
        self.signer.get_or_try_init(|| async { Ok(UrlSigner::new(store.server_secret(SIGNING_SECRET).await?)) }).await
    }

    fn volume_dir(&self, tenant_id: Uuid, name: &str) -> PathBuf {
        self.volumes_dir.join(tenant_id.to_string()).join(name)
    }
}

/// Who uploads an artefact: a member with their token, or the job's engine with its job token.
pub enum Uploader {
    User(Caller),
    Job(JobCaller),
}

fn storage_error(err: StorageError) -> Error {
    match err {
        StorageError::TooLarge(limit) => Error::invalid("body", format!("an artefact is at most {limit} bytes")),
        StorageError::Body(cause) => Error::invalid("body", format!("the upload broke off: {cause}")),
        other => Error::internal(other),
    }
}

/// The checked path of an artefact, or a 422 naming the parameter.
fn artifact_path(text: &str) -> Result<trainyard_storage::RelPath> {
    relative_path(text).map_err(|refused| Error::invalid("path", refused.to_string()))
}

impl App {
    /// A job's artefacts: path, size, SHA-256 when it came through the API, time.
    pub async fn artifacts_list(&self, caller: &Caller, job_id: Uuid) -> Result<Vec<Artifact>> {
        caller.authorize(Action::ReadJobs)?;
        self.store.job_get(caller.tenant_id, job_id).await?;
        let objects = self.storage.objects.list(&keys::artifacts_prefix(caller.tenant_id, job_id)).await;
        let hashes = self.store.artifact_hashes(caller.tenant_id, job_id).await?;
        Ok(objects
            .map_err(storage_error)?
            .into_iter()
            .filter_map(|object| {
                let path = keys::artifact_path_of(caller.tenant_id, job_id, &object.key)?;
                Some(Artifact {
                    sha256: hashes.get(&path).cloned(),
                    path,
                    size_bytes: object.size,
                    modified_at: object.modified,
                })
            })
            .collect())
    }

    /// Stores an upload at the job's artefact `path`, streaming (multipart when large), and
    /// records its SHA-256. A failed upload leaves nothing behind.
    pub async fn artifact_upload<S, E>(
        &self,
        uploader: &Uploader,
        job_id: Uuid,
        path: &str,
        body: S,
    ) -> Result<ArtifactUploaded>
    where
        S: Stream<Item = std::result::Result<Bytes, E>> + Send + Unpin,
        E: std::fmt::Display,
    {
        let tenant_id = match uploader {
            Uploader::User(caller) => {
                caller.authorize(Action::WriteJobs)?;
                caller.tenant_id
            }
            Uploader::Job(caller) if caller.job_id == job_id => caller.tenant_id,
            Uploader::Job(_) => return Err(Error::not_found(ObjectKind::Job)),
        };
        let path = artifact_path(path)?;
        self.store.job_get(tenant_id, job_id).await?;
        if self.store.job_storage_expiry(tenant_id, job_id).await?.artifacts.is_some() {
            // Retention never looks at this job again: an upload now would be kept forever.
            return Err(Error::Conflict("this job's artefacts were removed by its tenant's retention policy".into()));
        }
        let key = keys::artifact_key(tenant_id, job_id, &path);
        let uploaded =
            self.storage.objects.upload(&key, body, self.storage.max_artifact_bytes).await.map_err(storage_error)?;
        self.store.artifact_record(tenant_id, job_id, path.as_str(), uploaded.size, &uploaded.sha256).await?;
        Ok(ArtifactUploaded {
            path: path.to_string(),
            size_bytes: uploaded.size,
            sha256: uploaded.sha256,
            parts: uploaded.parts,
        })
    }

    /// A short-lived link to download one artefact: the store's own pre-signed URL (S3), or
    /// a URL of this server signed with HMAC (local store).
    pub async fn artifact_link(
        &self,
        caller: &Caller,
        job_id: Uuid,
        path: &str,
        expires_in: Option<u64>,
    ) -> Result<ArtifactLink> {
        caller.authorize(Action::ReadJobs)?;
        let path = artifact_path(path)?;
        let seconds = expires_in.unwrap_or(LINK_SECONDS_DEFAULT);
        if !(1..=LINK_SECONDS_MAX).contains(&seconds) {
            return Err(Error::invalid("expires_in", format!("1 to {LINK_SECONDS_MAX} seconds")));
        }
        self.store.job_get(caller.tenant_id, job_id).await?;
        let key = keys::artifact_key(caller.tenant_id, job_id, &path);
        let size = self
            .storage
            .objects
            .size_of(&key)
            .await
            .map_err(storage_error)?
            .ok_or_else(|| Error::not_found(ObjectKind::Artifact))?;
        let expires_at = chrono::Utc::now() + chrono::Duration::seconds(seconds as i64);
        let url = match self.storage.objects.presigned_get(&key, Duration::from_secs(seconds)).await {
            Ok(Some(url)) => url,
            Ok(None) => self.storage.signer(&self.store).await?.download_url(key.as_ref(), expires_at.timestamp()),
            Err(err) => return Err(storage_error(err)),
        };
        Ok(ArtifactLink { path: path.to_string(), url, expires_at, size_bytes: size })
    }

    /// Streams an artefact named by a signed URL of this server. The signature is the only
    /// credential: a changed key, expiry or signature, or a passed expiry, is refused (403).
    pub async fn artifact_download(
        &self,
        key: &str,
        expires: i64,
        sig: &str,
    ) -> Result<(u64, BoxStream<'static, std::result::Result<Bytes, std::io::Error>>)> {
        let signer = self.storage.signer(&self.store).await?;
        signer
            .verify(key, expires, sig, chrono::Utc::now().timestamp())
            .map_err(|err| Error::Forbidden(err.to_string()))?;
        // Signed by us, so it is one of our keys; check anyway that it is an artefact's.
        let key = Key::parse(key).map_err(|_| Error::Forbidden("not a download link".into()))?;
        if keys::tenant_of(&key).is_none() || !key.parts().any(|p| p.as_ref() == "artifacts") {
            return Err(Error::Forbidden("not a download link".into()));
        }
        let (size, stream) = self
            .storage
            .objects
            .download(&key)
            .await
            .map_err(storage_error)?
            .ok_or_else(|| Error::not_found(ObjectKind::Artifact))?;
        Ok((size, stream.map_err(std::io::Error::other).boxed()))
    }

    /// Creates a named volume (a directory under the data directory) within the tenant's
    /// storage quota. A directory that cannot be made removes the record again.
    pub async fn volume_create(&self, caller: &Caller, request: VolumeCreate) -> Result<Volume> {
        caller.authorize(Action::WriteJobs)?;
        let storage_class = request.storage_class.as_deref().unwrap_or("standard");
        // The name becomes a directory: check it here too, before any path is built from it.
        let name_ok = !request.name.is_empty()
            && request.name.len() <= 63
            && request.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !request.name.starts_with('-');
        if !name_ok {
            return Err(Error::invalid(
                "name",
                "1 to 63 lowercase letters, digits or '-', starting with a letter or digit",
            ));
        }
        // Where jobs find it: the backend's mount path (a cluster's claim), or a directory here.
        let dir = self.storage.volume_dir(caller.tenant_id, &request.name);
        let mounted = self.executor.volume_path(&request.name);
        let path = mounted.clone().unwrap_or_else(|| dir.to_string_lossy().into_owned());
        let volume = self
            .store
            .volume_create(
                caller,
                &NewVolume {
                    name: &request.name,
                    size_bytes: request.size.bytes(),
                    access_mode: request.access_mode,
                    storage_class,
                    path: &path,
                },
            )
            .await?;
        let provisioned = match mounted {
            Some(_) => {
                let provision = trainyard_executor::VolumeRequest {
                    tenant_id: caller.tenant_id,
                    tenant: caller.tenant.clone(),
                    name: request.name.clone(),
                    size_bytes: request.size.bytes(),
                    access_mode: request.access_mode.as_str().to_string(),
                    storage_class: storage_class.to_string(),
                };
                self.executor.volume_ensure(&provision).await.map_err(|err| err.to_string())
            }
            None => tokio::fs::create_dir_all(&dir).await.map_err(|err| format!("creating {}: {err}", dir.display())),
        };
        if let Err(cause) = provisioned {
            // Nothing half-made stays behind: the record goes with the failed provisioning.
            self.store.volume_delete(caller.tenant_id, &request.name).await?;
            return Err(Error::internal(cause));
        }
        Ok(volume)
    }

    pub async fn volumes_list(&self, caller: &Caller) -> Result<Vec<Volume>> {
        caller.authorize(Action::ReadJobs)?;
        self.store.volumes_list(caller.tenant_id).await
    }

    /// Deletes a volume and everything in it.
    pub async fn volume_delete(&self, caller: &Caller, name: &str) -> Result<()> {
        caller.authorize(Action::WriteJobs)?;
        let volume = self.store.volume_delete(caller.tenant_id, name).await?;
        if let Err(err) = self.executor.volume_remove(caller.tenant_id, &caller.tenant, &volume.name).await {
            tracing::warn!(%err, volume = %volume.name, "removing a deleted volume from the executor");
        }
        let dir = self.storage.volume_dir(caller.tenant_id, &volume.name);
        if let Err(err) = tokio::fs::remove_dir_all(&dir).await
            && err.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(%err, dir = %dir.display(), "removing a deleted volume's directory");
        }
        Ok(())
    }

    /// The directory a `volume` template parameter names, in the caller's tenant.
    pub async fn volume_path(&self, tenant_id: Uuid, name: &str) -> Result<String> {
        Ok(self.store.volume_get(tenant_id, name).await?.path)
    }

    pub async fn storage_report(&self, caller: &Caller) -> Result<StorageReport> {
        caller.authorize(Action::ReadJobs)?;
        self.store.storage_report(caller.tenant_id).await
    }

    pub async fn storage_policy_set(&self, caller: &Caller, tenant: &str, policy: &StoragePolicy) -> Result<()> {
        caller.require_platform_admin()?;
        self.store.storage_policy_set(tenant, policy).await
    }

    /// An archived log, when the executor no longer has the file: what the follower reads.
    pub async fn log_archived(
        &self,
        tenant_id: Uuid,
        job_id: Uuid,
        attempt: i32,
        replica: u32,
    ) -> Result<Option<BoxStream<'static, std::result::Result<Bytes, std::io::Error>>>> {
        let key = keys::log_key(tenant_id, job_id, attempt, replica);
        let found = self.storage.objects.download(&key).await.map_err(storage_error)?;
        Ok(found.map(|(_, stream)| stream.map_err(std::io::Error::other).boxed()))
    }
}

/// The control loop's part of storage: archiving the logs of ended attempts in the background,
/// and the retention sweep when it is due. Held by the reconciler (so it runs only on the leader).
pub struct StorageLoop {
    storage: std::sync::Arc<Storage>,
    swept: Option<std::time::Instant>,
    /// The archiver's current round, while one runs, and when the last one started.
    archiving: Option<tokio::task::JoinHandle<()>>,
    archive_started: Option<std::time::Instant>,
}

impl StorageLoop {
    pub fn new(storage: std::sync::Arc<Storage>) -> StorageLoop {
        StorageLoop { storage, swept: None, archiving: None, archive_started: None }
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
        self.archiving = Some(tokio::spawn(async move {
            if let Err(err) = archive_round(&store, &storage, &*executor).await {
                tracing::warn!(%err, "archiving logs failed; retrying at the next round");
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
        for attempt in &due {
            let (job, number) = (attempt.job_id, attempt.attempt);
            if logs_archive(storage, executor, attempt.tenant_id, job, number, attempt.replicas).await {
                store.attempt_logs_archived(job, number).await?;
                archived += 1;
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
            let Some(reader) = executor.log_reader(job_id, attempt, replica).await.map_err(Error::internal)? else {
                return Ok::<_, Error>(None);
            };
            let key = keys::log_key(tenant_id, job_id, attempt, replica);
            let uploaded = storage.objects.upload(&key, ReaderStream::new(reader), u64::MAX).await;
            Ok(Some(uploaded.map_err(storage_error)?))
        };
        match tokio::time::timeout(ARCHIVE_TIMEOUT, copy).await {
            Ok(Ok(Some(uploaded))) => {
                tracing::debug!(job = %job_id, attempt, replica, bytes = uploaded.size, "log archived")
            }
            Ok(Ok(None)) => {}
            Ok(Err(err)) => {
                tracing::warn!(job = %job_id, attempt, replica, %err, "archiving a log failed");
                complete = false;
            }
            Err(_) => {
                tracing::warn!(job = %job_id, attempt, replica, "archiving a log timed out");
                complete = false;
            }
        }
    }
    complete
}

/// One retention pass: removes the archived logs and the artefacts of jobs that ended longer
/// ago than their tenant keeps them, then records it. Idempotent: a job whose objects are gone
/// but whose record failed is simply swept again.
pub async fn retention_sweep(store: &Store, storage: &Storage, executor: &dyn Executor) -> Result<usize> {
    let due = store.retention_due(chrono::Utc::now(), RETENTION_BATCH).await?;
    for job in &due {
        retention_apply(storage, executor, job).await.map_err(storage_error)?;
        store.retention_done(job).await?;
        tracing::info!(job = %job.job_id, logs = job.logs, artifacts = job.artifacts, "retention removed storage");
    }
    Ok(due.len())
}

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
