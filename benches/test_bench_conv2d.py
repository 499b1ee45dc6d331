"""conv2d benchmarks (pytest-benchmark): per shape of the default suite, one group holding the
default variant and the tuned one. See benches/README.md for running and comparing.

Timed calls are whole ``convtune.conv2d`` calls, numpy in and numpy out: what a user sees.
``extra_info`` adds the adapter, the variant and its knobs, the GPU-only median from timestamp
queries, and GFLOP/s for both. The tuned variant comes from the tuning cache as
``CONVTUNE_TUNE`` says; a shape not tuned yet is tuned before its benchmark starts.
"""

from __future__ import annotations

import statistics

import numpy as np
import pytest

pytest.importorskip("pytest_benchmark")

import convtune  # noqa: E402
from convtune.__main__ import DEFAULT_SUITE, Case  # noqa: E402

WARMUP_ROUNDS = 3
ROUNDS = 25


def _id(case: Case) -> str:
    g = f"-g{case.groups}" if case.groups != 1 else ""
    return f"{case.n}x{case.c}x{case.h}x{case.w}-k{case.k}-{case.r}x{case.s}-s{case.stride}-p{case.padding}{g}"


@pytest.fixture(scope="module")
def adapter() -> str:
    info = convtune.adapter_info()
    return f"{info['name']} ({info['backend']})"


def _variant(case: Case, which: str) -> str:
    args = (case.x_shape, case.w_shape, case.stride, case.padding, 1, case.groups)
    if which == "default":
        return convtune.default_variant(*args)
    return convtune.explain(*args).variant


@pytest.mark.parametrize("which", ["default", "tuned"])
@pytest.mark.parametrize("case", DEFAULT_SUITE, ids=_id)
def test_conv2d(benchmark, adapter, case: Case, which: str) -> None:
    variant = _variant(case, which)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(case.x_shape, dtype=np.float32)
    w = rng.standard_normal(case.w_shape, dtype=np.float32)
    kwargs = dict(stride=case.stride, padding=case.padding, groups=case.groups, variant=variant)

    benchmark.group = case.label()
    benchmark.pedantic(
        convtune.conv2d, args=(x, w), kwargs=kwargs, warmup_rounds=WARMUP_ROUNDS, rounds=ROUNDS, iterations=1
    )

    _, gpu = convtune.time_variant(
        case.x_shape, case.w_shape, case.stride, case.padding, 1, case.groups, variant=variant, reps=ROUNDS
    )
    gpu_median = statistics.median(gpu)
    benchmark.extra_info.update(
        adapter=adapter,
        which=which,
        variant=variant,
        knobs=convtune.variant_knobs(variant),
        gpu_median_ms=gpu_median * 1e3,
        gpu_gflops=case.flops() / gpu_median / 1e9,
    )
    if benchmark.stats is not None:  # None under --benchmark-disable (a smoke run)
        benchmark.extra_info["e2e_gflops"] = case.flops() / benchmark.stats.stats.median / 1e9
