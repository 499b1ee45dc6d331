"""The stem family (direct convolution over a short reduction, weights staged per workgroup):
every variant against the float64 reference with poisoned outputs (conftest), on rows of
vec4s and of scalars, strides, dilation, padding past the edges and channel counts off its
tiles; the fused epilogue in both layouts; float16 data; pixel shuffles and transposed
convolutions in their lowered form (scattered stores); Inf and NaN; its refusals."""

from __future__ import annotations

import numpy as np
import pytest

import convtune
from convtune.reference import conv2d_reference, conv_transpose2d_reference, pixel_shuffle_reference
from reference import (swept,
    check_close, check_epilogue_in_both_layouts, check_same_non_finites,
    non_finite_inputs, nhwc, random_conv_inputs,
)
from tuning_support import tuning_env  # noqa: F401  (a fixture)

STEM = [v for v in convtune.variant_space() if v.startswith("stem_")]
F16 = convtune.adapter_info()["features"]["shader_f16"]
HALF_BOUND = 4 * 2.0**-11

# x, w, conv2d keywords. Rows of whole vec4s (W 16, 20) at strides 1 and 2, with the first
# column of each invocation at every distance past a vec4 boundary (padding 0 to 3); rows of
# scalars (W 13); dilation; K off every channel tile (10, 6); outputs off every column tile.
CASES = [
    ((2, 3, 9, 16), (10, 3, 3, 3), dict(padding=1)),
    ((1, 3, 19, 20), (6, 3, 7, 7), dict(stride=2, padding=3)),
    ((2, 2, 11, 13), (12, 2, 3, 3), dict(padding=(0, 2), dilation=(1, 2))),
    ((1, 4, 8, 12), (9, 4, 5, 5), dict(stride=(1, 2), padding=2)),
]


def test_family_is_listed():
    assert 50 <= len(STEM) <= 80
    for name in STEM:
        k = convtune.variant_knobs(name)
        assert k["family"] == "stem"
        assert name == f"stem_wg{k['wg']}_u{k['unroll']}_k{k['tk']}w{k['tw']}"
        assert k["tk"] % 4 == 0


@pytest.mark.parametrize("variant", swept(STEM, 24))
def test_every_variant_matches_the_reference(variant):
    # Two of the four cases per variant, alternating: each case runs on half the variants;
    # the largest written-out variants take the 3x3 cases only (their 5x5 and 7x7 windows,
    # thousands of written-out statements, take lavapipe's compiler seconds each).
    rng = np.random.default_rng(abs(hash(variant)) % 2**32)
    k = convtune.variant_knobs(variant)
    cases = CASES[0::2] if k["unroll"] == 1 and k["tk"] * k["tw"] > 16 else CASES[STEM.index(variant) % 2::2]
    for xs, ws, kw in cases:
        x, w, b = random_conv_inputs(rng, xs, ws, True)
        got = convtune.conv2d(x, w, bias=b, variant=variant, precision="highest", **kw)
        check_close(got, conv2d_reference(x, w, bias=b, **kw), context=f"{variant} {xs} {ws} {kw}")


@pytest.mark.parametrize("variant", swept(STEM, 24))
def test_every_variant_applies_the_epilogue_in_both_layouts(variant):
    """bias + residual z + activation in the store, on channels-first and channels-last x, y
    and z; K = 8 stores whole vec4s of channels in NHWC, W = 12 whole vec4s of columns in
    NCHW where the variant's column tile is."""
    rng = np.random.default_rng(abs(hash(("epi", variant))) % 2**32)
    x, w, b = random_conv_inputs(rng, (2, 3, 7, 12), (8, 3, 3, 3), True)
    check_epilogue_in_both_layouts(rng, x, w, b, dict(padding=1), 1e-5, ("silu", "leaky_relu"), variant=variant)


@pytest.mark.skipif(not F16, reason="the adapter has no 16-bit shader floats")
@pytest.mark.parametrize("variant", STEM[::3])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_float16_data(variant, layout):
    rng = np.random.default_rng(abs(hash(("f16", variant, layout))) % 2**32)
    xs, ws, kw = (2, 3, 10, 16), (12, 3, 3, 3), dict(padding=1)
    x = rng.standard_normal(xs).astype(np.float16)
    w = (rng.standard_normal(ws) / 5).astype(np.float16)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    want = conv2d_reference(x, w, bias=b, **kw)
    t = nhwc if layout == "NHWC" else (lambda a: a)
    got = convtune.conv2d(t(x), w, bias=b, variant=variant, layout=layout, **kw)
    assert got.dtype == np.float16
    err = np.abs(got.astype(np.float64) - t(want)).max() / np.abs(want).max()
    assert err <= HALF_BOUND, (variant, layout, err)


@pytest.mark.parametrize("variant", STEM[::5])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_pixel_shuffle_and_transposed_convolutions_scatter_their_stores(variant, layout):
    rng = np.random.default_rng(abs(hash(("moved", variant, layout))) % 2**32)
    t = nhwc if layout == "NHWC" else (lambda a: a)
    x, w, b = random_conv_inputs(rng, (2, 3, 6, 8), (12, 3, 3, 3), True)
    want = pixel_shuffle_reference(conv2d_reference(x, w, bias=b, padding=1), 2)
    got = convtune.conv2d(t(x), w, bias=b, padding=1, pixel_shuffle=2, layout=layout, variant=variant)
    check_close(got, t(want), context=f"{variant} shuffle {layout}")
    # A 4x4 stride-2 decoder of 3 input channels: lowered to 2x2 over 4 phases, 12 taps.
    x, w, _ = random_conv_inputs(rng, (1, 3, 5, 7), (3, 4, 4, 4), False)
    b = rng.standard_normal(4).astype(np.float32)
    want = conv_transpose2d_reference(x, w, bias=b, stride=2, padding=1)
    got = convtune.conv_transpose2d(t(x), w, bias=b, stride=2, padding=1, layout=layout, variant=variant)
    check_close(got, t(want), context=f"{variant} transposed {layout}")


@pytest.mark.parametrize("variant", STEM[::4])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_inf_and_nan_come_out_as_in_the_direct_method(variant, layout):
    """Padding multiplies an infinite weight by zero: NaN, as the reference's zero padding
    gives; an infinite input reaches exactly the outputs whose windows hold it."""
    x, w = non_finite_inputs(np.random.default_rng(10), (1, 3, 8, 12), (8, 3, 3, 3))
    with np.errstate(all="ignore"):
        want = conv2d_reference(x, w, padding=1)
    t = nhwc if layout == "NHWC" else (lambda a: a)
    got = convtune.conv2d(t(x), w, padding=1, layout=layout, variant=variant)
    want = t(want)
    assert np.isnan(want).any() and np.isposinf(want).any()
    fin = check_same_non_finites(got, want)
    check_close(np.where(fin, got, 0), np.where(fin, want, 0))


@pytest.mark.parametrize("xs, ws, kw", [
    ((1, 4, 8, 8), (4, 2, 3, 3), dict(groups=2, padding=1)),
    ((1, 6, 12, 12), (4, 6, 7, 7), dict(padding=3)),
])
def test_groups_and_long_reductions_are_refused(xs, ws, kw):
    x = np.ones(xs, np.float32)
    w = np.ones(ws, np.float32)
    with pytest.raises(ValueError, match="cannot run on this shape.*stem family"):
        convtune.conv2d(x, w, variant=STEM[0], **kw)


def test_the_tuner_offers_it_on_stems_only(tuning_env):
    """Its likeliest variant is timed on a 3-channel stem (each family's first candidate comes
    early; on a CPU adapter only the default is timed whatever the budget, so the budget
    leaves room for a few first-run compiles), and it is no candidate where the reduction is
    deep."""
    stem = convtune.tune((1, 3, 32, 32), (16, 3, 3, 3), padding=1, budget=2.0)
    deep = convtune.tune((1, 64, 16, 16), (64, 64, 3, 3), padding=1, budget=0.3)
    assert any(c["name"].startswith("stem_") and c["status"] == "ok" for c in stem.candidates)
    assert not any(c["name"].startswith("stem_") for c in deep.candidates)
