//! Datasets: registering an immutable version (by URI, from the job that produced it, or from
//! files pushed to the object store), listing and showing them, and the files of pushed
//! versions: uploaded one by one (checked against the manifest while they stream) and served
//! to the jobs that read them and to the tenant's members.
//!
//! A pushed dataset lives under `tenants/<tenant>/datasets/content/<content hash hex>/`: its
//! manifest (`dataset.json`, uploaded first), its shards and their indexes. The key is the
//! manifest's content hash, so one content is kept once per tenant whatever it is registered as,
//! and a registered version, which names that prefix, cannot change: every shard is stored only
//! with the SHA-256 and size its manifest gives, and a manifest with other shards under the same
//! hash is refused.

use axum::body::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use trainyard_core::api::{Dataset, DatasetFileUploaded, DatasetRegister, NodeCacheReport};
use trainyard_core::auth::{Action, Caller};
use trainyard_core::error::ObjectKind;
use trainyard_core::job::is_sha256_hex;
use trainyard_core::names::DatasetRef;
use trainyard_core::{Error, Result};
use trainyard_data::manifest::{DatasetManifest, FORMAT, MANIFEST_FILE, ShardEntry};
use trainyard_storage::{Key, StorageError, keys};
use trainyard_store::audit::Audit;
use trainyard_store::datasets::NodeReport;
use trainyard_store::metrics::JobCaller;
use trainyard_store::templates::Published;
use uuid::Uuid;

use super::App;
use crate::storage::storage_error;

/// The largest manifest a push may upload (it is read whole, to be checked).
pub const MAX_MANIFEST_BYTES: usize = 16 * 1024 * 1024;

/// Who reads a pushed dataset's files: a member of its tenant with an API token, or a job with
/// its job token (only the versions it recorded reading).
pub enum DatasetReader {
    Member(Caller),
    Job(JobCaller),
}

/// Which file of a pushed dataset a name is, for the counter of bytes served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatasetFileKind {
    Manifest,
    Shard,
    Index,
}

impl DatasetFileKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DatasetFileKind::Manifest => "manifest",
            DatasetFileKind::Shard => "shard",
            DatasetFileKind::Index => "index",
        }
    }
}

/// What a reader may know of a file of a pushed dataset without reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetFileFacts {
    /// The version's tenant: a cache keeps each tenant's copies apart.
    pub tenant_id: Uuid,
    /// The version's content hash (64 hex digits): its files never change under it.
    pub content_hex: String,
    pub kind: DatasetFileKind,
    /// A shard's size and SHA-256, from the manifest; none for the manifest and indexes.
    pub size: Option<u64>,
    pub sha256: Option<String>,
}

/// A file found for a reader it was authorized for.
struct Located {
    tenant: String,
    prefix: Key,
    facts: DatasetFileFacts,
}

/// A file of a pushed dataset, on its way to the caller.
pub struct DatasetFile {
    pub size: u64,
    pub kind: DatasetFileKind,
    pub stream: BoxStream<'static, std::result::Result<Bytes, std::io::Error>>,
}

impl App {
    /// Registers a dataset version, described in full, taken from a data-pack job's output, or
    /// from files pushed to the object store.
    pub async fn dataset_register(&self, caller: &Caller, request: DatasetRegister) -> Result<(Dataset, bool)> {
        let audit = Audit::by(caller, "dataset.register", format!("dataset:{}@{}", request.name, request.version));
        self.audited(&audit, self.dataset_register_checked(caller, request, &audit)).await
    }

    async fn dataset_register_checked(
        &self,
        caller: &Caller,
        request: DatasetRegister,
        audit: &Audit,
    ) -> Result<(Dataset, bool)> {
        caller.authorize(Action::WriteJobs)?;
        let dataset_ref = match DatasetRef::new(&request.name, &request.version) {
            Ok(dataset_ref) => dataset_ref,
            Err(message) => {
                let field = if message.contains("dataset name") { "name" } else { "version" };
                return Err(Error::invalid(field, message));
            }
        };
        let mut dataset = Dataset {
            name: request.name.clone(),
            version: request.version.clone(),
            uri: request.uri.clone().unwrap_or_default(),
            format: request.format.clone().unwrap_or_else(|| "files".into()),
            size_bytes: request.size_bytes,
            samples: request.samples,
            content_hash: request.content_hash.clone().unwrap_or_default(),
            source_job: None,
            store_prefix: None,
            created_by: caller.user.clone(),
            created_at: chrono::Utc::now(),
            cached_on: Vec::new(),
        };
        let store_location_refused = |field: &str| {
            Error::invalid(
                field,
                "store: locations are Trainyard's own; push the files (`yard datasets push`) and register with from_store",
            )
        };
        if dataset.uri.starts_with(trainyard_core::names::STORE_DATASET_PREFIX) {
            return Err(store_location_refused("uri"));
        }
        if request.from_job.is_some() && request.from_store.is_some() {
            return Err(Error::invalid("from_store", "give from_job or from_store, not both"));
        }
        if let Some(job_id) = request.from_job {
            let no_such_job = |err| match err {
                Error::NotFound { .. } => Error::invalid("from_job", "names no job of your tenant"),
                other => other,
            };
            let job = self.store.job_get(caller.tenant_id, job_id).await.map_err(no_such_job)?;
            let outputs = self.store.job_outputs(caller.tenant_id, job_id).await.map_err(no_such_job)?;
            if job.state != trainyard_core::job::JobState::Succeeded {
                return Err(Error::invalid(
                    "from_job",
                    format!("the job {}; only a succeeded job's output is registered", job.state),
                ));
            }
            let out = outputs.get("dataset").ok_or_else(|| {
                Error::invalid("from_job", "the job recorded no `dataset` output (data-pack jobs do)")
            })?;
            let text = |k: &str| out[k].as_str().map(str::to_string);
            dataset.uri = text("path").unwrap_or_default();
            dataset.format = text("format").unwrap_or_else(|| "trainyard-shards-v1".into());
            dataset.content_hash = text("content_hash").unwrap_or_default();
            dataset.size_bytes = out["bytes"].as_i64();
            dataset.samples = out["samples"].as_i64();
            dataset.source_job = Some(job_id);
            // A job's output path, like a given uri, cannot claim a store: location.
            if dataset.uri.starts_with(trainyard_core::names::STORE_DATASET_PREFIX) {
                return Err(store_location_refused("from_job"));
            }
        }
        if let Some(content_hash) = &request.from_store {
            if request.uri.is_some() {
                return Err(Error::invalid("uri", "a pushed dataset's location is the object store: leave uri out"));
            }
            let hex = content_hex(content_hash, "from_store")?;
            if request.content_hash.as_ref().is_some_and(|given| given != content_hash) {
                return Err(Error::invalid(
                    "content_hash",
                    "a pushed dataset's content hash is from_store's: leave it out",
                ));
            }
            let prefix = keys::dataset_content_prefix(caller.tenant_id, hex);
            let manifest = self.pushed_manifest(&prefix).await?.ok_or_else(|| {
                Error::invalid(
                    "from_store",
                    format!("no manifest of {content_hash} was uploaded (PUT /api/v1/dataset-content/{hex}/{MANIFEST_FILE} first)"),
                )
            })?;
            self.pushed_files_complete(&prefix, &manifest).await?;
            dataset.uri = dataset_ref.store_uri();
            dataset.format = manifest.format.clone();
            dataset.content_hash = manifest.content_hash.clone();
            dataset.size_bytes = i64::try_from(manifest.bytes).ok();
            dataset.samples = i64::try_from(manifest.samples).ok();
            dataset.store_prefix = Some(prefix.to_string());
        }
        if dataset.uri.is_empty() {
            return Err(Error::invalid("uri", "say where the dataset is, or give from_job or from_store"));
        }
        if dataset.content_hash.is_empty() {
            return Err(Error::invalid(
                "content_hash",
                "a dataset version needs its content hash (data-pack records one)",
            ));
        }
        let published = self.store.dataset_register(caller, &dataset, audit).await?;
        let stored = self.store.dataset_get(caller.tenant_id, &dataset.name, &dataset.version).await?;
        Ok((stored, published == Published::Created))
    }

    pub async fn datasets_list(&self, caller: &Caller) -> Result<Vec<Dataset>> {
        caller.authorize(Action::ReadJobs)?;
        self.store.datasets_list(caller.tenant_id).await
    }

    pub async fn dataset_get(&self, caller: &Caller, name: &str, version: &str) -> Result<Dataset> {
        caller.authorize(Action::ReadJobs)?;
        self.store.dataset_get(caller.tenant_id, name, version).await
    }

    /// Stores one file of a dataset being pushed, under the tenant's prefix for `content_hex`
    /// (the manifest's content hash): first the manifest (`dataset.json`, checked whole: its
    /// content hash is recomputed and must be `content_hex`), then the shards and indexes it
    /// names. A shard streams to the store and is kept only when its bytes have the SHA-256 and
    /// size the manifest gives; anything else is a 422 naming the file, and nothing is stored.
    pub async fn dataset_file_upload<S, E>(
        &self,
        caller: &Caller,
        content_hex: &str,
        file: &str,
        body: S,
    ) -> Result<DatasetFileUploaded>
    where
        S: Stream<Item = std::result::Result<Bytes, E>> + Send + Unpin + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        let (caller, content_hex, file) = (caller.clone(), content_hex.to_string(), file.to_string());
        // Run to its end even when the request is cancelled: a stored file always has its entry.
        self.uncancelled(move |app| async move {
            let audit = Audit::by(&caller, "dataset.upload", format!("dataset-content:{content_hex}/{file}"));
            let upload = app.dataset_file_upload_checked(&caller, &content_hex, &file, body);
            let uploaded = app.audited(&audit, upload).await?;
            // The file lives in the object store, outside any transaction: recorded once stored.
            app.store.audit_done(&audit).await?;
            Ok(uploaded)
        })
        .await
    }

    async fn dataset_file_upload_checked<S, E>(
        &self,
        caller: &Caller,
        content_hex: &str,
        file: &str,
        body: S,
    ) -> Result<DatasetFileUploaded>
    where
        S: Stream<Item = std::result::Result<Bytes, E>> + Send + Unpin,
        E: std::fmt::Display,
    {
        caller.authorize(Action::WriteJobs)?;
        let hex = content_hex_of_path(content_hex)?;
        dataset_file_name(file).map_err(|why| Error::invalid("file", why))?;
        let prefix = keys::dataset_content_prefix(caller.tenant_id, hex);
        if file == MANIFEST_FILE {
            return self.manifest_upload(caller.tenant_id, &prefix, hex, body).await;
        }
        let manifest = if self.store.dataset_push_renew(caller.tenant_id, prefix.as_ref()).await? {
            self.pushed_manifest(&prefix).await?
        } else {
            None
        };
        let manifest = manifest.ok_or_else(|| {
            Error::invalid(
                "file",
                format!("{file}: upload the manifest ({MANIFEST_FILE}) of this content first; the files are checked against it"),
            )
        })?;
        let (kind, shard) = file_in(&manifest, file).ok_or_else(|| {
            Error::invalid("file", format!("{file} is not a file the manifest of sha256:{hex} names"))
        })?;
        if kind == DatasetFileKind::Shard && shard.bytes > self.storage.max_artifact_bytes {
            return Err(Error::invalid(
                "file",
                format!(
                    "shard {file} has {} bytes; one file is at most {} bytes here (--max-artifact-size)",
                    shard.bytes, self.storage.max_artifact_bytes
                ),
            ));
        }
        let key = keys::dataset_file_key(&prefix, file);
        let uploaded = match kind {
            DatasetFileKind::Shard => self
                .storage
                .objects
                .upload_expecting(&key, body, shard.bytes, &shard.sha256)
                .await
                .map_err(|err| match err {
                    StorageError::Mismatch { size, sha256 } => Error::invalid(
                        "file",
                        format!(
                            "shard {file} does not match the manifest: {size} bytes with sha256 {sha256} arrived, the manifest says {} bytes with sha256 {}; nothing was stored",
                            shard.bytes, shard.sha256
                        ),
                    ),
                    other => storage_error(other),
                })?,
            // The manifest records no hash of an index: stored as it comes, within the limit,
            // until a version is registered on this content; from then on it stays as it is
            // (the version is immutable, and jobs read its indexes at every start).
            _ if self.store.dataset_content_registered(caller.tenant_id, prefix.as_ref()).await? => {
                return Err(registered_conflict(hex));
            }
            _ => self.index_upload(caller.tenant_id, &prefix, &key, hex, body).await?,
        };
        Ok(DatasetFileUploaded {
            file: file.to_string(),
            kind: kind.as_str().to_string(),
            size_bytes: uploaded.size,
            sha256: uploaded.sha256,
        })
    }

    /// Stores an index of a push, unless a version is registered on the content: the body goes
    /// to a key of its own first, then is copied into place under the push's row lock, which a
    /// registration takes too. So a registration sees the index as it will stay, and an upload
    /// racing it either lands before it or is refused (409), never after it.
    async fn index_upload<S, E>(
        &self,
        tenant_id: Uuid,
        prefix: &Key,
        key: &Key,
        hex: &str,
        body: S,
    ) -> Result<trainyard_storage::objects::Uploaded>
    where
        S: Stream<Item = std::result::Result<Bytes, E>> + Send + Unpin,
        E: std::fmt::Display,
    {
        let incoming = keys::dataset_incoming_key(tenant_id, Uuid::new_v4());
        let uploaded = self
            .storage
            .objects
            .upload(&incoming, body, self.storage.max_artifact_bytes)
            .await
            .map_err(storage_error)?;
        let placed = async {
            let lock = self.store.dataset_push_lock(tenant_id, prefix.as_ref()).await?.ok_or_else(|| {
                Error::invalid("file", format!("upload the manifest ({MANIFEST_FILE}) of sha256:{hex} first"))
            })?;
            if lock.registered {
                return Err(registered_conflict(hex));
            }
            self.storage.objects.copy(&incoming, key).await.map_err(storage_error)?;
            lock.release().await
        }
        .await;
        if let Err(err) = self.storage.objects.delete(&incoming).await {
            tracing::warn!(%err, key = %incoming, "removing an index upload's incoming copy");
        }
        placed.map(|()| uploaded)
    }

    /// Stores a push's manifest after checking it. A manifest kept under this hash already
    /// stays when it names the same shards (another packer's `created_by`, say). One naming
    /// other files or sizes under the same hash (the content hash covers the shards' names,
    /// samples and digests, not their sizes or index names) replaces it while no version is
    /// registered on the content (a push that went wrong is pushed again: shards are checked
    /// against the manifest as they arrive, so none stored under the old one can be wrong), and
    /// is refused (409) once one is: it would change what the version reads.
    async fn manifest_upload<S, E>(
        &self,
        tenant_id: Uuid,
        prefix: &Key,
        hex: &str,
        body: S,
    ) -> Result<DatasetFileUploaded>
    where
        S: Stream<Item = std::result::Result<Bytes, E>> + Send + Unpin,
        E: std::fmt::Display,
    {
        let bytes = body_whole(body, MAX_MANIFEST_BYTES).await?;
        let manifest = manifest_checked(&bytes, hex)?;
        // Its shards count against the tenant's storage quota from now on (422 when over).
        let shard_bytes = manifest.shards.iter().fold(0u64, |sum, shard| sum.saturating_add(shard.bytes));
        self.store.dataset_push_begin(tenant_id, prefix.as_ref(), shard_bytes).await?;
        let key = keys::dataset_file_key(prefix, MANIFEST_FILE);
        if let Some(existing) = self.pushed_manifest(prefix).await?
            && (existing.shards == manifest.shards
                || self.store.dataset_content_registered(tenant_id, prefix.as_ref()).await?)
        {
            if existing.shards != manifest.shards {
                return Err(Error::Conflict(format!(
                    "sha256:{hex} is registered as a dataset version with a manifest naming other files or sizes; its files cannot change"
                )));
            }
            let size = self.storage.objects.size_of(&key).await.map_err(storage_error)?.unwrap_or_default();
            let sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
            return Ok(DatasetFileUploaded {
                file: MANIFEST_FILE.into(),
                kind: "manifest".into(),
                size_bytes: size,
                sha256,
            });
        }
        // New, or replacing one no version is registered on: written under the push's row
        // lock, which a registration takes too, so that none registers on the old one meanwhile.
        let lock = self
            .store
            .dataset_push_lock(tenant_id, prefix.as_ref())
            .await?
            .ok_or_else(|| Error::internal(format!("the push of sha256:{hex} has no row after its manifest")))?;
        if lock.registered {
            return Err(registered_conflict(hex));
        }
        let size = bytes.len() as u64;
        let chunk = futures::stream::iter([Ok::<Bytes, std::io::Error>(Bytes::from(bytes))]);
        let uploaded = self.storage.objects.upload(&key, chunk, size).await.map_err(storage_error)?;
        lock.release().await?;
        Ok(DatasetFileUploaded {
            file: MANIFEST_FILE.into(),
            kind: "manifest".into(),
            size_bytes: uploaded.size,
            sha256: uploaded.sha256,
        })
    }

    /// The manifest kept under a push's prefix, if one was uploaded.
    async fn pushed_manifest(&self, prefix: &Key) -> Result<Option<DatasetManifest>> {
        let key = keys::dataset_file_key(prefix, MANIFEST_FILE);
        let Some((_, stream)) = self.storage.objects.download(&key).await.map_err(storage_error)? else {
            return Ok(None);
        };
        let chunks: Vec<Bytes> = stream.try_collect().await.map_err(storage_error)?;
        serde_json::from_slice(&chunks.concat())
            .map(Some)
            .map_err(|err| Error::internal(format!("the stored manifest {key} does not read: {err}")))
    }

    /// Refuses a registration (422 naming the file) unless every shard the manifest names is
    /// stored with its size, and every index is stored. One listing, not a request per file.
    async fn pushed_files_complete(&self, prefix: &Key, manifest: &DatasetManifest) -> Result<()> {
        let objects = self.storage.objects.list(prefix).await.map_err(storage_error)?;
        let stored: std::collections::HashMap<String, u64> = objects
            .into_iter()
            .filter_map(|o| {
                let mut parts = o.key.prefix_match(prefix)?;
                let name = keys::decoded(parts.next()?.as_ref());
                parts.next().is_none().then_some((name, o.size))
            })
            .collect();
        let push = "upload it (`yard datasets push` does) before registering";
        for shard in &manifest.shards {
            match stored.get(&shard.name) {
                None => {
                    return Err(Error::invalid("from_store", format!("shard {} was not uploaded; {push}", shard.name)));
                }
                Some(&size) if size != shard.bytes => {
                    return Err(Error::invalid(
                        "from_store",
                        format!(
                            "shard {} is stored with {size} bytes, the manifest says {}; {push}",
                            shard.name, shard.bytes
                        ),
                    ));
                }
                Some(_) => {}
            }
            if !stored.contains_key(&shard.index) {
                return Err(Error::invalid("from_store", format!("index {} was not uploaded; {push}", shard.index)));
            }
        }
        Ok(())
    }

    /// What the server knows of one file of a pushed dataset version without reading it (the
    /// answer to `HEAD`): the same authorization as [`App::dataset_file_read`], so that a node's
    /// cache agent can ask, for each request a job makes of it, whether the job may read the
    /// file and which cached content it is. Reads nothing from the object store but the
    /// manifest, once.
    pub async fn dataset_file_describe(
        &self,
        reader: &DatasetReader,
        name: &str,
        version: &str,
        file: &str,
    ) -> Result<DatasetFileFacts> {
        Ok(self.dataset_file_locate(reader, name, version, file).await?.facts)
    }

    /// One file of a pushed dataset version, streamed from the object store: for a member of
    /// its tenant, or for a job that recorded reading that version. Anything else, another
    /// tenant's version included, is the same 404 as a version that does not exist. Counts the
    /// bytes it sends (`trainyard_dataset_bytes_served_total`).
    pub async fn dataset_file_read(
        &self,
        reader: &DatasetReader,
        name: &str,
        version: &str,
        file: &str,
    ) -> Result<DatasetFile> {
        let Located { tenant, prefix, facts } = self.dataset_file_locate(reader, name, version, file).await?;
        let kind = facts.kind;
        let key = keys::dataset_file_key(&prefix, file);
        let (size, stream) = self
            .storage
            .objects
            .download(&key)
            .await
            .map_err(storage_error)?
            .ok_or_else(|| Error::internal(format!("the registered version {name}@{version} lacks {key}")))?;
        let served = self.monitoring.dataset_bytes_counter(&tenant, kind.as_str());
        let stream = stream
            .map_err(std::io::Error::other)
            .inspect_ok(move |chunk| {
                served.inc_by(chunk.len() as u64);
            })
            .boxed();
        Ok(DatasetFile { size, kind, stream })
    }

    /// Authorizes a read of one file of a pushed version and finds it (see
    /// [`App::dataset_file_read`]).
    async fn dataset_file_locate(
        &self,
        reader: &DatasetReader,
        name: &str,
        version: &str,
        file: &str,
    ) -> Result<Located> {
        let (tenant_id, tenant) = match reader {
            DatasetReader::Member(caller) => {
                caller.authorize(Action::ReadJobs)?;
                (caller.tenant_id, caller.tenant.as_str())
            }
            DatasetReader::Job(job) => {
                if !self.store.job_reads_dataset(job.tenant_id, job.job_id, name, version).await? {
                    return Err(Error::not_found(ObjectKind::Dataset));
                }
                (job.tenant_id, job.tenant.as_str())
            }
        };
        let dataset = self.store.dataset_get(tenant_id, name, version).await?;
        let prefix = pushed_prefix(tenant_id, &dataset)?;
        let manifest = match self.manifests.get(&prefix) {
            Some(manifest) => manifest,
            None => {
                let manifest = self.pushed_manifest(&prefix).await?.ok_or_else(|| {
                    Error::internal(format!("the registered version {name}@{version} has no manifest at {prefix}"))
                })?;
                self.manifests.put(&prefix, manifest)
            }
        };
        // Only a name the manifest gives becomes a key: nothing from the path reaches the store.
        let (kind, shard) = if file == MANIFEST_FILE {
            (DatasetFileKind::Manifest, None)
        } else {
            match file_in(&manifest, file).ok_or_else(|| Error::not_found(ObjectKind::Dataset))? {
                (DatasetFileKind::Shard, entry) => (DatasetFileKind::Shard, Some(entry)),
                (kind, _) => (kind, None),
            }
        };
        let facts = DatasetFileFacts {
            tenant_id,
            content_hex: content_hex(&dataset.content_hash, "content_hash")?.to_string(),
            kind,
            size: shard.map(|entry| entry.bytes),
            sha256: shard.map(|entry| entry.sha256.clone()),
        };
        Ok(Located { tenant: tenant.to_string(), prefix, facts })
    }
}

impl App {
    /// A job's engine saying that its node's shard cache holds every shard of a version the job
    /// reads: the scheduler then prefers that node for the tenant's jobs reading the same
    /// content. Only for the token's own job, a version it recorded reading (404 otherwise, as
    /// for any dataset the caller cannot read) and a node it was placed on (422 on `node`).
    pub async fn node_cache_report(&self, caller: &JobCaller, job_id: Uuid, report: NodeCacheReport) -> Result<()> {
        if caller.job_id != job_id {
            return Err(Error::not_found(ObjectKind::Job));
        }
        if report.node.is_empty() || report.node.len() > 253 {
            return Err(Error::invalid(
                "node",
                "must be the name of the node the replica runs on (1 to 253 characters)",
            ));
        }
        if report.bytes < 0 {
            return Err(Error::invalid("bytes", "must not be negative"));
        }
        // The local machine's nodes (one per GPU type) share its one cache.
        let sharing = match self.executor.nodes() {
            Some(_) => Vec::new(),
            None => crate::scheduling::snapshot::nodes_sharing_a_cache(
                &crate::scheduling::snapshot::nodes_of(&self.executor.inventory()),
                &report.node,
            ),
        };
        let outcome = self
            .store
            .node_dataset_report(
                caller.tenant_id,
                job_id,
                &report.name,
                &report.version,
                &report.node,
                &sharing,
                report.bytes,
            )
            .await?;
        match outcome {
            NodeReport::Recorded => Ok(()),
            NodeReport::NotRead => Err(Error::not_found(ObjectKind::Dataset)),
            NodeReport::NotItsNode => {
                Err(Error::invalid("node", format!("this job does not run on node {:?}", report.node)))
            }
        }
    }
}

/// The manifests of registered pushed versions, by their object-store prefix: a file request
/// then costs no read of the manifest from the store (a dataset of 1,000 shards was 1,000
/// manifest downloads per node). Safe to keep: a registered version's prefix is its content
/// hash, and the manifest under it can never be replaced. The most recently used, up to
/// [`MANIFEST_CACHE_SHARDS`] shard entries in all (a manifest's size is its shard list).
#[derive(Default)]
pub struct ManifestCache(std::sync::Mutex<ManifestLru>);

/// Shard entries the cached manifests may hold in all: some 200 MB at most.
const MANIFEST_CACHE_SHARDS: usize = 1_000_000;

pub struct ManifestLru {
    manifests: hashlink::LinkedHashMap<String, std::sync::Arc<DatasetManifest>>,
    shards: usize,
}

impl Default for ManifestLru {
    fn default() -> Self {
        ManifestLru { manifests: hashlink::LinkedHashMap::new(), shards: 0 }
    }
}

impl ManifestCache {
    fn get(&self, prefix: &Key) -> Option<std::sync::Arc<DatasetManifest>> {
        let mut lru = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let manifest = lru.manifests.to_back(prefix.as_ref())?;
        Some(std::sync::Arc::clone(manifest))
    }

    fn put(&self, prefix: &Key, manifest: DatasetManifest) -> std::sync::Arc<DatasetManifest> {
        let manifest = std::sync::Arc::new(manifest);
        let weight = manifest.shards.len().max(1);
        if weight > MANIFEST_CACHE_SHARDS {
            return manifest;
        }
        let mut lru = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(old) = lru.manifests.insert(prefix.as_ref().to_string(), std::sync::Arc::clone(&manifest)) {
            lru.shards -= old.shards.len().max(1);
        }
        lru.shards += weight;
        while lru.shards > MANIFEST_CACHE_SHARDS {
            let Some((_, evicted)) = lru.manifests.pop_front() else { break };
            lru.shards -= evicted.shards.len().max(1);
        }
        manifest
    }
}

/// The object-store prefix of a registered version pushed there; a version kept elsewhere has
/// no files here (404).
fn pushed_prefix(tenant_id: Uuid, dataset: &Dataset) -> Result<Key> {
    let prefix = dataset.store_prefix.as_deref().ok_or_else(|| Error::not_found(ObjectKind::Dataset))?;
    let key = Key::parse(prefix).map_err(Error::internal)?;
    // The database pins it under the tenant (`datasets_store_prefix_in_tenant`); so does this.
    if keys::tenant_of(&key) != Some(tenant_id) {
        return Err(Error::internal(format!("dataset {} has a store prefix outside its tenant", dataset.name)));
    }
    Ok(key)
}

/// The hex digits of a content hash given as `sha256:<64 hex>`, or a 422 on `field`.
fn content_hex<'a>(content_hash: &'a str, field: &str) -> Result<&'a str> {
    content_hash.strip_prefix("sha256:").filter(|hex| is_sha256_hex(hex)).ok_or_else(|| {
        Error::invalid(field, "must be sha256: and the 64 lowercase hex digits of the manifest's content hash")
    })
}

/// The content hash as a path segment: its 64 lowercase hex digits (or `sha256:` and them).
fn content_hex_of_path(text: &str) -> Result<&str> {
    let hex = text.strip_prefix("sha256:").unwrap_or(text);
    if is_sha256_hex(hex) {
        Ok(hex)
    } else {
        Err(Error::invalid("hash", "must be the 64 lowercase hex digits of the manifest's content hash"))
    }
}

/// A name a pushed dataset's file may have: one plain path segment (it becomes the last part of
/// a key, and a file name in the engine's folder), passing the one check for user paths.
pub fn dataset_file_name(name: &str) -> std::result::Result<(), String> {
    let path = trainyard_storage::relative_path(name).map_err(|refused| refused.to_string())?;
    if path.segments().count() != 1 {
        return Err(format!("{name:?} is not a plain file name (no '/')"));
    }
    Ok(())
}

/// What `file` is in `manifest`: a shard or an index, with its shard's entry.
fn file_in<'m>(manifest: &'m DatasetManifest, file: &str) -> Option<(DatasetFileKind, &'m ShardEntry)> {
    manifest.shards.iter().find_map(|shard| {
        if shard.name == file {
            Some((DatasetFileKind::Shard, shard))
        } else if shard.index == file {
            Some((DatasetFileKind::Index, shard))
        } else {
            None
        }
    })
}

fn registered_conflict(hex: &str) -> Error {
    Error::Conflict(format!(
        "sha256:{hex} is registered as a dataset version; its files cannot change (register it under another name without pushing again: POST /api/v1/datasets with from_store)"
    ))
}

/// A pushed manifest, checked: the format data-pack writes; shard and index names that are
/// plain, distinct file names other than the manifest's; each shard's SHA-256 as 64 lowercase
/// hex digits; and a content hash that is what its shards hash to and what the push names.
pub fn manifest_checked(bytes: &[u8], hex: &str) -> Result<DatasetManifest> {
    let bad = |why: String| Error::invalid("file", format!("{MANIFEST_FILE}: {why}"));
    let manifest: DatasetManifest =
        serde_json::from_slice(bytes).map_err(|err| bad(format!("not a dataset manifest: {err}")))?;
    if manifest.format != FORMAT {
        return Err(bad(format!("format {:?}; a pushed dataset is {FORMAT} (what data-pack writes)", manifest.format)));
    }
    let mut names = std::collections::HashSet::new();
    for shard in &manifest.shards {
        for name in [&shard.name, &shard.index] {
            dataset_file_name(name).map_err(|why| bad(format!("a shard's file: {why}")))?;
            if name == MANIFEST_FILE || !names.insert(name.as_str()) {
                return Err(bad(format!("the file {name} is named twice")));
            }
        }
        if !is_sha256_hex(&shard.sha256) {
            return Err(bad(format!("shard {}: sha256 must be 64 lowercase hex digits", shard.name)));
        }
        if i64::try_from(shard.bytes).is_err() {
            return Err(bad(format!("shard {}: {} bytes is not a size", shard.name, shard.bytes)));
        }
    }
    // The totals the registry records are the shards' own (what data-pack writes).
    let (bytes, samples) =
        manifest.shards.iter().fold((0u64, 0u64), |(b, n), s| (b.saturating_add(s.bytes), n.saturating_add(s.samples)));
    if (manifest.bytes, manifest.samples) != (bytes, samples) {
        return Err(bad(format!(
            "it says {} bytes and {} samples, but its shards add up to {bytes} bytes and {samples} samples",
            manifest.bytes, manifest.samples
        )));
    }
    let computed = trainyard_data::manifest::content_hash(&manifest.shards);
    if manifest.content_hash != computed {
        return Err(bad(format!(
            "its content_hash is {}, but its shards hash to {computed}; was it edited?",
            manifest.content_hash
        )));
    }
    if computed != format!("sha256:{hex}") {
        return Err(bad(format!("its content hash is {computed}, not the sha256:{hex} it was uploaded under")));
    }
    Ok(manifest)
}

/// A body read whole, up to `limit` bytes (a 413-like 422 on `body` past it).
async fn body_whole<S, E>(mut body: S, limit: usize) -> Result<Vec<u8>>
where
    S: Stream<Item = std::result::Result<Bytes, E>> + Send + Unpin,
    E: std::fmt::Display,
{
    let mut bytes = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|err| Error::invalid("body", format!("the upload broke off: {err}")))?;
        if bytes.len() + chunk.len() > limit {
            return Err(Error::invalid("body", format!("a manifest is at most {limit} bytes")));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(name: &str, sha: char) -> ShardEntry {
        ShardEntry {
            name: format!("{name}.tar"),
            index: format!("{name}.idx.json"),
            samples: 3,
            bytes: 10240,
            sha256: sha.to_string().repeat(64),
        }
    }

    fn manifest_bytes(shards: Vec<ShardEntry>) -> (Vec<u8>, String) {
        let manifest = DatasetManifest::new("data", shards);
        let hex = manifest.content_hash.trim_start_matches("sha256:").to_string();
        (serde_json::to_vec(&manifest).unwrap(), hex)
    }

    #[test]
    fn a_manifest_is_checked_against_its_hash_and_its_names() {
        let (bytes, hex) = manifest_bytes(vec![shard("data-000000", 'a'), shard("data-000001", 'b')]);
        assert_eq!(manifest_checked(&bytes, &hex).unwrap().shards.len(), 2);
        // Uploaded under another hash, or edited after packing.
        let err = manifest_checked(&bytes, &"0".repeat(64)).unwrap_err().to_string();
        assert!(err.contains("not the sha256:0000"), "{err}");
        let mut edited: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        edited["shards"][0]["sha256"] = serde_json::json!("c".repeat(64));
        let err = manifest_checked(&serde_json::to_vec(&edited).unwrap(), &hex).unwrap_err().to_string();
        assert!(err.contains("was it edited"), "{err}");
        // Totals the registry would record that are not the shards' own.
        let mut inflated: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        inflated["bytes"] = serde_json::json!(1);
        let err = manifest_checked(&serde_json::to_vec(&inflated).unwrap(), &hex).unwrap_err().to_string();
        assert!(err.contains("its shards add up to 20480 bytes and 6 samples"), "{err}");
        // Names that would leave the prefix, or that collide.
        for bad in ["../x.tar", "a/b.tar", "dataset.json", "data-000001.tar", "%2e%2e"] {
            let mut shards = vec![shard("data-000000", 'a'), shard("data-000001", 'b')];
            shards[0].name = bad.to_string();
            let (bytes, hex) = manifest_bytes(shards);
            let err = manifest_checked(&bytes, &hex).unwrap_err();
            assert!(matches!(&err, Error::InvalidInput { field, .. } if field == "file"), "{bad}: {err}");
        }
        let mut upper = shard("data-000000", 'a');
        upper.sha256 = "A".repeat(64);
        let (bytes, hex) = manifest_bytes(vec![upper]);
        assert!(manifest_checked(&bytes, &hex).unwrap_err().to_string().contains("lowercase hex"));
        assert!(manifest_checked(b"{\"not\": \"a manifest\"}", &hex).is_err());
    }

    #[test]
    fn only_files_the_manifest_names_are_found() {
        let manifest = DatasetManifest::new("data", vec![shard("data-000000", 'a')]);
        assert_eq!(file_in(&manifest, "data-000000.tar").map(|f| f.0), Some(DatasetFileKind::Shard));
        assert_eq!(file_in(&manifest, "data-000000.idx.json").map(|f| f.0), Some(DatasetFileKind::Index));
        assert!(file_in(&manifest, "data-000001.tar").is_none());
        assert!(file_in(&manifest, "../data-000000.tar").is_none());
    }

    #[test]
    fn content_hashes_in_paths_and_bodies() {
        let hex = "ab".repeat(32);
        assert_eq!(content_hex_of_path(&hex).unwrap(), hex);
        assert_eq!(content_hex_of_path(&format!("sha256:{hex}")).unwrap(), hex);
        assert!(content_hex_of_path(&"AB".repeat(32)).is_err());
        assert!(content_hex_of_path("..").is_err());
        assert_eq!(content_hex(&format!("sha256:{hex}"), "from_store").unwrap(), hex);
        assert!(content_hex(&hex, "from_store").is_err(), "the body names the hash as the manifest writes it");
    }
}
