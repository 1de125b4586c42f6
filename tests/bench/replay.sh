#!/usr/bin/env bash
# Kueue's scheduler baseline (15,000 jobs, 30 tenants in 5 cohorts) replayed end to end through
# the real server, release build, local executor with real processes on one simulated node of
# 600 GPUs; prints Kueue's figures beside the measured ones (tests/e2e/replay.rs).
# Usage: tests/bench/replay.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/ensure-postgres
cargo build --release --locked --workspace --bins
work=$(mktemp -d "${TMPDIR:-/tmp}/trainyard-replay.XXXXXX")
chmod 755 "$work" # Postgres runs as its own user
trap 'target/release/trainyard postgres stop --dir "$work/pg" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
export TRAINYARD_TEST_DATABASE_URL=$(target/release/trainyard postgres start --dir "$work/pg")
cargo test --release --locked -p trainyard-tests --test e2e replay::kueues_baseline_full -- --ignored --nocapture
