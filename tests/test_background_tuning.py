"""Background tuning (``set_tuning("background")`` / ``CONVTUNE_TUNE=background``): a new
problem's first call runs the default rule's pick and queues the problem; the worker's
winner is used by later calls; ``wait_tuning`` with and without a timeout;
``tuning_status``; an exit with tuning pending; bad arguments."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import convtune
from convtune.reference import conv2d_reference
from reference import check_close
from tuning_support import tuning_env  # noqa: F401  (a fixture)


@pytest.fixture
def background(tuning_env):  # noqa: F811
    convtune.wait_tuning()  # nothing of an earlier test left running
    convtune.set_tuning("background")
    yield tuning_env
    convtune.set_tuning(None)
    convtune.wait_tuning()


def call(shape, seed=0, **kw):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((8, shape[1], 3, 3)).astype(np.float32)
    got = convtune.conv2d(x, w, padding=1, **kw)
    check_close(got, conv2d_reference(x, w, padding=1))
    return x, w


def test_first_call_runs_the_default_and_later_calls_the_winner(background):
    assert convtune.tuning_mode() == "background"
    x, w = call((1, 4, 11, 9))
    first = convtune.explain(x, w, padding=1)
    assert first.source in ("default, tuning in the background", "cache"), first.source
    assert first.variant == convtune.default_variant(x, w, padding=1) or first.source == "cache"
    done = convtune.wait_tuning(timeout=120)
    assert [d["problem"] for d in done] == ["1x4x11x9 k8 3x3 s1 p1 highest"], done
    assert done[0]["error"] is None and done[0]["seconds"] > 0
    later = convtune.explain(x, w, padding=1)
    assert later.source == "cache" and later.variant == done[0]["winner"]
    call((1, 4, 11, 9), seed=1)  # the winner, checked against float64
    assert convtune.wait_tuning() == []  # returned once
    status = convtune.tuning_status()
    assert status["mode"] == "background" and status["queued"] == [] and status["in_progress"] is None
    assert any(d["problem"] == done[0]["problem"] for d in status["done"])
    # The winner is on disk, for the next process.
    entries = json.loads((background / "tuning.json").read_text())
    assert entries


def test_each_problem_is_queued_once_and_wait_takes_a_timeout(background, monkeypatch):
    monkeypatch.setenv("CONVTUNE_TUNE_BUDGET", "3")
    for seed in range(3):  # the same problem three times: one job
        call((1, 4, 13, 7), seed=seed)
    call((1, 4, 7, 13))
    status = convtune.tuning_status()
    pending = status["queued"] + [status["in_progress"]]
    assert sorted(p for p in pending if p) == ["1x4x13x7 k8 3x3 s1 p1 highest", "1x4x7x13 k8 3x3 s1 p1 highest"]
    with pytest.raises(TimeoutError, match="still has"):
        convtune.wait_tuning(timeout=0.01)
    done = convtune.wait_tuning(timeout=300)
    assert len(done) == 2 and all(d["winner"] for d in done), done


def test_other_modes_never_queue(tuning_env):  # noqa: F811
    convtune.wait_tuning()
    before = len(convtune.tuning_status()["done"])
    for mode in ("off", "cached"):
        convtune.set_tuning(mode)
        call((1, 4, 6, 5))
        assert convtune.tuning_status()["queued"] == []
    convtune.set_tuning(None)
    assert convtune.wait_tuning() == [] and len(convtune.tuning_status()["done"]) == before


def test_exit_with_tuning_pending_is_prompt_and_leaves_the_cache_valid(tmp_path):
    code = (
        "import numpy as np, convtune\n"
        "rng = np.random.default_rng(0)\n"
        "for h in range(8, 14):\n"
        "    convtune.conv2d(rng.standard_normal((1, 8, h, 9)).astype(np.float32),\n"
        "                    rng.standard_normal((8, 8, 3, 3)).astype(np.float32), padding=1)\n"
        "assert convtune.tuning_status()['queued']\n"
    )
    env = dict(os.environ, CONVTUNE_TUNE="background", CONVTUNE_TUNE_BUDGET="30",
               CONVTUNE_CACHE_DIR=str(tmp_path), CONVTUNE_PROGRESS="0")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    took = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    assert took < 60, took  # six problems at 30 s each would take minutes
    cache = tmp_path / "tuning.json"
    if cache.exists():
        json.loads(cache.read_text())


def test_bad_arguments():
    with pytest.raises(ValueError, match="'auto', 'background', 'cached' or 'off'"):
        convtune.set_tuning("sometimes")
    with pytest.raises(TypeError, match="mode must be a str"):
        convtune.set_tuning(1)
    with pytest.raises(TypeError, match="timeout must be a number"):
        convtune.wait_tuning(timeout="1")
    with pytest.raises(ValueError, match="timeout must be between"):
        convtune.wait_tuning(timeout=-1)
    assert convtune.tuning_mode() in ("auto", "background", "cached", "off")
