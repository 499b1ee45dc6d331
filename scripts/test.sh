#!/usr/bin/env bash
# Quickstart 2: set up, then run every test: Rust unit, integration and doc tests, the Rust
# examples, the benchmarks as smoke tests, and the Python test suite; each part's time is
# printed. Per-variant sweeps run a spread sample of each kernel family; CONVTUNE_EXHAUSTIVE=1
# runs every variant and every drawn case (hours on a CPU adapter: the GPU machine's runs).
set -euo pipefail
cd "$(dirname "$0")/.."
# On Mesa's CPU driver (lavapipe) compiling the kernels is most of the suite's time: skip
# LLVM's optimisation passes there (the kernels run slower, the tests' shapes are tiny). GPU
# drivers do not read it.
export GALLIVM_PERF=${GALLIVM_PERF:-nopt}
t0=$SECONDS
mark=$SECONDS
part() {  # prints the time of the part that just ended, then names the next one
  [ -n "${current:-}" ] && echo "== $current: $((SECONDS - mark)) s"
  current=$1
  mark=$SECONDS
  [ -n "$current" ] && echo "== $current"
  return 0
}
part "setup"
scripts/setup.sh
part "cargo test"
# The doctests, examples and integration test tune on first use: a throwaway tuning cache.
CONVTUNE_CACHE_DIR="$(mktemp -d)" cargo test --release
part "examples: each checks its result against a float64 reference"
CONVTUNE_CACHE_DIR="$(mktemp -d)" cargo run --release -q --example own_device
CONVTUNE_CACHE_DIR="$(mktemp -d)" cargo run --release -q --example host_slices
CONVTUNE_CACHE_DIR="$(mktemp -d)" cargo run --release -q --example resident_chain
part "benchmarks: build, and run each once as a smoke test"
cargo bench --no-run
CONVTUNE_CACHE_DIR="$(mktemp -d)" CONVTUNE_TUNE_BUDGET=1 \
  .venv/bin/python -m pytest -q -p no:cacheprovider benches/ --benchmark-disable
part "pytest"
# tests/conftest.py runs the suite untuned, with a throwaway tuning cache (one per worker
# process: one worker per core).
status=0
.venv/bin/python -m pytest -q -n auto "$@" || status=$?
part ""
echo "== total: $((SECONDS - t0)) s"
exit $status
