#!/usr/bin/env bash
# Time to a target loss (issue 40): ASHA vs random search through Trainyard (trials as jobs) vs
# Optuna's SuccessiveHalvingPruner run by its own driver, on the same trials of pytorch-ddp over
# the toy images (CPU), at the same concurrency, in one run. See tests/bench/search.py.
# Usage: tests/bench/search.sh [trials, default 12] [concurrency, default 2] [max steps, default 96]
# A build other than this checkout's release one: trainyard=target/debug/trainyard (training, not
# the control plane, takes the time here).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/python-env
source tests/bench/server.sh
bin=$(dirname "$trainyard")
[ -x "$bin/yard-data" ] || cargo build --locked -p trainyard-data --bin yard-data $([ "$bin" = target/release ] && echo --release)
"$venv/bin/python" tests/bench/search.py make-images "$work/images"
"$bin/yard-data" pack "$work/images" "$work/shards" --shard-size 32Ki >/dev/null
chmod -R a+rX "$work/shards"
"$venv/bin/python" tests/bench/search.py --url "$url" --token "$TRAINYARD_TOKEN" --data "$work/shards" \
  --trials "${1:-12}" --concurrency "${2:-2}" --max-length "${3:-96}"
