"""Checkpoints on disk: `ckpt-<step>.pt` files and `latest.json`, which names the newest complete
one, in one folder (rank 0 writes it; every rank resumes from it). The folder is in the tenant's
checkpoint volume by default (`checkpoint_dir`), so checkpoints outlive the job's pods on
Kubernetes and its working folders on the local executor: a restarted attempt resumes the same
way on both.

Durable: a checkpoint is written aside, fsynced, renamed into place and the folder fsynced; only
then does `latest.json` (written the same way) name it, so after a crash `latest.json` names a
complete file or nothing. A `latest.json` that names a missing or unreadable checkpoint is an
error, never a silent start from step 0. Names carry the step zero-padded to 8 digits (longer
beyond 10^8 steps); nothing relies on their string order: the step is parsed wherever it counts.

A run can start from the model weights of another run's checkpoint (`checkpoint_weights`,
`--init-from`: fine-tuning, with a fresh optimizer and schedule from step 0); once it has
checkpoints of its own, a restarted attempt resumes those instead.

Loading unpickles with torch.load(weights_only=True): tensors, containers and plain values only,
so a file someone put in the checkpoint folder cannot run code when a job resumes from it. What
the engine saves holds nothing else (seeds.py keeps NumPy's state as a list); checkpoints of
engines before 1.8 hold NumPy's state as an array, allowed by name (`legacy_globals`).
"""
import contextlib
import json
import os
import re

import torch

try:
    import numpy
except ImportError:  # NumPy is optional (seeds.py)
    numpy = None

LATEST = "latest.json"
_NAME = re.compile(r"ckpt-(\d+)\.pt")


class CheckpointError(Exception):
    """The checkpoint a run must resume from cannot be used."""


def checkpoint_dir(output, volume, job_id):
    """Where a job's checkpoints go: `<volume>/jobs/<job id>/<output>` when a checkpoint volume
    is given (one folder per job, so the tenant's jobs share the volume without meeting), else
    `output` itself (relative: the working folder of replica 0's processes). An absolute
    `output` is taken as it is."""
    if not volume or os.path.isabs(output):
        return output
    if not job_id:
        raise CheckpointError(
            "a checkpoint volume needs TRAINYARD_JOB_ID to name the job's folder in it; "
            "set it, or leave --checkpoint-volume empty")
    return os.path.join(volume, "jobs", job_id, output)


def checkpoint_name(step):
    return f"ckpt-{step:08d}.pt"


def checkpoint_step(name):
    """The step of a checkpoint file's name; None for any other file (`.partial` ones included)."""
    match = _NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def checkpoints_to_prune(names, keep):
    """The checkpoint files among `names` beyond the newest `keep` by step (none when keep is 0)."""
    if keep <= 0:
        return []
    steps = sorted((checkpoint_step(n), n) for n in names if checkpoint_step(n) is not None)
    return [name for _, name in steps[:-keep]]


def _first_line(err):
    lines = str(err).strip().splitlines()
    return lines[0] if lines else ""


def _fsync_directory(directory):
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(directory, name, write):
    aside = os.path.join(directory, name + ".partial")
    with open(aside, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(aside, os.path.join(directory, name))
    _fsync_directory(directory)


def checkpoint_save(directory, state, step, keep):
    """Writes `state` as the checkpoint of `step`, points `latest.json` at it, then deletes all
    but the newest `keep` (all kept when 0): pruning after `latest.json` moved on means a resume
    never finds its checkpoint gone."""
    os.makedirs(directory, exist_ok=True)
    name = checkpoint_name(step)
    _write_durably(directory, name, lambda f: torch.save(state, f))
    _write_durably(directory, LATEST, lambda f: f.write(json.dumps({"checkpoint": name, "step": step}).encode()))
    print(f"checkpoint {name} written", flush=True)
    names = os.listdir(directory)
    # A `.partial` left now is one a killed writer never finished (there is one writer: rank 0).
    for old in checkpoints_to_prune(names, keep) + [n for n in names if n.endswith(".partial")]:
        os.remove(os.path.join(directory, old))


def legacy_globals():
    """What the pickles of checkpoints written before engine 1.8 name besides tensors: NumPy's
    generator state, an array of uint32 (numpy.ndarray, numpy.dtype and the function that rebuilds
    an array, named numpy.core.multiarray._reconstruct by NumPy 1 and numpy._core.multiarray.
    _reconstruct by NumPy 2). Empty without NumPy (such a checkpoint then fails to load, clearly)."""
    if numpy is None:
        return []
    reconstruct = numpy.ndarray(0).__reduce__()[0]
    return [numpy.ndarray, numpy.dtype, type(numpy.dtype(numpy.uint32)),
            (reconstruct, "numpy.core.multiarray._reconstruct"), (reconstruct, "numpy._core.multiarray._reconstruct")]


def _allowing(globals_):
    """torch.serialization.safe_globals (torch 2.5 and later) over `globals_`."""
    safe_globals = getattr(torch.serialization, "safe_globals", None)
    return safe_globals(globals_) if safe_globals is not None and globals_ else contextlib.nullcontext()


def checkpoint_load(path):
    """The state in `path`, onto the CPU, unpickling only tensors, containers and plain values
    (and `legacy_globals`)."""
    with _allowing(legacy_globals()):
        return torch.load(path, map_location="cpu", weights_only=True)


def checkpoint_latest(directory):
    """The state `latest.json` names, loaded onto the CPU (every process would otherwise unpickle
    tensors onto the device they were saved from); None when there is no `latest.json` (a first
    start). Raises CheckpointError when it names a checkpoint that cannot be loaded."""
    latest = os.path.join(directory, LATEST)
    try:
        with open(latest) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    try:
        name = json.loads(text)["checkpoint"]
        if checkpoint_step(name) is None:
            raise ValueError(f"{name!r} is not a checkpoint name")
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"cannot resume: {latest} is unreadable ({err}); "
                              f"delete it to start over from step 0") from None
    path = os.path.join(directory, name)
    try:
        return checkpoint_load(path)
    except FileNotFoundError:
        raise CheckpointError(f"cannot resume: {latest} names {path}, which is missing") from None
    except Exception as err:  # torch.load raises many kinds for a damaged file
        raise CheckpointError(f"cannot resume: {path}, named by {latest}, cannot be loaded: "
                              f"{type(err).__name__}: {_first_line(err)}") from None


def checkpoint_weights(path):
    """The model weights and step of the checkpoint at `path`, another run's (fine-tuning from it,
    `--init-from`), loaded onto the CPU as a resume loads them. Raises CheckpointError when it is
    missing or cannot be loaded, never a silent start from fresh weights."""
    if checkpoint_step(os.path.basename(path)) is None:
        raise CheckpointError(f"cannot fine-tune from {path}: not a checkpoint file (ckpt-<step>.pt)")
    try:
        state = checkpoint_load(path)
    except FileNotFoundError:
        raise CheckpointError(f"cannot fine-tune from {path}: it is missing (deleted by keep_checkpoints since "
                              f"the run was submitted?)") from None
    except Exception as err:  # torch.load raises many kinds for a damaged file
        raise CheckpointError(f"cannot fine-tune from {path}: {type(err).__name__}: {_first_line(err)}") from None
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"cannot fine-tune from {path}: it holds no model weights")
    step = state.get("step")
    return {"model": state["model"], "step": step if isinstance(step, int) else 0}
