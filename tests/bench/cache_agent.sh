#!/usr/bin/env bash
# The node cache agent (issue 23): what a replica's view of a pushed dataset costs through the
# node's agent, cold and warm, beside the same view straight from the server (a pod without the
# agent) and from the local executor's warm machine cache (no copy). Starts s3s-fs on loopback, a
# Postgres database, `trainyard serve` on the S3 store and `trainyard cache-agent`, makes SAMPLES
# synthetic samples (tests/bench/gen_tree.py), packs them with `yard-data pack` (128 MiB shards)
# and pushes them with `yard datasets push`; tests/bench/cache_agent.py runs the engine's reader.
# Each round: server, agent cold (a fresh agent folder), agent warm, local warm. Figures go to
# docs/PERFORMANCE.md.
# Usage: tests/bench/cache_agent.sh [samples, default 15000 (about 1 GB)] [rounds, default 3]
# BENCH_BIN: a folder holding trainyard, yard and yard-data to use instead of building release
# ones; BENCH_PYTHON: a Python with the engine's packages instead of tests/python-env's.
set -euo pipefail
cd "$(dirname "$0")/../.."
samples=${1:-15000}
rounds=${2:-3}
source tests/ensure-s3s
if [ -n "${BENCH_BIN:-}" ]; then
  bin=$BENCH_BIN
else
  cargo build --release --locked --bin trainyard --bin yard --bin yard-data
  bin=${CARGO_TARGET_DIR:-target}/release
fi
if [ -n "${BENCH_PYTHON:-}" ]; then py=$BENCH_PYTHON; else source tests/python-env; py="$venv/bin/python"; fi

work=$(mktemp -d "${TMPDIR:-/tmp}/trainyard-cache-agent.XXXXXX")
chmod 755 "$work"
pids=()
agent_pid=""
own_db=""
cleanup() {
  status=$?
  if [ "$status" != 0 ]; then
    for log in server agent; do
      [ -f "$work/$log.log" ] && { echo "== the $log's log, last lines:"; tail -20 "$work/$log.log"; }
    done
  fi
  [ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null || true
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  if [ -n "$own_db" ]; then psql -q "$admin_url" -c "DROP DATABASE IF EXISTS $own_db" 2>/dev/null || true; fi
  "$bin/trainyard" postgres stop --dir "$work/pg" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

if [ -n "${TRAINYARD_TEST_DATABASE_URL:-}" ]; then
  admin_url=$TRAINYARD_TEST_DATABASE_URL
  own_db="bench_cache_agent_$$"
else
  source deploy/ensure-postgres
  admin_url=$("$bin/trainyard" postgres start --dir "$work/pg")
  own_db="bench_cache_agent"
fi
psql -q "$admin_url" -c "CREATE DATABASE $own_db"
db_url="${admin_url%/postgres}/$own_db"

echo "== $samples samples, $(nproc) cores; building the dataset in $work"
"$py" tests/bench/gen_tree.py "$work/src" "$samples"
"$bin/yard-data" pack "$work/src" "$work/packed" --shard-size 128Mi > /dev/null
rm -rf "$work/src"
echo "packed: $(jq '.shards | length' "$work/packed/dataset.json") shards, $(du -sm --apparent-size "$work/packed" | cut -f1) MB"

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
s3_port=$(port)
mkdir -p "$work/s3/bench"
"$TRAINYARD_TEST_S3S_FS" --host 127.0.0.1 --port "$s3_port" --access-key bench --secret-key bench-secret "$work/s3" \
  >/dev/null 2>&1 &
pids+=($!)
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench-secret AWS_REGION=us-east-1
token=$(TRAINYARD_DATABASE_URL="$db_url" "$bin/trainyard" bootstrap 2>/dev/null)
# Single PUTs for the 128 MiB shards (see data_cache.sh: s3s-fs and long multipart keys).
TRAINYARD_DATABASE_URL="$db_url" "$bin/trainyard" serve --listen 127.0.0.1:0 --data-dir "$work/data" \
  --object-store s3://bench/trainyard --object-store-endpoint "http://127.0.0.1:$s3_port" \
  --object-store-part-size 160Mi > "$work/server.out" 2> "$work/server.log" &
pids+=($!)
for _ in $(seq 100); do grep -q "listening on" "$work/server.out" 2>/dev/null && break; sleep 0.1; done
url=$(sed -n 's/^trainyard: listening on //p' "$work/server.out")
for try in 1 2 3; do
  TRAINYARD_URL=$url TRAINYARD_TOKEN=$token "$bin/yard" datasets push bench-data@1 "$work/packed" > /dev/null && break
  [ "$try" = 3 ] && exit 1
  echo "push failed (try $try); again"
done

agent_port=$(port)
agent_start() {
  [ -n "$agent_pid" ] && { kill "$agent_pid" 2>/dev/null || true; wait "$agent_pid" 2>/dev/null || true; }
  rm -rf "$work/agent"
  "$bin/trainyard" cache-agent --dir "$work/agent" --listen "127.0.0.1:$agent_port" --server "$url" \
    --budget-bytes $((8 << 30)) > "$work/agent.out" 2>> "$work/agent.log" &
  agent_pid=$!
  for _ in $(seq 100); do grep -q "listening on" "$work/agent.out" 2>/dev/null && break; sleep 0.1; done
}
arm() { TRAINYARD_TOKEN=$token "$py" tests/bench/cache_agent.py --url "$url" --dataset bench-data@1 "$@"; }

# The local executor's machine cache, filled once before the rounds.
arm --arm local --label "local fill" --cache-dir "$work/cache" > /dev/null
echo "== $rounds rounds; load: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$rounds"); do
  arm --arm server --label server
  agent_start
  arm --arm agent --label "agent cold" --agent-url "http://127.0.0.1:$agent_port"
  arm --arm agent --label "agent warm" --agent-url "http://127.0.0.1:$agent_port"
  arm --arm local --label "local warm" --cache-dir "$work/cache"
  echo "-- round $round done; agent: $(curl -sf "http://127.0.0.1:$agent_port/metrics" | grep -E '^trainyard_cache_agent_(origin|served)_bytes_total' | tr '\n' ' ')"
done
