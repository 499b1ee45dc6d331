"""float16 data: x and w of dtype float16 stay float16 on the GPU, are multiplied and summed in
float32, and give a float16 result, in every family, layout and epilogue; checked against a
float64 reference of the same float16 inputs with poisoned outputs (conftest)."""

from __future__ import annotations

import numpy as np
import pytest

import convtune
from convtune.reference import apply_epilogue, conv2d_reference
from reference import FMA_SAMPLE, nhwc
from tuning_support import tuning_env  # noqa: F401  (a fixture)

F16 = convtune.adapter_info()["features"]["shader_f16"]
TC = convtune.adapter_info()["features"]["tensor_cores"]
needs_f16 = pytest.mark.skipif(not F16, reason="the adapter has no 16-bit shader floats")
needs_tc = pytest.mark.skipif(not TC, reason="the adapter has no tensor cores (cooperative matrices)")

# The result is rounded to float16 (relative step 2^-11 of each element); a few steps of
# max |y| allow for the reference's own rounding, and a wrong kernel is off by far more.
BOUND = 4 * 2.0**-11

FMA_VARIANTS = FMA_SAMPLE
COOP_VARIANTS = [v for v in convtune.variant_space()
                 if v.startswith("coop_") and convtune.variant_knobs(v)["split"] == 1]

CASES = [
    ((2, 8, 12, 11), (6, 8, 3, 3), dict(padding=1)),
    ((1, 6, 9, 10), (10, 3, 3, 2), dict(stride=(2, 1), padding=(1, 0), groups=2, dilation=(1, 2))),
    ((3, 16, 7, 7), (20, 16, 1, 1), {}),
    ((1, 4, 8, 7), (4, 1, 3, 3), dict(padding="same", groups=4)),  # odd output length
    ((2, 8, 6, 6), (12, 8, 1, 1), {}),  # 1x1 over whole quads of pixels and of channels
    ((2, 64, 8, 8), (32, 64, 3, 3), dict(padding=1)),  # short grid, long reduction: split-K
    # Groups of 8 channels (16-byte gathers of NHWC x in place), padding, stride along w.
    ((1, 16, 9, 10), (24, 8, 3, 3), dict(stride=(1, 2), padding=1, groups=2)),
    # One group of 32 channels at stride 1: the staged input windows of the tensor-core
    # family (`_l3`, `_l4`), ragged at every image edge, with a 3x2 window unpadded.
    ((2, 32, 13, 37), (24, 32, 3, 3), dict(padding=1)),
    ((1, 32, 9, 70), (40, 32, 3, 2), {}),
]


def half_inputs(rng, xs, ws):
    x = rng.standard_normal(xs).astype(np.float16)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float16)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    return x, w, b


def check_half(got, want, context=""):
    assert got.dtype == np.float16, (got.dtype, context)
    assert got.shape == want.shape, (got.shape, want.shape, context)
    got = got.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"NaN positions {context}")
    inf = np.isinf(want)
    np.testing.assert_array_equal(got[inf], want[inf], err_msg=f"Inf positions {context}")
    ok = np.isfinite(want)
    err = np.abs(got[ok] - want[ok]).max() / max(np.abs(want[ok]).max(), 1e-6)
    assert err <= BOUND, f"max relative error {err:.3g} > {BOUND:.3g} {context}"


def run_cases(variant, layout):
    rng = np.random.default_rng(abs(hash((variant, layout))) % 2**32)
    ran = 0
    for xs, ws, kw in CASES:
        x, w, b = half_inputs(rng, xs, ws)
        conv = conv2d_reference(x, w, **kw)
        z = rng.standard_normal(conv.shape).astype(np.float16)
        want = apply_epilogue(conv, b, z=z, alpha2=0.5, activation="relu")
        to = nhwc if layout == "NHWC" else (lambda a: a)
        try:
            got = convtune.conv2d(to(x), w, bias=b, z=to(z), alpha2=0.5, activation="relu",
                                  layout=layout, variant=variant, **kw)
        except ValueError as e:
            if "the adapter allows" in str(e):
                pytest.skip(f"{variant} exceeds this adapter's workgroup memory: {e}")
            if "cannot run on this shape" in str(e):
                continue  # a layout or channel count the variant refuses (tested elsewhere)
            raise
        check_half(got, to(want), f"{variant} {layout} {xs} {ws} {kw}")
        ran += 1
    if variant and variant.startswith("coop_") and convtune.variant_knobs(variant)["splits"] > 1:
        # Split-K partials are f32: float16 data gives them room only where x is read in
        # place (NHWC with C/groups a multiple of 4, or NCHW under a window tile) and y is
        # stored in quads.
        in_place = layout == "NHWC" or convtune.variant_knobs(variant)["layout"] >= 3
        assert (ran >= 1) if in_place else (ran == 0), f"{variant} {layout} ran {ran} cases"
        return
    assert ran >= 2, f"{variant} {layout} ran only {ran} cases"


@needs_f16
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("variant", FMA_VARIANTS + [None])
def test_fma_families_compute_float16(variant, layout):
    run_cases(variant, layout)


@needs_tc
@pytest.mark.parametrize("variant, layout", [(v, lay) for v in COOP_VARIANTS for lay in ("NCHW", "NHWC")
                                             if convtune.variant_knobs(v)["layout"] in
                                             ((0, 1, 3, 4) if lay == "NCHW" else (1, 2, 3, 4))])
def test_tensor_core_variants_compute_float16(variant, layout):
    run_cases(variant, layout)


@needs_f16
def test_float16_propagates_nan_and_inf():
    rng = np.random.default_rng(5)
    x, w, _ = half_inputs(rng, (1, 8, 9, 9), (8, 8, 3, 3))
    x[0, 2, 4, 4] = np.nan
    x[0, 5, 1, 1] = np.inf
    for variant in ["direct_wg64x1_u1_k4w4", "gemm_b32x32x8_t4x4"] + (["coop_b64x64x32_s2x2_p1"] if TC else []):
        got = convtune.conv2d(x, w, padding=1, variant=variant)
        check_half(got, conv2d_reference(x, w, padding=1), variant)


@needs_f16
def test_float16_results_beyond_its_range_are_inf():
    x = np.full((1, 16, 4, 4), 200.0, np.float16)
    w = np.full((2, 16, 3, 3), 20.0, np.float16)
    w[1] = -20.0
    for variant in ["direct_wg64x1_u1_k4w4", "gemm_b32x32x8_t4x4", None]:
        got = convtune.conv2d(x, w, variant=variant)  # sums of +-576000, past 65504
        assert got.dtype == np.float16
        assert np.all(np.isposinf(got[:, 0])) and np.all(np.isneginf(got[:, 1])), variant


@needs_f16
def test_float16_tensors_chain_at_half_the_bytes():
    rng = np.random.default_rng(6)
    x, _, _ = half_inputs(rng, (1, 8, 16, 16), (8, 8, 3, 3))
    ws = [half_inputs(rng, (1, 8, 1, 1), (8, 8, 3, 3))[1] for _ in range(4)]
    t = convtune.to_device(x)
    assert t.dtype == "float16" and t.nbytes == x.nbytes and "float16" in repr(t)
    skip = t
    want = x.astype(np.float64)
    want_skip = want
    for i, w in enumerate(ws):
        if i % 2 == 0:
            t = convtune.conv2d(t, w, padding=1, activation="relu")
            want = np.maximum(conv2d_reference(want, w, padding=1), 0)
        else:
            # The residual block's tail: x0.1 and the skip, in the store step.
            t = convtune.conv2d(t, w, padding=1, alpha1=0.1, z=skip)
            want = 0.1 * conv2d_reference(want, w, padding=1) + want_skip
        # The reference follows the float16 rounding of each stored intermediate.
        want = want.astype(np.float16).astype(np.float64)
        if i % 2 == 1:
            skip, want_skip = t, want
    out = t.numpy()
    assert out.dtype == np.float16
    check_half(out, want)


@needs_f16
def test_float16_results_do_not_depend_on_tuning(tuning_env):
    rng = np.random.default_rng(7)
    x, w, b = half_inputs(rng, (2, 16, 12, 12), (16, 16, 3, 3))
    report = convtune.tune(x, w, padding=1, bias=b)
    assert report.shape.endswith("f16")
    f32 = convtune.tune(x.astype(np.float32), w.astype(np.float32), padding=1, bias=b)
    assert f32.shape != report.shape
    coop = [c["name"] for c in report.candidates if c["name"].startswith("coop_")]
    assert all(convtune.variant_knobs(n)["split"] == 1 for n in coop)
    got = convtune.conv2d(x, w, padding=1, bias=b)
    check_half(got, conv2d_reference(x, w, padding=1, bias=b))
    e = convtune.explain(x, w, padding=1, bias=b)
    assert e.shape == report.shape
    assert convtune.explain((2, 16, 12, 12), (16, 16, 3, 3), padding=1, bias=True, dtype="float16").shape == report.shape


@pytest.mark.parametrize("x_dtype, w_dtype", [("float16", "float32"), ("float32", "float16"), ("float16", "float64"),
                                              ("int8", "float16")])
def test_float16_mixed_with_another_dtype_is_a_type_error(x_dtype, w_dtype):
    x = np.ones((1, 4, 6, 6), x_dtype)
    w = np.ones((2, 4, 3, 3), w_dtype)
    with pytest.raises(TypeError, match="float16 data cannot be mixed"):
        convtune.conv2d(x, w)


@needs_f16
def test_float16_residual_and_tensors_must_match():
    x = np.ones((1, 4, 6, 6), np.float16)
    w = np.ones((2, 4, 3, 3), np.float16)
    with pytest.raises(TypeError, match="z float32"):
        convtune.conv2d(x, w, z=np.ones((1, 2, 4, 4), np.float32))
    t = convtune.to_device(x)
    with pytest.raises(TypeError, match="w float32"):
        convtune.conv2d(t, w.astype(np.float32))
    with pytest.raises(TypeError, match="z float32"):
        convtune.conv2d(t, w, z=convtune.to_device(np.ones((1, 2, 4, 4), np.float32)))
    t32 = convtune.to_device(x.astype(np.float32))
    assert t32.dtype == "float32"
    with pytest.raises(TypeError, match="w float16"):
        convtune.conv2d(t32, w)


@pytest.mark.parametrize("dtype, exc", [("half", ValueError), ("float64", ValueError), (3, TypeError)])
def test_bad_dtype_keyword(dtype, exc):
    with pytest.raises(exc, match="dtype must be one of"):
        convtune.explain((1, 4, 6, 6), (2, 4, 3, 3), dtype=dtype)


def test_float16_dtype_keyword_and_arrays_name_the_same_problem():
    a = convtune.explain((1, 4, 6, 6), (2, 4, 3, 3), dtype=np.float16)
    assert a.precision == "high"  # float16 products are exact: every call runs as "high"
    b = convtune.explain(np.ones((1, 4, 6, 6), np.float16), np.ones((2, 4, 3, 3), np.float16))
    assert a.shape == b.shape and a.shape.endswith("f16")
    assert not convtune.explain((1, 4, 6, 6), (2, 4, 3, 3)).shape.endswith("f16")


@needs_f16
@pytest.mark.parametrize("variant", ["direct_wg1x64_u1_k1w2", "direct_wg2x32_u0_k1w4", "direct_wg8x8_u0_k1w4"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_depthwise_float16_on_channel_fastest_and_pixel_fastest_workgroups(variant, layout):
    """Depthwise layers (MobileNet's) in float16: workgroups whose lanes go along channels
    (neighbouring bytes in NHWC) and along pixels, with the epilogue, stride 1 and 2."""
    rng = np.random.default_rng(abs(hash((variant, layout))) % 2**32)
    for xs, kw in (((2, 72, 9, 11), dict(padding=1)), ((1, 40, 12, 13), dict(stride=2, padding=1))):
        c = xs[1]
        x, w, b = half_inputs(rng, xs, (c, 1, 3, 3))
        conv = conv2d_reference(x, w, groups=c, **kw)
        z = rng.standard_normal(conv.shape).astype(np.float16)
        want = apply_epilogue(conv, b, z=z, alpha2=0.5, activation="relu")
        t = nhwc if layout == "NHWC" else np.asarray
        got = convtune.conv2d(t(x), w, bias=b, z=t(z), alpha2=0.5, activation="relu", groups=c, layout=layout,
                              variant=variant, **kw)
        check_half(got, t(want), f"{variant} {layout} {xs} {kw}")
