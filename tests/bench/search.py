"""Time to a target loss (issue 40): the same trials of pytorch-ddp on the packed toy images (CPU),
at the same concurrency, searched three ways in one run on one machine:

- Trainyard, random search: every trial trained to max_length, as jobs;
- Trainyard, ASHA: trials paused at their rungs with a checkpoint, the best resumed, as jobs;
- Optuna 5's SuccessiveHalvingPruner, run by Optuna's own driver (study.optimize, n_jobs =
  the concurrency): the same engine started straight from this script (no Trainyard), rung after
  rung from its checkpoint, the pruner deciding at each rung.

Every way trains the same trials in the same order: Trainyard's random and ASHA searches draw a
trial's values from the seed and its number alone, and Optuna is given them (enqueue_trial).
The target is a loss that only good trials reach: the third best final loss of the random search
(which trains every trial to the end), so it is known once that search is over; each way's time to
target is from its start to the first result at or below it. Prints one table.

Usage: python search.py --url URL --token TOKEN --data SHARDS [--trials 12] [--concurrency 2]
       [--max-length 96] [--divisor 2] [--rungs 3] [--seed 3]"""
import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import optuna

ENGINE_TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "templates", "pytorch-ddp")


def call(args, method, path, body=None):
    request = urllib.request.Request(
        f"{args.url}{path}", method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {args.token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read() or b"null")


def params_of(args):
    """What every trial shares: one replica of one process on one core, the engine's example
    model, a fixed seed and order, no checkpoint in between rungs but the rung's own."""
    return {"data": args.data, "python": sys.executable, "cpu": 1, "memory": "1Gi", "batch_size": 64,
            "workers": "1", "prefetch": "2", "precision": "fp32", "epochs": 1000, "warmup_steps": 4,
            "checkpoint_every": 100000, "deterministic": True}


def space():
    return {"lr": {"type": "float", "min": 0.0003, "max": 3.0, "log": True}}


def trainyard_search(args, method):
    """Runs one search through Trainyard; returns (results, seconds): each result (seconds from
    the start, trial, rung, value), in the order they appeared."""
    body = {"name": f"bench-{method}", "template": "pytorch-ddp", "params": params_of(args), "space": space(),
            "searcher": {"method": method, "metric": "loss", "goal": "minimize", "max_length": args.max_length,
                         "max_trials": args.trials, "max_concurrent_trials": args.concurrency,
                         "divisor": args.divisor, "max_rungs": args.rungs if method == "asha" else 1,
                         "seed": args.seed},
            "spare": False}
    started = time.monotonic()
    created = call(args, "POST", "/api/v1/experiments", body)
    seen, results = set(), []
    while True:
        detail = call(args, "GET", f"/api/v1/experiments/{created['id']}")
        now = time.monotonic() - started
        for trial in detail["trials"]:
            for run in trial["runs"]:
                if run["value"] is not None and (trial["trial"], run["rung"]) not in seen:
                    seen.add((trial["trial"], run["rung"]))
                    results.append((now, trial["trial"], run["rung"], run["value"]))
        state = detail["experiment"]["state"]
        if state in ("completed", "failed", "cancelled"):
            if state != "completed":
                raise SystemExit(f"the {method} search ended {state}: {detail['experiment'].get('reason')}")
            return detail, results, now
        time.sleep(0.25)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_args(args, lr, stop_at, output):
    """train.py's arguments as the template renders them for these parameters (docs: template.yaml)."""
    p = params_of(args)
    return [f"--data={args.data}", "--user-module=template/engine/example.py", f"--epochs={p['epochs']}",
            f"--max-steps={args.max_length}", f"--stop-at-step={stop_at}", f"--batch-size={p['batch_size']}",
            f"--lr={lr}", f"--warmup-steps={p['warmup_steps']}", f"--precision={p['precision']}",
            "--deterministic=true", f"--checkpoint-every={p['checkpoint_every']}", f"--output={output}",
            f"--workers={p['workers']}", f"--prefetch={p['prefetch']}", "--cpu=1", "--memory=1Gi", "--seed=0"]


def optuna_search(args, trials, lengths):
    """Optuna's SuccessiveHalvingPruner over the same trials, run by study.optimize; returns
    (results, seconds) as trainyard_search does."""
    work = tempfile.mkdtemp(prefix="optuna-search-")
    os.symlink(os.path.abspath(ENGINE_TEMPLATE), os.path.join(work, "template"))
    results, lock = [], threading.Lock()
    started = time.monotonic()

    def objective(trial):
        lr = trial.suggest_float("lr", 0.0003, 3.0, log=True)
        folder = os.path.join(work, f"trial-{trial.number}")
        os.makedirs(folder)
        os.symlink(os.path.join(work, "template"), os.path.join(folder, "template"))
        value = None
        for rung, length in enumerate(lengths):
            env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
            env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(free_port()), CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1",
                       OMP_NUM_THREADS="1")
            command = [sys.executable, "template/engine/launch.py", "0", "template/engine/train.py",
                       *engine_args(args, lr, length, os.path.join(folder, "checkpoints"))]
            run = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
            if run.returncode != 0:
                raise RuntimeError(f"trial {trial.number} rung {rung}: {run.stdout[-2000:]}{run.stderr[-2000:]}")
            found = re.findall(rf"^step {length} loss ([0-9.eE+-]+|nan|inf)$", run.stdout, re.M)
            value = float(found[-1])
            with lock:
                results.append((time.monotonic() - started, trial.number, rung, value))
            trial.report(value, length)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return value

    sampler = optuna.samplers.RandomSampler(seed=args.seed)
    pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=lengths[0], reduction_factor=args.divisor,
                                                    min_early_stopping_rate=0)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", sampler=sampler, pruner=pruner)
    for params in trials:
        study.enqueue_trial(params)
    study.optimize(objective, n_trials=len(trials), n_jobs=args.concurrency)
    seconds = time.monotonic() - started
    shutil.rmtree(work, ignore_errors=True)
    return results, seconds


def make_images(folder, count=2400, seed=12345, noise=3.0):
    """The toy images of the e2e tests (tests/e2e/training.rs::write_images: 8x8 float32 images of
    4 classes, a lit quadrant and noise, as c<class>/img<i>.bin and .cls files), with noise of
    +-`noise` instead of +-0.3: classes overlap, so the loss a trial reaches depends on its
    learning rate instead of falling to 0 for nearly all."""
    import struct
    state = seed
    for i in range(count):
        klass = i % 4
        folder_of = os.path.join(folder, f"c{klass}")
        os.makedirs(folder_of, exist_ok=True)
        values = []
        for r in range(8):
            for c in range(8):
                state = (state * 1_103_515_245 + 12345) % 2**32
                jitter = ((state >> 16) % 1000) / 1000.0 * 2 * noise - noise
                lit = (r >= 4) * 2 + (c >= 4) == klass
                values.append(float(lit) + jitter)
        with open(os.path.join(folder_of, f"img{i:05}.bin"), "wb") as f:
            f.write(struct.pack("<64f", *values))
        with open(os.path.join(folder_of, f"img{i:05}.cls"), "w") as f:
            f.write(str(klass))


def time_to(target, results):
    return next((at for at, _, _, value in sorted(results) if value <= target), None)


def main():
    if sys.argv[1:2] == ["make-images"]:
        return make_images(sys.argv[2])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--trials", type=int, default=12)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--max-length", type=int, default=96)
    p.add_argument("--divisor", type=int, default=2)
    p.add_argument("--rungs", type=int, default=3)
    p.add_argument("--seed", type=int, default=3)
    args = p.parse_args()

    print(f"{args.trials} trials, {args.concurrency} at once, {args.max_length} steps each at most; "
          f"ASHA: {args.rungs} rungs, divisor {args.divisor}", flush=True)
    random_detail, random_results, random_seconds = trainyard_search(args, "random")
    print(f"trainyard random: {random_seconds:.0f} s", flush=True)
    asha_detail, asha_results, asha_seconds = trainyard_search(args, "asha")
    print(f"trainyard asha: {asha_seconds:.0f} s", flush=True)
    trials = [{"lr": t["params"]["lr"]} for t in random_detail["trials"]]
    assert trials == [{"lr": t["params"]["lr"]} for t in asha_detail["trials"]], "the same trials"
    lengths = [r["length"] for r in asha_detail["ladder"]["rungs"]]
    optuna_results, optuna_seconds = optuna_search(args, trials, lengths)
    print(f"optuna successive halving: {optuna_seconds:.0f} s", flush=True)

    finals = sorted(value for _, _, _, value in random_results)
    target = finals[min(2, len(finals) - 1)]
    rows = [("trainyard random", random_results, random_seconds),
            ("trainyard asha", asha_results, asha_seconds),
            ("optuna sha pruner", optuna_results, optuna_seconds)]
    print(f"\ntarget: loss <= {target:.4f} (the third best final loss of the random search)")
    print(f"{'search':<19} {'to target':>10} {'vs random':>10} {'all done':>9} {'steps':>6} {'best':>8}")
    base = time_to(target, random_results)
    for name, results, seconds in rows:
        reached = time_to(target, results)
        steps = sum_steps(results, lengths, args.max_length, name)
        best = min(value for _, _, _, value in results)
        ratio = f"{reached / base:.2f}x" if reached is not None and base else "-"
        shown = f"{reached:.0f} s" if reached is not None else "never"
        print(f"{name:<19} {shown:>10} {ratio:>10} {seconds:>7.0f} s {steps:>6} {best:>8.4f}")


def sum_steps(results, lengths, max_length, name):
    """Training steps the search took: each result is a run to its rung's length, from the rung
    below's (random search: every run to max_length)."""
    if name.endswith("random"):
        return len(results) * max_length
    return sum(lengths[rung] - (lengths[rung - 1] if rung else 0) for _, _, rung, _ in results)


if __name__ == "__main__":
    main()
