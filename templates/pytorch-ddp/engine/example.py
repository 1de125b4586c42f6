"""The built-in example: a small image classifier over 8x8 single-channel images packed as
`<key>.bin` (64 float32 values) and `<key>.cls` (the label as text). Runs with no user code.

A user module provides the same three functions: build_model(), loss_fn(outputs, targets) and
decode(sample) -> (inputs, target), where `sample` maps extensions to bytes.
"""
import torch
from torch import nn


def build_model():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def loss_fn(outputs, targets):
    return nn.functional.cross_entropy(outputs, targets)


def decode(sample):
    image = torch.frombuffer(bytearray(sample["bin"]), dtype=torch.float32).view(1, 8, 8)
    return image, int(sample["cls"])
