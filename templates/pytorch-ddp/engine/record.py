"""The engine's part of the run record (docs/reproducibility.md): what only the running process
knows. Rank 0 posts it once per attempt, with the attempt's job token, to
`POST $TRAINYARD_URL/api/v1/jobs/$TRAINYARD_JOB_ID/record`; Trainyard keeps it with the part the
server wrote when the attempt began, and never changes either.

- `build(facts, run)` is pure: the record from facts about this machine and this run, injected
  (the tests give their own).
- `gather(...)` reads the facts here: importlib.metadata (every installed distribution, not only
  what was imported), /proc/cpuinfo and /proc/meminfo, torch's CUDA, cuDNN and NCCL versions,
  nvidia-smi for the driver when there is a GPU.
- `post(body)` sends it; failing to record never stops training (the caller prints why).
"""
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import urllib.request

import seeds
import shards

# The engine's version: the pytorch-ddp template's (a test checks they agree).
ENGINE = {"name": "pytorch-ddp", "version": "1.11.0"}
# Above this many shards the record gives the rule and its inputs, not every rank's list: the
# assignment is a pure function of the shard counts (in dataset.json, covered by its content
# hash), the seed and the world size.
MAX_LISTED_SHARDS = 10_000
# Above this many ranks, the rule instead of every rank's seed.
MAX_LISTED_SEEDS = 4096
SEED_RULE = ("rank r seeds Python, NumPy and torch with the first 8 bytes, little-endian, of "
             "sha256('rank:<seed>:<r>') (seeds.rank_seed)")
ASSIGNMENT_RULE = ("shards ordered by sha256('<seed>:<epoch>:<position>'); rank r takes samples "
                   "[r * n, (r + 1) * n) of that sequence, n = samples // world_size (shards.rank_share)")


def normalized_name(name):
    """A distribution's name as PEP 503 compares them: lowercase, runs of -_. as one '-'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def package_lock(distributions):
    """{normalized name: version} of every distribution in `distributions` ((name, version)
    pairs in sys.path order); a name found twice keeps the first, the one Python imports."""
    lock = {}
    for name, version in distributions:
        if name and version:
            lock.setdefault(normalized_name(name), version)
    return dict(sorted(lock.items()))


def cpu_model(cpuinfo):
    """The CPU's model from /proc/cpuinfo's text ("model name" on x86, "Model" or "Hardware" on
    some ARM machines); None when it says none."""
    for key in ("model name", "Model", "Hardware"):
        for line in cpuinfo.splitlines():
            name, _, value = line.partition(":")
            if name.strip() == key and value.strip():
                return value.strip()
    return None


def memory_bytes(meminfo):
    """MemTotal from /proc/meminfo's text, in bytes; None when absent."""
    match = re.search(r"^MemTotal:\s+(\d+) kB", meminfo, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def cudnn_version(number):
    """cuDNN's version number as text: 92600 is 9.26.0 (9.x: major * 10000 + minor * 100 +
    patch), 8907 is 8.9.7 (8.x and before: major * 1000 + minor * 100 + patch)."""
    if number is None:
        return None
    if number >= 10000:
        return f"{number // 10000}.{number // 100 % 100}.{number % 100}"
    return f"{number // 1000}.{number // 100 % 10}.{number % 100}"


def shard_assignment(shard_samples, world_size, seed, epoch=0, max_listed=MAX_LISTED_SHARDS):
    """Which shards each rank reads in `epoch`: per rank, the shard positions (in dataset.json's
    order) in the order it reads them, the index of its first sample in the first and the end
    index in the last (the others it reads whole). None past `max_listed` shards."""
    if len(shard_samples) > max_listed:
        return None
    ranks = []
    for rank in range(world_size):
        pieces = shards.rank_share(shard_samples, rank, world_size, seed, epoch)
        ranks.append({"rank": rank, "shards": [p[0] for p in pieces],
                      "first_index": pieces[0][1] if pieces else 0, "end_index": pieces[-1][2] if pieces else 0})
    return ranks


def build(facts, run):
    """The engine's record (the body of POST /api/v1/jobs/{id}/record) from `facts` about this
    machine (see `gather`) and `run`, this run's settings: seed, deterministic, world_size,
    replicas, processes_per_replica, backend, device_type, data_path (the folder, or
    `store:NAME@VERSION`: the manifest's content_hash is the same either way), content_hash,
    shard_samples, user_module, user_module_sha256, user_repo, user_commit, and input_pipeline:
    the decode settings the run trained with ({workers, prefetch, autotuned, settled}: the
    parameters autotune chose, and whether it had settled), which `yard rerun --set` can pin."""
    world = run["world_size"]
    return {
        "environment": {
            "python": facts["python"],
            "platform": facts["platform"],
            "packages": package_lock(facts["distributions"]),
        },
        "hardware": {
            "cpu_model": cpu_model(facts["cpuinfo"]),
            "cpu_count": facts["cpu_count"],
            "memory_bytes": memory_bytes(facts["meminfo"]),
            "gpus": facts["gpus"],
            "driver": facts["driver"],
            "cuda": facts["cuda"],
            "cudnn": cudnn_version(facts["cudnn"]),
            "nccl": facts["nccl"],
            "world_size": world,
            "replicas": run["replicas"],
            "processes_per_replica": run["processes_per_replica"],
            "backend": run["backend"],
            "device_type": run["device_type"],
        },
        "seeds": {
            "seed": run["seed"],
            "rule": SEED_RULE,
            "rank_seeds": ([seeds.rank_seed(run["seed"], r) for r in range(world)]
                           if world <= MAX_LISTED_SEEDS else None),
            "deterministic": run["deterministic"],
            "torch_deterministic_algorithms": facts["deterministic_algorithms"],
            "cudnn_benchmark": facts["cudnn_benchmark"],
            "cublas_workspace_config": facts["cublas_workspace_config"],
        },
        "data": {
            "path": run["data_path"],
            "content_hash": run["content_hash"] or None,
            "shards": len(run["shard_samples"]),
            "samples": sum(run["shard_samples"]),
            "assignment": {
                "epoch": 0,
                "rule": ASSIGNMENT_RULE,
                "ranks": shard_assignment(run["shard_samples"], world, run["seed"]),
            },
        },
        "user_code": {
            "module": run["user_module"] or None,
            "module_sha256": run["user_module_sha256"],
            "repository": run["user_repo"] or None,
            "commit": run["user_commit"] or None,
        },
        "engine": dict(ENGINE, input_pipeline=dict(run["input_pipeline"])),
    }


def file_sha256(path):
    """`sha256:<hex>` of a file's bytes; None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return "sha256:" + hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def driver_version():
    """The NVIDIA driver's version from nvidia-smi; None without it."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return next((line.strip() for line in out.splitlines() if line.strip()), None)


def gather():
    """The facts `build` needs, read from this process and machine."""
    import importlib.metadata

    import torch

    cuda = torch.cuda.is_available()
    gpus = []
    if cuda:
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            gpus.append({"name": props.name, "memory_bytes": props.total_memory})
    nccl = None
    if cuda:
        try:
            version = torch.cuda.nccl.version()
            nccl = ".".join(str(p) for p in version) if isinstance(version, tuple) else str(version)
        except (AttributeError, RuntimeError):
            nccl = None
    return {
        "python": {"version": platform.python_version(), "executable": sys.executable,
                   "implementation": platform.python_implementation()},
        "platform": platform.platform(),
        "distributions": [(d.metadata["Name"], d.version) for d in importlib.metadata.distributions()],
        "cpuinfo": read_text("/proc/cpuinfo"),
        "meminfo": read_text("/proc/meminfo"),
        "cpu_count": os.cpu_count(),
        "gpus": gpus,
        "driver": driver_version() if cuda else None,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": nccl,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }


def post(body):
    """Posts the record with the job token; does nothing without TRAINYARD_URL, TRAINYARD_TOKEN
    and TRAINYARD_JOB_ID. Raises OSError (urllib's HTTPError included) when it is refused."""
    url, token, job = (os.environ.get(k) for k in ("TRAINYARD_URL", "TRAINYARD_TOKEN", "TRAINYARD_JOB_ID"))
    if not (url and token and job):
        return False
    request = urllib.request.Request(
        f"{url}/api/v1/jobs/{job}/record", data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=10).read()
    return True
