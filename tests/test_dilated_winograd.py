"""Dilated 3x3 convolutions at stride 1 in the Winograd families that run on every adapter
(`wgemm`, and the fused `wino`): the output's dilation phases (rows a, a + d, ...; columns b, b + d, ...) are stride-1 3x3 problems on x's rows and
columns of that phase, which F(2x2, 3x3) and F(4x4, 3x3) tiles compute. Every result against
float64 on poisoned outputs: several dilations (square, one axis only, larger than the image
part), paddings, both layouts, float16, the fused epilogue, the padding modes, and NaN/Inf
where the reference has them."""

from __future__ import annotations

import numpy as np
import pytest

import convtune
from convtune.reference import conv2d_reference
from reference import check_same_non_finites, forced_conv, forced_conv_within, nhwc

VARIANTS = ["wgemm_m2_b32x32x8_t4x4", "wgemm_m4_b32x32x8_t4x4", "wino_t32x32_c4_r1x4", "wino_t32x32_c2_r1x4_m4"]
SHAPES = [
    # (n, c, h, w), k, dilation, padding
    ((2, 8, 13, 11), 16, 2, 2),
    ((1, 6, 17, 19), 8, 3, 3),
    ((1, 4, 9, 12), 8, (2, 1), (2, 1)),
    ((2, 5, 10, 10), 12, 4, 1),
    ((1, 8, 7, 9), 8, 5, 5),  # taps past the image: whole phases of padding
]


def run(rng, x_shape, k, dilation, padding, variant, layout="NCHW", dt=np.float32, **call):
    return forced_conv(rng, x_shape, (k, x_shape[1], 3, 3), variant, layout, dt, padding=padding, dilation=dilation, **call)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}-k{s[1]}-d{s[2]}-p{s[3]}")
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_dilated_layers_match_float64(variant, shape, layout):
    rng = np.random.default_rng(abs(hash((variant, str(shape), layout))) % 2**32)
    x_shape, k, dilation, padding = shape
    forced_conv_within(rng, x_shape, (k, x_shape[1], 3, 3), variant, layout, 1e-5, padding=padding, dilation=dilation)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_dilated_float16_with_the_epilogue(layout):
    rng = np.random.default_rng(3)
    x_shape, k, d, p = (2, 8, 15, 13), 16, 2, 2
    oh, ow = x_shape[2], x_shape[3]
    z = rng.standard_normal((x_shape[0], k, oh, ow)).astype(np.float16)
    b = rng.standard_normal(k).astype(np.float32)
    x, w, got = run(rng, x_shape, k, d, p, VARIANTS[0], layout, np.float16, bias=b,
                    z=nhwc(z) if layout == "NHWC" else z, activation="relu")
    conv = conv2d_reference(x.astype(np.float64), w.astype(np.float64), padding=p, dilation=d)
    want = np.maximum(conv + b[None, :, None, None] + z, 0)
    assert np.abs(got - want).max() <= 4e-3 * np.abs(want).max()


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_dilated_padding_modes(mode):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 6, 12, 14)).astype(np.float32)
    w = rng.standard_normal((8, 6, 3, 3)).astype(np.float32)
    got = convtune.conv2d(x, w, padding=2, dilation=2, padding_mode=mode, variant=VARIANTS[1])
    np_mode = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (2, 2), (2, 2)), mode=np_mode)
    want = conv2d_reference(xp, w.astype(np.float64), dilation=2)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_non_finite_values_land_where_the_reference_has_them():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 4, 11, 11)).astype(np.float32)
    x[0, 1, 3, 4] = np.inf
    x[0, 2, 8, 2] = np.nan
    w = rng.standard_normal((4, 4, 3, 3)).astype(np.float32)
    want = conv2d_reference(x.astype(np.float64), w.astype(np.float64), padding=2, dilation=2)
    for v in VARIANTS:
        got = convtune.conv2d(x, w, padding=2, dilation=2, variant=v).astype(np.float64)
        finite = check_same_non_finites(got, want, v)
        assert np.abs(got[finite] - want[finite]).max() <= 1e-5 * np.abs(want[finite]).max(), v


def test_the_tuner_may_pick_it_for_dilated_layers():
    x_shape, w_shape = (1, 16, 20, 20), (16, 16, 3, 3)
    assert any(v.startswith("wgemm_") for v in convtune.variant_space())
    report = convtune.tune(x_shape, w_shape, padding=2, dilation=2, force=True, budget=0.3)
    names = [c["name"] for c in report.candidates]
    assert any(n.startswith("wgemm_") for n in names), names
