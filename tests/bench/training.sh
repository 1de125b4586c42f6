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
"$venv/bin/python" tests/bench/make_images.py "$work/files" "$samples"
"$target_dir/release/yard-data" pack "$work/files" "$work/shards" --shard-size 256Mi >/dev/null
echo "$samples samples of 48 KiB; $(nproc) cores"
"$venv/bin/python" tests/bench/input_pipeline.py "$work/files" "$work/shards" --steps 1200 --workers 2
