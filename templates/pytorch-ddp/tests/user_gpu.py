"""User code for the engine's GPU tests (test_gpu.py): user_noisy.py's model and data (dropout,
which draws from the CUDA generator on a GPU; noise added in decode), and what the engine did, printed
as the user's code sees it: the dtype and device of the model's outputs and whether autocast is
on (first loss_fn call of each rank), and how many graphs torch.compile made (third call). With
TEST_KILL_AT=<n>, the n-th loss_fn call SIGKILLs the process's group (the training process and
its decode workers), as a machine failure would: no final checkpoint.
"""
import os
import signal

import torch
from torch import nn

calls = {"loss": 0}


def build_model():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 4))


def decode(sample):
    image = torch.frombuffer(bytearray(sample["bin"]), dtype=torch.float32).view(1, 8, 8)
    return image + 0.05 * torch.randn(1, 8, 8), int(sample["cls"])


def autocast_enabled(device_type):
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # before torch 2.4: CUDA's only
        return torch.is_autocast_enabled()


def compiled_graphs():
    try:
        import torch._dynamo.utils
        return torch._dynamo.utils.counters["stats"]["unique_graphs"]
    except Exception as err:  # noqa: BLE001 - a private counter: say so rather than fail
        return f"unknown ({type(err).__name__})"


def loss_fn(outputs, targets):
    calls["loss"] += 1
    rank = os.environ.get("RANK")
    if calls["loss"] == 1:
        print(f"user: rank {rank} outputs {outputs.dtype} on {outputs.device}, "
              f"autocast {autocast_enabled(outputs.device.type)}", flush=True)
    if calls["loss"] == 3:
        print(f"user: rank {rank} compiled graphs: {compiled_graphs()}", flush=True)
    if calls["loss"] == int(os.environ.get("TEST_KILL_AT", "0")):
        os.killpg(os.getpgrp(), signal.SIGKILL)
    return nn.functional.cross_entropy(outputs, targets)
