"""Generates the benchmark input: SAMPLES samples of two files each (.jpg and .json), every file
4-64 KiB of incompressible bytes, spread over 100 folders. Deterministic for a given seed."""
import os
import random
import sys

root, samples = sys.argv[1], int(sys.argv[2])
rng = random.Random(1234)
block = rng.randbytes(1 << 20)
for i in range(samples):
    folder = os.path.join(root, f"shard{i % 100:03d}")
    if i < 100:
        os.makedirs(folder, exist_ok=True)
    for ext in ("jpg", "json"):
        size = rng.randint(4096, 65536)
        offset = rng.randint(0, len(block) - size)
        with open(os.path.join(folder, f"sample{i:07d}.{ext}"), "wb") as f:
            f.write(block[offset:offset + size])
