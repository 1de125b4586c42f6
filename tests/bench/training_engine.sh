#!/usr/bin/env bash
# The pytorch-ddp engine before and after a change, side by side in one run (CPU, one process):
# training samples/s of the engine at REV against the working tree's, same data and model.
# Usage: tests/bench/training_engine.sh [REV, default 2087348 (before issue 17's fixes)] [rounds, default 3]
set -euo pipefail
cd "$(dirname "$0")/../.."
rev=${1:-2087348}
rounds=${2:-3}
cargo build --release --locked -p trainyard-data
source tests/python-env
work=$(mktemp -d "${TMPDIR:-/tmp}/trainyard-engine-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$venv/bin/python" tests/bench/make_images.py "$work/files" 12000
"$target_dir/release/yard-data" pack "$work/files" "$work/shards" --shard-size 64Mi >/dev/null
mkdir -p "$work/before"
git archive "$rev" templates/pytorch-ddp/engine | tar -x -C "$work/before"
echo "12000 samples of 48 KiB in $(ls "$work/shards" | grep -c '\.tar$') shards; $(nproc) cores; engine at $rev vs the working tree"
PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" tests/bench/engine_versions.py "$work/shards" \
  "before ($rev)" "$work/before/templates/pytorch-ddp/engine" \
  "after (working tree)" templates/pytorch-ddp/engine --rounds "$rounds"
