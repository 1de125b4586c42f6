#!/usr/bin/env bash
# Datasets from the object store (issue 23): one packed dataset read a full pass at a time from a
# local path, as store:NAME@VERSION through the server with the node cache empty and warm, and by
# webdataset straight from the S3 server, plus a what-if (cached without the per-process re-hash
# of every cached shard); tests/bench/data_cache.py does the reading. Starts
# s3s-fs on loopback, a Postgres database, `trainyard serve` on the S3 store, makes SAMPLES
# synthetic samples (tests/bench/gen_tree.py: two files of 4-64 KiB each), packs them with
# `yard-data pack` and pushes them with `yard datasets push`. Everything runs in a memory cgroup
# capped at CGROUP_MIB (when this machine lets root make one), so the page cache the benchmark can
# use is smaller than the dataset. Figures go to docs/PERFORMANCE.md.
# Usage: tests/bench/data_cache.sh [samples, default 40000 (2.8 GB)] [rounds, default 3] [cgroup MiB, default 1536]
# BENCH_BIN: a folder holding trainyard, yard and yard-data to use instead of building release
# ones; BENCH_PYTHON: a Python with torch and webdataset instead of tests/python-env's.
set -euo pipefail
cd "$(dirname "$0")/../.."
samples=${1:-40000}
rounds=${2:-3}
cgroup_mib=${3:-1536}
source tests/ensure-s3s
source tests/bench/release_tools.sh

work=$(mktemp -d "${TMPDIR:-/tmp}/trainyard-data-cache.XXXXXX")
# When run as root, a private Postgres runs as the `postgres` user and must reach this folder.
chmod 755 "$work"
pids=()
own_db=""
cgroup=""
home_cgroup=""
cleanup() {
  status=$?
  if [ "$status" != 0 ] && [ -f "$work/server.log" ]; then
    echo "== the server's log, last lines:"
    tail -20 "$work/server.log"
  fi
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  if [ -n "$own_db" ]; then psql -q "$admin_url" -c "DROP DATABASE IF EXISTS $own_db" 2>/dev/null || true; fi
  "$bin/trainyard" postgres stop --dir "$work/pg" >/dev/null 2>&1 || true
  rm -rf "$work"
  if [ -n "$cgroup" ]; then echo $$ > "$home_cgroup/cgroup.procs" || true; rmdir "$cgroup" 2>/dev/null || true; fi
}
trap cleanup EXIT

# The page cache cap: this shell and everything it starts in a memory cgroup (v1 or v2).
memory_line=$(grep -E '^[0-9]+:memory:' /proc/self/cgroup || true)
if [ -n "$memory_line" ] && [ -w "/sys/fs/cgroup/memory${memory_line##*:memory:}" ] 2>/dev/null; then
  home_cgroup="/sys/fs/cgroup/memory${memory_line##*:memory:}"
  home_cgroup=${home_cgroup%/}
  limit_file=memory.limit_in_bytes
elif [ -w "/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)" ] && [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  home_cgroup="/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)"
  home_cgroup=${home_cgroup%/}
  limit_file=memory.max
fi
if [ -n "$home_cgroup" ] && mkdir "$home_cgroup/trainyard-data-cache-$$" 2>/dev/null; then
  cgroup="$home_cgroup/trainyard-data-cache-$$"
  echo $((cgroup_mib << 20)) > "$cgroup/$limit_file"
  echo $$ > "$cgroup/cgroup.procs"
  export BENCH_CGROUP=$cgroup
  echo "== memory cgroup $cgroup: $cgroup_mib MiB for everything this benchmark runs, page cache included"
else
  echo "== no memory cgroup could be made here: the page cache is not capped"
fi

source tests/bench/pushed_dataset.sh bench_data_cache

# webdataset's URLs: each shard's object in the S3 server, fetched by curl signing the request;
# curl appends the bytes it downloaded to a file, the S3 server's own count. s3s-fs wants the
# x-amz-content-sha256 header, which curl 7.88 does not send by itself.
hex=$(jq -r '.content_hash | ltrimstr("sha256:")' "$work/packed/dataset.json")
: > "$work/s3-urls"
for name in $(jq -r '.shards[].name' "$work/packed/dataset.json"); do
  key=$(cd "$work/s3/bench" && find . -path "*/$hex/$name" -type f | sed 's|^\./||')
  [ -n "$key" ] || { echo "shard $name is not in the S3 server's folder"; exit 1; }
  echo "pipe:curl -sSf --aws-sigv4 aws:amz:us-east-1:s3 --user bench:bench-secret\
 -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' -w '%{stderr}%{size_download}\n'" \
    "http://127.0.0.1:$s3_port/bench/$key 2>>$work/s3-counts" >> "$work/s3-urls"
done

echo "== reading: $rounds rounds of local, uncached, cached, cached-trusted (what-if), webdataset;" \
  "load: $(cut -d' ' -f1-3 /proc/loadavg)"
TRAINYARD_TOKEN=$token "$py" tests/bench/data_cache.py --packed "$work/packed" --url "$url" --dataset bench-data@1 \
  --cache-dir "$work/cache" --s3-urls "$work/s3-urls" --s3-counts "$work/s3-counts" \
  --cold "$work/packed" "$work/s3" "$work/cache" --rounds "$rounds" --json "${BENCH_JSON:-$work/runs.json}"
if [ -n "$cgroup" ]; then
  peak=$(cat "$cgroup/memory.max_usage_in_bytes" 2>/dev/null || cat "$cgroup/memory.peak" 2>/dev/null || echo 0)
  echo "cgroup peak: $((peak >> 20)) MiB of $cgroup_mib"
fi
