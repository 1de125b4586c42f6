#!/usr/bin/env python3
"""The first step of tests/gpu/run: what this machine and its Python have, printed and written as
JSON (its `environment` result): Python, torch and its CUDA, cuDNN and NCCL, the GPU as torch and
nvidia-smi see it, triton, NumPy, nvidia-ml-py, pytest, the C compiler torch.compile's Triton
needs for its launchers, cores, memory, disk, cgroups, users. Fails only when torch cannot be
imported, or (without --dry-run) when torch sees no GPU: every later step would fail the same way.

Usage: tests/gpu/environment.py OUT.json [--dry-run]
"""
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys


def version(module):
    try:
        return getattr(importlib.import_module(module), "__version__", "present")
    except Exception as err:  # noqa: BLE001 - absent or broken: say which
        return f"absent ({type(err).__name__}: {err})"


def run(command):
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20)
        return (done.stdout or done.stderr).strip() if done.returncode == 0 else f"failed ({done.returncode}): {done.stderr.strip()}"
    except (OSError, subprocess.SubprocessError) as err:
        return f"unavailable: {err}"


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def main():
    out, dry_run = sys.argv[1], "--dry-run" in sys.argv[2:]
    facts = {"python": sys.version.split()[0], "python_executable": sys.executable, "platform": platform.platform(),
             "os": next((line.split("=", 1)[1].strip('"') for line in read("/etc/os-release").splitlines()
                         if line.startswith("PRETTY_NAME=")), None),
             "cores": len(os.sched_getaffinity(0)), "uid": os.getuid()}
    meminfo = read("/proc/meminfo")
    facts["mem_total_gib"] = next((round(int(line.split()[1]) / 2**20, 1) for line in meminfo.splitlines()
                                   if line.startswith("MemTotal:")), None)
    for where in ("/tmp", "/dev/shm", "."):
        try:
            facts[f"disk_free_gib {where}"] = round(shutil.disk_usage(where).free / 2**30, 1)
        except OSError:
            pass
    facts["cgroup"] = "v2" if os.path.exists("/sys/fs/cgroup/cgroup.controllers") else "v1 or none"
    facts["compilers"] = {name: shutil.which(name) for name in ("cc", "gcc", "g++", "nvcc")}
    facts["CC"] = os.environ.get("CC")
    facts["commands"] = {name: shutil.which(name) for name in ("nvidia-smi", "useradd", "runuser", "setpriv", "timeout")}
    facts["postgres_user"] = run(["id", "postgres"])
    for module in ("numpy", "triton", "pynvml", "pytest", "yaml"):
        facts[module] = version(module)
    facts["nvidia_smi"] = run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                               "--format=csv,noheader"])
    problems = []
    try:
        import torch
    except Exception as err:  # noqa: BLE001
        problems.append(f"torch cannot be imported: {type(err).__name__}: {err}")
        torch = None
    if torch is not None:
        facts.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available(),
                     cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            facts.update(gpu_count=torch.cuda.device_count(), gpu_name=props.name,
                         gpu_capability=f"{props.major}.{props.minor}", gpu_memory_gib=round(props.total_memory / 2**30, 1),
                         gpu_multiprocessors=props.multi_processor_count)
            try:
                facts["bf16_native"] = torch.cuda.is_bf16_supported(including_emulation=False)
            except TypeError:
                facts["bf16_native"] = torch.cuda.is_bf16_supported()
            try:
                facts["nccl"] = ".".join(str(p) for p in torch.cuda.nccl.version())
            except Exception as err:  # noqa: BLE001
                facts["nccl"] = f"unknown ({err})"
            facts["driver"] = facts["nvidia_smi"].split(",")[1].strip() if facts["nvidia_smi"].count(",") >= 3 else None
        elif not dry_run:
            problems.append("torch.cuda.is_available() is False: this torch sees no GPU "
                            f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}; nvidia-smi: {facts['nvidia_smi']})")
    if not any(facts["compilers"][name] for name in ("cc", "gcc")) and not facts["CC"]:
        facts["warning"] = ("no C compiler (cc, gcc, $CC): Triton builds its kernel launchers with one, "
                            "so torch.compile on the GPU may fail")
    facts["problems"] = problems
    for key, value in facts.items():
        print(f"  {key}: {value}", flush=True)
    with open(out, "w") as f:
        json.dump(facts, f, indent=1)
    if problems:
        for problem in problems:
            print(f"environment: {problem}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
