//! Checkpoints as outputs: the ones a job wrote, listed and read from its checkpoint volume, and
//! a template's `checkpoint` parameter (`init_from=JOB[:STEP]`) resolved to one of them.
//!
//! Where a job writes them is its template's layout, pytorch-ddp's
//! (`templates/pytorch-ddp/engine/checkpoints.py:checkpoint_dir`): `ckpt-<step>.pt` files in
//! `<checkpoint_volume>/jobs/<checkpoint_key or job id>/<output>`, from the parameters the job
//! ran with. The files are the truth (the engine prunes old ones; its `checkpoint_step` metric
//! says only what was written). The folder is the tenant's to write, and the server reads it as
//! root: only through handles that follow no link (`trainyard_executor::local::tenant_fs`), so a
//! link planted in the folder, or in place of any folder on the way, is never followed.

use std::path::{Component, PathBuf};

use chrono::{DateTime, Utc};
use trainyard_core::api::{Checkpoint, CheckpointSource, Job, JobCheckpoints};
use trainyard_core::auth::{Action, Caller};
use trainyard_core::error::ObjectKind;
use trainyard_core::job::VolumeMount;
use trainyard_core::{Error, Result};
use trainyard_executor::local::tenant_fs;
use trainyard_store::jobs::JobFilter;
use trainyard_templates::CheckpointRef;
use uuid::Uuid;

use super::App;

/// The parameters of pytorch-ddp's layout: the volume, the folder in the job's part of it, and
/// the key naming that part instead of the job's id.
const VOLUME_PARAM: &str = "checkpoint_volume";
const OUTPUT_PARAM: &str = "output";
const KEY_PARAM: &str = "checkpoint_key";

/// Where a job's checkpoints are: the volume, and the folder inside it.
#[derive(Debug, Clone, PartialEq)]
struct CheckpointFolder {
    volume: String,
    /// `jobs/<key or job id>/<output>`, plain segments only.
    inside: PathBuf,
}

/// Where a job's checkpoints are, or why the server cannot say.
#[derive(Debug, Clone, PartialEq)]
enum Located {
    /// Not a template that writes checkpoints (no checkpoint volume parameter): none.
    Nowhere,
    /// Written where the server does not read (a working folder, an absolute path).
    Unlisted(String),
    In(CheckpointFolder),
}

/// A checkpoint file opened for reading, with what the listing says of it.
pub struct OpenCheckpoint {
    pub checkpoint: Checkpoint,
    pub file: std::fs::File,
}

/// `ckpt-<step>.pt` (the step zero-padded, but parsed: nothing relies on the string order).
pub fn checkpoint_step(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("ckpt-")?.strip_suffix(".pt")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The folder pytorch-ddp's engine writes a job's checkpoints to, from the values its parameters
/// had (defaults filled): `checkpoints.py:checkpoint_dir`.
fn located(values: &std::collections::BTreeMap<String, serde_json::Value>, job_id: Uuid) -> Located {
    let text = |name: &str| values.get(name).and_then(|v| v.as_str()).unwrap_or_default().to_string();
    if !values.contains_key(VOLUME_PARAM) {
        return Located::Nowhere;
    }
    let (volume, output, key) = (text(VOLUME_PARAM), text(OUTPUT_PARAM), text(KEY_PARAM));
    if volume.is_empty() {
        return Located::Unlisted(format!(
            "this job kept its checkpoints in replica 0's working folder ({VOLUME_PARAM} was empty), which the server does not list"
        ));
    }
    if output.starts_with('/') {
        return Located::Unlisted(format!(
            "this job wrote its checkpoints to {output}, outside its checkpoint volume; the server lists a volume only"
        ));
    }
    let mut inside = PathBuf::from("jobs");
    inside.push(if key.is_empty() { job_id.to_string() } else { key });
    for component in std::path::Path::new(&output).components() {
        match component {
            Component::Normal(part) => inside.push(part),
            Component::CurDir => {}
            // A path parameter has no `..` (checked at submit); anything else is not listed.
            _ => return Located::Unlisted(format!("{OUTPUT_PARAM} {output:?} is not a folder inside the volume")),
        }
    }
    Located::In(CheckpointFolder { volume, inside })
}

/// The checkpoints in `folder` under `volume_dir` (the server's folder of the volume), oldest
/// step first, each with its path as the job sees it (`seen_at`: the volume's path in replicas).
/// No folder yet is none; a link anywhere on the way is an error, never followed.
fn checkpoints_in(volume_dir: &std::path::Path, folder: &std::path::Path, seen_at: &str) -> Result<Vec<Checkpoint>> {
    let Some(dir) = folder_open(volume_dir, folder)? else { return Ok(Vec::new()) };
    let files = tenant_fs::files_in(&dir, |name| checkpoint_step(name).is_some()).map_err(Error::internal)?;
    let mut checkpoints: Vec<Checkpoint> = files
        .into_iter()
        .filter_map(|file| {
            Some(Checkpoint {
                step: checkpoint_step(&file.name)?,
                size_bytes: file.size_bytes,
                saved_at: DateTime::<Utc>::from(file.modified),
                path: format!("{}/{}/{}", seen_at.trim_end_matches('/'), folder.display(), file.name),
            })
        })
        .collect();
    checkpoints.sort_by_key(|c| c.step);
    Ok(checkpoints)
}

/// The checkpoint folder opened beneath the volume's folder, one name at a time and following no
/// link; `None` when it does not exist (yet). A link in place of a folder is refused as a 409:
/// the tenant's jobs made the folder so, and the server will not go through it.
fn folder_open(volume_dir: &std::path::Path, folder: &std::path::Path) -> Result<Option<cap_std::fs::Dir>> {
    let root = match tenant_fs::open_own_dir(volume_dir) {
        Ok(root) => root,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(refused_folder(err)),
    };
    match tenant_fs::open_dir_beneath(&root, folder, false) {
        Ok(dir) => Ok(Some(dir)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(refused_folder(err)),
    }
}

/// The checkpoint of `step` in `folder` opened to read, with what the listing says of it (its
/// size as opened); a 404 when there is none, or it was pruned between the listing and the open.
fn checkpoint_file(
    volume_dir: &std::path::Path,
    folder: &std::path::Path,
    seen_at: &str,
    step: u64,
) -> Result<OpenCheckpoint> {
    let listed = checkpoints_in(volume_dir, folder, seen_at)?;
    let checkpoint =
        listed.into_iter().find(|c| c.step == step).ok_or_else(|| Error::not_found(ObjectKind::Checkpoint))?;
    let dir = folder_open(volume_dir, folder)?.ok_or_else(|| Error::not_found(ObjectKind::Checkpoint))?;
    let name = checkpoint.path.rsplit('/').next().unwrap_or_default().to_string();
    let file = match tenant_fs::open_plain_file(&dir, &name) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Err(Error::not_found(ObjectKind::Checkpoint)),
        Err(err) => return Err(refused_folder(err)),
    };
    let size_bytes = file.metadata().map_err(Error::internal)?.len();
    Ok(OpenCheckpoint { checkpoint: Checkpoint { size_bytes, ..checkpoint }, file })
}

fn refused_folder(err: std::io::Error) -> Error {
    // ELOOP / ENOTDIR: a link or a file where a folder should be.
    if matches!(err.raw_os_error(), Some(code) if code == nix::errno::Errno::ELOOP as i32 || code == nix::errno::Errno::ENOTDIR as i32)
    {
        Error::Conflict(
            "the checkpoint folder (or a folder on its way) is a link or a file, which the server does not follow"
                .into(),
        )
    } else {
        Error::internal(err)
    }
}

impl App {
    /// The checkpoints a job of the caller's tenant wrote (another tenant's job is a 404).
    pub async fn job_checkpoints(&self, caller: &Caller, job_id: Uuid) -> Result<JobCheckpoints> {
        caller.authorize(Action::ReadJobs)?;
        let job = self.store.job_get(caller.tenant_id, job_id).await?;
        self.checkpoints_of(caller, &job).await
    }

    /// One checkpoint of a job, opened to stream it: a 404 when the job wrote none at `step` (or
    /// it was pruned since).
    pub async fn checkpoint_open(&self, caller: &Caller, job_id: Uuid, step: u64) -> Result<OpenCheckpoint> {
        caller.authorize(Action::ReadJobs)?;
        let job = self.store.job_get(caller.tenant_id, job_id).await?;
        let Located::In(folder) = self.located_of(caller, &job).await? else {
            return Err(Error::not_found(ObjectKind::Checkpoint));
        };
        if self.executor.provisions_volumes() {
            return Err(Error::Conflict(kubernetes_note()));
        }
        let volume_dir = self.storage.volume_dir(caller.tenant_id, &folder.volume);
        let seen_at = self.volume_path(caller.tenant_id, &folder.volume).await?;
        // Folder reads block: off the request's thread.
        tokio::task::spawn_blocking(move || checkpoint_file(&volume_dir, &folder.inside, &seen_at, step))
            .await
            .map_err(Error::internal)?
    }

    async fn checkpoints_of(&self, caller: &Caller, job: &Job) -> Result<JobCheckpoints> {
        let folder = match self.located_of(caller, job).await? {
            Located::Nowhere => return Ok(JobCheckpoints { folder: None, checkpoints: Vec::new(), note: None }),
            Located::Unlisted(note) => {
                return Ok(JobCheckpoints { folder: None, checkpoints: Vec::new(), note: Some(note) });
            }
            Located::In(folder) => folder,
        };
        // The path the job was given for the volume (`/volumes/<name>`, or the server's folder
        // where replicas have no mount namespace).
        let seen_at = match self.volume_path(caller.tenant_id, &folder.volume).await {
            Ok(path) => path,
            Err(Error::NotFound { .. }) => {
                let note = format!("the checkpoint volume {} was deleted", folder.volume);
                return Ok(JobCheckpoints { folder: None, checkpoints: Vec::new(), note: Some(note) });
            }
            Err(other) => return Err(other),
        };
        let shown = format!("{}/{}", seen_at.trim_end_matches('/'), folder.inside.display());
        if self.executor.provisions_volumes() {
            return Ok(JobCheckpoints { folder: Some(shown), checkpoints: Vec::new(), note: Some(kubernetes_note()) });
        }
        let volume_dir = self.storage.volume_dir(caller.tenant_id, &folder.volume);
        let checkpoints = tokio::task::spawn_blocking(move || checkpoints_in(&volume_dir, &folder.inside, &seen_at))
            .await
            .map_err(Error::internal)??;
        Ok(JobCheckpoints { folder: Some(shown), checkpoints, note: None })
    }

    /// Where a job's checkpoints are, from its template's parameters as it ran them.
    async fn located_of(&self, caller: &Caller, job: &Job) -> Result<Located> {
        let Some(template) = self.template_of(caller, job).await? else { return Ok(Located::Nowhere) };
        let given = job.params.as_ref().and_then(|p| p.as_object()).cloned().unwrap_or_default();
        // A job's parameters passed these checks when it was submitted, with this template.
        let Ok(values) = template.check_params(&given) else { return Ok(Located::Nowhere) };
        Ok(located(&values, job.id))
    }

    /// A `checkpoint` parameter's value, `JOB[:STEP]`, resolved among the caller's tenant's jobs
    /// to one checkpoint (the newest without a step): where the new run finds it, the volume it
    /// must mount for that, and what its record keeps. Every refusal is a 422 on `field`; another
    /// tenant's job is refused as an unknown one.
    pub(crate) async fn checkpoint_resolve(
        &self,
        caller: &Caller,
        field: &str,
        text: &str,
    ) -> Result<(String, VolumeMount, CheckpointSource)> {
        let reference = CheckpointRef::parse(text).map_err(|message| Error::invalid(field, message))?;
        let job = self.job_by_reference(caller, field, &reference.job).await?;
        let short = &job.id.to_string()[..8];
        let listed = self.checkpoints_of(caller, &job).await.map_err(|err| match err {
            // A folder the server will not go through is the parameter's problem here.
            Error::Conflict(message) => Error::invalid(field, format!("job {short} ({}): {message}", job.name)),
            other => other,
        })?;
        if let Some(note) = listed.note.filter(|_| listed.checkpoints.is_empty()) {
            return Err(Error::invalid(field, format!("job {short} ({}): {note}", job.name)));
        }
        let steps = || listed.checkpoints.iter().map(|c| c.step.to_string()).collect::<Vec<_>>().join(", ");
        let chosen = match reference.step {
            Some(step) => listed.checkpoints.iter().find(|c| c.step == step).ok_or_else(|| {
                Error::invalid(
                    field,
                    if listed.checkpoints.is_empty() {
                        format!("job {short} ({}) has no checkpoint yet", job.name)
                    } else {
                        format!("job {short} ({}) has no checkpoint at step {step}; it has steps {}", job.name, steps())
                    },
                )
            })?,
            None => listed
                .checkpoints
                .last()
                .ok_or_else(|| Error::invalid(field, format!("job {short} ({}) has no checkpoint yet", job.name)))?,
        };
        let Located::In(folder) = self.located_of(caller, &job).await? else {
            return Err(Error::invalid(field, format!("job {short} ({}) writes no checkpoints", job.name)));
        };
        let volume_path = self.volume_path(caller.tenant_id, &folder.volume).await?;
        Ok((
            chosen.path.clone(),
            VolumeMount { name: folder.volume, path: volume_path },
            CheckpointSource { job_id: job.id, step: chosen.step },
        ))
    }

    /// The tenant's job a reference names, as the CLI's arguments do: a whole id, a short id (its
    /// first hex digits, at least 6), or a name (the newest job of that name).
    async fn job_by_reference(&self, caller: &Caller, field: &str, text: &str) -> Result<Job> {
        let unknown =
            || Error::invalid(field, format!("no job of your tenant is named {text} or has an id starting so"));
        if let Ok(id) = Uuid::parse_str(text) {
            return self.store.job_get(caller.tenant_id, id).await.map_err(|err| match err {
                Error::NotFound { .. } => unknown(),
                other => other,
            });
        }
        if let Some(range) = trainyard_core::names::job_id_range(text) {
            let filter = JobFilter { id_range: Some(range), limit: 2, ..JobFilter::default() };
            let page = self.store.jobs_list(caller.tenant_id, &filter).await?;
            match page.items.as_slice() {
                [job] => return Ok(job.clone()),
                [] => {}
                _ => return Err(Error::invalid(field, format!("{text} names more than one job; give more of the id"))),
            }
        }
        let filter = JobFilter { name: Some(text.to_string()), limit: 1, ..JobFilter::default() };
        let page = self.store.jobs_list(caller.tenant_id, &filter).await?;
        page.items.into_iter().next().ok_or_else(unknown)
    }
}

fn kubernetes_note() -> String {
    "on Kubernetes the checkpoint volume is a claim the server does not mount: read it from a job that mounts it"
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn values(pairs: serde_json::Value) -> std::collections::BTreeMap<String, serde_json::Value> {
        pairs.as_object().unwrap().clone().into_iter().collect()
    }

    #[test]
    fn a_checkpoint_file_name_holds_its_step() {
        assert_eq!(checkpoint_step("ckpt-00000040.pt"), Some(40));
        assert_eq!(checkpoint_step("ckpt-123456789.pt"), Some(123_456_789));
        for other in ["latest.json", "ckpt-00000040.pt.partial", "ckpt-.pt", "ckpt--1.pt", "ckpt-4a.pt", "x.pt"] {
            assert_eq!(checkpoint_step(other), None, "{other}");
        }
    }

    #[test]
    fn the_folder_follows_the_engines_layout() {
        let job = Uuid::nil();
        let at = |v| located(&values(v), job);
        assert_eq!(
            at(json!({"checkpoint_volume": "checkpoints", "output": "checkpoints", "checkpoint_key": ""})),
            Located::In(CheckpointFolder {
                volume: "checkpoints".into(),
                inside: PathBuf::from(format!("jobs/{job}/checkpoints")),
            })
        );
        assert_eq!(
            at(json!({"checkpoint_volume": "ckpt", "output": "./out/a", "checkpoint_key": "trial-3"})),
            Located::In(CheckpointFolder { volume: "ckpt".into(), inside: PathBuf::from("jobs/trial-3/out/a") })
        );
        assert!(matches!(at(json!({"checkpoint_volume": "", "output": "checkpoints"})), Located::Unlisted(_)));
        assert!(matches!(at(json!({"checkpoint_volume": "c", "output": "/abs"})), Located::Unlisted(_)));
        assert_eq!(at(json!({"data": "/d"})), Located::Nowhere);
    }

    #[test]
    fn a_link_planted_in_the_checkpoint_folder_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret.pt"), "another tenant's weights").unwrap();
        let volume = dir.path().join("volume");
        let folder = PathBuf::from("jobs/j/checkpoints");
        std::fs::create_dir_all(volume.join(&folder)).unwrap();
        std::fs::write(volume.join(&folder).join("ckpt-00000020.pt"), "weights at 20").unwrap();
        std::fs::write(volume.join(&folder).join("latest.json"), "{}").unwrap();
        std::os::unix::fs::symlink(outside.join("secret.pt"), volume.join(&folder).join("ckpt-00000099.pt")).unwrap();

        let listed = checkpoints_in(&volume, &folder, "/volumes/checkpoints").unwrap();
        assert_eq!(listed.len(), 1, "the link is not listed: {listed:?}");
        assert_eq!(listed[0].step, 20);
        assert_eq!(listed[0].size_bytes, "weights at 20".len() as u64);
        assert_eq!(listed[0].path, "/volumes/checkpoints/jobs/j/checkpoints/ckpt-00000020.pt");
        let dir_handle = folder_open(&volume, &folder).unwrap().unwrap();
        assert!(tenant_fs::open_plain_file(&dir_handle, "ckpt-00000099.pt").is_err());

        // A folder on the way swapped for a link to another folder full of checkpoints.
        std::fs::create_dir_all(outside.join("checkpoints")).unwrap();
        std::fs::write(outside.join("checkpoints/ckpt-00000001.pt"), "theirs").unwrap();
        std::fs::remove_dir_all(volume.join("jobs/j")).unwrap();
        std::os::unix::fs::symlink(&outside, volume.join("jobs/j")).unwrap();
        assert!(matches!(checkpoints_in(&volume, &folder, "/v"), Err(Error::Conflict(_))));
    }
}
