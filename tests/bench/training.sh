#!/usr/bin/env bash
# Input pipeline benchmark of the pytorch-ddp engine (CPU): the engine's shard pipeline against a
# plain DataLoader over the same samples as individual files, same model, same workers.
# Usage: tests/bench/training.sh [samples, default 20000 (3x64x64 float32 images, 48 KiB each)]
set -euo pipefail
cd "$(dirname "$0")/../.."
samples=${1:-20000}
cargo build --release --locked -p trainyard-data
source tests/python-env
work=$(mktemp -d "${TMPDIR:-/tmp}/trainyard-train-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$venv/bin/python" - "$work/files" "$samples" <<'PY'
import os, random, struct, sys
root, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(0)
block = rng.randbytes(1 << 20)
for i in range(n):
    d = os.path.join(root, f"d{i % 50:02d}")
    os.makedirs(d, exist_ok=True)
    off = rng.randrange(0, len(block) - 49152)
    open(os.path.join(d, f"s{i:06d}.bin"), "wb").write(block[off:off + 49152])
    open(os.path.join(d, f"s{i:06d}.cls"), "w").write(str(i % 10))
PY
"$target_dir/release/yard-data" pack "$work/files" "$work/shards" --shard-size 256Mi >/dev/null
echo "$samples samples of 48 KiB; $(nproc) cores"
"$venv/bin/python" tests/bench/input_pipeline.py "$work/files" "$work/shards" --steps 1200 --workers 2
