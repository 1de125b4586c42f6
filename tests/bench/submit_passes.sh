#!/usr/bin/env bash
# The submit benchmark side by side, in one run: the control loop starting a pass on every
# submit's wake-up (--min-pass-interval-ms 0, the behaviour before passes were spaced) against
# passes at most every 100 ms (the default), each on a fresh database, then the pgbench peer
# (the same INSERT straight into Postgres). Jobs stay queued (64 GPUs), so every submit lengthens
# the queue each pass reads: this is the benchmark that would have caught the regression.
# Usage: tests/bench/submit_passes.sh [seconds per run, default 15] [clients, default 16]
set -euo pipefail
cd "$(dirname "$0")/../.."
duration=${1:-15}
clients=${2:-16}
for interval in 0 100; do
  serve_args=(--min-pass-interval-ms "$interval")
  (
    source tests/bench/server.sh
    echo; echo "== submit, --min-pass-interval-ms $interval, $clients clients, ${duration}s"
    wrk -t2 -c"$clients" -d"${duration}s" --latency -s tests/bench/submit.lua "$url/api/v1/jobs" \
      | grep -E "Requests/sec|50%|99%|Non-2xx|Socket errors"
    echo "server CPU seconds: $(ps -o times= -p "$server_pid")"
    if [ "$interval" = 100 ]; then
      pgbench=$(ls /usr/lib/postgresql/*/bin/pgbench 2>/dev/null | tail -1 || command -v pgbench)
      peer_url="${admin_url%/postgres}/peer"
      psql -q "$admin_url" -c "CREATE DATABASE peer"
      TRAINYARD_DATABASE_URL="$peer_url" "$trainyard" bootstrap >/dev/null 2>&1
      echo; echo "== peer: the same INSERT straight into Postgres (pgbench), $clients clients, ${duration}s"
      "$pgbench" -n -M prepared -c "$clients" -j 2 -T "$duration" -f tests/bench/insert.sql "$peer_url" 2>/dev/null \
        | grep -E "^tps|latency average"
    fi
  )
done
