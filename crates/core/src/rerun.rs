//! What a rerun cannot pin (`yard rerun`, `POST /api/v1/jobs/{id}/rerun`).
//!
//! Trainyard keeps what a job ran by content: the template (by digest, kept after upgrades),
//! the parameters as given, registered dataset versions (immutable), the code archive (by
//! digest). It does not keep a file or folder on the machine that a `path` parameter names by
//! an absolute path (`user_module=/home/u/train.py`, `data=/scratch/packed`), nor what an image
//! tag points to. A rerun of such a job may run something else, so [`unpinned_inputs`] names
//! each such input with what the job's run record says it was, and the rerun refuses unless
//! the caller accepts them explicitly (`accept_unpinned`); an accepted rerun keeps the list
//! ([`RerunLink::unpinned`]) on the job and in its run record.
//!
//! One path is as pinned as a dataset parameter: the folder of a dataset version the tenant
//! registered, when the engine recorded reading exactly that version's content there (a
//! registered version is immutable, which is what a `name@version` parameter rests on too).
//! A `store:NAME@VERSION` value names a version kept on Trainyard's object store, by content:
//! pinned as well, and never described as a file or folder on the machine.
//!
//! Pure: the server gathers the facts. Nothing here (and nothing in the server) reads the files
//! to see whether they changed: that would let a tenant learn about files it cannot read.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::api::Dataset;
use crate::names::STORE_DATASET_PREFIX;
use crate::record::RunRecord;

/// An input a rerun cannot pin: it may not be what the job ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UnpinnedInput {
    /// Which input: `params.<name>` or `image`.
    pub input: String,
    /// What it is and what was recorded when the job ran, e.g. "/home/u/train.py is a file on
    /// the machine, not shipped with the job; it was sha256:... when the job ran and may have
    /// changed".
    pub message: String,
}

impl fmt::Display for UnpinnedInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.input, self.message)
    }
}

/// What a rerun keeps of its original, written with the new job (in the same statement, so
/// that its run record, written at launch, can say so).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RerunLink {
    /// The job it runs again.
    pub of: Uuid,
    /// The parameters it changed (`--set`); none for an exact rerun.
    pub overrides: Option<Value>,
    /// The inputs it could not pin and the caller accepted (`accept_unpinned`).
    pub unpinned: Vec<UnpinnedInput>,
    /// The image it runs by digest ([`pinned_image`]); none: the executor's configured image.
    pub image: Option<String>,
}

/// What a rerun would run with, besides the original job's own record.
#[derive(Debug, Clone, Copy)]
pub struct RerunInputs<'a> {
    /// The template's `path` parameters as the original ran them (defaults included), by name.
    pub path_params: &'a BTreeMap<String, String>,
    /// The parameters the rerun sets anew (`--set`): the caller's choice, not the original's
    /// input, so not reported.
    pub changed: &'a serde_json::Map<String, Value>,
    /// The image this server's replicas run now, as a run record names it: `local` for the
    /// local executor, the configured image on Kubernetes.
    pub image: &'a str,
    /// The tenant's registered dataset versions at any of those paths (by URI).
    pub registered: &'a [Dataset],
}

/// The image a record names for the local executor, which runs the machine's own programs.
const LOCAL_IMAGE: &str = "local";

/// The image a rerun on a cluster runs, by digest: the one the original's replicas reported
/// running (the pod's `imageID`, `repository@sha256:...`), or the image it named when that was a
/// digest already. None for a job of the local executor, one whose replicas reported no digest,
/// or one whose replicas ran different digests (a tag moved while it started): those cannot be
/// pinned, and [`unpinned_inputs`] names them.
pub fn pinned_image(record: &RunRecord) -> Option<String> {
    if record.image == LOCAL_IMAGE {
        return None;
    }
    if is_digest(&record.image) {
        return Some(record.image.clone());
    }
    match record.image_digests.as_slice() {
        [one] if is_digest(one) => Some(one.clone()),
        _ => None,
    }
}

/// `repository@sha256:<64 hex>`, or an image's own id `sha256:<64 hex>`: what containerd
/// reports for an image imported into the node rather than pulled (no repository digest), which
/// the node's runtime finds by that id.
fn is_digest(image: &str) -> bool {
    let hex64 = |hex: &str| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit());
    if let Some(id) = image.strip_prefix("sha256:") {
        return hex64(id);
    }
    image.split_once("@sha256:").is_some_and(|(repository, hex)| !repository.is_empty() && hex64(hex))
}

/// The inputs of a job that a rerun cannot pin, each named with what its latest run record
/// (`record`; none when no attempt began, or it began before Trainyard kept records) says it
/// was: the `path` parameters with an absolute value (but a registered dataset version's folder
/// that the engine read that version's content in), then the image when the rerun cannot run it
/// by digest ([`pinned_image`]: a tag no replica reported a digest for, different digests, or
/// another executor than the original's). Empty: the rerun runs exactly what the job ran.
pub fn unpinned_inputs(record: Option<&RunRecord>, rerun: &RerunInputs<'_>) -> Vec<UnpinnedInput> {
    let mut unpinned = Vec::new();
    for (name, path) in rerun.path_params {
        // A relative path lies in the job's working folder: the code archive or the template's
        // files, both kept by content; a `store:` dataset is a registered version on the object
        // store, immutable.
        if !path.starts_with('/')
            || is_store_dataset(path)
            || rerun.changed.contains_key(name)
            || registered_read(path, record, rerun)
        {
            continue;
        }
        unpinned.push(UnpinnedInput { input: format!("params.{name}"), message: path_message(path, record) });
    }
    if let Some(record) = record
        && let Some(message) = image_message(record, rerun.image)
    {
        unpinned.push(UnpinnedInput { input: "image".into(), message });
    }
    unpinned
}

/// Whether `path` is the folder of a registered dataset version whose content the engine
/// recorded reading there.
fn registered_read(path: &str, record: Option<&RunRecord>, rerun: &RerunInputs<'_>) -> bool {
    let Some(data) = record.and_then(|r| r.data.as_ref()) else { return false };
    if data.get("path").and_then(Value::as_str) != Some(path) {
        return false;
    }
    let Some(read) = data.get("content_hash").and_then(Value::as_str) else { return false };
    rerun.registered.iter().any(|d| d.uri == path && d.content_hash == read)
}

/// Whether a path parameter's value names a dataset version on Trainyard's object store
/// (`store:NAME@VERSION`) rather than a file or folder.
fn is_store_dataset(path: &str) -> bool {
    path.starts_with(STORE_DATASET_PREFIX)
}

/// A path parameter's sentence, with what the engine recorded of the file or folder there.
fn path_message(path: &str, record: Option<&RunRecord>) -> String {
    let recorded_hash =
        record.and_then(|r| r.data.as_ref()).filter(|data| data.get("path").and_then(Value::as_str) == Some(path));
    if is_store_dataset(path) {
        // Not a file on the machine: a registered version, kept by content on the store.
        let hash = recorded_hash.and_then(|data| data.get("content_hash")?.as_str());
        return match hash {
            Some(hash) => format!(
                "{path} is a dataset version on Trainyard's object store; its content hash was {hash} when the job ran"
            ),
            None => format!("{path} is a dataset version on Trainyard's object store"),
        };
    }
    let Some(record) = record else {
        return format!(
            "{path} is a path on the machine, not shipped with the job; no run record says what it held when the job ran, and it may have changed"
        );
    };
    // The engine's part says what it read at a path: pytorch-ddp's user module and its data.
    let recorded = |part: &Option<Value>, path_field: &str, hash_field: &str| -> Option<String> {
        let part = part.as_ref()?;
        if part.get(path_field)?.as_str()? != path {
            return None;
        }
        part.get(hash_field)?.as_str().map(str::to_string)
    };
    if let Some(hash) = recorded(&record.user_code, "module", "module_sha256") {
        return format!(
            "{path} is a file on the machine, not shipped with the job; it was {hash} when the job ran and may have changed"
        );
    }
    if let Some(hash) = recorded(&record.data, "path", "content_hash") {
        return format!(
            "{path} is a folder on the machine, not shipped with the job; its content hash was {hash} when the job ran and may have changed"
        );
    }
    format!(
        "{path} is a path on the machine, not shipped with the job; the run record does not say what it held, and it may have changed"
    )
}

/// The image's sentence when a rerun may run another image: this server runs another one, or
/// the one recorded is a tag (not `repo@sha256:...`), which may point elsewhere now.
fn image_message(record: &RunRecord, image_now: &str) -> Option<String> {
    // A cluster runs the original's image by digest, whatever its image is configured as now.
    if image_now != LOCAL_IMAGE && pinned_image(record).is_some() {
        return None;
    }
    let ran =
        if record.image_digests.is_empty() { String::new() } else { format!(" ({})", record.image_digests.join(", ")) };
    if record.image != image_now {
        let where_ = |image: &str| {
            if image == LOCAL_IMAGE {
                "on the local executor (the machine's own programs)".to_string()
            } else {
                format!("in image {image}")
            }
        };
        return Some(format!(
            "the job ran {}{ran}; this server runs replicas {}",
            where_(&record.image),
            where_(image_now)
        ));
    }
    if record.image == LOCAL_IMAGE || record.image.contains("@sha256:") {
        return None;
    }
    Some(if record.image_digests.is_empty() {
        format!(
            "{} is a tag, not a digest, and no digest was recorded for it (no replica reported one); the tag may point to another image now",
            record.image
        )
    } else {
        format!(
            "{} is a tag, not a digest; it was {} when the job ran and may point to another image now",
            record.image,
            record.image_digests.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::job::JobSpec;
    use crate::record::{EngineRecord, RecordEnvironment, ServerRecord};

    fn spec() -> JobSpec {
        JobSpec {
            command: vec!["python3".into()],
            args: Vec::new(),
            env: BTreeMap::new(),
            resources: Default::default(),
            replicas: 1,
            template: None,
            image: None,
            volumes: Vec::new(),
            code: None,
            time_limit_seconds: None,
            cache_wait_seconds: None,
            spare: false,
        }
    }

    /// A pytorch-ddp record: the engine read `/home/u/train.py` and the data in `/scratch/packed`.
    fn record(image: Option<&str>, image_digests: &[&str]) -> RunRecord {
        let executor = if image.is_some() { "kubernetes" } else { "local" };
        let server = ServerRecord::new(&spec(), &BTreeMap::new(), executor, image);
        let engine = EngineRecord {
            environment: RecordEnvironment { packages: BTreeMap::new(), python: None, platform: None },
            hardware: None,
            seeds: None,
            data: Some(json!({"path": "/scratch/packed", "content_hash": "sha256:da7a"})),
            user_code: Some(json!({"module": "/home/u/train.py", "module_sha256": "sha256:c0de"})),
            engine: None,
        };
        RunRecord::merge(server, image_digests.iter().map(|d| d.to_string()).collect(), Some(engine))
    }

    fn paths(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn unpinned(record: Option<&RunRecord>, path_params: &BTreeMap<String, String>, image: &str) -> Vec<String> {
        let changed = serde_json::Map::new();
        let rerun = RerunInputs { path_params, changed: &changed, image, registered: &[] };
        unpinned_inputs(record, &rerun).iter().map(ToString::to_string).collect()
    }

    fn registered(uri: &str, content_hash: &str) -> Dataset {
        Dataset {
            name: "digits".into(),
            version: "1".into(),
            uri: uri.into(),
            format: "trainyard-shards-v1".into(),
            size_bytes: None,
            samples: None,
            content_hash: content_hash.into(),
            source_job: None,
            store_prefix: None,
            created_by: "ada".into(),
            created_at: chrono::DateTime::UNIX_EPOCH,
            cached_on: Vec::new(),
        }
    }

    #[test]
    fn a_file_on_the_machine_is_named_with_the_hash_it_had() {
        let params = paths(&[("user_module", "/home/u/train.py"), ("output", "checkpoints")]);
        let found = unpinned(Some(&record(None, &[])), &params, "local");
        assert_eq!(
            found,
            [
                "params.user_module: /home/u/train.py is a file on the machine, not shipped with the job; it was sha256:c0de when the job ran and may have changed"
            ]
        );
    }

    #[test]
    fn a_data_folder_is_named_with_its_content_hash_and_an_unknown_path_says_so() {
        let params = paths(&[("data", "/scratch/packed"), ("output", "/scratch/ckpt")]);
        let found = unpinned(Some(&record(None, &[])), &params, "local");
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with("params.data: /scratch/packed is a folder") && found[0].contains("sha256:da7a"));
        assert!(found[1].starts_with("params.output: /scratch/ckpt") && found[1].contains("does not say what it held"));
        // Without a record (no attempt began), the paths are still named.
        let found = unpinned(None, &paths(&[("data", "/scratch/packed")]), "local");
        assert!(found[0].contains("no run record says what it held"), "{found:?}");
    }

    #[test]
    fn relative_paths_and_changed_parameters_are_pinned() {
        // Relative: in the job's working folder, from the code archive or the template.
        let found =
            unpinned(Some(&record(None, &[])), &paths(&[("user_module", "template/engine/example.py")]), "local");
        assert!(found.is_empty(), "{found:?}");
        // Set anew by the rerun: the caller's choice, shown as an override.
        let params = paths(&[("data", "/scratch/packed")]);
        let changed = json!({"data": "/scratch/other"}).as_object().unwrap().clone();
        let rerun = RerunInputs { path_params: &params, changed: &changed, image: "local", registered: &[] };
        assert!(unpinned_inputs(Some(&record(None, &[])), &rerun).is_empty());
    }

    #[test]
    fn a_store_dataset_is_pinned_and_never_called_a_folder_on_the_machine() {
        let mut ran = record(None, &[]);
        ran.data = Some(json!({"path": "store:digits@1", "content_hash": "sha256:da7a"}));
        assert!(unpinned(Some(&ran), &paths(&[("data", "store:digits@1")]), "local").is_empty());
        let message = path_message("store:digits@1", Some(&ran));
        assert!(!message.contains("on the machine") && !message.contains("folder"), "{message}");
        assert!(message.contains("object store") && message.contains("sha256:da7a"), "{message}");
        let message = path_message("store:digits@1", None);
        assert!(!message.contains("on the machine"), "{message}");
    }

    #[test]
    fn a_registered_datasets_folder_read_with_its_content_is_pinned() {
        let params = paths(&[("data", "/scratch/packed")]);
        let none = serde_json::Map::new();
        let check = |registered: &[Dataset], record: Option<&RunRecord>| {
            let rerun = RerunInputs { path_params: &params, changed: &none, image: "local", registered };
            unpinned_inputs(record, &rerun).len()
        };
        let ran = record(None, &[]);
        assert_eq!(check(&[registered("/scratch/packed", "sha256:da7a")], Some(&ran)), 0, "an immutable version");
        // Registered with other content than the engine read, elsewhere, or nothing recorded.
        assert_eq!(check(&[registered("/scratch/packed", "sha256:0bad")], Some(&ran)), 1);
        assert_eq!(check(&[registered("/scratch/other", "sha256:da7a")], Some(&ran)), 1);
        assert_eq!(check(&[registered("/scratch/packed", "sha256:da7a")], None), 1);
    }

    #[test]
    fn an_image_by_tag_is_pinned_to_the_digest_its_replicas_ran_and_unpinned_without_one() {
        let none = BTreeMap::new();
        let tag = "ghcr.io/x/trainer:1";
        let digest = format!("ghcr.io/x/trainer@sha256:{}", "ab".repeat(32));
        let other = format!("ghcr.io/x/trainer@sha256:{}", "cd".repeat(32));
        // No replica reported a digest: the tag is all there is.
        let found = unpinned(Some(&record(Some(tag), &[])), &none, tag);
        assert_eq!(found.len(), 1);
        assert!(found[0].starts_with("image: ghcr.io/x/trainer:1 is a tag") && found[0].contains("no digest"));
        assert_eq!(pinned_image(&record(Some(tag), &[])), None);
        // One digest: the rerun runs it, whatever the tag points to now.
        assert_eq!(pinned_image(&record(Some(tag), &[&digest])), Some(digest.clone()));
        assert!(unpinned(Some(&record(Some(tag), &[&digest])), &none, tag).is_empty());
        // Replicas that ran different digests (the tag moved while they started): none to pin.
        let split = record(Some(tag), &[&digest, &other]);
        assert_eq!(pinned_image(&split), None);
        let found = unpinned(Some(&split), &none, tag);
        assert!(found[0].contains(&format!("it was {digest}, {other} when the job ran")), "{found:?}");
        // Named by digest already.
        assert_eq!(pinned_image(&record(Some(&digest), &[&digest])), Some(digest.clone()));
        assert!(unpinned(Some(&record(Some(&digest), &[&digest])), &none, &digest).is_empty());
        // Not a digest: too short, or no repository.
        assert_eq!(pinned_image(&record(Some(tag), &["ghcr.io/x/trainer@sha256:abc"])), None);
        assert_eq!(pinned_image(&record(Some(tag), &[&format!("@sha256:{}", "ab".repeat(32))])), None);
        // An image imported into the node (containerd reports its id, no repository): pinned to
        // that id, which the node's runtime resolves.
        let id = format!("sha256:{}", "ef".repeat(32));
        assert_eq!(pinned_image(&record(Some(tag), &[&id])), Some(id.clone()));
        assert!(unpinned(Some(&record(Some(tag), &[&id])), &none, tag).is_empty());
        assert_eq!(pinned_image(&record(Some(tag), &["sha256:abc"])), None, "too short");
        // The local executor runs the machine's programs: its packages are in the record.
        assert!(unpinned(Some(&record(None, &[])), &none, "local").is_empty());
        assert_eq!(pinned_image(&record(None, &[])), None);
    }

    #[test]
    fn another_image_on_this_server_is_named_with_both_unless_the_original_digest_runs() {
        let none = BTreeMap::new();
        let old = format!("ghcr.io/x/trainer@sha256:{}", "ab".repeat(32));
        let new = format!("ghcr.io/x/trainer@sha256:{}", "cd".repeat(32));
        // The cluster now runs another image, but the rerun runs the original's by digest.
        assert!(unpinned(Some(&record(Some(&old), &[&old])), &none, &new).is_empty());
        // A tag with no digest recorded, and the server's image changed since.
        let found = unpinned(Some(&record(Some("ghcr.io/x/trainer:1"), &[])), &none, &new);
        assert_eq!(
            found,
            [format!("image: the job ran in image ghcr.io/x/trainer:1; this server runs replicas in image {new}")]
        );
        // Executors changed: from the local one to a cluster, and back.
        let found = unpinned(Some(&record(None, &[])), &none, "ghcr.io/x/trainer:1");
        assert!(found[0].contains("ran on the local executor"), "{found:?}");
        let found = unpinned(Some(&record(Some(&old), &[&old])), &none, "local");
        assert!(found[0].contains("this server runs replicas on the local executor"), "{found:?}");
    }
}
