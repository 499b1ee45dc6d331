"""Weights that stay on the device (a weight Tensor; the inputs a tuning run times on) are
rearranged for a kernel once and the copy is kept with them: later calls bind that copy
instead of running the weight pass again. Every call, first or later, with fresh x each
time and poisoned outputs, must match the float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

import convtune
from convtune.reference import conv2d_reference, conv_transpose2d_reference
from reference import check_close, check_mode_bound, nhwc, run_or_skip_tensor_core

TC = convtune.adapter_info()["features"]["tensor_cores"]


def fresh_calls(call, want_of, x_shape, dtype, seed, check, calls=3):
    """``calls`` runs of ``call(x)`` (a Tensor result) on fresh random NCHW x, each checked
    against ``want_of(x)`` by ``check(got, want, context)``."""
    rng = np.random.default_rng(seed)
    for i in range(calls):
        x = rng.standard_normal(x_shape).astype(dtype)
        check(call(x).numpy(), want_of(x), f"call {i + 1}")


@pytest.mark.parametrize("variant", [None, "gemm_b32x32x8_t4x4", "direct_wg64x1_u0_k1w1"])
def test_a_lowered_transposed_conv_keeps_its_rearranged_weights(variant):
    # One weight tensor serving three problems (batch and size differ), in turn: the weight
    # pass's output kept per problem, two at a time, the oldest dropped for a third.
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((6, 4, 4, 4)) / 4).astype(np.float32)
    wt = convtune.to_device(w)
    kw = dict(stride=2, padding=1)
    for round_ in range(2):
        for j, xs in enumerate([(2, 6, 5, 4), (1, 6, 7, 3), (3, 6, 2, 2)]):
            fresh_calls(lambda x: convtune.conv_transpose2d(convtune.to_device(x), wt, variant=variant, **kw),
                        lambda x: conv_transpose2d_reference(x, w, **kw), xs, np.float32, 10 * round_ + j,
                        lambda g, r, c: check_close(g, r, f"{variant} {xs} {c}"), calls=2)


def test_a_weight_tensor_made_by_a_conv_serves_a_lowered_form():
    # A conv's output Tensor (its max unknown) used as the weights of a transposed conv.
    rng = np.random.default_rng(6)
    src = rng.standard_normal((6, 4, 4, 4)).astype(np.float32)
    eye = np.eye(4, dtype=np.float32).reshape(4, 4, 1, 1) * 0.25
    wt = convtune.conv2d(convtune.to_device(src), eye)
    w = src * 0.25
    fresh_calls(lambda x: convtune.conv_transpose2d(convtune.to_device(x), wt, stride=2, padding=1),
                lambda x: conv_transpose2d_reference(x, w, stride=2, padding=1), (2, 6, 5, 4), np.float32, 7,
                lambda g, r, c: check_close(g, r, c))


# Tensor-core tiles whose prologue writes w's copy: every layout that has one, a few tiles
# of each, single pass and split-K.
COOP_W_COPY = [v for v in convtune.variant_space() if v.startswith("coop_")
               and convtune.variant_knobs(v)["layout"] >= 1][::23]


@pytest.mark.skipif(not TC, reason="the adapter has no tensor cores (cooperative matrices)")
@pytest.mark.parametrize("variant", COOP_W_COPY)
def test_tensor_core_kernels_keep_the_copy_of_w(variant):
    # float16 NHWC data and float32 ("high" and, for split 3 tiles, "highest") in both
    # layouts, 3x3 and 1x1 kernels, the weights a Tensor uploaded once.
    i = COOP_W_COPY.index(variant)
    knobs = convtune.variant_knobs(variant)
    half = knobs["layout"] >= 2 and i % 2 == 0
    layout = "NHWC" if half or i % 3 else "NCHW"
    precision = "highest" if knobs["split"] == 3 else "high"
    r = 1 if i % 4 == 3 else 3
    rng = np.random.default_rng(40 + i)
    dt = np.float16 if half else np.float32
    w = (rng.standard_normal((64, 32, r, r)) / 8).astype(dt)
    wt = convtune.to_device(w)
    to = nhwc if layout == "NHWC" else (lambda a: a)

    def call(x):
        return convtune.conv2d(convtune.to_device(to(x), layout), wt, padding=r // 2, layout=layout, variant=variant,
                               precision=None if half else precision)

    def check(got, want, context):
        check_mode_bound(got, to(want), half, precision, f"{variant} {layout} half={half} {context}")

    run_or_skip_tensor_core(variant, lambda: fresh_calls(
        call, lambda x: conv2d_reference(x, w, padding=r // 2), (2, 32, 9, 10), dt, 50 + i, check))


@pytest.mark.skipif(not TC, reason="the adapter has no tensor cores (cooperative matrices)")
@pytest.mark.parametrize("variant", [v for v in COOP_W_COPY if convtune.variant_knobs(v)["layout"] == 1][:4])
def test_layout_one_finds_max_w_with_the_copy_when_w_max_is_unknown(variant):
    # Layout 1 on float32 data finds max |w| in its prologue, while copying w: with weights
    # whose max the host does not know (a conv's output) it must copy them on every call.
    rng = np.random.default_rng(8)
    src = rng.standard_normal((64, 32, 3, 3)).astype(np.float32)
    eye = np.eye(32, dtype=np.float32).reshape(32, 32, 1, 1) * 0.125
    wt = convtune.conv2d(convtune.to_device(src), eye, precision="highest")
    w = src * 0.125
    run_or_skip_tensor_core(variant, lambda: fresh_calls(
        lambda x: convtune.conv2d(convtune.to_device(x), wt, padding=1, variant=variant, precision="high"),
        lambda x: conv2d_reference(x, w, padding=1), (2, 32, 9, 10), np.float32, 9,
        lambda g, r, c: check_mode_bound(g, r, False, "high", f"{variant} {c}")))
