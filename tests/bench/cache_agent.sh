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
source tests/bench/release_tools.sh

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

source tests/bench/pushed_dataset.sh bench_cache_agent

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
