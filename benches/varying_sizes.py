"""A service that meets a new input size on most calls: process memory per new size, and the
compiled kernels kept (`memory_stats`), for one layer (8 -> 16 channels, 3x3, padding 1) or
a small network of three (that layer, a 3x3 stride-2 16 -> 16 and a 1x1 16 -> 32) over
`--sizes` distinct (N, H, W), each result checked against float64 once every 25 sizes.

Usage: python benches/varying_sizes.py [--sizes 1000] [--layers 1|3] [--warm 100]
       (default settings: CONVTUNE_KERNELS_PER_LAYER, default 16, bounds the kernels one layer
       keeps; CONVTUNE_TUNE=off measures what each new size costs without tuning)
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import convtune
from convtune.reference import conv2d_reference


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, default=1000)
    p.add_argument("--layers", type=int, choices=(1, 3), default=1)
    p.add_argument("--warm", type=int, default=100, help="sizes before the memory baseline")
    a = p.parse_args()
    rng = np.random.default_rng(0)
    ws = [(rng.standard_normal((16, 8, 3, 3)) / 8).astype(np.float32),
          (rng.standard_normal((16, 16, 3, 3)) / 12).astype(np.float32),
          (rng.standard_normal((32, 16, 1, 1)) / 4).astype(np.float32)][: a.layers]
    kws = [dict(padding=1), dict(stride=2, padding=1), dict()]
    start = None
    t0 = time.perf_counter()
    new_s, seen_s = [], []

    def chain(y, check=False):
        for w, kw in zip(ws, kws):
            x, y = y, convtune.conv2d(y, w, **kw)
            if check:
                want = conv2d_reference(x, w, **kw)
                assert np.abs(y - want).max() <= 1e-4 * np.abs(want).max(), i
        return y

    for i in range(a.sizes):
        h, wd = 20 + i % 37, 24 + (i * 7) % 53
        y = rng.standard_normal((1 + i % 2, 8, h, wd)).astype(np.float32)
        t = time.perf_counter()
        chain(y, check=i % 25 == 0)
        if i >= a.warm:
            # A new size's calls against the same calls again, the size now met before.
            new_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            chain(y)
            seen_s.append(time.perf_counter() - t)
        if i == a.warm - 1:
            start = rss_mb()
        if (i + 1) % 100 == 0:
            print(f"#   {i + 1} sizes, {time.perf_counter() - t0:.1f} s, RSS {rss_mb():.0f} MB, "
                  f"size-generic kernels {convtune.memory_stats()['generic_kernels']}", flush=True)
    end = rss_mb()
    s = convtune.memory_stats()
    if new_s:
        q = lambda v, f: sorted(v)[min(len(v) - 1, int(f * (len(v) - 1)))] * 1e3  # noqa: E731
        print(f"# calls after the first {a.warm} sizes, ms: new size p50 {q(new_s, 0.5):.2f} / p95 {q(new_s, 0.95):.2f}, "
              f"the same size again p50 {q(seen_s, 0.5):.2f} / p95 {q(seen_s, 0.95):.2f}: p95 ratio "
              f"{q(new_s, 0.95) / q(seen_s, 0.95):.2f}; size-generic kernels {s['generic_kernels']}")
    print(f"# {convtune.adapter_info()['name']}: {a.layers} layer(s), {a.sizes} sizes in {time.perf_counter() - t0:.1f} s; "
          f"RSS {start:.0f} MB after {a.warm}, {end:.0f} MB after {a.sizes}: +{end - start:.1f} MB "
          f"({(end - start) / (a.sizes - a.warm):.3f} MB per new size); kernels kept {s['kernels_cached']} "
          f"(limit {s['kernel_cache_limit']}, {s['kernels_per_layer']} per layer), dropped {s['kernel_evictions']}")


if __name__ == "__main__":
    main()
