//! Cutting samples into shards. The plan depends only on the ordered samples and their sizes, so
//! every worker computes the same plan and packs its own disjoint part of it.

use std::ops::Range;

use crate::source::SourceSample;
use crate::{DataError, Result};

/// Where shards are cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardLimits {
    /// Most bytes per shard (tar bytes: headers and padding count).
    pub max_bytes: u64,
    /// Most samples per shard.
    pub max_samples: usize,
}

/// One planned shard: a run of samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlan {
    pub index: usize,
    pub samples: Range<usize>,
    /// Tar bytes, with the two zero blocks that end an archive.
    pub bytes: u64,
}

/// The two 512-byte zero blocks at the end of every tar.
pub const TAR_TRAILER: u64 = 1024;

/// Fills each shard up to the limits, in sample order. A sample that alone exceeds the byte limit
/// is an error naming it.
pub fn plan_shards(samples: &[SourceSample], limits: ShardLimits) -> Result<Vec<ShardPlan>> {
    if limits.max_samples == 0 || limits.max_bytes <= TAR_TRAILER {
        return Err(DataError::BadInput("a shard must hold at least one sample and more than 1 KiB".into()));
    }
    let mut shards = Vec::new();
    let mut start = 0;
    let mut bytes = TAR_TRAILER;
    for (i, sample) in samples.iter().enumerate() {
        let size = sample.tar_bytes();
        if size + TAR_TRAILER > limits.max_bytes {
            return Err(DataError::BadInput(format!(
                "sample {} takes {size} bytes in a tar, more than the shard size of {} bytes; raise --shard-size",
                sample.key, limits.max_bytes
            )));
        }
        if i > start && (bytes + size > limits.max_bytes || i - start == limits.max_samples) {
            shards.push(ShardPlan { index: shards.len(), samples: start..i, bytes });
            start = i;
            bytes = TAR_TRAILER;
        }
        bytes += size;
    }
    if start < samples.len() {
        shards.push(ShardPlan { index: shards.len(), samples: start..samples.len(), bytes });
    }
    Ok(shards)
}

/// A fingerprint of the input and the limits: every worker of one run computes the same one.
pub fn plan_id(samples: &[SourceSample], limits: ShardLimits, prefix: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(format!("{prefix}\0{}\0{}\n", limits.max_bytes, limits.max_samples));
    for sample in samples {
        for file in &sample.files {
            hasher.update(format!("{}\0{}\0{}\n", sample.key, file.ext, file.size));
        }
    }
    hex::encode(hasher.finalize())
}

/// The shards worker `worker` of `workers` packs: every `workers`-th, so that parts are
/// disjoint, together complete, and balanced.
pub fn worker_share(shards: &[ShardPlan], worker: usize, workers: usize) -> Vec<&ShardPlan> {
    shards.iter().filter(|s| s.index % workers == worker).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::SourceFile;

    fn sample(key: &str, size: u64) -> SourceSample {
        SourceSample { key: key.into(), files: vec![SourceFile { ext: "bin".into(), path: key.into(), size }] }
    }

    #[test]
    fn cuts_at_bytes_and_counts() {
        let samples: Vec<_> = (0..10).map(|i| sample(&format!("s{i}"), 1000)).collect(); // 1536 tar bytes each
        let plan = plan_shards(&samples, ShardLimits { max_bytes: 1024 + 3 * 1536, max_samples: 100 }).unwrap();
        assert_eq!(plan.iter().map(|p| p.samples.len()).collect::<Vec<_>>(), [3, 3, 3, 1]);
        assert!(plan.iter().all(|p| p.bytes <= 1024 + 3 * 1536));
        let plan = plan_shards(&samples, ShardLimits { max_bytes: u64::MAX, max_samples: 4 }).unwrap();
        assert_eq!(plan.iter().map(|p| p.samples.len()).collect::<Vec<_>>(), [4, 4, 2]);
    }

    #[test]
    fn a_sample_bigger_than_a_shard_is_named() {
        let err = plan_shards(&[sample("big", 10_000)], ShardLimits { max_bytes: 4096, max_samples: 10 }).unwrap_err();
        assert!(err.to_string().contains("sample big"), "{err}");
    }

    #[test]
    fn worker_shares_are_disjoint_and_complete() {
        let samples: Vec<_> = (0..100).map(|i| sample(&format!("s{i:03}"), 100)).collect();
        let plan = plan_shards(&samples, ShardLimits { max_bytes: u64::MAX, max_samples: 7 }).unwrap();
        let mut seen: Vec<usize> = (0..4).flat_map(|w| worker_share(&plan, w, 4)).map(|s| s.index).collect();
        seen.sort();
        assert_eq!(seen, (0..plan.len()).collect::<Vec<_>>());
    }
}
