# Sourced by the dataset benchmarks (data_cache.sh, cache_agent.sh): sets `bin`, a folder holding
# trainyard, yard and yard-data (BENCH_BIN, else release ones built here), and `py`, a Python
# with the engine's packages (BENCH_PYTHON, else tests/python-env's).
if [ -n "${BENCH_BIN:-}" ]; then
  bin=$BENCH_BIN
else
  cargo build --release --locked --bin trainyard --bin yard --bin yard-data
  bin=${CARGO_TARGET_DIR:-target}/release
fi
if [ -n "${BENCH_PYTHON:-}" ]; then py=$BENCH_PYTHON; else source tests/python-env; py="$venv/bin/python"; fi
