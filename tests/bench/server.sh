#!/usr/bin/env bash
# Sourced by the server benchmarks (api.sh, dashboard.sh): builds the release binaries, starts a
# private Postgres and `trainyard serve` against a fresh database, and cleans both up on exit.
# Extra flags for `trainyard serve` may be set beforehand in the array serve_args, and a binary to
# run instead of this checkout's release build in `trainyard` (versions.sh compares two builds).
# Sets: trainyard, work (a scratch folder), admin_url, db_url, url (the server), server_pid,
# and exports TRAINYARD_TOKEN (the admin's token).
source deploy/ensure-postgres
command -v wrk >/dev/null || { echo "== installing wrk"; as_root apt-get install -y -qq wrk >/dev/null; }
if [ -z "${trainyard:-}" ]; then
  cargo build --release --locked --bins
  trainyard=target/release/trainyard
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/trainyard-bench.XXXXXX")
chmod 755 "$work"
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  "$trainyard" postgres stop --dir "$work/pg" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

admin_url=$("$trainyard" postgres start --dir "$work/pg")
db_url="${admin_url%/postgres}/bench"
psql -q "$admin_url" -c "CREATE DATABASE bench"
export TRAINYARD_TOKEN=$(TRAINYARD_DATABASE_URL="$db_url" "$trainyard" bootstrap 2>/dev/null)
TRAINYARD_DATABASE_URL="$db_url" "$trainyard" serve --listen 127.0.0.1:0 --data-dir "$work/data" ${serve_args[@]+"${serve_args[@]}"} \
  > "$work/server.out" 2> "$work/server.log" &
server_pid=$!
for _ in $(seq 600); do grep -q "listening on" "$work/server.out" 2>/dev/null && break; sleep 0.1; done
url=$(sed -n 's/^trainyard: listening on //p' "$work/server.out")
echo "server at $url; $(nproc) cores; $(psql -tA "$admin_url" -c 'SHOW server_version')"
