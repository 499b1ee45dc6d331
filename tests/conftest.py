"""Shared fixtures: every run poisons the output buffer first, so unwritten elements are NaN."""

from __future__ import annotations

import os
import sys

import pytest

# Make tests/reference.py importable as `reference` whatever the import mode.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import convtune  # noqa: E402

from reference import check_close, max_rel_err, reference_conv2d  # noqa: E402,F401


@pytest.fixture(scope="session", autouse=True)
def poison_outputs():
    """Every conv2d run fills its output with a NaN pattern before the kernel runs."""
    convtune._convtune._set_poison(True)
    yield
    convtune._convtune._set_poison(False)


@pytest.fixture
def ref_conv2d():
    return reference_conv2d
