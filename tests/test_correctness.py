"""conv2d against a float64 numpy reference: a seeded random sweep, every kernel variant,
NaN propagation, the dtype policy and unusual memory layouts.

The conftest turns output poisoning on, so any output element a kernel fails to write is NaN
and fails the comparison (the reference has no NaN unless the input has).

Reproduce a failing sweep case with ``CONVTUNE_TEST_SEED=<base> pytest -k 'sweep and [<i>]'``;
the assertion message names the seed (``base + index``) the case was drawn from.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import convtune
from reference import (swept, swept_range,
    check_close,
    max_rel_err,
    output_shape,
    random_conv_inputs,
    reference_conv2d,
    resolve_padding,
)

# --------------------------------------------------------------------------------------------
# The random sweep
# --------------------------------------------------------------------------------------------

DEFAULT_SEED = 20_240_611
BASE_SEED = int(os.environ.get("CONVTUNE_TEST_SEED", DEFAULT_SEED))
N_CASES = 240
# Bound on multiply-adds per case (N*K*OH*OW*C/groups*R*S) so the sweep stays fast on lavapipe.
MAX_MACS = 2e7

# Cycled over the case index so every seed covers every group and padding mode.
GROUP_MODES = ("one", "divisor", "depthwise")
PAD_MODES = ("int", "pair", "same", "valid")


def _maybe_int(rng, pair):
    """An (h, w) pair, passed as a plain int half the time when both are equal."""
    a, b = int(pair[0]), int(pair[1])
    if a == b and rng.random() < 0.5:
        return a
    return (a, b)


def macs(case) -> float:
    n, k, oh, ow = output_shape(case["x_shape"], case["w_shape"], case["stride"], case["padding"],
                                case["dilation"])
    _, cg, r, s = case["w_shape"]
    return float(n) * k * oh * ow * cg * r * s


def draw_case(index: int, base_seed: int = BASE_SEED):
    """Parameters of sweep case `index`, drawn from default_rng(base_seed + index)."""
    seed = base_seed + index
    rng = np.random.default_rng(seed)
    gmode = GROUP_MODES[index % len(GROUP_MODES)]
    pmode = PAD_MODES[(index // len(GROUP_MODES)) % len(PAD_MODES)]
    for _ in range(100_000):
        n = int(rng.integers(1, 5))
        if gmode == "one":
            g = 1
            c = int(rng.integers(1, 71))
            k = int(rng.integers(1, 71))
        elif gmode == "depthwise":
            c = int(rng.integers(1, 71))
            g = c
            k = c * int(rng.integers(1, 70 // c + 1))  # channel multiplier, K <= 70
        else:
            c = int(rng.integers(2, 71))
            divisors = [d for d in range(2, c) if c % d == 0]
            if not divisors:
                continue
            g = int(rng.choice(divisors))
            k = g * int(rng.integers(1, 70 // g + 1))
        h = int(rng.integers(1, 71))
        w = int(rng.integers(1, 71))
        r = int(rng.integers(1, 8))
        s = int(rng.integers(1, 8))
        dilation = _maybe_int(rng, rng.integers(1, 4, size=2))
        if pmode == "same":
            stride = 1 if rng.random() < 0.5 else (1, 1)
            padding = "same"
        else:
            stride = _maybe_int(rng, rng.integers(1, 4, size=2))
            if pmode == "valid":
                padding = "valid"
            elif pmode == "int":
                padding = int(rng.integers(0, 4))
            else:
                padding = (int(rng.integers(0, 4)), int(rng.integers(0, 4)))
        bias = bool(rng.random() < 0.5)
        case = dict(
            seed=seed,
            x_shape=(n, c, h, w),
            w_shape=(k, c // g, r, s),
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=g,
            bias=bias,
        )
        _, _, oh, ow = output_shape(case["x_shape"], case["w_shape"], stride, padding, dilation)
        if oh < 1 or ow < 1:
            continue  # the dilated kernel exceeds the padded input
        if macs(case) > MAX_MACS:
            continue
        case["rng"] = rng
        return case
    raise RuntimeError(f"could not draw a case from seed {seed}")


def _describe(case) -> str:
    c = {k: v for k, v in case.items() if k not in ("rng", "seed")}
    return (
        f"seed={case['seed']} (CONVTUNE_TEST_SEED={BASE_SEED} + index "
        f"{case['seed'] - BASE_SEED}) {c}"
    )


def test_sweep_covers_the_parameter_space():
    """The sweep's draws (no GPU needed) span the ranges the sweep is meant to cover."""
    cases = [draw_case(i) for i in range(N_CASES)]
    assert len(cases) >= 200

    def any_(pred):
        return any(pred(c) for c in cases)

    pair = lambda v: v if isinstance(v, tuple) else (v, v)  # noqa: E731
    assert {c["x_shape"][0] for c in cases} == {1, 2, 3, 4}
    assert any_(lambda c: c["x_shape"][1] % 2 == 1 and c["x_shape"][1] > 1)  # odd C
    assert any_(lambda c: c["x_shape"][1] == 1)
    assert any_(lambda c: c["x_shape"][1] >= 48)
    assert any_(lambda c: c["w_shape"][0] >= 48)
    assert any_(lambda c: c["x_shape"][2] != c["x_shape"][3])  # non-square images
    assert any_(lambda c: min(c["x_shape"][2:]) <= 3)
    assert any_(lambda c: max(c["x_shape"][2:]) >= 60)
    assert any_(lambda c: c["w_shape"][2:] == (1, 1))
    assert any_(lambda c: c["w_shape"][2] != c["w_shape"][3])  # non-square kernels
    assert any_(lambda c: max(c["w_shape"][2:]) == 7)
    assert {c["groups"] == 1 for c in cases} == {True, False}
    assert any_(lambda c: 1 < c["groups"] < c["x_shape"][1])  # a proper divisor
    assert any_(lambda c: c["groups"] == c["x_shape"][1] > 1)  # depthwise
    assert any_(lambda c: c["groups"] == c["x_shape"][1] and c["w_shape"][0] > c["groups"])
    assert any_(lambda c: 3 in pair(c["stride"]))
    assert any_(lambda c: 2 in pair(c["stride"]))
    assert any_(lambda c: 3 in pair(c["dilation"]))
    assert {type(c["padding"]) for c in cases} == {int, tuple, str}
    assert {c["padding"] for c in cases if isinstance(c["padding"], str)} == {"same", "valid"}
    assert any_(lambda c: not isinstance(c["padding"], str) and 3 in pair(c["padding"]))
    # 'same' with an even effective kernel pads asymmetrically.
    assert any_(
        lambda c: c["padding"] == "same"
        and any(a != b for a, b in resolve_padding("same", c["w_shape"][2:], pair(c["dilation"])))
    )
    assert {c["bias"] for c in cases} == {True, False}
    assert all(c["padding"] != "same" or pair(c["stride"]) == (1, 1) for c in cases)
    assert all(macs(c) <= MAX_MACS for c in cases)


@pytest.mark.parametrize("index", swept_range(N_CASES))
def test_sweep(index):
    case = draw_case(index)
    x, w, b = random_conv_inputs(case["rng"], case["x_shape"], case["w_shape"], case["bias"])
    args = (case["stride"], case["padding"], case["dilation"], case["groups"])
    where = _describe(case)
    try:
        got = convtune.conv2d(x, w, *args, bias=b)
    except Exception as e:  # keep the seed in the failure message
        pytest.fail(f"conv2d raised {type(e).__name__}: {e} [{where}]")
    ref = reference_conv2d(x, w, *args, bias=b)
    check_close(got, ref, context=where)


def _draw_variant(rng, case) -> str:
    """A variant for the case: either family with equal odds, uniform within the family,
    keeping the written-out direct window to a size that compiles quickly."""
    _, _, r, s = case["w_shape"]
    family = "gemm" if rng.random() < 0.5 else "direct"
    names = [v for v in convtune.variant_space() if v.startswith(family)]
    if family == "gemm":
        # Leave out tiles whose workgroup memory exceeds the adapter's (the runner refuses them).
        limit = convtune.adapter_info()["limits"]["max_compute_workgroup_storage_size"]

        def wg_bytes(v):
            k = convtune.variant_knobs(v)
            return 4 * k["bk"] * (k["bm"] + k["bn"] + 1)
        names = [v for v in names if wg_bytes(v) <= limit]
    else:
        def terms(v):
            k = convtune.variant_knobs(v)
            return r * s * k["tk"] * k["tw"] * max(k["unroll"], 1)
        names = [v for v in names if terms(v) <= 256]
    return str(rng.choice(names))


@pytest.mark.parametrize("index", swept_range(N_CASES))
def test_sweep_random_variant(index):
    """The same cases run with a randomly chosen variant, so both families see every shape."""
    case = draw_case(index)
    x, w, b = random_conv_inputs(case["rng"], case["x_shape"], case["w_shape"], case["bias"])
    args = (case["stride"], case["padding"], case["dilation"], case["groups"])
    name = _draw_variant(case["rng"], case)
    where = f"variant={name} " + _describe(case)
    try:
        got = convtune.conv2d(x, w, *args, bias=b, variant=name)
    except ValueError as e:
        if "the adapter allows" in str(e):
            pytest.skip(f"{name} exceeds this adapter's limits")
        pytest.fail(f"conv2d raised ValueError: {e} [{where}]")
    except Exception as e:
        pytest.fail(f"conv2d raised {type(e).__name__}: {e} [{where}]")
    ref = reference_conv2d(x, w, *args, bias=b)
    check_close(got, ref, context=where)


# --------------------------------------------------------------------------------------------
# The reference itself
# --------------------------------------------------------------------------------------------


def _naive(x, w, stride, padding, dilation, groups, bias):
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    sh, sw = stride
    dh, dw = dilation
    (pt, _), (pl, _) = resolve_padding(padding, (r, s), dilation)
    _, _, oh, ow = output_shape(x.shape, w.shape, stride, padding, dilation)
    kg = k // groups
    y = np.zeros((n, k, oh, ow))
    for nn in range(n):
        for kk in range(k):
            gg = kk // kg
            for i in range(oh):
                for j in range(ow):
                    acc = 0.0 if bias is None else float(bias[kk])
                    for cc in range(cg):
                        for rr in range(r):
                            for ss in range(s):
                                ih = i * sh - pt + rr * dh
                                iw = j * sw - pl + ss * dw
                                if 0 <= ih < h and 0 <= iw < wd:
                                    acc += x[nn, gg * cg + cc, ih, iw] * w[kk, cc, rr, ss]
                    y[nn, kk, i, j] = acc
    return y


@pytest.mark.parametrize(
    "x_shape, w_shape, stride, padding, dilation, groups, bias",
    [
        ((2, 4, 7, 6), (6, 2, 3, 2), (2, 1), (1, 2), (1, 2), 2, True),
        ((1, 3, 6, 5), (2, 3, 4, 2), (1, 1), "same", (2, 1), 1, False),
        ((1, 3, 5, 8), (3, 1, 2, 3), (1, 3), "valid", (1, 1), 3, True),
        ((1, 2, 4, 4), (1, 2, 4, 4), (1, 1), "same", (1, 1), 1, False),
    ],
)
def test_reference_matches_naive_loops(x_shape, w_shape, stride, padding, dilation, groups, bias):
    rng = np.random.default_rng(7)
    x, w, b = random_conv_inputs(rng, x_shape, w_shape, bias)
    got = reference_conv2d(x, w, stride, padding, dilation, groups, b)
    np.testing.assert_allclose(got, _naive(x, w, stride, padding, dilation, groups, b), rtol=1e-12,
                               atol=1e-12)


def test_reference_same_padding_is_asymmetric():
    assert resolve_padding("same", (4, 3), (1, 1)) == ((1, 2), (1, 1))
    assert resolve_padding("same", (2, 3), (3, 2)) == ((1, 2), (2, 2))


# --------------------------------------------------------------------------------------------
# Fixed shapes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("padding", [0, 1])
def test_seed_shape_225(padding):
    rng = np.random.default_rng(225 + padding)
    x, w, _ = random_conv_inputs(rng, (1, 3, 225, 225), (32, 3, 3, 3), False)
    got = convtune.conv2d(x, w, padding=padding)
    assert got.shape == (1, 32, 225 - 2 + 2 * padding, 225 - 2 + 2 * padding)
    check_close(got, reference_conv2d(x, w, padding=padding), context=f"padding={padding}")


ALL_WRITTEN_CASES = [
    # (x_shape, w_shape, kwargs, variant)
    ((1, 3, 225, 225), (32, 3, 3, 3), dict(padding=1), None),
    # The default rule picks the GEMM family here.
    ((1, 32, 70, 70), (64, 32, 3, 3), dict(padding=1), None),
    # Odd sizes that leave partial tiles everywhere.
    ((3, 5, 37, 29), (7, 5, 3, 5), dict(stride=(2, 1), padding=(2, 1)), "gemm_b64x64x16_t4x4"),
    ((3, 5, 37, 29), (7, 5, 3, 5), dict(stride=(2, 1), padding=(2, 1)), "direct_wg16x4_u2_k4w4"),
    # 2*1024*64 = 131072 workgroups: more than the 65535 of one grid dimension.
    ((2, 1, 256, 256), (64, 1, 1, 1), {}, "direct_wg64x1_u1_k1w1"),
]


@pytest.mark.parametrize("x_shape, w_shape, kwargs, variant", ALL_WRITTEN_CASES)
def test_every_output_is_written(x_shape, w_shape, kwargs, variant):
    rng = np.random.default_rng(1)
    x, w, b = random_conv_inputs(rng, x_shape, w_shape, True)
    got = convtune.conv2d(x, w, bias=b, variant=variant, **kwargs)
    assert got.shape == output_shape(x_shape, w_shape, kwargs.get("stride", 1),
                                     kwargs.get("padding", 0))
    bad = np.argwhere(~np.isfinite(got))
    assert bad.size == 0, f"{len(bad)} outputs not finite (unwritten?), first {bad[:5].tolist()}"
    check_close(got, reference_conv2d(x, w, bias=b, **kwargs), context=f"variant={variant}")


def test_default_rule_is_the_models_likeliest_winner_on_a_gpu():
    """The untuned choice: on a GPU the cost model's first-ranked variant that serves the
    mode (the seed shape takes a stem kernel, a 3x3 body layer a Winograd or tensor-core
    one); on a CPU adapter, for which the model's estimates were not fitted, the fixed
    rule's GEMM or direct kernels. The same every call."""
    body = convtune.default_variant((1, 32, 70, 70), (64, 32, 3, 3), padding=1)
    seed = convtune.default_variant((1, 3, 225, 225), (32, 3, 3, 3), padding=1)
    if convtune.adapter_info()["type"] == "Cpu":
        assert (body.split("_")[0], seed.split("_")[0]) == ("gemm", "direct"), (body, seed)
    else:
        assert seed.startswith("stem_"), seed
        assert body.split("_")[0] in ("wino", "wgemm", "wcoop", "coop"), body
    assert body == convtune.default_variant((1, 32, 70, 70), (64, 32, 3, 3), padding=1)


def test_default_call_equals_explicit_default_variant():
    rng = np.random.default_rng(3)
    for x_shape, w_shape in [((1, 32, 70, 70), (64, 32, 3, 3)), ((2, 6, 13, 9), (4, 3, 3, 2))]:
        groups = x_shape[1] // w_shape[1]
        x, w, _ = random_conv_inputs(rng, x_shape, w_shape, False)
        name = convtune.default_variant(x_shape, w_shape, padding=1, groups=groups)
        a = convtune.conv2d(x, w, padding=1, groups=groups)
        b = convtune.conv2d(x, w, padding=1, groups=groups, variant=name)
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------------------------
# NaN propagation
# --------------------------------------------------------------------------------------------


def _covers(out_shape, pos, x_shape, w_shape, stride, padding, dilation, groups):
    """Boolean mask of the outputs whose receptive field contains input position `pos`."""
    n0, c0, h0, w0 = pos
    _, c, _, _ = x_shape
    k, cg, r, s = w_shape
    kg = k // groups
    (pt, _), (pl, _) = resolve_padding(padding, (r, s), dilation)
    mask = np.zeros(out_shape, dtype=bool)
    g = c0 // cg
    for i in range(out_shape[2]):
        for j in range(out_shape[3]):
            hit_h = any(i * stride[0] - pt + rr * dilation[0] == h0 for rr in range(r))
            hit_w = any(j * stride[1] - pl + ss * dilation[1] == w0 for ss in range(s))
            if hit_h and hit_w:
                mask[n0, g * kg : (g + 1) * kg, i, j] = True
    return mask


NAN_VARIANTS = [None, "direct_wg64x1_u0_k1w1", "direct_wg8x8_u4_k2w2", "gemm_b32x32x8_t4x4"]


@pytest.mark.parametrize("variant", NAN_VARIANTS)
@pytest.mark.parametrize("pos", [(1, 3, 5, 6), (0, 0, 0, 0)])
def test_nan_propagates_to_exactly_the_covering_outputs(variant, pos):
    x_shape, w_shape = (2, 4, 12, 11), (6, 2, 3, 2)
    stride, padding, dilation, groups = (2, 1), (1, 1), (1, 2), 2
    rng = np.random.default_rng(11)
    x, w, b = random_conv_inputs(rng, x_shape, w_shape, True)
    x[pos] = np.nan
    got = convtune.conv2d(x, w, stride, padding, dilation, groups, bias=b, variant=variant)
    expect_nan = _covers(got.shape, pos, x_shape, w_shape, stride, padding, dilation, groups)
    assert expect_nan.any() and not expect_nan.all()
    np.testing.assert_array_equal(np.isnan(got), expect_nan, err_msg=f"variant={variant}")
    assert np.isfinite(got[~expect_nan]).all()
    ref = reference_conv2d(x, w, stride, padding, dilation, groups, b)
    check_close(got, ref, context=f"variant={variant}, NaN at {pos}")


def test_nan_in_weights_propagates_to_its_output_channel():
    rng = np.random.default_rng(12)
    x, w, b = random_conv_inputs(rng, (1, 3, 9, 9), (4, 3, 3, 3), False)
    w[2, 1, 0, 2] = np.nan
    got = convtune.conv2d(x, w, padding=1)
    # Every output of channel 2 multiplies that weight, by an input or by a padding zero
    # (0 * NaN is NaN, as in PyTorch's zero padding); the other channels stay finite.
    expect = np.zeros(got.shape, dtype=bool)
    expect[:, 2] = True
    np.testing.assert_array_equal(np.isnan(got), expect)
    check_close(got, reference_conv2d(x, w, padding=1))


# --------------------------------------------------------------------------------------------
# Dtype policy and memory layout
# --------------------------------------------------------------------------------------------

X_SHAPE, W_SHAPE = (2, 4, 10, 9), (6, 2, 3, 3)
KW = dict(stride=(1, 2), padding=1, dilation=1, groups=2)


def _ints(rng, dtype, shape, lo, hi):
    return rng.integers(lo, hi, size=shape).astype(dtype)


@pytest.mark.parametrize(
    "dtype, lo, hi",
    [
        (np.float64, None, None),
        # float16 x and w stay float16 (test_float16.py).
        (np.int32, -50, 50),
        (np.uint8, 0, 256),
        (np.int8, -128, 128),
        (np.int64, -1000, 1000),
        (np.uint16, 0, 1000),
    ],
)
def test_dtype_is_cast_to_float32(dtype, lo, hi):
    rng = np.random.default_rng(5)
    if lo is None:
        x = rng.standard_normal(X_SHAPE).astype(dtype)
        w = rng.standard_normal(W_SHAPE).astype(dtype)
        b = rng.standard_normal(W_SHAPE[0]).astype(dtype)
    else:
        x = _ints(rng, dtype, X_SHAPE, lo, hi)
        w = _ints(rng, dtype, W_SHAPE, max(lo, -5), min(hi, 5))
        b = _ints(rng, dtype, (W_SHAPE[0],), max(lo, -5), min(hi, 5))
    assert np.abs(x).max() > 0
    x_before = x.copy()
    got = convtune.conv2d(x, w, bias=b, **KW)
    want = convtune.conv2d(x.astype(np.float32), w.astype(np.float32), bias=b.astype(np.float32),
                           **KW)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(x, x_before)  # the input is not modified
    assert not np.shares_memory(got, x)
    check_close(got, reference_conv2d(x.astype(np.float32), w.astype(np.float32), bias=b, **KW))


def test_result_is_a_new_float32_array():
    rng = np.random.default_rng(6)
    x, w, b = random_conv_inputs(rng, X_SHAPE, W_SHAPE, True)
    x_before, w_before, b_before = x.copy(), w.copy(), b.copy()
    y1 = convtune.conv2d(x, w, bias=b, **KW)
    y2 = convtune.conv2d(x, w, bias=b, **KW)
    for y in (y1, y2):
        assert isinstance(y, np.ndarray)
        assert y.dtype == np.float32
        assert y.flags.c_contiguous and y.flags.writeable and y.flags.owndata
        for a in (x, w, b):
            assert not np.shares_memory(y, a)
    assert not np.shares_memory(y1, y2)
    np.testing.assert_array_equal(y1, y2)
    y1[...] = 0.0
    np.testing.assert_array_equal(x, x_before)
    np.testing.assert_array_equal(w, w_before)
    np.testing.assert_array_equal(b, b_before)
    assert np.isfinite(y2).all() and np.abs(y2).max() > 0


def test_identity_kernel_returns_a_copy_of_x():
    """A 1x1 identity convolution: same values as x, but never the same memory."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 3, 5, 4), dtype=np.float32)
    w = np.eye(3, dtype=np.float32).reshape(3, 3, 1, 1)
    y = convtune.conv2d(x, w)
    np.testing.assert_array_equal(y, x)
    assert not np.shares_memory(y, x)


@pytest.mark.parametrize(
    "make_x, make_w",
    [
        (lambda x: x[:, :, ::2, ::-1], lambda w: w),
        (lambda x: np.asfortranarray(x), lambda w: np.asfortranarray(w)),
        (lambda x: x.transpose(0, 1, 3, 2), lambda w: w[:, :, ::-1, :]),
        (lambda x: x[::2], lambda w: w.transpose(0, 1, 3, 2).copy().transpose(0, 1, 3, 2)),
    ],
    ids=["strided-reversed", "fortran", "transposed", "batch-strided"],
)
def test_non_contiguous_inputs(make_x, make_w):
    rng = np.random.default_rng(9)
    x_full, w_full, b = random_conv_inputs(rng, (4, 4, 20, 18), (6, 2, 3, 3), True)
    x, w = make_x(x_full), make_w(w_full)
    got = convtune.conv2d(x, w, bias=b, **KW)
    check_close(got, reference_conv2d(x, w, bias=b, **KW))
    np.testing.assert_array_equal(
        got, convtune.conv2d(np.ascontiguousarray(x), np.ascontiguousarray(w), bias=b, **KW)
    )


def test_non_contiguous_bias():
    rng = np.random.default_rng(10)
    x, w, _ = random_conv_inputs(rng, X_SHAPE, W_SHAPE, False)
    b = rng.standard_normal(2 * W_SHAPE[0]).astype(np.float32)[::2]
    got = convtune.conv2d(x, w, bias=b, **KW)
    check_close(got, reference_conv2d(x, w, bias=b, **KW))


def test_nested_lists():
    rng = np.random.default_rng(13)
    x, w, b = random_conv_inputs(rng, (1, 2, 5, 6), (3, 2, 2, 3), True)
    got = convtune.conv2d(x.tolist(), w.tolist(), padding=1, bias=b.tolist())
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    check_close(got, reference_conv2d(x, w, padding=1, bias=b))
    # Python ints in nested lists too.
    xi = [[[[1, 2, 3], [4, 5, 6], [7, 8, 9]]]]
    wi = [[[[1, 0], [0, -1]]]]
    np.testing.assert_array_equal(
        convtune.conv2d(xi, wi), np.array([[[[-4, -4], [-4, -4]]]], dtype=np.float32)
    )


def test_known_values_same_padding_even_kernel():
    """Hand-checkable: 'same' with a 2x2 kernel pads one row/column at the bottom/right."""
    x = np.arange(1, 10, dtype=np.float32).reshape(1, 1, 3, 3)
    w = np.ones((1, 1, 2, 2), dtype=np.float32)
    got = convtune.conv2d(x, w, padding="same")
    want = np.array([[[[12, 16, 9], [24, 28, 15], [15, 17, 9]]]], dtype=np.float32)
    np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------------------------
# Every variant of the generator
# --------------------------------------------------------------------------------------------

# Plain convolutions' variants; the tconv family takes transposed ones only
# (tests/test_conv_transpose.py).
VARIANTS = [v for v in convtune.variant_space() if not v.startswith("tconv_")]
# Small, but with stride 2, padding 1, dilation 2, groups 2 and bias; C/groups = 3 and
# K/groups = 3 are not multiples of any unroll or channel tile, OH*OW = 110 and
# N*OH*OW = 220 overflow the smaller spatial tiles.
V_X, V_W = (2, 6, 23, 19), (6, 3, 3, 2)
V_KW = dict(stride=2, padding=1, dilation=2, groups=2)
_V_INPUTS = random_conv_inputs(np.random.default_rng(17), V_X, V_W, True)
_V_REF = reference_conv2d(*_V_INPUTS[:2], bias=_V_INPUTS[2], **V_KW)


def test_variant_space_has_both_families():
    assert len(VARIANTS) == len(set(VARIANTS))
    assert any(v.startswith("direct_") for v in VARIANTS)
    assert any(v.startswith("gemm_") for v in VARIANTS)
    assert any(v.startswith("coop_") for v in VARIANTS)
    assert any(v.startswith("wino_") for v in VARIANTS)
    assert any(v.startswith("wgemm_") for v in VARIANTS)
    assert any(v.startswith("stem_") for v in VARIANTS)
    assert any(v.startswith("dwise_") for v in VARIANTS)
    assert all(v.startswith(("direct_", "stem_", "gemm_", "coop_", "wino_", "wgemm_", "wcoop_", "dwise_")) for v in VARIANTS)
    assert any(v.startswith("tconv_") for v in convtune.variant_space())


def test_variant_knobs_family_matches_name():
    for name in VARIANTS:
        knobs = convtune.variant_knobs(name)
        assert isinstance(knobs, dict)
        assert knobs["family"] == name.split("_")[0], (name, knobs)
        assert len(knobs) > 1, (name, knobs)


# dwise takes NHWC depthwise problems only: tests/test_dwise.py runs it.
@pytest.mark.parametrize("name", swept([v for v in VARIANTS if not v.startswith("dwise_")]))
def test_variant_matches_reference(name):
    x, w, b = _V_INPUTS
    try:
        got = convtune.conv2d(x, w, bias=b, variant=name, **V_KW)
    except ValueError as e:
        if any(why in str(e) for why in ("the adapter allows", "cannot run here", "cannot run on this shape")):
            pytest.skip(f"{name} cannot run on this adapter: {e}")
        raise
    if name.startswith("coop_") and convtune.variant_knobs(name)["split"] == 1:
        # Single-pass tensor-core variants serve precision "high" (TF32-class);
        # tests/test_precision.py covers the family in depth.
        assert max_rel_err(got, _V_REF) <= 4e-3, name
        return
    check_close(got, _V_REF, context=f"variant={name}")


def _default_shapes():
    return [
        ((1, 3, 225, 225), (32, 3, 3, 3), dict(padding=1)),
        ((1, 32, 70, 70), (64, 32, 3, 3), dict(padding=1, bias=True)),
        ((2, 6, 13, 9), (4, 3, 3, 2), dict(stride=2, padding="valid", groups=2, bias=4)),
        ((1, 8, 16, 16), (8, 1, 7, 7), dict(padding="same", groups=8)),
        ((1, 1, 1, 1), (1, 1, 1, 1), {}),
    ]


@pytest.mark.parametrize("x_shape, w_shape, kw", _default_shapes())
def test_default_variant_is_in_space_and_wgsl_names_it(x_shape, w_shape, kw):
    name = convtune.default_variant(x_shape, w_shape, **kw)
    assert isinstance(name, str)
    assert name in VARIANTS
    src = convtune.wgsl(name, x_shape, w_shape, **kw)
    assert isinstance(src, str)
    assert "@compute" in src
    assert name in src


def test_wgsl_for_every_variant():
    for name in VARIANTS:
        if name.startswith(("wino_", "wgemm_")):
            # Winograd F(mxm, 3x3), fused or not, takes 3x3 filters at stride 1 and dilation 1 only.
            src = convtune.wgsl(name, V_X, (6, 3, 3, 3), bias=True, padding=1, groups=2)
            with pytest.raises(ValueError, match="cannot run on this shape"):
                convtune.wgsl(name, V_X, V_W, bias=True, **V_KW)
        elif name.startswith("stem_"):
            # One group, at most 256 taps (its weights staged per workgroup).
            src = convtune.wgsl(name, (2, 3, 23, 19), (6, 3, 3, 2), bias=True, stride=(2, 1), dilation=(1, 2))
            with pytest.raises(ValueError, match="cannot run on this shape"):
                convtune.wgsl(name, V_X, V_W, bias=True, **V_KW)
        elif name.startswith("wcoop_"):
            # Winograd on tensor cores: 3x3 filters at stride 1 and dilation 1; float32 data
            # scaled from its maxima.
            src = convtune.wgsl(name, V_X, (6, 3, 3, 3), bias=True, padding=1, groups=2, dtype="float16")
            assert "scale_exp(run[0])" in convtune.wgsl(name, V_X, (6, 3, 3, 3), bias=True, padding=1, groups=2)
            with pytest.raises(ValueError, match="cannot run on this shape"):
                convtune.wgsl(name, V_X, V_W, bias=True, **V_KW)
        elif name.startswith("coop_") and convtune.variant_knobs(name)["layout"] == 2:
            # Layout 2 reads float16 NHWC x in place, 8 channels of a group at a time.
            src = convtune.wgsl(name, (2, 23, 19, 16), (6, 8, 3, 2), bias=True, layout="NHWC",
                                dtype="float16", **V_KW)
            with pytest.raises(ValueError, match="cannot run on this shape"):
                convtune.wgsl(name, V_X, V_W, bias=True, **V_KW)
        elif name.startswith("coop_") and convtune.variant_knobs(name)["layout"] >= 3:
            # Layouts 3 and 4 stage input windows: float16 NHWC, one group, stride and dilation 1.
            x, w = (2, 23, 19, 32), (6, 32, 3, 2)
            src = convtune.wgsl(name, x, w, bias=True, padding=1, layout="NHWC", dtype="float16")
            with pytest.raises(ValueError, match="cannot run on this shape: layouts 2 to 4"):
                convtune.wgsl(name, V_X, V_W, bias=True, **V_KW)
            with pytest.raises(ValueError, match="layouts 3 and 4 stage the input window"):
                convtune.wgsl(name, x, w, stride=2, padding=1, layout="NHWC", dtype="float16")
        elif name.startswith("dwise_"):
            # NHWC depthwise only, channels in vectors of the variant's width.
            src = convtune.wgsl(name, (2, 23, 19, 8), (8, 1, 3, 2), bias=True, layout="NHWC",
                                stride=2, padding=1, dilation=2, groups=8)
            assert "array<vec" in src, name
            with pytest.raises(ValueError, match="cannot run on this shape.*dwise family"):
                convtune.wgsl(name, V_X, V_W, bias=True, **V_KW)
        else:
            src = convtune.wgsl(name, V_X, V_W, bias=True, **V_KW)
        assert "@compute" in src, name
        assert name in src, name


# --------------------------------------------------------------------------------------------
# Concurrency
# --------------------------------------------------------------------------------------------


def test_concurrent_calls_from_threads():
    """conv2d releases the GIL; calls from several threads at once each get their own answer."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(21)
    jobs = []
    for i in range(24):
        x, w, b = random_conv_inputs(rng, (1, 4, 20 + i % 5, 17), (6, 2, 3, 3), i % 2 == 0)
        variant = ["direct_wg64x1_u1_k4w1", "gemm_b32x32x8_t4x4", None][i % 3]
        jobs.append((x, w, b, variant))

    def run(job):
        x, w, b, variant = job
        return convtune.conv2d(x, w, padding=1, groups=2, bias=b, variant=variant)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, jobs))
    for (x, w, b, variant), got in zip(jobs, results):
        check_close(got, reference_conv2d(x, w, padding=1, groups=2, bias=b),
                    context=f"variant={variant}, x {x.shape}")
