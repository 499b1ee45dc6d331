"""One-parameter sweeps: `python -m convtune bench --sweep` and benches/cliffs.py, which share
convtune._sweep. The runs use tiny shapes and a zero budget (the default and the top-ranked
few candidates are still tuned and timed), a few seconds on lavapipe."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import convtune.__main__ as cli
from convtune import _sweep
from convtune._shapes import parse_spec
from tuning_support import env_with, tuning_env  # noqa: F401  (tuning_env is a fixture)

BASE = "1x4x6x6 k4 3x3 s1 p1"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("text, param, values", [
    ("C=56:72", "C", list(range(56, 73))),
    ("ck=8:16:4", "CK", [8, 12, 16]),
    (" HW = 14:14 ", "HW", [14]),
    ("pad=0:4", "pad", [0, 1, 2, 3, 4]),
    ("n=8:40:8", "N", [8, 16, 24, 32, 40]),
    ("K=5:9:3", "K", [5, 8]),
])
def test_parse_sweep(text, param, values):
    assert _sweep.parse_sweep(text) == (param, values)


@pytest.mark.parametrize("text, match", [
    ("C56:72", "is not PARAM=START:STOP"),
    ("X=1:4", "unknown parameter 'X'.*C, K, CK, HW, pad, N"),
    ("C=9:3", "STOP .* below START"),
    ("C=1:4:0", "STEP must be >= 1"),
    ("C=0:4", "C must be >= 1"),
    ("pad=-1:2", "pad must be >= 0"),
    ("N=1:5000", "at most 1000"),
    ("C=1.5:4", "is not PARAM"),
])
def test_bad_sweeps_raise_value_error(text, match):
    with pytest.raises(ValueError, match=match):
        _sweep.parse_sweep(text)


def test_points_set_one_parameter():
    base = parse_spec("8x64x56x56 k64 3x3 s1 p1 g2")
    assert _sweep.at(base, "C", 66).label() == "8x66x56x56 k64 3x3 s1 p1 g2"
    assert _sweep.at(base, "C", 66).w == (64, 33, 3, 3)
    assert _sweep.at(base, "K", 70).label() == "8x64x56x56 k70 3x3 s1 p1 g2"
    assert _sweep.at(base, "CK", 60).label() == "8x60x56x56 k60 3x3 s1 p1 g2"
    assert _sweep.at(base, "HW", 14).label() == "8x64x14x14 k64 3x3 s1 p1 g2"
    assert _sweep.at(base, "pad", 3).label() == "8x64x56x56 k64 3x3 s1 p3 g2"
    assert _sweep.at(base, "N", 40).label() == "40x64x56x56 k64 3x3 s1 p1 g2"
    with pytest.raises(ValueError, match="groups=2 must divide C=65"):
        _sweep.at(base, "C", 65)


def test_sweeps_around_a_pixel_shuffled_base_keep_the_shuffle():
    base = parse_spec("1x8x12x12 k16 3x3 s1 p1 ps2")
    assert _sweep.at(base, "HW", 10).label() == "1x8x10x10 k16 3x3 s1 p1 ps2"
    assert _sweep.at(base, "K", 20).kwargs() == {"pixel_shuffle": 2}
    assert [s.label() for s in _sweep.points(base, "K", [12, 16])] == [
        "1x8x12x12 k12 3x3 s1 p1 ps2", "1x8x12x12 k16 3x3 s1 p1 ps2"]
    # A point whose K the shuffle cannot divide is named before anything is tuned.
    with pytest.raises(ValueError, match="sweep point K=14: .*pixel_shuffle=2"):
        _sweep.points(base, "K", [12, 14])


def test_summary_finds_the_extremes_and_the_worst_cliff():
    times = {4: 1.0, 5: 3.0, 6: 1.2, 7: 1.1, 8: 2.0}
    pts = [{"value": v, "lib": {"s_per_flop": t}} for v, t in times.items()]
    pts.append({"value": 9, "lib": None})  # not timed: left out
    s = _sweep.summarize(pts, "lib")
    assert (s["min_at"], s["max_at"]) == (4, 5)
    assert s["max_over_min"] == pytest.approx(3.0)
    # 5 is 3.0 / min(1.0, 1.2) = 3x its better neighbour; 8 only 2.0 / 1.1.
    assert (s["worst_neighbour_at"], s["worst_neighbour_ratio"]) == (5, pytest.approx(3.0))
    assert _sweep.summarize([{"value": 1, "lib": None}], "lib") is None
    line = _sweep.summary_line("C", "lib", s)
    assert "worst vs better neighbour 3.00x at C=5" in line


def test_cli_sweep_parsing_errors(capsys):
    for argv in (
        ["bench", "--base", BASE],
        ["bench", "--budget", "1"],
        ["bench", "--suite", "default", "--sweep", "C=4:5"],
    ):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
    assert cli.main(["bench", "--sweep", "Q=1:2"]) == 2
    assert "unknown parameter 'Q'" in capsys.readouterr().err
    assert cli.main(["bench", "--sweep", "C=4:5", "--base", "1x4x6x6 k4"]) == 2
    assert "incomplete" in capsys.readouterr().err
    # A point convtune rejects is named before anything is tuned.
    assert cli.main(["bench", "--sweep", "HW=1:3", "--base", BASE.replace("p1", "p0")]) == 2
    assert "sweep point HW=1" in capsys.readouterr().err


def test_cli_sweep_prints_each_point_and_the_extremes(tuning_env, capsys):
    argv = ["bench", "--sweep", "K=3:5", "--base", BASE, "--budget", "0", "--reps", "2"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line[:1] in "345" and "k" in line]
    assert [r[0] for r in rows] == ["3", "4", "5"]
    assert [r[2] for r in rows] == ["k3", "k4", "k5"]
    assert all(float(r[9]) > 0 for r in rows)  # ps/FLOP
    assert "convtune: ps/FLOP min" in out and "worst vs better neighbour" in out


def test_cliffs_script_runs_a_small_sweep(tmp_path, tuning_env):
    out = tmp_path / "results"
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benches", "cliffs.py"), "--small", "--only", "pad",
         "--budget", "0", "--reps", "2", "--families", "direct,gemm", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=env_with(CONVTUNE_PROGRESS="0"),
    )
    assert r.returncode == 0, r.stderr
    data = json.loads((out / "cliffs_small.json").read_text())
    assert data["environment"]["families"] == "direct,gemm"
    (sweep,) = data["sweeps"]
    assert sweep["param"] == "pad" and [p["value"] for p in sweep["points"]] == [0, 1, 2]
    assert all(p["convtune"]["s_per_flop"] > 0 for p in sweep["points"])
    assert sweep["summary"]["convtune"]["max_over_min"] >= 1.0
    assert "worst vs better neighbour" in r.stdout
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "no plots" in r.stderr
    else:
        assert (out / "cliffs_small_pad.png").stat().st_size > 0
