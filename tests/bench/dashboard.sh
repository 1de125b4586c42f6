#!/usr/bin/env bash
# Dashboard benchmark: latency of the jobs page and a job's page with 100,000 jobs in the tenant,
# side by side with the JSON API answering the same questions; and a log followed by 100
# concurrent viewers (server-sent events) against the same job with no viewers.
# Server, Postgres and the load generator (wrk) all run on this machine; latencies are wrk's,
# over loopback. Figures go to docs/PERFORMANCE.md.
# Usage: tests/bench/dashboard.sh [seconds per run, default 10]
set -euo pipefail
cd "$(dirname "$0")/../.."
duration=${1:-10}
source tests/bench/server.sh

# One real job, from a template, then 100,000 more like it in the same tenant.
job=$(curl -sf -H "Authorization: Bearer $TRAINYARD_TOKEN" -H 'Content-Type: application/json' \
  -d '{"params": {"command": ["true"]}}' "$url/api/v1/templates/shell/jobs" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
psql -q "$db_url" <<'SQL'
INSERT INTO jobs (id, tenant_id, name, spec, last_actor, created_by, template_name)
SELECT gen_random_uuid(), t.id, 'filler-' || (n % 100), j.spec, 'bench', u.id, 'shell'
FROM generate_series(1, 100000) n, tenants t, users u, LATERAL (SELECT spec FROM jobs LIMIT 1) j;
-- History, not a queue: the fillers have ended (the state machine allows queued -> cancelled).
UPDATE jobs SET state = 'cancelled', reason = 'bench filler', finished_at = now() WHERE last_actor = 'bench';
ANALYZE jobs;
SQL
echo "jobs in the tenant: $(psql -tA "$db_url" -c 'SELECT count(*) FROM jobs')"

# A browser session, as the sign-in form makes one.
login=$(curl -sf -c "$work/jar" "$url/login" | sed -n 's/.*name="csrf" value="\([0-9a-f]*\)".*/\1/p')
curl -sf -b "$work/jar" -c "$work/jar" -o /dev/null --data-urlencode "csrf=$login" --data-urlencode "token=$TRAINYARD_TOKEN" "$url/login"
session=$(awk '$6 == "trainyard_session" {print $7}' "$work/jar")
export TRAINYARD_COOKIE="trainyard_session=$session"

run() { # label, path, auth (cookie|bearer)
  local header
  if [ "$3" = cookie ]; then header="Cookie: $TRAINYARD_COOKIE"; else header="Authorization: Bearer $TRAINYARD_TOKEN"; fi
  echo; echo "== $1 ($2), 1 client, ${duration}s"
  status=$(curl -s -o /dev/null -w '%{http_code}' -H "$header" "$url$2")
  # 286 is the live part of a finished job: "stop polling" to htmx.
  [ "$status" = 200 ] || [ "$status" = 286 ] || { echo "expected 200 from $2, got $status"; exit 1; }
  wrk -t1 -c1 -d"${duration}s" --latency -H "$header" "$url$2" | grep -E "Requests/sec|50%|90%|99%|Non-2xx|Socket errors"
}
run "jobs page, first 50 of 100,001" "/jobs" cookie
run "peer: the same list from the JSON API" "/api/v1/jobs?limit=50" bearer
run "jobs page filtered by template" "/jobs?template=shell" cookie
run "jobs page rows (what htmx polls)" "/jobs/rows" cookie
run "job page" "/jobs/$job" cookie
run "peer: the job from the JSON API" "/api/v1/jobs/$job" bearer
run "job page live part (what htmx polls)" "/jobs/$job/live" cookie

echo; echo "== a log followed by 100 viewers: the job prints 20,000 lines over about 4 s"
printer='import sys, time
for i in range(20000):
    print(f"line {i} " + "x" * 60)
    if i % 500 == 0:
        sys.stdout.flush(); time.sleep(0.1)
'
submit_printer() {
  python3 - "$printer" <<'PY'
import json, os, sys, urllib.request
body = json.dumps({"name": "printer", "command": ["python3", "-c", sys.argv[1]]}).encode()
request = urllib.request.Request(os.environ["URL"] + "/api/v1/jobs", data=body, method="POST",
    headers={"Authorization": "Bearer " + os.environ["TRAINYARD_TOKEN"], "Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(request))["id"])
PY
}
runtime() { # job id -> seconds from start to end once finished
  for _ in $(seq 600); do
    out=$(curl -sf -H "Authorization: Bearer $TRAINYARD_TOKEN" "$url/api/v1/jobs/$1")
    echo "$out" | python3 -c 'import json,sys,datetime as d
j=json.load(sys.stdin)
if j["state"] in ("succeeded","failed","cancelled"):
    f=lambda s: d.datetime.fromisoformat(s.replace("Z","+00:00"))
    print(j["state"], round((f(j["finished_at"])-f(j["started_at"])).total_seconds(),2)); sys.exit(0)
sys.exit(1)' && return
    sleep 0.2
  done
}
export URL="$url"
alone=$(submit_printer); echo "no viewers:  $(runtime "$alone")"
watched=$(submit_printer)
viewers=()
for v in $(seq 100); do
  curl -sN -b "$work/jar" "$url/jobs/$watched/log/stream?replica=0" > "$work/viewer-$v.sse" &
  viewers+=($!)
done
echo "100 viewers: $(runtime "$watched")"
start=$(date +%s.%N)
wait "${viewers[@]}"
echo "the last viewer finished $(python3 -c "import time; print(round(time.time() - $start, 2))") s after the job's end was seen"
complete=0
for v in $(seq 100); do
  lines=$(grep -c '^event: line' "$work/viewer-$v.sse" || true)
  ended=$(grep -c '^event: end' "$work/viewer-$v.sse" || true)
  [ "$lines" = 20000 ] && [ "$ended" = 1 ] && complete=$((complete + 1))
done
echo "viewers that received all 20,000 lines and the end: $complete of 100"
