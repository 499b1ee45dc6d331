"""conv2d(..., pixel_shuffle=r) against a float64 reference (the conv, its epilogue, then
numpy's reshape and transpose): a seeded random sweep over r = 2, 3, 4, both layouts,
groups, stride, dilation, epilogues and float16; every FMA variant on two shuffled shapes;
device Tensors (the EDSR x4 upsampler); the tuner, the cache and the introspection
functions; bad arguments.

Outputs are poisoned (conftest), so an output a kernel leaves unwritten is NaN and fails.
Reproduce a sweep case with ``CONVTUNE_TEST_SEED=<base> pytest -k 'shuffle_sweep and [<i>]'``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import convtune
from convtune.reference import apply_epilogue, conv2d_reference, conv_transpose2d_reference, pixel_shuffle_reference
from reference import (swept, swept_range, check_close, check_mode_bound, nhwc, readme_examples, run_or_skip_over_limits,
                       run_or_skip_tensor_core, split_k_case)
from tuning_support import tuning_env  # noqa: F401  (a fixture)

BASE_SEED = int(os.environ.get("CONVTUNE_TEST_SEED", 20_261_126))
N_CASES = 36
HALF_BOUND = 4 * 2.0**-11
F16 = convtune.adapter_info()["features"]["shader_f16"]
FAMILIES = ("direct_", "gemm_", "wino_")
FMA = [v for v in convtune.variant_space() if v.startswith(FAMILIES)]
ACTIVATIONS = (None, "relu", "leaky_relu", "silu", "gelu", "clamp")


def want_of(x, w, r, stride=1, padding=0, dilation=1, groups=1, bias=None, z=None,
            alpha1=1.0, alpha2=1.0, activation=None, clamp=None):
    """``pixel_shuffle(act(alpha1 * conv + bias)) `` with z (of the shuffled shape) added
    before the activation: bias per conv channel, then the shuffle, then the rest."""
    conv = conv2d_reference(x, w, stride, padding, dilation, groups)
    pre = pixel_shuffle_reference(apply_epilogue(conv, bias, alpha1=alpha1), r)
    return apply_epilogue(pre, z=z, alpha2=alpha2, activation=activation, clamp=clamp)


def draw_case(index):
    """Parameters of sweep case ``index``, from default_rng(BASE_SEED + index)."""
    rng = np.random.default_rng(BASE_SEED + index)
    r = (2, 3, 4)[index % 3]
    st = tuple(int(v) for v in rng.choice([1, 1, 2, 3], 2))
    d = tuple(int(v) for v in rng.choice([1, 1, 2], 2))
    kr, ks = (int(v) for v in rng.choice([1, 2, 3, 3, 5], 2))
    p = tuple(int(rng.integers(0, 3)) for _ in range(2))
    h = int(rng.integers(d[0] * (kr - 1) + 1, 12))
    wd = int(rng.integers(d[1] * (ks - 1) + 1, 12))
    g = int(rng.choice([1, 1, 2, 3]))
    cg = int(rng.integers(1, 5))
    # K = groups * K/groups, a multiple of r^2: channels of one shuffled output may come
    # from different groups.
    k = r * r * int(rng.integers(1, 4)) * g
    act = ACTIVATIONS[index % len(ACTIVATIONS)]
    return dict(
        n=int(rng.integers(1, 3)), c=cg * g, k=k, g=g, h=h, w=wd, kr=kr, ks=ks, st=st, p=p, d=d, r=r,
        layout="NHWC" if (index // 3) % 2 else "NCHW",
        half=F16 and index % 4 == 3,
        bias=bool(rng.random() < 0.6),
        z=bool(rng.random() < 0.4),
        alpha1=float(rng.choice([1.0, 0.5, -2.0])),
        act=act,
        variant=str(rng.choice(FMA)) if rng.random() < 0.5 else None,
        seed=BASE_SEED + index,
    )


def compare(got, want, half, context):
    if half:
        assert got.dtype == np.float16, context
        assert got.shape == want.shape, (got.shape, want.shape, context)
        g = got.astype(np.float64)
        np.testing.assert_array_equal(np.isnan(g), np.isnan(want), err_msg=f"NaN positions {context}")
        err = np.abs(g - want).max() / max(np.abs(want).max(), 1e-6)
        assert err <= HALF_BOUND, f"max relative error {err:.3g} {context}"
    else:
        check_close(got, want, context)


def test_reference_is_pytorchs_pixel_shuffle():
    # The reference written out element by element: the sweep's witness is not itself.
    y = np.arange(2 * 18 * 2 * 3, dtype=np.float64).reshape(2, 18, 2, 3)
    got = pixel_shuffle_reference(y, 3)
    assert got.shape == (2, 2, 6, 9)
    for n, k, h, w in np.ndindex(*y.shape):
        c, i, j = k // 9, (k // 3) % 3, k % 3
        assert got[n, c, h * 3 + i, w * 3 + j] == y[n, k, h, w]


@pytest.mark.parametrize("index", swept_range(N_CASES))
def test_shuffle_sweep(index):
    c = draw_case(index)
    rng = np.random.default_rng(c["seed"])
    dt = np.float16 if c["half"] else np.float32
    x = rng.standard_normal((c["n"], c["c"], c["h"], c["w"])).astype(dt)
    fan = (c["c"] // c["g"]) * c["kr"] * c["ks"]
    w = (rng.standard_normal((c["k"], c["c"] // c["g"], c["kr"], c["ks"])) / np.sqrt(fan)).astype(dt)
    b = rng.standard_normal(c["k"]).astype(np.float32) if c["bias"] else None
    r = c["r"]
    conv_shape = conv2d_reference(x, w, c["st"], c["p"], c["d"], c["g"]).shape
    n, k, oh, ow = conv_shape
    z = rng.standard_normal((n, k // (r * r), oh * r, ow * r)).astype(dt) if c["z"] else None
    clamp = (-0.5, 0.75) if c["act"] == "clamp" else None
    a2 = 0.5 if c["z"] else 1.0
    want = want_of(x, w, r, c["st"], c["p"], c["d"], c["g"], b, z, c["alpha1"], a2, c["act"], clamp)
    to = nhwc if c["layout"] == "NHWC" else (lambda a: a)
    try:
        got = convtune.conv2d(
            to(x), w, c["st"], c["p"], c["d"], c["g"], b,
            z=None if z is None else to(z), alpha1=c["alpha1"], alpha2=a2,
            activation=c["act"], clamp=clamp, layout=c["layout"], variant=c["variant"], pixel_shuffle=r,
        )
    except ValueError as e:
        # A drawn variant may not take the shape (Winograd: 3x3 at stride 1 only) or fit
        # the adapter's workgroup memory.
        assert c["variant"] and ("cannot run on this shape" in str(e) or "the adapter allows" in str(e)), e
        return
    compare(got, to(want), c["half"], f"case {c}")


# Two shapes: strided, dilated and grouped (r = 2), and 3x3 at stride 1 for the Winograd
# variants (r = 3, NHWC, with a residual and an activation).
SHAPES = [
    dict(x=(2, 6, 9, 7), w=(8, 3, 3, 2), kw=dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2), r=2,
         layout="NCHW", z=False),
    dict(x=(2, 4, 9, 7), w=(18, 4, 3, 3), kw=dict(padding=1), r=3, layout="NHWC", z=True),
]


@pytest.mark.parametrize("variant", swept(FMA))
def test_every_fma_variant_stores_shuffled(variant):
    # Alternating shapes keep this to about one compile per variant; Winograd takes the
    # second alone. (The Rust suite runs every variant on both shapes' kind too.)
    i = FMA.index(variant)
    rng = np.random.default_rng(i)
    order = SHAPES[i % 2:] + SHAPES[:i % 2]
    ran = 0
    for s in order:
        if ran:
            break
        x = rng.standard_normal(s["x"]).astype(np.float32)
        w = rng.standard_normal(s["w"]).astype(np.float32)
        b = rng.standard_normal(s["w"][0]).astype(np.float32)
        kw, r = s["kw"], s["r"]
        conv = conv2d_reference(x, w, **kw)
        n, k, oh, ow = conv.shape
        z = rng.standard_normal((n, k // (r * r), oh * r, ow * r)).astype(np.float32) if s["z"] else None
        want = want_of(x, w, r, bias=b, z=z, activation="relu" if s["z"] else None, **kw)
        to = nhwc if s["layout"] == "NHWC" else (lambda a: a)
        try:
            got = convtune.conv2d(to(x), w, bias=b, z=None if z is None else to(z),
                                  activation="relu" if s["z"] else None, layout=s["layout"],
                                  variant=variant, pixel_shuffle=r, **kw)
        except ValueError as e:
            if "the adapter allows" in str(e):
                pytest.skip(f"{variant} does not fit this adapter: {e}")
            assert "cannot run on this shape" in str(e), e
            continue
        check_close(got, to(want), f"{variant} {s}")
        ran += 1
    assert ran, f"{variant} ran on neither shape"


WGEMM = [v for v in convtune.variant_space() if v.startswith("wgemm_")]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_winograd_tiles_store_shuffled_past_ragged_edges(layout):
    # F(2x2), F(4x4) and F(6x6) tiles over a 10 x 11 image: each output's place is its tile
    # origin's plus its offset within the tile, cut where the tile runs past the image.
    rng = np.random.default_rng(17)
    x = rng.standard_normal((1, 8, 10, 11)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    want = want_of(x, w, 2, padding=1, bias=b)
    to = nhwc if layout == "NHWC" else (lambda a: a)
    for variant in WGEMM[::3]:
        got = convtune.conv2d(to(x), w, padding=1, bias=b, layout=layout, variant=variant, pixel_shuffle=2)
        check_close(got, to(want), f"{variant} {layout}")


def test_tensor_core_variants_generate_shuffled_problems():
    # Split-K variants move their summed parts in the finishing pass; the single-pass
    # variants store through ystore or the scatter.
    coop = [v for v in convtune.variant_space() if v.startswith("coop_")]
    split_k = [v for v in coop if convtune.variant_knobs(v)["splits"] > 1]
    single = [v for v in coop if convtune.variant_knobs(v)["splits"] == 1]
    assert split_k and single
    for v in split_k[:3]:
        src = convtune.wgsl(v, (1, 16, 8, 8), (64, 16, 3, 3), padding=1, pixel_shuffle=2)
        assert "let yi = ystore(4 * i" in src
    # The window tiles (layouts 3 and 4) scatter too, from their block of the image.
    for layout in (3, 4):
        windows = [v for v in single if convtune.variant_knobs(v)["layout"] == layout]
        assert windows
        src = convtune.wgsl(windows[0], (1, 8, 8, 16), (64, 16, 3, 3), padding=1, pixel_shuffle=2, layout="NHWC",
                            dtype="float16")
        assert "yscatter(" in src or "ystore(" in src
    assert "ystore(" in convtune.wgsl(single[0], (1, 16, 8, 8), (64, 16, 3, 3), padding=1, pixel_shuffle=2)


TC = convtune.adapter_info()["features"]["tensor_cores"]


def check_shuffled(variant, seed, x_shape, k, r, scale, layout, half, precision, run):
    """``variant`` on a 3x3 conv (padding 1, a bias, a residual at alpha2 0.5) of random
    ``x_shape`` data into ``k`` channels, shuffled by ``r``, against the float64 reference
    within ``precision``'s bound (float16 data where ``half``); ``run`` wraps the call and
    decides which refusals skip."""
    rng = np.random.default_rng(seed)
    dt = np.float16 if half else np.float32
    x = rng.standard_normal(x_shape).astype(dt)
    w = (rng.standard_normal((k, x_shape[1], 3, 3)) / scale).astype(dt)
    b = rng.standard_normal(k).astype(np.float32)
    want = want_of(x, w, r, padding=1, bias=b)
    z = rng.standard_normal(want.shape).astype(dt)
    want = want + 0.5 * z.astype(np.float64)
    to = nhwc if layout == "NHWC" else (lambda a: a)
    got = run(variant, lambda: convtune.conv2d(
        to(x), w, padding=1, bias=b, z=to(z), alpha2=0.5, layout=layout, variant=variant, pixel_shuffle=r,
        precision=None if half else precision))
    check_mode_bound(got, to(want), half, precision, f"{variant} {layout} half={half} r={r}")


# Every fourth single-pass tensor-core variant (they share the store step; the sample spans
# tile shapes, layouts 0-2 and the split-precision pair).
COOP_SAMPLE = [v for v in convtune.variant_space()
               if v.startswith("coop_") and convtune.variant_knobs(v)["splits"] == 1
               and convtune.variant_knobs(v)["layout"] < 3][::4]


@pytest.mark.skipif(not TC, reason="the adapter has no tensor cores (cooperative matrices)")
@pytest.mark.parametrize("variant", COOP_SAMPLE)
def test_tensor_core_variants_store_shuffled(variant):
    knobs = convtune.variant_knobs(variant)
    layout = "NHWC" if knobs["layout"] > 0 else "NCHW"
    half = knobs["layout"] == 2 or (knobs["split"] == 1 and COOP_SAMPLE.index(variant) % 2 == 0)
    precision = "highest" if knobs["split"] == 3 else "high"
    check_shuffled(variant, COOP_SAMPLE.index(variant), (2, 16, 9, 10), 64, 2, 12, layout, half, precision,
                   run_or_skip_tensor_core)


# Every third window tile (layouts 3 and 4: a block of one image per workgroup).
WINDOW_SAMPLE = [v for v in convtune.variant_space()
                 if v.startswith("coop_") and convtune.variant_knobs(v)["layout"] >= 3][::3]


@pytest.mark.skipif(not TC, reason="the adapter has no tensor cores (cooperative matrices)")
@pytest.mark.parametrize("variant", WINDOW_SAMPLE)
def test_window_tiles_store_shuffled(variant):
    # Ragged image edges (9 x 10 or 9 x 9 pixels in blocks of 8 to 64 columns), shuffles by 2
    # and 4, float16 and float32 data in both layouts ("high": the window tiles read float32
    # x, and float16 NCHW x, in place; NCHW stores four output columns per lane where rows
    # allow).
    i = WINDOW_SAMPLE.index(variant)
    half = i % 2 == 0
    layouts = ("NHWC", "NCHW") if half else ("NHWC",) if i % 4 == 1 else ("NCHW",)
    r = 4 if i % 3 == 0 else 2
    for layout in layouts:
        check_shuffled(variant, 60 + i, (2, 32, 9, 9 if i % 5 == 4 else 10), 128, r, 17, layout, half, "high",
                       run_or_skip_over_limits)


SPLIT_SAMPLE = [v for v in convtune.variant_space()
                if v.startswith("coop_") and convtune.variant_knobs(v)["splits"] > 1][::2]


@pytest.mark.skipif(not TC, reason="the adapter has no tensor cores (cooperative matrices)")
@pytest.mark.parametrize("variant", SPLIT_SAMPLE)
def test_tensor_core_split_k_variants_store_shuffled(variant):
    # The finishing pass adds the parts, applies the epilogue and moves each output to its
    # shuffled place: shuffles by 2 and 3, both layouts, float16 and float32 data.
    i = SPLIT_SAMPLE.index(variant)
    half, layout, precision = split_k_case(convtune.variant_knobs(variant), i)
    r = 3 if i % 3 == 1 else 2
    check_shuffled(variant, 90 + i, (2, 64, 9, 10), 16 * r * r, r, 24, layout, half, precision,
                   run_or_skip_over_limits)


def test_edsr_x4_upsampler_on_device_tensors():
    # EDSR's x4 upsampler: conv 64 -> 256 then shuffle 2, twice, on the GPU throughout
    # (channels scaled down to keep lavapipe quick).
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 16, 6, 5)).astype(np.float32)
    w1 = (rng.standard_normal((64, 16, 3, 3)) / 12).astype(np.float32)
    w2 = (rng.standard_normal((64, 16, 3, 3)) / 12).astype(np.float32)
    for layout, to in (("NCHW", lambda a: a), ("NHWC", nhwc)):
        t = convtune.to_device(to(x), layout)
        t = convtune.conv2d(t, w1, padding=1, pixel_shuffle=2)
        assert isinstance(t, convtune.Tensor) and t.shape == to(np.empty((1, 16, 12, 10))).shape
        zt = convtune.to_device(to(np.ones((1, 16, 24, 20), np.float32)), layout)
        y = convtune.conv2d(t, w2, padding=1, pixel_shuffle=2, z=zt, activation="relu")
        h = want_of(x, w1, 2, padding=1)
        want = want_of(h, w2, 2, padding=1, z=np.ones((1, 16, 24, 20)), activation="relu")
        check_close(y.numpy(), to(want), layout)


def test_readme_edsr_x4_upsampler():
    # README.md's example, run as written: EDSR's x4 upsampler (conv 64 -> 256 then shuffle 2,
    # twice) on device Tensors, with its 64 channels scaled down to 16 for lavapipe.
    (code,) = readme_examples("test_readme_edsr_x4_upsampler")
    assert "convtune.to_device(features)" in code and code.count("pixel_shuffle=2") == 2
    rng = np.random.default_rng(12)
    features = rng.standard_normal((1, 16, 5, 7)).astype(np.float32)
    w1 = (rng.standard_normal((64, 16, 3, 3)) / 12).astype(np.float32)
    w2 = (rng.standard_normal((64, 16, 3, 3)) / 12).astype(np.float32)
    scope = {"convtune": convtune, "features": features, "w1": w1, "w2": w2}
    exec(compile(code, "README.md", "exec"), scope)
    y = scope["y"]
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (1, 16, 20, 28)
    want = want_of(want_of(features, w1, 2, padding=1), w2, 2, padding=1)
    check_close(y, want, "README EDSR x4 upsampler")


def test_shuffle_of_one_is_the_plain_conv():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    plain = convtune.conv2d(x, w)
    np.testing.assert_array_equal(convtune.conv2d(x, w, pixel_shuffle=1), plain)
    np.testing.assert_array_equal(convtune.conv2d(x, w, pixel_shuffle=None), plain)
    assert convtune.wgsl("direct_wg64x1_u0_k1w1", x, w, pixel_shuffle=1) == convtune.wgsl("direct_wg64x1_u0_k1w1", x, w)


def test_introspection_names_the_shuffled_problem():
    xs, ws = (1, 8, 6, 6), (32, 8, 3, 3)
    src = convtune.wgsl("direct_wg64x1_u0_k1w1", xs, ws, padding=1, pixel_shuffle=2)
    assert " ps2" in src and "fn ystore" in src
    assert src != convtune.wgsl("direct_wg64x1_u0_k1w1", xs, ws, padding=1)
    assert not convtune.default_variant(xs, ws, padding=1, pixel_shuffle=2).startswith("coop_")
    name, times = convtune.time_variant(xs, ws, padding=1, pixel_shuffle=4, reps=2, warmup=0)
    assert len(times) == 2
    # A transposed convolution's shuffle runs in its lowered form: never on tconv.
    assert not convtune.default_variant(xs, (8, 8, 3, 3), 2, 1, transposed=True, pixel_shuffle=2).startswith("tconv_")
    assert not convtune.default_variant(xs, (8, 8, 3, 3), 2, 1, 2, transposed=True, pixel_shuffle=2).startswith("tconv_")
    with pytest.raises(ValueError, match="pixel_shuffle=2 on a transposed convolution needs padding within"):
        convtune.default_variant(xs, (8, 8, 3, 3), 2, 4, transposed=True, pixel_shuffle=2)
    with pytest.raises(ValueError, match="pixel_shuffle"):
        convtune.wgsl("direct_wg64x1_u0_k1w1", xs, ws, pixel_shuffle=3)


def test_tuned_and_cached_as_its_own_problem(tuning_env):
    xs, ws = (1, 8, 7, 7), (16, 8, 3, 3)
    e = convtune.explain(xs, ws, padding=1, bias=True, pixel_shuffle=2)
    assert e.source == "tuned" and " ps2" in e.shape
    statuses = {c["name"]: c["status"] for c in e.candidates}
    assert "ok" in statuses.values()
    assert convtune.explain(xs, ws, padding=1, bias=True, pixel_shuffle=2).source == "cache"
    # The plain conv of the same shapes is a different problem.
    assert convtune.explain(xs, ws, padding=1, bias=True).source == "tuned"
    rng = np.random.default_rng(11)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    y = convtune.conv2d(x, w, padding=1, bias=b, pixel_shuffle=2)
    check_close(y, want_of(x, w, 2, padding=1, bias=b))


X = np.ones((1, 4, 5, 5), np.float32)
W = np.ones((8, 4, 3, 3), np.float32)


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(pixel_shuffle=0), ValueError, "pixel_shuffle must be an int >= 1"),
    (dict(pixel_shuffle=-2), ValueError, "pixel_shuffle must be an int >= 1"),
    (dict(pixel_shuffle=True), TypeError, "pixel_shuffle must be an int, got bool"),
    (dict(pixel_shuffle=2.0), TypeError, "pixel_shuffle must be an int"),
    (dict(pixel_shuffle="2"), TypeError, "pixel_shuffle must be an int"),
    (dict(pixel_shuffle=3), ValueError, "pixel_shuffle=3 needs output channels K divisible by 3"),
    (dict(pixel_shuffle=4), ValueError, "pixel_shuffle=4 needs output channels K divisible"),
    (dict(pixel_shuffle=2, z=np.ones((1, 8, 3, 3), np.float32)), ValueError, "z must have the output's shape"),
    (dict(pixel_shuffle=2, variant="coop_b64x64x32_w2x2_l0"), ValueError, "cannot run on this shape|unknown variant"),
])
def test_bad_arguments_raise_naming_them(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        convtune.conv2d(X, W, **kwargs)


def test_nothing_is_written_on_failure():
    t = convtune.to_device(X)
    with pytest.raises(ValueError, match="pixel_shuffle"):
        convtune.conv2d(t, W, pixel_shuffle=3)
    np.testing.assert_array_equal(t.numpy(), X)


def test_transposed_convolutions_take_it_as_pytorch_would_compose_them():
    # conv_transpose2d(..., pixel_shuffle=r) is pixel_shuffle(conv_transpose2d(...), r); the
    # cases across families and layouts are in tests/test_conv_transpose.py.
    w = np.random.default_rng(9).standard_normal((4, 8, 3, 3)).astype(np.float32)
    got = convtune.conv_transpose2d(X, w, pixel_shuffle=2)
    assert got.shape == (1, 2, 14, 14)
    check_close(got, pixel_shuffle_reference(conv_transpose2d_reference(X, w), 2))


def test_images_larger_than_a_binding_are_refused_not_banded(monkeypatch):
    # Bands of rows do not land on runs of the shuffled output: such a problem is a
    # ValueError naming pixel_shuffle, decided from the shapes before any copy.
    limit = convtune.adapter_info()["limits"]["max_storage_buffer_binding_size"]
    assert 0 < limit < 2**34
    side = int(np.sqrt(limit / 4 / 4)) + 64
    x = np.broadcast_to(np.float32(1.0), (1, 1, side, side))
    w = np.ones((4, 1, 1, 1), np.float32)
    with pytest.raises((ValueError, convtune.OutOfMemoryError), match="pixel_shuffle|bytes"):
        convtune.conv2d(x, w, pixel_shuffle=2)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_split_into_whole_images_under_a_small_binding(monkeypatch, layout):
    # One image's output (16*6*5 floats = 1920 bytes) fits a 2000-byte binding, three do
    # not: the call runs image by image, each piece storing its shuffled image in place.
    monkeypatch.setenv("CONVTUNE_MAX_BINDING", "2000")
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 2, 6, 5)).astype(np.float32)
    w = rng.standard_normal((16, 2, 3, 3)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    z = rng.standard_normal((3, 1, 24, 20)).astype(np.float32)
    to = nhwc if layout == "NHWC" else (lambda a: a)
    got = convtune.conv2d(to(x), w, padding=1, bias=b, z=to(z), activation="silu", layout=layout, pixel_shuffle=4)
    check_close(got, to(want_of(x, w, 4, padding=1, bias=b, z=z, activation="silu")), layout)
    # An image larger than the binding would need bands of rows: refused, naming the option.
    monkeypatch.setenv("CONVTUNE_MAX_BINDING", "1200")
    with pytest.raises(ValueError, match="pixel_shuffle=4 an image must fit one storage binding"):
        convtune.conv2d(to(x), w, padding=1, bias=b, layout=layout, pixel_shuffle=4)
