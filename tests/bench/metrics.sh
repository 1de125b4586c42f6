#!/usr/bin/env bash
# /metrics with many tenants: 1,000 tenants (TENANTS), each with a quota on 8 simulated GPUs'
# type and one queued job too large to start, so that every per-tenant family (jobs by state,
# pending by reason, quota nominal/used/borrowed/lent) has a series per tenant. Then wrk at one
# connection on /metrics (with the metrics token) beside /healthz on the same server, the
# cheapest answer it gives: the difference is the cost of encoding the registry.
# Usage: tests/bench/metrics.sh [tenants, default 1000] [seconds, default 10]
set -euo pipefail
cd "$(dirname "$0")/../.."
tenants=${1:-1000}
duration=${2:-10}
token_file=$(mktemp)
echo "a-metrics-token-for-the-benchmark" > "$token_file"
serve_args=(--simulate-gpus 8 --simulate-gpu-type sim-h100 --cluster-grows --metrics-token-file "$token_file")
source tests/bench/server.sh

echo "== $tenants tenants, a quota and a queued job each"
auth=(-H "Authorization: Bearer $TRAINYARD_TOKEN" -H "content-type: application/json")
seq "$tenants" | xargs -P 8 -I{} sh -c '
  t=team-{}
  curl -sf -o /dev/null "$0/api/v1/admin/tenants" -X POST -H "Authorization: Bearer $TRAINYARD_TOKEN" -H "content-type: application/json" -d "{\"name\":\"$t\"}"
  curl -sf -o /dev/null "$0/api/v1/admin/tenants/$t/quotas/sim-h100" -X PUT -H "Authorization: Bearer $TRAINYARD_TOKEN" -H "content-type: application/json" -d "{\"nominal\":1}"
' "$url"
# The jobs go in as the platform admin's own tenant would not give a series per tenant: insert
# them for each tenant directly (the submit path is not what is measured here).
psql -q "$db_url" -c "
  INSERT INTO jobs (id, tenant_id, name, spec, last_actor, created_by)
  SELECT gen_random_uuid(), t.id, 'waits', '{\"command\":[\"true\"],\"args\":[],\"env\":{},\"replicas\":1,\"resources\":{\"cpu\":1,\"memory\":\"1Gi\",\"gpus\":64}}',
         'bench', (SELECT id FROM users LIMIT 1)
  FROM tenants t WHERE t.name LIKE 'team-%'"
sleep 4 # a few passes: the gauges and the quota read (every 2 s)
series=$(curl -sf -H "Authorization: Bearer $(cat "$token_file")" "$url/metrics" | grep -c '^trainyard_')
bytes=$(curl -sf -H "Authorization: Bearer $(cat "$token_file")" "$url/metrics" | wc -c)
echo "exposition: $series samples, $bytes bytes"
echo "| endpoint | tenants | requests/s | p50 | p99 |"
echo "|---|---|---|---|---|"
for path in /metrics /healthz; do
  wrk -t1 -c1 -d"${duration}s" --latency -H "Authorization: Bearer $(cat "$token_file")" "$url$path" |
    awk -v path="$path" -v tenants="$tenants" '
      /50%/ {p50=$2} /99%/ {p99=$2} /Requests\/sec/ {rps=$2}
      END {printf "| %s | %s | %s | %s | %s |\n", path, tenants, rps, p50, p99}'
done
rm -f "$token_file"
