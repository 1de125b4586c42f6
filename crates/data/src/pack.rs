//! Writing shards. Each shard is written aside (`.partial`), hashed as it is written, synced,
//! and renamed; its index likewise; a worker's part file after all its shards; the manifest
//! after everything. A crash leaves only `.partial` files and parts without a manifest, which
//! nothing mistakes for a complete dataset, and a rerun overwrites them.

use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::manifest::{
    DatasetManifest, IndexedMember, IndexedSample, MANIFEST_FILE, PartManifest, ShardEntry, ShardIndex, WIDS_FILE,
    partial_path, write_atomically,
};
use crate::plan::{ShardLimits, ShardPlan, plan_id, plan_shards, worker_share};
use crate::source::SourceSample;
use crate::{DataError, Result};

#[derive(Debug, Clone)]
pub struct PackOptions {
    /// Shard names: `<prefix>-000000.tar`.
    pub prefix: String,
    pub limits: ShardLimits,
    /// This worker's number, from 0, and how many pack in parallel.
    pub worker: usize,
    pub workers: usize,
    /// Replace a dataset already in the destination.
    pub overwrite: bool,
    /// Threads writing shards at once (all cores when `None`).
    pub threads: Option<usize>,
}

/// What one `pack` call wrote.
#[derive(Debug)]
pub struct Packed {
    pub part: PartManifest,
    /// Written when this call packed everything (one worker).
    pub manifest: Option<DatasetManifest>,
}

/// Counts bytes written so far, for progress bars.
#[derive(Debug, Default)]
pub struct Progress {
    pub bytes: AtomicU64,
    pub samples: AtomicU64,
}

pub fn pack(samples: &[SourceSample], dest: &Path, options: &PackOptions, progress: &Progress) -> Result<Packed> {
    if options.workers == 0 || options.worker >= options.workers {
        return Err(DataError::BadInput(format!(
            "worker {} of {}: the worker number runs from 0 to workers - 1",
            options.worker, options.workers
        )));
    }
    if options.prefix.is_empty() || !options.prefix.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) {
        return Err(DataError::BadInput(format!("prefix {:?}: use letters, digits, '.', '_' or '-'", options.prefix)));
    }
    if samples.is_empty() {
        return Err(DataError::BadInput("there are no samples to pack".into()));
    }
    std::fs::create_dir_all(dest).map_err(DataError::io(dest))?;
    let manifest_path = dest.join(MANIFEST_FILE);
    if manifest_path.exists() {
        if !options.overwrite {
            return Err(DataError::DestinationTaken(dest.to_path_buf()));
        }
        // The old dataset stops being complete before any of its shards is replaced.
        if options.worker == 0 {
            std::fs::remove_file(&manifest_path).map_err(DataError::io(&manifest_path))?;
        }
    }
    let plan = plan_shards(samples, options.limits)?;
    let share = worker_share(&plan, options.worker, options.workers);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(options.threads.unwrap_or(0))
        .build()
        .map_err(|e| DataError::BadInput(format!("cannot start threads: {e}")))?;
    let mut entries: Vec<(usize, ShardEntry)> = pool.install(|| {
        share
            .par_iter()
            .map(|shard| write_shard(samples, shard, dest, &options.prefix, progress).map(|e| (shard.index, e)))
            .collect::<Result<Vec<_>>>()
    })?;
    entries.sort_by_key(|(index, _)| *index);
    let part = PartManifest {
        plan_id: plan_id(samples, options.limits, &options.prefix),
        worker: options.worker,
        workers: options.workers,
        total_shards: plan.len(),
        shards: entries,
    };
    write_atomically(
        &part_path(dest, &options.prefix, options.worker, options.workers),
        &serde_json::to_vec_pretty(&part).expect("serialises"),
    )?;
    let manifest =
        if options.workers == 1 { Some(merge(dest, &options.prefix, 1, Some(&part.plan_id))?) } else { None };
    Ok(Packed { part, manifest })
}

/// Where worker `worker` of `workers` records its shards.
pub fn part_path(dest: &Path, prefix: &str, worker: usize, workers: usize) -> PathBuf {
    dest.join(format!("{prefix}.part-{worker:05}-of-{workers:05}.json"))
}

/// The parts of all workers, once all are there for the plan `plan_id` (any plan, when `None`,
/// as long as all parts share it). `None` while some are missing or from another run.
pub fn parts_ready(
    dest: &Path,
    prefix: &str,
    workers: usize,
    plan_id: Option<&str>,
) -> Result<Option<Vec<PartManifest>>> {
    let mut parts = Vec::with_capacity(workers);
    for worker in 0..workers {
        let path = part_path(dest, prefix, worker, workers);
        let part: PartManifest = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| DataError::Corrupt(format!("{}: not a part manifest: {e}", path.display())))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(DataError::Io { path, source: e }),
        };
        let expected = plan_id.or(parts.first().map(|p: &PartManifest| p.plan_id.as_str()));
        if expected.is_some_and(|id| id != part.plan_id) {
            return Ok(None);
        }
        parts.push(part);
    }
    Ok(Some(parts))
}

/// Joins the parts of all workers into the manifest (written last). Every part must be there,
/// from the same run, and every planned shard present with its recorded size.
pub fn merge(dest: &Path, prefix: &str, workers: usize, plan_id: Option<&str>) -> Result<DatasetManifest> {
    let Some(parts) = parts_ready(dest, prefix, workers, plan_id)? else {
        let present: Vec<usize> = (0..workers).filter(|w| part_path(dest, prefix, *w, workers).exists()).collect();
        return Err(DataError::BadInput(format!(
            "not every worker of {workers} has finished this run's part (parts present: {present:?}); \
             wait for them, or rerun the missing workers with the same input"
        )));
    };
    let mut entries: Vec<(usize, ShardEntry)> = Vec::new();
    let mut total = None;
    for part in parts {
        if *total.get_or_insert(part.total_shards) != part.total_shards {
            return Err(DataError::Corrupt(format!(
                "worker {} plans {} shards where others plan {}",
                part.worker,
                part.total_shards,
                total.unwrap_or_default()
            )));
        }
        entries.extend(part.shards);
    }
    entries.sort_by_key(|(index, _)| *index);
    let total = total.unwrap_or_default();
    if entries.len() != total || entries.iter().enumerate().any(|(i, (index, _))| i != *index) {
        return Err(DataError::Corrupt(format!("the parts hold {} shards of the {total} planned", entries.len())));
    }
    for (_, shard) in &entries {
        let path = dest.join(&shard.name);
        let size = std::fs::metadata(&path).map_err(DataError::io(&path))?.len();
        if size != shard.bytes {
            return Err(DataError::Corrupt(format!("{}: {size} bytes, the part says {}", path.display(), shard.bytes)));
        }
    }
    let manifest = DatasetManifest::new(prefix, entries.into_iter().map(|(_, e)| e).collect());
    write_atomically(&dest.join(WIDS_FILE), &serde_json::to_vec_pretty(&manifest.wids_descriptor()).expect("json"))?;
    write_atomically(&dest.join(MANIFEST_FILE), &serde_json::to_vec_pretty(&manifest).expect("serialises"))?;
    Ok(manifest)
}

/// A writer that hashes and counts what passes through.
struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn write_shard(
    samples: &[SourceSample],
    plan: &ShardPlan,
    dest: &Path,
    prefix: &str,
    progress: &Progress,
) -> Result<ShardEntry> {
    let name = format!("{prefix}-{:06}.tar", plan.index);
    let index_name = format!("{prefix}-{:06}.idx.json", plan.index);
    let final_path = dest.join(&name);
    let aside = partial_path(&final_path);
    let file = std::fs::File::create(&aside).map_err(DataError::io(&aside))?;
    let writer = HashingWriter { inner: BufWriter::with_capacity(1 << 20, file), hasher: Sha256::new(), written: 0 };
    let mut builder = tar::Builder::new(writer);
    let mut indexed = Vec::with_capacity(plan.samples.len());
    let mut buffer = Vec::new();
    for sample in &samples[plan.samples.clone()] {
        let offset = builder.get_ref().written;
        let mut members = Vec::with_capacity(sample.files.len());
        for file in &sample.files {
            buffer.clear();
            let mut source = std::fs::File::open(&file.path).map_err(DataError::io(&file.path))?;
            source.read_to_end(&mut buffer).map_err(DataError::io(&file.path))?;
            if buffer.len() as u64 != file.size {
                return Err(DataError::BadInput(format!(
                    "{}: changed while packing ({} bytes, then {})",
                    file.path.display(),
                    file.size,
                    buffer.len()
                )));
            }
            let member = format!("{}.{}", sample.key, file.ext);
            // Fixed mode, owner and time: the same input gives the same bytes, hence the same hash.
            let mut header = tar::Header::new_ustar();
            header.set_path(&member).map_err(|e| DataError::BadInput(format!("{member}: {e}")))?;
            header.set_size(file.size);
            header.set_mode(0o444);
            header.set_mtime(0);
            header.set_uid(0);
            header.set_gid(0);
            header.set_entry_type(tar::EntryType::Regular);
            header.set_cksum();
            let data_offset = builder.get_ref().written + 512;
            builder.append(&header, buffer.as_slice()).map_err(DataError::io(&aside))?;
            members.push(IndexedMember { ext: file.ext.clone(), offset: data_offset, size: file.size });
            progress.bytes.fetch_add(512 + file.size.div_ceil(512) * 512, Ordering::Relaxed);
        }
        progress.samples.fetch_add(1, Ordering::Relaxed);
        indexed.push(IndexedSample { key: sample.key.clone(), offset, members });
    }
    builder.finish().map_err(DataError::io(&aside))?;
    let mut writer = builder.into_inner().map_err(DataError::io(&aside))?;
    writer.flush().map_err(DataError::io(&aside))?;
    let file = writer.inner.into_inner().map_err(|e| DataError::io(&aside)(e.into_error()))?;
    file.sync_all().map_err(DataError::io(&aside))?;
    let entry = ShardEntry {
        name: name.clone(),
        index: index_name.clone(),
        samples: indexed.len() as u64,
        bytes: writer.written,
        sha256: hex::encode(writer.hasher.finalize()),
    };
    let index = ShardIndex { shard: name, samples: indexed };
    write_atomically(&dest.join(&index_name), &serde_json::to_vec(&index).expect("serialises"))?;
    std::fs::rename(&aside, &final_path).map_err(DataError::io(&final_path))?;
    Ok(entry)
}
