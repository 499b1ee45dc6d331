"""CONVTUNE_FAMILIES: the kernel families the tuner and the default rule may choose from.

SMALL is a shape whose default rule picks a direct kernel, so restricting to gemm changes
every choice made for it.
"""

from __future__ import annotations

import pytest

import convtune
from convtune import _convtune
from convtune.__main__ import main
from tuning_support import (  # noqa: F401  (tuning_env is a fixture)
    SMALL,
    check_conv2d,
    entries,
    explain,
    tune,
    tuning_env,
    write_entries,
)

X, W, KW = SMALL
# Every family, in the list's order; the rest when CONVTUNE_FAMILIES allows gemm only.
ALL = ["direct", "stem", "gemm", "coop", "wino", "tconv", "wgemm", "wcoop", "dwise"]
OTHERS = ", ".join(f for f in ALL if f != "gemm")


def families_of(report):
    return {c["knobs"]["family"] for c in report.candidates if c["status"] != "skipped (budget)"}


@pytest.mark.parametrize("value", ["winograd", "direct,fft", "Direct;gemm", ","])
def test_unknown_names_raise_value_error_naming_the_accepted_ones(tuning_env, monkeypatch, value):
    monkeypatch.setenv("CONVTUNE_FAMILIES", value)
    calls = [
        lambda: convtune.default_variant(X, W, **KW),
        lambda: tune(SMALL),
        lambda: explain(SMALL),
        lambda: check_conv2d(SMALL),
        lambda: convtune.conv2d(*[__import__("numpy").ones(s, "float32") for s in (X, W)], **KW,
                                variant="direct_wg64x1_u1_k4w1"),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="CONVTUNE_FAMILIES") as e:
            call()
        assert ", ".join(ALL) in str(e.value)


def test_names_are_case_and_space_insensitive(tuning_env, monkeypatch):
    monkeypatch.setenv("CONVTUNE_FAMILIES", " GEMM , ")
    assert convtune.default_variant(X, W, **KW).startswith("gemm_")
    assert _convtune.families() == (["gemm"], [f for f in ALL if f != "gemm"])
    monkeypatch.setenv("CONVTUNE_FAMILIES", "  ")  # blank: no restriction
    assert _convtune.families()[1] == []


def test_restriction_holds_for_default_tuning_and_conv2d(tuning_env, monkeypatch):
    assert not convtune.default_variant(X, W, **KW).startswith("gemm_")
    monkeypatch.setenv("CONVTUNE_FAMILIES", "gemm")
    default = convtune.default_variant(X, W, **KW)
    assert default.startswith("gemm_")
    r = tune(SMALL)
    assert r.default == default
    assert families_of(r) == {"gemm"}
    assert r.winner.startswith("gemm_") and r.families == ["gemm"]
    assert "families gemm" in str(r)
    # conv2d runs the tuned gemm winner and is correct.
    check_conv2d(SMALL)
    assert explain(SMALL).variant == r.winner
    monkeypatch.setenv("CONVTUNE_TUNE", "off")
    e = explain(SMALL)
    assert (e.source, e.variant) == ("default", default)
    check_conv2d(SMALL)


def test_cache_never_returns_a_winner_of_an_excluded_family(tuning_env, monkeypatch):
    monkeypatch.setenv("CONVTUNE_FAMILIES", "direct")
    direct = tune(SMALL)
    assert direct.winner.startswith("direct_") and direct.source == "tuned"
    monkeypatch.setenv("CONVTUNE_FAMILIES", "gemm")
    gemm = tune(SMALL)
    assert gemm.source == "tuned" and gemm.winner.startswith("gemm_")
    # Each allowed set has its own entry; the unrestricted one is a third.
    monkeypatch.delenv("CONVTUNE_FAMILIES")
    assert tune(SMALL).source == "tuned"
    keys = sorted(str(e["key"].get("families")) for e in entries())
    assert keys == ["None", "direct", "gemm"]
    monkeypatch.setenv("CONVTUNE_FAMILIES", "direct")
    again = tune(SMALL)
    assert again.source == "cache" and again.winner == direct.winner


def test_a_hand_edited_entry_with_an_excluded_winner_is_ignored(tuning_env, monkeypatch):
    monkeypatch.setenv("CONVTUNE_FAMILIES", "gemm")
    tune(SMALL)
    (entry,) = entries()
    entry["report"]["winner"] = "direct_wg64x1_u1_k4w1"
    write_entries([entry])
    _convtune._reset_tuning_state()
    monkeypatch.setenv("CONVTUNE_TUNE", "cached")
    with pytest.warns(convtune.ConvtuneWarning, match="excluded by CONVTUNE_FAMILIES"):
        e = explain(SMALL)
    assert e.source == "default" and e.family == "gemm"


def test_explain_names_excluded_families_and_a_forced_variant_still_runs(tuning_env, monkeypatch):
    monkeypatch.setenv("CONVTUNE_TUNE", "off")
    e = explain(SMALL)
    assert e.excluded == [] and e.families == ALL
    assert "CONVTUNE_FAMILIES" not in str(e)
    monkeypatch.setenv("CONVTUNE_FAMILIES", "gemm")
    e = explain(SMALL)
    assert e.families == ["gemm"] and e.excluded == [f for f in ALL if f != "gemm"]
    assert f"CONVTUNE_FAMILIES excludes {OTHERS}" in str(e)
    forced = explain(SMALL, variant="direct_wg64x1_u1_k4w1")
    assert (forced.source, forced.family) == ("forced", "direct")
    assert "asked for by name" in str(forced)
    import numpy as np
    from convtune.reference import conv2d_reference, max_relative_error

    rng = np.random.default_rng(1)
    x = rng.standard_normal(X).astype(np.float32)
    w = rng.standard_normal(W).astype(np.float32)
    y = convtune.conv2d(x, w, **KW, variant="direct_wg64x1_u1_k4w1")
    assert max_relative_error(y, conv2d_reference(x, w, 1, 1)) <= 1e-5


def test_families_that_cannot_run_here_raise_a_clear_error(tuning_env, monkeypatch):
    if convtune.adapter_info()["features"]["tensor_cores"]:
        pytest.skip("the adapter runs the tensor-core family")
    monkeypatch.setenv("CONVTUNE_FAMILIES", "coop")
    for call in (lambda: convtune.default_variant(X, W, **KW), lambda: tune(SMALL), lambda: check_conv2d(SMALL)):
        with pytest.raises(ValueError, match="CONVTUNE_FAMILIES=coop leaves no kernel variant") as e:
            call()
        assert "cooperative" in str(e.value)


def test_a_family_that_cannot_compute_the_shape_raises_a_clear_error(tuning_env, monkeypatch):
    """Winograd alone on a 1x1 problem: no variant computes it, and the error says so."""
    monkeypatch.setenv("CONVTUNE_FAMILIES", "wino")
    with pytest.raises(ValueError, match="CONVTUNE_FAMILIES=wino leaves no kernel variant") as e:
        convtune.default_variant((1, 4, 8, 8), (4, 4, 1, 1))
    assert "wino: no variant computes this shape" in str(e.value)
    # On a 3x3 stride-1 problem it is the default, and tuning stays within it.
    assert convtune.default_variant(X, W, **KW).startswith("wino_")
    r = tune(SMALL)
    assert families_of(r) == {"wino"} and r.winner.startswith("wino_")
    check_conv2d(SMALL)


def test_cli_reports_the_families(tuning_env, monkeypatch, capsys):
    monkeypatch.setenv("CONVTUNE_FAMILIES", "gemm")
    assert main(["info"]) == 0
    assert f"kernel families: gemm (CONVTUNE_FAMILIES excludes {OTHERS})" in capsys.readouterr().out
    assert main(["tune", "--families", "gemm,nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown kernel family \"nope\"" in err and "Traceback" not in err
