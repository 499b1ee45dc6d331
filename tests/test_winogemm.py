"""The non-fused Winograd family (wgemm: F(2x2), F(4x4), F(6x6) on FMA units): every variant on
3x3 stride-1 shapes (several images, odd and even output sizes, padding 0 to 2, groups, C and K
off the tile sizes), with and without the fused epilogue, in both layouts and on float16 data,
against the float64 reference with poisoned outputs (conftest); hostile value ranges, Inf and
NaN; its refusals; F(6x6) kept out of "highest"; and chunked runs (CONVTUNE_MAX_WORKSPACE)."""

from __future__ import annotations

import numpy as np
import pytest

import convtune
from convtune.reference import conv2d_reference, pixel_shuffle_reference
from reference import check_close, check_epilogue_in_both_layouts, check_same_non_finites, nhwc
from tuning_support import tuning_env  # noqa: F401  (a fixture)

WGEMM = [v for v in convtune.variant_space() if v.startswith("wgemm_")]
F16 = convtune.adapter_info()["features"]["shader_f16"]
# One variant per tile size, for the slower cases.
PER_M = {convtune.variant_knobs(v)["m"]: v for v in reversed(WGEMM)}


def _m(variant):
    return convtune.variant_knobs(variant)["m"]


def _precision(variant):
    """F(6x6) serves "high" only (its float32 error passes 1e-5 on deep reductions)."""
    return "high" if _m(variant) == 6 else "highest"


def _bound(variant):
    # "highest"'s bound; F(6x6) measured 2.4e-5 at C = 256, far inside "high"'s 4e-3: 1e-4
    # catches a transform gone wrong that 4e-3 would let through.
    return 1e-4 if _m(variant) == 6 else 1e-5


def _inputs(rng, xs, ws):
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    return x, w, b


# x, w, conv2d keywords; each a fresh shader per variant on lavapipe, so few and mixed.
CASES = [
    # Groups 2, odd OH (11), even OW (4: padding 0 on the columns), C/groups 3, K/groups 5.
    ((2, 6, 9, 6), (10, 3, 3, 3), dict(padding=(2, 0), groups=2)),
    # C and K past one tile and off every step and channel tile, odd OH and OW, padding 0,
    # three images: tiles run past the last image's edge and the GEMMs' padding.
    ((3, 37, 11, 7), (41, 37, 3, 3), dict(padding=0)),
]


def test_family_is_listed():
    assert 6 <= len(WGEMM) <= 10
    for name in WGEMM:
        k = convtune.variant_knobs(name)
        assert k["family"] == "wgemm"
        assert name == f"wgemm_m{k['m']}_b{k['bm']}x{k['bn']}x{k['bk']}_t{k['tm']}x{k['tn']}"
    assert set(PER_M) == {2, 4, 6}


@pytest.mark.parametrize("variant", WGEMM)
def test_every_variant_matches_the_reference(variant):
    rng = np.random.default_rng(abs(hash(variant)) % 2**32)
    for xs, ws, kw in CASES:
        x, w, b = _inputs(rng, xs, ws)
        got = convtune.conv2d(x, w, bias=b, variant=variant, precision=_precision(variant), **kw)
        check_close(got, conv2d_reference(x, w, bias=b, **kw), context=f"{variant} {xs} {ws} {kw}",
                    rtol=_bound(variant))


@pytest.mark.parametrize("variant", WGEMM)
def test_every_variant_applies_the_epilogue_in_both_layouts(variant):
    """bias + residual z + activation in finish's store, padding 1, on channels-first and
    channels-last x, y and z."""
    rng = np.random.default_rng(abs(hash(("epi", variant))) % 2**32)
    x, w, b = _inputs(rng, (2, 5, 7, 8), (6, 5, 3, 3))
    check_epilogue_in_both_layouts(rng, x, w, b, dict(padding=1), _bound(variant), variant=variant,
                                   precision=_precision(variant))


@pytest.mark.parametrize("m", [2, 4, 6])
def test_pixel_shuffle_is_stored_through_the_shared_store(m):
    variant = PER_M[m]
    rng = np.random.default_rng(20 + m)
    x, w, b = _inputs(rng, (2, 4, 7, 6), (8, 4, 3, 3))
    want = pixel_shuffle_reference(conv2d_reference(x, w, bias=b, padding=1), 2)
    got = convtune.conv2d(nhwc(x), w, bias=b, padding=1, pixel_shuffle=2, layout="NHWC", variant=variant,
                          precision=_precision(variant))
    check_close(got, nhwc(want), context=variant, rtol=_bound(variant))


@pytest.mark.skipif(not F16, reason="the adapter has no 16-bit shader floats")
@pytest.mark.parametrize("variant", WGEMM)
def test_every_variant_computes_float16(variant):
    rng = np.random.default_rng(abs(hash(("f16", variant))) % 2**32)
    xs, ws, kw = (2, 8, 9, 10), (12, 4, 3, 3), dict(padding=1, groups=2)
    x = rng.standard_normal(xs).astype(np.float16)
    w = (rng.standard_normal(ws) / 6).astype(np.float16)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    want = conv2d_reference(x, w, bias=b, **kw)
    # The layouts alternate over the variants: each runs one, both are covered per m.
    nhwc_layout = WGEMM.index(variant) % 2 == 1 or _m(variant) == 6
    t, layout = (nhwc, "NHWC") if nhwc_layout else ((lambda a: a), "NCHW")
    got = convtune.conv2d(t(x), w, bias=b, variant=variant, layout=layout, **kw)
    assert got.dtype == np.float16
    err = np.abs(got.astype(np.float64) - t(want)).max() / np.abs(want).max()
    assert err <= 4 * 2.0**-11, (variant, layout, err)


# Dilated 3x3 layers are taken (tests/test_dilated_winograd.py), and 5x5 ones by F(2x2)
# (tests/test_winograd_5x5.py).
@pytest.mark.parametrize("kw, ws", [
    (dict(stride=2, padding=1), (4, 3, 3, 3)),
    (dict(padding=1), (4, 3, 7, 7)),
    (dict(stride=2, padding=1), (4, 3, 5, 5)),
    (dict(padding=1), (4, 3, 3, 1)),
])
def test_shapes_other_than_3x3_and_5x5_stride_1_are_refused(kw, ws):
    x = np.ones((1, 3, 9, 9), np.float32)
    w = np.ones(ws, np.float32)
    with pytest.raises(ValueError, match="cannot run on this shape"):
        convtune.conv2d(x, w, variant=WGEMM[0], **kw)


@pytest.mark.parametrize("xs, wsc", [(1e-30, 1.0), (1e30, 1e-30), (1e-20, 1e-15), (1e18, 1e15)])
@pytest.mark.parametrize("m", [2, 4, 6])
def test_any_value_range_meets_the_bound(m, xs, wsc):
    """Tiny and huge inputs: nothing flushed to zero where the result is not tiny, and where a
    transform overflows (F(6x6)'s at 1e18 x 1e15: A^T's 32s over sums of 1e35) the direct
    re-sum in finish gives the finite result."""
    variant = PER_M[m]
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((2, 16, 10, 10)) * xs).astype(np.float32)
    w = (rng.standard_normal((16, 16, 3, 3)) * wsc).astype(np.float32)
    got = convtune.conv2d(x, w, padding=1, variant=variant, precision=_precision(variant))
    want = conv2d_reference(x, w, padding=1)
    assert np.all(np.isfinite(got))
    big = np.abs(want) > 1e-3 * np.abs(want).max()
    assert np.all(got[big] != 0)
    check_close(got, want, context=f"{variant} {xs} {wsc}", rtol=_bound(variant))


@pytest.mark.parametrize("variant", [PER_M[2], PER_M[4], PER_M[6]])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_inf_and_nan_come_out_as_in_the_direct_method(variant, layout):
    """The transforms subtract an infinite input from itself and mix a NaN into neighbouring
    outputs; outputs that come out Inf or NaN are summed again the direct way, so every output
    is +-Inf, NaN or finite exactly where the float64 reference is."""
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
    t = nhwc if layout == "NHWC" else (lambda a: a)
    got = convtune.conv2d(t(x), w, bias=b, padding=1, layout=layout, variant=variant,
                          precision=_precision(variant))
    want = t(want)
    assert np.isnan(want).any() and np.isposinf(want).any() and np.isneginf(want).any()
    fin = check_same_non_finites(got, want)
    check_close(np.where(fin, got, 0), np.where(fin, want, 0), rtol=_bound(variant))


def test_a_nan_alone_changes_only_the_outputs_it_covers():
    """With 6x6 tiles a NaN reaches every output of the tiles whose patches hold it before
    the direct re-sum; after it, only the outputs whose window holds it."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 4, 13, 14)).astype(np.float32)
    w = rng.standard_normal((3, 4, 3, 3)).astype(np.float32)
    x[0, 2, 6, 7] = np.nan
    want = np.isnan(conv2d_reference(x, w, padding=1))
    got = np.isnan(convtune.conv2d(x, w, padding=1, variant=PER_M[6], precision="high"))
    np.testing.assert_array_equal(got, want)


def test_tuning_keeps_f6_out_of_highest(tuning_env, monkeypatch):
    """Only the family's own candidates (CONVTUNE_FAMILIES), which the tuner checks against
    the reference: F(6x6) is a candidate for "high" and never for "highest"."""
    monkeypatch.setenv("CONVTUNE_FAMILIES", "wgemm")
    shape = ((1, 8, 10, 10), (16, 8, 3, 3))
    names = {}
    for precision in ("highest", "high"):
        report = convtune.tune(*shape, padding=1, precision=precision, budget=0.5)
        names[precision] = {c["name"] for c in report.candidates}
        assert report.winner.startswith("wgemm_")
    assert not any(_m(n) == 6 for n in names["highest"]), names["highest"]
    assert any(_m(n) == 6 for n in names["high"]), names["high"]


# --- Chunks: CONVTUNE_MAX_WORKSPACE lowers the workspace bound so small problems run in chunks
# (or raises it, within the adapter's largest binding).

def _ceil_to(v, q):
    return -(-v // q) * q


def _chunking(variant, xs, ws, padding, groups):
    """The smallest CONVTUNE_MAX_WORKSPACE that holds U and one GEMM tile (BM tiles) of V and M
    (each chunk is then BM tiles), the chunks and the tiles of the last one (as in
    src/kernels/winogemm.rs)."""
    k = convtune.variant_knobs(variant)
    m, bm, bn, bk = k["m"], k["bm"], k["bn"], k["bk"]
    n, c, h, w = xs
    oh, ow = h + 2 * padding - 2, w + 2 * padding - 2
    tiles = n * -(-oh // m) * -(-ow // m)
    planes = groups * (m + 2) ** 2
    cp, np_ = _ceil_to(c // groups, bk), _ceil_to(ws[0] // groups, bn)
    cap = max(4 * planes * cp * (np_ + bm), 4 * planes * np_ * bm)
    return cap, -(-tiles // bm), tiles - bm * (-(-tiles // bm) - 1)


# Three images, groups 2, C/groups 3, K/groups 5, odd output sizes: every variant's tiles
# run past one GEMM tile (BM up to 128) and leave the last chunk partial.
CHUNKED = ((3, 6, 27, 25), (10, 3, 3, 3), 1, 2)


@pytest.mark.parametrize("variant", WGEMM)
def test_chunked_runs_match_the_reference(variant, monkeypatch):
    xs, ws, padding, groups = CHUNKED
    cap, chunks, last = _chunking(variant, xs, ws, padding, groups)
    assert chunks >= 2 and last < convtune.variant_knobs(variant)["bm"], (chunks, last)
    rng = np.random.default_rng(abs(hash(("chunks", variant))) % 2**32)
    x, w, b = _inputs(rng, xs, ws)
    want = conv2d_reference(x, w, bias=b, padding=padding, groups=groups)
    monkeypatch.setenv("CONVTUNE_MAX_WORKSPACE", str(cap))
    got = convtune.conv2d(x, w, bias=b, padding=padding, groups=groups, variant=variant,
                          precision=_precision(variant))
    check_close(got, want, context=f"{variant} in {chunks} chunks", rtol=_bound(variant))
    # A word less and one GEMM tile no longer fits: the bound reaches the generator.
    monkeypatch.setenv("CONVTUNE_MAX_WORKSPACE", str(cap - 4))
    with pytest.raises(ValueError, match="bytes of workspace"):
        convtune.conv2d(x, w, bias=b, padding=padding, groups=groups, variant=variant,
                        precision=_precision(variant))


@pytest.mark.parametrize("m", [2, 4])
def test_a_bound_raised_past_the_adapters_binding_is_held_to_it(m, monkeypatch):
    """CONVTUNE_MAX_WORKSPACE may raise the bound (fewer chunks, more memory); past the
    adapter's largest storage binding it is held there, and the result does not change."""
    variant = PER_M[m]
    xs, ws, padding, groups = CHUNKED
    rng = np.random.default_rng(20 + m)
    x, w, b = _inputs(rng, xs, ws)
    want = conv2d_reference(x, w, bias=b, padding=padding, groups=groups)
    monkeypatch.setenv("CONVTUNE_MAX_WORKSPACE", str(2**50))
    got = convtune.conv2d(x, w, bias=b, padding=padding, groups=groups, variant=variant,
                          precision=_precision(variant))
    check_close(got, want, context=f"{variant} at a raised bound", rtol=_bound(variant))


@pytest.mark.parametrize("m", [2, 4, 6])
def test_chunked_runs_apply_the_epilogue_in_both_layouts(m, monkeypatch):
    variant = PER_M[m]
    xs, ws, padding, groups = CHUNKED
    cap, chunks, _ = _chunking(variant, xs, ws, padding, groups)
    assert chunks >= 2
    monkeypatch.setenv("CONVTUNE_MAX_WORKSPACE", str(cap))
    rng = np.random.default_rng(30 + m)
    x, w, b = _inputs(rng, xs, ws)
    check_epilogue_in_both_layouts(rng, x, w, b, dict(padding=padding, groups=groups), _bound(variant),
                                   ("relu", "silu"), variant=variant, precision=_precision(variant))


@pytest.mark.skipif(not F16, reason="the adapter has no 16-bit shader floats")
@pytest.mark.parametrize("m", [2, 4, 6])
def test_chunked_runs_compute_float16(m, monkeypatch):
    variant = PER_M[m]
    xs, ws, padding, groups = CHUNKED
    cap, chunks, _ = _chunking(variant, xs, ws, padding, groups)
    assert chunks >= 2
    monkeypatch.setenv("CONVTUNE_MAX_WORKSPACE", str(cap))
    rng = np.random.default_rng(40 + m)
    x = rng.standard_normal(xs).astype(np.float16)
    w = (rng.standard_normal(ws) / 6).astype(np.float16)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    want = conv2d_reference(x, w, bias=b, padding=padding, groups=groups)
    t, layout = (nhwc, "NHWC") if m != 4 else ((lambda a: a), "NCHW")
    got = convtune.conv2d(t(x), w, bias=b, padding=padding, groups=groups, variant=variant, layout=layout)
    assert got.dtype == np.float16 and np.all(np.isfinite(got))
    err = np.abs(got.astype(np.float64) - t(want)).max() / np.abs(want).max()
    assert err <= 4 * 2.0**-11, (variant, layout, err)


@pytest.mark.parametrize("m", [2, 6])
def test_chunked_runs_on_device_tensors(m, monkeypatch):
    """The Tensor path records the same passes: two chunked convolutions in a row, queued
    without waits in between, each reading the other's output."""
    variant = PER_M[m]
    xs, _, padding, groups = CHUNKED
    ws = (6, 3, 3, 3)
    cap, chunks, _ = _chunking(variant, xs, ws, padding, groups)
    assert chunks >= 2
    monkeypatch.setenv("CONVTUNE_MAX_WORKSPACE", str(cap))
    rng = np.random.default_rng(50 + m)
    x, w, b = _inputs(rng, xs, ws)
    t = convtune.to_device(x)
    ref = x.astype(np.float64)
    for _ in range(2):
        t = convtune.conv2d(t, w, bias=b, padding=padding, groups=groups, variant=variant,
                            precision=_precision(variant))
        ref = conv2d_reference(ref, w, bias=b, padding=padding, groups=groups)
    check_close(t.numpy(), ref, context=f"{variant} on Tensors", rtol=2 * _bound(variant))


@pytest.mark.parametrize("variant", WGEMM[::2])
def test_a_weight_tensor_keeps_its_transformed_filters(variant, monkeypatch):
    """U, transformed once from a weight Tensor and kept with it where it has a workspace of
    its own: later calls with fresh x bind it; two problems share the tensor (each its own U),
    and a chunked run (U then shares V's workspace and is transformed every call) between."""
    rng = np.random.default_rng(abs(hash(("kept", variant))) % 2**32)
    w = (rng.standard_normal((10, 6, 3, 3)) / 4).astype(np.float32)
    wt = convtune.to_device(w)
    xs, ws, padding, groups = CHUNKED
    cap, chunks, _ = _chunking(variant, xs, ws, padding, 1)
    for rnd in range(2):
        for shape, env in [((2, 6, 9, 10), None), ((3, 6, 27, 25), str(cap)), ((1, 6, 12, 7), None)]:
            if env:
                monkeypatch.setenv("CONVTUNE_MAX_WORKSPACE", env)
            else:
                monkeypatch.delenv("CONVTUNE_MAX_WORKSPACE", raising=False)
            for call in range(2):
                x = rng.standard_normal(shape).astype(np.float32)
                got = convtune.conv2d(convtune.to_device(x), wt, padding=1, variant=variant,
                                      precision=_precision(variant)).numpy()
                check_close(got, conv2d_reference(x, w, padding=1), rtol=_bound(variant),
                            context=f"{variant} {shape} round {rnd} call {call + 1}")
