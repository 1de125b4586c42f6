//! Jobs: what a user submits ([`JobSubmission`]), what Trainyard keeps after checking it
//! ([`JobSpec`]), and the state machine every job follows ([`JobState`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::Error;
use crate::resources::{MAX_GPUS_PER_REPLICA, Resources};

pub const MAX_NAME_LEN: usize = 128;
pub const MAX_REPLICAS: u32 = 1024;
pub const MAX_ARGV_ITEMS: usize = 4096;
pub const MAX_ARGV_BYTES: usize = 256 * 1024;
pub const MAX_ENV_VARS: usize = 256;
pub const MAX_ENV_BYTES: usize = 256 * 1024;
pub const MAX_RESTARTS: u32 = 100;
pub const PRIORITY_RANGE: std::ops::RangeInclusive<i32> = -1000..=1000;
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 128;

/// Environment variables Trainyard sets on every replica; a job may not override them.
pub const RESERVED_ENV: [&str; 7] =
    ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"];
pub const RESERVED_ENV_PREFIX: &str = "TRAINYARD_";
/// Where a job from a template finds the template's files, relative to each replica's working
/// directory.
pub const TEMPLATE_FILES_DIR: &str = "template";

/// The longest time limit a job may ask for: 30 days.
pub const MAX_TIME_LIMIT_SECONDS: u32 = 30 * 86_400;
/// The longest a job may wait for room on a node that caches its data (`cache_wait_seconds`).
pub const MAX_CACHE_WAIT_SECONDS: u32 = 3600;

/// A job as submitted. Unknown fields are rejected so that a typo never goes unnoticed.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobSubmission {
    /// A name for people; defaults to the program's file name. Letters, digits, `.`, `_`, `-`.
    #[serde(default)]
    pub name: Option<String>,
    /// The program and its leading arguments, as an argv array. Never run through a shell.
    #[schema(min_items = 1, max_items = 4096)]
    pub command: Vec<String>,
    /// More arguments, appended to `command`.
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment variables for every replica.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// What each replica needs.
    #[serde(default)]
    pub resources: Resources,
    /// How many replicas run together (all-or-nothing). Default 1.
    #[serde(default = "one")]
    #[schema(minimum = 1, maximum = 1024)]
    pub replicas: u32,
    /// Higher runs first within a tenant. Default 0, range -1000..=1000.
    #[serde(default)]
    #[schema(minimum = -1000, maximum = 1000)]
    pub priority: i32,
    /// How many times a failed attempt is relaunched before the job fails. Default 0.
    #[serde(default)]
    #[schema(maximum = 100)]
    pub max_restarts: u32,
    /// A retried submit with the same key returns the first job instead of creating another.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Code to run with: the digest (`sha256:<hex>`) of a tar archive uploaded to the tenant
    /// with `PUT /api/v1/code/{digest}`, unpacked as every replica's working directory.
    #[serde(default)]
    pub code: Option<String>,
    /// Stop the job when an attempt has run this many seconds, without restarting it (Slurm's
    /// `--time`); also what start estimates assume it takes. 1 to 30 days' worth.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 2592000)]
    pub time_limit_seconds: Option<u32>,
    /// Wait up to this many seconds after submission for room on a node whose shard cache
    /// holds the job's datasets, before taking any node. Absent or 0: never wait (such nodes
    /// are still preferred when they have room). At most an hour.
    #[serde(default)]
    #[schema(maximum = 3600)]
    pub cache_wait_seconds: Option<u32>,
    /// Run on spare room only: GPUs no job within its tenant's quota is waiting for. The job
    /// counts in no quota, is placed after every other job, and is the first stopped (and
    /// requeued, to resume from its checkpoint) when a job within its quota needs the room.
    #[serde(default)]
    pub spare: bool,
    /// Start only after each of these jobs succeeded (Slurm's `afterok`); cancelled, with the
    /// reason, once one of them fails or is cancelled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_ok: Vec<Uuid>,
    /// Start only after each of these jobs ended, however (Slurm's `afterany`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_any: Vec<Uuid>,
    /// Start only after each of these jobs failed (Slurm's `afternotok`); cancelled once one of
    /// them succeeds or is cancelled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_failed: Vec<Uuid>,
    /// A job array, `FIRST-LAST[%MAX]` (Slurm's `--array=0-99%8`): one job per index, each with
    /// its index in `TRAINYARD_ARRAY_INDEX`, at most `MAX` of them admitted at once. The answer
    /// is the first job (an idempotency key is its own; a replay answers it again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<String>,
}

/// What a chained job waits for of one of its dependencies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterKind {
    Ok,
    Any,
    Failed,
}

impl AfterKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AfterKind::Ok => "ok",
            AfterKind::Any => "any",
            AfterKind::Failed => "failed",
        }
    }
}

/// A job array's indexes and how many may be admitted at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArraySpec {
    pub first: u32,
    pub last: u32,
    pub limit: Option<u32>,
}

/// The most jobs one array holds, and the most dependencies one job has.
pub const MAX_ARRAY_JOBS: u32 = 1000;
pub const MAX_DEPENDENCIES: usize = 100;

impl ArraySpec {
    /// `FIRST-LAST[%MAX]` or `INDEX[%MAX]`, with at most [`MAX_ARRAY_JOBS`] indexes.
    pub fn parse(text: &str) -> Result<ArraySpec, String> {
        let shape = || format!("{text:?} is not FIRST-LAST[%MAX], e.g. 0-99%8");
        let (range, limit) = match text.split_once('%') {
            Some((range, limit)) => (range, Some(limit.parse::<u32>().map_err(|_| shape())?)),
            None => (text, None),
        };
        let (first, last) = match range.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().map_err(|_| shape())?, b.parse::<u32>().map_err(|_| shape())?),
            None => {
                let one = range.parse::<u32>().map_err(|_| shape())?;
                (one, one)
            }
        };
        if first > last {
            return Err(format!("{text:?}: the first index is after the last"));
        }
        if last - first >= MAX_ARRAY_JOBS {
            return Err(format!("{text:?}: at most {MAX_ARRAY_JOBS} jobs in one array"));
        }
        if limit == Some(0) {
            return Err(format!("{text:?}: %0 would never run any"));
        }
        Ok(ArraySpec { first, last, limit })
    }

    pub fn indexes(&self) -> std::ops::RangeInclusive<u32> {
        self.first..=self.last
    }
}

fn one() -> u32 {
    1
}

/// What runs: the checked, canonical form of a submission, stored with the job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JobSpec {
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub resources: Resources,
    pub replicas: u32,
    /// The template the spec was rendered from; its files are delivered to every replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<TemplateRef>,
    /// The image the replicas run, by digest (`repository@sha256:<hex>`), instead of the
    /// executor's configured one. Set only by a rerun on a cluster, to the image its original's
    /// replicas reported running, so that a tag moved since cannot change what runs; never by
    /// a submission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The tenant's shared volumes the replicas use (from `volume` parameters), each at the
    /// path its parameter resolved to. The local executor's volumes are directories reached by
    /// that path; a cluster executor mounts each volume's claim there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeMount>,
    /// The code shipped with the job, unpacked into every replica's working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<CodeRef>,
    /// An attempt that runs this many seconds is stopped and the job fails (no restart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_seconds: Option<u32>,
    /// How long after submission the job waits for room on a node that caches its datasets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_wait_seconds: Option<u32>,
    /// Runs on spare room only (see [`JobSubmission::spare`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub spare: bool,
}

/// Code shipped with a job: a tar archive in the tenant's storage, by content.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub struct CodeRef {
    /// `sha256:<hex>` of the archive's bytes.
    pub digest: String,
    pub size_bytes: u64,
}

/// Whether `text` is a content digest as Trainyard writes them: `sha256:` and 64 lowercase hex.
pub fn is_sha256_digest(text: &str) -> bool {
    text.strip_prefix("sha256:").is_some_and(is_sha256_hex)
}

/// Whether `text` is a SHA-256 as 64 lowercase hex digits (a shard's name in the cache, a
/// content hash in a path).
pub fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A shared volume as a job uses it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub struct VolumeMount {
    pub name: String,
    pub path: String,
}

/// Exactly which template version a job came from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub struct TemplateRef {
    pub name: String,
    pub version: String,
    /// `sha256:<hex>` over the template's canonical manifest and files.
    pub digest: String,
}

impl JobSpec {
    /// The full argv of each replica: `command` then `args`.
    pub fn argv(&self) -> Vec<String> {
        self.command.iter().chain(self.args.iter()).cloned().collect()
    }
}

/// A submission that passed every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidSubmission {
    pub name: String,
    pub spec: JobSpec,
    pub priority: i32,
    pub max_restarts: u32,
    pub idempotency_key: Option<String>,
    /// A typical run time, for start-time estimates (from the template).
    pub expected_runtime_seconds: Option<u32>,
    /// The dataset versions its parameters named, resolved in the registry.
    pub datasets: Vec<crate::api::DatasetUse>,
    /// For a rerun: the job it runs again, what it changed and the unpinned inputs accepted.
    pub rerun: Option<crate::rerun::RerunLink>,
    /// The jobs it starts after, and what of each it waits for.
    pub after: Vec<(Uuid, AfterKind)>,
    /// A job array: one job per index.
    pub array: Option<ArraySpec>,
    /// The checkpoint its weights start from (a template's `checkpoint` parameter, resolved).
    pub init_from: Option<crate::api::CheckpointSource>,
}

impl JobSubmission {
    /// Checks every rule and returns the canonical job, or an error naming the first bad field.
    pub fn validate(self) -> Result<ValidSubmission, Error> {
        // Every rule is checked, and every broken one named at once.
        let mut problems = crate::error::Problems::default();
        if self.command.is_empty() || self.command[0].trim().is_empty() {
            problems.add("command", "must name a program to run, e.g. [\"python\", \"train.py\"]");
        }
        let argv_bytes: usize = self.command.iter().chain(&self.args).map(|a| a.len()).sum();
        if self.command.len() + self.args.len() > MAX_ARGV_ITEMS || argv_bytes > MAX_ARGV_BYTES {
            problems.add(
                "args",
                format!("command and args together may have at most {MAX_ARGV_ITEMS} items and {MAX_ARGV_BYTES} bytes"),
            );
        }
        for (field, items) in [("command", &self.command), ("args", &self.args)] {
            if let Some(i) = items.iter().position(|a| a.contains('\0')) {
                problems.add(format!("{field}[{i}]"), "must not contain a NUL byte");
            }
        }
        problems.check(validate_env(&self.env));
        if let Some(name) = &self.name {
            problems.check(validate_name(name));
        }
        if self.replicas == 0 || self.replicas > MAX_REPLICAS {
            problems.add("replicas", format!("must be between 1 and {MAX_REPLICAS}"));
        }
        if self.resources.cpu.millis() == 0 {
            problems.add("resources.cpu", "must be more than 0");
        }
        if self.resources.gpus > MAX_GPUS_PER_REPLICA {
            problems.add(
                "resources.gpus",
                format!("at most {MAX_GPUS_PER_REPLICA} GPUs per replica; use more replicas for more GPUs"),
            );
        }
        if let Some(gpu_type) = &self.resources.gpu_type {
            let ok = !gpu_type.is_empty()
                && gpu_type.len() <= 63
                && gpu_type.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
            if !ok {
                problems.add(
                    "resources.gpu_type",
                    "must be 1 to 63 letters, digits, '-', '_' or '.', e.g. nvidia-h100-80gb",
                );
            }
        }
        if !PRIORITY_RANGE.contains(&self.priority) {
            problems
                .add("priority", format!("must be between {} and {}", PRIORITY_RANGE.start(), PRIORITY_RANGE.end()));
        }
        if let Some(code) = &self.code
            && !is_sha256_digest(code)
        {
            problems.add("code", "must be the digest of an uploaded archive: sha256: and 64 hex digits");
        }
        if let Some(limit) = self.time_limit_seconds
            && !(1..=MAX_TIME_LIMIT_SECONDS).contains(&limit)
        {
            problems.add("time_limit_seconds", format!("must be 1 to {MAX_TIME_LIMIT_SECONDS} (30 days)"));
        }
        if let Some(wait) = self.cache_wait_seconds
            && wait > MAX_CACHE_WAIT_SECONDS
        {
            problems.add(
                "cache_wait_seconds",
                format!(
                    "must be at most {MAX_CACHE_WAIT_SECONDS} (an hour): data locality is worth minutes of waiting, not hours"
                ),
            );
        }
        if self.max_restarts > MAX_RESTARTS {
            problems.add("max_restarts", format!("must be at most {MAX_RESTARTS}"));
        }
        if let Some(key) = &self.idempotency_key
            && (key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_LEN || key.chars().any(char::is_control))
        {
            problems.add("idempotency_key", format!("must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} printable characters"));
        }
        let mut after: Vec<(Uuid, AfterKind)> = (self.after_ok.iter().map(|id| (*id, AfterKind::Ok)))
            .chain(self.after_any.iter().map(|id| (*id, AfterKind::Any)))
            .chain(self.after_failed.iter().map(|id| (*id, AfterKind::Failed)))
            .collect();
        after.dedup();
        if after.len() > MAX_DEPENDENCIES {
            problems.add("after_ok", format!("at most {MAX_DEPENDENCIES} dependencies in all"));
        }
        let array = match self.array.as_deref().map(ArraySpec::parse) {
            None => None,
            Some(Ok(array)) => Some(array),
            Some(Err(message)) => {
                problems.add("array", message);
                None
            }
        };
        problems.into_result()?;
        let name = match self.name {
            Some(name) => name,
            None => default_name(&self.command[0]),
        };
        Ok(ValidSubmission {
            name,
            spec: JobSpec {
                command: self.command,
                args: self.args,
                env: self.env,
                resources: self.resources,
                replicas: self.replicas,
                template: None,
                image: None,
                volumes: Vec::new(),
                // The archive's size is filled in where its upload is found.
                code: self.code.map(|digest| CodeRef { digest, size_bytes: 0 }),
                time_limit_seconds: self.time_limit_seconds,
                cache_wait_seconds: self.cache_wait_seconds.filter(|&wait| wait > 0),
                spare: self.spare,
            },
            priority: self.priority,
            max_restarts: self.max_restarts,
            idempotency_key: self.idempotency_key,
            // The most it may take is the best guess of what it takes.
            expected_runtime_seconds: self.time_limit_seconds,
            datasets: Vec::new(),
            rerun: None,
            after,
            array,
            init_from: None,
        })
    }
}

/// A name's rule (letters, digits, `.`, `_`, `-`, starting with a letter or digit), as `field`.
pub fn check_name(field: &str, name: &str) -> Result<(), Error> {
    validate_name(name).map_err(|err| match err {
        Error::InvalidInput { message, .. } => Error::invalid(field, message),
        other => other,
    })
}

fn validate_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if ok {
        Ok(())
    } else {
        let shown: String = name.chars().take(40).collect();
        Err(Error::invalid(
            "name",
            format!(
                "must be 1 to {MAX_NAME_LEN} letters, digits, '.', '_' or '-', starting with a letter or digit (got {} characters: {shown:?}{})",
                name.chars().count(),
                if name.chars().count() > 40 { "..." } else { "" }
            ),
        ))
    }
}

fn validate_env(env: &BTreeMap<String, String>) -> Result<(), Error> {
    if env.len() > MAX_ENV_VARS {
        return Err(Error::invalid("env", format!("at most {MAX_ENV_VARS} variables")));
    }
    let bytes: usize = env.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_ENV_BYTES {
        return Err(Error::invalid("env", format!("at most {MAX_ENV_BYTES} bytes in all")));
    }
    for (key, value) in env {
        check_env_name(key).map_err(|message| Error::invalid(format!("env.{key}"), message))?;
        if value.contains('\0') {
            return Err(Error::invalid(format!("env.{key}"), "must not contain a NUL byte"));
        }
    }
    Ok(())
}

/// Checks one environment variable name: well formed, and not one Trainyard sets itself.
pub fn check_env_name(key: &str) -> Result<(), String> {
    let well_formed = key.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !well_formed {
        return Err("variable names are letters, digits and '_', not starting with a digit".into());
    }
    if RESERVED_ENV.contains(&key) || key.starts_with(RESERVED_ENV_PREFIX) {
        return Err("is set by Trainyard for every replica and cannot be overridden".into());
    }
    Ok(())
}

/// `python3` from `/usr/bin/python3`, cleaned to the name rules.
fn default_name(program: &str) -> String {
    let base = program.rsplit('/').next().unwrap_or(program);
    let cleaned: String = base
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '-' })
        .take(MAX_NAME_LEN)
        .collect();
    let cleaned = cleaned.trim_start_matches(|c: char| !c.is_ascii_alphanumeric()).to_string();
    if cleaned.is_empty() { "job".to_string() } else { cleaned }
}

/// Where a job is in its life. See [`JobState::TRANSITIONS`] for the legal moves; the database
/// holds the same table and refuses any other update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Waiting for admission.
    Queued,
    /// Capacity is reserved; the executor will launch it.
    Admitted,
    /// An attempt is being launched; not every replica is running yet.
    Starting,
    /// Every replica of the current attempt is running.
    Running,
    /// An attempt failed and restarts remain; the next attempt is about to launch.
    Restarting,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    pub const ALL: [JobState; 8] = [
        JobState::Queued,
        JobState::Admitted,
        JobState::Starting,
        JobState::Running,
        JobState::Restarting,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
    ];

    /// Every legal transition. Mirrored by the `job_state_transitions` table in Postgres, and a
    /// test checks that the two agree.
    pub const TRANSITIONS: &'static [(JobState, JobState)] = {
        use JobState::*;
        &[
            (Queued, Admitted),
            (Queued, Cancelled),
            (Admitted, Starting),
            (Admitted, Queued),
            (Admitted, Cancelled),
            (Starting, Running),
            (Starting, Succeeded),
            (Starting, Failed),
            (Starting, Restarting),
            (Starting, Cancelled),
            (Starting, Queued),
            (Running, Succeeded),
            (Running, Failed),
            (Running, Restarting),
            (Running, Cancelled),
            (Running, Queued),
            (Restarting, Starting),
            (Restarting, Failed),
            (Restarting, Cancelled),
            (Restarting, Queued),
        ]
    };

    pub fn can_transition_to(self, to: JobState) -> bool {
        JobState::TRANSITIONS.contains(&(self, to))
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed | JobState::Cancelled)
    }

    /// The names of the states `keep` selects, for SQL (`state = ANY($n)`, `state <> ALL($n)`),
    /// so that the store's state sets follow these predicates instead of repeating them.
    pub fn names_where(keep: impl Fn(JobState) -> bool) -> Vec<&'static str> {
        JobState::ALL.into_iter().filter(|s| keep(*s)).map(JobState::as_str).collect()
    }

    /// States in which the job holds capacity (admitted and not yet finished).
    pub fn holds_capacity(self) -> bool {
        matches!(self, JobState::Admitted | JobState::Starting | JobState::Running | JobState::Restarting)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Admitted => "admitted",
            JobState::Starting => "starting",
            JobState::Running => "running",
            JobState::Restarting => "restarting",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<JobState> {
        JobState::ALL.into_iter().find(|state| state.as_str() == s)
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_array_is_first_last_and_at_most() {
        assert_eq!(ArraySpec::parse("0-99%8"), Ok(ArraySpec { first: 0, last: 99, limit: Some(8) }));
        assert_eq!(ArraySpec::parse("7"), Ok(ArraySpec { first: 7, last: 7, limit: None }));
        for bad in ["", "a-b", "5-2", "0-99%0", "0-5000", "1-2%x"] {
            assert!(ArraySpec::parse(bad).is_err(), "{bad}");
        }
    }

    fn submission(json: serde_json::Value) -> Result<ValidSubmission, Error> {
        serde_json::from_value::<JobSubmission>(json).map_err(|e| Error::invalid("body", e.to_string()))?.validate()
    }

    fn field_of(err: Error) -> String {
        match err {
            Error::InvalidInput { field, .. } => field,
            other => panic!("expected invalid input, got {other:?}"),
        }
    }

    #[test]
    fn minimal_submission_gets_defaults() {
        let job = submission(serde_json::json!({"command": ["/usr/bin/python3", "-c", "print(1)"]})).unwrap();
        assert_eq!(job.name, "python3");
        assert_eq!(job.spec.replicas, 1);
        assert_eq!(job.spec.resources, Resources::default());
        assert_eq!(job.spec.argv(), ["/usr/bin/python3", "-c", "print(1)"]);
    }

    #[test]
    fn every_broken_rule_is_named_at_once() {
        let err = submission(serde_json::json!({
            "command": ["true"], "name": "Bad Name!", "replicas": 0, "priority": 5000
        }))
        .unwrap_err();
        let fields: Vec<String> = err.field_problems().into_iter().map(|p| p.field).collect();
        assert_eq!(fields, ["name", "replicas", "priority"], "{err}");
        assert!(matches!(err, Error::InvalidFields(_)));
        // One problem stays one error naming its field.
        let one = submission(serde_json::json!({"command": ["true"], "replicas": 0})).unwrap_err();
        assert_eq!(field_of(one), "replicas");
    }

    #[test]
    fn each_rule_names_its_field() {
        let cases = [
            (serde_json::json!({"command": []}), "command"),
            (serde_json::json!({"command": [""]}), "command"),
            (serde_json::json!({"command": ["x"], "name": "a b"}), "name"),
            (serde_json::json!({"command": ["x"], "name": "n".repeat(129)}), "name"),
            (serde_json::json!({"command": ["x"], "replicas": 0}), "replicas"),
            (serde_json::json!({"command": ["x"], "replicas": 100000}), "replicas"),
            (serde_json::json!({"command": ["x"], "resources": {"gpus": 1000}}), "resources.gpus"),
            (serde_json::json!({"command": ["x"], "resources": {"cpu": 0}}), "resources.cpu"),
            (serde_json::json!({"command": ["x"], "priority": 5000}), "priority"),
            (serde_json::json!({"command": ["x"], "max_restarts": 1000}), "max_restarts"),
            (serde_json::json!({"command": ["x"], "env": {"RANK": "3"}}), "env.RANK"),
            (serde_json::json!({"command": ["x"], "env": {"TRAINYARD_TOKEN": "3"}}), "env.TRAINYARD_TOKEN"),
            (serde_json::json!({"command": ["x"], "env": {"1BAD": "3"}}), "env.1BAD"),
            (serde_json::json!({"command": ["x", "a\u{0}b"]}), "command[1]"),
            (serde_json::json!({"command": ["x"], "idempotency_key": ""}), "idempotency_key"),
        ];
        for (json, field) in cases {
            let err = submission(json.clone()).expect_err(&json.to_string());
            assert_eq!(field_of(err), field, "{json}");
        }
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let err =
            serde_json::from_value::<JobSubmission>(serde_json::json!({"command": ["x"], "replica": 2})).unwrap_err();
        assert!(err.to_string().contains("unknown field `replica`"), "{err}");
    }

    #[test]
    fn state_machine_allows_the_documented_path_only() {
        use JobState::*;
        for (from, to) in [(Queued, Admitted), (Admitted, Starting), (Starting, Running), (Running, Succeeded)] {
            assert!(from.can_transition_to(to), "{from} -> {to}");
        }
        assert!(Running.can_transition_to(Restarting) && Restarting.can_transition_to(Starting));
        for terminal in [Succeeded, Failed, Cancelled] {
            assert!(terminal.is_terminal());
            assert!(JobState::ALL.iter().all(|to| !terminal.can_transition_to(*to)), "{terminal} is final");
        }
        assert!(!Queued.can_transition_to(Running));
        assert!(!Succeeded.can_transition_to(Queued));
    }

    #[test]
    fn state_names_round_trip() {
        for state in JobState::ALL {
            assert_eq!(JobState::parse(state.as_str()), Some(state));
            assert_eq!(serde_json::to_value(state).unwrap(), state.as_str());
        }
    }
}
