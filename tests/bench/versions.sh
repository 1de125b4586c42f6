#!/usr/bin/env bash
# Two builds side by side in one run: BEFORE against AFTER (default HEAD), each built from a
# scratch worktree (tests/bench/revisions.sh; uncommitted changes are not measured). For each build, alternately and ROUNDS
# times: a fresh Postgres and server; submits at 16 clients (the jobs stay queued); the table
# filled to 100,000 jobs; the first page of the job list at 1 and 16 clients; the dashboard's
# jobs page and a job's page. Figures go to docs/PERFORMANCE.md.
# Usage: [MEASURE=submit] tests/bench/versions.sh BEFORE [AFTER] [seconds per measurement, default 10] [rounds, default 2]
set -euo pipefail
cd "$(dirname "$0")/../.."
before=$(git rev-parse --short "${1:?usage: tests/bench/versions.sh BEFORE [AFTER] [seconds] [rounds]}")
after=$(git rev-parse --short "${2:-HEAD}")
duration=${3:-10}
rounds=${4:-2}
bins=$(mktemp -d "${TMPDIR:-/tmp}/trainyard-versions.XXXXXX")
trap 'rm -rf "$bins"' EXIT
source tests/bench/revisions.sh
for rev in "$before" "$after"; do
  build_rev "$rev" "$bins/$rev"
done

measure() { # label, binary
  local label=$1
  (
    trainyard=$2
    serve_args=()
    # Newer builds refuse a job that can never fit; the benchmark's jobs ask for 64 GPUs so that
    # they stay queued, as if the cluster were about to grow.
    "$trainyard" serve --help | grep -q -- --cluster-grows && serve_args+=(--cluster-grows)
    source tests/bench/server.sh
    wrk_row() { # what, then wrk's arguments
      local what=$1; shift
      wrk "$@" --latency | awk -v label="$label" -v what="$what" '
        /50%/ {p50=$2} /99%/ {p99=$2} /Requests\/sec/ {rps=$2} /Non-2xx/ {bad=$NF}
        END {printf "| %s | %s | %s | %s | %s |%s\n", what, label, rps, p50, p99, (bad ? " non-2xx: " bad : "")}'
    }
    wrk_row "submit, 16 clients" -t2 -c16 -d"${duration}s" -s tests/bench/submit.lua "$url/api/v1/jobs"
    # MEASURE=submit: the submit row only (more rounds in the same time).
    [ "${MEASURE:-all}" = submit ] && exit 0
    psql -q "$db_url" <<'SQL'
INSERT INTO jobs (id, tenant_id, name, spec, last_actor, created_by, template_name)
SELECT overlay(gen_random_uuid()::text placing 'ffff' from 1)::uuid, t.id, 'filler-' || (n % 100), j.spec, 'bench', u.id, 'shell'
FROM generate_series(1, 100000 - (SELECT count(*) FROM jobs)) n,
     tenants t, users u, LATERAL (SELECT spec FROM jobs LIMIT 1) j;
ANALYZE jobs;
SQL
    wrk_row "list, first 50, 1 client" -t1 -c1 -d"${duration}s" -s tests/bench/list.lua "$url/api/v1/jobs?limit=50"
    wrk_row "list, first 50, 16 clients" -t1 -c16 -d"${duration}s" -s tests/bench/list.lua "$url/api/v1/jobs?limit=50"
    login=$(curl -sf -c "$work/jar" "$url/login" | sed -n 's/.*name="csrf" value="\([0-9a-f]*\)".*/\1/p')
    curl -sf -b "$work/jar" -c "$work/jar" -o /dev/null --data-urlencode "csrf=$login" \
      --data-urlencode "token=$TRAINYARD_TOKEN" "$url/login"
    cookie="Cookie: trainyard_session=$(awk '$6 == "trainyard_session" {print $7}' "$work/jar")"
    # The first job submitted: first in its tenant's queue (the fillers' ids sort after every
    # submitted job's), so every build answers its page from the schedule board, not the count
    # of the jobs ahead of one deep in the queue (which an arbitrary job made a lottery).
    job=$(psql -tA "$db_url" -c "SELECT id FROM jobs WHERE last_actor <> 'bench' ORDER BY id LIMIT 1")
    wrk_row "dashboard jobs page, 1 client" -t1 -c1 -d"${duration}s" -H "$cookie" "$url/jobs"
    wrk_row "dashboard job page, 1 client" -t1 -c1 -d"${duration}s" -H "$cookie" "$url/jobs/$job"
  ) 2>&1 | grep '^|'
}

echo
echo "| measurement | build | requests/s | p50 | p99 |"
echo "|---|---|---|---|---|"
for round in $(seq "$rounds"); do
  measure "before ($before)" "$bins/$before"
  measure "after ($after)" "$bins/$after"
done
