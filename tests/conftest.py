"""Shared fixtures: every run poisons the output buffer first, so unwritten elements are NaN."""

from __future__ import annotations

import os
import sys

import pytest

# Make tests/reference.py importable as `reference` whatever the import mode.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# conv2d tunes every new shape by default, and these tests use hundreds of shapes: run them
# untuned and away from the user's cache. The tuning tests set both themselves.
os.environ.setdefault("CONVTUNE_TUNE", "off")
# The tuning tests check what an auto call tunes and stores before it returns: on GPUs a run
# past the budget would finish after the call (CONVTUNE_TUNE_DETACH); test_tuning_deadline.py
# and the detached storm test that.
os.environ.setdefault("CONVTUNE_TUNE_DETACH", "0")
# Many tests meet one layer at many sizes and check what each size chose or cached: the
# switch-over to size-generic kernels is tested in test_size_generic.py, which sets it.
os.environ.setdefault("CONVTUNE_GENERIC_AFTER", "0")
if "CONVTUNE_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["CONVTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="convtune-test-cache-")

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
