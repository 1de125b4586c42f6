//! `yard artifacts` and `yard volumes`: a job's artefacts (list, download through a signed
//! link with a progress bar, upload) and the tenant's named volumes; `yard storage`: the tenant's
//! storage policy and use.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::io::AsyncWriteExt;
use trainyard_core::api::{
    AccessMode, Artifact, ArtifactLink, ArtifactUploaded, StoragePolicy, StorageReport, Volume, VolumeCreate,
};
use trainyard_core::resources::{Memory, human_memory};

use crate::Output;
use crate::client::Client;
use crate::output;

#[derive(Subcommand)]
pub enum ArtifactsCommand {
    /// A job's artefacts: path, size, SHA-256, time.
    Ls { job: String },
    /// Download one artefact (to its file name here, or --output-file; `-` for stdout).
    Get {
        job: String,
        path: String,
        #[arg(short = 'O', long)]
        output_file: Option<PathBuf>,
    },
    /// Upload a file as the job's artefact PATH.
    Put { job: String, path: String, file: PathBuf },
}

#[derive(Subcommand)]
pub enum VolumesCommand {
    Ls,
    /// A named volume for the tenant's jobs, within its storage quota.
    Create {
        name: String,
        /// Bytes or a quantity such as 10Gi.
        #[arg(long, value_parser = Memory::parse)]
        size: Memory,
        /// ReadWriteOnce, ReadOnlyMany or ReadWriteMany.
        #[arg(long, default_value = "ReadWriteOnce", value_parser = parse_access_mode)]
        access_mode: AccessMode,
        #[arg(long)]
        storage_class: Option<String>,
    },
    /// Delete a volume and its content.
    Delete {
        name: String,
    },
}

#[derive(Subcommand)]
pub enum StorageCommand {
    /// Your tenant's retention, storage quota and volume use.
    Show,
    /// Replace a tenant's storage policy (platform admins). An option left out means keep
    /// forever / no limit.
    Set {
        tenant: String,
        #[arg(long)]
        log_retention_days: Option<u32>,
        #[arg(long)]
        artifact_retention_days: Option<u32>,
        /// Bytes or a quantity such as 10Ti.
        #[arg(long, value_parser = Memory::parse)]
        quota: Option<Memory>,
    },
}

fn parse_access_mode(text: &str) -> Result<AccessMode, String> {
    AccessMode::parse(text).ok_or_else(|| "one of ReadWriteOnce, ReadOnlyMany, ReadWriteMany".into())
}

/// `/api/v1/jobs/<job>/artifacts/<path>` with each segment percent-encoded.
fn artifact_api_path(job: uuid::Uuid, path: &str) -> anyhow::Result<String> {
    let mut url = reqwest::Url::parse("http://x/api/v1/jobs")?;
    url.path_segments_mut()
        .map_err(|()| anyhow::anyhow!("bad URL"))?
        .push(&job.to_string())
        .push("artifacts")
        .extend(path.split('/'));
    Ok(url.path().to_string())
}

fn progress_bar(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(what.to_string());
    bar
}

pub async fn artifacts(client: &Client, out: Output, command: ArtifactsCommand) -> anyhow::Result<ExitCode> {
    match command {
        ArtifactsCommand::Ls { job } => {
            let job = client.job_id(&job).await?;
            let list: Vec<Artifact> = client.get(&format!("/api/v1/jobs/{job}/artifacts")).await?;
            output::print(out, &list, |list| output::artifacts_table(list))
        }
        ArtifactsCommand::Get { job, path, output_file } => {
            let job = client.job_id(&job).await?;
            let link: ArtifactLink = client.get(&artifact_api_path(job, &path)?).await?;
            let target = output_file.unwrap_or_else(|| PathBuf::from(path.rsplit('/').next().unwrap_or(&path)));
            download(client, &link, &target).await?;
            if target != Path::new("-") {
                eprintln!("saved {} ({}) to {}", link.path, human_memory(link.size_bytes), target.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        ArtifactsCommand::Put { job, path, file } => {
            let job = client.job_id(&job).await?;
            let len = tokio::fs::metadata(&file).await.with_context(|| format!("opening {}", file.display()))?.len();
            let bar = progress_bar(len, "uploading");
            let uploaded: ArtifactUploaded = client.put_file(&artifact_api_path(job, &path)?, &file, len, &bar).await?;
            bar.finish_and_clear();
            output::print(out, &uploaded, |u| {
                format!("uploaded {} ({}, sha256 {})\n", u.path, human_memory(u.size_bytes), u.sha256)
            })
        }
    }
}

/// Fetches a signed link without credentials (the link is one) and writes it to `target`.
async fn download(client: &Client, link: &ArtifactLink, target: &Path) -> anyhow::Result<()> {
    let url = client.resolve(&link.url)?;
    let response = reqwest::get(url).await.context("downloading")?;
    if !response.status().is_success() {
        anyhow::bail!("the download was refused: {}", response.status());
    }
    save_download(response, link.size_bytes, target).await
}

/// Writes a download's body to `target` (`-`: stdout) with a progress bar on a terminal.
pub(crate) async fn save_download(response: reqwest::Response, size_bytes: u64, target: &Path) -> anyhow::Result<()> {
    let to_stdout = target == Path::new("-");
    let bar = if to_stdout { ProgressBar::hidden() } else { progress_bar(size_bytes, "downloading") };
    // Written next to the target and renamed at the end, so a broken download leaves no file
    // that looks complete.
    let mut partial = target.as_os_str().to_owned();
    partial.push(".part");
    let partial = PathBuf::from(partial);
    let mut sink: Box<dyn tokio::io::AsyncWrite + Unpin> = if to_stdout {
        Box::new(tokio::io::stdout())
    } else {
        Box::new(tokio::fs::File::create(&partial).await.with_context(|| format!("creating {}", partial.display()))?)
    };
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.context("downloading")?;
        sink.write_all(&chunk).await?;
        bar.inc(chunk.len() as u64);
    }
    sink.flush().await?;
    drop(sink);
    bar.finish_and_clear();
    if !to_stdout {
        tokio::fs::rename(&partial, target).await?;
    }
    Ok(())
}

pub async fn volumes(client: &Client, out: Output, command: VolumesCommand) -> anyhow::Result<ExitCode> {
    match command {
        VolumesCommand::Ls => {
            let list: Vec<Volume> = client.get("/api/v1/volumes").await?;
            output::print(out, &list, |list| output::volumes_table(list))
        }
        VolumesCommand::Create { name, size, access_mode, storage_class } => {
            let body = VolumeCreate { name, size, access_mode, storage_class };
            let volume: Volume = client.post("/api/v1/volumes", &body).await?;
            output::print(out, &volume, |v| {
                format!("created volume {} ({}) at {}\n", v.name, human_memory(v.size_bytes), v.path)
            })
        }
        VolumesCommand::Delete { name } => {
            client.delete(&format!("/api/v1/volumes/{name}")).await?;
            eprintln!("deleted volume {name}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

pub async fn storage(client: &Client, out: Output, command: StorageCommand) -> anyhow::Result<ExitCode> {
    match command {
        StorageCommand::Show => {
            let report: StorageReport = client.get("/api/v1/storage").await?;
            output::print(out, &report, |r| {
                let days = |d: Option<u32>| d.map(|d| format!("{d} days")).unwrap_or_else(|| "forever".into());
                let quota = r.policy.storage_quota_bytes.map_or_else(|| "no limit".into(), human_memory);
                format!(
                    "tenant {}\nlogs kept {} after a job ends, artefacts {}\nvolumes: {} using {}; pushed datasets: {}; \
                     {} of {}\n",
                    r.tenant,
                    days(r.policy.log_retention_days),
                    days(r.policy.artifact_retention_days),
                    r.volumes,
                    human_memory(r.volume_bytes),
                    human_memory(r.dataset_bytes),
                    human_memory(r.volume_bytes.saturating_add(r.dataset_bytes)),
                    quota
                )
            })
        }
        StorageCommand::Set { tenant, log_retention_days, artifact_retention_days, quota } => {
            let policy = StoragePolicy {
                log_retention_days,
                artifact_retention_days,
                storage_quota_bytes: quota.map(Memory::bytes),
            };
            client.put(&format!("/api/v1/admin/tenants/{tenant}/storage"), &policy).await?;
            eprintln!("storage policy of {tenant} set");
            Ok(ExitCode::SUCCESS)
        }
    }
}
