#!/usr/bin/env bash
# Quickstart 2: set up, then run every test: Rust unit, integration and doc tests, the Rust
# examples, and the Python test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "== cargo test"
# The doctests, examples and integration test tune on first use: a throwaway tuning cache.
CONVTUNE_CACHE_DIR="$(mktemp -d)" cargo test --release
echo "== examples: each checks its result against a float64 reference"
CONVTUNE_CACHE_DIR="$(mktemp -d)" cargo run --release -q --example own_device
CONVTUNE_CACHE_DIR="$(mktemp -d)" cargo run --release -q --example host_slices
CONVTUNE_CACHE_DIR="$(mktemp -d)" cargo run --release -q --example resident_chain
echo "== benchmarks: build, and run each once as a smoke test"
cargo bench --no-run
CONVTUNE_CACHE_DIR="$(mktemp -d)" CONVTUNE_TUNE_BUDGET=1 \
  .venv/bin/python -m pytest -q -p no:cacheprovider benches/ --benchmark-disable
echo "== pytest"
# tests/conftest.py runs the suite untuned, with a throwaway tuning cache.
exec .venv/bin/python -m pytest -q "$@"
