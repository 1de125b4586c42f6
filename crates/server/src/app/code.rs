//! Code shipped with jobs (`yard submit` packs the folder it runs in): a tar archive uploaded by
//! its content digest, checked as it arrives and kept in the tenant's storage under that digest.
//! Reading and unpacking an archive (the upload's check, and each launch) is `crate::code`'s,
//! below the control loop that launches.

use axum::body::Bytes;
use sha2::{Digest, Sha256};
use trainyard_core::api::CodeUploaded;
use trainyard_core::auth::{Action, Caller};
use trainyard_core::job::is_sha256_digest;
use trainyard_core::{Error, Result};
use trainyard_storage::keys;
use uuid::Uuid;

use super::App;
use crate::code::unpack;
use crate::storage::storage_error;

impl App {
    /// Stores an archive under its digest, after checking that the bytes have that digest and
    /// that every entry is a plain file or folder at a relative path. Uploading the same archive
    /// again stores nothing and answers the same.
    pub async fn code_upload(&self, caller: &Caller, digest: &str, body: Bytes) -> Result<CodeUploaded> {
        let audit = trainyard_store::audit::Audit::by(caller, "code.upload", format!("code:{digest}"));
        let uploaded = self.audited(&audit, self.code_upload_checked(caller, digest, body)).await?;
        // The archive lives in the object store, outside any transaction: recorded once stored.
        if uploaded.created {
            self.store.audit_done(&audit).await?;
        }
        Ok(uploaded)
    }

    async fn code_upload_checked(&self, caller: &Caller, digest: &str, body: Bytes) -> Result<CodeUploaded> {
        caller.authorize(Action::WriteJobs)?;
        if !is_sha256_digest(digest) {
            return Err(Error::invalid("digest", "must be sha256: and the 64 hex digits of the archive's SHA-256"));
        }
        let actual = format!("sha256:{}", hex::encode(Sha256::digest(&body)));
        if actual != digest {
            return Err(Error::invalid(
                "digest",
                format!("the archive's SHA-256 is {actual}, not the digest in the path; was it changed on the way?"),
            ));
        }
        let files = unpack(&body).map_err(|why| Error::invalid("archive", why))?.len();
        let key = keys::code_key(caller.tenant_id, &digest["sha256:".len()..]);
        let size_bytes = body.len() as u64;
        let stored = self.storage.objects.size_of(&key).await.map_err(storage_error)?;
        let created = stored.is_none();
        if created {
            let chunk = futures::stream::iter([Ok::<Bytes, std::io::Error>(body)]);
            self.storage.objects.upload(&key, chunk, size_bytes).await.map_err(storage_error)?;
        }
        Ok(CodeUploaded { digest: digest.to_string(), size_bytes, files, created })
    }

    /// The size of an uploaded archive of the tenant, or a 422 naming `code` when there is none.
    pub(crate) async fn code_size(&self, tenant_id: Uuid, digest: &str) -> Result<u64> {
        let key = keys::code_key(tenant_id, digest.trim_start_matches("sha256:"));
        self.storage.objects.size_of(&key).await.map_err(storage_error)?.ok_or_else(|| {
            Error::invalid(
                "code",
                format!("no archive {digest} was uploaded to this tenant (PUT /api/v1/code/{digest})"),
            )
        })
    }
}
