//! How `yard` shows things: JSON for scripts, tables and short lines for people.

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use comfy_table::presets::UTF8_BORDERS_ONLY;
use comfy_table::{ContentArrangement, Table};
use serde::Serialize;
use trainyard_core::api::{Job, JobAttempt, JobEvent, JobPage, TokenInfo};

use crate::Output;

pub fn print<T: Serialize>(out: Output, value: &T, human: impl FnOnce(&T) -> String) -> anyhow::Result<ExitCode> {
    match out {
        Output::Json => println!("{}", serde_json::to_string_pretty(value)?),
        Output::Table => print!("{}", human(value)),
    }
    Ok(ExitCode::SUCCESS)
}

fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table.load_style(UTF8_BORDERS_ONLY).set_content_arrangement(ContentArrangement::Dynamic).set_header(header);
    table
}

fn when(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S").to_string()
}

pub fn jobs_table(page: &JobPage) -> String {
    let mut t = table(&["ID", "NAME", "STATE", "REPLICAS", "GPUS", "SUBMITTED", "REASON"]);
    for job in &page.items {
        t.add_row(vec![
            job.id.to_string(),
            job.name.clone(),
            job.state.to_string(),
            job.spec.replicas.to_string(),
            (job.spec.resources.gpus * job.spec.replicas).to_string(),
            when(job.created_at),
            job.reason.clone().unwrap_or_default(),
        ]);
    }
    let mut text = format!("{t}\n");
    if let Some(cursor) = &page.next_cursor {
        text.push_str(&format!("more: yard jobs ls --cursor {cursor}\n"));
    }
    text
}

pub fn job_detail(job: &Job, attempts: &[JobAttempt], events: &[JobEvent]) -> String {
    let spec = &job.spec;
    let mut text = format!(
        "{id}  {name}\nstate:     {state}{reason}\ncommand:   {argv}\nreplicas:  {replicas} x (cpu {cpu}, memory {memory}, gpus {gpus})\npriority:  {priority}   restarts: {restarts} of {max}\nsubmitted: {submitted} by {by}\n",
        id = job.id,
        name = job.name,
        state = job.state,
        reason = job.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default(),
        argv = serde_json::to_string(&spec.argv()).unwrap_or_default(),
        replicas = spec.replicas,
        cpu = spec.resources.cpu,
        memory = spec.resources.memory,
        gpus = spec.resources.gpus,
        priority = job.priority,
        restarts = job.restart_count,
        max = job.max_restarts,
        submitted = when(job.created_at),
        by = job.created_by,
    );
    if !attempts.is_empty() {
        let mut t = table(&["ATTEMPT", "STARTED", "ENDED", "EXIT CODES", "REASON"]);
        for a in attempts {
            let codes: Vec<String> =
                a.exit_codes.iter().map(|c| c.map(|c| c.to_string()).unwrap_or_else(|| "-".into())).collect();
            t.add_row(vec![
                a.attempt.to_string(),
                when(a.started_at),
                a.ended_at.map(when).unwrap_or_default(),
                codes.join(","),
                a.reason.clone().unwrap_or_default(),
            ]);
        }
        text.push_str(&format!("\n{t}\n"));
    }
    let mut t = table(&["#", "AT", "FROM", "TO", "BY", "WHY"]);
    for e in events {
        t.add_row(vec![
            e.seq.to_string(),
            when(e.at),
            e.from_state.map(|s| s.to_string()).unwrap_or_default(),
            e.to_state.to_string(),
            e.actor.clone(),
            e.reason.clone().unwrap_or_default(),
        ]);
    }
    text.push_str(&format!("\n{t}\n"));
    text
}

pub fn tokens_table(tokens: &Vec<TokenInfo>) -> String {
    let mut t = table(&["ID", "NAME", "CREATED", "EXPIRES", "LAST USED", "REVOKED"]);
    for token in tokens {
        t.add_row(vec![
            token.id.to_string(),
            token.name.clone(),
            when(token.created_at),
            token.expires_at.map(when).unwrap_or_else(|| "never".into()),
            token.last_used_at.map(when).unwrap_or_default(),
            token.revoked_at.map(when).unwrap_or_default(),
        ]);
    }
    format!("{t}\n")
}
