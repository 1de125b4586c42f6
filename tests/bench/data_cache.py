"""One dataset read four ways, one full pass over every sample each, taking turns round by round
(issue 23): the packed folder on a local path, `store:NAME@VERSION` through the server with an
empty node cache (uncached), the same with the cache warm (cached), and webdataset reading the
same .tar shards straight from the S3 server (curl signs the requests). A fifth arm is a what-if,
not the engine as it is: cached, with the cache trusting a cached shard of the right size instead
of hashing it again (`shards_trusted`). tests/bench/data_cache.sh sets everything up and runs
this.

A store arm's time is the view's setup (manifest, indexes, every shard fetched or verified: what a
job does before its first step; the manifest's and indexes' share is timed apart) plus the pass.

The three engine arms use the engine's own code: `shards.ShardDataset` and `shards.loader` (its
2 decode workers, prefetch 4, shuffle blocks of 1,000) for the pass, `remote.dataset_view` for
the store (the view a job makes at start: manifest, indexes, every shard opened through the
cache, fetched or verified). Webdataset runs its usual pipeline in a DataLoader with the same 2
workers: `WebDataset(urls).shuffle(1000)`, batches of 64. The per-sample work is the same
everywhere: the sample's member bytes are read into memory and counted (no decoding of their
content, which would be the same cost in every arm and hide the differences in reading).

Before every arm the dataset's files (the packed folder, the S3 server's objects, the node cache)
are dropped from the page cache (fsync, then POSIX_FADV_DONTNEED, which needs no root and leaves
the rest of the machine's cache alone), so every arm starts cold; the driver caps the page cache
the whole benchmark may use (a memory cgroup) below the dataset's size, so no arm can keep the
dataset in memory between its two reads (the cached arm's verification and its pass).
"""
import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import time
import urllib.request

ENGINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "templates", "pytorch-ddp", "engine")
sys.path.insert(0, ENGINE)

import torch  # noqa: E402
import webdataset as wds  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import cache  # noqa: E402
import remote  # noqa: E402
import shards  # noqa: E402

BATCH = 64
WORKERS = 2
PREFETCH = 4
SHUFFLE = 1000
ARMS = ("local", "uncached", "cached", "cached-trusted", "webdataset")


def sample_bytes(sample):
    """The work done per sample in every arm: the member bytes, counted."""
    return torch.tensor(sum(len(v) for k, v in sample.items() if not k.startswith("__")))


def engine_pass(folder):
    """One pass over every sample of the packed folder `folder` through the engine's reader:
    (samples, bytes)."""
    dataset = shards.ShardDataset(folder, sample_bytes, rank=0, world_size=1, seed=0, batch_size=BATCH,
                                  shuffle_block=SHUFFLE)
    batches = dataset.plan.samples_per_rank // BATCH
    stream = shards.BatchStream(dataset, WORKERS, PREFETCH, pin_memory=False, seed=0)
    samples = size = 0
    try:
        stream.start(0, 0, batches)
        for sizes, _keys in stream:
            samples += len(sizes)
            size += int(sizes.sum())
    finally:
        stream.stop()
    return samples, size


def webdataset_pass(urls):
    pipeline = (wds.WebDataset(urls, shardshuffle=False, empty_check=False)
                .shuffle(SHUFFLE).map(sample_bytes).batched(BATCH, collation_fn=torch.stack, partial=True))
    loader = DataLoader(pipeline, batch_size=None, num_workers=WORKERS, prefetch_factor=PREFETCH)
    samples = size = 0
    for sizes in loader:
        samples += len(sizes)
        size += int(sizes.sum())
    return samples, size


@contextlib.contextmanager
def shards_trusted():
    """A what-if, not the engine's behaviour: the cache takes a cached shard of the right size
    as good without hashing it again, as it would with a node-wide record of the shards it has
    verified (today each process hashes every cached shard it opens once)."""
    original = cache._has_content
    cache._has_content = lambda fd, _sha256, size: os.fstat(fd).st_size == size
    try:
        yield
    finally:
        cache._has_content = original


class SmallFileTimer:
    """Counts the seconds the view spends fetching the manifest and the indexes (`DatasetFiles.read`;
    shards go through `copy`), to split a store arm's setup into those and the shards' opening."""

    def __init__(self):
        self.seconds = 0.0
        self._read = remote.DatasetFiles.read
        timer = self

        def timed_read(files, file):
            began = time.monotonic()
            try:
                return timer._read(files, file)
            finally:
                timer.seconds += time.monotonic() - began
        remote.DatasetFiles.read = timed_read


def cgroup_memory():
    """(anonymous, page cache) bytes the benchmark's memory cgroup holds now, or None."""
    folder = os.environ.get("BENCH_CGROUP")
    if not folder:
        return None
    stats = {}
    with open(os.path.join(folder, "memory.stat")) as f:
        for line in f:
            key, value = line.split()
            stats[key] = int(value)
    if "total_rss" in stats:  # cgroup v1
        return stats["total_rss"], stats["total_cache"]
    return stats["anon"], stats["file"]


def served_bytes(url, token, tenant):
    """The server's `trainyard_dataset_bytes_served_total` for `tenant`, by kind."""
    request = urllib.request.Request(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"})
    text = urllib.request.urlopen(request).read().decode()
    prefix = f'trainyard_dataset_bytes_served_total{{tenant="{tenant}",kind="'
    out = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            kind, value = line[len(prefix):].split('"}', 1)
            out[kind] = int(float(value))
    return out


def drop_from_page_cache(folders):
    """Every file under `folders` out of the page cache: written back first (DONTNEED keeps
    dirty pages), then let go."""
    for folder in folders:
        for parent, _dirs, files in os.walk(folder):
            for name in files:
                try:
                    fd = os.open(os.path.join(parent, name), os.O_RDONLY)
                except OSError:
                    continue
                try:
                    os.fdatasync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--packed", required=True, help="the packed folder (local path arm)")
    p.add_argument("--url", required=True, help="the Trainyard server")
    # The token comes in the environment, never on a command line (where `ps` shows it).
    p.add_argument("--token", default=os.environ.get("TRAINYARD_TOKEN"),
                   help="default: $TRAINYARD_TOKEN, a token of the dataset's tenant (and /metrics)")
    p.add_argument("--tenant", default="default", help="the tenant's name in the server's metrics")
    p.add_argument("--dataset", required=True, help="NAME@VERSION")
    p.add_argument("--cache-dir", required=True)
    p.add_argument("--s3-urls", required=True, help="a file: one signed-curl pipe: URL per shard")
    p.add_argument("--s3-counts", required=True, help="the file curl appends each shard's downloaded bytes to")
    p.add_argument("--cold", nargs="*", default=[], help="folders dropped from the page cache before each arm")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", help="write every run here")
    args = p.parse_args()
    if not args.token:
        p.error("set TRAINYARD_TOKEN (a token of the dataset's tenant)")

    dataset = remote.store_dataset(f"store:{args.dataset}")
    environ = {"TRAINYARD_URL": args.url, "TRAINYARD_TOKEN": args.token, "TRAINYARD_CACHE_DIR": args.cache_dir,
               "TRAINYARD_CACHE_NAMESPACE": "bench", "TRAINYARD_CACHE_PRIVATE": "1"}
    with open(args.s3_urls) as f:
        urls = [line.strip() for line in f if line.strip()]

    def local():
        began = time.monotonic()
        samples, size = engine_pass(args.packed)
        return {"setup_s": 0.0, "pass_s": time.monotonic() - began, "samples": samples, "bytes": size}

    def store(empty_cache, trusted=False):
        if empty_cache:
            shutil.rmtree(args.cache_dir, ignore_errors=True)
        before = served_bytes(args.url, args.token, args.tenant)
        small_files.seconds = 0.0
        began = time.monotonic()
        with shards_trusted() if trusted else contextlib.nullcontext(), \
                remote.dataset_view(dataset, environ=environ) as view:
            ready = time.monotonic()
            samples, size = engine_pass(view.folder)
            ended = time.monotonic()
            counts = view.counts()
        after = served_bytes(args.url, args.token, args.tenant)
        served = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        return {"setup_s": ready - began, "pass_s": ended - ready, "small_files_s": small_files.seconds,
                "samples": samples, "bytes": size,
                "store_bytes": served.get("shard", 0), "other_bytes": sum(served.values()) - served.get("shard", 0),
                "store_bytes_by_kind": served,
                "engine_bytes_fetched": counts["data/bytes_fetched"], "cache_hits": counts["data/cache_hits"]}

    def webdataset():
        open(args.s3_counts, "w").close()
        began = time.monotonic()
        samples, size = webdataset_pass(urls)
        took = time.monotonic() - began
        with open(args.s3_counts) as f:
            fetched = [int(float(line)) for line in f if line.strip()]
        if len(fetched) != len(urls):
            raise SystemExit(f"curl reported {len(fetched)} downloads for {len(urls)} shards")
        return {"setup_s": 0.0, "pass_s": took, "samples": samples, "bytes": size, "store_bytes": sum(fetched)}

    small_files = SmallFileTimer()
    runs = {arm: [] for arm in ARMS}
    order = {"local": local, "uncached": lambda: store(True), "cached": lambda: store(False),
             "cached-trusted": lambda: store(False, trusted=True),
             "webdataset": webdataset}
    for round_ in range(args.rounds):
        # uncached must come right before cached (it fills the cache); local and webdataset take
        # turns at the ends so neither always follows the same arm.
        sequence = ["local", "uncached", "cached", "cached-trusted", "webdataset"]
        if round_ % 2:
            sequence = ["webdataset", "uncached", "cached", "cached-trusted", "local"]
        for arm in sequence:
            drop_from_page_cache(args.cold)
            run = order[arm]()
            run["epoch_s"] = run["setup_s"] + run["pass_s"]
            run["load1"] = os.getloadavg()[0]
            memory = cgroup_memory()
            if memory:
                run["cgroup_anon"], run["cgroup_page_cache"] = memory
            runs[arm].append(run)
            extra = f", {run['store_bytes'] / 1e6:,.1f} MB of shards from the store" if "store_bytes" in run else ""
            if "small_files_s" in run:
                extra += f", manifest and indexes {run['small_files_s']:.2f} s of the setup"
            if "other_bytes" in run:
                extra += f" (and {run['other_bytes'] / 1e6:,.2f} MB of manifest and indexes)"
            print(f"round {round_ + 1} {arm:10s}: {run['epoch_s']:6.2f} s (setup {run['setup_s']:.2f} + pass "
                  f"{run['pass_s']:.2f}), {run['samples']} samples, {run['bytes'] / 1e6:,.1f} MB{extra}; "
                  f"load {run['load1']:.1f}" + (f", cgroup {memory[0] >> 20} MiB anonymous + {memory[1] >> 20} MiB "
                                                f"page cache" if memory else ""), flush=True)

    expected = {(r["samples"], r["bytes"]) for arm in ARMS for r in runs[arm] if arm != "webdataset"}
    if len(expected) != 1:
        raise SystemExit(f"the engine arms read different samples: {expected}")
    print()
    print("| arm | epoch s, median (min-max) | setup + pass s, medians | samples/s | MB/s "
          "| shard MB from the object store, each run |")
    print("|---|---|---|---|---|---|")
    for arm in ARMS:
        rs = runs[arm]
        epoch = statistics.median(r["epoch_s"] for r in rs)
        setup = statistics.median(r["setup_s"] for r in rs)
        pass_ = statistics.median(r["pass_s"] for r in rs)
        samples, size = rs[0]["samples"], rs[0]["bytes"]
        store = ", ".join(f"{r['store_bytes'] / 1e6:,.1f}" for r in rs) if "store_bytes" in rs[0] else "0 (local disk)"
        print(f"| {arm} | {epoch:.2f} ({min(r['epoch_s'] for r in rs):.2f}-{max(r['epoch_s'] for r in rs):.2f}) "
              f"| {setup:.2f} + {pass_:.2f} | {samples / epoch:,.0f} | {size / 1e6 / epoch:,.0f} | {store} |")
    local_s = statistics.median(r["epoch_s"] for r in runs["local"])
    cached_s = statistics.median(r["epoch_s"] for r in runs["cached"])
    trusted_s = statistics.median(r["epoch_s"] for r in runs["cached-trusted"])
    print(f"\ncached / local = {cached_s / local_s:.3f} (target at most 1.10); "
          f"cached-trusted / local = {trusted_s / local_s:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
