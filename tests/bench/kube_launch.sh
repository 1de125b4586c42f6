#!/usr/bin/env bash
# Launch rate of the Kubernetes executor through the whole control plane, against a real API
# server (none runs on the build machines: build one, see docs/kubernetes.md, "Tests").
# For --launch-concurrency 1 (launches in turn, as before), 8 (the default) and 16, each on a fresh
# Postgres and server: JOBS one-replica jobs submitted at 16 clients; Jobs created per second and
# submit -> Job latency as the API server's watch sees them. Then the peer: the same four applies
# per job from a minimal Rust client (crates/kube/examples/launch_peer.rs, one connection pool),
# 1, 8 and 16 in flight. Figures go to docs/PERFORMANCE.md.
# Needs: TRAINYARD_BENCH_KUBECONFIG (Trainyard's service account, rbac.yaml and policy.yaml
# applied) and TRAINYARD_BENCH_KUBECONFIG_ADMIN (the cluster's admin: stand-in nodes, cleanup).
# Usage: tests/bench/kube_launch.sh [jobs, default 500] [BEFORE AFTER]
# With two commits, both builds run at each setting, alternately (tests/bench/revisions.sh).
# CONCURRENCY="8 16" chooses the settings (default 1 8 16).
set -euo pipefail
cd "$(dirname "$0")/../.."
jobs=${1:-500}
: "${TRAINYARD_BENCH_KUBECONFIG:?the kubeconfig of the executor, as Trainyard service account}"
: "${TRAINYARD_BENCH_KUBECONFIG_ADMIN:?the kubeconfig of the cluster admin}"
python=$(command -v python3)
export KUBECONFIG=$TRAINYARD_BENCH_KUBECONFIG
cargo build --release --locked -p trainyard-kube --example launch_peer -q
builds=()
if [ $# -ge 3 ]; then
  bins=$(mktemp -d "${TMPDIR:-/tmp}/trainyard-kube-launch.XXXXXX")
  trap 'rm -rf "$bins"' EXIT
  source tests/bench/revisions.sh
  for rev in "$(git rev-parse --short "$2")" "$(git rev-parse --short "$3")"; do
    build_rev "$rev" "$bins/$rev"
    builds+=("$rev=$bins/$rev")
  done
else
  cargo build --release --locked --bins -q
  builds+=("this checkout=target/release/trainyard")
fi
for concurrency in ${CONCURRENCY:-1 8 16}; do
  for build in "${builds[@]}"; do
    serve_args=(--executor kubernetes --kube-image registry.example/runtime:1 --launch-concurrency "$concurrency")
    (
      trainyard=${build#*=}
      source tests/bench/server.sh
      echo "== ${build%%=*}: --launch-concurrency $concurrency, $jobs jobs"
      "$python" tests/bench/kube_launch.py trainyard "$url" "$TRAINYARD_TOKEN" "$TRAINYARD_BENCH_KUBECONFIG_ADMIN" "$jobs" 16
      echo "server CPU seconds: $(ps -o times= -p "$server_pid")"
    )
  done
  # The peer beside each setting, against the same API server.
  echo "== peer: a minimal client, $concurrency in flight"
  target/release/examples/launch_peer "$TRAINYARD_BENCH_KUBECONFIG_ADMIN" "$TRAINYARD_BENCH_KUBECONFIG" "$jobs" "$concurrency" \
    2> >(grep -v "cert bypassed" >&2)
done
