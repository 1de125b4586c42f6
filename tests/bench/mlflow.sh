#!/usr/bin/env bash
# MLflow's log-batch (issue 42): CLIENTS (default 16) clients each send batches of 1,000 metric
# points (MLflow's limit per request) into runs of their own, against Trainyard (its MLflow API,
# into Postgres: durable settings, fsync and synchronous commit on) and against MLflow's own
# tracking server (`mlflow server`, the same version as the client, SQLite backend, its default
# workers) on the same machine, in the same run, with the same load generator
# (tests/bench/mlflow_log_batch.py). Figures go to docs/PERFORMANCE.md.
# Needs `mlflow` (the full package, for `mlflow server`) in PYTHON's environment.
# Usage: tests/bench/mlflow.sh [batches per client, default 20] [clients, default 16]
set -euo pipefail
cd "$(dirname "$0")/../.."
batches=${1:-20}
clients=${2:-16}
python=${PYTHON:-python3}
"$python" -c "import mlflow.server" 2>/dev/null || { echo "mlflow is not installed for $python: $python -m pip install mlflow==3.17.2 (the version tests/python-requirements.txt pins for mlflow-skinny)"; exit 1; }
if [ -z "${trainyard:-}" ]; then
  # The server and the supervisor the local executor needs beside it (no job runs here).
  cargo build --release --locked -p trainyard-server --bin trainyard
  cargo build --release --locked -p trainyard-executor --bin trainyard-shim
  trainyard=${CARGO_TARGET_DIR:-target}/release/trainyard
fi
source tests/bench/server.sh

mlflow_pid=""
stop_mlflow() { [ -n "$mlflow_pid" ] && kill "$mlflow_pid" 2>/dev/null && wait "$mlflow_pid" 2>/dev/null; cleanup; }
trap stop_mlflow EXIT
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$python" -m mlflow server --backend-store-uri "sqlite:///$work/mlflow.db" --host 127.0.0.1 --port "$port" \
  > "$work/mlflow.log" 2>&1 &
mlflow_pid=$!
for _ in $(seq 300); do curl -sf -o /dev/null "http://127.0.0.1:$port/health" && break; sleep 0.2; done
curl -sf -o /dev/null "http://127.0.0.1:$port/health" || { tail -20 "$work/mlflow.log"; exit 1; }
echo "mlflow server $("$python" -c 'import mlflow; print(mlflow.__version__)') at http://127.0.0.1:$port (SQLite)"

echo "== $clients clients x $batches batches of 1,000 points"
"$python" tests/bench/mlflow_log_batch.py --url "$url" --token "$TRAINYARD_TOKEN" --label trainyard \
  --clients "$clients" --batches "$batches"
"$python" tests/bench/mlflow_log_batch.py --url "http://127.0.0.1:$port" --label "mlflow-server-sqlite" \
  --clients "$clients" --batches "$batches"
