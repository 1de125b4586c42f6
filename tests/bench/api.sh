#!/usr/bin/env bash
# API benchmark: job submission throughput and latency at 1, 16 and 64 concurrent clients, and
# the latency of the first page of the job list with 100,000 jobs in the database.
# Server, Postgres (durable settings: fsync and synchronous commit on) and the load generator
# (wrk) all run on this machine. Figures go to docs/PERFORMANCE.md.
# Usage: tests/bench/api.sh [seconds per run, default 15]
set -euo pipefail
cd "$(dirname "$0")/../.."
duration=${1:-15}
source tests/bench/server.sh

for clients in 1 16 64; do
  threads=$(( clients < 2 ? 1 : 2 ))
  echo; echo "== submit, $clients concurrent clients, ${duration}s"
  wrk -t"$threads" -c"$clients" -d"${duration}s" --latency -s tests/bench/submit.lua "$url/api/v1/jobs" \
    | grep -E "Requests/sec|50%|90%|99%|Non-2xx|Socket errors"
done

pgbench=$(ls /usr/lib/postgresql/*/bin/pgbench 2>/dev/null | tail -1 || command -v pgbench)
# The peer writes into a database of its own with the same schema, tenant and user.
peer_url="${admin_url%/postgres}/peer"
psql -q "$admin_url" -c "CREATE DATABASE peer"
TRAINYARD_DATABASE_URL="$peer_url" "$trainyard" bootstrap >/dev/null 2>&1
for clients in 1 16 64; do
  echo; echo "== peer: the same INSERT straight into Postgres (pgbench), $clients clients, ${duration}s"
  "$pgbench" -n -M prepared -c "$clients" -j "$(( clients < 2 ? 1 : 2 ))" -T "$duration" -f tests/bench/insert.sql "$peer_url" 2>/dev/null \
    | grep -E "^tps|latency average"
done

echo; echo "== filling the job table to at least 100,000 jobs"
psql -q "$db_url" <<'SQL'
INSERT INTO jobs (id, tenant_id, name, spec, last_actor, created_by)
SELECT gen_random_uuid(), t.id, 'filler-' || (n % 100), j.spec, 'bench', u.id
FROM generate_series(1, 100000 - (SELECT count(*) FROM jobs)) n,
     tenants t, users u, LATERAL (SELECT spec FROM jobs LIMIT 1) j;
ANALYZE jobs;
SQL
echo "jobs in the database: $(psql -tA "$db_url" -c 'SELECT count(*) FROM jobs')"
for clients in 1 16; do
  echo; echo "== list first page (50 jobs), $clients concurrent clients, ${duration}s"
  wrk -t1 -c"$clients" -d"${duration}s" --latency -s tests/bench/list.lua "$url/api/v1/jobs?limit=50" \
    | grep -E "Requests/sec|50%|90%|99%|Non-2xx|Socket errors"
done
echo; echo "== list filtered by state (queued), 1 client, ${duration}s"
wrk -t1 -c1 -d"${duration}s" --latency -s tests/bench/list.lua "$url/api/v1/jobs?limit=50&state=queued" \
  | grep -E "Requests/sec|50%|99%|Non-2xx"
