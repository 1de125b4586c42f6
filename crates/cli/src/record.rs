//! `yard jobs show ID --record`: a job's run records (what exactly each attempt ran), a section
//! a line, in the words of [`summary`] (the job page's too); `-o json` prints the whole record.

use std::fmt::Write;

use serde_json::Value;
use trainyard_core::record::summary::{self, text};
use trainyard_core::record::{AttemptRunRecord, JobRunRecords, RunRecord};

/// How many packages are named besides torch (all of them are in `-o json`).
const PACKAGES_SHOWN: usize = 5;

/// What a section says when the engine has not reported it.
const NOT_REPORTED: &str = "- (the engine reported none)";

/// Every attempt's record as text.
pub fn render(job: &JobRunRecords) -> String {
    if job.attempts.is_empty() {
        return format!(
            "job {} has no run record yet (it has not begun, or began before records were kept)\n",
            job.job_id
        );
    }
    job.attempts.iter().map(attempt).collect::<Vec<_>>().join("\n")
}

fn attempt(a: &AttemptRunRecord) -> String {
    let r = &a.record;
    let mut out = String::new();
    let engine = match a.engine_recorded_at {
        Some(at) => format!("engine's part {}", at.format("%Y-%m-%d %H:%M:%S")),
        None => "no engine's part yet".into(),
    };
    let reported = |part: Option<String>| part.unwrap_or_else(|| NOT_REPORTED.into());
    line(&mut out, "attempt", format!("{} (begun {}; {engine})", a.attempt, a.recorded_at.format("%Y-%m-%d %H:%M:%S")));
    line(&mut out, "hash", a.record_hash.clone());
    line(
        &mut out,
        "template",
        match &r.template {
            Some(t) => format!("{}@{} {} ({} files)", t.name, t.version, t.digest, t.files.len()),
            None => "none (submitted directly)".into(),
        },
    );
    line(&mut out, "parameters", parameters(r.params.as_ref()));
    line(&mut out, "spec hash", r.spec_hash.clone());
    line(&mut out, "code", summary::code(r).unwrap_or_else(|| "none shipped".into()));
    if let Some(user) = summary::user_code(r) {
        line(&mut out, "user code", user);
    }
    for dataset in summary::datasets(r) {
        line(&mut out, "dataset", dataset);
    }
    line(&mut out, "data", reported(summary::data(r)));
    line(&mut out, "image", summary::image(r));
    line(&mut out, "environment", environment(r));
    line(&mut out, "hardware", reported(summary::hardware(r)));
    line(&mut out, "seeds", reported(summary::seeds(r)));
    if let Some(input) = summary::input_pipeline(r) {
        line(&mut out, "input", input);
    }
    if let Some(source) = &r.init_from {
        line(&mut out, "init from", format!("job {} checkpoint step {}", source.job_id, source.step));
    }
    // A rerun that ran what it could not pin, as accepted.
    for input in &r.accepted_unpinned {
        line(&mut out, "unpinned", format!("{input} (accepted)"));
    }
    let engine = r.engine.as_ref().map(|e| format!("; engine {} {}", text(&e["name"]), text(&e["version"])));
    line(&mut out, "trainyard", format!("{}{}", summary::trainyard(r), engine.unwrap_or_default()));
    out
}

fn line(out: &mut String, label: &str, value: String) {
    let _ = writeln!(out, "{:<12} {value}", format!("{label}:"));
}

fn parameters(params: Option<&Value>) -> String {
    match params.and_then(Value::as_object) {
        Some(map) if !map.is_empty() => {
            let mut given: Vec<String> = map.iter().map(|(k, v)| format!("{k}={}", text(v))).collect();
            given.sort();
            given.join(" ")
        }
        Some(_) => "none given (every default)".into(),
        None => "none (not from a template)".into(),
    }
}

/// The interpreter, then on a line of its own how many packages, torch's version and a few more.
fn environment(r: &RunRecord) -> String {
    let (Some(python), Some(env)) = (summary::python(r), &r.environment) else { return NOT_REPORTED.into() };
    let packages = &env.packages;
    let torch = packages.get("torch").map(|v| format!("torch {v}; ")).unwrap_or_default();
    let first: Vec<String> =
        packages.iter().filter(|(n, _)| *n != "torch").take(PACKAGES_SHOWN).map(|(n, v)| format!("{n} {v}")).collect();
    let more = packages.len().saturating_sub(first.len() + usize::from(packages.contains_key("torch")));
    let more = if more > 0 { format!(", and {more} more (-o json lists all)") } else { String::new() };
    format!("{python}\n{:<12} {} packages: {torch}{}{more}", "", packages.len(), first.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_record_reads_section_by_section() {
        let record: JobRunRecords = serde_json::from_value(json!({
            "job_id": "0190b7e4-0000-7000-8000-000000000001",
            "attempts": [{
                "attempt": 1, "recorded_at": "2026-11-24T10:00:00Z", "engine_recorded_at": "2026-11-24T10:00:05Z",
                "record_hash": "sha256:aa",
                "record": {
                    "template": {"name": "pytorch-ddp", "version": "1.4.0", "digest": "sha256:bb", "files": {"engine/train.py": "sha256:cc"}},
                    "params": {"seed": 3, "data": "/d"},
                    "spec": {"command": ["python3"], "args": [], "env": {}, "resources": {"cpu": 1, "memory": "1Gi", "gpus": 0}, "replicas": 1},
                    "spec_hash": "sha256:dd", "code": null, "datasets": [], "executor": "local", "image": "local",
                    "image_digests": [], "trainyard": {"version": "0.1.0", "commit": null},
                    "environment": {"packages": {"torch": "2.15.0", "filelock": "3.0", "a": "1", "b": "2", "c": "3", "d": "4", "e": "5"},
                                    "python": {"version": "3.12.3", "executable": "/v/python", "implementation": "CPython"},
                                    "platform": "Linux"},
                    "hardware": {"cpu_model": "Xeon", "cpu_count": 8, "memory_bytes": 1073741824, "gpus": [], "driver": null,
                                 "cuda": "13.2", "cudnn": "9.26.0", "nccl": null, "world_size": 2, "replicas": 2,
                                 "processes_per_replica": 1, "backend": "gloo"},
                    "seeds": {"seed": 3, "rank_seeds": [1, 2], "deterministic": false, "cublas_workspace_config": null},
                    "data": {"path": "/d", "content_hash": "sha256:ee", "shards": 7, "samples": 900,
                             "assignment": {"epoch": 0, "ranks": [{"rank": 0, "shards": [1, 2]}, {"rank": 1, "shards": [3]}]}},
                    "user_code": null, "engine": {"name": "pytorch-ddp", "version": "1.4.0"}
                }
            }]
        }))
        .unwrap();
        let text = render(&record);
        for expected in [
            "template:    pytorch-ddp@1.4.0 sha256:bb (1 files)",
            "parameters:  data=/d seed=3",
            "spec hash:   sha256:dd",
            "code:        none shipped",
            "data:        /d read with content hash sha256:ee (7 shards, 900 samples); epoch 0: rank 0 reads 2 shards, rank 1 reads 1 shards",
            "7 packages: torch 2.15.0; a 1, b 2, c 3, d 4, e 5, and 1 more (-o json lists all)",
            "environment: CPython 3.12.3 (/v/python) on Linux",
            "hardware:    Xeon, 8 CPUs, 1 GiB of memory, no GPU; driver -, CUDA 13.2, cuDNN 9.26.0, NCCL -; world size 2 (2 replicas × 1, gloo)",
            "seeds:       seed 3, 2 rank seeds; deterministic false, cuBLAS workspace -",
            "trainyard:   0.1.0 (commit unknown); engine pytorch-ddp 1.4.0",
        ] {
            assert!(text.contains(expected), "{expected:?} in:\n{text}");
        }
    }
}
