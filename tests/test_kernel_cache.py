"""The compiled kernels an engine keeps are bounded (CONVTUNE_KERNEL_CACHE): a process that
meets many input sizes keeps the most recently used, drops the rest, reports both in
memory_stats(), and every result stays right, the dropped shapes' included."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import convtune

SCRIPT = textwrap.dedent("""
    import numpy as np, convtune
    from convtune.reference import conv2d_reference
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    sizes = [(5 + i, 6 + 2 * i) for i in range(10)]
    for h, wd in sizes + sizes[:3]:  # the first three again, after they were dropped
        x = rng.standard_normal((1, 3, h, wd)).astype(np.float32)
        y = convtune.conv2d(x, w, padding=1)
        want = conv2d_reference(x, w, padding=1)
        assert np.abs(y - want).max() <= 1e-5 * np.abs(want).max(), (h, wd)
    s = convtune.memory_stats()
    print(s["kernels_cached"], s["kernel_cache_limit"], s["kernel_evictions"])
""")


def run(env_limit):
    env = dict(os.environ, CONVTUNE_TUNE="off")
    env.pop("CONVTUNE_KERNEL_CACHE", None)
    if env_limit is not None:
        env["CONVTUNE_KERNEL_CACHE"] = env_limit
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return tuple(int(v) for v in out.stdout.split())


def test_the_kernels_kept_are_bounded_and_reported():
    cached, limit, evicted = run("4")
    assert (cached, limit) == (4, 4)
    assert evicted == 13 - 4  # 13 calls, each a new compile once its shape was dropped


def test_the_default_keeps_every_shape_of_a_small_process():
    cached, limit, evicted = run(None)
    assert (cached, limit, evicted) == (10, 256, 0)
    assert run("not a number")[1] == 256


def test_memory_stats_reports_the_kernel_cache():
    s = convtune.memory_stats()
    assert {"kernels_cached", "kernel_cache_limit", "kernel_evictions"} <= set(s)
    assert 0 <= s["kernels_cached"] <= s["kernel_cache_limit"]
