"""Split-K implicit-GEMM variants (``gemm_..._k{splits}``): partial tiles summed by a second
pass in a fixed order. Correct against float64 on shapes with tails, groups, strides and bias,
NaN/Inf propagating, and bit-identical from run to run."""

from __future__ import annotations

import numpy as np
import pytest

import convtune
from reference import swept, check_close, check_mode_bound, reference_conv2d, run_or_skip_over_limits

SPLIT = [v for v in convtune.variant_space()
         if v.startswith("gemm_") and convtune.variant_knobs(v)["splits"] > 1]

CASES = [
    # x, w, kwargs: reductions not a multiple of the split's share, tails in M and N.
    ((1, 64, 7, 7), (64, 64, 3, 3), dict(padding=1)),
    ((2, 32, 6, 5), (20, 16, 3, 3), dict(padding=(1, 0), stride=(2, 1), groups=2)),
    ((3, 40, 5, 5), (24, 40, 1, 1), {}),
    ((1, 9, 11, 10), (7, 9, 5, 3), dict(dilation=(1, 2), padding=2)),
]


def test_split_variants_are_in_the_space():
    assert SPLIT and {convtune.variant_knobs(v)["splits"] for v in SPLIT} == {4, 16}
    assert all(v.endswith(f"_k{convtune.variant_knobs(v)['splits']}") for v in SPLIT)


@pytest.mark.parametrize("variant", swept(SPLIT, 8))
def test_split_k_computes_the_reference(variant):
    rng = np.random.default_rng(abs(hash(variant)) % 2**32)
    for xs, ws, kw in CASES:
        x = rng.standard_normal(xs).astype(np.float32)
        w = rng.standard_normal(ws).astype(np.float32)
        b = rng.standard_normal(ws[0]).astype(np.float32)
        got = convtune.conv2d(x, w, bias=b, variant=variant, **kw)
        check_close(got, reference_conv2d(x, w, bias=b, **kw), context=f"{variant} {xs} {ws}")


def repeated_with_nan(variant, n, seed):
    """``variant`` on a 64-channel 7x7 problem of ``n`` images with one NaN in x, run four
    times: the first result, checked bit-identical to the others and NaN where the float64
    reference is, and that reference."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 64, 7, 7)).astype(np.float32)
    w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    x[n - 1, 5, 3, 3] = np.nan
    first = convtune.conv2d(x, w, padding=1, variant=variant)
    for _ in range(3):
        again = convtune.conv2d(x, w, padding=1, variant=variant)
        assert np.array_equal(first.view(np.uint32), again.view(np.uint32))
    want = reference_conv2d(x, w, padding=1)
    np.testing.assert_array_equal(np.isnan(first), np.isnan(want))
    return first, want


def test_split_k_is_deterministic_and_propagates_nan():
    repeated_with_nan(next(v for v in SPLIT if convtune.variant_knobs(v)["splits"] == 16), 1, 3)


def test_split_k_refuses_outputs_too_large_for_its_workspace():
    variant = next(v for v in SPLIT if convtune.variant_knobs(v)["splits"] == 16)
    with pytest.raises(ValueError, match="workspace"):
        convtune.wgsl(variant, (8, 8, 512, 512), (64, 8, 3, 3), padding=1)


# ---- the tensor-core family's split-K (``coop_..._l1_k{splits}``): the GPU machine only ----

TC = convtune.adapter_info()["features"]["tensor_cores"]
COOP_SPLIT = [v for v in convtune.variant_space()
              if v.startswith("coop_") and convtune.variant_knobs(v)["splits"] > 1]


def test_tensor_core_split_variants_are_in_the_space():
    assert COOP_SPLIT and {convtune.variant_knobs(v)["splits"] for v in COOP_SPLIT} == {2, 4}
    assert all(v.endswith(tuple(f"_l{lay}_k{convtune.variant_knobs(v)['splits']}" for lay in (1, 2, 3)))
               for v in COOP_SPLIT)
    # Window tiles (layout 3) split over channel blocks.
    assert {convtune.variant_knobs(v)["layout"] for v in COOP_SPLIT} == {1, 2, 3}
    # The finishing pass is part of every split module's WGSL.
    assert "fn finish" in convtune.wgsl(COOP_SPLIT[0], (2, 64, 7, 7), (64, 64, 3, 3), padding=1)


@pytest.mark.skipif(not TC, reason="the adapter has no tensor cores (cooperative matrices)")
@pytest.mark.parametrize("split, bound", [(1, 4e-3), (3, 1e-5)])
def test_tensor_core_split_k_is_deterministic_and_propagates_nan(split, bound):
    # 7x7 outputs per image: not whole quads, so the partials are written one at a time.
    variant = f"coop_b128x128x16_s2x4_p{split}_l1_k4"
    first, want = repeated_with_nan(variant, 2, 5)
    ok = np.isfinite(want)
    err = np.abs(first[ok] - want[ok]).max() / np.abs(want[ok]).max()
    assert err <= bound, (variant, err)


WINDOW_SPLIT = [v for v in COOP_SPLIT if convtune.variant_knobs(v)["layout"] >= 3]


@pytest.mark.skipif(not TC, reason="the adapter has no tensor cores (cooperative matrices)")
@pytest.mark.parametrize("variant", WINDOW_SPLIT)
def test_window_tiles_split_over_channel_blocks(variant):
    # Each part takes a run of channel blocks, two at least: as many blocks as that needs,
    # one more (a short last part), and twice as many; a tail of output channels, images
    # whose size is not a tile's. Window split tiles take float16 data (x read in place, in
    # either layout: the partials have binding 5 to themselves).
    knobs = convtune.variant_knobs(variant)
    least = 2 * knobs["splits"] * knobs["bk"]
    rng = np.random.default_rng(abs(hash(variant)) % 2**32)
    for channels in (least, least + knobs["bk"], 2 * least):
        x = rng.standard_normal((2, 9, 21, channels)).astype(np.float16)
        w = (rng.standard_normal((80, channels, 3, 3)) / np.sqrt(9 * channels)).astype(np.float16)
        b = rng.standard_normal(80).astype(np.float32)
        want = reference_conv2d(x.astype(np.float64).transpose(0, 3, 1, 2), w.astype(np.float64), bias=b, padding=1)
        got = run_or_skip_over_limits(variant, lambda: convtune.conv2d(
            x, w, bias=b, padding=1, layout="NHWC", variant=variant))
        check_mode_bound(got, want.transpose(0, 2, 3, 1), True, "high", f"{variant} C={channels}")
        xn = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
        got = run_or_skip_over_limits(variant, lambda: convtune.conv2d(xn, w, bias=b, padding=1, variant=variant))
        check_mode_bound(got, want, True, "high", f"{variant} NCHW C={channels}")
