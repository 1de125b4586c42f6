//! Looking at a packed dataset: verify it against its manifest, summarise it, fetch one sample
//! through the index.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::manifest::{DatasetManifest, read_index};
use crate::reader::Sample;
use crate::{DataError, Result};

/// A problem `verify` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub shard: String,
    pub problem: String,
}

/// Rehashes every shard and checks sizes and indexes against the manifest. Empty when all is well.
pub fn verify(dir: &Path) -> Result<Vec<Mismatch>> {
    let manifest = DatasetManifest::read(dir)?;
    let mut problems = Vec::new();
    for shard in &manifest.shards {
        let path = dir.join(&shard.name);
        let mut file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(e) => {
                problems.push(Mismatch { shard: shard.name.clone(), problem: format!("cannot open: {e}") });
                continue;
            }
        };
        let mut hasher = Sha256::new();
        let bytes = std::io::copy(&mut file, &mut hasher).map_err(DataError::io(&path))?;
        if bytes != shard.bytes {
            problems.push(Mismatch {
                shard: shard.name.clone(),
                problem: format!("{bytes} bytes, the manifest says {}", shard.bytes),
            });
        }
        let sha = hex::encode(hasher.finalize());
        if sha != shard.sha256 {
            problems.push(Mismatch {
                shard: shard.name.clone(),
                problem: format!("sha256 {sha}, the manifest says {}", shard.sha256),
            });
        }
        match read_index(dir, shard) {
            Ok(index) if index.samples.len() as u64 == shard.samples => {}
            Ok(index) => problems.push(Mismatch {
                shard: shard.name.clone(),
                problem: format!("the index lists {} samples, the manifest {}", index.samples.len(), shard.samples),
            }),
            Err(e) => problems.push(Mismatch { shard: shard.name.clone(), problem: e.to_string() }),
        }
    }
    Ok(problems)
}

/// One sample through the index, by its position in the dataset or by key.
pub fn get(dir: &Path, which: &SampleRef) -> Result<Sample> {
    let manifest = DatasetManifest::read(dir)?;
    let mut first = 0u64;
    for shard in &manifest.shards {
        let in_this = match which {
            SampleRef::Position(n) => (first..first + shard.samples).contains(n),
            SampleRef::Key(_) => true,
        };
        if in_this {
            let index = read_index(dir, shard)?;
            let found = match which {
                SampleRef::Position(n) => index.samples.get((n - first) as usize),
                SampleRef::Key(key) => index.samples.iter().find(|s| &s.key == key),
            };
            if let Some(sample) = found {
                let path = dir.join(&shard.name);
                let mut file = std::fs::File::open(&path).map_err(DataError::io(&path))?;
                let mut fields = Vec::with_capacity(sample.members.len());
                for member in &sample.members {
                    let mut data = vec![0u8; member.size as usize];
                    file.seek(SeekFrom::Start(member.offset)).map_err(DataError::io(&path))?;
                    file.read_exact(&mut data).map_err(DataError::io(&path))?;
                    fields.push((member.ext.clone(), data));
                }
                return Ok(Sample { key: sample.key.clone(), fields });
            }
        }
        first += shard.samples;
    }
    Err(DataError::BadInput(match which {
        SampleRef::Position(n) => format!("there is no sample {n}; the dataset has {}", manifest.samples),
        SampleRef::Key(key) => format!("no sample has the key {key:?}"),
    }))
}

/// Which sample `get` fetches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SampleRef {
    /// 0-based, in dataset order.
    Position(u64),
    Key(String),
}
