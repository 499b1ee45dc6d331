"""The fused epilogue ``y = act(alpha1 * conv + alpha2 * z + bias)``: every family's store
step against a float64 reference (outputs poisoned first), split problems and padding-only
rows, device Tensors and chaining, tuning with an epilogue, and bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

import convtune
from convtune.reference import apply_epilogue, conv2d_reference
from reference import check_close, run_ok
from tuning_support import tuning_env  # noqa: F401  (a fixture)

TC = convtune.adapter_info()["features"]["tensor_cores"]

# One or two variants of each family and each store path: direct (the reference and a
# register tile), implicit GEMM (two tiles), split-K (its finishing pass stores) and, where the
# adapter has tensor cores, the cooperative-matrix family in both layouts and both splits.
VARIANTS = [
    "direct_wg64x1_u0_k1w1",
    "direct_wg64x1_u1_k4w4",
    "gemm_b32x32x8_t4x4",
    "gemm_b64x64x16_t4x8",
    "gemm_b32x32x16_t4x4_k4",
    "gemm_b64x32x16_t4x4_k16",
]
if TC:
    VARIANTS += [f"coop_b64x64x32_s2x2_p{p}{l}" for p in (1, 3) for l in ("", "_l1")]

EPILOGUES = [
    dict(activation="relu"),
    dict(z=True, alpha1=0.5, alpha2=2.0),
    dict(z=True, alpha1=0.1, activation="leaky_relu", negative_slope=0.2),
    dict(activation="silu", alpha1=1.5),
    dict(z=True, activation="gelu"),
    dict(activation="clamp", clamp=(-0.5, 1.25)),
]

CASES = [
    # x, w, conv2d keywords
    ((2, 8, 12, 11), (6, 8, 3, 3), dict(padding=1)),
    ((1, 6, 9, 10), (10, 3, 3, 2), dict(stride=(2, 1), padding=(1, 0), groups=2)),
    ((3, 16, 7, 7), (20, 16, 1, 1), {}),
]


def _bound(variant: str) -> float:
    knobs = convtune.variant_knobs(variant)
    return 4e-3 if knobs.get("split") == 1 else 1e-5


def _check(got, want, pre, context, bound):
    """Within ``bound`` of the float64 result, relative to the largest value before the
    activation: a clamp shrinks the outputs, not the rounding of the sums it clamps."""
    check_close(got, want, context=context, rtol=bound * max(1.0, np.abs(pre).max() / max(np.abs(want).max(), 1e-6)))


def _run(rng, variant, xs, ws, kw, epi, bias=True, x=None):
    x = rng.standard_normal(xs).astype(np.float32) if x is None else x
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32) if bias else None
    conv = conv2d_reference(x, w, **kw)
    args = dict(epi)
    if args.pop("z", False):
        args["z"] = rng.standard_normal(conv.shape).astype(np.float32)
    prec = "high" if variant.startswith("coop") and convtune.variant_knobs(variant)["split"] == 1 else None
    got = convtune.conv2d(x, w, bias=b, variant=variant, precision=prec, **kw, **args)
    want = apply_epilogue(conv, b, **args)
    pre = apply_epilogue(conv, b, **{k: v for k, v in args.items() if k in ("z", "alpha1", "alpha2")})
    return got, want, pre


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("epi", EPILOGUES, ids=lambda e: "-".join(f"{k}" for k in e))
def test_every_family_applies_the_epilogue(variant, epi):
    rng = np.random.default_rng(abs(hash((variant, str(epi)))) % 2**32)
    for xs, ws, kw in CASES:
        got, want, pre = _run(rng, variant, xs, ws, kw, epi)
        _check(got, want, pre, f"{variant} {xs} {ws} {epi}", _bound(variant))


def test_plain_epilogue_arguments_are_the_plain_conv():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 4, 9, 9)).astype(np.float32)
    w = rng.standard_normal((5, 4, 3, 3)).astype(np.float32)
    a = convtune.conv2d(x, w, padding=1)
    b = convtune.conv2d(x, w, padding=1, alpha1=1.0, activation=None)
    assert np.array_equal(a, b)
    assert "epilogue" in convtune.wgsl("gemm_b32x32x8_t4x4", x, w, padding=1)
    src = convtune.wgsl("gemm_b32x32x8_t4x4", x, w, padding=1, z=True, activation="relu")
    assert "binding(7)" in src and "select(max(v, 0.0), v, nan)" in src


def test_nan_and_inf_follow_the_reference_through_activations():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    x[0, 1, 2, 3] = np.nan
    x[0, 2, 6, 6] = np.inf
    w = rng.standard_normal((3, 4, 3, 3)).astype(np.float32)
    for act in ("relu", "clamp", "leaky_relu"):
        kw = dict(activation=act, clamp=(-1.0, 1.0) if act == "clamp" else None)
        for v in ("direct_wg64x1_u0_k1w1", "gemm_b32x32x8_t4x4"):
            got = convtune.conv2d(x, w, padding=1, variant=v, **kw)
            want = apply_epilogue(conv2d_reference(x, w, padding=1), None, **kw)
            # Infinities must match exactly; the finite rest within the bound.
            inf = np.isinf(want)
            assert np.array_equal(got[inf], want[inf]) and not np.isinf(got[~inf]).any(), (v, act)
            check_close(np.where(inf, 0, got), np.where(inf, 0, want), context=f"{v} {act}")
            if act != "clamp":
                assert inf.any() and np.isnan(want).any(), "the case must exercise both"


SPLIT = r"""
import os, numpy as np, convtune
from convtune.reference import apply_epilogue, conv2d_reference, max_relative_error
convtune._convtune._set_poison(True)
rng = np.random.default_rng(5)
# NHWC row bands are one run per image, NCHW ones one per channel.
views = {"NCHW": lambda a: a, "NHWC": lambda a: np.ascontiguousarray(np.asarray(a).transpose(0, 2, 3, 1))}
# Padding 4 with a 3x3 window: the first and last output rows see padding only and are
# filled on the host, through the same epilogue.
cases = [((2, 3, 37, 29), (5, 3, 3, 3), 1, 1), ((1, 4, 13, 23), (3, 4, 3, 3), 1, 4)]
for binding in (10**9, 6000, 2500):
    os.environ["CONVTUNE_MAX_BINDING"] = str(binding)
    for (xs, ws, stride, pad), (layout, t) in [(c, v) for c in cases for v in views.items()]:
        x = rng.standard_normal(xs, dtype=np.float32)
        w = rng.standard_normal(ws, dtype=np.float32)
        b = rng.standard_normal(ws[0], dtype=np.float32)
        conv = conv2d_reference(x, w, stride, pad)
        z = rng.standard_normal(conv.shape, dtype=np.float32)
        for epi in (dict(activation="relu", alpha1=0.5), dict(z=z, alpha2=-1.5, activation="silu")):
            run = dict(epi, z=t(z)) if "z" in epi else epi
            y = convtune.conv2d(t(x), w, stride, pad, bias=b, layout=layout, **run)
            err = max_relative_error(y, t(apply_epilogue(conv, b, **epi)))
            assert err <= 1e-5, (binding, xs, layout, sorted(epi), err)
print("ok")
"""


def test_split_problems_and_padding_only_rows_apply_the_epilogue():
    """Problems too large for one binding run as row bands, each uploading its part of z,
    in both layouts."""
    run_ok(SPLIT)


def test_tensor_calls_take_z_as_tensor_or_array():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 8, 10, 10)).astype(np.float32)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    z = rng.standard_normal((2, 8, 10, 10)).astype(np.float32)
    want = apply_epilogue(conv2d_reference(x, w, padding=1), None, z=z, alpha1=0.1, activation="relu")
    xt = convtune.to_device(x)
    for zz in (z, convtune.to_device(z)):
        y = convtune.conv2d(xt, w, padding=1, z=zz, alpha1=0.1, activation="relu")
        assert isinstance(y, convtune.Tensor)
        check_close(y.numpy(), want)
    # A Tensor z with a host x is read back and used like an array.
    check_close(convtune.conv2d(x, w, padding=1, z=convtune.to_device(z), alpha1=0.1, activation="relu"), want)


def test_chained_residual_blocks_on_tensors():
    """EDSR-style blocks (conv -> relu -> conv -> x0.1 + skip) on device Tensors, the skip
    added in the second conv's store step: no host round trip, no elementwise pass."""
    rng = np.random.default_rng(4)
    c = 8
    h = rng.standard_normal((1, c, 12, 12)).astype(np.float32)
    ws = [(rng.standard_normal((c, c, 3, 3)) * 0.2).astype(np.float32) for _ in range(20)]
    want = h.astype(np.float64)
    for i in range(10):
        t = apply_epilogue(conv2d_reference(want, ws[2 * i], padding=1), None, activation="relu")
        want = apply_epilogue(conv2d_reference(t, ws[2 * i + 1], padding=1), None, z=want, alpha1=0.1)
    cur = convtune.to_device(h)
    for i in range(10):
        t = convtune.conv2d(cur, ws[2 * i], padding=1, activation="relu")
        cur = convtune.conv2d(t, ws[2 * i + 1], padding=1, z=cur, alpha1=0.1)
    check_close(cur.numpy(), want, rtol=1e-4)


def test_tuning_validates_with_the_epilogue_and_keys_on_it(tuning_env):
    x, w = (1, 4, 10, 10), (8, 4, 3, 3)
    plain = convtune.tune(x, w, padding=1)
    fused = convtune.tune(x, w, padding=1, z=True, alpha1=0.5, activation="gelu")
    assert fused.shape.endswith("*0.5 +z gelu"), fused.shape
    assert fused.shape != plain.shape
    ok = [c for c in fused.candidates if c["status"] == "ok"]
    assert ok and fused.winner in {c["name"] for c in ok}
    # Cached separately: asking again for the fused problem does not tune.
    again = convtune.tune(x, w, padding=1, z=True, alpha1=0.5, activation="gelu")
    assert again.tuned_at == fused.tuned_at
    e = convtune.explain(x, w, padding=1, z=True, alpha1=0.5, activation="gelu")
    assert "fn epilogue" in e.wgsl and "binding(7)" in e.wgsl
    name, times = convtune.time_variant(x, w, padding=1, z=True, activation="relu", reps=2, warmup=0)
    assert len(times) == 2 and all(t > 0 for t in times)


def test_faulty_candidate_never_wins_with_an_epilogue(tuning_env):
    convtune._convtune._inject_faulty_candidate(True)
    r = convtune.tune((1, 4, 10, 10), (8, 4, 3, 3), padding=1, z=True, activation="relu", force=True)
    faulty = [c for c in r.candidates if c["name"].startswith("faulty:")]
    assert len(faulty) == 1 and faulty[0]["status"] == "wrong"
    assert not r.winner.startswith("faulty")


def _xw():
    rng = np.random.default_rng(6)
    return (rng.standard_normal((1, 4, 6, 6)).astype(np.float32),
            rng.standard_normal((3, 4, 3, 3)).astype(np.float32))


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(z=np.ones((1, 3, 5, 5), np.float32)), ValueError, "z must have the output's shape"),
    (dict(z=np.ones((3, 4, 4), np.float32)), ValueError, "z must be 4-D"),
    (dict(z=np.full((1, 3, 4, 4), "a")), TypeError, "z"),
    (dict(z=np.full((1, 3, 4, 4), np.nan, np.float32)), ValueError, "z contains NaN or Inf"),
    (dict(activation="fast"), ValueError, "activation must be None or one of"),
    (dict(activation=1), TypeError, "activation must be None or a str"),
    (dict(alpha1="0.5"), TypeError, "alpha1 must be a real number"),
    (dict(alpha1=float("nan")), ValueError, "alpha1 must be finite"),
    (dict(alpha1=True), TypeError, "alpha1"),
    (dict(alpha2=0.5), ValueError, "alpha2 scales the residual z"),
    (dict(activation="clamp"), ValueError, "needs clamp=(min, max)"),
    (dict(activation="clamp", clamp=(1.0, -1.0)), ValueError, "clamp min must be <= max"),
    (dict(activation="clamp", clamp=1.0), TypeError, "clamp must be a (min, max) pair"),
    (dict(activation="relu", clamp=(0.0, 1.0)), ValueError, "only used with activation='clamp'"),
    (dict(activation="leaky_relu", negative_slope="x"), TypeError, "negative_slope"),
])
def test_bad_epilogue_arguments_are_clear_errors(kwargs, exc, words):
    x, w = _xw()
    with pytest.raises(exc, match=None) as info:
        convtune.conv2d(x, w, **kwargs)
    assert words in str(info.value), str(info.value)
    with pytest.raises(exc):
        convtune.conv2d(convtune.to_device(x), w, **kwargs)


def test_introspection_rejects_unknown_epilogue_keywords():
    x, w = _xw()
    with pytest.raises(TypeError, match="unexpected keyword"):
        convtune.wgsl("gemm_b32x32x8_t4x4", x, w, activaton="relu")
    with pytest.raises(TypeError, match="z must be None, a bool"):
        convtune.wgsl("gemm_b32x32x8_t4x4", x, w, z="yes")
