//! Storage seen from the API: a job's artefacts (list, signed download links, streamed and
//! multipart uploads), volumes within the tenant's storage quota, and the storage policy. Every
//! operation takes the tenant from the caller, never from input.

use std::time::Duration;

use axum::body::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use trainyard_core::api::{
    Artifact, ArtifactLink, ArtifactUploaded, StoragePolicy, StorageReport, Volume, VolumeCreate,
};
use trainyard_core::auth::{Action, Caller};
use trainyard_core::error::ObjectKind;
use trainyard_core::{Error, Result};
use trainyard_storage::{Key, keys};
use trainyard_store::audit::Audit;
use trainyard_store::storage::NewVolume;
use uuid::Uuid;

use super::App;
use crate::storage::*;

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
    /// records its SHA-256. A failed upload leaves nothing behind. Runs to its end even when the
    /// request is cancelled (its client gone, the server draining): a stored object is never
    /// left without its record, nor a member's upload without its audit entry, which is written
    /// with the record in one transaction. (A client gone mid-body ends the body, and so the
    /// upload, with an error: nothing is stored.)
    pub async fn artifact_upload<S, E>(
        &self,
        uploader: Uploader,
        job_id: Uuid,
        path: &str,
        body: S,
    ) -> Result<ArtifactUploaded>
    where
        S: Stream<Item = std::result::Result<Bytes, E>> + Send + Unpin + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        let path = path.to_string();
        self.uncancelled(move |app| async move {
            match &uploader {
                // A member's upload is a change to audit; an engine's (with its job token) is
                // the job's own output, like its metrics.
                Uploader::User(caller) => {
                    let audit = Audit::by(caller, "artifact.upload", format!("job:{job_id}/artifact:{path}"));
                    let upload = app.artifact_upload_checked(&uploader, job_id, &path, body, Some(&audit));
                    app.audited(&audit, upload).await
                }
                Uploader::Job(_) => app.artifact_upload_checked(&uploader, job_id, &path, body, None).await,
            }
        })
        .await
    }

    async fn artifact_upload_checked<S, E>(
        &self,
        uploader: &Uploader,
        job_id: Uuid,
        path: &str,
        body: S,
        audit: Option<&Audit>,
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
        self.artifact_name_free(tenant_id, job_id, &path, &key).await?;
        let uploaded =
            self.storage.objects.upload(&key, body, self.storage.max_artifact_bytes).await.map_err(storage_error)?;
        self.store.artifact_record(tenant_id, job_id, path.as_str(), uploaded.size, &uploaded.sha256, audit).await?;
        Ok(ArtifactUploaded {
            path: path.to_string(),
            size_bytes: uploaded.size,
            sha256: uploaded.sha256,
            parts: uploaded.parts,
        })
    }

    /// A file and a folder cannot share a name (the local store is a file system; S3 would keep
    /// both and make every listing ambiguous): refuses a path beneath an artefact, or one that
    /// is a folder of artefacts, with 409, the same on every store.
    pub(super) async fn artifact_name_free(
        &self,
        tenant_id: Uuid,
        job_id: Uuid,
        path: &trainyard_storage::RelPath,
        key: &trainyard_storage::Key,
    ) -> Result<()> {
        let segments: Vec<&str> = path.segments().collect();
        for end in 1..segments.len() {
            let parent = artifact_path(&segments[..end].join("/"))?;
            let parent_key = keys::artifact_key(tenant_id, job_id, &parent);
            // An error here is no answer either way (s3s-fs answers a HEAD of a key that is a
            // folder in its file system with 500): the upload itself meets any real outage.
            if self.storage.objects.size_of(&parent_key).await.ok().flatten().is_some() {
                return Err(Error::Conflict(format!(
                    "{parent} is an artefact already, so nothing can be stored beneath it; choose another path"
                )));
            }
        }
        if self.storage.objects.has_objects_under(key).await.map_err(storage_error)? {
            return Err(Error::Conflict(format!("{path} is a folder of artefacts; choose another path")));
        }
        Ok(())
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
            Ok(None) => self.storage.signer().download_url(key.as_ref(), expires_at.timestamp()),
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
    ) -> Result<(u64, String, BoxStream<'static, std::result::Result<Bytes, std::io::Error>>)> {
        let signer = self.storage.signer();
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
        // The file's own name, as its uploader gave it (parts are stored percent-encoded).
        let name = key.parts().next_back().map(|p| keys::decoded(p.as_ref())).unwrap_or_else(|| "artifact".into());
        Ok((size, name, stream.map_err(std::io::Error::other).boxed()))
    }

    /// Creates a named volume (a directory under the data directory, or the executor's claim)
    /// within the tenant's storage quota. Storage that cannot be provisioned removes the record
    /// again, and a request cancelled half-way does not stop it: no record stands without its
    /// storage.
    pub async fn volume_create(&self, caller: &Caller, request: VolumeCreate) -> Result<Volume> {
        let caller = caller.clone();
        self.uncancelled(move |app| async move {
            let audit = Audit::by(&caller, "volume.create", format!("volume:{}", request.name));
            app.audited(&audit, app.volume_create_checked(&caller, request, &audit)).await
        })
        .await
    }

    async fn volume_create_checked(&self, caller: &Caller, request: VolumeCreate, audit: &Audit) -> Result<Volume> {
        caller.authorize(Action::WriteJobs)?;
        // None: the cluster's default class (the operator may name one, `--kube-storage-class`).
        let storage_class = request.storage_class.as_deref();
        // The name becomes a directory: check it before any path is built from it.
        trainyard_core::names::VolumeName::parse(&request.name).map_err(|message| Error::invalid("name", message))?;
        // Where jobs find it: the backend's mount path (a cluster's claim), or a directory here.
        let dir = self.storage.volume_dir(caller.tenant_id, &request.name);
        let path = self.executor.volume_path(&request.name).unwrap_or_else(|| dir.to_string_lossy().into_owned());
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
                audit,
            )
            .await?;
        let provisioned = match self.executor.provisions_volumes() {
            true => {
                let provision = trainyard_executor::VolumeRequest {
                    tenant_id: caller.tenant_id,
                    tenant: caller.tenant.clone(),
                    name: request.name.clone(),
                    size_bytes: request.size.bytes(),
                    access_mode: request.access_mode.as_str().to_string(),
                    storage_class: storage_class.map(str::to_string),
                };
                self.executor.volume_ensure(&provision).await.map_err(|err| err.to_string())
            }
            false => match tokio::fs::create_dir_all(&dir).await {
                Ok(()) => self
                    .executor
                    .volume_dir_prepare(caller.tenant_id, &dir)
                    .await
                    .map_err(|err| format!("preparing {}: {err}", dir.display())),
                Err(err) => Err(format!("creating {}: {err}", dir.display())),
            },
        };
        if let Err(cause) = provisioned {
            // Nothing half-made stays behind: the record goes with the failed provisioning.
            let undo = Audit::by(caller, "volume.delete", format!("volume:{}", request.name));
            self.store.volume_delete(caller.tenant_id, &request.name, &undo).await?;
            return Err(Error::internal(cause));
        }
        Ok(volume)
    }

    /// The tenant's volumes, each with why it cannot be used yet when the executor says so.
    pub async fn volumes_list(&self, caller: &Caller) -> Result<Vec<Volume>> {
        caller.authorize(Action::ReadJobs)?;
        let mut volumes = self.store.volumes_list(caller.tenant_id).await?;
        let reasons = futures::future::join_all(
            volumes.iter().map(|v| self.executor.volume_pending_reason(caller.tenant_id, &caller.tenant, &v.name)),
        )
        .await;
        for (volume, reason) in volumes.iter_mut().zip(reasons) {
            volume.pending_reason = reason;
        }
        Ok(volumes)
    }

    /// Deletes a volume and everything in it, to the end even when the request is cancelled
    /// after the record went (the storage would stay, counted against no quota).
    pub async fn volume_delete(&self, caller: &Caller, name: &str) -> Result<()> {
        let (caller, name) = (caller.clone(), name.to_string());
        self.uncancelled(move |app| async move { app.volume_delete_whole(&caller, &name).await }).await
    }

    async fn volume_delete_whole(&self, caller: &Caller, name: &str) -> Result<()> {
        let audit = Audit::by(caller, "volume.delete", format!("volume:{name}"));
        let volume = self
            .audited(&audit, async {
                caller.authorize(Action::WriteJobs)?;
                self.store.volume_delete(caller.tenant_id, name, &audit).await
            })
            .await?;
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
        let audit = Audit::by(caller, "storage.policy", format!("tenant:{tenant}"));
        self.audited(&audit, async {
            caller.require_platform_admin()?;
            self.store.storage_policy_set(tenant, policy, &audit).await
        })
        .await
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
