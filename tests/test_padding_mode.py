"""padding_mode ("zeros", "reflect", "replicate", "circular"), as torch.nn.Conv2d takes it,
against a float64 reference that pads with np.pad's matching mode: random shapes, strides,
dilations, groups, asymmetric and "same" padding, both layouts, float16 and the epilogue, on
every family that takes the modes; bad combinations refused as PyTorch refuses them."""

from __future__ import annotations

import numpy as np
import pytest

import convtune
from convtune.reference import apply_epilogue, conv2d_reference
from reference import check_close, check_mode_bound, nhwc, run_or_skip_tensor_core, split_k_case, swept
from tuning_support import tuning_env  # noqa: F401  (a fixture)

F16 = convtune.adapter_info()["features"]["shader_f16"]
TC = convtune.adapter_info()["features"]["tensor_cores"]
MODES = ("reflect", "replicate", "circular")
# The families that take the modes other than zeros: all that run plain convolutions.
PLAIN = ("direct", "stem", "gemm", "wino", "wgemm", "coop", "wcoop")
# The families that take the modes other than zeros (wino: 3x3 at stride 1 only).
TAKERS = swept([v for v in convtune.variant_space() if v.startswith(("direct_", "stem_", "gemm_"))], 6)
WINO = swept([v for v in convtune.variant_space() if v.startswith(("wino_", "wgemm_"))], 6)


def draw(index):
    rng = np.random.default_rng(20_261_129 + index)
    while True:
        r, s = (int(v) for v in rng.integers(1, 6, 2))
        st = tuple(int(v) for v in rng.integers(1, 3, 2))
        d = tuple(int(v) for v in rng.choice([1, 1, 2], 2))
        h, w = (int(v) for v in rng.integers(3, 12, 2))
        p = tuple(int(rng.integers(0, min(4, n))) for n in (h, w))  # below the size: reflect's rule
        if (h + 2 * p[0] - d[0] * (r - 1) - 1) >= 0 and (w + 2 * p[1] - d[1] * (s - 1) - 1) >= 0:
            break
    g = int(rng.choice([1, 1, 2, 3]))
    return dict(
        rng=rng, n=int(rng.integers(1, 3)), c=g * int(rng.integers(1, 4)), k=g * int(rng.integers(1, 5)),
        g=g, r=r, s=s, h=h, w=w, kw=dict(stride=st, padding=p, dilation=d, groups=g),
        mode=MODES[index % 3], layout="NHWC" if index % 2 else "NCHW", half=F16 and index % 5 == 4,
        epilogue=index % 4 == 1, variant=TAKERS[index % len(TAKERS)] if index % 3 else None,
    )


@pytest.mark.parametrize("index", range(24))
def test_padding_modes_match_the_reference(index):
    c = draw(index)
    rng = c["rng"]
    dt = np.float16 if c["half"] else np.float32
    x = rng.standard_normal((c["n"], c["c"], c["h"], c["w"])).astype(dt)
    w = rng.standard_normal((c["k"], c["c"] // c["g"], c["r"], c["s"])).astype(dt)
    want = conv2d_reference(x, w, padding_mode=c["mode"], **c["kw"])
    extra = {}
    if c["epilogue"]:
        b = rng.standard_normal(c["k"]).astype(np.float32)
        z = rng.standard_normal(want.shape).astype(dt)
        want = apply_epilogue(want, b, z=z, alpha2=0.5, activation="silu")
        extra = dict(bias=b, z=nhwc(z) if c["layout"] == "NHWC" else z, alpha2=0.5, activation="silu")
    xin = nhwc(x) if c["layout"] == "NHWC" else x
    call = dict(padding_mode=c["mode"], layout=c["layout"], **c["kw"], **extra)
    try:
        got = convtune.conv2d(xin, w, variant=c["variant"], **call)
    except ValueError as e:
        if "cannot run on this shape" not in str(e) and "the adapter allows" not in str(e):
            raise
        got = convtune.conv2d(xin, w, **call)  # a stem variant refusing groups, say
    got = np.asarray(got).transpose(0, 3, 1, 2) if c["layout"] == "NHWC" else got
    assert got.shape == want.shape and got.dtype == dt, (got.shape, got.dtype, c)
    err = np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max()
    assert err <= (4 * 2.0**-11 if c["half"] else 1e-5), (err, c)


@pytest.mark.parametrize("mode", MODES)
def test_same_padding_unbatched_and_the_tuner(mode, tuning_env):  # noqa: F811
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 9, 7)).astype(np.float32)
    w = rng.standard_normal((4, 3, 4, 3)).astype(np.float32)
    got = convtune.conv2d(x, w, padding="same", padding_mode=mode)
    check_close(got, conv2d_reference(x[None], w, padding="same", padding_mode=mode)[0])
    report = convtune.tune((3, 9, 7), w.shape, padding="same", padding_mode=mode, budget=0.2, force=True)
    assert report.winner.split("_")[0] in PLAIN, report.winner
    assert mode in report.shape
    assert convtune.default_variant((3, 9, 7), w.shape, padding=1, padding_mode=mode).split("_")[0] in PLAIN


def test_bad_combinations_are_refused_as_pytorch_refuses_them():
    x = np.ones((1, 2, 3, 5), np.float32)
    w = np.ones((2, 2, 3, 3), np.float32)
    with pytest.raises(ValueError, match="padding size should be less than the corresponding input dimension"):
        convtune.conv2d(x, w, padding=3, padding_mode="reflect")
    with pytest.raises(ValueError, match="wrapping around more than once"):
        convtune.conv2d(x, w, padding=4, padding_mode="circular")
    convtune.conv2d(x, w, padding=(3, 5), padding_mode="circular")  # at most the size: fine
    convtune.conv2d(x, w, padding=7, padding_mode="replicate")
    with pytest.raises(ValueError, match="padding_mode must be"):
        convtune.conv2d(x, w, padding=1, padding_mode="mirror")
    with pytest.raises(TypeError, match="padding_mode must be a str"):
        convtune.conv2d(x, w, padding=1, padding_mode=None)
    with pytest.raises(ValueError, match=r"are for plain convolutions"):
        convtune.conv2d(x, w, padding=1, padding_mode="reflect", variant="tconv_wg64x1_k1w1")


def test_zeros_is_the_default_and_its_own_problem():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    np.testing.assert_array_equal(convtune.conv2d(x, w, padding=1), convtune.conv2d(x, w, padding=1, padding_mode="zeros"))
    assert not np.allclose(convtune.conv2d(x, w, padding=1), convtune.conv2d(x, w, padding=1, padding_mode="replicate"))


@pytest.mark.parametrize("variant", WINO)
def test_winograd_tiles_read_the_padding_modes(variant):
    i = WINO.index(variant)
    rng = np.random.default_rng(100 + i)
    layout = "NHWC" if i % 2 else "NCHW"
    half = F16 and i % 3 == 2
    dt = np.float16 if half else np.float32
    for j, mode in enumerate(MODES):
        # Odd sizes: the last tiles reach past the output (their reads stay inside x).
        x = rng.standard_normal((2, 5, 7 + j, 9 - j)).astype(dt)
        w = rng.standard_normal((6, 5, 3, 3)).astype(dt)
        want = conv2d_reference(x, w, padding=1, padding_mode=mode)
        got = convtune.conv2d(nhwc(x) if layout == "NHWC" else x, w, padding=1, padding_mode=mode, layout=layout,
                              variant=variant)
        got = np.asarray(got, np.float64).transpose(0, 3, 1, 2) if layout == "NHWC" else np.asarray(got, np.float64)
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err <= (8 * 2.0**-11 if half else 1e-5), (variant, mode, err)
    # A non-finite x takes the direct re-sum, which reads the padding the same way.
    x = rng.standard_normal((1, 5, 6, 6)).astype(np.float32)
    x[0, 1, 0, 0] = np.inf
    x[0, 2, 5, 3] = np.nan
    w = rng.standard_normal((6, 5, 3, 3)).astype(np.float32)
    want = conv2d_reference(x, w, padding=1, padding_mode="reflect")
    got = convtune.conv2d(x, w, padding=1, padding_mode="reflect", variant=variant)
    for kind in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(kind(got), kind(want), err_msg=f"{variant} {kind.__name__}")


@pytest.mark.parametrize("variant", [v for v in TAKERS if v.startswith(("stem_", "gemm_"))])
def test_stem_and_gemm_tiles_read_the_padding_modes(variant):
    i = TAKERS.index(variant)
    rng = np.random.default_rng(200 + i)
    for j, mode in enumerate(MODES):
        layout = "NHWC" if (i + j) % 2 else "NCHW"
        half = F16 and (i + j) % 3 == 2
        dt = np.float16 if half else np.float32
        r = (7, 3, 5)[j]
        x = rng.standard_normal((1 + j % 2, 3, 12 + j, 16)).astype(dt)
        w = rng.standard_normal((8, 3, r, r)).astype(dt)
        kw = dict(stride=1 + j % 2, padding=r // 2)
        want = conv2d_reference(x, w, padding_mode=mode, **kw)
        try:
            got = convtune.conv2d(nhwc(x) if layout == "NHWC" else x, w, padding_mode=mode, layout=layout,
                                  variant=variant, **kw)
        except ValueError as e:
            if "the adapter allows" in str(e):
                pytest.skip(str(e))
            raise
        got = np.asarray(got, np.float64).transpose(0, 3, 1, 2) if layout == "NHWC" else np.asarray(got, np.float64)
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err <= (4 * 2.0**-11 if half else 1e-5), (variant, mode, layout, err)


# Tensor-core tiles (GPU only): every layout of the coop family (layouts 3 and 4 are window
# tiles, float16 NHWC at stride 1), split-K, both splits, and the Winograd tiles.
COOP_MODES = swept([v for v in convtune.variant_space() if v.startswith(("coop_", "wcoop_"))], 10)


@pytest.mark.skipif(not TC, reason="the adapter has no tensor cores (cooperative matrices)")
@pytest.mark.parametrize("variant", COOP_MODES)
def test_tensor_core_tiles_read_the_padding_modes(variant):
    i = COOP_MODES.index(variant)
    rng = np.random.default_rng(300 + i)
    half, layout, precision = split_k_case({"layout": 0, **convtune.variant_knobs(variant)}, i)
    channels_last = layout == "NHWC"
    dt = np.float16 if half else np.float32
    for j, mode in enumerate(MODES):
        # Odd sizes (the last tiles reach past the output), a long reduction for split-K.
        x = rng.standard_normal((2, 64, 11 + j, 13 - j)).astype(dt)
        w = (rng.standard_normal((48, 64, 3, 3)) / 24).astype(dt)
        b = rng.standard_normal(48).astype(np.float32)
        want = conv2d_reference(x, w, bias=b, padding=(1, 2 - j % 2), padding_mode=mode)
        to = nhwc if channels_last else (lambda a: a)
        got = run_or_skip_tensor_core(variant, lambda: convtune.conv2d(
            to(x), w, bias=b, padding=(1, 2 - j % 2), padding_mode=mode, layout=layout, variant=variant,
            precision=None if half else precision))
        check_mode_bound(got, to(want), half, precision, f"{variant} {mode} {layout}")
