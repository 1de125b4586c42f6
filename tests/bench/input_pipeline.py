"""Input pipeline benchmark for the pytorch-ddp engine: samples/s and input stall time of the
engine's shard pipeline against a plain torch.utils.data.DataLoader over the same samples stored
as individual files, feeding the same small model on this machine's CPU.

Usage: input_pipeline.py FILES_DIR SHARDS_DIR [--steps N] [--batch-size B] [--workers W]
"""
import argparse
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../templates/pytorch-ddp/engine"))
import shards  # noqa: E402


def decode(sample):
    image = torch.frombuffer(bytearray(sample["bin"]), dtype=torch.float32).view(3, 64, 64)
    return image, int(sample["cls"])


class Files(Dataset):
    """The plain way: one file read (two, with the label) per sample."""

    def __init__(self, root):
        self.keys = sorted(os.path.join(d, f[:-4]) for d, _, fs in os.walk(root) for f in fs if f.endswith(".bin"))

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, i):
        with open(self.keys[i] + ".bin", "rb") as f:
            data = f.read()
        with open(self.keys[i] + ".cls", "rb") as f:
            label = f.read()
        return decode({"bin": data, "cls": label})


def engine_batches(root, batch_size, workers):
    """The engine's pipeline driven as train.py drives it: epoch after epoch, every batch of the
    rank's share (one rank here)."""
    dataset = shards.ShardDataset(root, decode, 0, 1, 0, batch_size)
    loader = shards.loader(dataset, workers, 4, False, seed=0)
    epoch = 0
    while True:
        loader.sampler.start(epoch, 0, dataset.plan.samples_per_rank // batch_size)
        for batch, _keys in loader:
            yield batch
        epoch += 1


def drop_caches():
    """Empties the page cache (root only) so that a run reads from the disk, as a first epoch
    over a big dataset does. Returns whether it could."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def run(name, batches, steps):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.Flatten(), nn.LazyLinear(10))
    optimizer = None
    stall, samples, step = 0.0, 0, 0
    started = time.time()
    iterator = iter(batches)
    while step < steps:
        waited = time.time()
        try:
            inputs, targets = next(iterator)
        except StopIteration:
            iterator = iter(batches)
            continue
        stall += time.time() - waited
        loss = nn.functional.cross_entropy(model(inputs), targets)
        if optimizer is None:
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        samples += len(targets)
        step += 1
    seconds = time.time() - started
    print(f"{name:<34} {samples / seconds:>8.0f} samples/s   input stall {stall:6.2f} s of {seconds:6.2f} s ({100 * stall / seconds:4.1f}%)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("files")
    p.add_argument("shards")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(1)
    plain = DataLoader(Files(args.files), batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                       prefetch_factor=4, persistent_workers=True)
    ours = engine_batches(args.shards, args.batch_size, args.workers)
    if drop_caches():
        print("cold page cache (dropped before each run):")
        for name, batches in (("plain DataLoader over files", plain), ("pytorch-ddp shard pipeline", ours)):
            drop_caches()
            run(name, batches, args.steps)
    else:
        print("cannot drop the page cache here (not root): cold runs skipped")
    print("warm page cache:")
    for name, batches in (("plain DataLoader over files", plain), ("pytorch-ddp shard pipeline", ours)):
        run(name, batches, args.steps)


if __name__ == "__main__":
    main()
