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
# CONCURRENCY="8 16" chooses the settings (default 1 8 16). TRAINYARD_BENCH_FAKE=1 runs against the
# in-memory API server instead (crates/kube/examples/fake_apiserver.rs, which also places and
# runs the pods): the reconciler's path without an API server's cost; no kubeconfig needed.
set -euo pipefail
cd "$(dirname "$0")/../.."
jobs=${1:-500}
python=$(command -v python3)
cargo build --release --locked -p trainyard-kube --example launch_peer --example fake_apiserver -q
fake_pid="" fake_dir="" bins=""
trap '[ -n "$fake_pid" ] && kill "$fake_pid" 2>/dev/null; rm -rf "$fake_dir" "$bins"' EXIT
if [ "${TRAINYARD_BENCH_FAKE:-}" = 1 ]; then
  # The in-memory API server of the executor's tests, over HTTP, fresh for each run: what is
  # measured is Trainyard's own path (reconciler, Postgres, executor), not an API server's.
  fake_dir=$(mktemp -d "${TMPDIR:-/tmp}/trainyard-fake-api.XXXXXX")
  fake_start() {
    [ -n "$fake_pid" ] && kill "$fake_pid" 2>/dev/null && wait "$fake_pid" 2>/dev/null || true
    target/release/examples/fake_apiserver 16 > "$fake_dir/out" &
    fake_pid=$!
    for _ in $(seq 50); do grep -q listening "$fake_dir/out" && break; sleep 0.1; done
    printf 'apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {server: "%s"}\nusers:\n- name: bench\n  user: {token: "bench"}\ncontexts:\n- name: fake\n  context: {cluster: fake, user: bench}\ncurrent-context: fake\n' \
      "$(sed -n 's/^listening on //p' "$fake_dir/out")" > "$fake_dir/kubeconfig"
    export TRAINYARD_BENCH_KUBECONFIG=$fake_dir/kubeconfig TRAINYARD_BENCH_KUBECONFIG_ADMIN=$fake_dir/kubeconfig
  }
  fake_start
fi
: "${TRAINYARD_BENCH_KUBECONFIG:?the kubeconfig of the executor, as Trainyard service account}"
: "${TRAINYARD_BENCH_KUBECONFIG_ADMIN:?the kubeconfig of the cluster admin}"
export KUBECONFIG=$TRAINYARD_BENCH_KUBECONFIG
builds=()
if [ $# -ge 3 ]; then
  bins=$(mktemp -d "${TMPDIR:-/tmp}/trainyard-kube-launch.XXXXXX")
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
    [ -n "$fake_pid" ] && fake_start
    serve_args=(--executor kubernetes --kube-image registry.example/runtime:1 --launch-concurrency "$concurrency")
    (
      trainyard=${build#*=}
      source tests/bench/server.sh
      echo "== ${build%%=*}: --launch-concurrency $concurrency, $jobs jobs"
      "$python" tests/bench/kube_launch.py trainyard "$url" "$TRAINYARD_TOKEN" "$TRAINYARD_BENCH_KUBECONFIG_ADMIN" "$jobs" 16 \
        ${fake_pid:+fake}
      echo "server CPU seconds: $(ps -o times= -p "$server_pid")"
    )
  done
  # The peer beside each setting, against the same API server.
  echo "== peer: a minimal client, $concurrency in flight"
  target/release/examples/launch_peer "$TRAINYARD_BENCH_KUBECONFIG_ADMIN" "$TRAINYARD_BENCH_KUBECONFIG" "$jobs" "$concurrency" \
    2> >(grep -v "cert bypassed" >&2)
done
