//! The data pipeline engine of Trainyard's templates.
//!
//! Reading millions of small files is dominated by metadata operations. The cure: pack them once
//! into large tar shards, WebDataset style (files sharing a key form one sample), with an index
//! beside each shard for random access and a manifest over the whole dataset; then read shards
//! sequentially, each rank its own disjoint share, shuffled per epoch, by parallel readers ahead
//! of the consumer.
//!
//! - [`naming`]: WebDataset's key/extension rule and what a tar member name may be.
//! - [`source`]: finding the samples of a folder tree (or a list of files).
//! - [`plan`]: cutting the samples into shards: deterministic, from sizes alone.
//! - [`pack`]: writing shards in parallel (write aside, rename), indexes, worker parts, merge.
//! - [`manifest`]: the dataset manifest, shard indexes, and the content hash.
//! - [`check`]: verify, inspect, get one sample through the index.
//! - [`reader`]: rank assignment, per-epoch shuffles, parallel prefetching reader.

pub mod check;
pub mod manifest;
pub mod naming;
pub mod pack;
pub mod plan;
pub mod reader;
pub mod source;

use std::path::PathBuf;

/// Everything that can go wrong, each with what a person needs to fix it.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{0}")]
    BadInput(String),
    #[error("{0} already holds a dataset (dataset.json); choose another destination or pass --overwrite to replace it")]
    DestinationTaken(PathBuf),
    #[error("{0}")]
    Corrupt(String),
}

impl DataError {
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> DataError {
        let path = path.into();
        move |source| DataError::Io { path, source }
    }
}

pub type Result<T, E = DataError> = std::result::Result<T, E>;
