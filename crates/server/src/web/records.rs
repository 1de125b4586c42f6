//! The run record on a job's page: the latest attempt's record in brief (its hash, template,
//! spec hash, code, data, packages, hardware, seeds), and the whole of it as JSON for the
//! browser, which has a session rather than the API's token (`GET /api/v1/jobs/{id}/record`
//! answers the same for scripts).

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use trainyard_core::error::ObjectKind;
use trainyard_core::record::AttemptRunRecord;
use trainyard_core::resources::human_memory;

use super::{WebAuth, WebResult};
use crate::AppState;
use crate::extract::parse_id;

/// An attempt's record as the job page shows it: one line a fact, every package listed.
pub struct RecordSummary {
    pub attempt: i32,
    pub hash: String,
    /// Whether the engine posted its part (environment, hardware, seeds, the data it read).
    pub engine_part: bool,
    /// `name version` and the digest; none for a direct submit.
    pub template: Option<String>,
    pub template_digest: String,
    pub spec_hash: String,
    pub code: Option<String>,
    pub user_code: Option<String>,
    pub data: Vec<String>,
    pub image: String,
    pub python: Option<String>,
    pub packages: Vec<(String, String)>,
    pub hardware: Option<String>,
    pub seeds: Option<String>,
    pub trainyard: String,
    /// A rerun's inputs it could not pin, accepted by whoever ran it.
    pub accepted_unpinned: Vec<String>,
}

impl RecordSummary {
    pub fn of(attempt: &AttemptRunRecord) -> RecordSummary {
        let r = &attempt.record;
        let mut data: Vec<String> = r
            .datasets
            .iter()
            .map(|d| format!("{}@{} {} (parameter {})", d.name, d.version, d.content_hash, d.param))
            .collect();
        if let Some(d) = &r.data {
            data.push(format!(
                "{} read with content hash {} ({} shards, {} samples)",
                text(&d["path"]),
                text(&d["content_hash"]),
                text(&d["shards"]),
                text(&d["samples"])
            ));
        }
        let mut image = format!("{} (executor {})", r.image, r.executor);
        if !r.image_digests.is_empty() {
            image.push_str(&format!(", ran {}", r.image_digests.join(", ")));
        }
        RecordSummary {
            attempt: attempt.attempt,
            hash: attempt.record_hash.clone(),
            engine_part: attempt.engine_recorded_at.is_some(),
            template: r.template.as_ref().map(|t| format!("{} {}", t.name, t.version)),
            template_digest: r.template.as_ref().map(|t| t.digest.clone()).unwrap_or_default(),
            spec_hash: r.spec_hash.clone(),
            code: r.code.as_ref().map(|c| format!("{} ({})", c.digest, human_memory(c.size_bytes))),
            user_code: r.user_code.as_ref().map(user_code),
            data,
            image,
            python: r.environment.as_ref().map(|env| {
                let python = env.python.as_ref().map_or_else(
                    || "-".to_string(),
                    |p| format!("{} {} ({})", text(&p["implementation"]), text(&p["version"]), text(&p["executable"])),
                );
                format!("{python} on {}", env.platform.as_deref().unwrap_or("-"))
            }),
            packages: r
                .environment
                .as_ref()
                .map(|env| env.packages.iter().map(|(n, v)| (n.clone(), v.clone())).collect())
                .unwrap_or_default(),
            hardware: r.hardware.as_ref().map(hardware),
            seeds: r.seeds.as_ref().map(|s| {
                let ranks = s["rank_seeds"].as_array().map(|r| format!(", {} rank seeds", r.len())).unwrap_or_default();
                format!("seed {}{ranks}; deterministic {}", text(&s["seed"]), text(&s["deterministic"]))
            }),
            trainyard: format!(
                "{} (commit {})",
                r.trainyard.version,
                r.trainyard.commit.as_deref().unwrap_or("unknown")
            ),
            accepted_unpinned: r.accepted_unpinned.iter().map(ToString::to_string).collect(),
        }
    }
}

/// A JSON value as text: strings bare, null as `-`.
fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
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

fn hardware(h: &Value) -> String {
    let memory = h["memory_bytes"].as_u64().map_or_else(|| "-".to_string(), human_memory);
    let gpus = match h["gpus"].as_array() {
        Some(gpus) if !gpus.is_empty() => format!("{} × {}", gpus.len(), text(&gpus[0]["name"])),
        _ => "no GPU".into(),
    };
    format!(
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
    )
}

/// Every attempt's record as JSON, as `GET /api/v1/jobs/{id}/record` answers.
pub async fn record_json(State(state): State<AppState>, auth: WebAuth, Path(id): Path<String>) -> WebResult<Response> {
    let job_id = parse_id(&id, ObjectKind::Job)?;
    let records = state.app.run_records(&auth.caller, job_id).await?;
    Ok(([(header::CACHE_CONTROL, "no-store")], axum::Json(records)).into_response())
}
