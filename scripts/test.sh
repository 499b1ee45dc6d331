#!/usr/bin/env bash
# Quickstart 2: set up, then run every test: Rust unit tests and the Python test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "== cargo test"
cargo test --release --no-default-features
echo "== pytest"
# tests/conftest.py runs the suite untuned, with a throwaway tuning cache.
exec .venv/bin/python -m pytest -q "$@"
