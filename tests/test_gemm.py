"""The implicit-GEMM family's reads of x in rows of the kernel window (NCHW rows of whole
vec4s, output rows of whole quads): every variant that reads rows on strides 1 and 2, padding
past both edges, dilation, groups, channel counts and pixel counts off its tiles, against the
float64 reference with poisoned outputs (conftest); the fused epilogue; float16 data; Inf and
NaN through the padding; split-K on 2-wide kernels; the shapes that keep pixel-wise gathers."""

from __future__ import annotations

import numpy as np
import pytest

import convtune
from convtune.reference import conv2d_reference
from reference import (swept,
    check_close, check_epilogue_in_both_layouts, check_same_non_finites,
    non_finite_inputs, random_conv_inputs,
)

GEMM = [v for v in convtune.variant_space() if v.startswith("gemm_")]
F16 = convtune.adapter_info()["features"]["shader_f16"]
MARK = "x read in rows of the kernel window"

# x, w, conv2d keywords; every one reads x in rows on some variants: rows of 1, 2, 4 and 8
# taps. 1x1 at stride 2 with rows padded above and below (two vec4s per four pixels), 2x2 at
# stride 2 (ConvNeXt's downsampling), 4x4 at stride 2 with padding (a vec4 before the row),
# 4x4 patches at stride 4, 8x8 at stride 8, and 2x2 at stride 1 with dilation 2, groups and
# padding on the right. C of 5 and 3 per group, K of 7, 6, 5 and 20 or 24 outputs per image
# are off every tile.
CASES = [
    ((2, 5, 7, 16), (7, 5, 1, 1), dict(stride=(1, 2), padding=(1, 0))),
    ((1, 3, 9, 16), (6, 3, 2, 2), dict(stride=2)),
    ((2, 5, 10, 16), (7, 5, 4, 4), dict(stride=2, padding=1)),
    ((2, 3, 16, 32), (6, 3, 4, 4), dict(stride=4)),
    ((1, 5, 16, 64), (5, 5, 8, 8), dict(stride=8)),
    ((1, 6, 10, 12), (4, 3, 2, 2), dict(padding=(0, 1), dilation=2, groups=2)),
]


def _reads_rows(variant, xs, ws, **kw):
    try:
        return MARK in convtune.wgsl(variant, xs, ws, **kw)
    except ValueError as e:
        # Split-K variants whose partials would not fit refuse the shape.
        assert "cannot run on this shape" in str(e), (variant, e)
        return False


ROWS = {i: [v for v in GEMM if _reads_rows(v, xs, ws, **kw)] for i, (xs, ws, kw) in enumerate(CASES)}


def test_rows_are_read_on_these_cases_and_only_where_they_fit():
    # Steps (8, 16, 32 terms) of whole rows with every invocation copying the same number of
    # slots; split-K too.
    for i in range(len(CASES)):
        assert len(ROWS[i]) >= 10, (i, ROWS[i])
    assert any(convtune.variant_knobs(v)["splits"] > 1 for v in ROWS[1])
    # Rows of scalars (W 14), output rows off quads (OW 7), channels-last x, 3-tap rows (no
    # step holds whole ones), and the 1x1 stride-1 planes read four pixels at a time already:
    # pixel-wise gathers.
    v = ROWS[1][0]
    assert not _reads_rows(v, (1, 3, 9, 14), (6, 3, 2, 2), stride=2)
    assert not _reads_rows(v, (1, 3, 9, 16), (6, 3, 2, 2), stride=2, padding=1)
    assert not _reads_rows(v, (1, 9, 16, 3), (6, 3, 2, 2), stride=2, layout="NHWC")
    assert not any(_reads_rows(v, (2, 5, 12, 16), (7, 5, 3, 3), stride=2, padding=1) for v in GEMM)
    assert not any(_reads_rows(v, (2, 4, 5, 24), (5, 4, 1, 1)) for v in GEMM)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_every_row_variant_matches_the_reference(case):
    xs, ws, kw = CASES[case]
    rng = np.random.default_rng(case)
    x, w, b = random_conv_inputs(rng, xs, ws, True)
    want = conv2d_reference(x, w, bias=b, **kw)
    ran, variants = 0, swept(ROWS[case], 8)
    for variant in variants:
        try:
            got = convtune.conv2d(x, w, bias=b, variant=variant, precision="highest", **kw)
        except ValueError as e:
            # Workgroup memory past the adapter's (lavapipe: 32 KiB) is the only excuse.
            assert "the adapter allows" in str(e), (variant, e)
            continue
        check_close(got, want, context=f"{variant} {xs} {ws} {kw}")
        ran += 1
    assert ran >= min(4, len(variants) // 2), ran


@pytest.mark.parametrize("variant", ROWS[2][::13])
def test_the_epilogue_is_applied_on_rows(variant):
    xs, ws, kw = CASES[2]
    rng = np.random.default_rng(abs(hash(("epi", variant))) % 2**32)
    x, w, b = random_conv_inputs(rng, xs, ws, True)
    check_epilogue_in_both_layouts(rng, x, w, b, kw, 1e-5, ("silu", "leaky_relu"), variant=variant)


@pytest.mark.skipif(not F16, reason="the adapter has no 16-bit shader floats")
@pytest.mark.parametrize("variant", ROWS[1][::24])
def test_float16_data_on_rows(variant):
    rng = np.random.default_rng(3)
    xs, ws, kw = CASES[1]
    x = rng.standard_normal(xs).astype(np.float16)
    w = (rng.standard_normal(ws) / 5).astype(np.float16)
    want = conv2d_reference(x, w, **kw)
    assert _reads_rows(variant, xs, ws, dtype="float16", **kw)
    got = convtune.conv2d(x, w, variant=variant, **kw)
    assert got.dtype == np.float16
    err = np.abs(got.astype(np.float64) - want).max() / np.abs(want).max()
    assert err <= 4 * 2.0**-11, (variant, err)


@pytest.mark.parametrize("variant", ROWS[2][::13])
def test_inf_and_nan_come_out_as_in_the_direct_method(variant):
    """Padding multiplies an infinite weight by zero: NaN, as the reference's zero padding
    gives; an infinite input reaches exactly the outputs whose windows hold it."""
    x, w = non_finite_inputs(np.random.default_rng(11), (1, 3, 10, 16), (8, 3, 4, 4))
    with np.errstate(all="ignore"):
        want = conv2d_reference(x, w, stride=2, padding=1)
    assert _reads_rows(variant, x.shape, w.shape, stride=2, padding=1)
    got = convtune.conv2d(x, w, stride=2, padding=1, variant=variant)
    assert np.isnan(want).any() and np.isposinf(want).any()
    fin = check_same_non_finites(got, want)
    check_close(np.where(fin, got, 0), np.where(fin, want, 0))
