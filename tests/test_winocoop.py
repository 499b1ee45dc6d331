"""The non-fused Winograd family on tensor cores (wcoop: F(2x2); float16 data, float32 data
in "high", scaled, and in "highest" on the split pair): every variant on 3x3 stride-1 shapes (several images, odd output
sizes, padding 0 to 2, groups, C and K off the tile sizes, dilated ones), with the fused epilogue, in both
layouts, pixel shuffle, in chunks, and with Inf, NaN, values past float16's range and float32
values of any range, against the float64 reference with poisoned outputs (conftest). Lavapipe has no cooperative matrices: there only the listing, the WGSL and
the refusals run; the rest runs on a GPU with tensor cores."""

from __future__ import annotations

import numpy as np
import pytest

import convtune
from convtune.reference import apply_epilogue, conv2d_reference, pixel_shuffle_reference
from reference import check_mode_bound, check_same_non_finites, nhwc, run_or_skip_over_limits
from tuning_support import tuning_env  # noqa: F401  (a fixture)

WCOOP = [v for v in convtune.variant_space() if v.startswith("wcoop_")]
TC = convtune.adapter_info()["features"]["tensor_cores"]
needs_tc = pytest.mark.skipif(not TC, reason="the adapter has no tensor cores (cooperative matrices)")
SINGLE = [v for v in WCOOP if convtune.variant_knobs(v)["split"] == 1]
SPLIT = [v for v in WCOOP if convtune.variant_knobs(v)["split"] == 3]
PER_M = {convtune.variant_knobs(v)["m"]: v for v in SINGLE}


def _half(rng, xs, ws):
    x = rng.standard_normal(xs).astype(np.float16)
    w = (rng.standard_normal(ws) / np.sqrt(9 * ws[1])).astype(np.float16)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    return x, w, b


def _run(variant, *args, **kw):
    return run_or_skip_over_limits(variant, lambda: convtune.conv2d(*args, variant=variant, **kw))


def test_family_is_listed_and_named_by_its_knobs():
    assert len(SINGLE) >= 4 and len(SPLIT) == len(SINGLE) and set(PER_M) == {2}
    for name in WCOOP:
        k = convtune.variant_knobs(name)
        assert k["family"] == "wcoop"
        assert name == f"wcoop_m{k['m']}_b{k['bm']}x{k['bn']}x{k['bk']}_s{k['sgm']}x{k['sgn']}_p{k['split']}"
        src = convtune.wgsl(name, (2, 16, 9, 10), (8, 16, 3, 3), padding=1, dtype="float16")
        assert "coopMultiplyAdd" in src and "fn finish" in src and name in src


@pytest.mark.parametrize("kw, ws, dtype, why", [
    (dict(stride=2, padding=1), (4, 8, 3, 3), "float16", "at stride 1"),
    (dict(stride=2, padding=2, dilation=2), (4, 8, 3, 3), "float32", "at stride 1"),
    (dict(padding=1), (4, 8, 5, 5), "float16", "3x3 filters"),
])
def test_what_it_cannot_compute_is_refused(kw, ws, dtype, why):
    x = np.ones((1, 8, 9, 9), dtype)
    w = np.ones(ws, dtype)
    with pytest.raises(ValueError, match=why):
        convtune.wgsl(WCOOP[0], x.shape, w.shape, dtype=dtype, **kw)
    if TC:
        with pytest.raises(ValueError, match="cannot run on this shape"):
            convtune.conv2d(x, w, variant=WCOOP[0], **kw)


@needs_tc
def test_it_serves_high_and_float16_but_not_highest(tuning_env, monkeypatch):
    """Only this family's candidates: "high" and float16 data tune to a single-pass one,
    "highest" to a split-pair one."""
    monkeypatch.setenv("CONVTUNE_FAMILIES", "wcoop")
    spec = ((1, 16, 9, 9), (8, 16, 3, 3))
    for kw, split in ((dict(precision="high"), 1), (dict(dtype="float16"), 1), (dict(precision="highest"), 3)):
        report = convtune.tune(*spec, padding=1, budget=0.1, force=True, **kw)
        assert report.winner.startswith("wcoop_"), kw
        assert {convtune.variant_knobs(c["name"])["split"] for c in report.candidates} == {split}, kw


# x (NCHW), w, keywords: odd output sizes, padding 0 to 2, groups, C and K off every tile,
# dilated layers (their dilation's phases, one shorter than the others; one axis only).
CASES = [
    ((3, 37, 11, 7), (41, 37, 3, 3), dict(padding=0)),
    ((2, 48, 9, 13), (20, 24, 3, 3), dict(padding=(2, 1), groups=2)),
    ((1, 64, 17, 16), (72, 64, 3, 3), dict(padding=1)),
    ((2, 24, 13, 11), (16, 24, 3, 3), dict(padding=2, dilation=2)),
    ((1, 16, 17, 19), (24, 16, 3, 3), dict(padding=(3, 1), dilation=(3, 1))),
]


@needs_tc
@pytest.mark.parametrize("variant", WCOOP)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_every_variant_matches_the_reference(variant, layout):
    rng = np.random.default_rng(abs(hash((variant, layout))) % 2**32)
    t = nhwc if layout == "NHWC" else np.asarray
    for xs, ws, kw in CASES:
        x, w, b = _half(rng, xs, ws)
        want = conv2d_reference(x, w, bias=b, **kw)
        got = _run(variant, t(x), w, bias=b, layout=layout, **kw)
        assert got.dtype == np.float16 and np.all(np.isfinite(got))
        check_mode_bound(got, t(want), True, "high", f"{variant} {layout} {xs} {ws} {kw}")


@needs_tc
@pytest.mark.parametrize("variant, precision", [(v, "high") for v in SINGLE] + [(v, "highest") for v in SPLIT])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_float32_data_meets_its_modes_bound(variant, precision, layout):
    """float32 data: in "high" x and w scaled from their maxima before the transforms and
    the outputs scaled back (4e-3 of max |y|); in "highest" the split pair's products (1e-5)."""
    rng = np.random.default_rng(abs(hash((precision, variant, layout))) % 2**32)
    t = nhwc if layout == "NHWC" else np.asarray
    for xs, ws, kw in CASES:
        x = rng.standard_normal(xs).astype(np.float32)
        w = rng.standard_normal(ws).astype(np.float32)
        b = rng.standard_normal(ws[0]).astype(np.float32)
        want = conv2d_reference(x, w, bias=b, **kw)
        got = _run(variant, t(x), w, bias=b, layout=layout, precision=precision, **kw)
        assert got.dtype == np.float32 and np.all(np.isfinite(got))
        check_mode_bound(got, t(want), False, precision, f"{variant} {layout} {xs} {ws} {kw}")


@needs_tc
@pytest.mark.parametrize("split, precision", [(1, "high"), (3, "highest")])
@pytest.mark.parametrize("xs, wsc", [(1e-30, 1.0), (1e30, 1e-30), (1e-20, 1e-15), (1e18, 1e15), (1e-3, 1e5)])
def test_float32_data_of_any_range_meets_its_bound(xs, wsc, split, precision):
    """Tiny and huge float32 inputs, and 12-decade spreads between x and w: nothing flushed
    to zero where the result is not tiny, nothing overflowing f16; "high" on one product per
    term, "highest" on the split pair."""
    variant = (SINGLE if split == 1 else SPLIT)[0]
    rng = np.random.default_rng(90)
    x = (rng.standard_normal((2, 32, 10, 10)) * xs).astype(np.float32)
    w = (rng.standard_normal((16, 32, 3, 3)) * wsc).astype(np.float32)
    got = _run(variant, x, w, padding=1, precision=precision)
    want = conv2d_reference(x, w, padding=1)
    assert np.all(np.isfinite(got))
    big = np.abs(want) > 1e-2 * np.abs(want).max()
    assert np.all(got[big] != 0)
    check_mode_bound(got, want, False, precision, f"{variant} {xs} {wsc}")


@needs_tc
@pytest.mark.parametrize("m", [2])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_the_epilogue_and_pixel_shuffle_go_through_finish(m, layout):
    variant = PER_M[m]
    rng = np.random.default_rng(50 + m)
    t = nhwc if layout == "NHWC" else np.asarray
    x, w, b = _half(rng, (2, 32, 10, 9), (48, 32, 3, 3))
    conv = conv2d_reference(x, w, padding=1)
    z = rng.standard_normal(conv.shape).astype(np.float16)
    want = apply_epilogue(conv, b, z=z, alpha1=0.5, alpha2=-2.0, activation="silu")
    got = _run(variant, t(x), w, bias=b, z=t(z), alpha1=0.5, alpha2=-2.0, activation="silu",
               padding=1, layout=layout)
    check_mode_bound(got, t(want), True, "high", f"{variant} {layout}")
    want = pixel_shuffle_reference(conv2d_reference(x, w, bias=b, padding=1), 2)
    got = _run(variant, t(x), w, bias=b, padding=1, pixel_shuffle=2, layout=layout)
    check_mode_bound(got, t(want), True, "high", f"{variant} {layout} shuffle")


@needs_tc
@pytest.mark.parametrize("variant", SINGLE[::2] + SPLIT[::2])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_a_weight_tensor_keeps_its_transformed_filters(variant, layout, monkeypatch):
    """U, transformed once from a weight Tensor and kept with it: later calls with fresh x
    (float16 data, float32 in the variant's mode) bind it instead of transforming again; two
    problems share the tensor (each its own U); the second runs in chunks, where only the
    first chunk could write U."""
    knobs = convtune.variant_knobs(variant)
    half = knobs["split"] == 1 and layout == "NHWC"
    precision = None if half else ("highest" if knobs["split"] == 3 else "high")
    dt = np.float16 if half else np.float32
    rng = np.random.default_rng(abs(hash(("kept", variant, layout))) % 2**32)
    w = (rng.standard_normal((40, 32, 3, 3)) / 8).astype(dt)
    wt = convtune.to_device(w)
    t = nhwc if layout == "NHWC" else np.asarray
    planes, cp, np_ = 16, 32, -(-40 // knobs["bn"]) * knobs["bn"]
    parts = 2 if knobs["split"] == 3 else 1
    chunked = str(parts * max(planes * knobs["bm"] * (2 * cp + 4 * np_), 2 * planes * cp * np_))
    for rnd in range(2):
        for xs, cap in [((2, 32, 9, 10), None), ((3, 32, 29, 27), chunked)]:
            if cap:
                monkeypatch.setenv("CONVTUNE_MAX_WORKSPACE", cap)
            else:
                monkeypatch.delenv("CONVTUNE_MAX_WORKSPACE", raising=False)
            for call in range(2):
                x = rng.standard_normal(xs).astype(dt)
                want = conv2d_reference(x, w, padding=1)
                got = run_or_skip_over_limits(variant, lambda: convtune.conv2d(
                    convtune.to_device(t(x), layout), wt, padding=1, layout=layout, variant=variant,
                    precision=precision).numpy())
                check_mode_bound(got, t(want), half, precision or "high",
                                 f"{variant} {layout} {xs} round {rnd} call {call + 1}")


@needs_tc
@pytest.mark.parametrize("m", [2])
def test_chunked_runs_match_the_reference(m, monkeypatch):
    """A workspace bound of a few GEMM tiles' worth: the passes run in chunks, the last one
    partial."""
    variant = PER_M[m]
    k = convtune.variant_knobs(variant)
    rng = np.random.default_rng(60 + m)
    xs, ws = (3, 32, 29, 27), (40, 32, 3, 3)
    x, w, b = _half(rng, xs, ws)
    want = conv2d_reference(x, w, bias=b, padding=1)
    planes, cp, np_ = (m + 2) ** 2, 32, -(-40 // k["bn"]) * k["bn"]
    # V and M of one GEMM tile's tiles in binding 5, U in binding 6.
    cap = max(planes * k["bm"] * (2 * cp + 4 * np_), 2 * planes * cp * np_)
    monkeypatch.setenv("CONVTUNE_MAX_WORKSPACE", str(cap))
    got = _run(variant, nhwc(x), w, bias=b, padding=1, layout="NHWC")
    check_mode_bound(got, nhwc(want), True, "high", variant)


@needs_tc
@pytest.mark.parametrize("m", [2])
def test_inf_nan_and_overflowing_transforms_come_out_as_in_the_direct_method(m):
    """Inf and NaN inputs, and inputs near float16's largest value whose transforms overflow
    f16: finish sums those outputs again the direct way."""
    variant = PER_M[m]
    rng = np.random.default_rng(70 + m)
    x, w, _ = _half(rng, (2, 32, 9, 10), (16, 32, 3, 3))
    x[0, 1, 3, 4] = np.inf
    x[1, 2, 0, 0] = -np.inf
    x[1, 4, 8, 9] = np.nan
    x[0, 7, 5:8, 5:8] = 30000.0
    w = w * np.float16(0.01)
    with np.errstate(all="ignore"):
        want = conv2d_reference(x, w, padding=1)
    got = _run(variant, x, w, padding=1)
    fin = check_same_non_finites(got, want)
    check_mode_bound(np.where(fin, got, 0), np.where(fin, want, 0), True, "high", variant)


@needs_tc
@pytest.mark.parametrize("split, precision", [(1, "high"), (3, "highest")])
def test_float32_inf_and_nan_come_out_as_in_the_direct_method(split, precision):
    """float32 data, scaled: Inf and NaN pass into the transforms unscaled (the split pair
    keeps them in hi with a zero lo) and finish sums their outputs again the direct way."""
    variant = (SINGLE if split == 1 else SPLIT)[0]
    rng = np.random.default_rng(75 + split)
    x = rng.standard_normal((2, 32, 9, 10)).astype(np.float32)
    w = rng.standard_normal((16, 32, 3, 3)).astype(np.float32)
    x[0, 1, 3, 4] = np.inf
    x[1, 2, 0, 0] = -np.inf
    x[1, 4, 8, 9] = np.nan
    w[3, 2, 1, 1] = np.inf
    with np.errstate(all="ignore"):
        want = conv2d_reference(x, w, padding=1)
    for layout, t in (("NCHW", np.asarray), ("NHWC", nhwc)):
        got = _run(variant, t(x), w, padding=1, layout=layout, precision=precision)
        fin = check_same_non_finites(got, t(want))
        check_mode_bound(np.where(fin, got, 0), np.where(fin, t(want), 0), False, precision, f"{variant} {layout}")


@needs_tc
def test_tuning_picks_a_validated_winner_among_them(tuning_env, monkeypatch):
    """Only this family's candidates (CONVTUNE_FAMILIES): the tuner times and validates them."""
    monkeypatch.setenv("CONVTUNE_FAMILIES", "wcoop")
    rng = np.random.default_rng(80)
    x, w, b = _half(rng, (4, 9, 11, 64), (64, 64, 3, 3))
    report = convtune.tune((4, 9, 11, 64), (64, 64, 3, 3), padding=1, layout="NHWC", dtype="float16",
                           budget=0.5, force=True)
    assert report.winner.startswith("wcoop_")
    got = convtune.conv2d(x, w, bias=b, padding=1, layout="NHWC")
    want = conv2d_reference(x.transpose(0, 3, 1, 2), w, bias=b, padding=1)
    check_mode_bound(got, nhwc(want), True, "high", report.winner)
