#!/usr/bin/env bash
# Sets up a development environment on a fresh Debian/Ubuntu machine: the Vulkan loader and
# Mesa's CPU driver (lavapipe) when missing, a virtualenv in .venv with the Python tools, and
# convtune built into it in release mode. Safe to run again; it only does what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

have_vulkan_loader() { ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1'; }
have_icd() { compgen -G '/usr/share/vulkan/icd.d/*.json' >/dev/null || compgen -G '/etc/vulkan/icd.d/*.json' >/dev/null; }

if command -v apt-get >/dev/null && { ! have_vulkan_loader || ! have_icd; }; then
  echo "setup: installing the Vulkan loader and Mesa's Vulkan drivers (lavapipe)"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq libvulkan1 mesa-vulkan-drivers >/dev/null
fi

if ! command -v cargo >/dev/null; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null; then
  echo "setup: a Rust toolchain (cargo, rustc >= 1.87) is needed: see https://rustup.rs" >&2
  exit 1
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade \
  "maturin>=1.7,<2" numpy pytest pytest-xdist hypothesis pytest-benchmark mypy "onnx>=1.14"
echo "setup: building convtune (release)"
VIRTUAL_ENV="$PWD/.venv" .venv/bin/maturin develop --release -q
