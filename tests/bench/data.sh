#!/usr/bin/env bash
# Data pipeline benchmark: packing throughput of yard-data vs webdataset's ShardWriter (Python)
# vs GNU tar -cf, and reading throughput of yard-data's reader vs webdataset iteration, on the
# same generated input in the same run. Figures go to docs/PERFORMANCE.md.
# Usage: tests/bench/data.sh [samples, default 50000 (= 100,000 files of 4-64 KiB)]
set -euo pipefail
cd "$(dirname "$0")/../.."
samples=${1:-50000}
cargo build --release --locked -p trainyard-data
source tests/python-env
yard_data="$target_dir/release/yard-data"
py="$venv/bin/python"

work=$(mktemp -d "${TMPDIR:-/tmp}/trainyard-data-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "== generating $samples samples ($((samples * 2)) files) in $work/src"
"$py" tests/bench/gen_tree.py "$work/src" "$samples"
files=$(find "$work/src" -type f | wc -l)
mb=$(du -sm --apparent-size "$work/src" | cut -f1)
echo "input: $files files, $mb MB; $(nproc) cores; page cache warm for every tool"
find "$work/src" -type f -exec cat {} + > /dev/null  # the same warm cache for every run

rate() { python3 -c "import sys; s, mb, n = map(float, sys.argv[1:]); print(f'{mb / s:.0f} MB/s, {n / s:.0f} files/s')" "$@"; }
timed() { local start end; start=$(date +%s.%N); "$@"; end=$(date +%s.%N); python3 -c "print(f'{$end - $start:.2f}')"; }

# yard-data syncs every shard before naming it complete (crash safety); tar does not, so it is
# also timed with a sync of its output, the like-for-like figure.
pack_ours() { "$yard_data" pack "$work/src" "$work/ours" --shard-size 256Mi --overwrite > /dev/null 2>&1; }
tar_synced() { tar -cf "$work/all.tar" -C "$work/src" . && sync -f "$work/all.tar"; }

for round in 1 2; do
  echo; echo "== round $round: packing"
  t=$(timed tar -cf "$work/all.tar" -C "$work/src" .); echo "GNU tar -cf:               ${t}s  $(rate "$t" "$mb" "$files")"; rm -f "$work/all.tar"
  t=$(timed pack_ours); echo "yard-data pack (2 threads): ${t}s  $(rate "$t" "$mb" "$files")"
  t=$(timed tar_synced); echo "GNU tar -cf, then sync:    ${t}s  $(rate "$t" "$mb" "$files")"; rm -f "$work/all.tar"
  t=$(timed "$py" tests/bench/wds_pack.py "$work/src" "$work/wds" 268435456); echo "webdataset ShardWriter:    ${t}s  $(rate "$t" "$mb" "$files")"
  rm -rf "$work/wds"
  echo; echo "== round $round: reading the same shards"
  echo -n "yard-data read (2 readers, shuffle buffer 1000): "; "$yard_data" read "$work/ours" --readers 2 2>&1 | tail -1
  echo -n "webdataset WebDataset iteration:                "; "$py" tests/bench/wds_read.py "$work/ours"
  [ "$round" = 1 ] && rm -rf "$work/ours"
done
