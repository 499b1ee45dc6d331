"""python/convtune/_convtune.pyi matches the native module (mypy's stubtest)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("mypy")


def test_native_module_stub_matches_the_runtime() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "convtune._convtune"],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_package_type_checks() -> None:
    # The package's own annotations against the stub: py.typed promises users they hold.
    package = __import__("convtune").__path__[0]
    r = subprocess.run(
        [sys.executable, "-m", "mypy", package],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
