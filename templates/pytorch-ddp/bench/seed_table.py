"""The seed table on one GPU (issue 44), and the engine's input pipeline feeding it: the real
engine (launch.py, train.py) and the two loops of bench/loops.py, one process per row, on the
model and data of bench/transformer.py. tests/gpu/run runs both; `--dry-run` runs them on the
CPU at toy sizes, so that the harness itself is tested where there is no GPU.

`table` runs, one after the other, on the same model and data (one shard set and the same
samples as one file each):
  plain_fp32            a plain PyTorch loop as a user writes it (loops.py plain): fp32, no compile
  engine_fp32           the pytorch-ddp engine at fp32
  engine_bf16           the engine, bf16 autocast
  engine_bf16_compile   the engine, bf16 + torch.compile (the template's fast setting)
  bare_bf16_compile     a bare loop, bf16 + compile, the data already on the GPU (loops.py bare):
                        the framework's limit, which the engine's step time is compared with
  engine_fp16           the engine, fp16 with the gradient scaler
`input` runs the engine (bf16, no compile) at a larger batch with its input pipeline tuning
itself (workers and prefetch `auto`): the share of the time its steps waited for data.

How a row is measured: every row prints `step N loss X` after reading the loss (a wait for the
GPU) every L steps; this harness stamps each line as it arrives and times the steps from the
line of step W (after W warm-up steps, compile included) to the line of step W + M: step time,
samples/s. Meanwhile it samples the GPU's utilisation (NVML's percent of time a kernel ran,
every 0.1 s, through nvidia-ml-py, else `nvidia-smi -lms 200`) and averages it over the same
window. Engine rows report to a stand-in Trainyard (tests/fake_trainyard.py), as they would to
Trainyard: the input stall is the difference of its `input_stall_seconds` metric between the
two steps over the window's time. A row ends (SIGKILL, so no checkpoint of gigabytes is written)
once its last line arrived. Model FLOP utilisation is the model's FLOPs per sample (torch's FLOP
counter in the bare loop; the formula of transformer.py otherwise) times samples/s over the
H200's bf16 peak as measured on this machine kind (790 TFLOP/s).

Usage (from templates/pytorch-ddp, with the Python that has torch):
  bench/seed_table.py table|input --work DIR --out FILE.json [--dry-run] [--deadline SECONDS]
"""
import argparse
import collections
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ENGINE = os.path.join(os.path.dirname(HERE), "engine")
TESTS = os.path.join(os.path.dirname(HERE), "tests")
sys.path.insert(0, TESTS)
sys.dont_write_bytecode = True

import shardset  # noqa: E402
from fake_trainyard import FakeTrainyard  # noqa: E402
from jobs import free_port  # noqa: E402

# bf16 dense matrix products on one H200, as measured on this machine kind (an 8192^3 product
# through PyTorch ran at 769 to 798 TFLOP/s).
H200_BF16_PEAK = 790e12
STEP_LINE = re.compile(r"^step (\d+) loss (\S+)(?: stall (\S+))?$")

Sizes = collections.namedtuple("Sizes", "model samples shard_samples batch input_batch fp32 fast input_steps "
                                        "autotune_window workers row_timeout compile_timeout")
# (warm-up steps W, measured steps M, log every L): fp32 steps take about 8 times as long.
SIZES = {
    "gpu": Sizes(model={}, samples=8192, shard_samples=512, batch=16, input_batch=64, fp32=(5, 20, 5),
                 fast=(50, 200, 50), input_steps=(20, 160, 10), autotune_window=2.0, workers=4,
                 row_timeout=90, compile_timeout=180),
    "dry": Sizes(model={"BENCH_LAYERS": "1", "BENCH_WIDTH": "64", "BENCH_HEADS": "2", "BENCH_SEQ": "32",
                        "BENCH_VOCAB": "256"},
                 samples=512, shard_samples=64, batch=4, input_batch=8, fp32=(2, 4, 2), fast=(2, 4, 2),
                 input_steps=(10, 30, 10), autotune_window=0.5, workers=1, row_timeout=60, compile_timeout=60),
}

Row = collections.namedtuple("Row", "name label kind precision compile")
ROWS = [
    Row("plain_fp32", "plain loop, fp32", "plain", "fp32", False),
    Row("engine_fp32", "engine, fp32", "engine", "fp32", False),
    Row("engine_bf16", "engine, bf16", "engine", "bf16", False),
    Row("engine_bf16_compile", "engine, bf16 + compile", "engine", "bf16", True),
    # Right after the engine's compiled row: the same graphs, so Inductor's caches make its
    # compile short, and the comparison the issue asks for is made before the last row.
    Row("bare_bf16_compile", "bare loop, bf16 + compile, data on the GPU", "bare", "bf16", True),
    Row("engine_fp16", "engine, fp16 + gradient scaler", "engine", "fp16", False),
]


def say(text):
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def gpu_present():
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


class GpuSampler:
    """The GPU's utilisation (percent), SM clock (MHz) and memory in use (bytes), sampled in a
    thread: (monotonic time, utilisation, clock, memory). `how` says how, or why not."""

    def __init__(self, on_gpu):
        self.on_gpu, self.samples, self._stop = on_gpu, [], threading.Event()
        self._thread, self._smi = None, None
        self.how = "skipped: no NVIDIA GPU (dry run on CPU)"
        index = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
        self.index = int(index) if index.isdigit() else 0

    def start(self):
        if not self.on_gpu:
            return self
        try:
            import pynvml
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            self.how = f"NVML (nvidia-ml-py), GPU {self.index}, every 0.1 s"
            self._thread = threading.Thread(target=self._nvml, args=(pynvml, handle), daemon=True)
            self._thread.start()
            return self
        except Exception as err:  # noqa: BLE001 - fall back to nvidia-smi
            why = f"{type(err).__name__}: {err}"
        try:
            self._smi = subprocess.Popen(
                ["nvidia-smi", f"--id={self.index}", "--query-gpu=utilization.gpu,clocks.sm,memory.used",
                 "--format=csv,noheader,nounits", "-lms", "200"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self.how = f"nvidia-smi -lms 200 (NVML through Python failed: {why})"
            self._thread = threading.Thread(target=self._nvidia_smi, daemon=True)
            self._thread.start()
        except OSError as err:
            self.how = f"skipped: no NVML ({why}) and no nvidia-smi ({err})"
        return self

    def _nvml(self, pynvml, handle):
        while not self._stop.is_set():
            try:
                util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
                clock = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle).used
                self.samples.append((time.monotonic(), util, clock, memory))
            except Exception:  # noqa: BLE001 - a missed sample
                pass
            self._stop.wait(0.1)

    def _nvidia_smi(self):
        for line in self._smi.stdout:
            try:
                util, clock, memory = (float(v) for v in line.split(","))
                self.samples.append((time.monotonic(), util, clock, memory * 2**20))
            except ValueError:
                pass

    def stop(self):
        self._stop.set()
        if self._smi is not None:
            self._smi.kill()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def window(self, began, ended):
        """Mean utilisation and SM clock, and the most memory used, between two times."""
        inside = [s for s in self.samples if began <= s[0] <= ended]
        if not inside:
            return {}
        return {"gpu_util_pct": round(sum(s[1] for s in inside) / len(inside), 1),
                "sm_clock_mhz": round(sum(s[2] for s in inside) / len(inside)),
                "gpu_memory_gib": round(max(s[3] for s in inside) / 2**30, 2), "gpu_samples": len(inside)}


class Process:
    """A row's process in a session of its own, its output lines stamped as they arrive and
    kept in its log file; `steps[N]` is (time, loss, stall or None) of its `step N` line."""

    def __init__(self, command, env, cwd, log_path):
        self.log = open(log_path, "w")
        self.log.write("$ " + " ".join(command) + "\n")
        self.started = time.monotonic()
        self.process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        self.lines, self.steps = [], {}
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for raw in self.process.stdout:
            now = time.monotonic()
            line = raw.decode(errors="replace").rstrip("\n")
            self.lines.append(line)
            self.log.write(f"{now - self.started:8.3f} {line}\n")
            self.log.flush()
            match = STEP_LINE.match(line)
            if match:
                stall = float(match.group(3)) if match.group(3) else None
                self.steps[int(match.group(1))] = (now, float(match.group(2)), stall)

    def wait_for_step(self, step, deadline):
        """Whether the line of `step` came before the process ended or the deadline passed."""
        while step not in self.steps:
            if self.process.poll() is not None:
                self.reader.join(timeout=2)
                return step in self.steps
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def kill(self):
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        self.reader.join(timeout=2)
        self.log.close()

    def tail(self, count=40):
        return self.lines[-count:]


def prepare_data(work, sizes, model_env):
    """The samples as shards (for the engine) and as one file each (for the loops), in
    `work/data`; written once per size (a second step of the same run reuses them)."""
    os.environ.update(model_env)
    sys.path.insert(0, HERE)
    import transformer
    folder = os.path.join(work, "data")
    stamp = {"samples": sizes.samples, "shard_samples": sizes.shard_samples, "model": model_env}
    stamp_path = os.path.join(folder, "stamp.json")
    if os.path.exists(stamp_path):
        with open(stamp_path) as f:
            if json.load(f) == stamp:
                return folder, transformer
    began = time.monotonic()
    rng = random.Random(44)
    samples = [transformer.sample_bytes(rng) for _ in range(sizes.samples)]
    shards_dir, files_dir = os.path.join(folder, "shards"), os.path.join(folder, "files")
    os.makedirs(files_dir, exist_ok=True)
    keys = shardset.write_dataset(shards_dir, [sizes.shard_samples] * (sizes.samples // sizes.shard_samples),
                                  fields=lambda index, _rng: [("bin", samples[index])], key_prefix="seq")
    for key, data in zip(keys, samples):
        with open(os.path.join(files_dir, key + ".bin"), "wb") as f:
            f.write(data)
    with open(stamp_path, "w") as f:
        json.dump(stamp, f)
    say(f"data: {len(samples)} samples of {len(samples[0])} bytes as {len(keys) // sizes.shard_samples} shards "
        f"and as files, in {time.monotonic() - began:.1f} s ({folder})")
    return folder, transformer


def row_env(model_env, extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env.update(model_env)
    env.update(PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    env.update(extra)
    return env


def engine_command(data, batch, precision, compile_, steps, log_every, workers, prefetch, output, on_gpu,
                   extra=()):
    return [sys.executable, os.path.join(ENGINE, "launch.py"), "1" if on_gpu else "0", os.path.join(ENGINE, "train.py"),
            f"--data={data}", f"--user-module={os.path.join(HERE, 'transformer.py')}", "--epochs=1000",
            f"--max-steps={steps}", f"--batch-size={batch}", "--lr=0.0003", "--warmup-steps=10",
            f"--precision={precision}", f"--compile={'true' if compile_ else 'false'}", f"--workers={workers}",
            f"--prefetch={prefetch}", "--checkpoint-every=100000000", f"--output={output}", "--keep-checkpoints=1",
            f"--log-every={log_every}", "--seed=0", *extra]


def engine_env(model_env, trainyard, extra=None):
    env = dict(trainyard.env(), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env.update(extra or {})
    return row_env(model_env, env)


def stand_in_trainyard():
    """tests/fake_trainyard.py, quiet about a request cut short: a row is killed once measured,
    maybe in the middle of posting metrics it no longer needs."""
    trainyard = FakeTrainyard()
    trainyard.server.handle_error = lambda request, address: None
    return trainyard


def measure(process, sampler, warmup, measured, batch, deadline, trainyard=None):
    """The row's figures over steps (warmup, warmup + measured], or why there are none."""
    last = warmup + measured
    if not process.wait_for_step(last, deadline):
        code = process.process.poll()
        why = (f"exited with code {code}" if code is not None else
               f"no step {last} within its time (the last step seen: {max(process.steps, default=None)})")
        return {"status": "failed", "reason": why}
    if trainyard is not None:  # the metrics of the last step are posted from a thread: wait for them
        until = time.monotonic() + 5
        while last not in dict(trainyard.series("input_stall_seconds")) and time.monotonic() < until:
            time.sleep(0.05)
    (began, first_loss, stall0), (ended, last_loss, stall1) = process.steps[warmup], process.steps[last]
    if not (math.isfinite(first_loss) and math.isfinite(last_loss)):
        return {"status": "failed", "reason": f"the loss is not finite: {first_loss} at step {warmup}, "
                                               f"{last_loss} at step {last}"}
    seconds = ended - began
    result = {"status": "ok", "batch_size": batch, "warmup_steps": warmup, "steps": measured,
              "seconds": round(seconds, 4), "step_ms": round(1000 * seconds / measured, 3),
              "samples_per_s": round(measured * batch / seconds, 2),
              "first_step_line_s": round(process.steps[min(process.steps)][0] - process.started, 2),
              "loss_at_warmup": first_loss, "loss_at_end": last_loss}
    if stall0 is not None:
        result["input_stall_share"] = round((stall1 - stall0) / seconds, 5)
    if trainyard is not None:
        stalls = dict(trainyard.series("input_stall_seconds"))
        if warmup in stalls and last in stalls:
            result["input_stall_share"] = round((stalls[last] - stalls[warmup]) / seconds, 5)
        else:
            result["input_stall_note"] = f"no input_stall_seconds metric at steps {warmup} and {last}"
    result.update(sampler.window(began, ended))
    return result


def run_row(row, sizes, data, work, sampler, on_gpu, dry, deadline):
    warmup, measured, log_every = sizes.fp32 if row.precision == "fp32" else sizes.fast
    row_dir = os.path.join(work, "rows", row.name)
    os.makedirs(row_dir, exist_ok=True)
    extra = {}
    notes = []
    if row.compile and dry:
        # Inductor's first compile on a CPU builds C++ for minutes on two cores: the dry run
        # takes the same path with compile turned into a no-op.
        extra["TORCH_COMPILE_DISABLE"] = "1"
        notes.append("dry run: TORCH_COMPILE_DISABLE=1 (Inductor's cold C++ compile on CPU would take minutes)")
    timeout = sizes.compile_timeout if row.compile else sizes.row_timeout
    row_deadline = min(deadline, time.monotonic() + timeout)
    if row_deadline - time.monotonic() < 15:
        return {"status": "skipped", "reason": "out of time: the step's deadline is less than 15 s away"}
    trainyard = None
    files, shards_dir = os.path.join(data, "files"), os.path.join(data, "shards")
    if row.kind == "engine":
        trainyard = stand_in_trainyard()
        command = engine_command(shards_dir, sizes.batch, row.precision, row.compile, warmup + measured + 1000,
                                 log_every, sizes.workers, 4, os.path.join(row_dir, "checkpoints"), on_gpu)
        env = engine_env(sizes.model, trainyard, extra)
    else:
        command = [sys.executable, os.path.join(HERE, "loops.py"), row.kind, f"--files={files}",
                   f"--batch-size={sizes.batch}", f"--steps={warmup + measured + 1000}",
                   f"--log-every={log_every}", f"--workers={sizes.workers}"]
        env = row_env(sizes.model, extra)
    say(f"row {row.name} ({row.label}): W={warmup} M={measured} L={log_every}, at most "
        f"{row_deadline - time.monotonic():.0f} s")
    process = Process(command, env, row_dir, os.path.join(row_dir, "log"))
    try:
        result = measure(process, sampler, warmup, measured, sizes.batch, row_deadline, trainyard)
    finally:
        process.kill()
        if trainyard is not None:
            trainyard.close()
    result.update(name=row.name, label=row.label, kind=row.kind, precision=row.precision, compile=row.compile,
                  log_every=log_every, wall_s=round(time.monotonic() - process.started, 1), notes=notes)
    if row.kind != "bare":
        result.update(decode_workers=sizes.workers, prefetch=4 if row.kind == "engine" else 2)
    for line in process.lines:
        if line.startswith("engine: ") and "engine_line" not in result:
            result["engine_line"] = line
        if line.startswith("trainyard: "):
            notes.append(line)
        if line.startswith("flops_per_sample "):
            value = line.split()[1]
            result["flops_per_sample_counted"] = float(value) if value.replace(".", "").isdigit() else None
    if result["status"] != "ok":
        result["log_tail"] = process.tail()
    return result


def show(result):
    if result["status"] != "ok":
        say(f"  {result['name']}: {result['status'].upper()}: {result.get('reason')}")
        for line in result.get("log_tail", []):
            print(f"    | {line}", flush=True)
        return
    util = result.get("gpu_util_pct")
    say(f"  {result['name']}: {result['samples_per_s']:,.1f} samples/s, {result['step_ms']:.2f} ms a step, "
        f"GPU {'-' if util is None else f'{util:.0f}%'}, input stall "
        f"{result.get('input_stall_share', float('nan')):.2%}, loss {result['loss_at_warmup']} -> "
        f"{result['loss_at_end']}, first step line after {result['first_step_line_s']} s, wall {result['wall_s']} s")


def table(args, sizes, on_gpu):
    data, transformer = prepare_data(args.work, sizes, sizes.model)
    deadline = time.monotonic() + args.deadline
    sampler = GpuSampler(on_gpu).start()
    rows = []
    try:
        for row in ROWS:
            result = run_row(row, sizes, data, args.work, sampler, on_gpu, args.dry_run, deadline)
            result.setdefault("name", row.name)
            result.setdefault("label", row.label)
            rows.append(result)
            show(result)
    finally:
        sampler.stop()
    by_name = {r["name"]: r for r in rows}
    counted = by_name.get("bare_bf16_compile", {}).get("flops_per_sample_counted")
    flops = counted or transformer.train_flops_per_sample()
    plain = by_name.get("plain_fp32", {})
    for result in rows:
        if result.get("status") != "ok":
            continue
        if plain.get("status") == "ok":
            result["ratio_to_plain"] = round(result["samples_per_s"] / plain["samples_per_s"], 3)
        result["model_tflops"] = round(flops * result["samples_per_s"] / 1e12, 2)
        if on_gpu and result["precision"] in ("bf16", "fp16"):
            result["mfu_vs_h200_bf16_peak"] = round(flops * result["samples_per_s"] / H200_BF16_PEAK, 4)
    summary = {
        "model": transformer.describe(), "parameters": transformer.parameter_count(),
        "flops_per_sample": flops, "flops_source": "torch FLOP counter (bare loop)" if counted else
        "formula (transformer.train_flops_per_sample)", "flops_per_sample_formula": transformer.train_flops_per_sample(),
        "batch_size": sizes.batch, "peak_bf16_flops": H200_BF16_PEAK, "device": "cuda" if on_gpu else "cpu (dry run)",
        "gpu_sampling": sampler.how,
        "rows": rows, "goals": goals(by_name, on_gpu),
    }
    status = "ok" if all(r.get("status") == "ok" for r in rows) else "failed"
    return {"status": status, **summary}


def goals(rows, on_gpu):
    """The issue's acceptance figures, as measured (recorded, not enforced: a measurement)."""
    def ok(name):
        return rows.get(name, {}).get("status") == "ok"
    out = {}
    if ok("plain_fp32") and ok("engine_bf16_compile"):
        ratio = rows["engine_bf16_compile"]["samples_per_s"] / rows["plain_fp32"]["samples_per_s"]
        out["bf16_compile_over_plain"] = {"value": round(ratio, 3), "goal": "at least 1.9x", "met": ratio >= 1.9}
    if ok("plain_fp32") and ok("engine_fp32"):
        ratio = rows["engine_fp32"]["samples_per_s"] / rows["plain_fp32"]["samples_per_s"]
        out["engine_fp32_over_plain"] = {"value": round(ratio, 3), "goal": "at least 1.0x", "met": ratio >= 1.0}
    if ok("bare_bf16_compile") and ok("engine_bf16_compile"):
        extra = rows["engine_bf16_compile"]["step_ms"] / rows["bare_bf16_compile"]["step_ms"] - 1
        out["engine_step_over_bare"] = {"value": round(extra, 4), "goal": "at most +3%", "met": extra <= 0.03}
    if ok("engine_bf16_compile") and "input_stall_share" in rows["engine_bf16_compile"]:
        stall = rows["engine_bf16_compile"]["input_stall_share"]
        out["engine_bf16_compile_input_stall"] = {"value": stall, "goal": "under 2%", "met": stall < 0.02}
    if not on_gpu:
        for goal in out.values():
            goal["met"] = None  # toy sizes on a CPU say nothing about the goals
    return out


def input_pipeline(args, sizes, on_gpu):
    data, transformer = prepare_data(args.work, sizes, sizes.model)
    deadline = time.monotonic() + args.deadline
    warmup, measured, log_every = sizes.input_steps
    row_dir = os.path.join(args.work, "rows", "input_pipeline")
    os.makedirs(row_dir, exist_ok=True)
    cores = len(os.sched_getaffinity(0))
    sampler = GpuSampler(on_gpu).start()
    trainyard = stand_in_trainyard()
    command = engine_command(os.path.join(data, "shards"), sizes.input_batch, "bf16", False,
                             warmup + measured + 1000, log_every, "auto", "auto", os.path.join(row_dir, "checkpoints"),
                             on_gpu, extra=(f"--autotune-window={sizes.autotune_window}", f"--cpu={cores}",
                                            "--memory=64Gi"))
    say(f"input pipeline: engine bf16, batch {sizes.input_batch}, workers and prefetch auto (window "
        f"{sizes.autotune_window} s, {cores} cores), W={warmup} M={measured} L={log_every}")
    process = Process(command, engine_env(sizes.model, trainyard), row_dir, os.path.join(row_dir, "log"))
    try:
        result = measure(process, sampler, warmup, measured, sizes.input_batch,
                         min(deadline, time.monotonic() + sizes.row_timeout), trainyard)
    finally:
        process.kill()
        trainyard.close()
        sampler.stop()
    result.update(model=transformer.describe(), decode="bytes to an int64 token tensor (no augmentation)",
                  wall_s=round(time.monotonic() - process.started, 1),
                  gpu_sampling=sampler.how)
    for name in ("input_workers", "input_prefetch"):
        series = trainyard.series(name)
        result[name] = int(series[-1][1]) if series else None
    result["stall_share_recent"] = [(int(s), round(v, 4)) for s, v in trainyard.series("input_stall_share_recent")]
    result["autotune_log"] = [line for line in process.lines if line.startswith("input pipeline:")]
    if result["status"] != "ok":
        result["log_tail"] = process.tail()
    if result["status"] == "ok" and "input_stall_share" in result:
        result["goal"] = {"value": result["input_stall_share"], "goal": "under 2%",
                          "met": result["input_stall_share"] < 0.02 if on_gpu else None}
    util = result.get("gpu_util_pct")
    say(f"  input pipeline: {result.get('status')}: stall {result.get('input_stall_share')}, "
        f"{result.get('samples_per_s')} samples/s, GPU {'-' if util is None else f'{util:.0f}%'}, ended at "
        f"{result.get('input_workers')} workers x {result.get('input_prefetch')} prefetch")
    for line in result["autotune_log"]:
        print(f"    | {line}", flush=True)
    for line in result.get("log_tail", []):
        print(f"    | {line}", flush=True)
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["table", "input"])
    p.add_argument("--work", required=True, help="a scratch folder (data, row logs); reused by the next call")
    p.add_argument("--out", required=True, help="the JSON result")
    p.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU")
    p.add_argument("--deadline", type=float, default=600, help="seconds for the whole call")
    args = p.parse_args()
    on_gpu = not args.dry_run and gpu_present()
    if not args.dry_run and not on_gpu:
        sys.exit("no NVIDIA GPU here (nvidia-smi -L failed): run with --dry-run")
    sizes = SIZES["dry" if args.dry_run else "gpu"]
    os.makedirs(args.work, exist_ok=True)
    result = (table if args.what == "table" else input_pipeline)(args, sizes, on_gpu)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    sys.exit(0 if result.get("status") == "ok" else 1)


if __name__ == "__main__":
    main()
