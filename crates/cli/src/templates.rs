//! `yard templates ...` and `yard run`: browsing, scaffolding, publishing and running templates.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};
use base64::Engine;
use serde_json::Value;
use trainyard_core::api::{DryRun, Job, Schedule, TemplateDetail, TemplateRun, TemplateSummary, TemplateUpload};
use trainyard_templates::{Bundle, MANIFEST_FILE, Template};

use crate::client::Client;

/// `NAME` or `NAME@VERSION`.
pub fn split_reference(reference: &str) -> (&str, Option<&str>) {
    match reference.split_once('@') {
        Some((name, version)) => (name, Some(version)),
        None => (reference, None),
    }
}

pub async fn show(client: &Client, reference: &str) -> anyhow::Result<TemplateDetail> {
    let (name, version) = split_reference(reference);
    let mut path = format!("/api/v1/templates/{name}");
    if let Some(version) = version {
        path.push('?');
        path.push_str(&serde_urlencoded::to_string([("version", version)])?);
    }
    client.get(&path).await
}

pub async fn list(client: &Client) -> anyhow::Result<Vec<TemplateSummary>> {
    client.get("/api/v1/templates").await
}

/// Parameters from `-f params.yaml` and then `--set key=value` (which wins). A `--set` value
/// that starts with `[` is a JSON list; anything else is a string, which the server reads as
/// the parameter's type, so the CLI and the API give the same messages.
pub fn params_of(file: Option<&Path>, sets: &[String]) -> anyhow::Result<serde_json::Map<String, Value>> {
    let mut params = serde_json::Map::new();
    if let Some(file) = file {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let value: Value = serde_yaml_ng::from_str(&text).with_context(|| format!("{} is not YAML", file.display()))?;
        match value {
            Value::Object(map) => params.extend(map),
            Value::Null => {}
            _ => bail!("{} must hold a mapping of parameter names to values", file.display()),
        }
    }
    for set in sets {
        let Some((key, value)) = set.split_once('=') else {
            bail!("--set {set:?}: expected key=value");
        };
        let value = if value.trim_start().starts_with('[') {
            serde_json::from_str(value)
                .with_context(|| format!("--set {key}: a value starting with '[' must be a JSON list"))?
        } else {
            Value::String(value.to_string())
        };
        params.insert(key.to_string(), value);
    }
    Ok(params)
}

// Returned once per command: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum RunResult {
    DryRun(DryRun),
    Job(Job),
}

pub async fn what_if(client: &Client, reference: &str, run: &TemplateRun) -> anyhow::Result<Schedule> {
    let (name, _) = split_reference(reference);
    client.post(&format!("/api/v1/templates/{name}/jobs?what_if=true"), run).await
}

pub async fn run(client: &Client, reference: &str, run: &TemplateRun, dry_run: bool) -> anyhow::Result<RunResult> {
    let (name, _) = split_reference(reference);
    if dry_run {
        Ok(RunResult::DryRun(client.post(&format!("/api/v1/templates/{name}/jobs?dry_run=true"), run).await?))
    } else {
        // Every run is keyed, so that one sent again (after a 503) makes no second job.
        let mut run = run.clone();
        run.idempotency_key.get_or_insert_with(idempotency_key);
        Ok(RunResult::Job(client.post_idempotent(&format!("/api/v1/templates/{name}/jobs"), &run).await?))
    }
}

/// An idempotency key for a submit the user gave none: unique to this submit.
pub fn idempotency_key() -> String {
    format!("yard-{}", uuid::Uuid::now_v7())
}

/// Reads a template folder: `template.yaml` and every other file below it (hidden ones aside).
pub fn bundle_from_dir(dir: &Path) -> anyhow::Result<Bundle> {
    let manifest = std::fs::read_to_string(dir.join(MANIFEST_FILE))
        .with_context(|| format!("{} has no {MANIFEST_FILE}", dir.display()))?;
    let mut files = BTreeMap::new();
    collect(dir, dir, &mut files)?;
    Ok(Bundle { manifest, files })
}

fn collect(root: &Path, dir: &Path, files: &mut BTreeMap<String, Vec<u8>>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "__pycache__" {
            continue;
        }
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            collect(root, &path, files)?;
        } else {
            let relative = path.strip_prefix(root)?.to_string_lossy().replace('\\', "/");
            if relative != MANIFEST_FILE {
                files.insert(relative, std::fs::read(&path)?);
            }
        }
    }
    Ok(())
}

/// Checks a folder locally (the same checks the server makes) and publishes it.
pub async fn push(client: &Client, dir: &Path) -> anyhow::Result<TemplateDetail> {
    let bundle = bundle_from_dir(dir)?;
    Template::load(&bundle).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    let upload = TemplateUpload {
        manifest: bundle.manifest,
        files: bundle
            .files
            .into_iter()
            .map(|(path, content)| (path, base64::engine::general_purpose::STANDARD.encode(content)))
            .collect(),
    };
    client.post("/api/v1/templates", &upload).await
}

/// Writes a new template folder that loads as it is: a manifest with one parameter of each
/// common kind and a small Python engine that reports a metric.
pub fn init(name: &str) -> anyhow::Result<()> {
    let dir = Path::new(name);
    if dir.exists() {
        bail!("{name} exists already; choose a new folder name");
    }
    let manifest = format!(
        r#"# A Trainyard task template. Format: docs/templates.md
name: {name}
version: 0.1.0
description: Describe in one sentence what a job from this template does.
parameters:
  epochs:
    type: int
    default: 3
    min: 1
    max: 1000
    help: Passes over the data.
  lr:
    type: float
    default: 0.001
    min: 0.0
    max: 1.0
    help: Learning rate.
  precision:
    type: enum
    choices: [fp32, bf16]
    default: fp32
    help: Numeric precision.
  replicas:
    type: int
    default: 1
    min: 1
    max: 64
    help: How many replicas train together.
resources:
  cpu: 1
  memory: 2Gi
  gpus: 0
replicas: {{param: replicas}}
command: [python3, template/engine/main.py, --epochs, "{{{{ epochs }}}}", --lr, "{{{{ lr }}}}", --precision, "{{{{ precision }}}}"]
files: [engine/]
outputs:
  checkpoints:
    path: checkpoints
    description: Model checkpoints.
expected_runtime: 10m
"#
    );
    let engine = r#""""The engine of this template: replace the body of train() with your own logic."""
import argparse
import json
import os
import urllib.request


def report(points):
    """Posts metric points to Trainyard with the job's own token (set for every replica)."""
    url, token, job = os.environ.get("TRAINYARD_URL"), os.environ.get("TRAINYARD_TOKEN"), os.environ.get("TRAINYARD_JOB_ID")
    if not (url and token and job) or os.environ.get("RANK", "0") != "0":
        return
    request = urllib.request.Request(
        f"{url}/api/v1/jobs/{job}/metrics",
        data=json.dumps({"points": points}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=10).read()


def train(args):
    loss = 1.0
    for epoch in range(args.epochs):
        loss *= 1.0 - min(args.lr * 100, 0.5)
        print(f"epoch {epoch} loss {loss:.4f}", flush=True)
        report([{"step": epoch, "name": "loss", "value": loss}])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--precision", choices=["fp32", "bf16"], required=True)
    train(parser.parse_args())
"#;
    std::fs::create_dir_all(dir.join("engine"))?;
    std::fs::write(dir.join(MANIFEST_FILE), manifest)?;
    std::fs::write(dir.join("engine/main.py"), engine)?;
    // What we scaffold must load; a failure here is a bug in yard.
    Template::load(&bundle_from_dir(dir)?).map_err(|e| anyhow::anyhow!("the scaffold does not load: {e}"))?;
    Ok(())
}
