//! `yard diff A B`: what differs between two runs, field by field, and nothing else unless asked.
//! Each job is flattened to `field -> value` pairs (its spec, template and code, parameters,
//! datasets, outcome, outputs and each metric's last value); ids and times are left out unless
//! `--all`, since they always differ.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;
use trainyard_core::api::{Job, JobAttempt, JobMetrics};

/// A run's fields by name.
pub type Fields = BTreeMap<String, Value>;

/// One field as the two runs have it (`None`: the run has no such field).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Difference {
    pub field: String,
    pub a: Option<Value>,
    pub b: Option<Value>,
}

/// The comparison `yard diff` prints.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub a: String,
    pub b: String,
    pub differences: Vec<Difference>,
    /// How many fields are the same.
    pub same: usize,
}

/// What a run is, as comparable fields.
pub struct Run {
    pub job: Job,
    pub attempts: Vec<JobAttempt>,
    pub outputs: Value,
    pub metrics: JobMetrics,
}

/// The fields of a run, flattened (`spec.env.LR`, `params.lr`, `metrics.loss.last`, ...).
pub fn fields(run: &Run, all: bool) -> Fields {
    let mut out = BTreeMap::new();
    let job = &run.job;
    flatten("spec", &serde_json::to_value(&job.spec).unwrap_or(Value::Null), &mut out);
    if let Some(params) = &job.params {
        flatten("params", params, &mut out);
    }
    flatten("datasets", &serde_json::to_value(&job.datasets).unwrap_or(Value::Null), &mut out);
    flatten("outputs", &run.outputs, &mut out);
    // The link a rerun keeps to its original, and the parameters it changed.
    if let Some(original) = job.rerun_of {
        out.insert("rerun.of".into(), Value::from(original.to_string()));
    }
    if let Some(set) = &job.rerun_overrides {
        flatten("rerun.set", set, &mut out);
    }
    out.insert("priority".into(), Value::from(job.priority));
    out.insert("max_restarts".into(), Value::from(job.max_restarts));
    out.insert("outcome.state".into(), Value::from(job.state.as_str()));
    out.insert("outcome.reason".into(), job.reason.clone().map(Value::from).unwrap_or(Value::Null));
    out.insert("outcome.restarts".into(), Value::from(job.restart_count));
    if let Some(last) = run.attempts.last() {
        out.insert("outcome.exit_codes".into(), serde_json::to_value(&last.exit_codes).unwrap_or(Value::Null));
    }
    for series in &run.metrics.series {
        if let Some(last) = series.values.last() {
            out.insert(format!("metrics.{}.last", series.name), Value::from(*last));
            out.insert(format!("metrics.{}.points", series.name), Value::from(series.values.len()));
        }
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
    }
    out
}

fn flatten(prefix: &str, value: &Value, out: &mut BTreeMap<String, Value>) {
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

/// The fields that differ, in field order; `same` counts the rest.
pub fn compare(a: &Run, b: &Run, all: bool) -> Comparison {
    let (fa, fb) = (fields(a, all), fields(b, all));
    let mut differences = Vec::new();
    let mut same = 0;
    let names: std::collections::BTreeSet<&String> = fa.keys().chain(fb.keys()).collect();
    for name in names {
        let (va, vb) = (fa.get(name), fb.get(name));
        if va == vb {
            same += 1;
        } else {
            differences.push(Difference { field: name.clone(), a: va.cloned(), b: vb.cloned() });
        }
    }
    Comparison { a: a.job.id.to_string(), b: b.job.id.to_string(), differences, same }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(env: &[(&str, &str)], loss: f64) -> Run {
        let mut job: Job = serde_json::from_value(serde_json::json!({
            "id": uuid::Uuid::now_v7(), "tenant": "t", "name": "train", "state": "succeeded", "reason": null,
            "priority": 0, "max_restarts": 0, "restart_count": 0, "created_by": "alice",
            "created_at": "2026-11-24T00:00:00Z", "updated_at": "2026-11-24T00:00:00Z",
            "started_at": null, "finished_at": null, "cancel_requested_at": null, "idempotency_key": null,
            "spec": { "command": ["python", "train.py"], "args": [], "env": {}, "replicas": 2,
                      "resources": { "cpu": 1.0, "memory": "1Gi", "gpus": 0, "gpu_type": null } },
        }))
        .unwrap();
        job.spec.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let metrics = JobMetrics {
            series: vec![trainyard_core::api::MetricSeries {
                name: "loss".into(),
                steps: vec![0, 1],
                values: vec![1.0, loss],
            }],
        };
        Run { job, attempts: Vec::new(), outputs: serde_json::json!({}), metrics }
    }

    #[test]
    fn only_what_differs_is_shown_and_ids_only_when_asked() {
        let (a, b) = (run(&[("LR", "0.1")], 0.5), run(&[("LR", "0.01")], 0.25));
        let comparison = compare(&a, &b, false);
        let fields: Vec<&str> = comparison.differences.iter().map(|d| d.field.as_str()).collect();
        assert_eq!(fields, ["metrics.loss.last", "spec.env.LR"], "{comparison:?}");
        assert!(comparison.same > 5);
        assert!(compare(&a, &a, false).differences.is_empty(), "a run does not differ from itself");
        let all = compare(&a, &b, true);
        assert!(all.differences.iter().any(|d| d.field == "id"), "--all shows the ids too");
        let one_sided = compare(&run(&[("LR", "0.1"), ("SEED", "1")], 0.5), &a, false);
        assert_eq!(one_sided.differences[0].field, "spec.env.SEED");
        assert_eq!(one_sided.differences[0].b, None, "absent on one side");
    }
}
