"""The pytorch-ddp training engine: DDP over every process of the job, mixed precision, optional
torch.compile, gradient accumulation, warm-up then cosine decay, atomic checkpoints with resume,
a final checkpoint on SIGTERM, and metrics reported to Trainyard.

Seeds: the global --seed seeds Python, NumPy-free torch and the data order; process r seeds its
generators with seed + 1000 * r, so ranks differ (dropout, augmentation) but runs repeat.
"""
import argparse
import importlib.util
import json
import math
import os
import random
import signal
import sys
import time
import urllib.request

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shards  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", required=True, help="folder of shards written by yard-data / data-pack")
    p.add_argument("--user-module", default="", help="python file with build_model, loss_fn, decode")
    p.add_argument("--user-repo", default="", help="git repository of the user code (fetched by launch.py)")
    p.add_argument("--user-commit", default="", help="the commit of --user-repo to run")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many optimizer steps (0: no limit)")
    p.add_argument("--batch-size", type=int, default=64, help="per process")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    p.add_argument("--compile", default="false", choices=["true", "false"])
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deterministic", default="false", choices=["true", "false"])
    p.add_argument("--checkpoint-every", type=int, default=50, help="optimizer steps")
    p.add_argument("--output", default="checkpoints")
    p.add_argument("--keep-checkpoints", type=int, default=3, help="newest checkpoints kept (0: all)")
    p.add_argument("--workers", type=int, default=2, help="decode processes per training process")
    p.add_argument("--prefetch", type=int, default=4, help="batches each decode process keeps ready")
    p.add_argument("--shuffle-buffer", type=int, default=1000)
    p.add_argument("--log-every", type=int, default=10)
    return p.parse_args()


def load_user_code(path):
    if not path:
        import example
        return example
    spec = importlib.util.spec_from_file_location("user_code", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in ("build_model", "loss_fn", "decode"):
        if not hasattr(module, name):
            raise AttributeError(f"{path} must define {name}()")
    return module


class Reporter:
    """Posts metric points to Trainyard in batches (rank 0 only)."""

    def __init__(self, enabled):
        self.url, self.token, self.job = (os.environ.get(k) for k in ("TRAINYARD_URL", "TRAINYARD_TOKEN", "TRAINYARD_JOB_ID"))
        self.enabled = enabled and all((self.url, self.token, self.job))
        self.points = []

    def add(self, step, **values):
        if self.enabled:
            self.points += [{"step": int(step), "name": k, "value": float(v)} for k, v in values.items() if math.isfinite(v)]

    def flush(self):
        if not (self.enabled and self.points):
            return
        request = urllib.request.Request(
            f"{self.url}/api/v1/jobs/{self.job}/metrics",
            data=json.dumps({"points": self.points}).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            urllib.request.urlopen(request, timeout=10).read()
            self.points = []
        except OSError as err:  # metrics must never stop training
            print(f"trainyard: could not report metrics: {err}", file=sys.stderr, flush=True)


def checkpoint_save(directory, state, step, keep):
    """Atomic: written aside, synced, renamed; `latest.json` names it afterwards. Then only the
    newest `keep` checkpoints stay (all when 0): pruning after `latest.json` moved on means a
    resume never finds its checkpoint gone."""
    os.makedirs(directory, exist_ok=True)
    name = f"ckpt-{step:08d}.pt"
    aside = os.path.join(directory, name + ".partial")
    with open(aside, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(aside, os.path.join(directory, name))
    latest = os.path.join(directory, "latest.json.partial")
    with open(latest, "w") as f:
        json.dump({"checkpoint": name, "step": step}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(latest, os.path.join(directory, "latest.json"))
    print(f"checkpoint {name} written", flush=True)
    if keep > 0:
        # Zero-padded steps: name order is step order.
        older = sorted(f for f in os.listdir(directory) if f.startswith("ckpt-") and f.endswith(".pt"))[:-keep]
        for old in older:
            os.remove(os.path.join(directory, old))


def checkpoint_latest(directory):
    try:
        latest = json.load(open(os.path.join(directory, "latest.json")))
        return torch.load(os.path.join(directory, latest["checkpoint"]), weights_only=False)
    except FileNotFoundError:
        return None


def main():
    args = parse_args()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            timeout=__import__("datetime").timedelta(seconds=120))
    random.seed(args.seed + 1000 * rank)
    torch.manual_seed(args.seed + 1000 * rank)
    if args.deterministic == "true":
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False

    stop = {"requested": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(requested=True))

    user = load_user_code(args.user_module)
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = user.build_model().to(device)
    if args.compile == "true":
        model = torch.compile(model)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    dataset = shards.ShardDataset(args.data, user.decode, rank, world, args.seed, args.shuffle_buffer)
    steps_per_epoch = max(1, dataset.samples_total // (world * args.batch_size * args.grad_accum))
    total_steps = args.max_steps or steps_per_epoch * args.epochs

    def lr_at(step):
        if step < args.warmup_steps:
            return (step + 1) / args.warmup_steps
        progress = (step - args.warmup_steps) / max(1, total_steps - args.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    precision = args.precision
    if precision == "fp16" and not cuda:
        print("trainyard: fp16 needs a GPU; using bf16 on CPU", flush=True)
        precision = "bf16"
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)

    # Resume: rank 0 reads the latest checkpoint and every rank gets the same state.
    state = [checkpoint_latest(args.output) if rank == 0 else None]
    dist.broadcast_object_list(state, src=0)
    state = state[0]
    epoch, step, consumed = 0, 0, 0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        random.setstate(state["python_rng"][rank % len(state["python_rng"])])
        torch.set_rng_state(state["torch_rng"])
        epoch, step, consumed = state["epoch"], state["step"], state["consumed"]
        print(f"resuming from step {step} (epoch {epoch}, {consumed} batches into it)", flush=True)

    reporter = Reporter(rank == 0)
    started, stall_total = time.time(), 0.0
    finished = False
    batch_loader = shards.loader(dataset, args.batch_size, args.workers, args.prefetch, cuda)
    while epoch < args.epochs and not finished:
        dataset.set_epoch(epoch)
        batches = iter(batch_loader)
        seen = 0
        while True:
            waited = time.time()
            try:
                inputs, targets = next(batches)
            except StopIteration:
                break
            stall = time.time() - waited
            seen += 1
            if seen <= consumed:  # already trained on before the restart
                continue
            stall_total += stall
            inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                loss = user.loss_fn(ddp(inputs), targets) / args.grad_accum
            scaler.scale(loss).backward()
            consumed = seen
            if seen % args.grad_accum:
                continue
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            step += 1
            # Every rank agrees on stopping at the same step.
            flag = torch.tensor([1.0 if stop["requested"] else 0.0])
            dist.all_reduce(flag)
            stopping = flag.item() > 0
            if rank == 0 and step % args.log_every == 0:
                reporter.add(step, loss=loss.item() * args.grad_accum, lr=scheduler.get_last_lr()[0],
                             samples_per_second=step * args.batch_size * args.grad_accum * world / (time.time() - started),
                             input_stall_seconds=stall_total)
                reporter.flush()
                print(f"step {step} loss {loss.item() * args.grad_accum:.4f}", flush=True)
            if stopping or step % args.checkpoint_every == 0 or step >= total_steps:
                if rank == 0:
                    checkpoint_save(args.output, {
                        "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
                        "python_rng": [random.getstate()], "torch_rng": torch.get_rng_state(),
                        "epoch": epoch, "step": step, "consumed": consumed,
                    }, step, args.keep_checkpoints)
                dist.barrier()
            if stopping:
                print("stopping on SIGTERM after a final checkpoint", flush=True)
                reporter.flush()
                dist.destroy_process_group()
                sys.exit(143)
            if step >= total_steps:
                finished = True
                break
        epoch, consumed = epoch + 1, 0
    reporter.flush()
    dist.barrier()
    dist.destroy_process_group()
    print(f"done: {step} steps", flush=True)


if __name__ == "__main__":
    main()
