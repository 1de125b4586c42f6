//! Reading a packed dataset for training.
//!
//! - **Rank assignment**: each epoch, the shard order is shuffled by a hash of `(seed, epoch)`,
//!   the same on every rank (and in every language: see [`assign_shards`]); rank `r` of `w` takes
//!   every `w`-th shard from position `r`. Every shard goes to exactly one rank, and the split
//!   changes each epoch.
//! - **Parallel readers, in order**: reader threads take the rank's shards in turn and stream
//!   their samples through one bounded channel per shard; the consumer drains the channels in
//!   shard order. Memory stays bounded (readers x prefetch batches) and the output does not
//!   depend on thread timing.
//! - **Shuffle buffer**: samples pass through a buffer from which a seeded generator picks the
//!   next one, mixing samples across shards.
//!
//! The same `(seed, epoch, rank, world_size)` always yields the same samples in the same order.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, bounded};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::manifest::DatasetManifest;
use crate::naming::split_key;
use crate::{DataError, Result};

/// One sample: its key and its fields (extension, bytes), in the order they were packed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub key: String,
    pub fields: Vec<(String, Vec<u8>)>,
}

impl Sample {
    pub fn bytes(&self) -> usize {
        self.fields.iter().map(|(_, data)| data.len()).sum()
    }
}

#[derive(Debug, Clone)]
pub struct ReaderOptions {
    pub seed: u64,
    pub epoch: u64,
    pub rank: usize,
    pub world_size: usize,
    /// Reader threads.
    pub readers: usize,
    /// Batches buffered per shard in flight.
    pub prefetch: usize,
    /// Samples in the shuffle buffer; 0 or 1 keeps shard order.
    pub shuffle_buffer: usize,
}

impl Default for ReaderOptions {
    fn default() -> Self {
        ReaderOptions { seed: 0, epoch: 0, rank: 0, world_size: 1, readers: 4, prefetch: 4, shuffle_buffer: 1000 }
    }
}

/// The shard positions (into the manifest's list) that `rank` reads in `epoch`, in order.
///
/// The epoch's order sorts shards by `sha256("<seed>:<epoch>:<position>")`, a rule any language
/// reproduces with its standard library (the PyTorch engine does, in Python), so that a Rust
/// reader and a Python one agree on which rank reads which shard.
pub fn assign_shards(shards: usize, rank: usize, world_size: usize, seed: u64, epoch: u64) -> Vec<usize> {
    use sha2::{Digest, Sha256};
    let mut order: Vec<(Vec<u8>, usize)> =
        (0..shards).map(|i| (Sha256::digest(format!("{seed}:{epoch}:{i}")).to_vec(), i)).collect();
    order.sort();
    order.into_iter().map(|(_, i)| i).skip(rank).step_by(world_size.max(1)).collect()
}

/// A per-purpose seed from the user's seed (splitmix64 finaliser over the parts).
fn mix(seed: u64, epoch: u64, salt: u64) -> u64 {
    let mut z = seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt.wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

const BATCH: usize = 64;

type Batch = Result<Vec<Sample>>;

/// An iterator over one rank's samples for one epoch.
pub struct Reader {
    shards: Receiver<Receiver<Batch>>,
    current: Option<Receiver<Batch>>,
    pending: std::vec::IntoIter<Sample>,
    buffer: Vec<Sample>,
    buffer_size: usize,
    rng: ChaCha8Rng,
    threads: Vec<JoinHandle<()>>,
    failed: bool,
}

impl Reader {
    pub fn open(dir: &Path, options: &ReaderOptions) -> Result<Reader> {
        if options.world_size == 0 || options.rank >= options.world_size {
            return Err(DataError::BadInput(format!(
                "rank {} of {}: ranks run from 0 to world_size - 1",
                options.rank, options.world_size
            )));
        }
        let manifest = DatasetManifest::read(dir)?;
        let order = assign_shards(manifest.shards.len(), options.rank, options.world_size, options.seed, options.epoch);
        let paths: Vec<PathBuf> = order.iter().map(|&i| dir.join(&manifest.shards[i].name)).collect();
        let readers = options.readers.max(1);
        let (queue, shards) = bounded::<Receiver<Batch>>(readers);
        let next = Arc::new(Mutex::new(paths.into_iter()));
        let threads = (0..readers)
            .map(|_| {
                let (next, queue, prefetch) = (Arc::clone(&next), queue.clone(), options.prefetch.max(1));
                std::thread::spawn(move || read_shards(&next, &queue, prefetch))
            })
            .collect();
        Ok(Reader {
            shards,
            current: None,
            pending: Vec::new().into_iter(),
            buffer: Vec::with_capacity(options.shuffle_buffer),
            buffer_size: options.shuffle_buffer,
            rng: ChaCha8Rng::seed_from_u64(mix(options.seed, options.epoch, 1 + options.rank as u64)),
            threads,
            failed: false,
        })
    }

    /// The next sample in shard order, before shuffling.
    fn next_in_order(&mut self) -> Option<Result<Sample>> {
        loop {
            if let Some(sample) = self.pending.next() {
                return Some(Ok(sample));
            }
            if self.current.is_none() {
                self.current = Some(self.shards.recv().ok()?);
            }
            match self.current.as_ref().and_then(|c| c.recv().ok()) {
                Some(Ok(batch)) => self.pending = batch.into_iter(),
                Some(Err(err)) => return Some(Err(err)),
                None => self.current = None,
            }
        }
    }
}

impl Iterator for Reader {
    type Item = Result<Sample>;

    fn next(&mut self) -> Option<Result<Sample>> {
        if self.failed {
            return None;
        }
        while self.buffer.len() < self.buffer_size.max(1) {
            match self.next_in_order() {
                Some(Ok(sample)) => self.buffer.push(sample),
                Some(Err(err)) => {
                    self.failed = true;
                    return Some(Err(err));
                }
                None => break,
            }
        }
        if self.buffer.is_empty() {
            return None;
        }
        let pick = if self.buffer_size > 1 { self.rng.random_range(0..self.buffer.len()) } else { 0 };
        Some(Ok(self.buffer.swap_remove(pick)))
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        // Closing the channels stops the readers at their next send.
        self.current = None;
        let (_, empty) = bounded(0);
        self.shards = empty;
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn read_shards(next: &Mutex<std::vec::IntoIter<PathBuf>>, queue: &Sender<Receiver<Batch>>, prefetch: usize) {
    loop {
        // Claiming a shard and queueing its channel happen together, so channels queue in
        // shard order.
        let (path, sender) = {
            let mut next = next.lock().expect("reader queue poisoned");
            let Some(path) = next.next() else { return };
            let (sender, receiver) = bounded::<Batch>(prefetch);
            if queue.send(receiver).is_err() {
                return;
            }
            (path, sender)
        };
        if let Err(err) = stream_shard(&path, &sender) {
            let _ = sender.send(Err(err));
            return;
        }
    }
}

/// Streams one tar shard as batches of samples: consecutive members with the same key form a
/// sample, as WebDataset groups them.
fn stream_shard(path: &Path, sender: &Sender<Batch>) -> Result<()> {
    let file = std::fs::File::open(path).map_err(DataError::io(path))?;
    let mut archive = tar::Archive::new(std::io::BufReader::with_capacity(1 << 20, file));
    let mut batch = Vec::with_capacity(BATCH);
    let mut current: Option<Sample> = None;
    for entry in archive.entries().map_err(DataError::io(path))? {
        let mut entry = entry.map_err(DataError::io(path))?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let name = entry.path().map_err(DataError::io(path))?.to_string_lossy().into_owned();
        let Some((key, ext)) = split_key(&name) else { continue };
        let mut data = Vec::with_capacity(entry.size() as usize);
        std::io::Read::read_to_end(&mut entry, &mut data).map_err(DataError::io(path))?;
        match current.as_mut() {
            Some(sample) if sample.key == key => sample.fields.push((ext.to_lowercase(), data)),
            _ => {
                if let Some(done) =
                    current.replace(Sample { key: key.to_string(), fields: vec![(ext.to_lowercase(), data)] })
                {
                    batch.push(done);
                    if batch.len() == BATCH && sender.send(Ok(std::mem::take(&mut batch))).is_err() {
                        return Ok(());
                    }
                }
            }
        }
    }
    batch.extend(current);
    if !batch.is_empty() {
        let _ = sender.send(Ok(batch));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn every_shard_goes_to_exactly_one_rank(shards in 0usize..200, world in 1usize..=16, seed in any::<u64>(), epoch in 0u64..5) {
            let mut seen: Vec<usize> = (0..world).flat_map(|rank| assign_shards(shards, rank, world, seed, epoch)).collect();
            seen.sort();
            prop_assert_eq!(seen, (0..shards).collect::<Vec<_>>());
        }
    }

    #[test]
    fn the_order_is_the_documented_hash_order() {
        // What Python's hashlib gives for seed 7, epoch 3, 8 shards:
        // sorted(range(8), key=lambda i: sha256(f"7:3:{i}".encode()).digest())
        assert_eq!(assign_shards(8, 0, 1, 7, 3), PYTHON_ORDER_SEED7_EPOCH3);
        assert_eq!(
            assign_shards(8, 1, 3, 7, 3),
            PYTHON_ORDER_SEED7_EPOCH3.iter().copied().skip(1).step_by(3).collect::<Vec<_>>()
        );
    }

    const PYTHON_ORDER_SEED7_EPOCH3: [usize; 8] = [0, 4, 5, 3, 1, 7, 2, 6];

    #[test]
    fn the_split_changes_with_the_epoch_and_not_otherwise() {
        assert_eq!(assign_shards(100, 1, 4, 7, 0), assign_shards(100, 1, 4, 7, 0));
        assert_ne!(assign_shards(100, 1, 4, 7, 0), assign_shards(100, 1, 4, 7, 1));
        assert_ne!(assign_shards(100, 1, 4, 7, 0), assign_shards(100, 1, 4, 8, 0));
    }
}
