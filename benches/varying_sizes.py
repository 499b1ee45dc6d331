"""A service that meets a new input size on most calls: process memory per new size, and the
compiled kernels kept (`memory_stats`), for one layer (8 -> 16 channels, 3x3, padding 1) over
`--sizes` distinct (N, H, W), each result checked against float64 once every 25 calls.

Usage: CONVTUNE_TUNE=off python benches/varying_sizes.py [--sizes 220]
       (CONVTUNE_KERNEL_CACHE=16 to bound the kernels kept lower than the default 256)
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
    p.add_argument("--sizes", type=int, default=220)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    warm = 20
    start = None
    t0 = time.perf_counter()
    for i in range(a.sizes):
        h, wd = 20 + i % 37, 24 + (i * 7) % 53
        x = rng.standard_normal((1 + i % 2, 8, h, wd)).astype(np.float32)
        y = convtune.conv2d(x, w, padding=1)
        if i % 25 == 0:
            want = conv2d_reference(x, w, padding=1)
            assert np.abs(y - want).max() <= 1e-4 * np.abs(want).max(), i
        if i == warm - 1:
            start = rss_mb()
    end = rss_mb()
    s = convtune.memory_stats()
    print(f"# {convtune.adapter_info()['name']}: {a.sizes} sizes in {time.perf_counter() - t0:.1f} s; "
          f"RSS {start:.0f} MB after {warm}, {end:.0f} MB after {a.sizes}: "
          f"{(end - start) / (a.sizes - warm):.3f} MB per new size; kernels kept {s['kernels_cached']} "
          f"(limit {s['kernel_cache_limit']}), dropped {s['kernel_evictions']}")


if __name__ == "__main__":
    main()
