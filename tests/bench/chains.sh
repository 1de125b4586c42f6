#!/usr/bin/env bash
# The admission pass with a queue of chained jobs beside the same queue without dependencies, in
# one run, each on a fresh database (release build, tests/bench/server.sh): N queued jobs of one
# tenant that no node fits (64 GPUs; 8 simulated), then the same N each `after_ok` the one
# before (all but the first held out of the cycle, their reasons kept current). Reads the
# server's own histograms over the measured window: the admit phase of a pass (the chains'
# queries, the snapshot, the cycle, the reasons written) and the whole pass.
# Usage: tests/bench/chains.sh [jobs, default 10000] [seconds, default 30]
set -euo pipefail
cd "$(dirname "$0")/../.."
jobs=${1:-10000}
duration=${2:-30}
token_file=$(mktemp)
echo "a-metrics-token-for-the-benchmark" > "$token_file"
trap 'rm -f "$token_file"' EXIT
echo "| queue | jobs | passes | admit phase mean | pass mean |"
echo "|---|---|---|---|---|"
for shape in unchained chained; do
  (
    serve_args=(--simulate-gpus 8 --simulate-gpu-type sim-h100 --cluster-grows --metrics-token-file "$token_file")
    source tests/bench/server.sh >/dev/null
    # Ids in submission order (UUIDv7-like: a time prefix), so the chain runs first to last.
    psql -q "$db_url" -c "
      CREATE TEMP TABLE bench_ids AS
        SELECT n, (lpad(to_hex(1700000000000 + n), 12, '0') || '7000' || '8000' || lpad(to_hex(n), 12, '0'))::uuid AS id
        FROM generate_series(1, $jobs) n;
      INSERT INTO jobs (id, tenant_id, name, spec, last_actor, created_by)
        SELECT b.id, t.id, 'link-' || b.n,
               '{\"command\":[\"true\"],\"args\":[],\"env\":{},\"replicas\":1,\"resources\":{\"cpu\":1,\"memory\":\"1Gi\",\"gpus\":64}}',
               'bench', (SELECT id FROM users LIMIT 1)
        FROM bench_ids b, (SELECT id FROM tenants LIMIT 1) t ORDER BY b.n;
      $( [ "$shape" = chained ] && echo "
      INSERT INTO job_dependencies (job_id, tenant_id, depends_on, kind)
        SELECT b.id, (SELECT id FROM tenants LIMIT 1), p.id, 'ok' FROM bench_ids b JOIN bench_ids p ON p.n = b.n - 1;" )"
    scrape() {
      curl -sf -H "Authorization: Bearer $(cat "$token_file")" "$url/metrics" |
        awk '/^trainyard_reconciler_pass_phase_duration_seconds_(sum|count)\{phase="admit"\}/ {a[$1 ~ /_sum/ ? "as" : "ac"] = $2}
             /^trainyard_reconciler_pass_duration_seconds_(sum|count)/ {a[$1 ~ /_sum/ ? "ps" : "pc"] = $2}
             END {printf "%s %s %s %s\n", a["as"] + 0, a["ac"] + 0, a["ps"] + 0, a["pc"] + 0}'
    }
    sleep 5 # the first passes write every job's reason
    read -r as0 ac0 ps0 pc0 < <(scrape)
    sleep "$duration"
    read -r as1 ac1 ps1 pc1 < <(scrape)
    held=$(psql -tA "$db_url" -c "SELECT count(*) FROM jobs WHERE state = 'queued' AND reason LIKE 'waiting for %'")
    awk -v shape="$shape" -v jobs="$jobs" -v held="$held" -v as="$(echo "$as1 - $as0" | bc -l)" -v ac="$(echo "$ac1 - $ac0" | bc -l)" \
        -v ps="$(echo "$ps1 - $ps0" | bc -l)" -v pc="$(echo "$pc1 - $pc0" | bc -l)" \
      'BEGIN {printf "| %s (%d held) | %d | %d | %.1f ms | %.1f ms |\n", shape, held, jobs, ac, ac ? 1000 * as / ac : 0, pc ? 1000 * ps / pc : 0}'
  )
done
