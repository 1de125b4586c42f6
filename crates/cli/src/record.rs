//! `yard jobs show ID --record`: a job's run records (what exactly each attempt ran), a section
//! a line; `-o json` prints the whole record.

use std::fmt::Write;

use serde_json::Value;
use trainyard_core::record::{AttemptRunRecord, JobRunRecords, RunRecord};
use trainyard_core::resources::Memory;

/// How many packages are named besides torch (all of them are in `-o json`).
const PACKAGES_SHOWN: usize = 5;

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
    line(
        &mut out,
        "code",
        match &r.code {
            Some(code) => format!("{} ({})", code.digest, Memory(code.size_bytes)),
            None => "none shipped".into(),
        },
    );
    if let Some(user) = r.user_code.as_ref() {
        line(&mut out, "user code", user_code(user));
    }
    for d in &r.datasets {
        line(&mut out, "dataset", format!("{}@{} {} (parameter {})", d.name, d.version, d.content_hash, d.param));
    }
    line(&mut out, "data", data(r.data.as_ref()));
    line(&mut out, "image", image(r));
    line(&mut out, "environment", environment(r));
    line(&mut out, "hardware", hardware(r.hardware.as_ref()));
    line(&mut out, "seeds", seeds(r.seeds.as_ref()));
    // A rerun that ran what it could not pin, as accepted.
    for input in &r.accepted_unpinned {
        line(&mut out, "unpinned", format!("{input} (accepted)"));
    }
    let engine = r.engine.as_ref().map(|e| format!("; engine {} {}", text(&e["name"]), text(&e["version"])));
    line(
        &mut out,
        "trainyard",
        format!(
            "{} (commit {}){}",
            r.trainyard.version,
            r.trainyard.commit.as_deref().unwrap_or("unknown"),
            engine.unwrap_or_default()
        ),
    );
    out
}

fn line(out: &mut String, label: &str, value: String) {
    let _ = writeln!(out, "{:<12} {value}", format!("{label}:"));
}

/// A JSON value as text: strings bare, null as `-`.
fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
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

fn user_code(user: &Value) -> String {
    let mut parts = vec![match user["module"].as_str() {
        Some(module) => module.to_string(),
        None => "the template's example".into(),
    }];
    if let Some(hash) = user["module_sha256"].as_str() {
        parts.push(hash.to_string());
    }
    if let Some(repo) = user["repository"].as_str() {
        parts.push(format!("from {repo} at {}", text(&user["commit"])));
    }
    parts.join(" ")
}

fn data(data: Option<&Value>) -> String {
    let Some(d) = data else { return "- (the engine reported none)".into() };
    let mut text_out = format!(
        "{} content {} ({} shards, {} samples)",
        text(&d["path"]),
        text(&d["content_hash"]),
        text(&d["shards"]),
        text(&d["samples"])
    );
    if let Some(ranks) = d["assignment"]["ranks"].as_array() {
        let each: Vec<String> = ranks
            .iter()
            .take(4)
            .map(|r| {
                let shards = r["shards"].as_array().map_or(0, Vec::len);
                format!("rank {} reads {shards} shards", text(&r["rank"]))
            })
            .collect();
        let more = if ranks.len() > 4 { format!(", ... ({} ranks)", ranks.len()) } else { String::new() };
        let _ = write!(text_out, "; epoch {}: {}{more}", text(&d["assignment"]["epoch"]), each.join(", "));
    }
    text_out
}

fn image(r: &RunRecord) -> String {
    let mut image = format!("{} (executor {})", r.image, r.executor);
    if !r.image_digests.is_empty() {
        let _ = write!(image, ", ran {}", r.image_digests.join(", "));
    }
    image
}

fn environment(r: &RunRecord) -> String {
    let Some(env) = &r.environment else { return "- (the engine reported none)".into() };
    let python = env.python.as_ref().map_or_else(
        || "-".to_string(),
        |p| format!("{} {} ({})", text(&p["implementation"]), text(&p["version"]), text(&p["executable"])),
    );
    let packages = &env.packages;
    let torch = packages.get("torch").map(|v| format!("torch {v}; ")).unwrap_or_default();
    let first: Vec<String> =
        packages.iter().filter(|(n, _)| *n != "torch").take(PACKAGES_SHOWN).map(|(n, v)| format!("{n} {v}")).collect();
    let more = packages.len().saturating_sub(first.len() + usize::from(packages.contains_key("torch")));
    let more = if more > 0 { format!(", and {more} more (-o json lists all)") } else { String::new() };
    format!(
        "{python} on {}\n{:<12} {} packages: {torch}{}{more}",
        env.platform.as_deref().unwrap_or("-"),
        "",
        packages.len(),
        first.join(", ")
    )
}

fn hardware(hardware: Option<&Value>) -> String {
    let Some(h) = hardware else { return "- (the engine reported none)".into() };
    let memory = h["memory_bytes"].as_u64().map_or_else(|| "-".to_string(), gib);
    let gpus = match h["gpus"].as_array() {
        Some(gpus) if !gpus.is_empty() => format!("{} x {}", gpus.len(), text(&gpus[0]["name"])),
        _ => "no GPU".into(),
    };
    format!(
        "{}, {} CPUs, {memory}, {gpus}; driver {}, CUDA {}, cuDNN {}, NCCL {}; world size {} ({} replicas x {}, {})",
        text(&h["cpu_model"]),
        text(&h["cpu_count"]),
        text(&h["driver"]),
        text(&h["cuda"]),
        text(&h["cudnn"]),
        text(&h["nccl"]),
        text(&h["world_size"]),
        text(&h["replicas"]),
        text(&h["processes_per_replica"]),
        text(&h["backend"]),
    )
}

/// Bytes as GiB with one decimal: a machine's memory is rarely a round number of anything.
fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

fn seeds(seeds: Option<&Value>) -> String {
    let Some(s) = seeds else { return "- (the engine reported none)".into() };
    let ranks = s["rank_seeds"].as_array().map(|r| format!(", {} rank seeds", r.len())).unwrap_or_default();
    format!(
        "seed {}{ranks}; deterministic {}, cuBLAS workspace {}",
        text(&s["seed"]),
        text(&s["deterministic"]),
        text(&s["cublas_workspace_config"])
    )
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
            "data:        /d content sha256:ee (7 shards, 900 samples); epoch 0: rank 0 reads 2 shards, rank 1 reads 1 shards",
            "7 packages: torch 2.15.0; a 1, b 2, c 3, d 4, e 5, and 1 more (-o json lists all)",
            "Xeon, 8 CPUs, 1.0 GiB, no GPU; driver -, CUDA 13.2, cuDNN 9.26.0, NCCL -; world size 2 (2 replicas x 1, gloo)",
            "seeds:       seed 3, 2 rank seeds; deterministic false",
            "trainyard:   0.1.0 (commit unknown); engine pytorch-ddp 1.4.0",
        ] {
            assert!(text.contains(expected), "{expected:?} in:\n{text}");
        }
    }
}
