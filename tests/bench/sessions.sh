#!/usr/bin/env bash
# Interactive sessions' proxy overhead (issue 41): the same requests to a session's program
# directly (127.0.0.1 at its port, with its upstream secret) and through the server's proxy (the
# session's own host, with its cookie), in the same run: a small HTTP request's latency (wrk, one
# connection), a WebSocket message's round trip, and a 1 GiB download. The program is the e2e
# tests' stand-in for JupyterLab (tests/e2e/sessions/recorder.py, Python's http.server), so the
# direct figures are Python's; the difference is the proxy's. Figures go to docs/PERFORMANCE.md.
# Usage: tests/bench/sessions.sh [seconds per wrk run, default 10]
set -euo pipefail
cd "$(dirname "$0")/../.."
duration=${1:-10}
source tests/bench/server.sh
[ -n "$url" ] || { echo "the server did not start:"; head -20 "$work/server.log"; exit 1; }
port=${url##*:}

# A session whose "python" runs the recorder.
cp tests/e2e/sessions/recorder.py "$work/recorder.py"
printf '#!/bin/sh\nexec /usr/bin/python3 %s/recorder.py\n' "$work" > "$work/python"
chmod 755 "$work/python" "$work/recorder.py"
api() { curl -sf -H "Authorization: Bearer $TRAINYARD_TOKEN" -H 'Content-Type: application/json' "$@"; }
id=$(api -d "{\"python\": \"$work/python\"}" "$url/api/v1/sessions" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
for _ in $(seq 300); do
  state=$(api "$url/api/v1/jobs/$id" | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
  [ "$state" = running ] && break; sleep 0.2
done
host="s-${id//-/}.localhost:$port"
link=$(api -X POST -d '{}' "$url/api/v1/sessions/$id/link" | python3 -c 'import json,sys; print(json.load(sys.stdin)["url"])')
cookie=$(curl -s -D - -o /dev/null --resolve "${host%:*}:$port:127.0.0.1" "$link" | sed -n 's/^set-cookie: \([^;]*\).*/\1/ip')
# The program's own port and secret, read from its process (this script runs as root, as the server).
pid=""
for _ in $(seq 100); do
  for p in /proc/[0-9]*; do grep -qa "$work/recorder.py" "$p/cmdline" 2>/dev/null && pid=${p#/proc/}; done
  [ -n "$pid" ] && break; sleep 0.1
done
envof() { tr '\0' '\n' < "/proc/$pid/environ" | sed -n "s/^$1=//p"; }
upstream_port=$(envof MASTER_PORT); secret=$(envof TRAINYARD_SESSION_SECRET)
for _ in $(seq 100); do curl -sf -o /dev/null -H "Authorization: token $secret" "http://127.0.0.1:$upstream_port/sessions/$id/api/echo" && break; sleep 0.1; done
path="/sessions/$id/api/echo"
curl -sf -o /dev/null --resolve "${host%:*}:$port:127.0.0.1" -H "Cookie: $cookie" "http://$host$path" || { echo "the proxy refused the bench's cookie"; exit 1; }

echo; echo "== HTTP GET $path, 1 connection, ${duration}s"
echo "-- direct"
wrk -t1 -c1 -d"${duration}s" --latency -H "Authorization: token $secret" "http://127.0.0.1:$upstream_port$path" | grep -E "Requests/sec|50%|90%|99%|Non-2xx|Socket errors"
echo "-- through the proxy"
wrk -t1 -c1 -d"${duration}s" --latency -H "Host: $host" -H "Cookie: $cookie" "http://127.0.0.1:$port$path" | grep -E "Requests/sec|50%|90%|99%|Non-2xx|Socket errors"

echo; echo "== WebSocket round trips, 5,000 messages"
echo "-- direct";  python3 tests/bench/ws_roundtrip.py "$upstream_port" "$host" "Authorization: token $secret" 5000 "$path"
echo "-- through the proxy"; python3 tests/bench/ws_roundtrip.py "$port" "$host" "Cookie: $cookie" 5000 "$path"

echo; echo "== 1 GiB download"
big="/sessions/$id/bytes"
for round in 1 2; do
  direct=$(curl -sf -o /dev/null -w '%{speed_download}' -H "Authorization: token $secret" "http://127.0.0.1:$upstream_port$big")
  proxied=$(curl -sf -o /dev/null -w '%{speed_download}' --resolve "${host%:*}:$port:127.0.0.1" -H "Cookie: $cookie" "http://$host$big")
  python3 -c "d, p = $direct, $proxied; print(f'round $round: direct {d/2**20:.0f} MiB/s, through the proxy {p/2**20:.0f} MiB/s ({p/d:.0%})')"
done
api -X POST -d '{}' "$url/api/v1/jobs/$id/cancel" > /dev/null
