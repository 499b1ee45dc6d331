"""Times every GEMM-family variant (and the default) on each shape of a suite; GPU machines.

Usage: python benches/explore_variants.py [--suite public|default|strided] [--reps 5] [--out results.json]
Prints, per shape, the fastest variants with TFLOP/s, and cuDNN's fp32 time when PyTorch with
CUDA is importable. For studying kernels; the tuner does this selection for users.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

import convtune
from convtune.__main__ import SUITES

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from strided_layers import STRIDED, cudnn_fp32_ms  # noqa: E402

LAYERS = {**SUITES, "strided": STRIDED}


def torch_check(case, name):
    """Max relative error of `name` against PyTorch in float64 on fresh random inputs."""
    try:
        import torch
    except ImportError:
        return None
    rng = np.random.default_rng(1)
    x = rng.standard_normal(case.x_shape, dtype=np.float32)
    w = rng.standard_normal(case.w_shape, dtype=np.float32)
    y = convtune.conv2d(x, w, stride=case.stride, padding=case.padding, groups=case.groups, variant=name)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ref = torch.nn.functional.conv2d(
        torch.from_numpy(x).to(dev, torch.float64), torch.from_numpy(w).to(dev, torch.float64),
        stride=case.stride, padding=case.padding, groups=case.groups).cpu().numpy()
    return float(np.abs(y - ref).max() / np.abs(ref).max())


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--suite", default="public", choices=sorted(LAYERS))
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--family", default="gemm")
    p.add_argument("--out", default=None)
    p.add_argument("--top", type=int, default=5)
    p.add_argument("--only", default="", help="comma-separated indices into the suite")
    p.add_argument("--check", action="store_true", help="check the fastest against PyTorch")
    args = p.parse_args()
    info = convtune.adapter_info()
    print(f"adapter: {info['name']} ({info['backend']}) driver {info['driver']} {info['driver_info']}")
    names = [n for n in convtune.variant_space() if n.startswith(args.family)]
    results = []
    suite = LAYERS[args.suite]
    if args.only:
        suite = [suite[int(i)] for i in args.only.split(",")]
    for case in suite:
        spec = (case.x_shape, case.w_shape, case.stride, case.padding, 1, case.groups)
        default = convtune.default_variant(*spec)
        rows = []
        t_shape = time.perf_counter()
        for name in [default] + [n for n in names if n != default]:
            try:
                t0 = time.perf_counter()
                _, times = convtune.time_variant(*spec, variant=name, reps=args.reps, warmup=1)
                rows.append((statistics.median(times), name, time.perf_counter() - t0))
            except Exception as e:  # noqa: BLE001 - exploration records every failure
                rows.append((float("inf"), name, repr(e)[:120]))
        rows.sort()
        ref = cudnn_fp32_ms(case, 20)
        flops = case.flops()
        d_ms = next(r[0] for r in rows if r[1] == default) * 1e3
        print(f"\n{case.label()}  ({time.perf_counter() - t_shape:.1f} s)  default {default}: {d_ms:.3f} ms"
              + (f"  cuDNN fp32 {ref:.3f} ms" if ref else ""))
        for t, name, extra in rows[: args.top]:
            ratio = f"  x{t * 1e3 / ref:.2f} cuDNN" if ref else ""
            print(f"  {name:28s} {t * 1e3:8.3f} ms  {flops / t / 1e12:6.2f} TFLOP/s{ratio}")
        if args.check and rows[0][0] != float("inf"):
            print(f"  check {rows[0][1]} vs PyTorch float64: rel err {torch_check(case, rows[0][1]):.2e}")
        fails = [r for r in rows if r[0] == float("inf")]
        if fails:
            print(f"  {len(fails)} failed, e.g. {fails[0][1]}: {fails[0][2]}")
        results.append({"shape": case.label(), "cudnn_ms": ref, "default": default,
                        "variants": [{"name": n, "s": t if t != float('inf') else None} for t, n, _ in rows]})
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
