"""The dwise family (NHWC depthwise convolution, channels in vectors per invocation): its
variants against the float64 reference with poisoned outputs (conftest), over strides,
dilations, rectangular and 5x5 kernels and outputs off every tile; the fused epilogue with a
residual; float16 data; padding modes; a pixel shuffle after it; Inf and NaN; its refusals;
and the tuner timing it on a depthwise layer."""

from __future__ import annotations

import numpy as np
import pytest

import convtune
from convtune.reference import apply_epilogue, conv2d_reference, pixel_shuffle_reference
from reference import check_close, check_same_non_finites, nhwc, non_finite_inputs, swept
from tuning_support import tuning_env  # noqa: F401  (a fixture)

DWISE = [v for v in convtune.variant_space() if v.startswith("dwise_")]
F16 = convtune.adapter_info()["features"]["shader_f16"]
HALF_BOUND = 4 * 2.0**-11


def draw(index: int):
    """A random NHWC depthwise problem: channels a multiple of 8 (every variant takes it),
    kernel sides 1-5, strides 1-2, dilations 1-3, padding up to the kernel's reach, images
    small enough that their edges meet most tiles."""
    rng = np.random.default_rng(20_261_130 + index)
    while True:
        r, s = (int(v) for v in rng.integers(1, 6, 2))
        st = tuple(int(v) for v in rng.integers(1, 3, 2))
        d = tuple(int(v) for v in rng.choice([1, 1, 2, 3], 2))
        h, w = (int(v) for v in rng.integers(2, 14, 2))
        p = (int(rng.integers(0, d[0] * (r - 1) // 2 + 2)), int(rng.integers(0, d[1] * (s - 1) // 2 + 2)))
        if h + 2 * p[0] - d[0] * (r - 1) - 1 >= 0 and w + 2 * p[1] - d[1] * (s - 1) - 1 >= 0:
            break
    c = 8 * int(rng.integers(1, 4))
    return rng, (int(rng.integers(1, 3)), c, h, w), (c, 1, r, s), dict(stride=st, padding=p, dilation=d, groups=c)


def run(variant, x, w, **call):
    """``variant`` on NCHW ``x`` given as NHWC; the result back in NCHW order."""
    got = convtune.conv2d(nhwc(x), w, layout="NHWC", variant=variant, **call)
    return np.asarray(got).transpose(0, 3, 1, 2)


def test_family_is_listed():
    assert len(DWISE) == 54
    for name in DWISE:
        k = convtune.variant_knobs(name)
        assert k["family"] == "dwise"
        assert name == f"dwise_wg{k['wg']}_c{k['cv']}_w{k['tw']}h{k['th']}"


@pytest.mark.parametrize("variant", swept(DWISE, 27))
def test_every_variant_matches_the_reference(variant):
    i = DWISE.index(variant)
    for case in (2 * i, 2 * i + 1):
        rng, xs, ws, kw = draw(case)
        x = rng.standard_normal(xs).astype(np.float32)
        w = rng.standard_normal(ws).astype(np.float32)
        b = rng.standard_normal(ws[0]).astype(np.float32)
        got = run(variant, x, w, bias=b, precision="highest", **kw)
        check_close(got, conv2d_reference(x, w, bias=b, **kw), context=f"{variant} {xs} {ws} {kw}")


@pytest.mark.parametrize("variant", DWISE[::5])
def test_the_epilogue_with_a_residual(variant):
    rng = np.random.default_rng(abs(hash(("epi", variant))) % 2**32)
    x = rng.standard_normal((2, 16, 7, 9)).astype(np.float32)
    w = rng.standard_normal((16, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    kw = dict(padding=1, groups=16)
    conv = conv2d_reference(x, w, **kw)
    z = rng.standard_normal(conv.shape).astype(np.float32)
    want = apply_epilogue(conv, b, z=z, alpha1=0.5, alpha2=-2.0, activation="silu")
    got = run(variant, x, w, bias=b, z=nhwc(z), alpha1=0.5, alpha2=-2.0, activation="silu", **kw)
    check_close(got, want, context=variant)


@pytest.mark.skipif(not F16, reason="the adapter has no 16-bit shader floats")
@pytest.mark.parametrize("variant", DWISE[1::4])
def test_float16_data(variant):
    rng, xs, ws, kw = draw(100 + DWISE.index(variant))
    x = rng.standard_normal(xs).astype(np.float16)
    w = (rng.standard_normal(ws) / 3).astype(np.float16)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    got = convtune.conv2d(nhwc(x), w, bias=b, layout="NHWC", variant=variant, **kw)
    assert got.dtype == np.float16
    want = conv2d_reference(x, w, bias=b, **kw)
    err = np.abs(got.astype(np.float64).transpose(0, 3, 1, 2) - want).max() / np.abs(want).max()
    assert err <= HALF_BOUND, (variant, kw, err)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_padding_modes(mode):
    for j, variant in enumerate(DWISE[2::9]):
        rng = np.random.default_rng(j)
        x = rng.standard_normal((1, 8, 6, 7)).astype(np.float32)
        w = rng.standard_normal((8, 1, 3, 5)).astype(np.float32)
        kw = dict(stride=(1, 2), padding=(1, 2), groups=8)
        got = run(variant, x, w, padding_mode=mode, **kw)
        check_close(got, conv2d_reference(x, w, padding_mode=mode, **kw), context=f"{variant} {mode}")


@pytest.mark.parametrize("variant", DWISE[3::7])
def test_pixel_shuffle_after_it(variant):
    rng = np.random.default_rng(abs(hash(("shuffle", variant))) % 2**32)
    x = rng.standard_normal((2, 16, 5, 6)).astype(np.float32)
    w = rng.standard_normal((16, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    want = pixel_shuffle_reference(conv2d_reference(x, w, bias=b, padding=1, groups=16), 2)
    got = run(variant, x, w, bias=b, padding=1, groups=16, pixel_shuffle=2)
    check_close(got, want, context=variant)


@pytest.mark.parametrize("variant", DWISE[::6])
def test_inf_and_nan_come_out_as_in_the_direct_method(variant):
    """Padding multiplies the infinite weight by zero: NaN, as the reference's zero padding
    gives; the infinite and NaN inputs reach exactly the outputs whose windows hold them."""
    x, w = non_finite_inputs(np.random.default_rng(11), (1, 8, 8, 12), (8, 1, 3, 3))
    with np.errstate(all="ignore"):
        want = conv2d_reference(x, w, padding=1, groups=8)
    got = run(variant, x, w, padding=1, groups=8)
    assert np.isnan(want).any() and np.isposinf(want).any()
    fin = check_same_non_finites(got, want, variant)
    check_close(np.where(fin, got, 0), np.where(fin, want, 0))


@pytest.mark.parametrize("xs, ws, kw, layout", [
    ((1, 8, 6, 6), (8, 1, 3, 3), dict(groups=8), "NCHW"),
    ((1, 8, 6, 6), (16, 1, 3, 3), dict(groups=8), "NHWC"),
    ((1, 8, 6, 6), (8, 2, 3, 3), dict(groups=4), "NHWC"),
    ((1, 12, 6, 6), (12, 1, 3, 3), dict(groups=12), "NHWC"),
])
def test_what_it_cannot_compute_is_refused(xs, ws, kw, layout):
    x = np.ones(xs, np.float32)
    x = nhwc(x) if layout == "NHWC" else x
    with pytest.raises(ValueError, match="cannot run on this shape.*dwise family"):
        convtune.conv2d(x, np.ones(ws, np.float32), layout=layout, variant="dwise_wg64_c8_w1h1", **kw)


def test_the_tuner_times_it_on_a_depthwise_layer(tuning_env):
    report = convtune.tune((1, 10, 12, 32), (32, 1, 3, 3), padding=1, groups=32, layout="NHWC", budget=2.0)
    assert any(c["name"].startswith("dwise_") and c["status"] == "ok" for c in report.candidates)
    plain = convtune.tune((1, 32, 10, 12), (32, 1, 3, 3), padding=1, groups=32, budget=0.3)
    assert not any(c["name"].startswith("dwise_") for c in plain.candidates)
