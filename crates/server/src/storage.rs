//! Storage in the control plane: its settings (`--object-store`, volumes, limits) and the
//! configured object store with the volumes folder, shared by the operations that requests
//! reach (`app::storage`: artefacts, volumes, the storage policy) and the control loop's
//! archiving and retention (`control::archiving`). Keys and path checks live in
//! `trainyard-storage`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use trainyard_core::auth::Caller;
use trainyard_core::resources::Memory;
use trainyard_core::{Error, Result};
use trainyard_storage::{ObjectStorage, StorageConfig, StorageError, UrlSigner, relative_path};
use trainyard_store::metrics::JobCaller;
use uuid::Uuid;

/// Download links live this long unless the caller asks for less (or more, up to 15 minutes:
/// a link is for downloading now; a script asks again).
pub(crate) const LINK_SECONDS_DEFAULT: u64 = 300;
pub(crate) const LINK_SECONDS_MAX: u64 = 900;

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
    /// The file holding the key that signs download links of the local store (at least 32
    /// characters; every server replica needs the same). Default: `<data-dir>/signing.key`,
    /// made at the first start, readable by the server's user alone. Never in the database,
    /// so that a database dump cannot forge links.
    #[arg(long, env = "TRAINYARD_SIGNING_KEY_FILE")]
    pub signing_key_file: Option<PathBuf>,
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
        let volumes_dir = data_dir.join(trainyard_executor::local::VOLUMES_DIR);
        std::fs::create_dir_all(&volumes_dir)
            .with_context(|| format!("creating the volumes folder {}", volumes_dir.display()))?;
        tracing::info!(store = objects.url(), "object store");
        let key_file = self.signing_key_file.clone().unwrap_or_else(|| data_dir.join("signing.key"));
        Ok(Storage {
            objects,
            volumes_dir,
            signer: UrlSigner::new(signing_key(&key_file)?),
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

/// The download-link key in `path`, made there (0600, 256 random bits in hex) when the file does
/// not exist. A key file that anyone on the machine may read is refused: with it, they could
/// sign a link to any tenant's artefacts.
fn signing_key(path: &Path) -> anyhow::Result<Vec<u8>> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut fresh = [0u8; 32];
    rand::fill(&mut fresh);
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(mut file) => {
            file.write_all(hex::encode(fresh).as_bytes())?;
            file.sync_all()?;
            tracing::info!(file = %path.display(), "made a new key for download links");
        }
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(err) => return Err(err).with_context(|| format!("creating the signing key file {}", path.display())),
    }
    let mode = std::fs::metadata(path)?.permissions().mode();
    if mode & 0o007 != 0 {
        anyhow::bail!(
            "the signing key file {} may be read by every user of this machine (mode {:o}); chmod o-rwx it",
            path.display(),
            mode & 0o777
        );
    }
    let key =
        std::fs::read_to_string(path).with_context(|| format!("reading the signing key file {}", path.display()))?;
    let key = key.trim();
    if key.len() < 32 {
        anyhow::bail!("the signing key file {} holds {} characters; it needs at least 32", path.display(), key.len());
    }
    Ok(key.as_bytes().to_vec())
}

/// The object store and the volumes folder, as the server uses them.
#[derive(Debug)]
pub struct Storage {
    pub objects: ObjectStorage,
    volumes_dir: PathBuf,
    /// Signs download links of the local store (key from `--signing-key-file`).
    signer: UrlSigner,
    pub(crate) max_artifact_bytes: u64,
    pub retention_every: Duration,
}

impl Storage {
    pub(crate) fn signer(&self) -> &UrlSigner {
        &self.signer
    }

    /// The secret an interactive session's program accepts, which only the proxy sends: derived
    /// from the signing key and the session's id, so no table holds it.
    pub(crate) fn session_upstream_secret(&self, session: uuid::Uuid) -> String {
        self.signer.derived_secret(&format!("interactive-session-upstream:{session}"))
    }

    /// The MLflow token of replica `rank` (1 and up) of an attempt whose job token is
    /// `job_token` ([`replica_token`]).
    pub(crate) fn replica_token(&self, job_token: &str, rank: u32) -> String {
        replica_token(&self.signer, job_token, rank)
    }

    /// The job token and rank a replica token stands for ([`replica_token_parts`]).
    pub(crate) fn replica_token_parts<'t>(&self, token: &'t str) -> Option<std::result::Result<(&'t str, u32), ()>> {
        replica_token_parts(&self.signer, token)
    }

    /// The HMAC key a notification subscription's webhooks are signed with: derived from the
    /// signing key and the subscription's id, so no table holds it.
    pub(crate) fn notification_key(&self, subscription: uuid::Uuid) -> Vec<u8> {
        let derived = self.signer.derived_secret(&format!("notification-subscription:{subscription}"));
        hex::decode(derived).expect("a derived secret is hex")
    }

    pub(crate) fn volume_dir(&self, tenant_id: Uuid, name: &str) -> PathBuf {
        self.tenant_volumes_dir(tenant_id).join(name)
    }

    /// The folder holding every volume of a tenant on this machine.
    pub(crate) fn tenant_volumes_dir(&self, tenant_id: Uuid) -> PathBuf {
        self.volumes_dir.join(tenant_id.to_string())
    }
}

/// The MLflow token of replica `rank` (1 and up) of an attempt whose job token is `job_token`:
/// `<job token>.<rank>.<proof>`, the proof derived from the signing key, so that no replica can
/// claim another rank and no table holds it. Rank 0 logs with the job token itself
/// (docs/tracking.md, "Ranks").
fn replica_token(signer: &UrlSigner, job_token: &str, rank: u32) -> String {
    format!("{job_token}.{rank}.{}", replica_proof(signer, job_token, rank))
}

fn replica_proof(signer: &UrlSigner, job_token: &str, rank: u32) -> String {
    signer.derived_secret(&format!("mlflow-replica:{rank}:{job_token}"))
}

/// The job token and rank a replica token stands for; `None` when `token` is no replica token
/// (a job token), `Some(Err)` when its proof is not this key's for that rank.
fn replica_token_parts<'t>(signer: &UrlSigner, token: &'t str) -> Option<std::result::Result<(&'t str, u32), ()>> {
    let mut parts = token.rsplitn(3, '.');
    let (proof, rank, job_token) = (parts.next()?, parts.next()?, parts.next()?);
    let checked = rank
        .parse::<u32>()
        .ok()
        .filter(|r| *r > 0 && constant_time_eq(replica_proof(signer, job_token, *r).as_bytes(), proof.as_bytes()))
        .map(|r| (job_token, r))
        .ok_or(());
    Some(checked)
}

/// Whether `a` and `b` are equal, in a time that does not depend on where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
        StorageError::Mismatch { size, sha256 } => {
            Error::invalid("body", format!("{size} bytes with sha256 {sha256} arrived, not the content expected"))
        }
        other => Error::internal(other),
    }
}

/// The checked path of an artefact, or a 422 naming the parameter.
pub(crate) fn artifact_path(text: &str) -> Result<trainyard_storage::RelPath> {
    relative_path(text).map_err(|refused| Error::invalid("path", refused.to_string()))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::{UrlSigner, replica_token, replica_token_parts, signing_key};

    #[test]
    fn a_replica_token_proves_its_rank_and_no_other() {
        let signer = UrlSigner::new(b"k".repeat(32));
        let job_token = "tyj_00ff";
        let one = replica_token(&signer, job_token, 1);
        assert!(one.starts_with("tyj_00ff.1."), "{one}");
        assert_eq!(replica_token_parts(&signer, &one), Some(Ok((job_token, 1))));
        assert_eq!(replica_token_parts(&signer, job_token), None, "the job token itself is rank 0's");
        let two = replica_token(&signer, job_token, 2);
        assert_ne!(one, two);
        let (_, proof_of_one) = one.rsplit_once('.').unwrap();
        assert_eq!(replica_token_parts(&signer, &format!("{job_token}.2.{proof_of_one}")), Some(Err(())));
        assert_eq!(replica_token_parts(&signer, &format!("{job_token}.0.{proof_of_one}")), Some(Err(())));
        assert_eq!(replica_token_parts(&signer, &format!("tyj_0100.1.{proof_of_one}")), Some(Err(())));
        let other_key = UrlSigner::new(b"o".repeat(32));
        assert_eq!(replica_token_parts(&other_key, &one), Some(Err(())), "another server's key");
    }

    #[test]
    fn the_signing_key_is_made_private_kept_and_refused_when_others_may_read_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("signing.key");
        let made = signing_key(&path).unwrap();
        assert_eq!(made.len(), 64, "256 bits in hex");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(signing_key(&path).unwrap(), made, "the same key at the next start");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = signing_key(&path).unwrap_err().to_string();
        assert!(err.contains("every user of this machine"), "{err}");
        // A group-readable key is accepted (a Kubernetes Secret volume with fsGroup).
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(signing_key(&path).unwrap(), made);

        let short = dir.path().join("short.key");
        std::fs::write(&short, "too short").unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(signing_key(&short).unwrap_err().to_string().contains("at least 32"));
    }
}
