#!/usr/bin/env bash
# Quickstart 1: set up, then tune and run conv2d over the default shape suite and print a table.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m convtune run "$@"
