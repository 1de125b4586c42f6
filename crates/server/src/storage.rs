//! Storage in the control plane: its settings (`--object-store`, volumes, limits) and the
//! configured object store with the volumes folder, shared by the operations that requests
//! reach (`app::storage`: artefacts, volumes, the storage policy) and the control loop's
//! archiving and retention (`control::archiving`). Keys and path checks live in
//! `trainyard-storage`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use tokio::sync::OnceCell;
use trainyard_core::auth::Caller;
use trainyard_core::resources::Memory;
use trainyard_core::{Error, Result};
use trainyard_storage::{ObjectStorage, StorageConfig, StorageError, UrlSigner, relative_path};
use trainyard_store::Store;
use trainyard_store::metrics::JobCaller;
use uuid::Uuid;

/// The name of the URL-signing key in `server_secrets`.
const SIGNING_SECRET: &str = "artifact-download-urls";
/// Download links live this long unless the caller asks for less (or more, up to a day).
pub(crate) const LINK_SECONDS_DEFAULT: u64 = 300;
pub(crate) const LINK_SECONDS_MAX: u64 = 86_400;

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
    // The control plane's alone: jobs must not read other tenants' artefacts and logs here.
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
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
    pub(crate) max_artifact_bytes: u64,
    pub retention_every: Duration,
}

impl Storage {
    pub(crate) async fn signer(&self, store: &Store) -> Result<&UrlSigner> {
        self.signer.get_or_try_init(|| async { Ok(UrlSigner::new(store.server_secret(SIGNING_SECRET).await?)) }).await
    }

    pub(crate) fn volume_dir(&self, tenant_id: Uuid, name: &str) -> PathBuf {
        self.volumes_dir.join(tenant_id.to_string()).join(name)
    }
}

/// Who uploads an artefact: a member with their token, or the job's engine with its job token.
pub enum Uploader {
    User(Caller),
    Job(JobCaller),
}

pub(crate) fn storage_error(err: StorageError) -> Error {
    match err {
        StorageError::TooLarge(limit) => Error::invalid("body", format!("an artefact is at most {limit} bytes")),
        StorageError::Body(cause) => Error::invalid("body", format!("the upload broke off: {cause}")),
        other => Error::internal(other),
    }
}

/// The checked path of an artefact, or a 422 naming the parameter.
pub(crate) fn artifact_path(text: &str) -> Result<trainyard_storage::RelPath> {
    relative_path(text).map_err(|refused| Error::invalid("path", refused.to_string()))
}
