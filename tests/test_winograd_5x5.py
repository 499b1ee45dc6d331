"""5x5 convolutions at stride 1 in the Winograd-GEMM family, F(2x2, 5x5): 36 products per
2x2 outputs where the direct sum takes 100, at F(4x4, 3x3)'s interpolation points (the same
input transform). Every result against float64 on poisoned outputs: several channel counts
and paddings, dilated ones (their phases), both layouts, float16 with the fused epilogue, the
padding modes, NaN/Inf where the reference has them, and "highest"'s bound at many channels."""

from __future__ import annotations

import numpy as np
import pytest

import convtune
from convtune.reference import conv2d_reference
from reference import check_same_non_finites, forced_conv, forced_conv_within, nhwc

VARIANTS = ["wgemm_m2_b32x32x8_t4x4", "wgemm_m2_b64x64x8_t4x4"]
SHAPES = [
    # (n, c, h, w), k, padding, dilation
    ((2, 8, 13, 11), 16, 2, 1),
    ((1, 3, 9, 10), 8, 0, 1),
    ((1, 6, 17, 19), 12, (1, 2), 1),
    ((2, 5, 12, 12), 8, 4, 2),
    ((1, 4, 16, 14), 8, (6, 3), (3, 1)),
]


def run(rng, x_shape, k, padding, dilation, variant, layout="NCHW", dt=np.float32, **call):
    return forced_conv(rng, x_shape, (k, x_shape[1], 5, 5), variant, layout, dt, padding=padding, dilation=dilation, **call)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}-k{s[1]}-p{s[2]}-d{s[3]}")
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_5x5_layers_match_float64(variant, shape, layout):
    rng = np.random.default_rng(abs(hash((variant, str(shape), layout))) % 2**32)
    x_shape, k, padding, dilation = shape
    forced_conv_within(rng, x_shape, (k, x_shape[1], 5, 5), variant, layout, 5e-6, padding=padding, dilation=dilation)


def test_many_channels_stay_within_half_of_highest_bound():
    """The tuner validates "highest" candidates at half its 1e-5 bound: F(2x2, 5x5) keeps it
    where the GEMM family does."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 256, 10, 10)).astype(np.float32)
    w = rng.standard_normal((32, 256, 5, 5)).astype(np.float32)
    want = conv2d_reference(x.astype(np.float64), w.astype(np.float64), padding=2)
    got = convtune.conv2d(x, w, padding=2, variant=VARIANTS[0], precision="highest")
    assert np.abs(got - want).max() <= 5e-6 * np.abs(want).max()


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_5x5_float16_with_the_epilogue(layout):
    rng = np.random.default_rng(3)
    x_shape, k, p = (2, 8, 15, 13), 16, 2
    z = rng.standard_normal((x_shape[0], k, x_shape[2], x_shape[3])).astype(np.float16)
    b = rng.standard_normal(k).astype(np.float32)
    x, w, got = run(rng, x_shape, k, p, 1, VARIANTS[0], layout, np.float16, bias=b,
                    z=nhwc(z) if layout == "NHWC" else z, activation="relu")
    conv = conv2d_reference(x.astype(np.float64), w.astype(np.float64), padding=p)
    want = np.maximum(conv + b[None, :, None, None] + z, 0)
    assert np.abs(got - want).max() <= 4e-3 * np.abs(want).max()


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_5x5_padding_modes(mode):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 6, 12, 14)).astype(np.float32)
    w = rng.standard_normal((8, 6, 5, 5)).astype(np.float32)
    got = convtune.conv2d(x, w, padding=2, padding_mode=mode, variant=VARIANTS[0])
    np_mode = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (2, 2), (2, 2)), mode=np_mode)
    want = conv2d_reference(xp, w.astype(np.float64))
    assert np.abs(got - want).max() <= 5e-6 * np.abs(want).max()


@pytest.mark.parametrize("dilation", [1, 2])
def test_non_finite_values_land_where_the_reference_has_them(dilation):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 4, 13, 13)).astype(np.float32)
    x[0, 1, 3, 4] = np.inf
    x[0, 2, 9, 2] = np.nan
    x[0, 3, 6, 10] = -np.inf
    w = rng.standard_normal((4, 4, 5, 5)).astype(np.float32)
    pad = 2 * dilation
    want = conv2d_reference(x.astype(np.float64), w.astype(np.float64), padding=pad, dilation=dilation)
    for v in VARIANTS:
        got = convtune.conv2d(x, w, padding=pad, dilation=dilation, variant=v).astype(np.float64)
        finite = check_same_non_finites(got, want, v)
        assert np.abs(got[finite] - want[finite]).max() <= 5e-6 * np.abs(want[finite]).max(), v


def test_only_f2x2_takes_5x5_and_the_tuner_may_pick_it():
    x_shape, w_shape = (1, 16, 20, 20), (16, 16, 5, 5)
    with pytest.raises(ValueError, match="5x5 filters take F.2x2, 5x5. only"):
        convtune.conv2d(np.ones(x_shape, np.float32), np.ones(w_shape, np.float32), padding=2, variant="wgemm_m4_b32x32x8_t4x4")
    report = convtune.tune(x_shape, w_shape, padding=2, force=True, budget=0.3)
    names = [c["name"] for c in report.candidates]
    assert any(n.startswith("wgemm_m2") for n in names), names
    assert not any(n.startswith(("wgemm_m4", "wgemm_m6", "wino_", "wcoop_")) for n in names), names
