#!/usr/bin/env bash
# Storage benchmark: one large artefact uploaded through the server (streamed, multipart) and
# downloaded through its signed link, against `cp` of the same file on the same disk, for the
# local store and for S3 (s3s-fs on loopback, writing to the same disk). Everything runs on
# this machine; the source file is in the page cache (warm). Figures go to docs/PERFORMANCE.md.
# Usage: tests/bench/storage.sh [size in MiB, default 1024]
set -euo pipefail
cd "$(dirname "$0")/../.."
mib=${1:-1024}
source deploy/ensure-postgres
source tests/ensure-s3s
cargo build --release --locked --bin trainyard
trainyard=${CARGO_TARGET_DIR:-target}/release/trainyard

work=$(mktemp -d "${TMPDIR:-/tmp}/trainyard-bench.XXXXXX")
chmod 755 "$work"
pids=()
cleanup() {
  # `|| true`: under `set -e` a killed child's status would end the cleanup early.
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  "$trainyard" postgres stop --dir "$work/pg" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

admin_url=$("$trainyard" postgres start --dir "$work/pg")
head -c "${mib}M" /dev/urandom > "$work/blob"
sha=$(sha256sum "$work/blob" | cut -d' ' -f1)
rate() { awk -v mib="$mib" -v s="$1" 'BEGIN { printf "%.2f s  %.0f MiB/s", s, mib / s }'; }
seconds() { local start=$(date +%s.%N); "$@" >/dev/null; echo "$(date +%s.%N) - $start" | bc; }

echo "== $mib MiB, $(nproc) cores"
printf '%-27s%s\n' "cp (then sync):" "$(rate "$(seconds sh -c "cp '$work/blob' '$work/blob.copy' && sync '$work/blob.copy'")")"
rm -f "$work/blob.copy"

# One server per backend: (name, extra serve arguments).
s3_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$work/s3/bench"
"$TRAINYARD_TEST_S3S_FS" --host 127.0.0.1 --port "$s3_port" --access-key bench --secret-key bench-secret "$work/s3" \
  >/dev/null 2>&1 &
pids+=($!)
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench-secret AWS_REGION=us-east-1
for backend in local s3; do
  db="bench_$backend"
  psql -q "$admin_url" -c "CREATE DATABASE $db"
  db_url="${admin_url%/postgres}/$db"
  token=$(TRAINYARD_DATABASE_URL="$db_url" "$trainyard" bootstrap 2>/dev/null)
  case $backend in
    local) store=(--object-store "file://$work/objects") ;;
    s3) store=(--object-store s3://bench/trainyard --object-store-endpoint "http://127.0.0.1:$s3_port") ;;
  esac
  TRAINYARD_DATABASE_URL="$db_url" "$trainyard" serve --listen 127.0.0.1:0 --data-dir "$work/data-$backend" "${store[@]}" \
    > "$work/server-$backend.out" 2> "$work/server-$backend.log" &
  pids+=($!)
  for _ in $(seq 100); do grep -q "listening on" "$work/server-$backend.out" 2>/dev/null && break; sleep 0.1; done
  url=$(sed -n 's/^trainyard: listening on //p' "$work/server-$backend.out")
  auth=(-H "Authorization: Bearer $token")
  job=$(curl -sf "${auth[@]}" -H 'Content-Type: application/json' -d '{"command": ["true"]}' "$url/api/v1/jobs" | jq -r .id)
  up=$(seconds curl -sf "${auth[@]}" -T "$work/blob" "$url/api/v1/jobs/$job/artifacts/blob.bin")
  link=$(curl -sf "${auth[@]}" "$url/api/v1/jobs/$job/artifacts/blob.bin?expires_in=600" | jq -r .url)
  case $link in http*) ;; *) link="$url$link" ;; esac
  down=$(seconds curl -sf -o "$work/back.bin" "$link")
  back=$(sha256sum "$work/back.bin" | cut -d' ' -f1)
  [ "$back" = "$sha" ] || { echo "$backend: the download differs from the upload"; exit 1; }
  rm -f "$work/back.bin"
  printf '%-27s%s\n' "$backend upload via server:" "$(rate "$up")"
  printf '%-27s%s\n' "$backend download, signed:" "$(rate "$down")"
done
