"""Precision modes: argument checking, cache keys, explain(), and on adapters with tensor
cores the cooperative-matrix kernels against a float64 reference, on hostile value ranges."""

import numpy as np
import pytest

import convtune
from reference import check_mode_bound, check_same_non_finites, nhwc, reference_conv2d, run_or_skip_over_limits
from tuning_support import tuning_env  # noqa: F401  (a fixture)

TC = convtune.adapter_info()["features"]["tensor_cores"]
needs_tc = pytest.mark.skipif(not TC, reason="the adapter has no tensor cores (cooperative matrices)")


def _rel_err(got, want):
    want = np.asarray(want, dtype=np.float64)
    finite = np.isfinite(want)
    scale = max(np.abs(want[finite]).max(), np.finfo(np.float32).tiny)
    return float(np.abs(got.astype(np.float64)[finite] - want[finite]).max() / scale)


@pytest.mark.parametrize("bad", ["fast", "HIGH", "", "float16"])
def test_unknown_precision_names_the_accepted_values(bad):
    x = np.random.default_rng(0).standard_normal((1, 2, 5, 5)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((3, 2, 3, 3)).astype(np.float32)
    with pytest.raises(ValueError, match="'highest'.*'high'"):
        convtune.conv2d(x, w, precision=bad)
    with pytest.raises(ValueError, match="highest"):
        convtune.explain(x.shape, w.shape, precision=bad)


@pytest.mark.parametrize("bad", [1, 1.0, b"high", ["high"]])
def test_non_string_precision_is_a_type_error(bad):
    with pytest.raises(TypeError, match="precision"):
        convtune.tune((1, 2, 5, 5), (3, 2, 3, 3), precision=bad)


def test_bad_environment_precision_is_reported(monkeypatch):
    monkeypatch.setenv("CONVTUNE_PRECISION", "fastest")
    with pytest.raises(ValueError, match="CONVTUNE_PRECISION"):
        convtune.explain((1, 2, 5, 5), (3, 2, 3, 3))


def test_environment_sets_the_default_precision(monkeypatch):
    monkeypatch.setenv("CONVTUNE_PRECISION", "high")
    assert convtune.explain((1, 2, 5, 5), (3, 2, 3, 3)).precision == "high"
    assert convtune.explain((1, 2, 5, 5), (3, 2, 3, 3), precision="highest").precision == "highest"


@pytest.mark.parametrize("precision", ["highest", "high"])
def test_every_mode_computes_the_reference(precision):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 8, 11, 9)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    got = convtune.conv2d(x, w, padding=1, bias=b, precision=precision)
    assert got.dtype == np.float32
    bound = {"highest": 1e-5, "high": 4e-3}[precision]
    assert _rel_err(got, reference_conv2d(x, w, padding=1, bias=b)) <= bound


def test_explain_reports_precision_family_and_tensor_cores():
    e = convtune.explain((1, 4, 8, 8), (8, 4, 3, 3), padding=1, precision="high")
    assert e.precision == "high"
    assert e.family == convtune.variant_knobs(e.variant)["family"]
    if TC:
        assert e.tensor_cores == "available"
    else:
        assert "cooperative matri" in e.tensor_cores
    assert "precision high" in str(e)


def test_tuning_cache_keeps_modes_apart(tuning_env):
    shape = ((1, 8, 10, 10), (16, 8, 3, 3))
    high = convtune.tune(*shape, padding=1, precision="high", budget=0.2)
    highest = convtune.tune(*shape, padding=1, precision="highest", budget=0.2)
    assert (high.precision, highest.precision) == ("high", "highest")
    assert highest.source == "tuned"  # not the "high" entry
    assert convtune.tune(*shape, padding=1, precision="high").source == "cache"
    # Single-pass tensor-core variants serve "high" only, split ones "highest" only.
    def coop(report):
        return [c["name"] for c in report.candidates if c["name"].startswith("coop_")]

    def splits(names):
        return {convtune.variant_knobs(n)["split"] for n in names}

    assert splits(coop(highest)) <= {3}, coop(highest)
    assert splits(coop(high)) <= {1}, coop(high)
    if TC:
        assert coop(highest) and coop(high)


def test_tensor_core_variants_are_in_the_space_and_refused_where_missing():
    coop = [v for v in convtune.variant_space() if v.startswith("coop_")]
    assert coop and all(convtune.variant_knobs(v)["family"] == "coop" for v in coop)
    src = convtune.wgsl(coop[0], (1, 16, 8, 8), (16, 16, 3, 3), padding=1)
    assert "coopMultiplyAdd" in src
    if not TC:
        x = np.ones((1, 16, 8, 8), np.float32)
        w = np.ones((16, 16, 3, 3), np.float32)
        with pytest.raises(ValueError, match="cannot run here"):
            convtune.conv2d(x, w, variant=coop[0])


# ---- tensor cores: the GPU machine only ----------------------------------------------------

# float32 data on layouts 2 to 4: the packed-copy tests below (float16: tests/test_float16.py).
COOP = [v for v in convtune.variant_space()
        if v.startswith("coop_") and convtune.variant_knobs(v)["layout"] < 2]
SHAPES = [
    # x, w, stride, padding, dilation, groups, bias
    ((2, 64, 20, 20), (64, 64, 3, 3), 1, 1, 1, 1, True),
    ((1, 3, 33, 31), (40, 3, 3, 3), 1, 0, 1, 1, False),
    ((3, 24, 17, 13), (72, 24, 1, 1), 1, 0, 1, 1, True),
    ((2, 32, 15, 16), (48, 16, 5, 3), (2, 1), (2, 1), (1, 2), 2, False),
    ((1, 100, 9, 9), (130, 100, 3, 3), 2, 1, 1, 1, True),
    # Channels per group not a multiple of 4: layout 1 zero-pads each group's channels.
    ((2, 12, 11, 10), (8, 6, 3, 3), 1, 1, 1, 2, True),
    ((1, 62, 10, 10), (36, 62, 3, 3), 1, 1, 1, 1, False),
    # 1x1 at stride 1 over whole quads of pixels: layout 0 loads four pixels at once.
    ((2, 16, 12, 10), (24, 8, 1, 1), 1, 0, 1, 2, True),
    # A short grid with a long reduction: where the split-K variants run.
    ((2, 64, 8, 8), (32, 64, 3, 3), 1, 1, 1, 1, True),
]


def _bound(variant):
    return 1e-5 if convtune.variant_knobs(variant)["split"] == 3 else 4e-3


def _variant(split, layout):
    """The 64x64 tile with the given split, gathering in place (0) or channels-last (1)."""
    return f"coop_b64x64x32_s2x2_p{split}" + ("_l1" if layout else "")



@needs_tc
@pytest.mark.parametrize("variant", COOP)
def test_tensor_core_variant_computes_the_reference(variant):
    rng = np.random.default_rng(abs(hash(variant)) % 2**32)
    ran = 0
    for xs, ws, st, pad, dil, g, has_b in SHAPES:
        x = rng.standard_normal(xs).astype(np.float32)
        w = rng.standard_normal(ws).astype(np.float32)
        b = rng.standard_normal(ws[0]).astype(np.float32) if has_b else None
        kw = dict(stride=st, padding=pad, dilation=dil, groups=g, bias=b)
        try:
            got = convtune.conv2d(x, w, variant=variant, **kw)
        except ValueError as e:
            if "the adapter allows" in str(e):
                pytest.skip(f"{variant} exceeds this adapter's workgroup memory: {e}")
            if "cannot run on this shape" in str(e) and convtune.variant_knobs(variant)["splits"] > 1:
                continue  # split-K runs on short grids only; the last shape is one
            raise
        err = _rel_err(got, reference_conv2d(x, w, **kw))
        assert err <= _bound(variant), (variant, xs, ws, err)
        ran += 1
    assert ran >= 1, variant


# float32 data on layouts 2 to 4: w's scaled, packed float16 copy written by the prologue
# after the max pass, and x's (layout 2) or x read in place, scaled and packed as the window
# tiles load it (layouts 3, 4); the tuner offers them for "high". Every window tile, every third
# unsplit layout 2 tile, and every layout 2 split-K tile (its f32 partials kept as the bits of
# the packed copy's u32s).
_UNSPLIT = [v for v in convtune.variant_space()
            if v.startswith("coop_") and convtune.variant_knobs(v)["splits"] == 1]
PACKED = ([v for v in _UNSPLIT if convtune.variant_knobs(v)["layout"] >= 3]
          + [v for v in _UNSPLIT if convtune.variant_knobs(v)["layout"] == 2][::3]
          + [v for v in convtune.variant_space() if v.startswith("coop_")
             and convtune.variant_knobs(v)["layout"] == 2 and convtune.variant_knobs(v)["splits"] > 1])
PACKED_SHAPES = [
    # x, w, padding, bias, x's scale, w's scale
    ((2, 64, 20, 20), (64, 64, 3, 3), 1, True, 1.0, 1.0),
    ((1, 32, 9, 70), (40, 32, 3, 2), 0, False, 1e12, 1e-25),  # the scaling at work
    ((2, 16, 12, 10), (24, 16, 1, 1), 0, True, 1e-20, 1.0),
]


@needs_tc
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("variant", PACKED)
def test_float32_data_on_packed_float16_copies(variant, layout):
    rng = np.random.default_rng(abs(hash((variant, layout))) % 2**32)
    to = nhwc if layout == "NHWC" else (lambda a: a)
    ran = 0
    for xs, ws, pad, has_b, sx, sw in PACKED_SHAPES:
        x = (rng.standard_normal(xs) * sx).astype(np.float32)
        w = (rng.standard_normal(ws) * sw).astype(np.float32)
        b = (rng.standard_normal(ws[0]) * sx * sw).astype(np.float32) if has_b else None
        try:
            got = convtune.conv2d(to(x), w, padding=pad, bias=b, layout=layout, variant=variant, precision="high")
        except ValueError as e:
            if "the adapter allows" in str(e):
                pytest.skip(f"{variant} exceeds this adapter's workgroup memory: {e}")
            assert "cannot run on this shape" in str(e), e
            continue  # a window tile on channels its step does not divide
        want = reference_conv2d(x, w, padding=pad, bias=b)
        check_mode_bound(got, to(want), False, "high", f"{variant} {layout} {xs} {ws}")
        ran += 1
    assert ran >= 2, f"{variant} {layout} ran {ran} shapes"


@needs_tc
@pytest.mark.parametrize("xs, wsc", [(1e-30, 1.0), (1e30, 1e-30), (1e-20, 1e-15), (1e18, 1e15)])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("split", [1, 3])
def test_tensor_cores_scale_any_value_range(layout, xs, wsc, split):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((2, 32, 12, 12)) * xs).astype(np.float32)
    w = (rng.standard_normal((32, 32, 3, 3)) * wsc).astype(np.float32)
    variant = _variant(split, layout)
    got = convtune.conv2d(x, w, padding=1, variant=variant)
    want = reference_conv2d(x, w, padding=1)
    assert np.all(np.isfinite(got))
    # Nothing flushed to zero or blown up where the true result is finite and non-zero.
    big = np.abs(want) > 1e-3 * np.abs(want).max()
    assert np.all(got[big] != 0)
    assert _rel_err(got, want) <= _bound(variant)


@needs_tc
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("split", [1, 3])
def test_tensor_cores_mixed_channel_magnitudes_meet_their_bound(layout, split):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 32, 10, 10)).astype(np.float32)
    x *= np.logspace(-6, 6, 32, dtype=np.float32)[None, :, None, None]
    w = rng.standard_normal((32, 32, 3, 3)).astype(np.float32)
    w *= np.logspace(3, -3, 32, dtype=np.float32)[:, None, None, None]
    variant = _variant(split, layout)
    got = convtune.conv2d(x, w, padding=1, variant=variant)
    assert _rel_err(got, reference_conv2d(x, w, padding=1)) <= _bound(variant)


@needs_tc
@pytest.mark.parametrize("split, suffix", [(1, ""), (3, ""), (1, "_l1"), (3, "_l1"), (1, "_l2")])
def test_tensor_cores_scale_device_tensors_with_and_without_a_known_max(suffix, split):
    """A Tensor uploaded from the host carries its max |x| (the kernel runs without a max
    pass); a conv's output Tensor does not (the pass runs): both scale right at the ends of
    float32's range, where a missing or stale max would overflow or flush."""
    rng = np.random.default_rng(10)
    x = (rng.standard_normal((2, 32, 12, 12)) * 1e30).astype(np.float32)
    w1 = (rng.standard_normal((32, 32, 3, 3)) * 1e-32).astype(np.float32)
    w2 = (rng.standard_normal((32, 32, 3, 3)) * 1e20).astype(np.float32)
    variant = f"coop_b64x64x32_s2x2_p{split}{suffix}"
    y1 = convtune.conv2d(convtune.to_device(x), w1, padding=1, variant=variant)
    # The second call's w is a Tensor: bound as it is, with the max it took on upload.
    y2 = convtune.conv2d(y1, convtune.to_device(w2), padding=1, variant=variant)
    first = y1.numpy()
    for got, want in ((first, reference_conv2d(x, w1, padding=1)), (y2.numpy(), reference_conv2d(first, w2, padding=1))):
        assert np.all(np.isfinite(got))
        assert _rel_err(got, want) <= _bound(variant)


def _plant_nan_and_inf(x, w, where):
    if where == "x":
        x[0, 3, 2, 2] = np.nan
        x[0, 5, 6, 6] = np.inf
    else:
        w[2, 3, 1, 1] = np.nan
        w[4, 5, 0, 0] = -np.inf


@needs_tc
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("where", ["x", "w"])
def test_tensor_cores_propagate_nan_and_inf(layout, split, where):
    # Both inputs are scaled (and, in layout 1, copied): Inf and NaN must survive that.
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 16, 8, 8)).astype(np.float32)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    _plant_nan_and_inf(x, w, where)
    variant = _variant(split, layout)
    got = convtune.conv2d(x, w, padding=1, variant=variant)
    want = reference_conv2d(x, w, padding=1)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    assert _rel_err(np.where(finite, got, 0), np.where(finite, want, 0)) <= _bound(variant)


@needs_tc
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("where", ["x", "w"])
def test_split_tiles_keep_each_inf_sign_on_short_values(layout, where):
    # float16 data (and float32 values of 11 significant bits or fewer) have a zero lo part:
    # an Inf times it made the correction sum, and an Inf result, NaN (H200, 4391087).
    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, 16, 8, 8)).astype(np.float16).astype(np.float32)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float16).astype(np.float32)
    _plant_nan_and_inf(x, w, where)
    variant = _variant(3, layout)
    want = reference_conv2d(x, w, padding=1)
    for data in (np.float32, np.float16):
        got = np.asarray(convtune.conv2d(x.astype(data), w.astype(data), padding=1, variant=variant), dtype=np.float32)
        check_same_non_finites(got, want)


@needs_tc
@pytest.mark.parametrize("precision", ["high", "highest"])
def test_tuned_tensor_core_modes_meet_their_bounds(precision, tuning_env):
    rng = np.random.default_rng(10)
    x = rng.standard_normal((4, 64, 28, 28)).astype(np.float32)
    w = rng.standard_normal((128, 64, 3, 3)).astype(np.float32)
    got = convtune.conv2d(x, w, padding=1, precision=precision)
    bound = {"highest": 1e-5, "high": 4e-3}[precision]
    assert _rel_err(got, reference_conv2d(x, w, padding=1)) <= bound


# ---- Winograd (FMA units, any adapter) -----------------------------------------------------

# The fused family's F(2x2) and F(4x4), and the non-fused one's three tile sizes (F(6x6)
# serves "high" only). tests/test_winogemm.py runs every non-fused variant.
WINOGRAD = ["wino_t32x32_c4_r1x4", "wino_t32x32_c2_r1x4_m4", "wgemm_m2_b32x32x8_t4x4",
            "wgemm_m4_b32x32x8_t4x4", "wgemm_m6_b32x32x8_t4x4"]


def _winograd_mode(variant):
    return "high" if variant.startswith("wgemm_m6") else "highest"


# Outputs stay above 1e-31: the bound (1e-5 of max |y|) then lies above float32's smallest
# normal number. Below that, GPUs that flush subnormal intermediates to zero (NVIDIA's
# Vulkan driver does) cannot meet it with any method that rounds a product or a transform
# on its own (on the H100 x 1e-20 with w 1e-15, outputs ~1e-34, gave 2.5e-5 for F(2x2)).
@pytest.mark.parametrize("xs, wsc", [(1e-30, 1.0), (1e30, 1e-30), (1e-17, 1e-15), (1e18, 1e15)])
@pytest.mark.parametrize("variant", WINOGRAD)
def test_winograd_meets_its_bound_on_any_value_range(variant, xs, wsc):
    """The transforms scale values by up to 32 (F(6x6)'s A^T) and 1/90 (its G): where one
    overflows, the direct re-sum gives the finite result; nothing flushes to zero."""
    assert variant in convtune.variant_space()
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((2, 24, 10, 10)) * xs).astype(np.float32)
    w = (rng.standard_normal((16, 24, 3, 3)) * wsc).astype(np.float32)
    mode = _winograd_mode(variant)
    got = convtune.conv2d(x, w, padding=1, variant=variant, precision=mode)
    want = reference_conv2d(x, w, padding=1)
    assert np.all(np.isfinite(got))
    big = np.abs(want) > 1e-3 * np.abs(want).max()
    assert np.all(got[big] != 0)
    # "high"'s bound is 4e-3; F(6x6) measures ~1e-5 here, so hold it to 1e-4.
    assert _rel_err(got, want) <= (1e-4 if mode == "high" else 1e-5), variant


@pytest.mark.parametrize("variant", WINOGRAD)
def test_winograd_mixed_channel_magnitudes_meet_the_bound(variant):
    rng = np.random.default_rng(13)
    x = rng.standard_normal((1, 24, 10, 10)).astype(np.float32)
    x *= np.logspace(-6, 6, 24, dtype=np.float32)[None, :, None, None]
    w = rng.standard_normal((16, 24, 3, 3)).astype(np.float32)
    w *= np.logspace(3, -3, 24, dtype=np.float32)[None, :, None, None]
    mode = _winograd_mode(variant)
    got = convtune.conv2d(x, w, padding=1, variant=variant, precision=mode)
    assert _rel_err(got, reference_conv2d(x, w, padding=1)) <= (1e-4 if mode == "high" else 1e-5), variant


# Every single-pass tensor-core tile: on float32 data whose outputs need only their scale, a
# workgroup of layout 0 or 4 whose tile lies inside y stores its accumulators straight from
# registers, the others through the scratch (src/kernels/coop/direct_store.rs).
DIRECT = [v for v in convtune.variant_space() if v.startswith("coop_") and convtune.variant_knobs(v)["splits"] == 1]


@needs_tc
@pytest.mark.parametrize("variant", DIRECT)
def test_float32_tiles_inside_y_store_from_registers(variant):
    # Two images of 24x32 (whole 16-pixel blocks), 272 output channels (whole tiles of every
    # width and a ragged one past them), 3x3 and 1x1; "high", and "highest" for split tiles.
    i = DIRECT.index(variant)
    knobs = convtune.variant_knobs(variant)
    layout = "NHWC" if knobs["layout"] > 0 and i % 2 else "NCHW"
    precision = "highest" if knobs["split"] == 3 else "high"
    r = 1 if i % 3 == 2 else 3
    rng = np.random.default_rng(900 + i)
    x = rng.standard_normal((2, 32, 24, 32)).astype(np.float32)
    w = (rng.standard_normal((272, 32, r, r)) / 8).astype(np.float32)
    want = reference_conv2d(x, w, padding=r // 2)
    to = nhwc if layout == "NHWC" else (lambda a: a)
    got = run_or_skip_over_limits(variant, lambda: convtune.conv2d(
        to(x), w, padding=r // 2, layout=layout, variant=variant, precision=precision))
    check_mode_bound(got, to(want), False, precision, f"{variant} {layout} {r}x{r}")
