"""The autotuner through the Python surface: reports, validation (the faulty candidate),
CONVTUNE_TUNE modes, explain(), progress reporting and argument errors.

Every test runs with its own CONVTUNE_CACHE_DIR and a 0.2 s budget (see tuning_support).
"""

from __future__ import annotations

import io

import numpy as np
import pytest

import convtune
from convtune import _convtune
from convtune._tuning import Progress
from tuning_support import (  # noqa: F401  (tuning_env is a fixture)
    OTHER,
    SMALL,
    STATUSES,
    STRIDED,
    cache_file,
    check_conv2d,
    entries,
    explain,
    tune,
    tuning_env,
    write_entries,
)


def by_name(report):
    return {c["name"]: c for c in report.candidates}


def test_report_has_every_field_and_a_valid_winner(tuning_env):
    r = tune(SMALL)
    assert isinstance(r, convtune.TuneReport)
    assert r.source == "tuned"
    assert r.shape == "1x4x10x10 k8 3x3 s1 p1"
    assert r.default == convtune.default_variant((1, 4, 10, 10), (8, 4, 3, 3), padding=1)
    assert r.tuning_s > 0 and r.default_ms > 0 and r.tuned_ms > 0
    assert r.speedup == pytest.approx(r.default_ms / r.tuned_ms)
    cands = by_name(r)
    assert {c["status"] for c in r.candidates} <= STATUSES
    for c in r.candidates:
        assert set(c) >= {"name", "knobs", "status", "median_ms", "samples", "compile_ms", "runoff_ms"}
    # The runoff: the default and the three fastest other valid candidates, timed again
    # (where there are two at least); the winner is valid, fully timed, and the fastest there.
    ok = sorted((c for c in r.candidates if c["status"] == "ok"), key=lambda c: c["median_ms"])
    finalists = {c["name"] for c in ok if c["runoff_ms"] is not None}
    others = [c["name"] for c in ok if c["name"] != r.default]
    expected = set(others[:3]) | ({r.default} & {c["name"] for c in ok})
    assert finalists == (expected if len(expected) > 1 else set())
    assert all(c["runoff_ms"] is None for c in r.candidates if c["name"] not in finalists)
    win = cands[r.winner]
    assert win["status"] == "ok" and len(win["samples"]) >= 3
    if finalists:
        assert win["runoff_ms"] == r.tuned_ms == min(cands[n]["runoff_ms"] for n in finalists)
        assert "runoff" in str(r)
    else:
        assert win["median_ms"] == r.tuned_ms == ok[0]["median_ms"]
    if r.default in finalists:
        assert cands[r.default]["runoff_ms"] == r.default_ms
    assert win["knobs"]["family"] in {"direct", "stem", "gemm"}
    # The default is always timed; a 0.2 s budget cannot reach the whole space.
    assert cands[r.default]["status"] in {"ok", "pruned"}
    skipped = [c for c in r.candidates if c["status"] == "skipped (budget)"]
    assert skipped and all(c["samples"] == [] and c["median_ms"] is None for c in skipped)
    # Pruned candidates stopped after two samples, more than 1.5x the best at the time.
    for c in r.candidates:
        if c["status"] == "pruned":
            assert len(c["samples"]) == 2
    assert "skipped (budget)" in str(r) and r.winner in str(r)
    assert r["winner"] == r.winner


def test_report_breaks_the_tuning_time_down(tuning_env):
    r = tune(SMALL)
    assert set(r.phases) == {"setup", "compile", "validate", "timing", "finish", "other"}
    assert all(v >= 0 for v in r.phases.values())
    # Measured phases, not shares of a total: they add up to the wall time tuning took.
    assert sum(r.phases.values()) == pytest.approx(r.tuning_s, rel=0.02, abs=2e-3)
    # Every timed candidate was compiled, validated and timed.
    assert r.phases["compile"] > 0 and r.phases["validate"] > 0 and r.phases["timing"] > 0
    assert "tuning time: setup" in str(r)
    assert explain(SMALL).report.phases == r.phases


def test_candidates_are_all_fitting_variants_once(tuning_env):
    r = tune(SMALL)
    names = [c["name"] for c in r.candidates]
    assert len(names) == len(set(names))
    space = set(convtune.variant_space())
    assert set(names) <= space
    assert "direct_wg64x1_u0_k1w1" in names  # the reference, the fallback


@pytest.mark.parametrize("case", [SMALL, OTHER], ids=["small", "grouped"])
def test_faulty_candidate_never_wins(tuning_env, case):
    _convtune._inject_faulty_candidate(True)
    r = tune(case, force=True)
    faulty = [c for c in r.candidates if c["name"].startswith("faulty:")]
    assert len(faulty) == 1
    assert faulty[0]["status"] == "wrong"
    assert faulty[0]["median_ms"] is None
    assert "exceeds" in faulty[0]["detail"] or "reference" in faulty[0]["detail"]
    assert not r.winner.startswith("faulty")
    assert by_name(r)[r.winner]["status"] == "ok"
    # Whatever was stored, conv2d computes the right thing with it.
    check_conv2d(case)


@pytest.mark.parametrize("overlap", ["0", "1"], ids=["in-turn", "overlapped"])
def test_compiling_the_next_batch_while_timing_gives_a_sound_report(tuning_env, monkeypatch, overlap):
    # CONVTUNE_TUNE_OVERLAP=1 makes a CPU adapter compile each batch while the one before is
    # measured, as GPUs do by default: the same guarantees either way.
    monkeypatch.setenv("CONVTUNE_TUNE_OVERLAP", overlap)
    monkeypatch.setenv("CONVTUNE_TUNE_BUDGET", "0.5")
    _convtune._inject_faulty_candidate(True)
    calls = []
    d = _convtune.tune(((1, 4, 10, 10), (8, 4, 3, 3), (1, 1), ((1, 1), "zeros"), (1, 1), 1, None, None, "NCHW", "float32", None, 1),
                       progress=lambda *a: calls.append(a))
    cands = d["candidates"]
    assert not d["winner"].startswith("faulty")
    assert next(c for c in cands if c["name"] == d["winner"])["status"] == "ok"
    assert next(c for c in cands if c["name"].startswith("faulty:"))["status"] == "wrong"
    # Compiled candidates carry their compile time, skipped ones none.
    for c in cands:
        if c["status"] == "skipped (budget)":
            assert c["compile_ms"] is None and c["median_ms"] is None
        else:
            assert c["compile_ms"] > 0, c
    measured = [c["name"] for c in cands if c["status"] != "skipped (budget)"]
    # Progress names each timed candidate once (in the order compiles finish, ranked order
    # where they keep up).
    assert sorted(c[2] for c in calls[:-1]) == sorted(measured) and len(measured) < len(cands)
    assert sum(d["phases"].values()) == pytest.approx(d["tuning_s"], rel=0.02, abs=2e-3)
    check_conv2d(SMALL)


def test_faulty_candidate_is_absent_from_normal_runs(tuning_env):
    r = tune(SMALL)
    assert not any(c["name"].startswith("faulty") for c in r.candidates)
    assert not any(n.startswith("faulty") for n in convtune.variant_space())


def test_auto_mode_tunes_on_first_call_and_writes_the_cache(tuning_env, monkeypatch):
    monkeypatch.setenv("CONVTUNE_TUNE", "auto")
    assert not cache_file().exists()
    check_conv2d(SMALL, bias=True)
    assert len(entries()) == 1
    e = explain(SMALL, bias=True)
    assert e.source == "cache"
    assert e.variant == entries()[0]["report"]["winner"]
    # A second call of the same shape does not tune again.
    before = cache_file().stat().st_mtime_ns
    check_conv2d(SMALL, bias=True)
    assert cache_file().stat().st_mtime_ns == before


def test_cached_mode_never_tunes(tuning_env, monkeypatch):
    monkeypatch.setenv("CONVTUNE_TUNE", "cached")
    check_conv2d(SMALL)
    assert not cache_file().exists()
    e = explain(SMALL)
    assert e.source == "default" and e.report is None
    assert e.variant == convtune.default_variant((1, 4, 10, 10), (8, 4, 3, 3), padding=1)
    # An explicit tune() does tune; cached mode then uses it.
    r = tune(SMALL)
    assert explain(SMALL).source == "cache"
    assert explain(SMALL).variant == r.winner


def test_off_mode_uses_the_default_even_with_a_cache_entry(tuning_env, monkeypatch):
    tune(SMALL)
    monkeypatch.setenv("CONVTUNE_TUNE", "off")
    e = explain(SMALL)
    assert e.source == "default"
    assert e.variant == convtune.default_variant((1, 4, 10, 10), (8, 4, 3, 3), padding=1)
    check_conv2d(SMALL)
    _, times = convtune.time_variant((1, 4, 10, 10), (8, 4, 3, 3), padding=1, reps=2)
    assert len(times) == 2


def test_forced_variant_wins_over_everything(tuning_env):
    e = explain(SMALL, variant="gemm_b32x32x8_t4x4")
    assert e.source == "forced" and e.variant == "gemm_b32x32x8_t4x4"
    assert not cache_file().exists()
    x = np.ones((1, 4, 10, 10), np.float32)
    w = np.ones((8, 4, 3, 3), np.float32)
    y = convtune.conv2d(x, w, padding=1, variant="direct_wg64x1_u0_k1w1")
    assert y[0, 0, 5, 5] == 36.0
    assert not cache_file().exists()


def test_explain_contents(tuning_env):
    e = explain(STRIDED, bias=True)
    assert isinstance(e, convtune.Explanation)
    assert e.source == "tuned" and e.mode == "auto"
    assert e.knobs["family"] in {"direct", "stem", "gemm"} and len(e.knobs) > 1
    assert e.knobs == convtune.variant_knobs(e.variant)
    assert "@compute" in e.wgsl and e.variant in e.wgsl
    assert e.report is not None and e.report.winner == e.variant
    assert e.candidates and all(c["status"] in STATUSES for c in e.candidates)
    assert any(c["median_ms"] is not None for c in e.candidates)
    assert e.variant in str(e)
    again = explain(STRIDED, bias=True)
    assert again.source == "cache" and again.variant == e.variant
    assert [c["name"] for c in again.candidates] == [c["name"] for c in e.candidates]


def test_conv2d_is_correct_for_tuned_shapes(tuning_env):
    for case in (SMALL, OTHER, STRIDED):
        check_conv2d(case, bias=True)
        assert explain(case, bias=True).source == "cache"


def test_print_tuning_prints_one_line_per_tuned_shape(tuning_env, monkeypatch, capfd):
    monkeypatch.setenv("CONVTUNE_PRINT_TUNING", "1")
    check_conv2d(SMALL)
    check_conv2d(SMALL)
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("convtune: tuned")]
    assert len(lines) == 1, err
    assert "1x4x10x10 k8 3x3" in lines[0] and "over default" in lines[0] and "tuning" in lines[0]


def test_progress_callback_sees_every_candidate(tuning_env):
    calls = []
    d = _convtune.tune(((1, 4, 10, 10), (8, 4, 3, 3), (1, 1), ((1, 1), "zeros"), (1, 1), 1, None, None, "NCHW", "float32", None, 1),
                       progress=lambda *a: calls.append(a))
    total = len(d["candidates"])
    measured = [c for c in d["candidates"] if c["status"] != "skipped (budget)"]
    # One call per measured candidate (skips are not progress), then one at the end.
    done = [c[0] for c in calls]
    assert len(calls) == len(measured) + 1
    assert done[0] == 0 and done[-1] == total and done == sorted(set(done))
    # Each measured candidate named once, in the order compiles finish (on a GPU's compile
    # pool a small kernel may come out before the default).
    assert sorted(c[2] for c in calls[:-1]) == sorted(c["name"] for c in measured)
    assert d["default"] in {c[2] for c in calls}
    assert all(c[1] == total for c in calls)
    assert all(c[3] == "1x4x10x10 k8 3x3 s1 p1" for c in calls[:-1])


def test_an_exception_in_the_progress_callback_cancels_tuning(tuning_env):
    class Stop(Exception):
        pass

    def cb(done, total, name, shape):
        # After the default's report: the second candidate's, or the end's where the budget
        # let no other candidate start (a CPU adapter's first runs are costed first).
        if done >= 1:
            raise Stop("enough")

    with pytest.raises(Stop):
        _convtune.tune(((1, 4, 10, 10), (8, 4, 3, 3), (1, 1), ((1, 1), "zeros"), (1, 1), 1, None, None, "NCHW", "float32", None, 1), progress=cb)
    assert not cache_file().exists()


def test_progress_display_plain_and_quiet():
    out = io.StringIO()
    p = Progress(stream=out, force=True)
    p._open = lambda total, shape: False  # as without tqdm
    p(0, 3, "direct_wg64x1_u1_k4w1", "1x4x10x10 k8 3x3 s1 p1")
    p(1, 3, "gemm_b32x32x8_t4x4", "1x4x10x10 k8 3x3 s1 p1")
    assert "tuning 1x4x10x10 k8 3x3 s1 p1 [1/3] gemm_b32x32x8_t4x4" in out.getvalue()
    p(3, 3, "", "1x4x10x10 k8 3x3 s1 p1")
    assert out.getvalue().endswith("\r")
    quiet = io.StringIO()  # not a terminal
    Progress(stream=quiet)(0, 3, "x", "y")
    assert quiet.getvalue() == ""


def test_bad_settings_are_clear_errors(tuning_env, monkeypatch):
    with pytest.raises(ValueError, match="budget"):
        tune(SMALL, budget=-1)
    with pytest.raises(TypeError, match="budget"):
        tune(SMALL, budget="1")
    monkeypatch.setenv("CONVTUNE_TUNE_BUDGET", "soon")
    with pytest.raises(ValueError, match="CONVTUNE_TUNE_BUDGET"):
        tune(SMALL)
    monkeypatch.setenv("CONVTUNE_TUNE", "sometimes")
    with pytest.raises(ValueError, match="CONVTUNE_TUNE"):
        check_conv2d(SMALL)
    with pytest.raises(ValueError, match="CONVTUNE_TUNE"):
        explain(SMALL)
    monkeypatch.setenv("CONVTUNE_TUNE", "off")
    with pytest.raises(ValueError, match="unknown variant"):
        explain(SMALL, variant="fastest_please")
    with pytest.raises(TypeError):
        explain(SMALL, variant=3)


def test_force_retunes_and_budget_argument_wins(tuning_env):
    first = tune(SMALL)
    assert tune(SMALL).source == "cache"
    again = tune(SMALL, force=True, budget=0.0)
    assert again.source == "tuned"
    assert again.budget_s == 0.0
    assert again.tuned_at >= first.tuned_at
    assert len(entries()) == 1


@pytest.mark.parametrize("mode", [dict(precision="high"), dict(dtype="float16")])
def test_tuning_times_the_related_problems_cached_winners(tuning_env, mode):
    """A "high" or float16 tuning run times the cached winner of the same problem in float32
    "highest" whatever its budget, so a looser mode or narrower type never settles for a
    slower kernel than that run found."""
    first = tune(SMALL)
    # Make the cached winner one that a zero budget would never reach on its own.
    late = next(c["name"] for c in reversed(first.candidates)
                if c["status"] == "skipped (budget)" and c["knobs"]["family"] in {"direct", "gemm"})
    (entry,) = entries()
    entry["report"]["winner"] = late
    write_entries([entry])
    _convtune._reset_tuning_state()
    r = tune(SMALL, budget=0.0, **mode)
    assert by_name(r)[late]["status"] in {"ok", "pruned"}, by_name(r)[late]
    # Without the related entry the same run leaves that variant to the budget.
    cache_file().unlink()
    _convtune._reset_tuning_state()
    r = tune(SMALL, budget=0.0, force=True, **mode)
    assert by_name(r)[late]["status"] == "skipped (budget)"
