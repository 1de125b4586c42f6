"""The seed table's model and data (bench/seed_table.py), as a user module of the engine
(build_model, loss_fn, decode) that the plain and bare loops (bench/loops.py) import as well: a
decoder-only transformer language model (pre-norm blocks of causal self-attention through
scaled_dot_product_attention and a GELU MLP, learned positions, an untied output layer) over
sequences of token ids.

Its size comes from the environment, so that one file serves the GPU run and the CPU dry run:
BENCH_LAYERS (4), BENCH_WIDTH (2048), BENCH_HEADS (16), BENCH_SEQ (512), BENCH_VOCAB (8192).
At the defaults it has 235 M parameters and a step of batch 16 (8,192 tokens) is about 12 TFLOP:
matrix products of 8,192 rows by 2,048 to 8,192 columns, large enough that the GPU, not Python,
bounds the step (the host launches a step's few hundred kernels in a few milliseconds).

A sample is `<key>.bin`: SEQ + 1 token ids as little-endian int32; inputs are its first SEQ,
targets its last SEQ. The sequences follow a rule a model can learn (token i is a + b * i modulo
the vocabulary, a and b drawn per sample), so the loss falls and a broken run shows.
"""
import math
import os
import struct

import torch
from torch import nn

LAYERS = int(os.environ.get("BENCH_LAYERS", "4"))
WIDTH = int(os.environ.get("BENCH_WIDTH", "2048"))
HEADS = int(os.environ.get("BENCH_HEADS", "16"))
SEQ = int(os.environ.get("BENCH_SEQ", "512"))
VOCAB = int(os.environ.get("BENCH_VOCAB", "8192"))


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, seq, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, width))
        return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))


class LanguageModel(nn.Module):
    def __init__(self, layers=LAYERS, width=WIDTH, heads=HEADS, seq=SEQ, vocab=VOCAB):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tokens(tokens) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build_model():
    return LanguageModel()


def loss_fn(outputs, targets):
    return nn.functional.cross_entropy(outputs.reshape(-1, outputs.shape[-1]), targets.reshape(-1))


def decode(sample):
    tokens = torch.frombuffer(bytearray(sample["bin"]), dtype=torch.int32).long()
    return tokens[:-1], tokens[1:]


def sample_bytes(rng):
    """One sample's `.bin`: SEQ + 1 tokens a + b * i (mod VOCAB), a and b from `rng`."""
    a, b = rng.randrange(VOCAB), rng.randrange(1, 64)
    return struct.pack(f"<{SEQ + 1}i", *((a + b * i) % VOCAB for i in range(SEQ + 1)))


def parameter_count(layers=LAYERS, width=WIDTH, seq=SEQ, vocab=VOCAB):
    block = 12 * width * width + 13 * width  # qkv, proj, up, down with biases; two LayerNorms
    return layers * block + (2 * vocab + seq + 2) * width


def train_flops_per_sample(layers=LAYERS, width=WIDTH, seq=SEQ, vocab=VOCAB):
    """Matrix-product FLOPs of a forward and backward pass over one sample, counted as the
    literature counts them (6 x weights x tokens, plus attention's 12 x layers x seq x width per
    token, causal masking not subtracted): what model FLOP utilisation divides by."""
    weights = layers * 12 * width * width + width * vocab
    return seq * (6 * weights + 12 * layers * seq * width)


def describe():
    return (f"decoder-only transformer: {LAYERS} layers, width {WIDTH}, {HEADS} heads, sequence {SEQ}, "
            f"vocabulary {VOCAB}, {parameter_count() / 1e6:.0f} M parameters, "
            f"{train_flops_per_sample() / 1e9:.1f} GFLOP per sample (forward and backward)")


if __name__ == "__main__":
    print(describe())
    assert math.isfinite(parameter_count())
