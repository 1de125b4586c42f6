#!/usr/bin/env bash
# The CLI end to end, as a user times it (process start, HTTP, the server, Postgres, the table):
# `yard jobs ls` with 100,000 jobs in the tenant, and `yard queue` as the platform admin with
# 10,000 jobs waiting in 20 tenants (500 each: every one inside the scheduler's window). The peer:
# `psql` asking Postgres for the same first page of 50 jobs, the floor of any client that prints it.
# hyperfine runs each side by side in one run. Figures go to docs/PERFORMANCE.md.
# Usage: tests/bench/cli.sh [runs, default 30]
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-30}
command -v hyperfine >/dev/null || { echo "== installing hyperfine"; as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }; as_root apt-get install -y -qq hyperfine >/dev/null; }
# Jobs of 64 GPUs wait on this GPU-less machine only where the cluster may grow.
serve_args=(--cluster-grows)
source tests/bench/server.sh
yard=$PWD/target/release/yard
export TRAINYARD_URL=$url

# One real job for its spec; 20 tenants with 500 waiting jobs each; the default tenant filled to
# 100,000 finished jobs.
curl -sf -o /dev/null -H "Authorization: Bearer $TRAINYARD_TOKEN" -H 'Content-Type: application/json' \
  -d '{"name": "model", "command": ["python", "train.py"], "resources": {"gpus": 64}}' "$url/api/v1/jobs"
for t in $(seq -w 1 20); do
  curl -sf -o /dev/null -H "Authorization: Bearer $TRAINYARD_TOKEN" -H 'Content-Type: application/json' \
    -d "{\"name\": \"team-$t\"}" "$url/api/v1/admin/tenants"
done
psql -q -v ON_ERROR_STOP=1 "$db_url" <<'SQL'
INSERT INTO jobs (id, tenant_id, name, spec, last_actor, created_by)
SELECT gen_random_uuid(), t.id, 'waiting-' || n, j.spec, 'bench', u.id
FROM generate_series(1, 500) n, tenants t, users u, LATERAL (SELECT spec FROM jobs LIMIT 1) j
WHERE t.name LIKE 'team-%';
-- New jobs must be queued (a trigger insists); in one transaction the reconciler never sees these
-- as queued, so its reason writes cannot deadlock with the update.
BEGIN;
INSERT INTO jobs (id, tenant_id, name, spec, last_actor, created_by)
SELECT gen_random_uuid(), t.id, 'finished-' || (n % 100), j.spec, 'bench', u.id
FROM generate_series(1, 100000) n, tenants t, users u, LATERAL (SELECT spec FROM jobs LIMIT 1) j
WHERE t.name = 'default';
UPDATE jobs SET state = 'cancelled', reason = 'bench filler', finished_at = now()
 WHERE last_actor = 'bench' AND name LIKE 'finished-%';
COMMIT;
ANALYZE jobs;
SQL
echo "jobs: $(psql -tA "$db_url" -c "SELECT count(*) FROM jobs WHERE tenant_id = (SELECT id FROM tenants WHERE name = 'default')") in the tenant, $(psql -tA "$db_url" -c "SELECT count(*) FROM jobs WHERE state = 'queued'") waiting"
"$yard" queue | tail -2
peer="SELECT j.id, j.name, u.name, j.state, j.created_at, j.reason FROM jobs j JOIN users u ON u.id = j.created_by
      WHERE j.tenant_id = (SELECT id FROM tenants WHERE name = 'default') ORDER BY j.id DESC LIMIT 50"
hyperfine --style basic --warmup 3 --runs "$runs" -N \
  -n "yard jobs ls (first 50 of 100,001)" "$yard jobs ls" \
  -n "yard queue (10,001 waiting)" "$yard queue" \
  -n "peer: psql, the same first page" "psql -q $db_url -c \"$peer\""
