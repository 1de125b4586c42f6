"""Writes N samples for the training benchmarks: 3x64x64 float32 images (48 KiB of seeded random
bytes, `.bin`) with a label (`.cls`), spread over 50 folders.

Usage: make_images.py DIR N
"""
import os
import random
import sys

root, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(0)
block = rng.randbytes(1 << 20)
for i in range(n):
    d = os.path.join(root, f"d{i % 50:02d}")
    os.makedirs(d, exist_ok=True)
    off = rng.randrange(0, len(block) - 49152)
    with open(os.path.join(d, f"s{i:06d}.bin"), "wb") as f:
        f.write(block[off:off + 49152])
    with open(os.path.join(d, f"s{i:06d}.cls"), "w") as f:
        f.write(str(i % 10))
