//! What a packed dataset holds, on disk beside its shards:
//! - `<prefix>-NNNNNN.tar`: the shards (plain USTAR, readable by `tar`, `webdataset`, `wids`);
//! - `<prefix>-NNNNNN.idx.json`: per shard, each sample's key and its members' data offsets and
//!   sizes, so one sample is read with a seek, not a scan;
//! - `dataset.json`: the manifest (shards, counts, bytes, sha256 per shard, one content hash),
//!   written last: a dataset without it is incomplete;
//! - `dataset.wids.json`: the same shard list as a `wids` descriptor.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{DataError, Result};

pub const MANIFEST_FILE: &str = "dataset.json";
pub const WIDS_FILE: &str = "dataset.wids.json";
pub const FORMAT: &str = "trainyard-shards-v1";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetManifest {
    pub format: String,
    pub prefix: String,
    pub shards: Vec<ShardEntry>,
    pub samples: u64,
    pub bytes: u64,
    /// `sha256:` over every shard's name, sample count and sha256, in order: one value that
    /// names this exact content, for reproducibility records.
    pub content_hash: String,
    pub created_by: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    pub name: String,
    pub index: String,
    pub samples: u64,
    pub bytes: u64,
    pub sha256: String,
}

/// One worker's share of a parallel pack, written when its shards are complete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartManifest {
    /// Identifies the plan (input and limits): parts of different runs never mix.
    pub plan_id: String,
    pub worker: usize,
    pub workers: usize,
    /// Shards in the whole plan (the same for every worker).
    pub total_shards: usize,
    pub shards: Vec<(usize, ShardEntry)>,
}

/// Offsets of one shard's samples.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardIndex {
    pub shard: String,
    pub samples: Vec<IndexedSample>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexedSample {
    pub key: String,
    /// Offset of the sample's first tar header.
    pub offset: u64,
    pub members: Vec<IndexedMember>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexedMember {
    pub ext: String,
    /// Offset of the member's data (after its header).
    pub offset: u64,
    pub size: u64,
}

pub fn content_hash(shards: &[ShardEntry]) -> String {
    let mut hasher = Sha256::new();
    for shard in shards {
        hasher.update(format!("{}\0{}\0{}\n", shard.name, shard.samples, shard.sha256));
    }
    format!("sha256:{}", hex::encode(hasher.finalize()))
}

impl DatasetManifest {
    pub fn new(prefix: &str, shards: Vec<ShardEntry>) -> DatasetManifest {
        DatasetManifest {
            format: FORMAT.to_string(),
            prefix: prefix.to_string(),
            samples: shards.iter().map(|s| s.samples).sum(),
            bytes: shards.iter().map(|s| s.bytes).sum(),
            content_hash: content_hash(&shards),
            shards,
            created_by: concat!("yard-data ", env!("CARGO_PKG_VERSION")).to_string(),
        }
    }

    pub fn read(dir: &Path) -> Result<DatasetManifest> {
        let path = dir.join(MANIFEST_FILE);
        let bytes = std::fs::read(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                DataError::BadInput(format!("{} holds no complete dataset (no {MANIFEST_FILE})", dir.display()))
            }
            _ => DataError::Io { path: path.clone(), source: e },
        })?;
        let manifest: DatasetManifest = serde_json::from_slice(&bytes)
            .map_err(|e| DataError::Corrupt(format!("{}: not a dataset manifest: {e}", path.display())))?;
        if manifest.format != FORMAT {
            return Err(DataError::Corrupt(format!(
                "{}: format {:?}, expected {FORMAT}",
                path.display(),
                manifest.format
            )));
        }
        Ok(manifest)
    }

    /// The `wids` descriptor of the same shards.
    pub fn wids_descriptor(&self) -> serde_json::Value {
        serde_json::json!({
            "__kind__": "wids-shard-index-v1",
            "wids_version": 1,
            "name": self.prefix,
            "shardlist": self.shards.iter().map(|s| serde_json::json!({
                "url": s.name, "nsamples": s.samples, "filesize": s.bytes,
            })).collect::<Vec<_>>(),
        })
    }
}

pub fn read_index(dir: &Path, shard: &ShardEntry) -> Result<ShardIndex> {
    let path = dir.join(&shard.index);
    let bytes = std::fs::read(&path).map_err(DataError::io(&path))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| DataError::Corrupt(format!("{}: not a shard index: {e}", path.display())))
}

/// Writes next to `path` and renames, so readers see the whole file or nothing.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let aside = partial_path(path);
    let mut file = std::fs::File::create(&aside).map_err(DataError::io(&aside))?;
    file.write_all(bytes).map_err(DataError::io(&aside))?;
    file.sync_all().map_err(DataError::io(&aside))?;
    std::fs::rename(&aside, path).map_err(DataError::io(path))
}

/// Where a file is written before it is complete.
pub fn partial_path(path: &Path) -> std::path::PathBuf {
    let mut name = path.file_name().expect("a file path").to_os_string();
    name.push(".partial");
    path.with_file_name(name)
}
