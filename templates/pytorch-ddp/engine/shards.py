"""The input pipeline: reads shards written by Trainyard's data pipeline (`yard-data pack`,
`data-pack` template) with the same rank assignment, per-epoch seeded shuffling, parallel decode
workers and a prefetch buffer.

Rank assignment is the data pipeline's rule (trainyard_data::reader::assign_shards): order the
shards by sha256("<seed>:<epoch>:<position>") and give rank r of w every w-th shard from r.
"""
import hashlib
import json
import os
import random
import tarfile

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


def assign_shards(shards, rank, world_size, seed, epoch):
    """The shard positions `rank` reads in `epoch`, in order (same rule as the Rust reader)."""
    order = sorted(range(shards), key=lambda i: hashlib.sha256(f"{seed}:{epoch}:{i}".encode()).digest())
    return order[rank::world_size]


def split_key(name):
    """WebDataset's rule: the key runs to the first dot of the last path component."""
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    if dot <= slash or dot == len(name) - 1:
        return None, None
    return name[:dot], name[dot + 1:].lower()


def read_shard(path):
    """Samples of one shard, through its index when it has one (a seek and a read per member, no
    tar parsing in Python), else by reading the tar."""
    index = path[: -len(".tar")] + ".idx.json" if path.endswith(".tar") else None
    if index and os.path.exists(index):
        entries = json.load(open(index))["samples"]
        with open(path, "rb", buffering=1 << 20) as f:
            for entry in entries:
                sample = {"__key__": entry["key"]}
                for member in entry["members"]:
                    f.seek(member["offset"])
                    sample[member["ext"]] = f.read(member["size"])
                yield sample
        return
    yield from read_tar(path)


def read_tar(path):
    """Samples of one tar shard: consecutive members with the same key form one sample."""
    current_key, sample = None, None
    with tarfile.open(path, mode="r|") as archive:
        for member in archive:
            if not member.isreg():
                continue
            key, ext = split_key(member.name)
            if key is None:
                continue
            data = archive.extractfile(member).read()
            if key != current_key:
                if sample is not None:
                    yield sample
                current_key, sample = key, {"__key__": key}
            sample[ext] = data
    if sample is not None:
        yield sample


class ShardDataset(IterableDataset):
    """One rank's samples for one epoch, decoded by `decode`. Each DataLoader worker reads every
    `workers`-th of the rank's shards; each has its own seeded shuffle buffer."""

    def __init__(self, root, decode, rank, world_size, seed, shuffle_buffer=1000):
        manifest = json.load(open(os.path.join(root, "dataset.json")))
        self.paths = [os.path.join(root, s["name"]) for s in manifest["shards"]]
        self.samples_total = manifest["samples"]
        self.decode, self.rank, self.world_size = decode, rank, world_size
        self.seed, self.shuffle_buffer = seed, shuffle_buffer
        # Shared with the decode workers, which persist across epochs.
        self._epoch = torch.multiprocessing.Value("i", 0)

    @property
    def epoch(self):
        return self._epoch.value

    def set_epoch(self, epoch):
        self._epoch.value = epoch

    def shards_of_rank(self):
        return assign_shards(len(self.paths), self.rank, self.world_size, self.seed, self.epoch)

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        mine = self.shards_of_rank()[worker::workers]
        rng = random.Random(f"{self.seed}:{self.epoch}:{self.rank}:{worker}")
        buffer = []
        for position in mine:
            for sample in read_shard(self.paths[position]):
                buffer.append(sample)
                if len(buffer) >= self.shuffle_buffer:
                    yield self.decode(buffer.pop(rng.randrange(len(buffer))))
        rng.shuffle(buffer)
        for sample in buffer:
            yield self.decode(sample)


def _ignore_sigterm(_worker_id):
    """Decode workers leave SIGTERM to the training process, which checkpoints and then stops
    them; otherwise a SIGTERM to the replica's process group would kill them first."""
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def loader(dataset, batch_size, workers, prefetch, pin_memory):
    """A DataLoader over the shards: `workers` decode processes, `prefetch` batches each ahead."""
    kwargs = {"num_workers": workers, "pin_memory": pin_memory, "worker_init_fn": _ignore_sigterm}
    if workers > 0:
        # Workers persist across epochs: no process start and import per epoch.
        kwargs.update(prefetch_factor=prefetch, persistent_workers=True)
    return DataLoader(dataset, batch_size=batch_size, **kwargs)
