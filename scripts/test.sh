#!/usr/bin/env bash
# Quickstart 2: set up, then run every test: Rust unit tests and the Python test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "== cargo test"
cargo test --release --no-default-features
echo "== pytest"
# conv2d tunes every new shape by default, and the correctness tests use hundreds of shapes:
# run them untuned and away from the user's cache. The tuning tests set both themselves.
export CONVTUNE_TUNE="${CONVTUNE_TUNE:-off}"
export CONVTUNE_CACHE_DIR="${CONVTUNE_CACHE_DIR:-$(mktemp -d)}"
exec .venv/bin/python -m pytest -q "$@"
