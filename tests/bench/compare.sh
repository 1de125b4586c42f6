#!/usr/bin/env bash
# Comparing two runs (issue 20): two finished jobs, each given 1,000 parameters (ten of them
# differing), an engine record of 500 packages (one differing) and 100,000 metric points (one
# `loss` series), then wrk at one connection on GET /api/v1/compare?jobs=A,B beside GET
# /api/v1/jobs/A on the same server, the peer: one job read. The parameters, record and points
# are written with psql (the submit and metrics paths are not what is measured here).
# Usage: tests/bench/compare.sh [points per job, default 100000] [seconds, default 10]
set -euo pipefail
cd "$(dirname "$0")/../.."
points=${1:-100000}
duration=${2:-10}
source tests/bench/server.sh

echo "== two runs: 1,000 parameters, 500 packages and $points metric points each"
auth=(-H "Authorization: Bearer $TRAINYARD_TOKEN" -H "content-type: application/json")
ids=()
for lr in 0.1 0.01; do
  id=$(curl -sf "${auth[@]}" "$url/api/v1/jobs" -d "{\"name\":\"sweep\",\"command\":[\"true\"],\"env\":{\"LR\":\"$lr\"}}" |
    sed 's/.*"id":"\([^"]*\)".*/\1/')
  ids+=("$id")
done
for id in "${ids[@]}"; do
  for _ in $(seq 300); do
    curl -sf "${auth[@]}" "$url/api/v1/jobs/$id" | grep -q '"state":"succeeded"' && break
    sleep 0.1
  done
done
a=${ids[0]}
b=${ids[1]}
psql -q "$db_url" -v a="$a" -v b="$b" -v points="$points" <<'SQL'
UPDATE jobs j SET params = (
  SELECT jsonb_object_agg('p' || g, CASE WHEN j.id = :'b' AND g % 100 = 0 THEN g * 2 ELSE g END)
  FROM generate_series(1, 1000) g)
WHERE j.id IN (:'a', :'b');
-- The engine's part arrives once (the only change the table allows).
UPDATE run_records r SET engine_recorded_at = now(), engine = jsonb_build_object('environment', jsonb_build_object(
  'packages', (SELECT jsonb_object_agg('package-' || g, CASE WHEN r.job_id = :'b' AND g = 1 THEN '2.0' ELSE '1.0' END)
               FROM generate_series(1, 500) g)))
WHERE r.job_id IN (:'a', :'b');
INSERT INTO metrics (job_id, tenant_id, attempt, name, step, value)
SELECT j.id, j.tenant_id, 1, 'loss', g, 1.0 / (g + 1) + CASE WHEN j.id = :'b' THEN 0.001 ELSE 0 END
FROM jobs j, generate_series(0, :points - 1) g WHERE j.id IN (:'a', :'b');
VACUUM ANALYZE metrics;
SQL
compare="$url/api/v1/compare?jobs=$a,$b"
echo "differences: $(curl -sf "${auth[@]}" "$compare" | grep -o '"differ":[0-9]*' | tail -1), $(curl -sf "${auth[@]}" "$compare" | wc -c) bytes"
echo "| endpoint | requests/s | p50 | p99 |"
echo "|---|---|---|---|"
for target in "$compare" "$url/api/v1/jobs/$a"; do
  wrk -t1 -c1 -d"${duration}s" --latency -H "Authorization: Bearer $TRAINYARD_TOKEN" "$target" |
    awk -v path="${target#"$url"}" '
      /50%/ {p50=$2} /99%/ {p99=$2} /Requests\/sec/ {rps=$2}
      END {sub(/jobs=.*/, "jobs=A,B", path); sub(/jobs\/[0-9a-f-]+$/, "jobs/A", path);
           printf "| GET %s | %s | %s | %s |\n", path, rps, p50, p99}'
done
