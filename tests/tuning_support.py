"""Helpers shared by the tuner and cache tests: an isolated tuning environment and small
shapes that tune in well under a second on lavapipe."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest

import convtune
from convtune import _convtune
from convtune.reference import conv2d_reference, max_relative_error

# x shape, w shape, conv2d keyword arguments.
SMALL = ((1, 4, 10, 10), (8, 4, 3, 3), {"padding": 1})
OTHER = ((1, 6, 9, 9), (4, 3, 3, 3), {"padding": 0, "groups": 2})
STRIDED = ((2, 3, 11, 11), (5, 3, 3, 3), {"stride": 2, "padding": 1})

# Enough to time the default and the top-ranked few; everything else is skipped.
BUDGET = "0.2"

STATUSES = {"ok", "pruned", "wrong", "compile error", "out of memory", "error", "skipped (budget)"}


@pytest.fixture
def tuning_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh cache directory, a small budget and default modes; yields the cache dir."""
    cache_dir = tmp_path / "cache"
    monkeypatch.setenv("CONVTUNE_CACHE_DIR", str(cache_dir))
    monkeypatch.setenv("CONVTUNE_TUNE_BUDGET", BUDGET)
    for var in ("CONVTUNE_TUNE", "CONVTUNE_PRINT_TUNING", "CONVTUNE_PROGRESS"):
        monkeypatch.delenv(var, raising=False)
    _convtune._reset_tuning_state()
    yield cache_dir
    _convtune._inject_faulty_candidate(False)
    _convtune._reset_tuning_state()


def inputs(case, seed: int = 0):
    x_shape, w_shape, kw = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    return x, w, kw


def check_conv2d(case, bias: bool = False, seed: int = 0) -> float:
    """Runs conv2d the way CONVTUNE_TUNE says and returns its error against float64."""
    x, w, kw = inputs(case, seed)
    b = np.linspace(-1, 1, w.shape[0]).astype(np.float32) if bias else None
    y = convtune.conv2d(x, w, bias=b, **kw)
    ref = conv2d_reference(x, w, kw.get("stride", 1), kw.get("padding", 0), 1, kw.get("groups", 1), b)
    err = max_relative_error(y, ref)
    assert err <= 1e-5, err
    return err


def tune(case, **kw) -> convtune.TuneReport:
    x_shape, w_shape, args = case
    return convtune.tune(x_shape, w_shape, **args, **kw)


def explain(case, **kw) -> convtune.Explanation:
    x_shape, w_shape, args = case
    return convtune.explain(x_shape, w_shape, **args, **kw)


def cache_file() -> Path:
    p = convtune.cache_path()
    assert p is not None
    return Path(p)


def entries() -> List[Dict[str, Any]]:
    data = json.loads(cache_file().read_text())
    return data["entries"]


def write_entries(items: List[Dict[str, Any]]) -> None:
    data = json.loads(cache_file().read_text())
    data["entries"] = items
    cache_file().write_text(json.dumps(data))


def shape_matches(entry: Dict[str, Any], case) -> bool:
    (n, c, h, w), (k, _, r, s), _ = case
    sk = entry["key"]["shape"]
    return (sk["n"], sk["c"], sk["h"], sk["w"], sk["k"], sk["r"], sk["s"]) == (n, c, h, w, k, r, s)


def env_with(**extra: str) -> Dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env
