"""conv_transpose2d against the float64 reference: a seeded random sweep over strides 1-4,
output padding, dilation, groups, both layouts, epilogues, float16 and bias; every tconv
variant; device Tensors; the tuner and the introspection functions; bad arguments.

Outputs are poisoned (conftest), so an output a kernel leaves unwritten is NaN and fails.
Reproduce a sweep case with ``CONVTUNE_TEST_SEED=<base> pytest -k 'transpose_sweep and [<i>]'``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import convtune
from convtune.reference import apply_epilogue, conv_transpose2d_reference, pixel_shuffle_reference
from reference import (swept, check_close, check_mode_bound, check_same_non_finites, nhwc, readme_examples, run_or_skip_over_limits,
                       run_or_skip_tensor_core, split_k_case)
from tuning_support import tuning_env  # noqa: F401  (a fixture)

BASE_SEED = int(os.environ.get("CONVTUNE_TEST_SEED", 20_260_126))
N_CASES = 48
# float16 results are rounded to float16: a few rounding steps of max |y|.
HALF_BOUND = 4 * 2.0**-11
F16 = convtune.adapter_info()["features"]["shader_f16"]
TCONV = [v for v in convtune.variant_space() if v.startswith("tconv_")]
# The plain FMA families compute transposed problems in their lowered form (stride phases
# stacked as output channels, stores scattered back): a sample of each, every split-K gemm
# (its finishing pass scatters too) and every Winograd variant (3x3 at stride 1 lowers to
# 3x3 at stride 1).
_FMA = [v for v in convtune.variant_space() if v.split("_")[0] in ("direct", "gemm", "wino", "wgemm")]
_WINOGRAD = ("wino_", "wgemm_")
LOWERED = sorted(set(_FMA[::7]) | {v for v in _FMA if v.startswith(_WINOGRAD) or (v.startswith("gemm_") and "_k" in v)})
# The ones a test run takes, alternating layouts and dtypes over them.
LOWERED_RUN = swept(LOWERED, 6)
ACTIVATIONS = (None, "relu", "leaky_relu", "silu", "gelu", "clamp")


def out_size(i, st, p, op, d, k):
    return (i - 1) * st - 2 * p + d * (k - 1) + op + 1


def draw_case(index):
    """Parameters of sweep case ``index``, from default_rng(BASE_SEED + index)."""
    rng = np.random.default_rng(BASE_SEED + index)
    while True:
        st = tuple(int(v) for v in rng.integers(1, 5, 2))
        d = tuple(int(v) for v in rng.choice([1, 1, 2, 3], 2))
        r, s = (int(v) for v in rng.integers(1, 6, 2))
        h, w = (int(v) for v in rng.integers(1, 9, 2))
        # Output padding below the stride or the dilation (PyTorch's rule), both exercised.
        op = tuple(int(rng.integers(0, max(a, b))) for a, b in zip(st, d))
        p = tuple(int(rng.integers(0, 3)) for _ in range(2))
        oh = out_size(h, st[0], p[0], op[0], d[0], r)
        ow = out_size(w, st[1], p[1], op[1], d[1], s)
        if oh >= 1 and ow >= 1:
            break
    mode = ("one", "divisor", "depthwise")[index % 3]
    g = {"one": 1, "divisor": int(rng.choice([2, 3])), "depthwise": int(rng.integers(2, 6))}[mode]
    cg = 1 if mode == "depthwise" else int(rng.integers(1, 5))
    kg = 1 if mode == "depthwise" else int(rng.integers(1, 6))
    act = ACTIVATIONS[index % len(ACTIVATIONS)]
    return dict(
        n=int(rng.integers(1, 3)), c=cg * g, kg=kg, g=g, h=h, w=w, r=r, s=s, st=st, p=p, op=op, d=d,
        layout="NHWC" if index % 2 else "NCHW",
        half=F16 and index % 4 == 3,
        bias=bool(rng.random() < 0.6),
        z=bool(rng.random() < 0.4),
        alpha1=float(rng.choice([1.0, 0.5, -2.0])),
        act=act,
        variant=str(rng.choice(TCONV)) if rng.random() < 0.4 else None,
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


@pytest.mark.parametrize("index", range(N_CASES))
def test_transpose_sweep(index):
    c = draw_case(index)
    rng = np.random.default_rng(c["seed"])
    dt = np.float16 if c["half"] else np.float32
    x = rng.standard_normal((c["n"], c["c"], c["h"], c["w"])).astype(dt)
    w = (rng.standard_normal((c["c"], c["kg"], c["r"], c["s"])) / np.sqrt(c["kg"] * c["r"] * c["s"])).astype(dt)
    k = c["kg"] * c["g"]
    b = rng.standard_normal(k).astype(np.float32) if c["bias"] else None
    conv = conv_transpose2d_reference(x, w, c["st"], c["p"], c["op"], c["g"], c["d"])
    z = rng.standard_normal(conv.shape).astype(dt) if c["z"] else None
    clamp = (-0.5, 0.75) if c["act"] == "clamp" else None
    want = apply_epilogue(conv, b, z=z, alpha1=c["alpha1"], alpha2=0.5, activation=c["act"], clamp=clamp)
    to = nhwc if c["layout"] == "NHWC" else (lambda a: a)
    got = convtune.conv_transpose2d(
        to(x), w, c["st"], c["p"], c["op"], c["g"], c["d"], b,
        z=None if z is None else to(z), alpha1=c["alpha1"], alpha2=0.5 if c["z"] else 1.0,
        activation=c["act"], clamp=clamp, layout=c["layout"], variant=c["variant"],
    )
    compare(got, to(want), c["half"], f"case {c}")


@pytest.mark.parametrize("variant", swept(TCONV, 24))
def test_every_tconv_variant(variant):
    # Alternating layouts and data types keep this to one compile per variant.
    i = TCONV.index(variant)
    layout = "NHWC" if i % 2 else "NCHW"
    half = F16 and i % 3 == 0
    rng = np.random.default_rng(i)
    dt = np.float16 if half else np.float32
    x = rng.standard_normal((2, 6, 5, 7)).astype(dt)
    w = (rng.standard_normal((6, 5, 3, 4)) / 8).astype(dt)
    kw = dict(stride=(2, 3), padding=(1, 2), output_padding=(1, 0), groups=2, dilation=(2, 1))
    b = rng.standard_normal(10).astype(np.float32)
    want = conv_transpose2d_reference(x, w, bias=b, **kw)
    to = nhwc if layout == "NHWC" else (lambda a: a)
    got = convtune.conv_transpose2d(to(x), w, bias=b, layout=layout, variant=variant, **kw)
    compare(got, to(want), half, f"{variant} {layout}")


@pytest.mark.parametrize("variant", LOWERED_RUN)
def test_lowered_form_on_other_families(variant):
    # Strides 2 and 3 with kernels past and short of a stride multiple, groups, output
    # padding, a bias and a residual: every phase's scatter, crop and bias channel. Winograd
    # variants take 3x3 at stride 1 (no other shape lowers to their 3x3 filters).
    i = LOWERED_RUN.index(variant)
    layout = "NHWC" if i % 2 else "NCHW"
    half = F16 and i % 3 == 0
    rng = np.random.default_rng(100 + i)
    dt = np.float16 if half else np.float32
    if variant.startswith(_WINOGRAD):
        xs, ws, kw = (2, 6, 7, 6), (6, 4, 3, 3), dict(stride=1, padding=1, groups=2)
    elif i % 2:
        xs, ws, kw = (2, 6, 5, 7), (6, 4, 4, 4), dict(stride=2, padding=1, groups=2)
    else:
        xs, ws, kw = (2, 4, 5, 4), (4, 3, 3, 5), dict(stride=(2, 3), padding=(1, 2), output_padding=(1, 2))
    try:
        check_lowered_case(variant, rng, xs, ws, kw, layout, dt, "leaky_relu")
    except ValueError as e:
        if "the adapter allows" not in str(e):
            raise
        pytest.skip(f"{variant} exceeds this adapter's limits")


def check_lowered_case(variant, rng, xs, ws, kw, layout, dt, activation):
    """``variant`` on a transposed convolution of random data with a bias and a residual at
    alpha2 0.5 and ``activation``, against the float64 reference."""
    x = rng.standard_normal(xs).astype(dt)
    w = (rng.standard_normal(ws) / 6).astype(dt)
    k = ws[1] * kw.get("groups", 1)
    b = rng.standard_normal(k).astype(np.float32)
    conv = conv_transpose2d_reference(x, w, **kw)
    z = rng.standard_normal(conv.shape).astype(dt)
    want = apply_epilogue(conv, b, z=z, alpha2=0.5, activation=activation)
    to = nhwc if layout == "NHWC" else (lambda a: a)
    got = convtune.conv_transpose2d(to(x), w, bias=b, z=to(z), alpha2=0.5, activation=activation, layout=layout,
                                    variant=variant, **kw)
    compare(got, to(want), dt == np.float16, f"{variant} {layout} {kw}")


# Stride-1 dilated transposed problems lower to a dilated convolution (taps flipped, padding
# d * (R - 1) - p, one phase), strided ones to their spread-out kernel's phases: the FMA
# sample, every Winograd variant (their dilation phases).
DILATED_RUN = sorted(set(LOWERED_RUN) | {v for v in _FMA if v.startswith(_WINOGRAD)})
DILATED_CASES = [
    ((2, 6, 9, 8), (6, 4, 3, 3), dict(dilation=2, padding=1, groups=2)),
    ((1, 5, 8, 10), (5, 6, 3, 3), dict(dilation=(3, 2), padding=(2, 1), output_padding=(1, 1))),
    ((1, 4, 9, 9), (4, 4, 5, 5), dict(dilation=2, padding=3)),
    # Past stride 1 the kernel is lowered spread out (zeros between its weights): dilation 2
    # at stride 2 leaves three phases of four without a tap, 3 at 2 reaches every phase; a
    # 5x5 dilated 2 at stride 2 lowers to 3x3 filters (the Winograd families take it).
    ((2, 6, 7, 6), (6, 4, 3, 3), dict(stride=2, dilation=2, padding=1, output_padding=1, groups=2)),
    ((1, 5, 6, 5), (5, 3, 3, 2), dict(stride=(2, 3), dilation=(3, 2), padding=(2, 1), output_padding=(1, 2))),
    ((1, 4, 5, 6), (4, 4, 3, 3), dict(stride=2, dilation=2, padding=2)),
]


@pytest.mark.parametrize("variant", DILATED_RUN)
def test_dilated_lowered_form(variant):
    i = DILATED_RUN.index(variant)
    layout = "NHWC" if i % 2 else "NCHW"
    half = F16 and i % 3 == 0
    dt = np.float16 if half else np.float32
    rng = np.random.default_rng(400 + i)
    ran = 0
    for xs, ws, kw in DILATED_CASES:
        try:
            check_lowered_case(variant, rng, xs, ws, kw, layout, dt, "relu")
        except ValueError as e:
            # Winograd variants take 3x3 (and F(2x2) 5x5) filters only.
            if "cannot run on this shape" not in str(e) and "the adapter allows" not in str(e):
                raise
            continue
        ran += 1
    if not ran:
        pytest.skip(f"{variant} takes none of these shapes on this adapter")


def test_dilated_stride_1_lowered_form_keeps_non_finite_values_where_the_reference_has_them():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 4, 10, 9)).astype(np.float32)
    x[0, 1, 2, 3], x[0, 2, 7, 5], x[0, 3, 4, 8] = np.inf, np.nan, -np.inf
    w = rng.standard_normal((4, 4, 3, 3)).astype(np.float32)
    kw = dict(dilation=2, padding=1)
    want = conv_transpose2d_reference(x.astype(np.float64), w.astype(np.float64), **kw)
    for v in ("wgemm_m4_b32x32x8_t4x4", "wino_t32x32_c4_r1x4", "gemm_b32x32x8_t4x4", LOWERED[0]):
        got = convtune.conv_transpose2d(x, w, variant=v, **kw).astype(np.float64)
        finite = check_same_non_finites(got, want, v)
        assert np.abs(got[finite] - want[finite]).max() <= 1e-5 * np.abs(want[finite]).max(), v


TC = convtune.adapter_info()["features"]["tensor_cores"]
# (Layouts 3 and 4 are sampled below: their window tiles need stride-1 lowered forms.)
COOP_SAMPLE = [v for v in convtune.variant_space()
               if v.startswith("coop_") and convtune.variant_knobs(v)["splits"] == 1
               and convtune.variant_knobs(v)["layout"] < 3][1::4]


def check_decoder(variant, seed, xs, ws, kw, scale, layout, half, precision, run):
    """``variant`` on the transposed convolution of random ``xs`` data by ``ws`` weights
    (``kw``: stride, padding, output_padding), with a bias and a residual at alpha2 0.5,
    against the float64 reference within ``precision``'s bound (float16 data where
    ``half``); ``run`` wraps the call and decides which refusals skip."""
    rng = np.random.default_rng(seed)
    dt = np.float16 if half else np.float32
    x = rng.standard_normal(xs).astype(dt)
    w = (rng.standard_normal(ws) / scale).astype(dt)
    b = rng.standard_normal(ws[1]).astype(np.float32)
    conv = conv_transpose2d_reference(x, w, bias=b, **kw)
    z = rng.standard_normal(conv.shape).astype(dt)
    want = conv + 0.5 * z.astype(np.float64)
    to = nhwc if layout == "NHWC" else (lambda a: a)
    got = run(variant, lambda: convtune.conv_transpose2d(
        to(x), w, bias=b, z=to(z), alpha2=0.5, layout=layout, variant=variant,
        precision=None if half else precision, **kw))
    check_mode_bound(got, to(want), half, precision, f"{variant} {layout} half={half} {kw}")


@pytest.mark.skipif(not TC, reason="the adapter has no tensor cores (cooperative matrices)")
@pytest.mark.parametrize("variant", COOP_SAMPLE)
def test_lowered_form_on_tensor_cores(variant):
    # The decoder layers the family is for: 4x4 stride 2 (no zero taps) and 3x3 stride 2
    # with output padding (zero taps, cropped phases), 16-channel groups of output.
    knobs = convtune.variant_knobs(variant)
    layout = "NHWC" if knobs["layout"] > 0 else "NCHW"
    i = COOP_SAMPLE.index(variant)
    half = knobs["layout"] == 2 or i % 2 == 0
    precision = "highest" if knobs["split"] == 3 else "high"
    if i % 3 == 2:
        xs, ws, kw = (2, 16, 7, 6), (16, 16, 3, 3), dict(stride=2, padding=1, output_padding=1)
    else:
        xs, ws, kw = (2, 32, 6, 7), (32, 16, 4, 4), dict(stride=2, padding=1)
    check_decoder(variant, 200 + i, xs, ws, kw, 12, layout, half, precision, run_or_skip_tensor_core)


def check_dilated_on_tensor_cores(variant, seed, xs, kw):
    """``check_decoder`` on a dilated problem with the layout, data type and mode the
    tensor-core ``variant`` takes."""
    knobs = convtune.variant_knobs(variant)
    i = convtune.variant_space().index(variant)
    layout = "NHWC" if knobs.get("layout", i % 2) > 0 else "NCHW"
    half = knobs.get("layout") == 2 or i % 2 == 0
    precision = "highest" if knobs["split"] == 3 else "high"
    check_decoder(variant, seed + i % 97, xs, (32, 16, 3, 3), kw, 12, layout, half, precision, run_or_skip_tensor_core)


WCOOP = [v for v in convtune.variant_space() if v.startswith("wcoop_")]


@pytest.mark.skipif(not TC, reason="the adapter has no tensor cores (cooperative matrices)")
@pytest.mark.parametrize("variant", COOP_SAMPLE[::2] + WCOOP[::3])
def test_dilated_stride_1_lowered_form_on_tensor_cores(variant):
    check_dilated_on_tensor_cores(variant, 500, (2, 32, 9, 8), dict(dilation=2, padding=1, output_padding=1))


@pytest.mark.skipif(not TC, reason="the adapter has no tensor cores (cooperative matrices)")
@pytest.mark.parametrize("variant", COOP_SAMPLE[1::2] + WCOOP[1::3])
def test_strided_dilated_lowered_form_on_tensor_cores(variant):
    # Past stride 1 the lowered kernel is spread out: dilation 2 at stride 2 leaves three
    # phases of four with no live tap (their outputs are the epilogue of zero), dilation 3
    # reaches every phase with some taps dead.
    d = 2 + convtune.variant_space().index(variant) % 2
    check_dilated_on_tensor_cores(variant, 700, (2, 32, 7, 6), dict(stride=2, dilation=d, padding=1, output_padding=1))


# Every third window tile (layouts 3 and 4), on the lowered form's stride-1 conv.
WINDOW_SAMPLE = [v for v in convtune.variant_space()
                 if v.startswith("coop_") and convtune.variant_knobs(v)["layout"] >= 3][1::3]


@pytest.mark.skipif(not TC, reason="the adapter has no tensor cores (cooperative matrices)")
@pytest.mark.parametrize("variant", WINDOW_SAMPLE)
def test_lowered_form_on_window_tiles(variant):
    i = WINDOW_SAMPLE.index(variant)
    half = i % 2 == 0
    # float16 in both layouts (the window tiles read float16 NCHW x in place as they do NHWC).
    layouts = ("NHWC", "NCHW") if half else ("NHWC",) if i % 4 == 1 else ("NCHW",)
    if i % 3 == 2:
        xs, ws, kw = (2, 32, 7, 9), (32, 16, 3, 3), dict(stride=2, padding=1, output_padding=1)
    else:
        xs, ws, kw = (2, 32, 6, 11), (32, 16, 4, 4), dict(stride=2, padding=1)
    for layout in layouts:
        check_decoder(variant, 300 + i, xs, ws, kw, 12, layout, half, "high", run_or_skip_over_limits)


SPLIT_SAMPLE = [v for v in convtune.variant_space()
                if v.startswith("coop_") and convtune.variant_knobs(v)["splits"] > 1][1::2]


@pytest.mark.skipif(not TC, reason="the adapter has no tensor cores (cooperative matrices)")
@pytest.mark.parametrize("variant", SPLIT_SAMPLE)
def test_lowered_form_split_k_on_tensor_cores(variant):
    # Small images and deep channels, the decoders split-K is for: the finishing pass moves
    # each summed output to its phase (cropped where it falls outside y).
    i = SPLIT_SAMPLE.index(variant)
    half, layout, precision = split_k_case(convtune.variant_knobs(variant), i)
    if i % 2:
        xs, ws, kw = (2, 128, 5, 6), (128, 16, 3, 3), dict(stride=2, padding=1, output_padding=1)
    else:
        xs, ws, kw = (2, 128, 5, 4), (128, 16, 4, 4), dict(stride=2, padding=1)
    check_decoder(variant, 400 + i, xs, ws, kw, 24, layout, half, precision, run_or_skip_over_limits)


# Every channels-last tensor-core tile (single pass and split-K, layouts 1 to 4).
DEAD_TAP_SAMPLE = [v for v in convtune.variant_space()
                   if v.startswith("coop_") and convtune.variant_knobs(v)["layout"] >= 1]


@pytest.mark.skipif(not TC, reason="the adapter has no tensor cores (cooperative matrices)")
@pytest.mark.parametrize("variant", DEAD_TAP_SAMPLE)
def test_lowered_forms_with_dead_taps_skip_them_on_tensor_cores(variant):
    # Kernels that are not stride multiples (3x3 at stride 2, 5x5 at stride 3, 1x1 at stride 2,
    # 3x3 at stride 2 then a pixel shuffle by 2, channels-last only): their lowered channels are phase-major in
    # both layouts, with 256 output channels per phase (64 after the shuffle), whole tiles of
    # every tile width, so the steps skip the taps each workgroup's phase never reaches (the
    # kernels' own test checks they do: `dead_taps_of_a_lowered_decoder_skip_their_products`).
    i = DEAD_TAP_SAMPLE.index(variant)
    knobs = convtune.variant_knobs(variant)
    half, layout, precision = split_k_case(knobs, i)
    case = i % 4
    if case == 0:
        xs, ws, kw = (2, 32, 5, 6), (32, 256, 3, 3), dict(stride=2, padding=1, output_padding=1)
    elif case == 1:
        xs, ws, kw = (2, 32, 4, 3), (32, 256, 5, 5), dict(stride=3, padding=2, output_padding=1)
    elif case == 3:
        # 1x1 at stride 2: three of the four phases reach no tap (their outputs are zeros).
        xs, ws, kw = (2, 32, 5, 6), (32, 256, 1, 1), dict(stride=2, output_padding=1)
    else:
        xs, ws, kw = (1, 32, 4, 5), (32, 256, 3, 3), dict(stride=2, padding=1, pixel_shuffle=2)
        layout = "NHWC"
    to = nhwc if layout == "NHWC" else (lambda a: a)
    rng = np.random.default_rng(700 + i)
    dt = np.float16 if half else np.float32
    x = rng.standard_normal(xs).astype(dt)
    w = (rng.standard_normal(ws) / 24).astype(dt)
    shuffle = kw.pop("pixel_shuffle", 1)
    want = conv_transpose2d_reference(x, w, **kw)
    if shuffle > 1:
        want = pixel_shuffle_reference(want, shuffle)
    got = run_or_skip_over_limits(variant, lambda: convtune.conv_transpose2d(
        to(x), w, layout=layout, variant=variant, precision=None if half else precision,
        pixel_shuffle=shuffle, **kw))
    check_mode_bound(got, to(want), half, precision, f"{variant} {layout} half={half} {ws} {kw} shuffle {shuffle}")


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("variant", [None, "direct_wg64x1_u0_k1w1", "gemm_b32x32x8_t4x4", "gemm_b32x32x16_t4x4_k4"])
def test_pixel_shuffle_after_the_transposed_convolution(layout, variant):
    # A decoder's x2 layer and a pixel shuffle by 2 in one kernel: the shuffle folds into the
    # lowered form's scatter (4x4 stride 2, and 3x3 stride 2 with cropped phases); groups,
    # a bias per transposed output channel, the residual in the shuffled shape.
    rng = np.random.default_rng(31)
    to = nhwc if layout == "NHWC" else (lambda a: a)
    for xs, ws, kw in [((2, 4, 5, 3), (4, 8, 4, 4), dict(stride=2, padding=1)),
                       ((1, 6, 4, 5), (6, 4, 3, 3), dict(stride=2, padding=1, output_padding=1, groups=2))]:
        x = rng.standard_normal(xs).astype(np.float32)
        w = (rng.standard_normal(ws) / 6).astype(np.float32)
        k = ws[1] * kw.get("groups", 1)
        b = rng.standard_normal(k).astype(np.float32)
        conv = pixel_shuffle_reference(conv_transpose2d_reference(x, w, bias=b, **kw), 2)
        z = rng.standard_normal(conv.shape).astype(np.float32)
        want = apply_epilogue(conv, z=z, alpha2=0.5, activation="relu")
        got = convtune.conv_transpose2d(to(x), w, bias=b, z=to(z), alpha2=0.5, activation="relu", layout=layout,
                                        variant=variant, pixel_shuffle=2, **kw)
        compare(got, to(want), False, f"{variant} {layout} {kw}")


@pytest.mark.skipif(not TC, reason="the adapter has no tensor cores (cooperative matrices)")
@pytest.mark.parametrize("variant", COOP_SAMPLE[::3])
def test_pixel_shuffle_after_the_transposed_convolution_on_tensor_cores(variant):
    knobs = convtune.variant_knobs(variant)
    layout = "NHWC" if knobs["layout"] > 0 else "NCHW"
    half = knobs["layout"] == 2
    precision = "highest" if knobs["split"] == 3 else "high"
    rng = np.random.default_rng(33)
    dt = np.float16 if half else np.float32
    x = rng.standard_normal((2, 32, 6, 7)).astype(dt)
    w = (rng.standard_normal((32, 64, 4, 4)) / 12).astype(dt)
    b = rng.standard_normal(64).astype(np.float32)
    want = pixel_shuffle_reference(conv_transpose2d_reference(x, w, 2, 1, bias=b), 2)
    to = nhwc if layout == "NHWC" else (lambda a: a)
    got = run_or_skip_tensor_core(variant, lambda: convtune.conv_transpose2d(
        to(x), w, 2, 1, bias=b, layout=layout, variant=variant, pixel_shuffle=2,
        precision=None if half else precision))
    check_mode_bound(got, to(want), half, precision, f"{variant} {layout}")


def test_pixel_shuffle_after_the_transposed_convolution_on_device_and_float16():
    rng = np.random.default_rng(32)
    x = rng.standard_normal((1, 8, 4, 4)).astype(np.float32)
    w = (rng.standard_normal((8, 16, 4, 4)) / 8).astype(np.float32)
    t = convtune.conv_transpose2d(convtune.to_device(x), w, stride=2, padding=1, pixel_shuffle=2)
    assert isinstance(t, convtune.Tensor) and t.shape == (1, 4, 16, 16)
    check_close(t.numpy(), pixel_shuffle_reference(conv_transpose2d_reference(x, w, 2, 1), 2))
    if F16:
        xh, wh = x.astype(np.float16), w.astype(np.float16)
        got = convtune.conv_transpose2d(nhwc(xh), wh, stride=2, padding=1, pixel_shuffle=2, layout="NHWC")
        compare(got, nhwc(pixel_shuffle_reference(conv_transpose2d_reference(xh, wh, 2, 1), 2)), True, "float16")


def test_pixel_shuffle_after_the_transposed_convolution_is_refused_where_it_cannot_run():
    x, w = np.ones((1, 4, 5, 5), np.float32), np.ones((4, 8, 3, 3), np.float32)
    with pytest.raises(ValueError, match="needs padding within the kernel's reach"):
        convtune.conv_transpose2d(x, w, stride=2, padding=4, pixel_shuffle=2)
    with pytest.raises(ValueError, match="pixel_shuffle=3 needs output channels K divisible by 3"):
        convtune.conv_transpose2d(x, w, stride=2, pixel_shuffle=3)
    with pytest.raises(ValueError, match="cannot run on this shape"):
        convtune.conv_transpose2d(x, w, stride=2, pixel_shuffle=2, variant="tconv_wg64x1_k1w1")


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_pixel_shuffle_after_a_dilated_stride_one_transposed_convolution(layout):
    # At stride 1 a dilated transposed convolution lowers (the flipped taps d apart), and the
    # shuffle folds into that form's scatter as it does undilated: every family that takes
    # the problem, against pixel_shuffle(conv_transpose2d(...)) in float64, outputs poisoned.
    rng = np.random.default_rng(41)
    x = rng.standard_normal((2, 8, 9, 7)).astype(np.float32)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    kw = dict(padding=2, dilation=2, output_padding=1, pixel_shuffle=2, layout=layout)
    want = pixel_shuffle_reference(conv_transpose2d_reference(x, w, 1, 2, dilation=2, output_padding=1), 2)
    to = nhwc if layout == "NHWC" else (lambda a: a)
    check_close(convtune.conv_transpose2d(to(x), w, **kw), to(want), layout)
    ran = set()
    for name in swept(convtune.variant_space(), 3):
        try:
            got = convtune.conv_transpose2d(to(x), w, variant=name, **kw)
        except ValueError as e:
            assert "cannot run" in str(e) or "the adapter allows" in str(e), (name, e)
            continue
        check_close(got, to(want), f"{name} {layout}")
        ran.add(name.split("_")[0])
    assert {"direct", "gemm"} <= ran, ran
    assert not any(n.startswith("tconv") for n in [convtune.default_variant(
        to(x).shape, w.shape, 1, 2, 2, transposed=True, output_padding=1, pixel_shuffle=2, layout=layout)])


def test_matches_a_stride_one_conv2d_with_the_flipped_weights():
    # A second witness besides the reference: at stride 1, conv_transpose2d is conv2d with
    # padding R - 1 - p and w flipped and swapped to (K, C, R, S).
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 9, 8)).astype(np.float32)
    w = rng.standard_normal((5, 4, 3, 2)).astype(np.float32)
    got = convtune.conv_transpose2d(x, w, padding=(1, 0))
    flipped = np.ascontiguousarray(w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
    want = convtune.conv2d(x, flipped, padding=(1, 1))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_nan_reaches_only_the_outputs_its_taps_reach():
    x = np.ones((1, 2, 5, 5), np.float32)
    x[0, 1, 2, 3] = np.nan
    w = np.ones((2, 3, 3, 3), np.float32)
    w[0, 0, 0, 0] = np.inf  # applied to finite inputs only: infinite, never NaN by omission
    kw = dict(stride=2, padding=1, output_padding=1)
    got = convtune.conv_transpose2d(x, w, **kw)
    want = conv_transpose2d_reference(x, w, **kw)
    assert np.isnan(want).any() and not np.isnan(want).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))


def test_outputs_no_input_reaches_hold_the_epilogue_of_zero():
    # Stride 4 with a 1x1 filter: three of every four rows and columns receive nothing.
    x = np.random.default_rng(5).standard_normal((1, 3, 4, 4)).astype(np.float32)
    w = np.ones((3, 2, 1, 1), np.float32)
    b = np.array([0.25, -1.0], np.float32)
    got = convtune.conv_transpose2d(x, w, stride=4, output_padding=3, bias=b, activation="relu")
    assert got.shape == (1, 2, 16, 16)
    assert (got[:, 0, 1::4, :] == 0.25).all() and (got[:, 1, :, 2::4] == 0.0).all()
    check_close(got, apply_epilogue(conv_transpose2d_reference(x, w, 4, 0, 3), b, activation="relu"))


def test_device_tensors_chain_a_decoder():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
    w1 = (rng.standard_normal((8, 4, 4, 4)) / 8).astype(np.float32)
    w2 = (rng.standard_normal((4, 2, 3, 3)) / 6).astype(np.float32)
    t = convtune.conv_transpose2d(convtune.to_device(x), w1, stride=2, padding=1, activation="relu")
    assert isinstance(t, convtune.Tensor) and t.shape == (1, 4, 12, 12)
    z = rng.standard_normal((1, 2, 24, 24)).astype(np.float32)
    y = convtune.conv_transpose2d(t, w2, stride=2, padding=1, output_padding=1, z=convtune.to_device(z))
    h = apply_epilogue(conv_transpose2d_reference(x, w1, 2, 1), activation="relu")
    want = apply_epilogue(conv_transpose2d_reference(h, w2, 2, 1, 1), z=z)
    check_close(y.numpy(), want)


def test_introspection_names_the_transposed_problem():
    xs, ws = (1, 8, 6, 6), (8, 8, 3, 3)  # valid both as a conv and as a transpose
    assert convtune.default_variant(xs, ws, 2, 1, transposed=True, output_padding=1).startswith("tconv_")
    assert not convtune.default_variant(xs, ws, 2, 1).startswith("tconv_")
    src = convtune.wgsl("tconv_wg64x1_k4w1", xs, ws, 2, 1, transposed=True, output_padding=1)
    assert "conv_transpose2d" in src and "T op1" in src
    # Other families compute it in its lowered form: the weight pass is a module of its own.
    src = convtune.wgsl("direct_wg64x1_u0_k1w1", xs, ws, 2, 1, transposed=True)
    assert "ystore" in src and "return -1;" in src
    # Dilated past stride 1 too, its kernel spread out (zeros between the weights).
    assert "ystore" in convtune.wgsl("direct_wg64x1_u0_k1w1", xs, ws, 2, 1, 2, transposed=True)
    with pytest.raises(ValueError, match="cannot run on this shape.*padding past its kernel's reach"):
        convtune.wgsl("direct_wg64x1_u0_k1w1", xs, ws, 2, 4, transposed=True)
    with pytest.raises(ValueError, match="cannot run on this shape"):
        convtune.wgsl("tconv_wg64x1_k4w1", xs, ws, 2, 1)
    with pytest.raises(ValueError, match="output_padding needs transposed=True"):
        convtune.default_variant(xs, ws, output_padding=1)
    with pytest.raises(TypeError, match="transposed"):
        convtune.default_variant(xs, ws, transposed="yes")
    name, times = convtune.time_variant(xs, ws, 2, 1, transposed=True, reps=2, warmup=0)
    assert name.startswith("tconv_") and len(times) == 2


def test_forced_variant_of_another_family_is_refused():
    x = np.ones((1, 4, 5, 5), np.float32)
    w = np.ones((4, 4, 3, 3), np.float32)
    # Padding past the kernel's reach leaves no lowered form: tconv only.
    with pytest.raises(ValueError, match="cannot run on this shape"):
        convtune.conv_transpose2d(x, w, stride=2, padding=4, variant="gemm_b64x64x8_t4x4")
    with pytest.raises(ValueError, match="cannot run on this shape"):
        convtune.conv2d(x, w, variant="tconv_wg64x1_k1w1")


def test_tuned_and_cached_as_its_own_problem(tuning_env):
    xs, ws = (1, 8, 7, 7), (8, 8, 3, 3)
    e = convtune.explain(xs, ws, 2, 1, transposed=True, output_padding=1, bias=True)
    assert e.source == "tuned"
    statuses = {c["name"]: c["status"] for c in e.candidates}
    # Its own family and the others' lowered forms compete; each is checked first.
    assert any(n.startswith("tconv_") for n in statuses) and any(not n.startswith("tconv_") for n in statuses)
    assert statuses[e.variant] == "ok" and "invalid" not in statuses.values()
    assert convtune.explain(xs, ws, 2, 1, transposed=True, output_padding=1, bias=True).source == "cache"
    # The same shapes as a plain conv2d are a different problem, of other families.
    plain = convtune.explain(xs, ws, 2, 1, bias=True)
    assert plain.source == "tuned" and not plain.variant.startswith("tconv_")
    rng = np.random.default_rng(11)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    y = convtune.conv_transpose2d(x, w, 2, 1, 1, bias=b)
    check_close(y, conv_transpose2d_reference(x, w, 2, 1, 1, bias=b))


X = np.ones((1, 4, 5, 5), np.float32)
W = np.ones((4, 2, 3, 3), np.float32)


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(w=np.ones((4, 2, 3), np.float32)), ValueError, r"w must be 4-D \(C, K/groups, R, S\)"),
    (dict(w=np.ones((3, 2, 3, 3), np.float32)), ValueError, r"w.shape\[0\] must be x's channel count C = 4"),
    (dict(groups=3), ValueError, "groups"),
    (dict(groups=0), ValueError, "groups"),
    (dict(stride=2, output_padding=2), ValueError, "output_padding must be smaller than the stride or the dilation"),
    (dict(stride=1, dilation=1, output_padding=1), ValueError, "output_padding"),
    (dict(stride=(2, 1), output_padding=(0, 1)), ValueError, "output_padding .* along the width"),
    (dict(output_padding=-1), ValueError, "output_padding must be >= 0"),
    (dict(padding=-1), ValueError, "padding must be >= 0"),
    (dict(stride=0), ValueError, "stride must be >= 1"),
    (dict(dilation=(1, -2)), ValueError, "dilation must be >= 1"),
    (dict(padding=4), ValueError, "padding .* leaves an empty output"),
    (dict(padding="same"), TypeError, "padding must be an int or an \\(h, w\\) pair"),
    (dict(output_padding="1"), TypeError, "output_padding"),
    (dict(output_padding=(1, 1, 1)), ValueError, "output_padding"),
    (dict(output_padding=1.5), TypeError, "output_padding"),
    (dict(bias=np.ones(4, np.float32)), ValueError, "bias must have K=2"),
    (dict(z=np.ones((1, 2, 5, 5), np.float32)), ValueError, r"z must have the output's shape"),
    (dict(w=np.ones((4, 2, 3, 3), np.float16)), TypeError, "float16"),
    (dict(variant="tconv_wg64x1_k3w1"), ValueError, "unknown variant"),
])
def test_bad_arguments_raise_naming_them(kwargs, exc, match):
    args = dict(x=X, w=W)
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        convtune.conv_transpose2d(**args)


def test_sizes_are_checked_before_any_copy():
    # A broadcast view of 2^33 elements: refused on its shape, never materialised.
    x = np.broadcast_to(np.float32(1.0), (8, 1024, 1024, 1024))
    w = np.ones((1024, 1, 1, 1), np.float32)
    with pytest.raises((ValueError, convtune.OutOfMemoryError), match="elements|bytes"):
        convtune.conv_transpose2d(x, w)
    # The output is what grows: a 2x upsampler of a 2^29-element x.
    x = np.broadcast_to(np.float32(1.0), (1, 8, 8192, 8192))
    w = np.ones((8, 8, 2, 2), np.float32)
    with pytest.raises((ValueError, convtune.OutOfMemoryError), match="elements|bytes"):
        convtune.conv_transpose2d(x, w, stride=2)


def test_readme_examples(tuning_env):
    # README.md's conv_transpose2d examples, run as written on small arrays.
    run, tuning = readme_examples("test_readme_examples")
    rng = np.random.default_rng(13)
    x = rng.standard_normal((2, 8, 5, 6)).astype(np.float32)
    w = (rng.standard_normal((8, 4, 4, 4)) / 8).astype(np.float32)
    w3 = (rng.standard_normal((8, 4, 3, 3)) / 6).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    scope = {"convtune": convtune, "x": x, "w": w, "w3": w3, "b": b}
    exec(compile(run, "README.md", "exec"), scope)
    assert isinstance(scope["t"], convtune.Tensor) and scope["y"].shape == (2, 4, 10, 12)
    check_close(scope["y"], conv_transpose2d_reference(x, w, 2, 1), "README: the Tensor call")
    exec(compile(tuning, "README.md", "exec"), scope)
    report = convtune.tune(x, w3, stride=2, padding=1, transposed=True, output_padding=1, bias=True,
                           activation="relu")
    assert report.shape.startswith("2x8x5x6 k4 3x3 s2 p1 T op1 +b")
    assert convtune.default_variant(x.shape, w.shape, stride=2, padding=1, transposed=True).startswith("tconv_")
