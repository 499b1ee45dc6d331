"""Where a device-Tensor call's wall time goes: the time until `conv2d` returns (its kernel
queued), the wait in `synchronize()`, the call's phases (`convtune.last_call_timings()`), and
the per-call time of a chain of 20 calls with one wait at the end; on a tiny problem (fixed
costs) and on the upsamplers of `upsample_vs_torch.py` with x and w as Tensors.

Usage: python benches/tensor_overhead.py [CASE ...]   (default: every case; e.g. "tiny f32")
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import convtune

CASES = {
    "tiny f32": ((1, 8, 8, 8), (8, 8, 3, 3), dict(padding=1), np.float32, "NCHW"),
    "tiny f16": ((1, 8, 8, 8), (8, 8, 3, 3), dict(padding=1), np.float16, "NHWC"),
    "ps2 high": ((1, 64, 360, 640), (256, 64, 3, 3), dict(padding=1, pixel_shuffle=2, precision="high"), np.float32, "NCHW"),
    "ps4 high": ((1, 64, 180, 320), (1024, 64, 3, 3), dict(padding=1, pixel_shuffle=4, precision="high"), np.float32, "NCHW"),
    "ps2 f16": ((1, 360, 640, 64), (256, 64, 3, 3), dict(padding=1, pixel_shuffle=2), np.float16, "NHWC"),
}


def split_times(call, n: int = 60):
    """Medians (ms) of: the call's return, the wait after it, both; and of each phase."""
    call()
    convtune.synchronize()
    rets, waits, both = [], [], []
    phases: dict = {}
    for _ in range(n):
        convtune.synchronize()
        a = time.perf_counter()
        call()
        b = time.perf_counter()
        convtune.synchronize()
        c = time.perf_counter()
        rets.append(b - a)
        waits.append(c - b)
        both.append(c - a)
        for k, v in convtune.last_call_timings()["phases"].items():
            phases.setdefault(k, []).append(v)
    medians = {k: statistics.median(v) * 1e3 for k, v in phases.items()}
    return [statistics.median(v) * 1e3 for v in (rets, waits, both)], medians


def main() -> None:
    rng = np.random.default_rng(0)
    wanted = sys.argv[1:] or list(CASES)
    for name, (xs, ws, kw, dt, layout) in CASES.items():
        if name not in wanted:
            continue
        x = rng.standard_normal(xs).astype(dt)
        w = (rng.standard_normal(ws) / 24).astype(dt)
        xt, wt = convtune.to_device(x, layout), convtune.to_device(w)

        def call():
            return convtune.conv2d(xt, wt, layout=layout, **kw)

        call()  # tunes the shape
        convtune.synchronize()
        (ret, wait, total), phases = split_times(call)
        print(f"{name}: tensor call returns {ret:.3f} ms, sync {wait:.3f}, total {total:.3f}; median phases "
              + ", ".join(f"{k} {v:.3f}" for k, v in phases.items()), flush=True)
        convtune.synchronize()
        a = time.perf_counter()
        for _ in range(20):
            call()
        b = time.perf_counter()
        convtune.synchronize()
        c = time.perf_counter()
        print(f"   chain of 20: {(b - a) / 20 * 1e3:.3f} ms per call queued, {(c - a) / 20 * 1e3:.3f} per call with the wait",
              flush=True)


if __name__ == "__main__":
    main()
