# Sourced by the benchmarks of datasets on the object store (data_cache.sh, cache_agent.sh): a
# Postgres database, s3s-fs on loopback, `trainyard serve` on that S3 store, and SAMPLES synthetic
# samples (tests/bench/gen_tree.py: two files of 4-64 KiB each) packed by `yard-data pack` into
# 128 MiB shards at $work/packed and pushed with `yard datasets push` as bench-data@1.
# Needs: $work, $bin (trainyard, yard, yard-data), $py, the array `pids` (what the caller's cleanup
# kills) and $1, a name for the database. Sets: admin_url and own_db (for the cleanup to drop),
# url and token (the server and its admin), s3_port.
bench_name=$1

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# The database: a new one in $TRAINYARD_TEST_DATABASE_URL's cluster, else a private cluster.
if [ -n "${TRAINYARD_TEST_DATABASE_URL:-}" ]; then
  admin_url=$TRAINYARD_TEST_DATABASE_URL
  own_db="${bench_name}_$$"
else
  source deploy/ensure-postgres
  admin_url=$("$bin/trainyard" postgres start --dir "$work/pg")
  own_db=$bench_name
fi
psql -q "$admin_url" -c "CREATE DATABASE $own_db"
db_url="${admin_url%/postgres}/$own_db"

echo "== $samples samples, $(nproc) cores; building the dataset in $work"
"$py" tests/bench/gen_tree.py "$work/src" "$samples"
"$bin/yard-data" pack "$work/src" "$work/packed" --shard-size 128Mi > /dev/null
rm -rf "$work/src"
echo "packed: $(jq '.shards | length' "$work/packed/dataset.json") shards, $(du -sm --apparent-size "$work/packed" | cut -f1) MB"

s3_port=$(port)
mkdir -p "$work/s3/bench"
"$TRAINYARD_TEST_S3S_FS" --host 127.0.0.1 --port "$s3_port" --access-key bench --secret-key bench-secret "$work/s3" \
  >/dev/null 2>&1 &
pids+=($!)
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench-secret AWS_REGION=us-east-1
# Shards go up as single PUTs (part size above the 128 MiB shards): s3s-fs names a multipart
# upload's metadata file after the base64 of the key, which for a dataset's key
# (tenants/<id>/datasets/content/<sha256>/<shard>) passes the file system's 255 bytes.
token=$(TRAINYARD_DATABASE_URL="$db_url" "$bin/trainyard" bootstrap 2>/dev/null)
TRAINYARD_DATABASE_URL="$db_url" "$bin/trainyard" serve --listen 127.0.0.1:0 --data-dir "$work/data" \
  --object-store s3://bench/trainyard --object-store-endpoint "http://127.0.0.1:$s3_port" \
  --object-store-part-size 160Mi \
  > "$work/server.out" 2> "$work/server.log" &
pids+=($!)
for _ in $(seq 100); do grep -q "listening on" "$work/server.out" 2>/dev/null && break; sleep 0.1; done
url=$(sed -n 's/^trainyard: listening on //p' "$work/server.out")

start=$(date +%s.%N)
# Tried again: a push that failed half way registers nothing, and pushing the same content again
# is harmless (a debug server hashing shards on a busy 2-core machine can keep its database
# waiting past its timeout).
for try in 1 2 3; do
  TRAINYARD_URL=$url TRAINYARD_TOKEN=$token "$bin/yard" datasets push bench-data@1 "$work/packed" -o json \
    > "$work/pushed.json" && break
  [ "$try" = 3 ] && exit 1
  echo "push failed (try $try); again"
done
echo "pushed $(jq -r .uri "$work/pushed.json") in $(echo "$(date +%s.%N) - $start" | bc) s"
