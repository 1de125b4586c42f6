"""Seeds and random-number-generator state: what makes a run repeat and a resumed run continue
as if it had never stopped.

- Process `rank` seeds Python, NumPy (when installed) and torch (CPU and every CUDA device) with
  `rank_seed(seed, rank)`: ranks differ (dropout, augmentation), runs repeat. Nothing reseeds
  them afterwards. The initial weights are rank 0's: DDP broadcasts rank 0's parameters and
  buffers to every rank when it wraps the model.
- `decode` runs in decode workers (or in the training process with workers=0) under
  `batch_seed(seed, epoch, rank, batch)`, so augmentations depend on which batch is decoded, not
  on which worker decodes it or how many workers there are, and a resumed run decodes the same.
- A checkpoint holds each rank's own generator states (`rng_state`); on resume each rank restores
  its own (`rng_restore`), CUDA included. They hold tensors and plain Python values only (NumPy's
  state as a list of ints), so checkpoints load with torch.load(weights_only=True).
"""
import contextlib
import hashlib
import random

import torch

try:
    import numpy
except ImportError:  # NumPy is optional: seeded and saved only where installed
    numpy = None


def _derive(*parts):
    """A 64-bit seed from parts, distinct for distinct parts (unlike seed + 1000 * rank, where
    seed 1000 of rank 0 is seed 0 of rank 1)."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def rank_seed(seed, rank):
    """The seed of process `rank`'s generators: a 64-bit value, as torch.manual_seed accepts."""
    return _derive("rank", seed, rank)


def batch_seed(seed, epoch, rank, batch):
    """The seed `decode` runs under for micro-batch `batch` of `epoch` on `rank`."""
    return _derive("batch", seed, epoch, rank, batch)


def seed_everything(value):
    """Seeds Python's, NumPy's (whose legacy seed is 32 bits) and torch's generators; torch's
    manual_seed seeds the CPU and every CUDA device."""
    random.seed(value)
    if numpy is not None:
        numpy.random.seed(value % 2**32)
    torch.manual_seed(value)


def rng_state(device):
    """This process's generator states; `device` is where it trains (its CUDA generator is saved
    when it is a GPU)."""
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if numpy is not None:
        state["numpy"] = numpy_state_plain(numpy.random.get_state())
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def rng_restore(state, device):
    """Puts back what `rng_state` saved, on this process's own device."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"].cpu())
    if numpy is not None and "numpy" in state:
        numpy.random.set_state(numpy_state_array(state["numpy"]))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def numpy_state_plain(state):
    """NumPy's legacy generator state (`numpy.random.get_state()`: name, 624 uint32 keys as an
    array, position, has_gauss, cached_gaussian) with the keys as a list of ints: no array, so a
    checkpoint holding it loads with weights_only=True."""
    name, keys, position, has_gauss, cached = state
    return (name, [int(k) for k in keys], int(position), int(has_gauss), float(cached))


def numpy_state_array(state):
    """The state as `numpy.random.set_state` takes it, from `numpy_state_plain`'s form or from the
    array form checkpoints of engines before 1.8 hold."""
    name, keys, position, has_gauss, cached = state
    return (name, numpy.asarray(keys, dtype=numpy.uint32), position, has_gauss, cached)


@contextlib.contextmanager
def seeded(value):
    """Runs the body with Python's, NumPy's and torch's CPU generators seeded with `value`, then
    puts the previous states back, so decoding in the training process (workers=0) leaves its
    generators as they were."""
    python = random.getstate()
    numpy_state = numpy.random.get_state() if numpy is not None else None
    with torch.random.fork_rng(devices=[]):
        random.seed(value)
        if numpy is not None:
            numpy.random.seed(value % 2**32)
        torch.default_generator.manual_seed(value)  # the CPU's only: CUDA's stays untouched
        try:
            yield
        finally:
            random.setstate(python)
            if numpy is not None:
                numpy.random.set_state(numpy_state)
