"""The thread storm (tests/storm.py) on this machine's adapter, with tuning racing and the
polling waits forced on: CPU adapters never poll by default, and concurrent polls are where
wgpu-core's own assertion once panicked mid-call."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("mode", ["auto", "auto-detached", "background"])
def test_threads_storm_with_polling_waits_and_tuning_racing(tmp_path, mode):
    # auto-detached: auto mode's runs on the background worker, as on GPUs.
    env = dict(os.environ, CONVTUNE_TUNE=mode.split("-")[0], CONVTUNE_TUNE_DETACH="1" if "detached" in mode else "0",
               CONVTUNE_TUNE_BUDGET="0.2", CONVTUNE_SPIN_US="2000", CONVTUNE_CACHE_DIR=str(tmp_path), CONVTUNE_PROGRESS="0")
    r = subprocess.run([sys.executable, os.path.join(HERE, "storm.py"), "--threads", "8", "--calls", "3"],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("24 passed, 0 failed"), r.stdout + r.stderr[-4000:]
