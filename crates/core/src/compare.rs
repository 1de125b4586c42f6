//! Comparing runs field by field (`yard diff`, `GET /api/v1/compare`, the dashboard's compare
//! page): each run is flattened to `field -> value` pairs from its job, its latest attempt's run
//! record, its outputs and a summary of each metric series, and the fields are grouped in
//! [`SECTIONS`]. A field differs when not all runs agree on it (a run without it counts as a
//! value of its own). Ids and times always differ, so they are shown only when all fields are
//! asked for. Pure: the server reads the facts, this decides what differs.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::api::{Job, JobAttempt};
use crate::record::RunRecord;

/// The sections a comparison is grouped in, in the order shown. `run` (ids, times, the record
/// hash) only appears when every field is asked for.
pub const SECTIONS: [&str; 11] = [
    "run",
    "parameters",
    "logged params",
    "spec",
    "template",
    "code",
    "data",
    "environment",
    "hardware",
    "outcome",
    "link",
];

/// The most runs one comparison takes.
pub const MAX_COMPARED_RUNS: usize = 8;

/// A metric series in brief: how many points it has and the value at its last step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct MetricSummary {
    pub name: String,
    pub points: i64,
    pub last: f64,
}

/// What is known of one run, as the store reads it.
#[derive(Debug, Clone)]
pub struct RunFacts {
    pub job: Job,
    pub attempts: Vec<JobAttempt>,
    pub outputs: BTreeMap<String, Value>,
    pub metrics: Vec<MetricSummary>,
    /// The latest attempt's run record, when it has one.
    pub record: Option<RunRecord>,
    pub record_hash: Option<String>,
    /// The params the job's code logged through MLflow (`mlflow.log_param`): beside its template
    /// parameters (`params.*`), never among them.
    pub logged_params: BTreeMap<String, String>,
}

/// A compared run, as the columns of a comparison name it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ComparedRun {
    pub id: Uuid,
    pub name: String,
    /// The name and the id's first 13 characters: `train (01a2b3c4-d5e6)`.
    pub label: String,
}

/// One field as each run has it, in the order of [`Comparison::runs`] (null: the run has no
/// such field, or has it as null).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ComparedField {
    pub field: String,
    #[schema(value_type = Vec<Object>)]
    pub values: Vec<Option<Value>>,
    /// Not all runs agree.
    pub differs: bool,
}

/// A section's fields: those that differ, or all of them when asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ComparisonSection {
    pub name: String,
    pub fields: Vec<ComparedField>,
    /// How many of the section's fields differ, and how many are the same.
    pub differ: usize,
    pub same: usize,
}

/// Two or more runs compared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Comparison {
    pub runs: Vec<ComparedRun>,
    /// Every field is listed, not only those that differ (ids and times too).
    pub all: bool,
    pub sections: Vec<ComparisonSection>,
    pub differ: usize,
    pub same: usize,
    /// The metric series any of the runs reported, by name (to chart them side by side).
    pub metrics: Vec<String>,
}

impl ComparedRun {
    pub fn of(job: &Job) -> ComparedRun {
        let id = job.id.to_string();
        ComparedRun { id: job.id, name: job.name.clone(), label: format!("{} ({})", job.name, &id[..13]) }
    }
}

/// A run's fields by name.
pub type Fields = BTreeMap<String, Value>;

/// The section a field belongs to, by its name.
pub fn section_of(field: &str) -> &'static str {
    let first = field.split('.').next().unwrap_or(field);
    match first {
        "params" => "parameters",
        "logged_params" => "logged params",
        "spec" | "priority" | "max_restarts" => "spec",
        "template" => "template",
        "code" => "code",
        "datasets" | "data" => "data",
        "environment" | "seeds" | "engine" => "environment",
        "hardware" => "hardware",
        "outcome" | "metrics" | "outputs" => "outcome",
        "rerun" => "link",
        _ => "run",
    }
}

/// The fields of a run, flattened (`spec.env.LR`, `params.lr`, `logged_params.lr`, `environment.packages.torch`,
/// `metrics.loss.last`, ...); `run` fields (ids, times, the record hash) only when `all`.
pub fn fields(run: &RunFacts, all: bool) -> Fields {
    let mut out = BTreeMap::new();
    let job = &run.job;
    let mut spec = serde_json::to_value(&job.spec).unwrap_or(Value::Null);
    // The template and the code have sections of their own.
    if let Value::Object(map) = &mut spec {
        map.remove("template");
        map.remove("code");
    }
    flatten("spec", &spec, &mut out);
    out.insert("priority".into(), Value::from(job.priority));
    out.insert("max_restarts".into(), Value::from(job.max_restarts));
    if let Some(params) = &job.params {
        flatten("params", params, &mut out);
    }
    for (key, value) in &run.logged_params {
        out.insert(format!("logged_params.{key}"), Value::from(value.clone()));
    }
    if let Some(template) = &job.spec.template {
        out.insert("template.name".into(), Value::from(template.name.clone()));
        out.insert("template.version".into(), Value::from(template.version.clone()));
        out.insert("template.digest".into(), Value::from(template.digest.clone()));
    }
    if let Some(code) = &job.spec.code {
        out.insert("code.digest".into(), Value::from(code.digest.clone()));
        out.insert("code.size_bytes".into(), Value::from(code.size_bytes));
    }
    for dataset in &job.datasets {
        let prefix = format!("datasets.{}", dataset.param);
        out.insert(format!("{prefix}.name"), Value::from(dataset.name.clone()));
        out.insert(format!("{prefix}.version"), Value::from(dataset.version.clone()));
        out.insert(format!("{prefix}.uri"), Value::from(dataset.uri.clone()));
        out.insert(format!("{prefix}.content_hash"), Value::from(dataset.content_hash.clone()));
    }
    if let Some(record) = &run.record {
        record_fields(record, &mut out);
    }
    flatten("outputs", &serde_json::to_value(&run.outputs).unwrap_or(Value::Null), &mut out);
    out.insert("outcome.state".into(), Value::from(job.state.as_str()));
    out.insert("outcome.reason".into(), job.reason.clone().map(Value::from).unwrap_or(Value::Null));
    out.insert("outcome.restarts".into(), Value::from(job.restart_count));
    if let Some(last) = run.attempts.last() {
        out.insert("outcome.exit_codes".into(), serde_json::to_value(&last.exit_codes).unwrap_or(Value::Null));
    }
    for series in &run.metrics {
        out.insert(format!("metrics.{}.last", series.name), Value::from(series.last));
        out.insert(format!("metrics.{}.points", series.name), Value::from(series.points));
    }
    // The link a rerun keeps to its original, and the parameters it changed.
    if let Some(original) = job.rerun_of {
        out.insert("rerun.of".into(), Value::from(original.to_string()));
    }
    if let Some(set) = &job.rerun_overrides {
        flatten("rerun.set", set, &mut out);
    }
    // What it could not pin and ran anyway, as accepted.
    for input in &job.rerun_unpinned {
        out.insert(format!("rerun.unpinned.{}", input.input), Value::from(input.message.clone()));
    }
    if all {
        out.insert("id".into(), Value::from(job.id.to_string()));
        out.insert("name".into(), Value::from(job.name.clone()));
        out.insert("created_by".into(), Value::from(job.created_by.clone()));
        out.insert("created_at".into(), Value::from(job.created_at.to_rfc3339()));
        if let Some(at) = job.started_at {
            out.insert("started_at".into(), Value::from(at.to_rfc3339()));
        }
        if let Some(at) = job.finished_at {
            out.insert("finished_at".into(), Value::from(at.to_rfc3339()));
        }
        if let Some(hash) = &run.record_hash {
            out.insert("record_hash".into(), Value::from(hash.clone()));
        }
    }
    out
}

/// What the run record adds to the job's own fields: the template's files, the user's code as
/// the engine loaded it, the data read, the environment (every package), the seeds, the hardware.
fn record_fields(record: &RunRecord, out: &mut Fields) {
    if let Some(template) = &record.template {
        for (path, digest) in &template.files {
            out.insert(format!("template.files.{path}"), Value::from(digest.clone()));
        }
    }
    if let Some(user_code) = &record.user_code {
        flatten("code.user", user_code, out);
    }
    if let Some(data) = &record.data {
        flatten("data", data, out);
    }
    out.insert("environment.executor".into(), Value::from(record.executor.clone()));
    out.insert("environment.image".into(), Value::from(record.image.clone()));
    if !record.image_digests.is_empty() {
        out.insert("environment.image_digests".into(), Value::from(record.image_digests.clone()));
    }
    out.insert("environment.trainyard.version".into(), Value::from(record.trainyard.version.clone()));
    out.insert(
        "environment.trainyard.commit".into(),
        record.trainyard.commit.clone().map(Value::from).unwrap_or(Value::Null),
    );
    if let Some(environment) = &record.environment {
        // One field per package: a lock of hundreds differs in the one or two that changed.
        for (name, version) in &environment.packages {
            out.insert(format!("environment.packages.{name}"), Value::from(version.clone()));
        }
        if let Some(python) = &environment.python {
            flatten("environment.python", python, out);
        }
        if let Some(platform) = &environment.platform {
            out.insert("environment.platform".into(), Value::from(platform.clone()));
        }
    }
    if let Some(engine) = &record.engine {
        flatten("engine", engine, out);
    }
    if let Some(seeds) = &record.seeds {
        flatten("seeds", seeds, out);
    }
    if let Some(hardware) = &record.hardware {
        flatten("hardware", hardware, out);
    }
}

fn flatten(prefix: &str, value: &Value, out: &mut Fields) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, value) in map {
                flatten(&format!("{prefix}.{key}"), value, out);
            }
        }
        // Lists stay whole (an argv, exit codes): a list that differs differs as a whole.
        other => {
            out.insert(prefix.to_string(), other.clone());
        }
    }
}

/// The runs compared: every section in [`SECTIONS`] order (`run` only when `all`), each with
/// the fields that differ (every field when `all`) in name order.
pub fn compare(runs: &[RunFacts], all: bool) -> Comparison {
    let per_run: Vec<Fields> = runs.iter().map(|run| fields(run, all)).collect();
    let names: BTreeSet<&String> = per_run.iter().flat_map(|f| f.keys()).collect();
    let mut sections: Vec<ComparisonSection> = SECTIONS
        .iter()
        .filter(|name| all || **name != "run")
        .map(|name| ComparisonSection { name: name.to_string(), fields: Vec::new(), differ: 0, same: 0 })
        .collect();
    for name in names {
        let values: Vec<Option<&Value>> = per_run.iter().map(|f| f.get(name)).collect();
        let differs = values.iter().any(|v| *v != values[0]);
        let Some(section) = sections.iter_mut().find(|s| s.name == section_of(name)) else { continue };
        if differs {
            section.differ += 1;
        } else {
            section.same += 1;
        }
        if differs || all {
            let values = values.into_iter().map(|v| v.cloned()).collect();
            section.fields.push(ComparedField { field: name.clone(), values, differs });
        }
    }
    Comparison {
        runs: runs.iter().map(|run| ComparedRun::of(&run.job)).collect(),
        all,
        differ: sections.iter().map(|s| s.differ).sum(),
        same: sections.iter().map(|s| s.same).sum(),
        sections,
        metrics: runs
            .iter()
            .flat_map(|r| r.metrics.iter().map(|m| m.name.clone()))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::RecordEnvironment;

    fn run(env: &[(&str, &str)], loss: f64) -> RunFacts {
        let mut job: Job = serde_json::from_value(serde_json::json!({
            "id": Uuid::now_v7(), "tenant": "t", "name": "train", "state": "succeeded", "reason": null,
            "priority": 0, "max_restarts": 0, "restart_count": 0, "created_by": "alice",
            "created_at": "2026-11-24T00:00:00Z", "updated_at": "2026-11-24T00:00:00Z",
            "started_at": null, "finished_at": null, "cancel_requested_at": null, "idempotency_key": null,
            "spec": { "command": ["python", "train.py"], "args": [], "env": {}, "replicas": 2,
                      "resources": { "cpu": 1.0, "memory": "1Gi", "gpus": 0, "gpu_type": null } },
        }))
        .unwrap();
        job.spec.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let metrics = vec![MetricSummary { name: "loss".into(), points: 2, last: loss }];
        RunFacts {
            job,
            attempts: Vec::new(),
            outputs: BTreeMap::new(),
            metrics,
            record: None,
            record_hash: None,
            logged_params: BTreeMap::new(),
        }
    }

    fn differing(c: &Comparison) -> Vec<(&str, &str)> {
        c.sections
            .iter()
            .flat_map(|s| s.fields.iter().filter(|f| f.differs).map(|f| (s.name.as_str(), f.field.as_str())))
            .collect()
    }

    #[test]
    fn params_logged_through_mlflow_are_a_section_of_their_own_beside_the_template_parameters() {
        let (mut a, mut b) = (run(&[], 0.5), run(&[], 0.5));
        a.job.params = Some(serde_json::json!({"lr": "0.1"}));
        b.job.params = Some(serde_json::json!({"lr": "0.1"}));
        a.logged_params.insert("lr".into(), "0.1".into());
        b.logged_params.insert("lr".into(), "0.01".into());
        let comparison = compare(&[a, b], false);
        assert_eq!(differing(&comparison), [("logged params", "logged_params.lr")]);
    }

    #[test]
    fn only_what_differs_is_shown_by_section_and_ids_only_when_asked() {
        let (a, b) = (run(&[("LR", "0.1")], 0.5), run(&[("LR", "0.01")], 0.25));
        let comparison = compare(&[a.clone(), b.clone()], false);
        assert_eq!(differing(&comparison), [("spec", "spec.env.LR"), ("outcome", "metrics.loss.last")]);
        assert_eq!(comparison.differ, 2);
        assert_eq!(comparison.metrics, ["loss"]);
        assert!(comparison.same > 5);
        assert!(comparison.sections.iter().all(|s| s.name != "run"), "no ids unless asked");
        let itself = compare(&[a.clone(), a.clone()], false);
        assert_eq!(itself.differ, 0, "a run does not differ from itself");
        let all = compare(&[a.clone(), b.clone()], true);
        assert!(differing(&all).contains(&("run", "id")), "--all shows the ids too");
        assert!(all.sections.iter().flat_map(|s| &s.fields).any(|f| !f.differs), "and the fields that agree");
        let one_sided = compare(&[run(&[("LR", "0.1"), ("SEED", "1")], 0.5), a], false);
        let seed = one_sided.sections.iter().flat_map(|s| &s.fields).find(|f| f.field == "spec.env.SEED").unwrap();
        assert_eq!(seed.values, [Some(Value::from("1")), None], "absent on one side");
    }

    #[test]
    fn three_runs_differ_where_any_one_disagrees_and_packages_are_compared_one_by_one() {
        let record = |torch: &str| {
            let mut record: RunRecord = serde_json::from_value(serde_json::json!({
                "template": null, "params": null, "spec_hash": "sha256:x", "code": null, "datasets": [],
                "executor": "local", "image": "local", "image_digests": [],
                "trainyard": {"version": "0.1.0", "commit": null},
                "spec": { "command": ["true"], "args": [], "env": {}, "replicas": 1,
                          "resources": { "cpu": 1.0, "memory": "1Gi", "gpus": 0, "gpu_type": null } },
                "environment": null, "hardware": {"cpu_count": 8}, "seeds": null, "data": null,
                "user_code": null, "engine": null,
            }))
            .unwrap();
            let packages = [("numpy", "2.1.0"), ("torch", torch)].map(|(n, v)| (n.to_string(), v.to_string()));
            record.environment =
                Some(RecordEnvironment { packages: packages.into_iter().collect(), python: None, platform: None });
            record
        };
        let mut runs = vec![run(&[], 0.5), run(&[], 0.5), run(&[], 0.5)];
        for (run, torch) in runs.iter_mut().zip(["2.5.0", "2.5.0", "2.6.0"]) {
            run.record = Some(record(torch));
        }
        let comparison = compare(&runs, false);
        assert_eq!(differing(&comparison), [("environment", "environment.packages.torch")]);
        let environment = comparison.sections.iter().find(|s| s.name == "environment").unwrap();
        assert_eq!(environment.fields[0].values.len(), 3, "a value per run");
        let hardware = comparison.sections.iter().find(|s| s.name == "hardware").unwrap();
        assert_eq!((hardware.differ, hardware.same), (0, 1), "hardware.cpu_count agrees");
    }
}
