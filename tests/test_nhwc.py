"""layout="NHWC": x as (N, H, W, C) and y as (N, OH, OW, K), read and written in place by the
kernels, against the float64 reference of the same problem in NCHW (outputs poisoned first)."""

from __future__ import annotations

import numpy as np
import pytest

import convtune
from convtune.reference import apply_epilogue, conv2d_reference
from reference import FMA_SAMPLE, check_close, nhwc
from tuning_support import tuning_env  # noqa: F401  (a fixture)

# Direct variants with several channel tiles per workgroup (tails of K and of the row inside one
# workgroup). In NHWC their lanes along y own interleaved channels: blocks of WG_Y tiles, a
# group's last block shorter (K = 40 below: 20 tiles of 2 in blocks of 8, 8 and 4).
VARIANTS = FMA_SAMPLE + [
    "direct_wg8x8_u1_k2w2",
    "direct_wg16x4_u0_k1w1",
    "direct_wg16x16_u2_k4w1",
    "direct_wg8x8_u2_k8w4",
    "direct_wg32x2_u1_k4w2",
    # Channel-fastest workgroups (lanes on neighbouring channel tiles): one pixel column a
    # workgroup, or two.
    "direct_wg1x64_u1_k1w2",
    "direct_wg2x32_u0_k2w4",
]

CASES = [
    ((2, 8, 12, 11), (6, 8, 3, 3), dict(padding=1)),
    ((1, 6, 9, 10), (10, 3, 3, 2), dict(stride=(2, 1), padding=(1, 0), groups=2, dilation=(1, 2))),
    ((3, 16, 7, 7), (20, 16, 1, 1), {}),
    ((1, 4, 8, 8), (4, 1, 3, 3), dict(padding="same", groups=4)),
    # 1x1 grouped and strided: GEMM tiles gather NHWC x a pixel's channels at a time.
    ((2, 12, 5, 9), (9, 4, 1, 1), dict(stride=2, groups=3)),
    ((1, 5, 6, 7), (40, 5, 3, 3), dict(padding=1)),
    ((1, 4, 5, 6), (44, 2, 1, 3), dict(padding=(0, 1), groups=2)),
]


@pytest.mark.parametrize("variant", VARIANTS + [None])
def test_every_family_reads_and_writes_nhwc(variant):
    rng = np.random.default_rng(abs(hash(str(variant))) % 2**32)
    for xs, ws, kw in CASES:
        x = rng.standard_normal(xs).astype(np.float32)
        w = rng.standard_normal(ws).astype(np.float32)
        b = rng.standard_normal(ws[0]).astype(np.float32)
        got = convtune.conv2d(nhwc(x), w, bias=b, layout="NHWC", variant=variant, **kw)
        check_close(got, nhwc(conv2d_reference(x, w, bias=b, **kw)), context=f"{variant} {xs} {ws}")


@pytest.mark.parametrize("variant", ["gemm_b32x32x8_t4x4", "gemm_b32x32x16_t4x4_k4", "direct_wg64x1_u1_k4w4"])
def test_nhwc_with_the_fused_epilogue(variant):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 8, 10, 9)).astype(np.float32)
    w = rng.standard_normal((12, 8, 3, 3)).astype(np.float32)
    b = rng.standard_normal(12).astype(np.float32)
    conv = conv2d_reference(x, w, padding=1)
    z = rng.standard_normal(conv.shape).astype(np.float32)
    want = apply_epilogue(conv, b, z=z, alpha1=0.5, alpha2=-2.0, activation="leaky_relu", negative_slope=0.1)
    got = convtune.conv2d(nhwc(x), w, padding=1, bias=b, layout="NHWC", variant=variant, z=nhwc(z),
                          alpha1=0.5, alpha2=-2.0, activation="leaky_relu", negative_slope=0.1)
    check_close(got, nhwc(want))


# Split NHWC problems (row bands, padding-only rows) with the epilogue: test_epilogue.py.


def test_nhwc_tensors_chain():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 6, 12, 12)).astype(np.float32)
    ws = [(rng.standard_normal((6, 6, 3, 3)) * 0.3).astype(np.float32) for _ in range(4)]
    t = convtune.to_device(nhwc(x), layout="NHWC")
    assert t.layout == "NHWC" and "NHWC" in repr(t)
    want = x.astype(np.float64)
    for w in ws:
        # The Tensor carries its layout: no layout= needed, and the output keeps it.
        t = convtune.conv2d(t, w, padding=1, activation="relu")
        want = apply_epilogue(conv2d_reference(want, w, padding=1), activation="relu")
    assert t.shape == (1, 12, 12, 6) and t.layout == "NHWC"
    check_close(t.numpy(), nhwc(want), rtol=1e-4)
    with pytest.raises(ValueError, match="x is an NHWC Tensor but the call's layout is NCHW"):
        convtune.conv2d(t, ws[0], padding=1, layout="NCHW")
    with pytest.raises(ValueError, match="z is an NCHW Tensor"):
        convtune.conv2d(t, ws[0], padding=1, z=convtune.to_device(nhwc(x).transpose(0, 3, 1, 2).copy()))
    with pytest.raises(ValueError, match="layout must be"):
        convtune.to_device(x, layout="CHW")


def test_tensor_cores_take_nhwc_in_their_channels_last_variants():
    src_ok = convtune.wgsl("gemm_b32x32x8_t4x4", (1, 8, 8, 4), (4, 4, 3, 3), layout="NHWC")
    assert "XSC: i32 = 1" in src_ok
    # Channels-last variants read NHWC x in place (no copy into the workspace) and store
    # channel-fastest.
    src = convtune.wgsl("coop_b64x64x32_s2x2_p1_l1", (1, 8, 8, 4), (4, 4, 3, 3), layout="NHWC")
    assert "array<vec4<f32>>" in src.split("@binding(0)")[1].split("\n")[0]
    assert "coopStoreT(acc" in src and "xt[" not in src.split("fn main")[1].split("fn finish")[0]
    with pytest.raises(ValueError, match="channels-last variants"):
        convtune.wgsl("coop_b64x64x32_s2x2_p1", (1, 8, 8, 4), (4, 4, 3, 3), layout="NHWC")
    # C/groups not a multiple of 4: the prologue copies x with each group's channels padded.
    padded = convtune.wgsl("coop_b64x64x32_s2x2_p1_l1", (1, 8, 8, 6), (4, 6, 3, 3), layout="NHWC")
    assert "xt[i] = vec4<CT>(v);" in padded and "xt[" in padded.split("fn main")[1].split("fn finish")[0]


TC = convtune.adapter_info()["features"]["tensor_cores"]
COOP_L1 = [v for v in convtune.variant_space()
           if v.startswith("coop_") and convtune.variant_knobs(v)["layout"] == 1]


@pytest.mark.skipif(not TC, reason="the adapter has no tensor cores (cooperative matrices)")
@pytest.mark.parametrize("variant", COOP_L1)
def test_tensor_core_variants_read_and_write_nhwc(variant):
    bound = 1e-5 if convtune.variant_knobs(variant)["split"] == 3 else 4e-3
    rng = np.random.default_rng(abs(hash(variant)) % 2**32)
    cases = [
        ((2, 64, 20, 20), (64, 64, 3, 3), dict(padding=1)),
        ((1, 16, 17, 13), (40, 8, 3, 1), dict(stride=(2, 1), padding=(1, 0), groups=2)),
        ((3, 24, 9, 9), (72, 24, 1, 1), {}),
        # C/groups 3 and 6: through the prologue's padded copy.
        ((2, 3, 15, 14), (16, 3, 7, 7), dict(stride=2, padding=3)),
        ((1, 12, 11, 10), (8, 6, 3, 3), dict(padding=1, groups=2)),
    ]
    ran = 0
    for xs, ws, kw in cases:
        x = rng.standard_normal(xs).astype(np.float32)
        w = rng.standard_normal(ws).astype(np.float32)
        b = rng.standard_normal(ws[0]).astype(np.float32)
        conv = conv2d_reference(x, w, **kw)
        z = rng.standard_normal(conv.shape).astype(np.float32)
        want = apply_epilogue(conv, b, z=z, alpha2=0.5, activation="relu")
        try:
            got = convtune.conv2d(nhwc(x), w, bias=b, z=nhwc(z), alpha2=0.5, activation="relu",
                                  layout="NHWC", variant=variant, **kw)
        except ValueError as e:
            if "the adapter allows" in str(e):
                pytest.skip(f"{variant} exceeds this adapter's workgroup memory: {e}")
            if "cannot run on this shape" in str(e) and convtune.variant_knobs(variant)["splits"] > 1:
                continue  # split-K runs on short grids only; the first case is one
            raise
        err = np.abs(got - nhwc(want)).max() / np.abs(want).max()
        assert err <= bound, (variant, xs, ws, err)
        ran += 1
    assert ran >= 1, variant


@pytest.mark.skipif(not TC, reason="the adapter has no tensor cores (cooperative matrices)")
@pytest.mark.parametrize("variant", ["coop_b64x64x16_s2x2_p1_l1", "coop_b64x64x16_s2x2_p3_l1"])
def test_tensor_core_scale_covers_all_of_a_large_nhwc_x(variant):
    # x read in place has its max |x| taken by 1024 workgroups striding over it: 270,400
    # vec4s here, so the last ones are a second stride's. The largest value sits there; a
    # scale that missed it would overflow float16 and leave infinities in y.
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 64, 130, 130)).astype(np.float32)
    x[0, :, -1, -1] = 3e4
    w = rng.standard_normal((16, 64, 1, 1)).astype(np.float32)
    want = conv2d_reference(x, w)
    got = convtune.conv2d(nhwc(x), w, layout="NHWC", variant=variant)
    assert np.isfinite(got).all()
    bound = 1e-5 if convtune.variant_knobs(variant)["split"] == 3 else 4e-3
    assert np.abs(got - nhwc(want)).max() / np.abs(want).max() <= bound


def test_tuning_keys_on_the_layout(tuning_env):
    a = convtune.tune((1, 4, 10, 10), (8, 4, 3, 3), padding=1)
    b = convtune.tune((1, 10, 10, 4), (8, 4, 3, 3), padding=1, layout="NHWC")
    assert a.shape != b.shape and b.shape.endswith("nhwc")
    assert convtune.tune((1, 10, 10, 4), (8, 4, 3, 3), padding=1, layout="NHWC").tuned_at == b.tuned_at


@pytest.mark.parametrize("layout, exc", [("nhwc", ValueError), ("NCWH", ValueError), (1, TypeError), (b"NHWC", TypeError)])
def test_bad_layouts_are_clear_errors(layout, exc):
    x = np.ones((1, 4, 4, 3), np.float32)
    with pytest.raises(exc, match="layout must be"):
        convtune.conv2d(x, np.ones((2, 3, 1, 1), np.float32), layout=layout)


def test_nhwc_array_whose_last_axis_is_not_c():
    x = np.ones((1, 3, 4, 4), np.float32)  # an NCHW array passed as NHWC: C would be 4
    with pytest.raises(ValueError, match="w.shape\\[1\\]"):
        convtune.conv2d(x, np.ones((2, 3, 1, 1), np.float32), layout="NHWC")
