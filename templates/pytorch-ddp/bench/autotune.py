"""Input pipeline autotune against hand tuning (issue 23): the same small training on a pipeline
made slow on purpose (a decode that burns CPU, as JPEG decoding and augmentations do), run with
the engine's previous default (2 workers, prefetch 4), a grid of hand-tuned settings (workers x
prefetch), and `auto`, taking turns round by round so that the machine's slow minutes fall on
all of them. Each run is the real engine (launch.py, train.py), one training process on CPU;
samples/s and the input stall share are the engine's own metrics for the whole run (its last
report), so autotune's measuring and trials (5-second windows, the default) count against it.

Usage: bench/autotune.py [--steps N] [--rounds N] [--workers 0,1,2,3,4] [--prefetch 2,8]
(from templates/pytorch-ddp, with the Python that has torch).
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.dont_write_bytecode = True

import shardset  # noqa: E402
from fake_trainyard import FakeTrainyard  # noqa: E402
from jobs import Job  # noqa: E402

# The example's 8x8 images, made 64x64 and put through ROUNDS of a 64x64 matrix product and
# tanh (about 3 ms of one core a sample here): an expensive decode. A one-conv model trains on them.
USER_MODULE = '''
import os

import torch
from torch import nn

ROUNDS = int(os.environ.get("BENCH_DECODE_ROUNDS", "100"))
MIX = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)) / 8


def build_model():
    return nn.Sequential(nn.Conv2d(1, 16, 5, stride=4), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 15 * 15, 4))


def loss_fn(outputs, targets):
    return nn.functional.cross_entropy(outputs, targets)


def decode(sample):
    image = torch.frombuffer(bytearray(sample["bin"]), dtype=torch.float32).view(8, 8).repeat(8, 8)
    for _ in range(ROUNDS):
        image = torch.tanh(image @ MIX)
    return image.unsqueeze(0), int(sample["cls"])
'''


def one_run(folder, data, user_module, steps, workers, prefetch):
    """(samples/s, stall share, the settings it ended with) of one run."""
    trainyard = FakeTrainyard()
    try:
        job = Job(folder, data, replicas=1, user_module=user_module, env=trainyard.env(), workers=workers,
                  prefetch=prefetch, epochs=1000, max_steps=steps, batch_size=32, log_every=10,
                  checkpoint_every=steps)
        job.start()
        codes = job.wait(1800)
    finally:
        trainyard.close()
    if codes != [0]:
        sys.exit(f"workers={workers} prefetch={prefetch} failed:\n{job.logs()}")
    last = {name: trainyard.series(name)[-1][1] for name in
            ("samples_per_second", "input_stall_share", "input_workers", "input_prefetch")}
    return last["samples_per_second"], last["input_stall_share"], (int(last["input_workers"]),
                                                                   int(last["input_prefetch"]))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--workers", default="0,1,2,3,4")
    p.add_argument("--prefetch", default="2,8")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="autotune-bench-")
    data = os.path.join(work, "data")
    shardset.write_dataset(data, [args.samples // 8] * 8)
    user_module = os.path.join(work, "slow_decode.py")
    with open(user_module, "w") as f:
        f.write(USER_MODULE)
    settings = [("previous default", 2, 4)]
    settings += [(f"hand-tuned {w} x {p}", int(w), int(p)) for w in args.workers.split(",")
                 for p in args.prefetch.split(",") if not (int(w) == 0 and p != args.prefetch.split(",")[0])]
    settings += [("auto", "auto", "auto")]
    print(f"{os.cpu_count()} cores (affinity {len(os.sched_getaffinity(0))}), {args.steps} steps of 32, "
          f"{args.rounds} rounds, data in {work}", flush=True)
    results = {label: [] for label, _, _ in settings}
    for round_ in range(args.rounds):
        for label, workers, prefetch in settings:
            began = time.monotonic()
            folder = os.path.join(work, f"run-{round_}-{label.replace(' ', '_')}")
            result = one_run(folder, data, user_module, args.steps, workers, prefetch)
            results[label].append(result)
            print(f"round {round_ + 1} {label}: {result[0]:.0f} samples/s, stall {result[1]:.1%}, ended at "
                  f"{result[2][0]} x {result[2][1]} ({time.monotonic() - began:.0f} s)", flush=True)
    print("\n| setting (workers x prefetch) | samples/s, median | each run | input stall share, median | "
          "ended at |\n|---|---|---|---|---|")
    for label, _, _ in settings:
        runs = results[label]
        print(f"| {label} | {statistics.median(r[0] for r in runs):,.0f} | "
              f"{', '.join(f'{r[0]:,.0f}' for r in runs)} | {statistics.median(r[1] for r in runs):.1%} | "
              f"{', '.join(f'{r[2][0]} x {r[2][1]}' for r in runs)} |")


if __name__ == "__main__":
    main()
