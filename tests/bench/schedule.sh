#!/usr/bin/env bash
# Schedule benchmark: "why is my job pending, when will it start" (GET /api/v1/jobs/{id}/schedule,
# which the dashboard's job page polls every 2 s) with 10,000 queued jobs in 20 tenants on 64
# simulated GPUs. Two replicas of the server on the same database, side by side in one run: the
# default one shares one computed schedule board between readers; the peer runs with
# --schedule-max-age-ms 0, so every request simulates the cluster forward on its own, as every
# request did before the board. Server, Postgres and wrk all run on this machine.
# Usage: tests/bench/schedule.sh [seconds per run, default 10]
set -euo pipefail
cd "$(dirname "$0")/../.."
duration=${1:-10}
gpu=sim-a100
serve_args=(--simulate-gpus 64 --simulate-gpu-type "$gpu")
source tests/bench/server.sh
yard=target/release/yard
export TRAINYARD_URL="$url"

# 20 tenants sharing the GPUs in one cohort, 3 GPUs of nominal quota each.
for i in $(seq -w 1 20); do
  "$yard" admin tenant-create "team-$i" >/dev/null
  "$yard" admin tenant set "team-$i" --cohort lab >/dev/null
  "$yard" admin quota set "team-$i" "$gpu" --nominal 3 >/dev/null
done
# One real 1-GPU job gives the spec; 500 jobs like it queue in every tenant (an hour each).
curl -sf -o /dev/null -H "Authorization: Bearer $TRAINYARD_TOKEN" -H 'Content-Type: application/json' \
  -d "{\"name\": \"spec\", \"command\": [\"sleep\", \"3600\"], \"resources\": {\"gpus\": 1, \"gpu_type\": \"$gpu\", \"cpu\": 0.01, \"memory\": \"16Mi\"}}" \
  "$url/api/v1/jobs"
psql -q "$db_url" <<'SQL'
INSERT INTO jobs (id, tenant_id, name, spec, last_actor, created_by, expected_runtime_seconds)
SELECT gen_random_uuid(), t.id, 'queued-' || n, j.spec, 'bench', u.id, 3600
FROM generate_series(1, 500) n, tenants t, users u, LATERAL (SELECT spec FROM jobs LIMIT 1) j
WHERE t.name LIKE 'team-%';
ANALYZE jobs;
SQL
# Let the reconciler admit what fits and write every waiting job's reason.
for _ in $(seq 120); do
  running=$(psql -tA "$db_url" -c "SELECT count(*) FROM jobs WHERE state IN ('starting', 'running')")
  [ "$running" -ge 64 ] && break
  sleep 1
done
sleep 3
echo "queued: $(psql -tA "$db_url" -c "SELECT count(*) FROM jobs WHERE state = 'queued'"), running: $running"
# A member of team-10 asks about its 101st queued job.
token=$("$yard" admin member-add team-10 bench-reader --role viewer | tail -1)
job=$(psql -tA "$db_url" -c "SELECT j.id FROM jobs j JOIN tenants t ON t.id = j.tenant_id
  WHERE j.state = 'queued' AND t.name = 'team-10' ORDER BY j.priority DESC, j.id OFFSET 100 LIMIT 1")

# The peer: a second replica on the same database that computes per request.
TRAINYARD_DATABASE_URL="$db_url" "$trainyard" serve --listen 127.0.0.1:0 --data-dir "$work/data2" \
  --schedule-max-age-ms 0 "${serve_args[@]}" > "$work/peer.out" 2> "$work/peer.log" &
peer_pid=$!
trap 'kill $peer_pid 2>/dev/null; wait $peer_pid 2>/dev/null; cleanup' EXIT
for _ in $(seq 100); do grep -q "listening on" "$work/peer.out" 2>/dev/null && break; sleep 0.1; done
peer=$(sed -n 's/^trainyard: listening on //p' "$work/peer.out")

run() { # label, base url, clients
  echo; echo "== $1, $3 client(s), ${duration}s"
  curl -sf -H "Authorization: Bearer $token" "$2/api/v1/jobs/$job/schedule"; echo
  wrk -t1 -c"$3" -d"${duration}s" --timeout 60s --latency -H "Authorization: Bearer $token" \
    "$2/api/v1/jobs/$job/schedule" | grep -E "Requests/sec|50%|90%|99%|Non-2xx|Socket errors"
}
for clients in 1 16; do
  run "shared board (default)" "$url" "$clients"
  run "peer: computed per request" "$peer" "$clients"
done
