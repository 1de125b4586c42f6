//! `yard experiment`: hyperparameter searches whose trials are jobs. A search is written in a
//! YAML file (the shape of `POST /api/v1/experiments`; see docs/experiments.md):
//!
//! ```yaml
//! name: lr-search
//! template: pytorch-ddp
//! params: {data: /data/shards}
//! space:
//!   lr: {type: float, min: 0.0001, max: 0.1, log: true}
//! searcher: {method: asha, metric: loss, max_length: 300, max_trials: 16, divisor: 4}
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use trainyard_core::experiments::{
    Experiment, ExperimentCreate, ExperimentDetail, ExperimentPreview, ExperimentState, TrialStatus,
};

use crate::Output;
use crate::client::Client;
use crate::output::{self, table, when};

#[derive(Subcommand)]
pub enum ExperimentCommand {
    /// Start a search from a YAML file; `--wait` follows it to its end (exit 1 unless it
    /// completed).
    Create {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        #[arg(long)]
        wait: bool,
    },
    /// What a search would cost at most: rungs, trials per rung, steps, GPU-hours, wall time.
    Preview {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
    },
    /// Your tenant's experiments.
    Ls,
    /// An experiment's trials: state, rung, metric per rung, parameters; the best so far.
    Show {
        id: String,
    },
    /// No new runs until resumed; runs under way finish their rung.
    Pause {
        id: String,
    },
    Resume {
        id: String,
    },
    /// End the search and cancel every trial still queued or running.
    Cancel {
        id: String,
    },
}

pub async fn experiment(client: &Client, out: Output, command: ExperimentCommand) -> anyhow::Result<ExitCode> {
    match command {
        ExperimentCommand::Create { file, wait } => {
            let body = read_search(&file)?;
            let experiment: Experiment = client.post("/api/v1/experiments", &body).await?;
            if !wait {
                return output::print(out, &experiment, |e| {
                    format!("created experiment {} ({}): `yard experiment show {}`\n", e.name, e.id, e.id)
                });
            }
            eprintln!("created experiment {} ({})", experiment.name, experiment.id);
            follow(client, out, &experiment.id.to_string()).await
        }
        ExperimentCommand::Preview { file } => {
            let body = read_search(&file)?;
            let preview: ExperimentPreview = client.post("/api/v1/experiments/preview", &body).await?;
            output::print(out, &preview, preview_text)
        }
        ExperimentCommand::Ls => {
            let list: Vec<Experiment> = client.get("/api/v1/experiments").await?;
            output::print(out, &list, |list| experiments_table(list))
        }
        ExperimentCommand::Show { id } => {
            let detail: ExperimentDetail = client.get(&format!("/api/v1/experiments/{id}")).await?;
            output::print(out, &detail, experiment_detail)
        }
        ExperimentCommand::Pause { id } => command_post(client, out, &id, "pause").await,
        ExperimentCommand::Resume { id } => command_post(client, out, &id, "resume").await,
        ExperimentCommand::Cancel { id } => command_post(client, out, &id, "cancel").await,
    }
}

async fn command_post(client: &Client, out: Output, id: &str, verb: &str) -> anyhow::Result<ExitCode> {
    let experiment: Experiment =
        client.post(&format!("/api/v1/experiments/{id}/{verb}"), &serde_json::json!({})).await?;
    output::print(out, &experiment, |e| format!("experiment {} is {}\n", e.name, e.state.as_str()))
}

/// Prints a line each time the search moves (a run ends, a trial starts or is promoted), then
/// the experiment as `show` prints it.
async fn follow(client: &Client, out: Output, id: &str) -> anyhow::Result<ExitCode> {
    let mut last = String::new();
    loop {
        let detail: ExperimentDetail = client.get(&format!("/api/v1/experiments/{id}")).await?;
        let running = detail.trials.iter().filter(|t| t.status == TrialStatus::Running).count();
        let line = format!(
            "{}: {} trials, {} running, {} events{}",
            detail.experiment.state.as_str(),
            detail.trials.len(),
            running,
            detail.events,
            detail
                .experiment
                .best
                .as_ref()
                .map(|b| format!(", best {} (trial {})", b.value, b.trial))
                .unwrap_or_default()
        );
        if line != last {
            eprintln!("{line}");
            last = line;
        }
        if detail.experiment.state.is_over() {
            let completed = detail.experiment.state == ExperimentState::Completed;
            output::print(out, &detail, experiment_detail)?;
            return Ok(if completed { ExitCode::SUCCESS } else { ExitCode::FAILURE });
        }
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
}

fn read_search(file: &Path) -> anyhow::Result<ExperimentCreate> {
    let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    serde_yaml_ng::from_str(&text)
        .with_context(|| format!("{} is not a search: see docs/experiments.md", file.display()))
}

pub fn experiments_table(list: &[Experiment]) -> String {
    if list.is_empty() {
        return "no experiments yet: `yard experiment create -f search.yaml`\n".into();
    }
    let mut t = table(&["ID", "NAME", "TEMPLATE", "METHOD", "STATE", "BEST", "CREATED"]);
    for e in list {
        t.add_row(vec![
            e.id.to_string()[..8].to_string(),
            e.name.clone(),
            e.template.clone(),
            serde_json::to_value(e.searcher.method).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default(),
            e.state.as_str().to_string(),
            e.best.as_ref().map(|b| format!("{:.4} (trial {})", b.value, b.trial)).unwrap_or_else(|| "-".into()),
            when(e.created_at),
        ]);
    }
    format!("{t}\n")
}

pub fn experiment_detail(d: &ExperimentDetail) -> String {
    let e = &d.experiment;
    let mut text = format!(
        "experiment {} ({})\ntemplate {}@{}, {} on {} ({}), {}\n",
        e.name,
        e.id,
        e.template,
        e.template_version,
        serde_json::to_value(e.searcher.method).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default(),
        e.searcher.metric,
        serde_json::to_value(e.searcher.goal).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default(),
        e.state.as_str(),
    );
    if let Some(reason) = &e.reason {
        text += &format!("reason: {reason}\n");
    }
    let rungs: Vec<String> = d.ladder.rungs.iter().map(|r| format!("{} steps x{}", r.length, r.trials)).collect();
    text += &format!("rungs: {}; GPU-hours so far {:.2}\n", rungs.join(" > "), d.gpu_hours);
    text += if e.spare {
        "trials run on spare room: outside the quota, stopped first when a job with quota needs it\n"
    } else {
        "trials count in the tenant's quota\n"
    };
    if let Some(best) = &e.best {
        text += &format!(
            "best: trial {} at rung {}: {} {}  {}\n",
            best.trial,
            best.rung,
            e.searcher.metric,
            best.value,
            params_text(&best.params)
        );
    }
    let mut t = table(&["TRIAL", "STATUS", "RUNG", &e.searcher.metric, "PARAMETERS"]);
    for trial in &d.trials {
        let values: Vec<String> =
            trial.runs.iter().map(|r| r.value.map_or_else(|| "-".into(), |v| format!("{v:.4}"))).collect();
        t.add_row(vec![
            trial.trial.to_string(),
            serde_json::to_value(trial.status).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default(),
            trial.rung.to_string(),
            values.join(" > "),
            // Cut so that a row stays one line of an 80-column terminal; `-o json` has them whole.
            output::cut(&params_text(&trial.params), TRIAL_PARAMS_CHARS),
        ]);
    }
    text += &format!("{t}\n");
    // Below the table, which stays within 80 columns.
    let preempted: Vec<String> = d
        .trials
        .iter()
        .filter(|t| t.preemptions > 0)
        .map(|t| format!("trial {} x{}", t.trial, t.preemptions))
        .collect();
    if !preempted.is_empty() {
        text += &format!("preempted, each resumed from its checkpoint: {}\n", preempted.join(", "));
    }
    text
}

/// The most characters of a trial's parameters in `show`'s table.
const TRIAL_PARAMS_CHARS: usize = 30;

fn params_text(params: &serde_json::Map<String, serde_json::Value>) -> String {
    params.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
}

pub fn preview_text(p: &ExperimentPreview) -> String {
    let mut t = table(&["RUNG", "STOPS AT STEP", "TRIALS", "AT MOST"]);
    for r in &p.ladder.rungs {
        t.add_row(vec![r.rung.to_string(), r.length.to_string(), r.trials.to_string(), r.trials_at_most.to_string()]);
    }
    let hours = |h: Option<f64>| h.map_or_else(|| "unknown".into(), |h| format!("{h:.2}"));
    let wall = p
        .wall_seconds_at_most
        .map_or_else(|| "unknown".into(), |s| output::elapsed(chrono::TimeDelta::seconds(s.round() as i64)));
    let mut text = format!(
        "{t}\n{} trials, {} training steps typically, {} at most, {} GPUs a trial\nGPU-hours at most: {}; wall time at most: {} ({} trials side by side)\n",
        p.ladder.trials,
        p.ladder.steps,
        p.ladder.steps_at_most,
        p.gpus_per_trial,
        hours(p.gpu_hours_at_most),
        wall,
        p.concurrent_trials
    );
    for note in &p.notes {
        text += &format!("note: {note}\n");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A search's trials as `yard experiment show` prints them: one line a row, within 80 columns.
    #[test]
    fn the_trials_table_fits_an_80_column_terminal() {
        let search: ExperimentCreate = serde_json::from_value(serde_json::json!({
            "name": "lr-search", "template": "pytorch-ddp",
            "space": {"lr": {"type": "float", "min": 0.0001, "max": 0.1, "log": true}},
            "searcher": {"metric": "loss", "max_length": 16, "max_trials": 2, "divisor": 2, "max_rungs": 2},
        }))
        .unwrap();
        let trial = |n: u32, values: &[f64]| {
            serde_json::json!({
                "trial": n, "status": "completed", "rung": values.len() - 1, "failure": null,
                "params": {"lr": 0.008598781572851318, "batch_size": 64, "precision": "bf16"},
                "runs": values.iter().enumerate().map(|(rung, v)| serde_json::json!({
                    "rung": rung, "length": 8 * (rung + 1), "job_id": null, "job_state": "succeeded", "value": v,
                })).collect::<Vec<_>>(),
            })
        };
        let detail: ExperimentDetail = serde_json::from_value(serde_json::json!({
            "experiment": {
                "id": uuid::Uuid::nil(), "name": search.name, "template": "pytorch-ddp", "template_version": "1.10.0",
                "state": "completed", "reason": null, "best": null, "params": {}, "space": search.space,
                "searcher": search.searcher, "budget_gpu_hours": null, "created_by": uuid::Uuid::nil(),
                "created_at": "2026-12-02T00:00:00Z", "ended_at": null,
            },
            "trials": [trial(0, &[0.857742428779602]), trial(1, &[0.2928217053413391, 0.07532963156700134])],
            "ladder": {"rungs": [], "trials": 2, "steps": 24, "steps_at_most": 24},
            "gpu_hours": 0.0, "events": 3,
        }))
        .unwrap();
        let text = experiment_detail(&detail);
        let table: Vec<&str> = text.lines().skip_while(|l| !l.contains("TRIAL")).collect();
        // Borders or none (none when piped): a row is one line.
        assert_eq!(table.iter().filter(|l| l.contains("completed")).count(), 2, "{text}");
        assert!(table.len() <= 2 + 3, "a header, two rows and the borders: {text}");
        for line in &table {
            assert!(line.chars().count() <= 80, "{} columns: {line}\n{text}", line.chars().count());
        }
    }
}
