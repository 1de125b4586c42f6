"""The pytorch-ddp training engine: DDP over every process of the job, mixed precision, optional
torch.compile, gradient accumulation, warm-up then cosine decay, atomic checkpoints with resume,
a final checkpoint on SIGTERM, and metrics reported to Trainyard (when TRAINYARD_URL,
TRAINYARD_TOKEN and TRAINYARD_JOB_ID are set; without them it trains and reports nothing).

Device and backend: placement.py (NCCL on the process's own GPU, gloo on CPU). How each step runs
there (precision, gradient scaler, compile, pinned memory, the optimizer's kernel):
step_settings.py, printed by rank 0 as its `engine:` line. Seeds: seeds.py
(each rank its own, restored per rank on resume). Data order: shards.py (equal batches per rank,
each sample at most once per epoch, resumable at any step); a dataset on Trainyard's object store
(`--data store:NAME@VERSION`) is read through the node's shard cache (remote.py, cache.py), its
cache hits, misses and bytes fetched reported as metrics. Decode workers and prefetch: pinned,
or tuned while training (`auto`, autotune.py; `InputPipeline` below). Checkpoints:
checkpoints.py; a run fine-tuned from another's checkpoint (`--init-from`) starts from its
model weights only. The run record (packages, hardware, seeds, data, the input pipeline's settings):
record.py, gathered by rank 0 before the first step and posted once the input pipeline's
settings are known.

Exactly once: a checkpoint holds every rank's position in the epoch (epoch, samples consumed, and
the description of its sample order) and generator states; a resumed run continues each rank
there. Steps taken after the last checkpoint are lost with the process and taken again.

Any exception ends the process at once: decode workers are killed, the traceback's last line (or
a `trainyard:` line for a clear condition such as a broken checkpoint) is the log's last line,
and the exit code is non-zero (143 when the cause was another process of the job failing).
"""
import argparse
import contextlib
import datetime
import importlib.util
import json
import math
import os
import queue
import signal
import sys
import threading
import time
import traceback
import urllib.request

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import autotune  # noqa: E402
import checkpoints  # noqa: E402
import placement  # noqa: E402
import record  # noqa: E402
import remote  # noqa: E402
import seeds  # noqa: E402
import shards  # noqa: E402
import step_settings  # noqa: E402

# Test hook: a folder where each rank appends, per optimizer step, the keys of the samples it
# trained on and its loss (rank-<r>.jsonl), so tests can check exactly-once and bitwise resume.
SAMPLE_LOG_ENV = "TRAINYARD_TEST_SAMPLE_LOG"
# Collectives wait this long for a stuck peer (a dead one is noticed at once: its connection
# closes). Long enough for rank 0 writing a large checkpoint or compiling a model.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=10)
# Windows autotune's setting must hold after it settled before the run record keeps it.
HELD_WINDOWS = 2
# Called by `run` with the exit code as the process ends, however it ends (rank 0's run record,
# when not yet posted).
AT_EXIT = []


class EngineError(Exception):
    """A condition the user can act on, reported as one line without a traceback."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", required=True,
                   help="folder of shards written by yard-data / data-pack, or store:NAME@VERSION (a registered "
                        "dataset on Trainyard's object store, read through the node's shard cache)")
    p.add_argument("--user-module", default="", help="python file with build_model, loss_fn, decode")
    p.add_argument("--user-repo", default="", help="git repository of the user code (fetched by launch.py)")
    p.add_argument("--user-commit", default="", help="the commit of --user-repo to run")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many optimizer steps (0: no limit)")
    p.add_argument("--stop-at-step", type=int, default=0,
                   help="pause: checkpoint and exit 0 after this step, the schedule still planned for the whole "
                        "run, so a later run with the same checkpoints goes on as if never stopped (0: no pause)")
    p.add_argument("--checkpoint-key", default="",
                   help="the folder under the checkpoint volume's jobs/ instead of the job's id: runs naming the "
                        "same key resume one another (an experiment's trial, rung after rung)")
    p.add_argument("--batch-size", type=int, default=64, help="per process")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--precision", choices=step_settings.PRECISIONS, default=step_settings.DEFAULT_PRECISION)
    p.add_argument("--compile", default="false", choices=["true", "false"])
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deterministic", default="false", choices=["true", "false"])
    p.add_argument("--checkpoint-every", type=int, default=50, help="optimizer steps")
    p.add_argument("--output", default="checkpoints")
    p.add_argument("--checkpoint-volume", default="",
                   help="a volume for the checkpoints (they go to <volume>/jobs/<job id>/<output>)")
    p.add_argument("--keep-checkpoints", type=int, default=3, help="newest checkpoints kept (0: all)")
    p.add_argument("--init-from", default="",
                   help="fine-tune: start from the model weights of this checkpoint file (another run's), with a fresh "
                        "optimizer and schedule from step 0; ignored once this run has a checkpoint of its own")
    p.add_argument("--workers", type=knob(0, autotune.MAX_WORKERS), default="auto",
                   help="decode processes per training process, or auto (tuned while training)")
    p.add_argument("--prefetch", type=knob(1, autotune.MAX_PREFETCH), default="auto",
                   help="batches each decode process keeps ready, or auto (tuned while training)")
    p.add_argument("--cpu", type=float, default=0, help="the replica's CPU cores, for autotune (0: not given)")
    p.add_argument("--memory", default="", help="the replica's memory (4Gi, 512Mi), for autotune")
    p.add_argument("--autotune-window", type=float, default=5.0, help="seconds autotune measures each setting for")
    p.add_argument("--shuffle-block", type=int, default=1000, help="samples shuffled together within a rank's share")
    p.add_argument("--log-every", type=int, default=10)
    return p.parse_args(argv)


def knob(low, high):
    """An argument that is `auto` or a whole number in [low, high]."""
    def parse(text):
        if text == "auto":
            return text
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not auto nor in [{low}, {high}]")
        return value
    return parse


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
    """Posts metric points to Trainyard in batches (rank 0 only; nowhere without a server), from a
    thread of its own: the training loop never waits for the server (a GPU would idle while it
    did). Points a post failed to deliver go with the next batch. `close` waits for what was
    handed over, retrying the last points for a few seconds (a server restarting)."""

    def __init__(self, enabled):
        self.url, self.token, self.job = (os.environ.get(k) for k in ("TRAINYARD_URL", "TRAINYARD_TOKEN", "TRAINYARD_JOB_ID"))
        self.enabled = enabled and all((self.url, self.token, self.job))
        self.points = []
        self._outbox = queue.Queue()
        self._sender = None

    def add(self, step, **values):
        if self.enabled:
            self.points += [{"step": int(step), "name": k, "value": float(v)} for k, v in values.items() if math.isfinite(v)]

    def flush(self):
        """Hands the points added so far to the sending thread."""
        if not (self.enabled and self.points):
            return
        if self._sender is None:
            self._sender = threading.Thread(target=self._send_all, name="trainyard-metrics", daemon=True)
            self._sender.start()
        self._outbox.put(self.points)
        self.points = []

    def close(self, timeout=10.0):
        """Flushes, then waits (at most `timeout` seconds) until the thread posted everything."""
        self.flush()
        if self._sender is not None:
            self._outbox.put(None)
            self._sender.join(timeout)
            self._sender = None

    def _send_all(self):
        unsent = []
        while True:
            batch = self._outbox.get()
            if batch is None:
                # The last points decide a search's rung: a server restarting right now (its
                # points would be lost with this process) gets them a little later.
                deadline = time.monotonic() + 8.0
                while unsent and not self._post(unsent) and time.monotonic() < deadline:
                    time.sleep(0.5)
                return
            unsent += batch
            if self._post(unsent):
                unsent = []

    def _post(self, points):
        request = urllib.request.Request(
            f"{self.url}/api/v1/jobs/{self.job}/metrics",
            data=json.dumps({"points": points}).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            urllib.request.urlopen(request, timeout=10).read()
            return True
        except OSError as err:  # metrics must never stop training
            print(f"trainyard: could not report metrics: {err}", file=sys.stderr, flush=True)
            return False


def gpu_utilization(device):
    """`gpu_utilization` (0 to 1) of this process's GPU, as NVML reports it, for usage reports'
    efficiency (GPU-hours used over held); nothing on CPU or where NVML cannot be read."""
    if device.type != "cuda":
        return {}
    try:
        return {"gpu_utilization": torch.cuda.utilization(device) / 100.0}
    except Exception:  # no pynvml, or NVML refused: report nothing rather than stop training
        return {}


class StepVotes:
    """What each rank says after an optimizer step (a stop was requested; its autotune window is
    ready), summed over the ranks with one all-reduce per step, so that every rank takes the same
    decision at the same step. The sums of step k are read at step k + 1: on a GPU the
    all-reduce and the copy of its result into page-locked host memory are queued behind step
    k's work, and step k + 1 waits for that copy only once its own work is queued, so the GPU
    never runs dry waiting for the host. (Reading the sums at once, as a `.tolist()` does, waits
    for everything queued before it: the GPU idles every step while the host launches the next.)
    On the CPU the all-reduce is done when it returns; the sums are read a step late there too,
    so that both behave alike."""

    def __init__(self, device, count):
        """`device`: where collectives run (placement.collective_device); `count` votes a step."""
        self.device, self.count = torch.device(device), count
        self.pending = None
        self.host = torch.empty(count, pin_memory=True) if self.device.type == "cuda" else None

    def collect(self):
        """The sums cast at the previous step (zeros at this process's first step)."""
        if self.pending is None:
            return (0.0,) * self.count
        sums, copied = self.pending
        self.pending = None
        if copied is not None:
            copied.synchronize()
        return tuple(sums.tolist())

    def cast(self, *votes):
        """Casts this step's votes (truthy counts 1), after `collect` read the previous step's."""
        if len(votes) != self.count or self.pending is not None:
            raise ValueError("cast one vote per kind, once per step, after collecting the previous sums")
        flags = torch.zeros(self.count, device=self.device)
        for index, vote in enumerate(votes):
            if vote:
                flags[index].fill_(1.0)  # a fill kernel on the device: no copy from the host
        dist.all_reduce(flags)
        if self.host is None:
            self.pending = (flags, None)
            return
        self.host.copy_(flags, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        self.pending = (self.host, copied)


class SampleLog:
    """The test hook behind TRAINYARD_TEST_SAMPLE_LOG (does nothing when it is unset)."""

    def __init__(self, rank):
        folder = os.environ.get(SAMPLE_LOG_ENV)
        self.path = os.path.join(folder, f"rank-{rank}.jsonl") if folder else None

    def record(self, epoch, step, keys, loss):
        if self.path:
            line = json.dumps({"epoch": epoch, "step": step, "keys": keys, "loss": loss.item()}) + "\n"
            with open(self.path, "a") as f:
                f.write(line)


def wraps_in_ddp(world_size):
    """Whether the model is wrapped in DistributedDataParallel: only in a job of several
    processes. One process's gradients are their own average, and DDP would still hook every
    parameter's gradient into its buckets and run the bucket's communication every step (on the
    H200, a 1-GPU step of the seed table's transformer took 3.4% longer under DDP than the bare
    loop). Nothing else changes: the optimizer, the checkpoint and the losses are the model's."""
    return world_size > 1


def native_bf16(device):
    """Whether `device` computes bf16 natively (every CPU does, through autocast); on a GPU,
    torch.cuda.is_bf16_supported without counting emulation (its argument since torch 2.3)."""
    if device.type != "cuda":
        return True
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:
        return torch.cuda.is_bf16_supported()


def steps_per_epoch(samples_per_rank, batch_size, grad_accum):
    """Optimizer steps every rank takes per epoch: the same on all (the rest is dropped)."""
    return samples_per_rank // (batch_size * grad_accum)


def position_after(epoch, cursor, epoch_samples):
    """A rank's data position after it consumed `cursor` samples of `epoch`: the end of an epoch
    is the start of the next."""
    return (epoch + 1, 0) if cursor >= epoch_samples else (epoch, cursor)


def saved_rank_state(saved, rank, world_size, order):
    """This rank's entry of a checkpoint's per-rank states, when it applies to this run: written
    by as many processes, over the same sample order, batch size and accumulation (`order`).
    None otherwise (another world size, other data, or a checkpoint from before engine 1.2)."""
    if not saved or len(saved) != world_size:
        return None
    mine = saved[rank]
    return mine if mine["data"]["order"] == order else None


def caused_by_a_peer(error):
    """Whether a training process's exception comes from another process of the job failing or
    hanging (a collective lost its peer or timed out) rather than from this process."""
    names = {cls.__name__ for cls in type(error).__mro__}
    text = str(error)
    return bool(names & {"DistBackendError", "DistNetworkError"}) or any(
        s in text for s in ("Connection closed by peer", "Connection reset by peer", "Timed out waiting"))


class RunRecord:
    """Completes this attempt's run record with what only the engine knows (record.py), on rank
    0: the facts are gathered before the first step and posted once, as soon as the input
    pipeline's settings are known: at once when they are pinned, once autotune's setting held
    (`InputPipeline.confirmed`), or as the process ends before that (`settled: false`, the
    settings then in use). Failing to record is reported and never stops training."""

    def __init__(self, args, world, per_replica, backend, device, plan):
        module = args.user_module or os.path.join(os.path.dirname(os.path.abspath(__file__)), "example.py")
        self.run = {"seed": args.seed, "deterministic": args.deterministic == "true", "world_size": world,
                    "replicas": world // max(1, per_replica), "processes_per_replica": per_replica,
                    "backend": backend, "device_type": device.type, "data_path": args.data,
                    "content_hash": plan.content, "shard_samples": plan.shard_samples,
                    "user_module": args.user_module, "user_module_sha256": record.file_sha256(module),
                    "user_repo": args.user_repo, "user_commit": args.user_commit}
        self.facts, self.posted = None, False
        try:
            self.facts = record.gather()
        except Exception as err:  # noqa: BLE001 - the record must never stop training
            self._failed(err)

    def post(self, input_pipeline, quiet=False):
        """Posts the record (once); `quiet`: a failure is not printed (a failed process's last
        line must stay its error, which Trainyard takes as the reason)."""
        if self.posted or self.facts is None:
            return
        self.posted = True
        try:
            record.post(record.build(self.facts, dict(self.run, input_pipeline=input_pipeline)))
        except Exception as err:  # noqa: BLE001 - the record must never stop training
            if not quiet:
                self._failed(err)

    @staticmethod
    def _failed(err):
        detail = err.read().decode(errors="replace") if hasattr(err, "read") else ""
        print(f"trainyard: could not complete the run record: {err} {detail}".strip(), flush=True)


def tensor_bytes(value):
    """The bytes of every tensor in a batch (tensors, or tuples, lists and dicts of them)."""
    if isinstance(value, torch.Tensor):
        return value.nbytes
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, (tuple, list)):
        return sum(tensor_bytes(v) for v in value)
    return 0


class InputPipeline:
    """This process's batches (shards.BatchStream) and how they are decoded: `workers` decode
    processes with `prefetch` batches each, as the parameters pin them, or tuned while training
    where they say `auto` (autotune.py). Every rank measures windows of the same steps; the
    windows are combined across ranks (the most stalled, the slowest, the busiest; the smallest
    limits), so every rank takes the same decision at the same step and the run record speaks
    for all of them. A change rebuilds the loader at the next batch: the batches stay the same."""

    def __init__(self, args, dataset, local_world, pin_memory, seed, resumed=None):
        """`resumed`: the settings the checkpoint resumed from was written with ({workers,
        prefetch}), where a parameter left `auto` starts instead of autotune.START, so that a
        resumed attempt does not tune again from one worker."""
        self.tuned = [k for k in ("workers", "prefetch") if getattr(args, k) == "auto" and args.workers != 0]
        start = resumed_start(resumed, self.tuned)
        workers = start["workers"] if args.workers == "auto" else args.workers
        prefetch = start["prefetch"] if args.prefetch == "auto" else args.prefetch
        self.stream = shards.BatchStream(dataset, workers, prefetch, pin_memory, seed)
        self.cores = autotune.process_cores(args.cpu or None, local_world)
        memory = autotune.process_memory(autotune.quantity_bytes(args.memory), local_world)
        self.prefetch_memory = autotune.prefetch_memory(memory, autotune.shm_free(), local_world)
        self.meter = autotune.WindowMeter(args.autotune_window)
        self.meter.restart(max(1, workers * prefetch))
        self.tuner, self.settled, self.held, self.batch_bytes = None, not self.tuned, 0, None
        if self.tuned:
            since = " (the checkpoint's)" if start != autotune.START else ""
            print(f"input pipeline: tuning {' and '.join(self.tuned)} from {workers} workers x {prefetch} "
                  f"prefetch{since}, within {self.cores:g} cores", flush=True)

    def confirmed(self):
        """Pinned, or autotune settled and its setting held for HELD_WINDOWS more windows: what
        the run record keeps. (It may still change later, if the stall comes back: the log and
        the input_workers and input_prefetch metrics say so.)"""
        return not self.tuned or (self.settled and self.held >= HELD_WINDOWS)

    def settings(self):
        """The settings as the run record keeps them (`yard rerun --set` pins them)."""
        return {"workers": self.stream.workers, "prefetch": self.stream.prefetch, "autotuned": self.tuned,
                "settled": self.confirmed()}

    def batch_taken(self, batch, waited):
        if self.batch_bytes is None:
            self.batch_bytes = tensor_bytes(batch)
        if self.tuned:
            self.meter.batch_taken(waited)

    def window_ready(self):
        return bool(self.tuned) and self.meter.ready(time.monotonic())

    def counters(self):
        try:
            cpu = autotune.cpu_seconds(self.stream.worker_pids())
        except (OSError, ValueError, IndexError):
            cpu = None
        return autotune.Counters(cpu, *self.stream.dataset.decode_times.totals())

    def step_ended(self, all_ready, collectives):
        """After every optimizer step, on every rank; `all_ready`: every rank's window is (the
        same on all ranks). Returns the decision taken, if any. Settled, it keeps measuring: the
        tuner opens its knobs again if the stall comes back (autotune.py, rule 5)."""
        if not self.tuned:
            return None
        now, counters = time.monotonic(), self.counters()
        if not all_ready:
            self.meter.step_ended(now, counters)
            return None
        window = self.meter.window(now, counters, self.cores, self.stream.workers)
        limits = autotune.Limits.of(self.cores, self.prefetch_memory, self.batch_bytes or 1)
        # One MAX over all ranks: the most stalled, the busiest, the slowest (delivered and
        # decode workers'; -inf stands for unknown), the smallest limits.
        unknown = -math.inf
        combined = torch.tensor([window.stall_share, unknown if window.cpu_share is None else window.cpu_share,
                                 -window.batches_per_second,
                                 unknown if window.input_batches_per_second is None else -window.input_batches_per_second,
                                 -limits.max_workers, -limits.max_inflight], dtype=torch.float64, device=collectives)
        dist.all_reduce(combined, op=dist.ReduceOp.MAX)
        stall, cpu_share, rate, supply, max_workers, max_inflight = combined.tolist()
        current = autotune.Setting(self.stream.workers, self.stream.prefetch)
        if self.tuner is None:
            self.tuner = autotune.Tuner(current, autotune.Limits(int(-max_workers), int(-max_inflight)), self.tuned)
            if self.tuner.setting != current:  # the start does not fit the limits: measure that instead
                start = autotune.Decision(self.tuner.setting, False, "the start exceeds the limits")
                return self._apply(start, now, counters)
        decision = self.tuner.observe(autotune.Window(stall, -rate, None if cpu_share == unknown else cpu_share,
                                                      None if supply == unknown else -supply))
        return self._apply(decision, now, counters)

    def _apply(self, decision, now, counters):
        workers, prefetch = decision.setting
        changed = (workers, prefetch) != (self.stream.workers, self.stream.prefetch)
        if changed:
            self.stream.resize(workers, prefetch)
            self.meter.restart(max(1, workers * prefetch))
        else:
            self.meter.restart(0)
            self.meter.step_ended(now, counters)
        if changed or decision.settled != self.settled:
            settled = f"; settled on {workers} workers x {prefetch} prefetch" if decision.settled else ""
            print(f"input pipeline: {decision.reason}{settled}", flush=True)
        self.held = self.held + 1 if decision.settled and self.settled and not changed else 0
        self.settled = decision.settled
        return decision


def report_data_counts(data_view, data, reporter, step, collectives):
    """Reports what the shard cache did for the job's store dataset (every rank's view summed:
    each fetched through its own), as metrics at `step` and in rank 0's log."""
    counts = data_view.counts()
    totals = torch.tensor(list(counts.values()), dtype=torch.float64, device=collectives)
    dist.all_reduce(totals)
    counts = dict(zip(counts, (int(v) for v in totals.tolist())))
    reporter.add(step, **counts)
    reporter.flush()
    if dist.get_rank() == 0:
        print(f"data: {data} through the shard cache: {counts['data/cache_hits']} shard opens cached, "
              f"{counts['data/cache_misses']} fetched ({counts['data/bytes_fetched']} bytes)", flush=True)


def resumed_start(saved, tuned):
    """Where autotune starts: the settings a checkpoint carries for the knobs it tunes (a whole
    number in range, else ignored), autotune.START for the rest and on a first start."""
    start = dict(autotune.START)
    for knob in tuned:
        value = (saved or {}).get(knob)
        low = 0 if knob == "workers" else 1
        if isinstance(value, int) and not isinstance(value, bool) and low <= value <= 64:
            start[knob] = value
    return start


def resume_state(directory, rank, device):
    """Rank 0 loads the latest checkpoint (None on a first start) and every rank gets it; a
    checkpoint that cannot be loaded fails every rank with the same message."""
    box = [None]
    if rank == 0:
        try:
            box[0] = {"state": checkpoints.checkpoint_latest(directory)}
        except checkpoints.CheckpointError as err:
            box[0] = {"error": str(err)}
    dist.broadcast_object_list(box, src=0, device=device)
    if "error" in box[0]:
        raise EngineError(box[0]["error"])
    return box[0]["state"]


def initial_weights(path, rank, device):
    """Rank 0 loads the model weights of the checkpoint at `path` (fine-tuning) and every rank
    gets them; one that cannot be loaded fails every rank with the same message."""
    box = [None]
    if rank == 0:
        try:
            box[0] = {"weights": checkpoints.checkpoint_weights(path)}
        except checkpoints.CheckpointError as err:
            box[0] = {"error": str(err)}
    dist.broadcast_object_list(box, src=0, device=device)
    if "error" in box[0]:
        raise EngineError(box[0]["error"])
    return box[0]["weights"]


def main():
    args = parse_args()
    args.output = checkpoints.checkpoint_dir(args.output, args.checkpoint_volume,
                                              args.checkpoint_key or os.environ.get("TRAINYARD_JOB_ID"))
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device_name, backend = placement.device_and_backend(local_rank, local_world, cuda_devices)
    device = torch.device(device_name)
    collectives = torch.device(placement.collective_device(backend, device_name))
    if args.deterministic == "true":
        # cuBLAS needs a fixed workspace to be deterministic, set before CUDA starts.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT,
                            device_id=device if backend == "nccl" else None)

    stop = {"requested": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(requested=True))

    settings = step_settings.step_settings(args.precision, args.compile == "true", device.type,
                                           bf16_supported=native_bf16(device))
    if rank == 0:
        for note in settings.notes:
            print(f"trainyard: {note}", flush=True)
        print(step_settings.describe(settings, device, backend), flush=True)

    user = load_user_code(args.user_module)
    seeds.seed_everything(seeds.rank_seed(args.seed, rank))
    net = user.build_model().to(device)
    model = torch.compile(net) if settings.compile else net
    # DDP starts every rank from rank 0's parameters and buffers (it broadcasts them). Gradients
    # live in its all-reduce buckets: no copy into them and back every step.
    ddp = None
    if wraps_in_ddp(world):
        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                      gradient_as_bucket_view=True)
    trained = ddp or model
    optimizer = torch.optim.AdamW(net.parameters(), lr=args.lr, **step_settings.optimizer_options(settings))
    data_folder, data_view = args.data, None
    store_dataset = remote.store_dataset(args.data)
    if store_dataset is not None:
        data_view = remote.dataset_view(store_dataset, local_rank, local_world)
        AT_EXIT.append(lambda _code: data_view.close())
        data_folder = data_view.folder
    dataset = shards.ShardDataset(data_folder, user.decode, rank, world, args.seed, args.batch_size,
                                  args.shuffle_block)
    epoch_steps = steps_per_epoch(dataset.plan.samples_per_rank, args.batch_size, args.grad_accum)
    if epoch_steps == 0:
        raise EngineError(f"{args.data} holds {dataset.plan.samples_total} samples, too few for one step of {world} "
                          f"processes x batch_size {args.batch_size} x grad_accum {args.grad_accum}")
    epoch_micro_batches = epoch_steps * args.grad_accum
    epoch_samples = epoch_micro_batches * args.batch_size
    total_steps = args.max_steps or epoch_steps * args.epochs
    # Where this run stops: the end of the schedule, or a pause before it (a search's rung).
    stop_at = min(args.stop_at_step, total_steps) if args.stop_at_step > 0 else total_steps
    order = dict(dataset.plan.description(), batch_size=args.batch_size, grad_accum=args.grad_accum)

    def lr_at(step):
        if step < args.warmup_steps:
            return (step + 1) / args.warmup_steps
        progress = (step - args.warmup_steps) / max(1, total_steps - args.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    scaler = torch.amp.GradScaler("cuda", enabled=settings.grad_scaler)
    autocast_dtype = settings.autocast_dtype

    epoch, step, cursor, rng, resumed_pipeline = 0, 0, 0, None, None
    init_from_step = None
    state = resume_state(args.output, rank, collectives)
    if state is not None:
        resumed_pipeline = state.get("input_pipeline")
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if state["scaler"] and settings.grad_scaler:
            # Empty when written without the scaler (another precision): it starts afresh.
            scaler.load_state_dict(state["scaler"])
        step = state["step"]
        mine = saved_rank_state(state.get("ranks"), rank, world, order)
        if mine is not None:
            epoch, cursor, rng = mine["data"]["epoch"], mine["data"]["cursor"], mine["rng"]
        else:
            epoch = state.get("epoch", 0)
            print(f"trainyard: the checkpoint holds no data position for this run ({world} processes, this data, "
                  f"batch_size and grad_accum); epoch {epoch} starts again from its beginning", flush=True)
        print(f"resuming from step {step} (epoch {epoch}, {cursor} samples into it)", flush=True)
        del state
    elif args.init_from:
        # Fine-tuning: the weights only; the optimizer, the schedule, the data order and the step
        # count start afresh. Every rank loads the same weights, as on a resume.
        weights = initial_weights(args.init_from, rank, collectives)
        net.load_state_dict(weights["model"])
        init_from_step = weights["step"]
        del weights
        if rank == 0:
            print(f"fine-tuning from {args.init_from} (the model weights of its step {init_from_step}); "
                  f"a fresh optimizer, training from step 0", flush=True)
    run_record = RunRecord(args, world, local_world, backend, device, dataset.plan) if rank == 0 else None
    # Starts no decode worker yet, and draws from no generator of this process.
    pipeline = InputPipeline(args, dataset, local_world, pin_memory=settings.pin_memory,
                             seed=seeds.rank_seed(args.seed, rank), resumed=resumed_pipeline)
    if run_record is not None:
        AT_EXIT.append(lambda code: run_record.post(pipeline.settings(), quiet=code != 0))
        if pipeline.confirmed():
            run_record.post(pipeline.settings())

    def checkpoint():
        """Every rank's state goes to rank 0, which writes the checkpoint; the others wait."""
        at_epoch, at_cursor = position_after(epoch, cursor, epoch_samples)
        mine = {"rng": seeds.rng_state(device), "data": {"epoch": at_epoch, "cursor": at_cursor, "order": order}}
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
        if rank == 0:
            checkpoints.checkpoint_save(args.output, {
                "model": net.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
                "step": step, "epoch": at_epoch, "ranks": gathered,
                # What the input pipeline ran with (every rank alike): where a resumed attempt's
                # autotune starts.
                "input_pipeline": {"workers": pipeline.stream.workers, "prefetch": pipeline.stream.prefetch},
            }, step, args.keep_checkpoints)
            # When progress was last saved: of runs on spare room, the scheduler stops the one
            # that saved last, which loses least.
            reporter.add(step, checkpoint_step=step)
            reporter.flush()
        dist.barrier()

    reporter = Reporter(rank == 0)
    AT_EXIT.append(lambda _code: reporter.close(timeout=2.0))
    votes = StepVotes(collectives, 2)
    if init_from_step is not None:
        # At step 0: the run's first point says which step's weights it started from.
        reporter.add(0, init_from_step=init_from_step)
        reporter.flush()
    if data_view is not None:
        report_data_counts(data_view, args.data, reporter, step, collectives)
    sample_log = SampleLog(rank)
    if rng is not None:
        # Last, so that nothing between here and the first step draws from them.
        seeds.rng_restore(rng, device)
    started, resumed_at, stall_total = time.monotonic(), step, 0.0
    reported = (started, stall_total)
    finished = step >= stop_at
    while epoch < args.epochs and not finished:
        micro = cursor // args.batch_size
        pipeline.stream.start(epoch, micro, epoch_micro_batches)
        step_loss, step_keys = torch.zeros((), device=device), []
        while True:
            waited = time.monotonic()
            try:
                (inputs, targets), keys = next(pipeline.stream)
            except StopIteration:
                break
            stall = time.monotonic() - waited
            stall_total += stall
            pipeline.batch_taken((inputs, targets), stall)
            inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            micro += 1
            syncing = micro % args.grad_accum == 0
            # Gradients are averaged across ranks once per optimizer step, on its last micro-batch.
            with contextlib.nullcontext() if syncing or ddp is None else ddp.no_sync():
                with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                    loss = user.loss_fn(trained(inputs), targets) / args.grad_accum
                scaler.scale(loss).backward()
            step_loss += loss.detach().float()
            step_keys += keys
            if not syncing:
                continue
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            step, cursor = step + 1, micro * args.batch_size
            sample_log.record(epoch, step, step_keys, step_loss)
            # Every rank agrees on stopping at the same step, and on when autotune's window ends,
            # from the votes of the step before (StepVotes: the host does not wait for the GPU).
            stop_votes, ready_votes = votes.collect()
            stopping = stop_votes > 0
            decision = pipeline.step_ended(ready_votes == world and not stopping and step < stop_at, collectives)
            if decision is not None and pipeline.confirmed() and run_record is not None:
                run_record.post(pipeline.settings())
            # After step_ended: a window it just closed does not vote ready again.
            votes.cast(stop["requested"], pipeline.window_ready())
            # The last step is always reported: a search ranks a run by its metrics at the step it stopped at.
            if rank == 0 and (step % args.log_every == 0 or step == stop_at):
                # This process's steps over its own time: a resumed run starts counting afresh.
                samples = (step - resumed_at) * args.batch_size * args.grad_accum * world
                samples_per_second = samples / (time.monotonic() - started)
                # The share of this process's time spent waiting for data (operators see it
                # per tenant as trainyard_input_stall_share).
                now = time.monotonic()
                stall_share = stall_total / max(now - started, 1e-9)
                # The same since the last report: what the current decode settings give.
                recent_share = (stall_total - reported[1]) / max(now - reported[0], 1e-9)
                reported = (now, stall_total)
                reporter.add(step, loss=step_loss.item(), lr=scheduler.get_last_lr()[0],
                             samples_per_second=samples_per_second, input_stall_seconds=stall_total,
                             input_stall_share=min(stall_share, 1.0),
                             input_stall_share_recent=min(recent_share, 1.0),
                             input_workers=pipeline.stream.workers, input_prefetch=pipeline.stream.prefetch,
                             **gpu_utilization(device))
                reporter.flush()
                print(f"step {step} loss {step_loss.item():.4f}", flush=True)
            step_loss, step_keys = torch.zeros((), device=device), []
            if stopping or step % args.checkpoint_every == 0 or step >= stop_at:
                checkpoint()
            if stopping:
                print("stopping on SIGTERM after a final checkpoint", flush=True)
                reporter.close()
                dist.destroy_process_group()
                sys.exit(143)
            if step >= stop_at:
                finished = True
                break
        epoch, cursor = epoch + 1, 0
    reporter.close()
    dist.barrier()
    dist.destroy_process_group()
    print(f"done: {step} steps", flush=True)


def run():
    """main(), then exit at once with its exit code: on any exception, after the traceback (or
    one `trainyard:` line) and with the decode workers killed, so no process is left waiting;
    rank 0's run record is posted first if it was not yet (autotune had not settled)."""
    code = 0
    try:
        main()
    except SystemExit as exit_:
        if isinstance(exit_.code, str):
            print(exit_.code, file=sys.stderr)
        code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    except (EngineError, checkpoints.CheckpointError, remote.DatasetError) as err:
        print(f"trainyard: {err}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    except BaseException as err:  # noqa: B036 - everything ends the process
        traceback.print_exc()
        code = placement.EXIT_STOPPED_BY_PEER if caused_by_a_peer(err) else 1
    try:
        shards.stop_decode_workers()
    except Exception:  # noqa: BLE001 - exiting matters more
        traceback.print_exc()
    for finish in AT_EXIT:
        try:
            finish(code)
        except Exception:  # noqa: BLE001 - exiting matters more
            traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    # Not sys.exit: interpreter shutdown can wait on threads and children (gloo, DataLoader).
    os._exit(code)


if __name__ == "__main__":
    run()
