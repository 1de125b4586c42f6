//! The run record of an attempt: a complete, immutable account of what ran, so that a run can
//! be repeated and two runs compared at a glance (by [`record_hash`]).
//!
//! Two parts, each written once:
//! - [`ServerRecord`], written by the control plane when the attempt begins, before any replica
//!   starts: the template with each file's hash, the parameters, the spec and its hash, the code
//!   shipped, the registered datasets, the executor and image, Trainyard's version;
//! - [`EngineRecord`], posted once by the job's engine with its job token: the interpreter and
//!   every installed package, the hardware and drivers, the seeds, the data read and its shard
//!   assignment, the user code.
//!
//! [`RunRecord`] is the two merged, as `GET /api/v1/jobs/{id}/record` shows it.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::api::DatasetUse;
use crate::job::{CodeRef, JobSpec};
use crate::rerun::UnpinnedInput;
use crate::{Error, Result};

pub mod summary;

/// The most JSON an engine's part of a record may hold.
pub const MAX_ENGINE_RECORD_BYTES: usize = 1024 * 1024;
/// The most packages an environment may list.
pub const MAX_PACKAGES: usize = 20_000;
/// The longest package name or version.
pub const MAX_PACKAGE_TEXT: usize = 256;

/// What the control plane records when an attempt begins.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ServerRecord {
    /// The template the job came from, with every file delivered; null for a direct submit.
    pub template: Option<TemplateRecord>,
    /// The template's parameters as the user gave them; null for a direct submit.
    #[schema(value_type = Option<Object>)]
    pub params: Option<Value>,
    /// The resolved spec the replicas ran.
    pub spec: JobSpec,
    /// `sha256:` over the spec as canonical JSON ([`canonical_json`]).
    pub spec_hash: String,
    /// The code archive shipped with the job (`yard submit`), by content.
    pub code: Option<CodeRef>,
    /// The registered dataset versions the job's parameters named.
    #[serde(default)]
    pub datasets: Vec<DatasetUse>,
    /// The executor that ran it: `local` or `kubernetes`.
    pub executor: String,
    /// The image the replicas run: the configured image on Kubernetes (the digests actually run
    /// are in [`RunRecord::image_digests`]); `local` for the local executor, whose interpreter
    /// and platform the engine's part records.
    pub image: String,
    pub trainyard: TrainyardBuild,
    /// For a rerun: the inputs it could not pin, which whoever ran it again accepted
    /// (`accept_unpinned`; see [`crate::rerun`]). Absent otherwise, so outside the hash.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accepted_unpinned: Vec<UnpinnedInput>,
    /// For a run fine-tuned from a checkpoint (`init_from`): the job that wrote it and its step.
    /// Absent otherwise, so records before it hash as they did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<crate::api::CheckpointSource>,
}

/// A template as an attempt ran it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TemplateRecord {
    pub name: String,
    pub version: String,
    /// `sha256:` over the canonical manifest and the files (see docs/templates.md).
    pub digest: String,
    /// Each file delivered under `template/`, by path: `sha256:<hex>` of its bytes.
    pub files: BTreeMap<String, String>,
}

/// The Trainyard that launched the attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TrainyardBuild {
    pub version: String,
    /// The git commit it was built from, when the build said (`TRAINYARD_GIT_COMMIT` at build
    /// time); null otherwise.
    pub commit: Option<String>,
}

impl TrainyardBuild {
    /// This build.
    pub fn current() -> TrainyardBuild {
        TrainyardBuild {
            version: env!("CARGO_PKG_VERSION").to_string(),
            commit: option_env!("TRAINYARD_GIT_COMMIT").filter(|c| !c.is_empty()).map(str::to_string),
        }
    }
}

impl ServerRecord {
    /// The record of an attempt of a job with `spec`, launched by `executor` with `image`, with
    /// these template files. `params` and `datasets` are the job's (the store fills them from the
    /// job's row when it writes the record).
    pub fn new(
        spec: &JobSpec,
        template_files: &BTreeMap<String, Vec<u8>>,
        executor: &str,
        image: Option<&str>,
    ) -> ServerRecord {
        let template = spec.template.as_ref().map(|t| TemplateRecord {
            name: t.name.clone(),
            version: t.version.clone(),
            digest: t.digest.clone(),
            files: template_files.iter().map(|(path, bytes)| (path.clone(), sha256_digest(bytes))).collect(),
        });
        ServerRecord {
            template,
            params: None,
            spec: spec.clone(),
            spec_hash: spec_hash(spec),
            code: spec.code.clone(),
            datasets: Vec::new(),
            executor: executor.to_string(),
            image: image.unwrap_or(executor).to_string(),
            trainyard: TrainyardBuild::current(),
            accepted_unpinned: Vec::new(),
            init_from: None,
        }
    }
}

/// What a job's engine posts (`POST /api/v1/jobs/{id}/record`), once per attempt. Top-level
/// fields are fixed (an unknown one is refused); what lies inside the free-form ones is the
/// engine's to describe (see docs/reproducibility.md for what pytorch-ddp sends).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EngineRecord {
    pub environment: RecordEnvironment,
    /// CPU, memory, GPUs, driver, CUDA/cuDNN/NCCL versions, world size, backend.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub hardware: Option<Value>,
    /// The seed, each rank's seed or the rule deriving it, determinism flags.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub seeds: Option<Value>,
    /// The data read: its path, content hash and each rank's shard assignment.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub data: Option<Value>,
    /// The user's code as the engine loaded it (module, its hash, repository and commit).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub user_code: Option<Value>,
    /// The engine itself (name, version).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub engine: Option<Value>,
}

/// The software the engine ran in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordEnvironment {
    /// Every installed distribution and its version (the full lock, not only what was
    /// imported), by name.
    pub packages: BTreeMap<String, String>,
    /// The interpreter: version, executable, implementation.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub python: Option<Value>,
    /// The operating system and machine, as the interpreter names them.
    #[serde(default)]
    pub platform: Option<String>,
}

impl EngineRecord {
    /// Checks the rules a stored engine record meets: at most [`MAX_ENGINE_RECORD_BYTES`] of
    /// JSON, packages named and versioned with short printable text, and every free-form part
    /// an object. An error names the field.
    pub fn validate(&self) -> Result<()> {
        let size = serde_json::to_vec(self).map_err(Error::internal)?.len();
        if size > MAX_ENGINE_RECORD_BYTES {
            return Err(Error::invalid(
                "body",
                format!("a run record is at most {} KiB of JSON, got {size} bytes", MAX_ENGINE_RECORD_BYTES >> 10),
            ));
        }
        let packages = &self.environment.packages;
        if packages.len() > MAX_PACKAGES {
            return Err(Error::invalid("environment.packages", format!("at most {MAX_PACKAGES} packages")));
        }
        let printable =
            |text: &str| !text.is_empty() && text.len() <= MAX_PACKAGE_TEXT && !text.chars().any(char::is_control);
        for (name, version) in packages {
            if !printable(name) {
                return Err(Error::invalid(
                    "environment.packages",
                    format!("a package name is 1 to {MAX_PACKAGE_TEXT} printable characters, got {name:?}"),
                ));
            }
            if !printable(version) {
                return Err(Error::invalid(
                    format!("environment.packages.{name}"),
                    format!("a version is 1 to {MAX_PACKAGE_TEXT} printable characters"),
                ));
            }
        }
        let parts = [
            ("environment.python", &self.environment.python),
            ("hardware", &self.hardware),
            ("seeds", &self.seeds),
            ("data", &self.data),
            ("user_code", &self.user_code),
            ("engine", &self.engine),
        ];
        for (field, part) in parts {
            if part.as_ref().is_some_and(|v| !v.is_object()) {
                return Err(Error::invalid(field, "must be a JSON object"));
            }
        }
        Ok(())
    }
}

/// An attempt's whole record: the server's part, the image digests seen when its containers
/// started, and the engine's part (null until the engine posts it; engines other than
/// pytorch-ddp may never do).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunRecord {
    pub template: Option<TemplateRecord>,
    #[schema(value_type = Option<Object>)]
    pub params: Option<Value>,
    pub spec: JobSpec,
    pub spec_hash: String,
    pub code: Option<CodeRef>,
    pub datasets: Vec<DatasetUse>,
    pub executor: String,
    pub image: String,
    /// The images the replicas ran, by digest (`repo@sha256:...`), once Kubernetes reported
    /// them; empty for the local executor.
    pub image_digests: Vec<String>,
    pub trainyard: TrainyardBuild,
    /// For a rerun: the inputs it could not pin, accepted explicitly; absent otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accepted_unpinned: Vec<UnpinnedInput>,
    /// For a fine-tune: the checkpoint its weights started from; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<crate::api::CheckpointSource>,
    pub environment: Option<RecordEnvironment>,
    #[schema(value_type = Option<Object>)]
    pub hardware: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub seeds: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub data: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub user_code: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub engine: Option<Value>,
}

impl RunRecord {
    pub fn merge(server: ServerRecord, image_digests: Vec<String>, engine: Option<EngineRecord>) -> RunRecord {
        let (environment, hardware, seeds, data, user_code, engine) = match engine {
            Some(e) => (Some(e.environment), e.hardware, e.seeds, e.data, e.user_code, e.engine),
            None => Default::default(),
        };
        RunRecord {
            template: server.template,
            params: server.params,
            spec: server.spec,
            spec_hash: server.spec_hash,
            code: server.code,
            datasets: server.datasets,
            executor: server.executor,
            image: server.image,
            image_digests,
            trainyard: server.trainyard,
            accepted_unpinned: server.accepted_unpinned,
            init_from: server.init_from,
            environment,
            hardware,
            seeds,
            data,
            user_code,
            engine,
        }
    }
}

/// One attempt's record as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AttemptRunRecord {
    pub attempt: i32,
    /// When the server's part was written (the attempt began).
    pub recorded_at: DateTime<Utc>,
    /// When the engine posted its part; null while it has not.
    pub engine_recorded_at: Option<DateTime<Utc>>,
    /// `sha256:` over `record` as canonical JSON. The job id, the attempt number and the times
    /// above are outside `record`, so two runs of the same thing hash equal.
    pub record_hash: String,
    pub record: RunRecord,
}

/// A job's run records, one per attempt that began (attempts launched before Trainyard kept
/// records have none).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobRunRecords {
    pub job_id: Uuid,
    pub attempts: Vec<AttemptRunRecord>,
}

/// JSON in one canonical form: object keys sorted (by their UTF-8 bytes) at every depth, no
/// whitespace, strings and numbers as serde_json writes them. Equal values give equal bytes
/// whatever order their keys were written or stored in (Postgres' jsonb reorders them).
pub fn canonical_json(value: &Value) -> Vec<u8> {
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                Value::Object(entries.into_iter().map(|(k, v)| (k.clone(), sorted(v))).collect())
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    serde_json::to_vec(&sorted(value)).expect("a JSON value serialises")
}

/// `sha256:<hex>` of some bytes.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex_of(&Sha256::digest(bytes)))
}

/// `sha256:` over the spec as canonical JSON.
pub fn spec_hash(spec: &JobSpec) -> String {
    sha256_digest(&canonical_json(&serde_json::to_value(spec).expect("a spec serialises")))
}

/// `sha256:` over the record as canonical JSON.
pub fn record_hash(record: &RunRecord) -> String {
    sha256_digest(&canonical_json(&serde_json::to_value(record).expect("a record serialises")))
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::TemplateRef;
    use serde_json::json;

    fn spec() -> JobSpec {
        JobSpec {
            command: vec!["python3".into(), "train.py".into()],
            args: vec!["--lr=0.1".into()],
            env: BTreeMap::from([("B".into(), "2".into()), ("A".into(), "1".into())]),
            resources: Default::default(),
            replicas: 2,
            template: Some(TemplateRef { name: "t".into(), version: "1.0.0".into(), digest: "sha256:00".into() }),
            image: None,
            volumes: Vec::new(),
            code: None,
            time_limit_seconds: None,
            cache_wait_seconds: None,
            spare: false,
        }
    }

    fn engine(torch: &str) -> EngineRecord {
        EngineRecord {
            environment: RecordEnvironment {
                packages: BTreeMap::from([("torch".into(), torch.into()), ("filelock".into(), "3.1".into())]),
                python: Some(json!({"version": "3.12.1"})),
                platform: Some("Linux-x86_64".into()),
            },
            hardware: Some(json!({"world_size": 2, "cpu_model": "x"})),
            seeds: Some(json!({"seed": 0})),
            data: None,
            user_code: None,
            engine: Some(json!({"name": "pytorch-ddp", "version": "1.4.0"})),
        }
    }

    #[test]
    fn canonical_json_ignores_key_order_and_whitespace() {
        let a: Value = serde_json::from_str(r#"{"b": 1, "a": {"y": [1, {"d": 2, "c": 3}], "x": null}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"x":null,"y":[1,{"c":3,"d":2}]},"b":1}"#).unwrap();
        assert_eq!(canonical_json(&a), canonical_json(&b));
        assert_eq!(String::from_utf8(canonical_json(&a)).unwrap(), r#"{"a":{"x":null,"y":[1,{"c":3,"d":2}]},"b":1}"#);
        // Array order is meaning: it counts.
        assert_ne!(canonical_json(&json!([1, 2])), canonical_json(&json!([2, 1])));
    }

    #[test]
    fn the_spec_hash_is_stable_and_changes_with_any_value() {
        let first = spec_hash(&spec());
        assert_eq!(first, spec_hash(&spec()));
        assert!(first.starts_with("sha256:") && first.len() == 7 + 64);
        let mut other = spec();
        other.args = vec!["--lr=0.2".into()];
        assert_ne!(first, spec_hash(&other));
    }

    #[test]
    fn the_server_record_hashes_each_template_file() {
        let files = BTreeMap::from([("engine/a.py".to_string(), b"print(1)\n".to_vec())]);
        let record = ServerRecord::new(&spec(), &files, "local", None);
        let template = record.template.as_ref().unwrap();
        assert_eq!(template.files["engine/a.py"], sha256_digest(b"print(1)\n"));
        assert_eq!(template.digest, "sha256:00");
        assert_eq!(record.image, "local");
        assert_eq!(record.spec_hash, spec_hash(&spec()));
        assert_eq!(record.trainyard.version, env!("CARGO_PKG_VERSION"));
        let kube = ServerRecord::new(&spec(), &files, "kubernetes", Some("ghcr.io/x/trainer:1"));
        assert_eq!(kube.image, "ghcr.io/x/trainer:1");
    }

    #[test]
    fn equal_records_hash_equal_and_a_changed_package_or_param_changes_the_hash() {
        let server = ServerRecord::new(&spec(), &BTreeMap::new(), "local", None);
        let a = RunRecord::merge(server.clone(), Vec::new(), Some(engine("2.15.0")));
        let b = RunRecord::merge(server.clone(), Vec::new(), Some(engine("2.15.0")));
        assert_eq!(record_hash(&a), record_hash(&b));
        let newer = RunRecord::merge(server.clone(), Vec::new(), Some(engine("2.16.0")));
        assert_ne!(record_hash(&a), record_hash(&newer));
        let mut with_params = server;
        with_params.params = Some(json!({"lr": 0.2}));
        assert_ne!(record_hash(&a), record_hash(&RunRecord::merge(with_params, Vec::new(), Some(engine("2.15.0")))));
        // A rerun's accepted unpinned inputs count; none leaves the record as it always was.
        let mut accepted = ServerRecord::new(&spec(), &BTreeMap::new(), "local", None);
        assert!(!serde_json::to_value(&accepted).unwrap().as_object().unwrap().contains_key("accepted_unpinned"));
        accepted.accepted_unpinned =
            vec![UnpinnedInput { input: "params.data".into(), message: "/d is a folder on the machine".into() }];
        assert_ne!(record_hash(&a), record_hash(&RunRecord::merge(accepted, Vec::new(), Some(engine("2.15.0")))));
        // Stored as jsonb and read back (keys reordered), the hash is the same.
        let stored: Value = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
        let read: RunRecord = serde_json::from_value(stored).unwrap();
        assert_eq!(record_hash(&read), record_hash(&a));
    }

    #[test]
    fn an_engine_record_is_checked_field_by_field() {
        assert!(engine("2.15.0").validate().is_ok());
        let mut bad = engine("");
        let err = bad.validate().unwrap_err();
        assert!(matches!(&err, Error::InvalidInput { field, .. } if field == "environment.packages.torch"), "{err}");
        bad = engine("1");
        bad.hardware = Some(json!([1]));
        assert!(matches!(bad.validate().unwrap_err(), Error::InvalidInput { field, .. } if field == "hardware"));
        bad = engine("1");
        bad.environment.packages.insert("x\n".into(), "1".into());
        assert!(
            matches!(bad.validate().unwrap_err(), Error::InvalidInput { field, .. } if field == "environment.packages")
        );
        bad = engine("1");
        bad.data = Some(json!({"blob": "x".repeat(MAX_ENGINE_RECORD_BYTES)}));
        assert!(matches!(bad.validate().unwrap_err(), Error::InvalidInput { field, .. } if field == "body"));
        // Unknown top-level fields are refused by name.
        let err = serde_json::from_value::<EngineRecord>(json!({"environment": {"packages": {}}, "extra": 1}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `extra`"), "{err}");
    }
}
