//! Where each object lives. Every key starts with its tenant's prefix, and the only part taken
//! from user input (an artefact's path) is a [`RelPath`], so no key can leave its prefix:
//!
//! ```text
//! tenants/<tenant_id>/jobs/<job_id>/logs/<attempt>/<replica>.log
//! tenants/<tenant_id>/jobs/<job_id>/artifacts/<path>   (also an MLflow run of its own's, by its id)
//! tenants/<tenant_id>/code/<sha256 hex>.tar
//! tenants/<tenant_id>/datasets/content/<content hash hex>/<file>
//! ```

use object_store::path::{Path, PathPart};
use uuid::Uuid;

use crate::paths::RelPath;

/// Everything a tenant owns.
pub fn tenant_prefix(tenant_id: Uuid) -> Path {
    Path::from_iter(["tenants".to_string(), tenant_id.to_string()])
}

/// Everything of one job.
pub fn job_prefix(tenant_id: Uuid, job_id: Uuid) -> Path {
    tenant_prefix(tenant_id).join("jobs").join(job_id.to_string())
}

/// A job's archived logs, every attempt.
pub fn logs_prefix(tenant_id: Uuid, job_id: Uuid) -> Path {
    job_prefix(tenant_id, job_id).join("logs")
}

/// One replica's log of one attempt.
pub fn log_key(tenant_id: Uuid, job_id: Uuid, attempt: i32, replica: u32) -> Path {
    logs_prefix(tenant_id, job_id).join(attempt.to_string()).join(format!("{replica}.log"))
}

/// A code archive of the tenant, by the hex of its SHA-256 (content-addressed: one per content).
pub fn code_key(tenant_id: Uuid, sha256_hex: &str) -> Path {
    tenant_prefix(tenant_id).join("code").join(format!("{sha256_hex}.tar"))
}

/// The files of a pushed dataset (`yard datasets push`), by the hex of its manifest's content
/// hash: one copy per content and tenant, whatever name and version it is registered under.
/// The caller checks `content_hex` (64 hex digits) first.
pub fn dataset_content_prefix(tenant_id: Uuid, content_hex: &str) -> Path {
    tenant_prefix(tenant_id).join("datasets").join("content").join(content_hex)
}

/// Where an upload to the tenant's pushed content waits before it is copied into place (an
/// index: see the server's `dataset_file_upload`).
pub fn dataset_incoming_key(tenant_id: Uuid, upload: Uuid) -> Path {
    tenant_prefix(tenant_id).join("datasets").join("incoming").join(upload.to_string())
}

/// One file of a pushed dataset: its manifest (`dataset.json`), a shard or an index. `file` is
/// a plain file name the manifest gives, checked by the caller (one [`RelPath`] segment).
pub fn dataset_file_key(prefix: &Path, file: &str) -> Path {
    prefix.clone().join(PathPart::from(file))
}

/// A job's artefacts.
pub fn artifacts_prefix(tenant_id: Uuid, job_id: Uuid) -> Path {
    job_prefix(tenant_id, job_id).join("artifacts")
}

/// One artefact of a job.
pub fn artifact_key(tenant_id: Uuid, job_id: Uuid, path: &RelPath) -> Path {
    let mut key = artifacts_prefix(tenant_id, job_id);
    for segment in path.segments() {
        key = key.join(PathPart::from(segment));
    }
    key
}

/// The artefact path of `key` relative to its job's artefacts prefix, if it is under it.
pub fn artifact_path_of(tenant_id: Uuid, job_id: Uuid, key: &Path) -> Option<String> {
    // Parts are stored percent-encoded where a character is not allowed in a key; user paths
    // never hold escapes of their own (see `relative_path`), so decoding is unambiguous.
    let parts: Vec<String> =
        key.prefix_match(&artifacts_prefix(tenant_id, job_id))?.map(|p| decoded(p.as_ref())).collect();
    if parts.is_empty() { None } else { Some(parts.join("/")) }
}

/// A key part as the user wrote it (parts are stored percent-encoded where a character is not
/// allowed in a key).
pub fn decoded(part: &str) -> String {
    percent_encoding::percent_decode_str(part).decode_utf8_lossy().into_owned()
}

/// The tenant a key belongs to, when it is under `tenants/<id>/`.
pub fn tenant_of(key: &Path) -> Option<Uuid> {
    let mut parts = key.parts();
    if parts.next()?.as_ref() != "tenants" {
        return None;
    }
    Uuid::parse_str(parts.next()?.as_ref()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::relative_path;
    use proptest::prelude::*;

    #[test]
    fn layout_is_as_documented() {
        let (t, j) = (Uuid::nil(), Uuid::from_u128(1));
        assert_eq!(log_key(t, j, 2, 0).as_ref(), format!("tenants/{t}/jobs/{j}/logs/2/0.log"));
        let path = relative_path("ckpt/model.pt").unwrap();
        let key = artifact_key(t, j, &path);
        assert_eq!(key.as_ref(), format!("tenants/{t}/jobs/{j}/artifacts/ckpt/model.pt"));
        assert_eq!(artifact_path_of(t, j, &key).as_deref(), Some("ckpt/model.pt"));
        assert_eq!(tenant_of(&key), Some(t));
        let hex = "ab".repeat(32);
        let prefix = dataset_content_prefix(t, &hex);
        assert_eq!(prefix.as_ref(), format!("tenants/{t}/datasets/content/{hex}"));
        assert_eq!(dataset_file_key(&prefix, "data-000000.tar").as_ref(), format!("{prefix}/data-000000.tar"));
        assert_eq!(tenant_of(&prefix), Some(t));
    }

    #[test]
    fn keys_survive_a_trip_through_text() {
        // A signed URL carries the key as text; parsing it must give the very same key.
        let (t, j) = (Uuid::nil(), Uuid::from_u128(1));
        for text in ["100%", "a#b/c d.txt", "x[1]{2}^~`|<>\"", "ünï/名前"] {
            let key = artifact_key(t, j, &relative_path(text).unwrap());
            assert_eq!(Path::parse(key.as_ref()).unwrap(), key, "{text}");
            assert_eq!(artifact_path_of(t, j, &key).as_deref(), Some(text));
        }
    }

    proptest! {
        /// Whatever path is accepted, its key stays under the job's artefacts prefix and reads
        /// back as the same path.
        #[test]
        fn artifact_keys_stay_under_their_prefix(text in "([a-z./\\\\%]|%2[eEfF]|\\.\\.|/){1,16}", tenant in any::<u128>(), job in any::<u128>()) {
            let (t, j) = (Uuid::from_u128(tenant), Uuid::from_u128(job));
            if let Ok(path) = relative_path(&text) {
                let key = artifact_key(t, j, &path);
                prop_assert!(key.prefix_matches(&artifacts_prefix(t, j)));
                prop_assert_eq!(tenant_of(&key), Some(t));
                prop_assert_eq!(artifact_path_of(t, j, &key), Some(path.to_string()));
            }
        }
    }
}
