"""NaN and ±Inf in x through conv_transpose2d (and a pixel shuffle after it) exactly as the
float64 reference has them, on every family that takes a transposed problem.

The plain families compute a transposed convolution as its lowered form, whose dead taps
(a phase the kernel does not reach) and padding multiply x by zero: without care, one Inf
there comes out NaN where the reference, which only has the real products, is finite or
infinite. Non-finite values sit at corners, edges and interiors, in both layouts and
float16; the finite outputs are compared within the precision's bound as well.
"""

from __future__ import annotations

import numpy as np
import pytest

import convtune
from convtune.reference import conv2d_reference, conv_transpose2d_reference, pixel_shuffle_reference
from reference import check_same_non_finites, nhwc, swept

F16 = convtune.adapter_info()["features"]["shader_f16"]
TC = convtune.adapter_info()["features"]["tensor_cores"]
TENSOR_CORE_FAMILIES = ("coop", "wcoop")
FAMILIES = ("direct", "stem", "gemm", "wino", "wgemm", "tconv") + TENSOR_CORE_FAMILIES
_SPACE = convtune.variant_space()
# Four of each family, and two split-K gemms (their finishing pass stores).
VARIANTS = swept([v for v in _SPACE if v.split("_")[0] in FAMILIES], 4) + swept(
    [v for v in _SPACE if v.startswith("gemm_") and convtune.variant_knobs(v).get("splits", 1) > 1], 2)

# (x shape, w shape, keyword arguments): dead taps (3x3 and 5x5 past a stride multiple),
# none (4x4 at stride 2), stride 1 (the Winograd families), groups, a pixel shuffle after,
# dilated at stride 2 (the kernel spread out: d 2 leaves whole phases without a tap, d 3
# reaches every phase).
CASES = [
    ((2, 8, 10, 10), (8, 4, 3, 3), dict(stride=2, padding=1, output_padding=1)),
    ((1, 6, 7, 9), (6, 5, 4, 4), dict(stride=2, padding=1)),
    ((1, 4, 6, 5), (4, 3, 5, 5), dict(stride=3, padding=2, output_padding=1, groups=2)),
    ((2, 5, 8, 8), (5, 4, 3, 3), dict(stride=1, padding=1)),
    ((1, 4, 6, 6), (4, 8, 3, 3), dict(stride=2, padding=1, output_padding=1, pixel_shuffle=2)),
    ((1, 6, 7, 6), (6, 4, 3, 3), dict(stride=2, padding=2, dilation=2, output_padding=1)),
    ((2, 4, 6, 5), (4, 6, 3, 3), dict(stride=2, padding=1, dilation=3)),
]


def poisoned_x(rng, shape):
    """Standard normal x with NaN, +Inf and -Inf at corners, edges and interior points of
    different images and channels."""
    n, c, h, w = shape
    x = rng.standard_normal(shape)
    spots = [(0, 0), (h - 1, w - 1), (0, w // 2), (h // 2, w - 1), (h - 1, 0), (h // 2, w // 3)]
    for i, (r, q) in enumerate(spots):
        x[i % n, (2 * i) % c, r, q] = (np.nan, np.inf, -np.inf)[i % 3]
    return x


def reference(x, w, kw):
    kw = dict(kw)
    r = kw.pop("pixel_shuffle", None)
    y = conv_transpose2d_reference(x, w, **kw)
    return pixel_shuffle_reference(y, r) if r else y


def mode_for(variant, i):
    """(float16 data?, precision) the ``i``-th run of ``variant`` uses."""
    tensor_cores = variant.split("_")[0] in TENSOR_CORE_FAMILIES
    if F16 and i % 3 == 2:
        return True, None
    return False, "high" if tensor_cores or i % 3 == 1 else "highest"


@pytest.mark.parametrize("variant", VARIANTS)
def test_non_finite_x_reaches_exactly_the_reference_outputs(variant):
    if variant.split("_")[0] in TENSOR_CORE_FAMILIES and not TC:
        pytest.skip("the adapter has no tensor cores (cooperative matrices)")
    rng = np.random.default_rng(abs(hash(variant)) % 2**32)
    ran = 0
    for i, (xs, ws, kw) in enumerate(CASES):
        half, precision = mode_for(variant, i + VARIANTS.index(variant))
        layout = "NHWC" if (i + VARIANTS.index(variant)) % 2 else "NCHW"
        dt = np.float16 if half else np.float32
        x = poisoned_x(rng, xs).astype(dt)
        w = rng.standard_normal(ws).astype(dt)
        want = reference(x.astype(np.float64), w.astype(np.float64), kw)
        xin = nhwc(x) if layout == "NHWC" else x
        call = dict(kw, variant=variant, layout=layout, **({} if half else dict(precision=precision)))
        try:
            got = np.asarray(convtune.conv_transpose2d(xin, w, **call))
        except ValueError as e:
            if "cannot run on this shape" in str(e) or "the adapter allows" in str(e):
                continue
            raise
        ran += 1
        got = got.transpose(0, 3, 1, 2) if layout == "NHWC" else got
        context = f"{variant} case {i} {layout} {'float16' if half else precision}"
        assert np.isnan(want).any() and np.isinf(want).any(), context
        try:
            finite = check_same_non_finites(got, want)
        except AssertionError as e:
            raise AssertionError(f"{context}: {e}") from None
        bound = 4 * 2.0**-11 if half else (1e-5 if precision == "highest" else 4e-3)
        err = np.abs(got[finite].astype(np.float64) - want[finite]).max() / np.abs(want[finite]).max()
        assert err <= bound, f"{context}: error {err:.3g}"
    if ran == 0:
        pytest.skip(f"{variant} takes none of the cases")


@pytest.mark.parametrize("variant", [v for v in VARIANTS if not v.startswith(("tconv_", "wino", "wgemm", "wcoop"))])
def test_non_finite_x_through_a_fused_pixel_shuffle(variant):
    if variant.split("_")[0] in TENSOR_CORE_FAMILIES and not TC:
        pytest.skip("the adapter has no tensor cores (cooperative matrices)")
    i = VARIANTS.index(variant)
    half, precision = mode_for(variant, i)
    layout = "NHWC" if i % 2 else "NCHW"
    dt = np.float16 if half else np.float32
    rng = np.random.default_rng(i)
    x = poisoned_x(rng, (2, 6, 7, 9)).astype(dt)
    w = rng.standard_normal((12, 6, 3, 3)).astype(dt)
    want = pixel_shuffle_reference(conv2d_reference(x.astype(np.float64), w.astype(np.float64), padding=1), 2)
    xin = nhwc(x) if layout == "NHWC" else x
    call = dict(padding=1, pixel_shuffle=2, variant=variant, layout=layout, **({} if half else dict(precision=precision)))
    try:
        got = np.asarray(convtune.conv2d(xin, w, **call))
    except ValueError as e:
        if "cannot run on this shape" in str(e) or "the adapter allows" in str(e):
            pytest.skip(f"{variant}: {e}")
        raise
    got = got.transpose(0, 3, 1, 2) if layout == "NHWC" else got
    check_same_non_finites(got, want)
