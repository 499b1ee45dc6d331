"""explain().dispatches: the GPU dispatches one run of the chosen kernel makes. The FMA
families run a convolution with its bias, residual and activation in one dispatch; a split-K
sum adds its finishing pass, a transposed problem's lowered form its weight pass, and the
Winograd families their transforms. The list follows the generated kernel, so a change that
adds a pass to a one-pass family shows here."""

from __future__ import annotations

import pytest

import convtune

PLAIN = ((2, 8, 10, 10), (16, 8, 3, 3))
FUSED = dict(padding=1, bias=True, activation="relu", z=True)


def dispatches(variant, x=PLAIN[0], w=PLAIN[1], **kw):
    e = convtune.explain(x, w, variant=variant, **(kw or FUSED))
    assert e.chunks == 1, e
    return e.dispatches


@pytest.mark.parametrize("variant", ["direct_wg64x1_u0_k1w1", "direct_wg64x1_u0_k2w1", "stem_wg64_u0_k8w2", "gemm_b32x32x8_t4x4"])
def test_one_pass_families_fuse_bias_residual_and_activation(variant):
    assert dispatches(variant) == ["main"]
    assert dispatches(variant, layout="NHWC", x=(2, 10, 10, 8), padding=1, bias=True) == ["main"]


def test_split_k_adds_its_finishing_pass():
    assert dispatches("gemm_b32x32x16_t4x4_k4") == ["main", "finish"]


def test_a_lowered_transposed_problem_adds_its_weight_pass_and_tconv_does_not():
    t = dict(stride=2, padding=1, transposed=True, output_padding=1)
    assert dispatches("direct_wg64x1_u0_k1w1", (2, 8, 10, 10), (8, 4, 3, 3), **t) == ["weights", "main"]
    assert dispatches("tconv_wg64x1_k1w1", (2, 8, 10, 10), (8, 4, 3, 3), **t) == ["main"]


def test_winograd_families_transform_before_and_sum_after():
    assert dispatches("wino_t32x32_c4_r1x4") == ["prologue", "main", "finish"]


def test_chunks_and_the_summary_line():
    e = convtune.explain(*PLAIN, variant="gemm_b32x32x8_t4x4", padding=1)
    assert e.chunks == 1 and "dispatches: main" in str(e).splitlines()[0]
