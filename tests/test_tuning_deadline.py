"""`auto` mode that keeps its budget (CONVTUNE_TUNE_DETACH, on by default on GPUs): a new
problem is tuned on the background worker while the call waits up to the budget; a run that
takes longer leaves the call with the best candidate validated so far (or the default
rule's pick), goes on to its end and stores its winner for later calls. Forced on here, on
lavapipe, with a budget far under what the run takes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCENARIO = """
import json, os
import numpy as np
import convtune
from convtune.reference import conv2d_reference

rng = np.random.default_rng(3)
x = rng.standard_normal((1, 8, 21, 19), dtype=np.float32)
w = rng.standard_normal((8, 8, 3, 3), dtype=np.float32)
want = conv2d_reference(x, w, padding=1)

def check(y):
    assert np.abs(y - want).max() <= 1e-4 * np.abs(want).max(), np.abs(y - want).max()

first = convtune.explain(x, w, padding=1)  # chooses as a conv2d call would
print("first:", first.source, first.variant)
check(convtune.conv2d(x, w, padding=1))
done = convtune.wait_tuning(timeout=300)
print("done:", [(d["problem"], d["winner"], d["error"]) for d in done])
later = convtune.explain(x, w, padding=1)
print("later:", later.source, later.variant)
check(convtune.conv2d(x, w, padding=1))
entries = json.loads(open(os.path.join(os.environ["CONVTUNE_CACHE_DIR"], "tuning.json")).read())
print("cached:", len(entries["entries"]))
"""


def run(tmp_path, budget: str, **env_more: str) -> str:
    script = tmp_path / "scenario.py"
    script.write_text(textwrap.dedent(SCENARIO))
    env = dict(os.environ, CONVTUNE_TUNE="auto", CONVTUNE_TUNE_DETACH="1", CONVTUNE_TUNE_BUDGET=budget,
               CONVTUNE_CACHE_DIR=str(tmp_path), CONVTUNE_PROGRESS="0", **env_more)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    return r.stdout


def test_a_run_past_the_budget_goes_on_and_its_winner_is_used_later(tmp_path):
    out = run(tmp_path, "0.01")
    lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    # The first choice did not wait for the run's end: the best validated so far or the
    # reference kernel (the call after it, meeting the same run or its result, is checked).
    assert lines["first"].startswith(("best within the budget", "reference kernel, tuning")), out
    done = eval(lines["done"])
    assert len(done) == 1 and done[0][0] == "1x8x21x19 k8 3x3 s1 p1 highest" and done[0][2] is None, out
    assert lines["later"] == f"cache {done[0][1]}", out
    assert int(lines["cached"]) == 1, out


def test_a_run_within_the_budget_is_used_at_once(tmp_path):
    # A run ends before its budget only once every candidate is timed: one small family's.
    out = run(tmp_path, "600", CONVTUNE_FAMILIES="wino")
    lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    source, variant = lines["first"].split(" ", 1)
    assert source == "tuned", out
    done = eval(lines["done"])
    assert len(done) == 1 and done[0][1] == variant and done[0][2] is None, out


BEHIND = """
import numpy as np
import convtune
from convtune.reference import conv2d_reference

rng = np.random.default_rng(4)
w = rng.standard_normal((32, 32, 3, 3), dtype=np.float32)
xs = [rng.standard_normal((1, 32, 48 + i, 44), dtype=np.float32) for i in range(3)]
# A network's layers, one after the other: each chooses as its first call would, while the
# first one's run (its default's first-run compile, validation and timing on lavapipe: far
# past a 0.05 s budget) goes on.
for i, x in enumerate(xs):
    print(f"first{i}:", convtune.explain(x, w, padding=1).source)
for x in xs:
    y = convtune.conv2d(x, w, padding=1)
    want = conv2d_reference(x, w, padding=1)
    assert np.abs(y - want).max() <= 1e-4 * np.abs(want).max()
done = convtune.wait_tuning(timeout=300)
print("done:", sorted(d["error"] is None for d in done))
print("later:", sorted({convtune.explain(x, w, padding=1).source for x in xs}))
"""


def test_a_problem_queued_behind_another_problems_run_does_not_wait_its_budget(tmp_path):
    """The second and third layers' runs queue behind the first's, which goes on past its
    budget: their calls take the reference kernel at once instead of waiting a budget each
    for a run that has not begun; all three are tuned and cached in the end."""
    script = tmp_path / "behind.py"
    script.write_text(BEHIND)
    env = dict(os.environ, CONVTUNE_TUNE="auto", CONVTUNE_TUNE_DETACH="1", CONVTUNE_TUNE_BUDGET="0.05",
               CONVTUNE_CACHE_DIR=str(tmp_path), CONVTUNE_PROGRESS="0")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in r.stdout.splitlines() if ": " in line)
    assert not lines["first0"].endswith("queued behind another problem's"), r.stdout
    for i in (1, 2):
        assert lines[f"first{i}"] == "reference kernel, tuning queued behind another problem's", r.stdout
    assert lines["done"] == "[True, True, True]", r.stdout
    assert lines["later"] == "['cache']", r.stdout
