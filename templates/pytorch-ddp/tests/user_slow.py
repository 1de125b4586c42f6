"""User code for the autotune tests: the built-in example with a decode made slow on purpose, as
an expensive decode (a remote read, a JPEG decode with heavy augmentations) is: it sleeps
TEST_DECODE_SECONDS per sample (0.004 by default) and each training step TEST_STEP_SECONDS
(0.01), so that one decode worker cannot keep up and a few can, whatever else loads the
machine's cores."""
import os
import time

import torch
from torch import nn

DECODE_SECONDS = float(os.environ.get("TEST_DECODE_SECONDS", "0.004"))
STEP_SECONDS = float(os.environ.get("TEST_STEP_SECONDS", "0.01"))


def build_model():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def loss_fn(outputs, targets):
    time.sleep(STEP_SECONDS)
    return nn.functional.cross_entropy(outputs, targets)


def decode(sample):
    time.sleep(DECODE_SECONDS)
    image = torch.frombuffer(bytearray(sample["bin"]), dtype=torch.float32).view(1, 8, 8)
    return image, int(sample["cls"])
