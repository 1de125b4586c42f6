#!/usr/bin/env bash
# Kueue's scheduler scenarios replayed end to end through the real server (release build),
# printing Kueue's figures beside the measured ones (tests/e2e/replay.rs):
#   tests/bench/replay.sh             the baseline (15,000 jobs, 30 tenants in 5 cohorts), local
#                                     executor with real processes on one simulated node of 600 GPUs
#   tests/bench/replay.sh kubernetes  the baseline on the Kubernetes executor against the in-memory
#                                     API server (crates/kube/examples/fake_apiserver.rs), 40-GPU nodes
#   tests/bench/replay.sh large       the large scale (50,000 jobs, 1,000 tenants in 10 cohorts),
#                                     Kubernetes executor as above
#   tests/bench/replay.sh kills       the baseline on two servers (local executor), the leader
#                                     killed (SIGKILL) five times at random moments
#   tests/bench/replay.sh real        the baseline on the Kubernetes executor against a real API
#                                     server (TRAINYARD_TEST_KUBECONFIG: an admin's kubeconfig, for
#                                     the kubelet stand-in; TRAINYARD_TEST_KUBECONFIG_EXECUTOR:
#                                     Trainyard's service account's; see docs/kubernetes.md)
# With TRAINYARD_BENCH_STATEMENTS=1 the replay also prints the statements that took the
# database's time (pg_stat_statements); TRAINYARD_BENCH_SERVER_ARGS="--launch-concurrency 16"
# gives the server of the local, kubernetes and real replays more options, and
# TRAINYARD_BENCH_PG_CONF="synchronous_commit = off" adds a line to Postgres's settings (to
# measure what a setting costs; the figures recorded are with Postgres's durable defaults).
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-local}" in
  local) test=replay::kueues_baseline_full ;;
  kubernetes) test=replay::kueues_baseline_full_on_kubernetes ;;
  large) test=replay::kueues_large_scale_on_kubernetes ;;
  kills) test=replay::kueues_baseline_full_survives_five_leader_kills ;;
  real) test=replay::kueues_baseline_full_on_a_real_api_server ;;
  *) echo "usage: $0 [local|kubernetes|large|kills|real]" >&2; exit 2 ;;
esac
source deploy/ensure-postgres
cargo build --release --locked --workspace --bins
cargo build --release --locked -p trainyard-kube --example fake_apiserver --example kubelet_standin
work=$(mktemp -d "${TMPDIR:-/tmp}/trainyard-replay.XXXXXX")
chmod 755 "$work" # Postgres runs as its own user
trap 'target/release/trainyard postgres stop --dir "$work/pg" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
export TRAINYARD_TEST_DATABASE_URL=$(target/release/trainyard postgres start --dir "$work/pg")
if [ -n "${TRAINYARD_BENCH_STATEMENTS:-}${TRAINYARD_BENCH_PG_CONF:-}" ]; then
  # The statements the replay ran, by total time, printed at its end (pg_stat_statements: it
  # must be loaded when Postgres starts); settings of Postgres's own to measure (e.g.
  # TRAINYARD_BENCH_PG_CONF="synchronous_commit = off", to see what waiting for commits costs).
  target/release/trainyard postgres stop --dir "$work/pg" >/dev/null
  if [ -n "${TRAINYARD_BENCH_STATEMENTS:-}" ]; then
    echo "shared_preload_libraries = 'pg_stat_statements'" >> "$work/pg/pgdata/postgresql.conf"
  fi
  if [ -n "${TRAINYARD_BENCH_PG_CONF:-}" ]; then
    echo "Postgres settings added for this run: $TRAINYARD_BENCH_PG_CONF"
    echo "$TRAINYARD_BENCH_PG_CONF" >> "$work/pg/pgdata/postgresql.conf"
  fi
  TRAINYARD_TEST_DATABASE_URL=$(target/release/trainyard postgres start --dir "$work/pg")
fi
cargo test --release --locked -p trainyard-tests --test e2e "$test" -- --exact --ignored --nocapture
