#!/usr/bin/env bash
# Quickstart 2: set up, then run every test: Rust unit tests and the Python test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "== cargo test"
cargo test --release --no-default-features
echo "== benchmarks: build, and run each once as a smoke test"
cargo bench --no-default-features --no-run
CONVTUNE_CACHE_DIR="$(mktemp -d)" CONVTUNE_TUNE_BUDGET=1 \
  .venv/bin/python -m pytest -q -p no:cacheprovider benches/ --benchmark-disable
echo "== pytest"
# tests/conftest.py runs the suite untuned, with a throwaway tuning cache.
exec .venv/bin/python -m pytest -q "$@"
