"""User code for the engine's tests: the built-in example with randomness everywhere a user has
it (dropout in the model, noise added in decode), so that a resume that restores a generator
wrongly changes the losses, and failures on demand:
TEST_FAIL_IN=decode|loss, TEST_FAIL_RANK=<rank>, TEST_FAIL_AT=<n> raise on that rank's n-th
decode (in each decode process) or loss_fn call.
"""
import os

import torch
from torch import nn

calls = {"decode": 0, "loss": 0}


def _fail_now(where):
    calls[where] += 1
    return (os.environ.get("TEST_FAIL_IN") == where and os.environ.get("RANK") == os.environ.get("TEST_FAIL_RANK")
            and calls[where] == int(os.environ.get("TEST_FAIL_AT", "0")))


def build_model():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 4))


def loss_fn(outputs, targets):
    if _fail_now("loss"):
        raise RuntimeError(f"test failure in loss_fn on rank {os.environ['RANK']}")
    return nn.functional.cross_entropy(outputs, targets)


def decode(sample):
    if _fail_now("decode"):
        raise ValueError(f"cannot decode {sample['__key__']} (test failure)")
    image = torch.frombuffer(bytearray(sample["bin"]), dtype=torch.float32).view(1, 8, 8)
    return image + 0.05 * torch.randn(1, 8, 8), int(sample["cls"])
