"""Training throughput of two versions of the pytorch-ddp engine side by side, in one run: the
same data, model, steps and settings, one training process on CPU (gloo), the versions taking
turns (A, B, A, B, ...) so that the machine's slow minutes fall on both. Samples/s counts from
the first logged step to the last, so the start (imports, process group, first batches) is
left out.

Usage: engine_versions.py SHARDS LABEL_A ENGINE_A LABEL_B ENGINE_B [--rounds N] [--steps N]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

USER_MODULE = '''
import torch
from torch import nn


def build_model():
    return nn.Sequential(nn.Conv2d(3, 16, 3, stride=2), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2), nn.ReLU(),
                         nn.Flatten(), nn.Linear(32 * 15 * 15, 10))


def loss_fn(outputs, targets):
    return nn.functional.cross_entropy(outputs, targets)


def decode(sample):
    image = torch.frombuffer(bytearray(sample["bin"]), dtype=torch.float32).view(3, 64, 64)
    return image, int(sample["cls"])
'''

STEP = re.compile(r"^step (\d+) loss")


def one_run(engine, shards, user_module, steps, batch_size, port):
    out = tempfile.mkdtemp(prefix="engine-bench-")
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    for name in ("TRAINYARD_URL", "TRAINYARD_TOKEN", "TRAINYARD_JOB_ID"):
        env.pop(name, None)
    command = [sys.executable, os.path.join(engine, "train.py"), f"--data={shards}", f"--user-module={user_module}",
               "--epochs=1000", f"--max-steps={steps}", f"--batch-size={batch_size}", "--precision=fp32",
               f"--checkpoint-every={steps}", f"--output={out}", "--workers=2", "--prefetch=4", "--log-every=10"]
    first = last = None
    tail = []
    with subprocess.Popen(command, cwd=engine, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as process:
        for line in process.stdout:
            tail = (tail + [line])[-20:]
            match = STEP.match(line)
            if match:
                now = (int(match.group(1)), time.monotonic())
                first = first or now
                last = now
        if process.wait() != 0:
            raise SystemExit(f"{engine}: train.py failed with exit code {process.returncode}:\n{''.join(tail)}")
    if first is None or last[0] == first[0]:
        raise SystemExit(f"{engine}: too few logged steps to time")
    return (last[0] - first[0]) * batch_size / (last[1] - first[1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("shards")
    p.add_argument("label_a")
    p.add_argument("engine_a")
    p.add_argument("label_b")
    p.add_argument("engine_b")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(USER_MODULE)
        user_module = f.name
    results = {args.label_a: [], args.label_b: []}
    port = 29600
    for round_ in range(args.rounds):
        for label, engine in ((args.label_a, args.engine_a), (args.label_b, args.engine_b)):
            port += 1
            rate = one_run(os.path.abspath(engine), args.shards, user_module, args.steps, args.batch_size, port)
            results[label].append(rate)
            print(f"round {round_ + 1}: {label:<28} {rate:8.0f} samples/s", flush=True)
    print()
    print(f"| engine | samples/s, median of {args.rounds} | each run |")
    print("|---|---|---|")
    for label, rates in results.items():
        print(f"| {label} | {statistics.median(rates):,.0f} | {', '.join(f'{r:,.0f}' for r in rates)} |")


if __name__ == "__main__":
    main()
