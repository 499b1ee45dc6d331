"""The Winograd F(2x2, 3x3) and F(4x4, 3x3) family: every variant on 3x3 stride-1 shapes (odd and even output
sizes, padding 0 to 2, groups, C and K off the tile sizes, several images), with and without
the fused epilogue, in both layouts and on float16 data, against the float64 reference with
poisoned outputs (conftest); and its refusal of shapes it cannot compute."""

from __future__ import annotations

import numpy as np
import pytest

import convtune
from convtune.reference import apply_epilogue, conv2d_reference
from reference import check_close, check_same_non_finites, nhwc

WINO = [v for v in convtune.variant_space() if v.startswith("wino_")]
F16 = convtune.adapter_info()["features"]["shader_f16"]

# x, w, conv2d keywords. Each variant runs every case (each a fresh shader on lavapipe, so
# the list is short and each case covers several properties).
CASES = [
    # Groups 2, odd OH (11) and even OW (4: padding 0 on the columns), C/groups 3, K/groups 5.
    ((2, 6, 9, 6), (10, 3, 3, 3), dict(padding=(2, 0), groups=2)),
    # C and K past one tile and off every chunk and channel tile, odd OH and OW, padding 0,
    # three images: the last workgroup's tiles run past the end.
    ((3, 37, 11, 7), (41, 37, 3, 3), dict(padding=0)),
]


def _inputs(rng, xs, ws):
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    return x, w, b


def test_family_is_listed():
    assert len(WINO) >= 4 and len(WINO) <= 12
    for name in WINO:
        k = convtune.variant_knobs(name)
        suffix = "" if k["m"] == 2 else f"_m{k['m']}"
        assert k["family"] == "wino" and name == f"wino_t{k['bt']}x{k['bn']}_c{k['bc']}_r{k['tt']}x{k['tk']}{suffix}"
    assert {convtune.variant_knobs(n)["m"] for n in WINO} == {2, 4}


@pytest.mark.parametrize("variant", WINO)
def test_every_variant_matches_the_reference(variant):
    rng = np.random.default_rng(abs(hash(variant)) % 2**32)
    for xs, ws, kw in CASES:
        x, w, b = _inputs(rng, xs, ws)
        got = convtune.conv2d(x, w, bias=b, variant=variant, **kw)
        check_close(got, conv2d_reference(x, w, bias=b, **kw), context=f"{variant} {xs} {ws} {kw}")


@pytest.mark.parametrize("variant", WINO)
def test_every_variant_applies_the_epilogue_in_nhwc(variant):
    """bias + residual z + relu in the store, on channels-last x and y, padding 1."""
    rng = np.random.default_rng(abs(hash(("epi", variant))) % 2**32)
    xs, ws, kw = (2, 5, 7, 8), (6, 5, 3, 3), dict(padding=1)
    x, w, b = _inputs(rng, xs, ws)
    conv = conv2d_reference(x, w, **kw)
    z = rng.standard_normal(conv.shape).astype(np.float32)
    want = apply_epilogue(conv, b, z=z, alpha1=0.5, alpha2=-2.0, activation="relu")
    for layout, t in (("NCHW", lambda a: a), ("NHWC", nhwc)):
        got = convtune.conv2d(t(x), w, bias=b, z=t(z), alpha1=0.5, alpha2=-2.0, activation="relu",
                              layout=layout, variant=variant, **kw)
        pre = np.abs(apply_epilogue(conv, b, z=z, alpha1=0.5, alpha2=-2.0)).max()
        check_close(got, t(want), context=f"{variant} {layout}", rtol=1e-5 * max(1.0, pre / np.abs(want).max()))


@pytest.mark.skipif(not F16, reason="the adapter has no 16-bit shader floats")
@pytest.mark.parametrize("variant", WINO)
def test_every_variant_computes_float16(variant):
    rng = np.random.default_rng(abs(hash(("f16", variant))) % 2**32)
    xs, ws, kw = (2, 8, 9, 10), (12, 4, 3, 3), dict(padding=1, groups=2)
    x = rng.standard_normal(xs).astype(np.float16)
    w = (rng.standard_normal(ws) / 6).astype(np.float16)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    want = conv2d_reference(x, w, bias=b, **kw)
    got = convtune.conv2d(x, w, bias=b, variant=variant, **kw)
    assert got.dtype == np.float16
    err = np.abs(got.astype(np.float64) - want).max() / np.abs(want).max()
    assert err <= 4 * 2.0**-11, (variant, err)


# Dilated 3x3 layers are taken (tests/test_dilated_winograd.py).
@pytest.mark.parametrize("kw, ws", [
    (dict(stride=2, padding=1), (4, 3, 3, 3)),
    (dict(padding=1), (4, 3, 5, 5)),
    (dict(padding=1), (4, 3, 3, 1)),
])
def test_shapes_other_than_3x3_stride_1_are_refused(kw, ws):
    x = np.ones((1, 3, 9, 9), np.float32)
    w = np.ones(ws, np.float32)
    with pytest.raises(ValueError, match="cannot run on this shape"):
        convtune.conv2d(x, w, variant=WINO[0], **kw)


def test_a_split_problem_runs_in_pieces(monkeypatch):
    """A problem over one binding runs as row bands with their own (asymmetric) padding; the
    filters are transformed again for each."""
    import os
    import subprocess
    import sys

    script = (
        "import numpy as np, convtune\n"
        "from convtune.reference import conv2d_reference, max_relative_error\n"
        "convtune._convtune._set_poison(True)\n"
        "rng = np.random.default_rng(5)\n"
        "x = rng.standard_normal((2, 3, 37, 29), dtype=np.float32)\n"
        "w = rng.standard_normal((5, 3, 3, 3), dtype=np.float32)\n"
        f"y = convtune.conv2d(x, w, padding=2, variant={WINO[0]!r})\n"
        "print(max_relative_error(y, conv2d_reference(x, w, padding=2)))\n"
    )
    env = dict(os.environ, CONVTUNE_MAX_BINDING="6000")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert float(r.stdout.strip()) <= 1e-5


@pytest.mark.parametrize("variant", WINO)
def test_inf_and_nan_come_out_as_in_the_direct_method(variant):
    """The transforms subtract an infinite input from itself and mix a NaN into neighbouring
    outputs; outputs that come out Inf or NaN are summed again the direct way, so every
    output is +-Inf, NaN or finite exactly where the float64 reference is."""
    rng = np.random.default_rng(10)
    x = rng.standard_normal((2, 5, 9, 10)).astype(np.float32)
    w = rng.standard_normal((6, 5, 3, 3)).astype(np.float32)
    x[0, 1, 3, 4] = np.inf
    x[1, 2, 0, 0] = -np.inf
    x[1, 4, 8, 9] = np.nan
    w[3, 2, 1, 1] = np.inf
    b = rng.standard_normal(6).astype(np.float32)
    with np.errstate(all="ignore"):
        want = conv2d_reference(x, w, bias=b, padding=1)
    got = convtune.conv2d(x, w, bias=b, padding=1, variant=variant)
    assert np.isnan(want).any() and np.isposinf(want).any() and np.isneginf(want).any()
    fin = check_same_non_finites(got, want)
    check_close(np.where(fin, got, 0), np.where(fin, want, 0))


def test_a_nan_alone_changes_only_the_outputs_it_covers():
    """With 4x4 tiles a NaN reaches every output of the tiles whose patches hold it before
    the direct re-sum; after it, only the outputs whose window holds it."""
    m4 = [v for v in WINO if convtune.variant_knobs(v)["m"] == 4][0]
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 4, 13, 14)).astype(np.float32)
    w = rng.standard_normal((3, 4, 3, 3)).astype(np.float32)
    x[0, 2, 6, 7] = np.nan
    want = np.isnan(conv2d_reference(x, w, padding=1))
    got = np.isnan(convtune.conv2d(x, w, padding=1, variant=m4))
    np.testing.assert_array_equal(got, want)

