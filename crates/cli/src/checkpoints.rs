//! `yard checkpoints`: the checkpoints a job wrote (step, size, time, path as the job sees it),
//! and one downloaded, streamed with a progress bar on a terminal.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;
use trainyard_core::api::JobCheckpoints;
use trainyard_core::resources::human_memory;

use crate::Output;
use crate::client::Client;
use crate::output;

#[derive(Subcommand)]
pub enum CheckpointsCommand {
    /// A job's checkpoints: step, size, time saved, path as the job sees it.
    Ls { job: String },
    /// Download one: JOB (its newest) or JOB:STEP, to its file name here or --output-file (`-`
    /// for stdout). Fine-tune from one with `yard run pytorch-ddp --set init_from=JOB:STEP`.
    Download {
        #[arg(value_name = "JOB[:STEP]")]
        checkpoint: String,
        /// Where to write it (`-O`, not `-o`: `-o` is yard's output format everywhere).
        #[arg(short = 'O', long)]
        output_file: Option<PathBuf>,
    },
}

pub async fn checkpoints(client: &Client, out: Output, command: CheckpointsCommand) -> anyhow::Result<ExitCode> {
    match command {
        CheckpointsCommand::Ls { job } => {
            let job = client.job_id(&job).await?;
            let list: JobCheckpoints = client.get(&format!("/api/v1/jobs/{job}/checkpoints")).await?;
            output::print(out, &list, output::checkpoints_table)
        }
        CheckpointsCommand::Download { checkpoint, output_file } => {
            let (job, step) = match checkpoint.split_once(':') {
                Some((job, step)) => {
                    let step: u64 = step
                        .parse()
                        .map_err(|_| anyhow::anyhow!("{checkpoint:?}: name a checkpoint as JOB or JOB:STEP"))?;
                    (job, Some(step))
                }
                None => (checkpoint.as_str(), None),
            };
            let job = client.job_id(job).await?;
            let list: JobCheckpoints = client.get(&format!("/api/v1/jobs/{job}/checkpoints")).await?;
            let chosen = match step {
                Some(step) => list.checkpoints.iter().find(|c| c.step == step).ok_or_else(|| {
                    let steps: Vec<String> = list.checkpoints.iter().map(|c| c.step.to_string()).collect();
                    anyhow::anyhow!("job {job} has no checkpoint at step {step}; it has: {}", steps.join(", "))
                })?,
                None => list.checkpoints.last().ok_or_else(|| {
                    anyhow::anyhow!(
                        "job {job} has no checkpoint{}",
                        list.note.map(|n| format!(": {n}")).unwrap_or_default()
                    )
                })?,
            };
            let name = chosen.path.rsplit('/').next().unwrap_or("checkpoint.pt");
            let target = output_file.unwrap_or_else(|| PathBuf::from(name));
            let response = client.get_streamed(&format!("/api/v1/jobs/{job}/checkpoints/{}", chosen.step)).await?;
            let size = response.content_length().unwrap_or(chosen.size_bytes);
            crate::storage::save_download(response, size, &target).await?;
            if target != Path::new("-") {
                eprintln!("saved checkpoint step {} ({}) to {}", chosen.step, human_memory(size), target.display());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
