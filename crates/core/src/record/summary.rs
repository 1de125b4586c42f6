//! A run record in words, a fact a line: what `yard jobs show --record` prints and what the
//! job page shows, from one code so that the two say the same. Sizes are in human units; the
//! whole record is in `-o json` and the page's JSON link.

use std::fmt::Write;

use serde_json::Value;

use super::RunRecord;
use crate::resources::human_memory;

/// How many ranks' shard assignments are named (all of them are in the JSON).
const RANKS_SHOWN: usize = 4;

/// A free-form value as text: strings bare, null (or absent) as `-`.
pub fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The code archive shipped with the job, `sha256:... (12 KiB)`; none when it shipped none.
pub fn code(record: &RunRecord) -> Option<String> {
    record.code.as_ref().map(|c| format!("{} ({})", c.digest, human_memory(c.size_bytes)))
}

/// Each registered dataset version the parameters named: `photos@1 sha256:... (parameter data)`.
pub fn datasets(record: &RunRecord) -> Vec<String> {
    record
        .datasets
        .iter()
        .map(|d| format!("{}@{} {} (parameter {})", d.name, d.version, d.content_hash, d.param))
        .collect()
}

/// The data the engine read, with its content hash and the first ranks' shares of the epoch it
/// began with; none when the engine reported none.
pub fn data(record: &RunRecord) -> Option<String> {
    let d = record.data.as_ref()?;
    let mut line = format!(
        "{} read with content hash {} ({} shards, {} samples)",
        text(&d["path"]),
        text(&d["content_hash"]),
        text(&d["shards"]),
        text(&d["samples"])
    );
    if let Some(ranks) = d["assignment"]["ranks"].as_array() {
        let each: Vec<String> = ranks
            .iter()
            .take(RANKS_SHOWN)
            .map(|r| {
                let shards = r["shards"].as_array().map_or(0, Vec::len);
                format!("rank {} reads {shards} shards", text(&r["rank"]))
            })
            .collect();
        let more = if ranks.len() > RANKS_SHOWN { format!(", ... ({} ranks)", ranks.len()) } else { String::new() };
        let _ = write!(line, "; epoch {}: {}{more}", text(&d["assignment"]["epoch"]), each.join(", "));
    }
    Some(line)
}

/// The image and the executor that ran it, with the digests the replicas ran when known.
pub fn image(record: &RunRecord) -> String {
    let mut image = format!("{} (executor {})", record.image, record.executor);
    if !record.image_digests.is_empty() {
        let _ = write!(image, ", ran {}", record.image_digests.join(", "));
    }
    image
}

/// The interpreter and the platform, `CPython 3.12.3 (/venv/bin/python) on Linux-x86_64`;
/// none until the engine reports them.
pub fn python(record: &RunRecord) -> Option<String> {
    let env = record.environment.as_ref()?;
    let python = env.python.as_ref().map_or_else(
        || "-".to_string(),
        |p| format!("{} {} ({})", text(&p["implementation"]), text(&p["version"]), text(&p["executable"])),
    );
    Some(format!("{python} on {}", env.platform.as_deref().unwrap_or("-")))
}

/// The user's code as the engine loaded it: the module (or the template's example), its hash,
/// and the repository and commit it came from.
pub fn user_code(record: &RunRecord) -> Option<String> {
    let user = record.user_code.as_ref()?;
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
    Some(parts.join(" "))
}

/// The machine, its GPUs and drivers, and how the job spread over them.
pub fn hardware(record: &RunRecord) -> Option<String> {
    let h = record.hardware.as_ref()?;
    let memory = h["memory_bytes"].as_u64().map_or_else(|| "-".to_string(), human_memory);
    let gpus = match h["gpus"].as_array() {
        Some(gpus) if !gpus.is_empty() => format!("{} × {}", gpus.len(), text(&gpus[0]["name"])),
        _ => "no GPU".into(),
    };
    Some(format!(
        "{}, {} CPUs, {memory} of memory, {gpus}; driver {}, CUDA {}, cuDNN {}, NCCL {}; world size {} ({} replicas × {}, {})",
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
    ))
}

/// The seed, how many ranks' seeds were derived, and the determinism settings.
pub fn seeds(record: &RunRecord) -> Option<String> {
    let s = record.seeds.as_ref()?;
    let ranks = s["rank_seeds"].as_array().map(|r| format!(", {} rank seeds", r.len())).unwrap_or_default();
    Some(format!(
        "seed {}{ranks}; deterministic {}, cuBLAS workspace {}",
        text(&s["seed"]),
        text(&s["deterministic"]),
        text(&s["cublas_workspace_config"])
    ))
}

/// The decode settings the engine trained with, `2 workers × prefetch 4 (auto: workers,
/// prefetch; settled)`; none when the engine reported none (engines before pytorch-ddp 1.5.0).
pub fn input_pipeline(record: &RunRecord) -> Option<String> {
    let p = record.engine.as_ref()?.get("input_pipeline")?;
    let tuned: Vec<String> = p["autotuned"].as_array().map(|a| a.iter().map(text).collect()).unwrap_or_default();
    let how = if tuned.is_empty() {
        "pinned".to_string()
    } else {
        let settled = if p["settled"].as_bool() == Some(true) { "settled" } else { "not settled when recorded" };
        format!("auto: {}; {settled}", tuned.join(", "))
    };
    Some(format!("{} workers × prefetch {} ({how})", text(&p["workers"]), text(&p["prefetch"])))
}

/// The Trainyard that launched the attempt, `0.1.0 (commit 1a2b3c4)`.
pub fn trainyard(record: &RunRecord) -> String {
    format!("{} (commit {})", record.trainyard.version, record.trainyard.commit.as_deref().unwrap_or("unknown"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn record() -> RunRecord {
        serde_json::from_value(json!({
            "template": null, "params": null,
            "spec": {"command": ["python3"], "args": [], "env": {}, "resources": {"cpu": 1, "memory": "1Gi", "gpus": 0}, "replicas": 1},
            "spec_hash": "sha256:dd", "code": {"digest": "sha256:c0", "size_bytes": 25_276_502},
            "datasets": [{"param": "data", "name": "photos", "version": "1", "uri": "/d", "content_hash": "sha256:ee"}],
            "executor": "local", "image": "local", "image_digests": [], "trainyard": {"version": "0.1.0", "commit": null},
            "environment": {"packages": {}, "python": {"version": "3.12.3", "executable": "/v/python", "implementation": "CPython"}},
            "hardware": {"cpu_model": "Xeon", "cpu_count": 8, "memory_bytes": 25_276_502_016u64,
                         "gpus": [{"name": "H100"}, {"name": "H100"}], "driver": "580.1", "cuda": "13.2", "cudnn": null,
                         "nccl": "2.27", "world_size": 4, "replicas": 2, "processes_per_replica": 2, "backend": "nccl"},
            "seeds": {"seed": 3, "rank_seeds": [1, 2, 3, 4], "deterministic": true},
            "data": {"path": "/d", "content_hash": "sha256:ee", "shards": 7, "samples": 900,
                     "assignment": {"epoch": 0, "ranks": (0..6).map(|r| json!({"rank": r, "shards": [r]})).collect::<Vec<_>>()}},
            "user_code": {"module": "train.py", "module_sha256": "sha256:ab", "repository": "git@x:y.git", "commit": null},
            "engine": null
        }))
        .unwrap()
    }

    #[test]
    fn a_record_reads_in_human_units_a_fact_a_line() {
        let r = record();
        assert_eq!(code(&r).unwrap(), "sha256:c0 (24.1 MiB)", "sizes in human units, never bytes or Ki");
        assert_eq!(datasets(&r), ["photos@1 sha256:ee (parameter data)"]);
        assert_eq!(
            data(&r).unwrap(),
            "/d read with content hash sha256:ee (7 shards, 900 samples); epoch 0: rank 0 reads 1 shards, \
             rank 1 reads 1 shards, rank 2 reads 1 shards, rank 3 reads 1 shards, ... (6 ranks)"
        );
        assert_eq!(python(&r).unwrap(), "CPython 3.12.3 (/v/python) on -", "no platform reported");
        assert_eq!(user_code(&r).unwrap(), "train.py sha256:ab from git@x:y.git at -");
        assert_eq!(
            hardware(&r).unwrap(),
            "Xeon, 8 CPUs, 23.5 GiB of memory, 2 × H100; driver 580.1, CUDA 13.2, cuDNN -, NCCL 2.27; \
             world size 4 (2 replicas × 2, nccl)"
        );
        assert_eq!(seeds(&r).unwrap(), "seed 3, 4 rank seeds; deterministic true, cuBLAS workspace -");
        assert_eq!(image(&r), "local (executor local)");
        assert_eq!(trainyard(&r), "0.1.0 (commit unknown)");
        assert_eq!(input_pipeline(&r), None, "an engine that reported no input pipeline");
    }

    #[test]
    fn the_input_pipeline_says_what_autotune_chose_and_whether_it_settled() {
        let mut r = record();
        r.engine = Some(json!({"name": "pytorch-ddp", "version": "1.5.0",
            "input_pipeline": {"workers": 2, "prefetch": 4, "autotuned": ["workers", "prefetch"], "settled": true}}));
        assert_eq!(input_pipeline(&r).unwrap(), "2 workers × prefetch 4 (auto: workers, prefetch; settled)");
        r.engine =
            Some(json!({"input_pipeline": {"workers": 3, "prefetch": 2, "autotuned": ["workers"], "settled": false}}));
        assert_eq!(input_pipeline(&r).unwrap(), "3 workers × prefetch 2 (auto: workers; not settled when recorded)");
        r.engine = Some(json!({"input_pipeline": {"workers": 0, "prefetch": 4, "autotuned": [], "settled": true}}));
        assert_eq!(input_pipeline(&r).unwrap(), "0 workers × prefetch 4 (pinned)");
    }

    #[test]
    fn what_the_engine_has_not_reported_is_absent_not_invented() {
        let mut r = record();
        r.code = None;
        r.environment = None;
        r.hardware = None;
        r.seeds = None;
        r.data = None;
        r.user_code = None;
        let absent = [code(&r), python(&r), hardware(&r), seeds(&r), data(&r), user_code(&r)];
        assert!(absent.iter().all(Option::is_none), "{absent:?}");
    }
}
