//! `yard-data`: pack folders of small files into WebDataset shards with indexes, check them, and
//! read them back fast. What the `data-pack` template runs.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use trainyard_core::resources::Memory;
use trainyard_data::check::{SampleRef, get, verify};
use trainyard_data::manifest::DatasetManifest;
use trainyard_data::pack::{PackOptions, Progress, merge, pack, parts_ready};
use trainyard_data::plan::{ShardLimits, plan_id, plan_shards, worker_share};
use trainyard_data::reader::{Reader, ReaderOptions};
use trainyard_data::source::{discover_dir, discover_list};

#[derive(Parser)]
#[command(name = "yard-data", version, about = "Pack small files into WebDataset shards, check them, read them fast")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Pack every file under SOURCE (files sharing a key form a sample) into shards in DEST.
    Pack {
        source: PathBuf,
        dest: PathBuf,
        /// Take the files from this list (one path per line, relative to SOURCE) instead of walking SOURCE.
        #[arg(long)]
        list: Option<PathBuf>,
        #[arg(long, default_value = "data")]
        prefix: String,
        /// Most bytes per shard: 256Mi, 1Gi, ...
        #[arg(long, default_value = "256Mi")]
        shard_size: String,
        /// Most samples per shard.
        #[arg(long, default_value_t = 100_000)]
        shard_samples: usize,
        /// This worker's number (0-based) when several pack in parallel.
        #[arg(long, default_value_t = 0)]
        worker: usize,
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// Take --worker and --workers from RANK and WORLD_SIZE (as the data-pack template does);
        /// worker 0 then waits for the others and merges.
        #[arg(long)]
        workers_from_env: bool,
        /// Replace a dataset already in DEST (`--overwrite` or `--overwrite=true|false`).
        #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
        overwrite: bool,
        /// Threads writing shards (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
        /// Record the dataset (content hash, counts) as an output of the Trainyard job running this.
        #[arg(long)]
        report: bool,
        /// How long worker 0 waits for the other workers' parts.
        #[arg(long, default_value = "6h")]
        merge_timeout: String,
    },
    /// Write the manifest once all N workers' parts are in DEST.
    Merge {
        dest: PathBuf,
        #[arg(long, default_value = "data")]
        prefix: String,
        #[arg(long)]
        workers: usize,
    },
    /// Check every shard against the manifest (size, sha256, index).
    Verify { dir: PathBuf },
    /// A summary of a dataset.
    Inspect { dir: PathBuf },
    /// One sample through the index: by position (--index) or key (--key).
    Get {
        dir: PathBuf,
        #[arg(long, conflicts_with = "key")]
        index: Option<u64>,
        #[arg(long)]
        key: Option<String>,
        /// Write the sample's files here instead of listing them.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Read a rank's share of an epoch and report throughput (what a training job would do).
    Read {
        dir: PathBuf,
        #[arg(long, default_value_t = 0)]
        rank: usize,
        #[arg(long, default_value_t = 1)]
        world_size: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long, default_value_t = 0)]
        epoch: u64,
        #[arg(long, default_value_t = 4)]
        readers: usize,
        #[arg(long, default_value_t = 1000)]
        shuffle_buffer: usize,
        /// Print each sample's key and the sha256 of each field (for comparisons).
        #[arg(long)]
        list: bool,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("yard-data: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Pack {
            source,
            dest,
            list,
            prefix,
            shard_size,
            shard_samples,
            worker,
            workers,
            workers_from_env,
            overwrite,
            threads,
            report,
            merge_timeout,
        } => {
            let (worker, workers) = if workers_from_env { workers_from_environment()? } else { (worker, workers) };
            let max_bytes = Memory::parse(&shard_size).map_err(|e| anyhow::anyhow!("--shard-size: {e}"))?.bytes();
            let limits = ShardLimits { max_bytes, max_samples: shard_samples };
            let timeout = parse_duration(&merge_timeout).context("--merge-timeout")?;
            let started = Instant::now();
            let found = match &list {
                Some(list) => discover_list(list, &source)?,
                None => discover_dir(&source)?,
            };
            if !found.skipped.is_empty() {
                eprintln!(
                    "skipped {} hidden or special files (e.g. {})",
                    found.skipped.len(),
                    found.skipped[0].display()
                );
            }
            let plan = plan_shards(&found.samples, limits)?;
            let share_bytes: u64 = worker_share(&plan, worker, workers).iter().map(|s| s.bytes).sum();
            let options = PackOptions { prefix: prefix.clone(), limits, worker, workers, overwrite, threads };
            let progress = Progress::default();
            let packed = with_progress(share_bytes, &progress, || pack(&found.samples, &dest, &options, &progress))?;
            let shards = packed.part.shards.len();
            let bytes: u64 = packed.part.shards.iter().map(|(_, s)| s.bytes).sum();
            let seconds = started.elapsed().as_secs_f64();
            eprintln!(
                "worker {worker} of {workers}: {shards} shards, {} samples, {:.1} MB in {seconds:.1}s ({:.0} MB/s)",
                packed.part.shards.iter().map(|(_, s)| s.samples).sum::<u64>(),
                bytes as f64 / 1e6,
                bytes as f64 / 1e6 / seconds.max(1e-9)
            );
            let manifest = match packed.manifest {
                Some(manifest) => Some(manifest),
                None if worker == 0 && workers_from_env => {
                    let id = plan_id(&found.samples, limits, &prefix);
                    wait_for_parts(&dest, &prefix, workers, &id, timeout)?;
                    Some(merge(&dest, &prefix, workers, Some(&id))?)
                }
                None => None,
            };
            if let Some(manifest) = manifest {
                println!("{}", serde_json::to_string_pretty(&summary(&manifest, &dest))?);
                if report {
                    report_output(&summary(&manifest, &dest))?;
                }
            }
            Ok(())
        }
        Command::Merge { dest, prefix, workers } => {
            let manifest = merge(&dest, &prefix, workers, None)?;
            println!("{}", serde_json::to_string_pretty(&summary(&manifest, &dest))?);
            Ok(())
        }
        Command::Verify { dir } => {
            let problems = verify(&dir)?;
            if problems.is_empty() {
                let manifest = DatasetManifest::read(&dir)?;
                println!(
                    "ok: {} shards, {} samples, {}",
                    manifest.shards.len(),
                    manifest.samples,
                    manifest.content_hash
                );
                Ok(())
            } else {
                for p in &problems {
                    eprintln!("{}: {}", p.shard, p.problem);
                }
                bail!("{} problems in {}", problems.len(), dir.display())
            }
        }
        Command::Inspect { dir } => {
            let manifest = DatasetManifest::read(&dir)?;
            println!("{}", serde_json::to_string_pretty(&summary(&manifest, &dir))?);
            Ok(())
        }
        Command::Get { dir, index, key, out } => {
            let which = match (index, key) {
                (Some(n), None) => SampleRef::Position(n),
                (None, Some(key)) => SampleRef::Key(key),
                _ => bail!("say which sample: --index N or --key KEY"),
            };
            let sample = get(&dir, &which)?;
            match out {
                Some(out) => {
                    std::fs::create_dir_all(&out)?;
                    for (ext, data) in &sample.fields {
                        let name = format!("{}.{ext}", sample.key.rsplit('/').next().unwrap_or(&sample.key));
                        std::fs::write(out.join(&name), data)?;
                        println!("{}", out.join(name).display());
                    }
                }
                None => {
                    for (ext, data) in &sample.fields {
                        println!("{}.{ext}\t{} bytes", sample.key, data.len());
                    }
                }
            }
            Ok(())
        }
        Command::Read { dir, rank, world_size, seed, epoch, readers, shuffle_buffer, list } => {
            let options = ReaderOptions { seed, epoch, rank, world_size, readers, prefetch: 4, shuffle_buffer };
            let started = Instant::now();
            let (mut samples, mut bytes) = (0u64, 0u64);
            let mut out = std::io::stdout().lock();
            for sample in Reader::open(&dir, &options)? {
                let sample = sample?;
                samples += 1;
                bytes += sample.bytes() as u64;
                if list {
                    use sha2::Digest;
                    let fields: Vec<String> = sample
                        .fields
                        .iter()
                        .map(|(ext, data)| format!("{ext}:{}", hex::encode(sha2::Sha256::digest(data))))
                        .collect();
                    if let Err(err) = writeln!(out, "{}\t{}", sample.key, fields.join("\t")) {
                        // A closed pipe (`| head`) is the reader's choice, not an error.
                        return if err.kind() == std::io::ErrorKind::BrokenPipe { Ok(()) } else { Err(err.into()) };
                    }
                }
            }
            let seconds = started.elapsed().as_secs_f64().max(1e-9);
            eprintln!(
                "read {samples} samples, {:.1} MB in {seconds:.2}s: {:.0} samples/s, {:.0} MB/s",
                bytes as f64 / 1e6,
                samples as f64 / seconds,
                bytes as f64 / 1e6 / seconds
            );
            Ok(())
        }
    }
}

fn workers_from_environment() -> anyhow::Result<(usize, usize)> {
    let read = |name: &str| -> anyhow::Result<usize> {
        std::env::var(name)
            .with_context(|| format!("--workers-from-env: {name} is not set"))?
            .parse()
            .with_context(|| format!("--workers-from-env: {name} is not a number"))
    };
    Ok((read("RANK")?, read("WORLD_SIZE")?))
}

fn parse_duration(text: &str) -> anyhow::Result<Duration> {
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let n: u64 = number.parse().with_context(|| format!("{text:?} is not a duration such as 90s, 30m or 6h"))?;
    Ok(Duration::from_secs(match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => bail!("{text:?} is not a duration such as 90s, 30m or 6h"),
    }))
}

fn wait_for_parts(dest: &Path, prefix: &str, workers: usize, plan: &str, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    eprintln!("waiting for the other {} workers to finish their parts", workers - 1);
    while parts_ready(dest, prefix, workers, Some(plan))?.is_none() {
        if Instant::now() > deadline {
            bail!("the other workers did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Ok(())
}

fn summary(manifest: &DatasetManifest, dir: &Path) -> serde_json::Value {
    serde_json::json!({
        "path": dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf()),
        "content_hash": manifest.content_hash,
        "shards": manifest.shards.len(),
        "samples": manifest.samples,
        "bytes": manifest.bytes,
        "format": manifest.format,
    })
}

/// Shows a progress bar on a terminal while `work` runs.
fn with_progress<T>(total: u64, progress: &Progress, work: impl FnOnce() -> T) -> T {
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} packing [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} {msg}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                bar.set_position(progress.bytes.load(Ordering::Relaxed));
                bar.set_message(format!("{} samples", progress.samples.load(Ordering::Relaxed)));
                std::thread::sleep(Duration::from_millis(100));
            }
            bar.finish_and_clear();
        });
        let result = work();
        done.store(true, Ordering::Relaxed);
        result
    })
}

/// Records the dataset as an output of the Trainyard job running this, with the job's token.
fn report_output(value: &serde_json::Value) -> anyhow::Result<()> {
    let (Ok(url), Ok(token), Ok(job)) =
        (std::env::var("TRAINYARD_URL"), std::env::var("TRAINYARD_TOKEN"), std::env::var("TRAINYARD_JOB_ID"))
    else {
        bail!("--report: not running as a Trainyard job (TRAINYARD_URL, TRAINYARD_TOKEN, TRAINYARD_JOB_ID unset)");
    };
    ureq::post(&format!("{url}/api/v1/jobs/{job}/outputs"))
        .header("Authorization", &format!("Bearer {token}"))
        .send_json(serde_json::json!({"name": "dataset", "value": value}))
        .context("recording the dataset with Trainyard")?;
    Ok(())
}
