"""The input pipeline: reads shards written by Trainyard's data pipeline (`yard-data pack`,
`data-pack` template), gives every rank the same number of batches each epoch, decodes in worker
processes with a prefetch buffer (both can change between any two batches: `BatchStream`, for
autotune), and can start any epoch at any batch, so a resumed run sees each sample exactly once
per epoch.

The epoch's order (`EpochPlan`, pure and deterministic):
1. Shards are ordered by sha256("<seed>:<epoch>:<position>"), the data pipeline's rule
   (trainyard_data::reader::assign_shards; `assign_shards` below is the same and a test checks
   Python and Rust agree).
2. Their samples, in that order, are one sequence of N; rank r of w takes the contiguous slice
   [r * N // w, (r + 1) * N // w): whole shards but at most two split ones, and every rank the
   same count, whatever the shard sizes (7 shards over 2 ranks included).
3. Each rank shuffles its slice in blocks of `shuffle_block` samples, block b with a permutation
   seeded by (seed, epoch, rank, b).
4. Drop, not pad: each epoch trains floor(N / w / (batch * grad_accum)) optimizer steps on every
   rank; the at most w * batch * grad_accum - 1 + (N mod w) samples beyond that are left out of
   that epoch. Padding would repeat samples within an epoch; what is left out differs from epoch
   to epoch because the shard order does.

A position in an epoch is a sample count (the cursor); the sequence is a function of the plan's
description (`EpochPlan.description`), so (epoch, cursor) and that description resume a rank
exactly where it stopped, with no sample read to skip ahead.
"""
import bisect
import collections
import contextlib
import hashlib
import json
import multiprocessing
import os
import random
import signal
import tarfile
import time
import warnings

import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data import default_collate

import seeds


def assign_shards(shards, rank, world_size, seed, epoch):
    """The shard positions `rank` reads in `epoch`, in order, under the data pipeline's rule (the
    Rust reader's): every `world_size`-th shard of the epoch's order, from `rank`."""
    order = sorted(range(shards), key=lambda i: hashlib.sha256(f"{seed}:{epoch}:{i}".encode()).digest())
    return order[rank::world_size]


def epoch_shard_order(shards, seed, epoch):
    """Every shard position, in the epoch's order."""
    return assign_shards(shards, 0, 1, seed, epoch)


def rank_share(shard_samples, rank, world_size, seed, epoch):
    """The samples `rank` is given in `epoch` (before its block shuffle and the drop of what
    does not fill a step), as (shard position, first index, end index) pieces in the epoch's
    order: its contiguous share [rank * n, (rank + 1) * n) of the epoch's sequence, with
    n = sum(shard_samples) // world_size (step 2 of the module's rule). Needs only the shards'
    sample counts."""
    per_rank = sum(shard_samples) // world_size
    first, end = rank * per_rank, (rank + 1) * per_rank
    pieces, start = [], 0
    for shard in epoch_shard_order(len(shard_samples), seed, epoch):
        stop = start + shard_samples[shard]
        low, high = max(first, start), min(end, stop)
        if low < high:
            pieces.append((shard, low - start, high - start))
        start = stop
    return pieces


class EpochPlan:
    """Which sample (shard position, index in the shard) `rank` trains on at each position of an
    epoch. Needs only the shards' sample counts: no data is read."""

    def __init__(self, shard_samples, rank, world_size, seed, shuffle_block, content=""):
        self.shard_samples = list(shard_samples)
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.shuffle_block = max(1, shuffle_block)
        self.content = content
        self.samples_total = sum(self.shard_samples)
        self.samples_per_rank = self.samples_total // world_size
        self._epoch_cache = (None, None, None)
        self._blocks = collections.OrderedDict()

    def description(self):
        """What the sequence depends on (besides the epoch): a saved position is valid for a
        plan with the same description."""
        return {"seed": self.seed, "rank": self.rank, "world_size": self.world_size,
                "shuffle_block": self.shuffle_block, "samples_per_rank": self.samples_per_rank,
                "content": self.content}

    def _epoch(self, epoch):
        cached_epoch, order, starts = self._epoch_cache
        if cached_epoch != epoch:
            order = epoch_shard_order(len(self.shard_samples), self.seed, epoch)
            starts, total = [], 0
            for shard in order:
                starts.append(total)
                total += self.shard_samples[shard]
            self._epoch_cache = (epoch, order, starts)
        return order, starts

    def _block(self, epoch, block):
        key = (epoch, block)
        if key not in self._blocks:
            first = block * self.shuffle_block
            size = min(self.shuffle_block, self.samples_per_rank - first)
            permutation = list(range(size))
            random.Random(f"{self.seed}:{epoch}:{self.rank}:{block}").shuffle(permutation)
            self._blocks[key] = permutation
            if len(self._blocks) > 4:
                self._blocks.popitem(last=False)
        return self._blocks[key]

    def sample_at(self, epoch, position):
        """(shard position, index within the shard) of this rank's `position`-th sample."""
        if not 0 <= position < self.samples_per_rank:
            raise IndexError(f"position {position} beyond the rank's {self.samples_per_rank} samples")
        block, offset = divmod(position, self.shuffle_block)
        within = self._block(epoch, block)[offset]
        overall = self.rank * self.samples_per_rank + block * self.shuffle_block + within
        order, starts = self._epoch(epoch)
        k = bisect.bisect_right(starts, overall) - 1
        return order[k], overall - starts[k]

    def samples(self, epoch, start, count):
        return [self.sample_at(epoch, p) for p in range(start, start + count)]

    def block_pieces(self, epoch, block):
        """The samples of shuffle block `block` as (shard position, first index, end index)
        pieces: a block holds a contiguous run of the epoch's sequence, whatever its order."""
        first = self.rank * self.samples_per_rank + block * self.shuffle_block
        end = first + min(self.shuffle_block, self.samples_per_rank - block * self.shuffle_block)
        order, starts = self._epoch(epoch)
        k, pieces = bisect.bisect_right(starts, first) - 1, []
        while first < end:
            shard_end = starts[k] + self.shard_samples[order[k]]
            piece_end = min(end, shard_end)
            if piece_end > first:
                pieces.append((order[k], first - starts[k], piece_end - starts[k]))
            first, k = piece_end, k + 1
        return pieces


def split_key(name):
    """WebDataset's rule: the key runs to the first dot of the last path component."""
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    if dot <= slash or dot == len(name) - 1:
        return None, None
    return name[:dot], name[dot + 1:].lower()


def shard_index(path, index_path):
    """Each sample's key and its members' data offsets and sizes: the shard's index file
    (written by `yard-data pack`), else read from the tar headers."""
    if index_path and os.path.exists(index_path):
        with open(index_path) as f:
            return json.load(f)["samples"]
    samples, current = [], None
    with tarfile.open(path, mode="r:") as archive:
        for member in archive:
            key, ext = split_key(member.name) if member.isreg() else (None, None)
            if key is None:
                continue
            if current is None or current["key"] != key:
                current = {"key": key, "offset": member.offset, "members": []}
                samples.append(current)
            current["members"].append({"ext": ext, "offset": member.offset_data, "size": member.size})
    return samples


class DecodeTimes:
    """The seconds decode processes spent reading and decoding batches, and the batches they
    made: running totals in memory shared with the decode workers (they are forked after it is
    made), a slot per worker id and one for decoding in the training process; a slot has one
    writer at a time (a replaced worker's id passes to a new one only after it exited). What
    autotune measures the input stage by."""

    SLOTS = 1 + 64

    def __init__(self):
        self.seconds = multiprocessing.RawArray("d", self.SLOTS)
        self.batches = multiprocessing.RawArray("q", self.SLOTS)

    def add(self, seconds):
        info = torch.utils.data.get_worker_info()
        slot = 0 if info is None else 1 + info.id
        if slot < self.SLOTS:
            self.seconds[slot] += seconds
            self.batches[slot] += 1

    def totals(self):
        """(seconds, batches) over every process so far."""
        return sum(self.seconds), sum(self.batches)


class ShardDataset(Dataset):
    """Batches of one rank: item (epoch, batch) is micro-batch `batch` of `epoch` (samples
    [batch * batch_size, (batch + 1) * batch_size) of the rank's plan), decoded by `decode` under
    the batch's seed and collated; with the samples' keys."""

    def __init__(self, root, decode, rank, world_size, seed, batch_size, shuffle_block=1000):
        with open(os.path.join(root, "dataset.json")) as f:
            manifest = json.load(f)
        shards = manifest["shards"]
        self.paths = [os.path.join(root, s["name"]) for s in shards]
        # `yard-data pack` names each shard's index; <shard>.idx.json beside it otherwise.
        self.index_paths = [os.path.join(root, s.get("index") or s["name"].removesuffix(".tar") + ".idx.json")
                            for s in shards]
        self.plan = EpochPlan([s["samples"] for s in shards], rank, world_size, seed, shuffle_block,
                              manifest.get("content_hash", ""))
        self.decode, self.rank, self.seed, self.batch_size = decode, rank, seed, batch_size
        # Per process (each decode worker fills its own): indexes and open files, newest kept.
        self._indexes = collections.OrderedDict()
        self._files = collections.OrderedDict()
        self._read_ahead = collections.deque(maxlen=8)
        self.decode_times = DecodeTimes()

    def _index(self, shard):
        if shard not in self._indexes:
            self._indexes[shard] = shard_index(self.paths[shard], self.index_paths[shard])
            if len(self._indexes) > 16:
                self._indexes.popitem(last=False)
        self._indexes.move_to_end(shard)
        return self._indexes[shard]

    def _file(self, shard):
        if shard not in self._files:
            self._files[shard] = os.open(self.paths[shard], os.O_RDONLY)
            if len(self._files) > 16:
                os.close(self._files.popitem(last=False)[1])
        self._files.move_to_end(shard)
        return self._files[shard]

    def read(self, shard, index):
        """Sample `index` of shard `shard` as {"__key__": key, ext: bytes}. pread: no shared file
        offset, so a file opened before the workers forked is safe."""
        entry, fd = self._index(shard)[index], self._file(shard)
        sample = {"__key__": entry["key"]}
        for member in entry["members"]:
            sample[member["ext"]] = os.pread(fd, member["size"], member["offset"])
        return sample

    def read_ahead(self, epoch, block):
        """Asks the kernel to read a shuffle block's bytes (once per process): with a cold page
        cache, one sequential read-ahead instead of a disk seek per sample."""
        if (epoch, block) in self._read_ahead or block * self.plan.shuffle_block >= self.plan.samples_per_rank:
            return
        self._read_ahead.append((epoch, block))
        for shard, first, end in self.plan.block_pieces(epoch, block):
            entries = self._index(shard)
            start, last = entries[first]["members"][0]["offset"], entries[end - 1]["members"][-1]
            os.posix_fadvise(self._file(shard), start, last["offset"] + last["size"] - start, os.POSIX_FADV_WILLNEED)

    def __getitem__(self, item):
        began = time.monotonic()
        epoch, batch = item
        start = batch * self.batch_size
        first_block = start // self.plan.shuffle_block
        for block in range(first_block, (start + self.batch_size - 1) // self.plan.shuffle_block + 2):
            self.read_ahead(epoch, block)  # this batch's blocks and the next
        samples = [self.read(shard, index) for shard, index in self.plan.samples(epoch, start, self.batch_size)]
        with seeds.seeded(seeds.batch_seed(self.seed, epoch, self.rank, batch)):
            decoded = [self.decode(sample) for sample in samples]
        collated = default_collate(decoded)
        self.decode_times.add(time.monotonic() - began)
        return collated, [sample["__key__"] for sample in samples]


class EpochBatches(Sampler):
    """The micro-batches the training loop asks for next: (epoch, batch) for batch in
    [first, end). Set before each pass over the loader."""

    def __init__(self):
        self.epoch, self.first, self.end = 0, 0, 0

    def start(self, epoch, first, end):
        self.epoch, self.first, self.end = epoch, first, end

    def __iter__(self):
        epoch = self.epoch
        return ((epoch, batch) for batch in range(self.first, self.end))

    def __len__(self):
        return self.end - self.first


def _ignore_sigterm(_worker_id):
    """Decode workers leave SIGTERM to the training process, which checkpoints and then stops
    them (`stop_decode_workers`); otherwise a SIGTERM to the replica's process group would kill
    them first."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def loader(dataset, workers, prefetch, pin_memory, seed):
    """A DataLoader over `dataset`'s batches in the order `loader.sampler` gives: `workers` decode
    processes with `prefetch` batches each ahead, results in request order. Its own generator:
    starting workers draws no number from the training process's generators."""
    kwargs = {"batch_size": None, "sampler": EpochBatches(), "num_workers": workers, "pin_memory": pin_memory,
              "worker_init_fn": _ignore_sigterm, "generator": torch.Generator().manual_seed(seed)}
    if workers > 0:
        # Workers persist across epochs (no process start and import per epoch) and are forked,
        # so a `decode` from a module loaded by path needs no pickling.
        kwargs.update(prefetch_factor=prefetch, persistent_workers=True, multiprocessing_context="fork")
    return DataLoader(dataset, **kwargs)


class BatchStream:
    """The rank's micro-batches in the order `EpochBatches` gives them, through a loader that can
    be rebuilt with other `workers` and `prefetch` between any two batches (`resize`, the
    autotune's changes): a DataLoader cannot change its number of workers in place, but any
    epoch can start at any batch, and batch b of an epoch is the same samples decoded under the
    same seed whoever decodes it, so the sequence is exactly the same whatever the changes."""

    def __init__(self, dataset, workers, prefetch, pin_memory, seed):
        self.dataset, self.pin_memory, self.seed = dataset, pin_memory, seed
        self.workers, self.prefetch = workers, prefetch
        self.loader = loader(dataset, workers, prefetch, pin_memory, seed)
        self._batches, self.tuned = None, False
        self.epoch = self.next_batch = self.end = 0

    def start(self, epoch, first, end):
        """Micro-batches [first, end) of `epoch` come next."""
        self.epoch, self.next_batch, self.end = epoch, first, end
        self.loader.sampler.start(epoch, first, end)
        with self._quiet():
            self._batches = iter(self.loader)

    def __iter__(self):
        return self

    def __next__(self):
        item = next(self._batches)
        self.next_batch += 1
        return item

    def worker_pids(self):
        """The process ids of the current decode workers (none with workers=0)."""
        return [w.pid for w in getattr(self._batches, "_workers", ()) if w.is_alive()]

    def resize(self, workers, prefetch):
        """Goes on from the next batch not yet returned with `workers` decode processes and
        `prefetch` batches each: the current workers are stopped (what they decoded ahead is
        dropped and decoded again by the new ones) and a new loader starts at that batch."""
        self.stop()
        self.workers, self.prefetch, self.tuned = workers, prefetch, True
        with self._quiet():
            self.loader = loader(self.dataset, workers, prefetch, self.pin_memory, self.seed)
        self.start(self.epoch, self.next_batch, self.end)

    @contextlib.contextmanager
    def _quiet(self):
        """torch warns past one decode worker per core: not once autotune measured what they give."""
        with warnings.catch_warnings():
            if self.tuned:
                warnings.filterwarnings("ignore", "This DataLoader will create")
            yield

    def stop(self):
        """Stops the decode workers as the DataLoader does when it is done with them: asks them
        to exit, joins them (terminating any that does not), and unregisters them from its
        SIGCHLD handler, so that their exit is not taken for a failure."""
        shutdown = getattr(self._batches, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self._batches = None
        self.loader = None


def stop_decode_workers():
    """Kills this process's decode workers and waits for them. They ignore SIGTERM, hold nothing
    worth saving, and a worker left running keeps its parent from exiting (multiprocessing joins
    its children at exit). The DataLoader's SIGCHLD handler, which turns a worker's death into
    an exception in the training process, is removed first."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    children = multiprocessing.active_children()
    for child in children:
        child.kill()
    for child in children:
        child.join(timeout=5)
