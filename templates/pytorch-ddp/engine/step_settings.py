"""How each training step runs on this process's device: the precision (autocast's dtype, and
whether the gradient scaler is used), torch.compile, pinned host memory for the input batches,
and the optimizer's implementation. `step_settings` decides them all from the parameters and the
device, pure (no I/O; the caller asks torch whether the GPU has bf16); the rules follow torch's
documentation as cited beside each, and tests/test_step_settings.py checks every one without a
GPU (tests/test_gpu.py checks them on one). Rank 0 prints the outcome as one line (`describe`).

The default precision is the template's (template.yaml's `precision`; a test checks that every
default the engine and the template share agrees).
"""
import collections

import torch

PRECISIONS = ("fp32", "bf16", "fp16")
DEFAULT_PRECISION = "bf16"

# torch.autocast: "dtype: data type for ops run in autocast"; fp32 runs without autocast.
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

StepSettings = collections.namedtuple(
    "StepSettings", "precision autocast_dtype grad_scaler compile pin_memory fused_optimizer notes")
StepSettings.__doc__ = """What one process's training step uses: `precision` as it runs (after any
fallback), `autocast_dtype` (None: no autocast), `grad_scaler` (torch.amp.GradScaler enabled),
`compile` (torch.compile), `pin_memory` (the input loader's), `fused_optimizer` (AdamW's fused
kernel), and `notes`: why a fallback was taken, for the log."""


def step_settings(precision, compile_model, device_type, bf16_supported=True):
    """The settings of a process that trains on a `device_type` device ("cuda" or "cpu") with
    the `precision` and `compile_model` parameters; `bf16_supported`: whether that GPU computes
    bf16 natively (torch.cuda.is_bf16_supported(including_emulation=False)).

    - Precision. bf16 and fp16 are autocast to that dtype. fp16 has a fifth of fp32's exponent
      range, so small gradients underflow to zero without loss scaling: the gradient scaler runs
      with fp16 only (torch.amp docs: bf16 has fp32's range and needs none). fp16 needs a GPU (the
      scaler is CUDA's): on CPU it falls back to bf16. A GPU without native bf16 (before Ampere)
      emulates it slowly: bf16 falls back to fp16 with the scaler there.
    - Pinned memory on a GPU only: DataLoader's pin_memory puts batches in page-locked memory so
      that the copy to the GPU is asynchronous (`.to(device, non_blocking=True)`); on CPU there
      is no copy to make.
    - AdamW's fused implementation on a GPU ("fused: currently torch.float64, torch.float32,
      torch.float16, and torch.bfloat16 are supported on CUDA"): one kernel for every
      parameter, and with the gradient scaler no device-to-host read of its inf check each step
      (GradScaler.step hands the check to an optimizer that supports it instead of reading it).
      On CPU torch's default implementation.
    - compile: as the parameter says, on any device."""
    notes = []
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is none of {', '.join(PRECISIONS)}")
    on_gpu = device_type == "cuda"
    if precision == "fp16" and not on_gpu:
        notes.append("fp16 needs a GPU; using bf16 on CPU")
        precision = "bf16"
    elif precision == "bf16" and on_gpu and not bf16_supported:
        notes.append("this GPU has no native bf16 (it came with Ampere); using fp16 with the gradient scaler")
        precision = "fp16"
    return StepSettings(precision=precision, autocast_dtype=AUTOCAST_DTYPES.get(precision),
                        grad_scaler=precision == "fp16", compile=bool(compile_model), pin_memory=on_gpu,
                        fused_optimizer=on_gpu, notes=tuple(notes))


def optimizer_options(settings):
    """Keyword arguments for torch.optim.AdamW beyond the learning rate."""
    return {"fused": True} if settings.fused_optimizer else {}


def describe(settings, device, backend):
    """One line saying what the step uses, for rank 0's log."""
    def on(flag):
        return "on" if flag else "off"
    autocast = f"autocast {settings.autocast_dtype}" if settings.autocast_dtype is not None else "no autocast"
    optimizer = "fused AdamW" if settings.fused_optimizer else "AdamW"
    return (f"engine: {device} over {backend}; {settings.precision} ({autocast}); gradient scaler "
            f"{on(settings.grad_scaler)}; compile {on(settings.compile)}; pinned memory {on(settings.pin_memory)}; "
            f"{optimizer}")
