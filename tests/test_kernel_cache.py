"""The compiled kernels an engine keeps are bounded (CONVTUNE_KERNEL_CACHE, and
CONVTUNE_KERNELS_PER_LAYER per layer): a process that meets many input sizes keeps the most
recently used, drops the rest, reports both in memory_stats(), and every result stays right,
the dropped shapes' included; a layer fed ever new sizes leaves the other layers' kernels
alone, and the process's memory stays bounded."""

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


def run(env_limit, per_layer=None, script=SCRIPT):
    env = dict(os.environ, CONVTUNE_TUNE="off")
    env.pop("CONVTUNE_KERNEL_CACHE", None)
    env.pop("CONVTUNE_KERNELS_PER_LAYER", None)
    if per_layer is not None:
        env["CONVTUNE_KERNELS_PER_LAYER"] = per_layer
    if env_limit is not None:
        env["CONVTUNE_KERNEL_CACHE"] = env_limit
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return tuple(int(v) for v in out.stdout.split())


def test_the_kernels_kept_are_bounded_and_reported():
    cached, limit, evicted = run("4")
    assert (cached, limit) == (4, 4)
    assert evicted == 13 - 4  # 13 calls, each a new compile once its shape was dropped


def test_a_layer_keeps_its_most_recent_sizes():
    # The default keeps every one of ten sizes of a layer.
    assert run(None) == (10, 256, 0)
    assert run("not a number")[1] == 256
    # Eight per layer: ten sizes, then the first three again, each dropped and compiled again.
    assert run(None, per_layer="8") == (8, 256, 2 + 3)


LAYERS = textwrap.dedent("""
    import numpy as np, convtune
    from convtune.reference import conv2d_reference
    def rss_mb():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
    rng = np.random.default_rng(1)
    fixed = [(rng.standard_normal((1, 3, 9, 9)).astype(np.float32), rng.standard_normal((5, 3, 3, 3)).astype(np.float32)),
             (rng.standard_normal((1, 5, 7, 7)).astype(np.float32), rng.standard_normal((2, 5, 1, 1)).astype(np.float32))]
    w = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    start = None
    for i in range(80):  # one layer at ever new sizes between two layers that keep theirs
        for x, k in fixed:
            convtune.conv2d(x, k, padding=k.shape[-1] // 2)
        x = rng.standard_normal((1 + i % 2, 2, 5 + i % 9, 6 + i // 2)).astype(np.float32)
        y = convtune.conv2d(x, w, padding=1)
        if i % 10 == 0:
            want = conv2d_reference(x, w, padding=1)
            assert np.abs(y - want).max() <= 1e-5 * np.abs(want).max(), i
        if i == 19:
            start = rss_mb()
    s = convtune.memory_stats()
    print(s["kernels_cached"], s["kernel_evictions"], round(rss_mb() - start))
""")


def test_a_layer_of_ever_new_sizes_keeps_its_few_and_memory_stays_bounded():
    cached, evicted, grown_mb = run(None, per_layer="4", script=LAYERS)
    # The two fixed layers' kernels were never dropped: 2 + 4 kept, 80 - 4 dropped.
    assert (cached, evicted) == (6, 76)
    # Without the bound each new size kept about 1 MB on lavapipe (60 sizes here).
    assert grown_mb < 30, grown_mb


def test_memory_stats_reports_the_kernel_cache():
    s = convtune.memory_stats()
    assert {"kernels_cached", "kernel_cache_limit", "kernel_evictions"} <= set(s)
    assert 0 <= s["kernels_cached"] <= s["kernel_cache_limit"]
