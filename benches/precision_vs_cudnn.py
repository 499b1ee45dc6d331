"""Precision modes against cuDNN on the same NVIDIA GPU, over the public suite.

Per shape and mode, tuned at the default budget (what a user gets): convtune "highest" against
cuDNN fp32 (TF32 off) and convtune "high" against cuDNN TF32, GPU times (timestamp queries /
CUDA events, median of 30), TFLOP/s, the ratio, the winner, and both sides' max relative
error against a float64 result on the same random inputs.

Usage (GPU machine, PyTorch with CUDA installed):
    python benches/precision_vs_cudnn.py [--json out.json] [--budget S]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys

import numpy as np

import convtune
from convtune.__main__ import PUBLIC_SUITE


def cuda_ms(fn, reps: int = 30) -> float:
    import torch

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def rel_err(got, ref) -> float:
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


def cudnn(case, x, w, ref) -> dict:
    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.benchmark = True
    xt, wt = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
    kw = dict(stride=case.stride, padding=case.padding, groups=case.groups)
    out = {}
    for name, tf32 in (("fp32", False), ("tf32", True)):
        torch.backends.cudnn.allow_tf32 = tf32
        out[name + "_ms"] = cuda_ms(lambda: F.conv2d(xt, wt, **kw))
        out[name + "_err"] = rel_err(F.conv2d(xt, wt, **kw).cpu().numpy(), ref)
    torch.backends.cudnn.allow_tf32 = False
    return out


def reference(case, x, w) -> np.ndarray:
    import torch

    return torch.nn.functional.conv2d(
        torch.from_numpy(x).cuda().double(), torch.from_numpy(w).cuda().double(),
        stride=case.stride, padding=case.padding, groups=case.groups,
    ).cpu().numpy()


def convtune_mode(case, x, w, ref, precision: str, budget) -> dict:
    spec = (case.x_shape, case.w_shape, case.stride, case.padding, 1, case.groups)
    rep = convtune.tune(*spec, budget=budget, force=True, precision=precision)
    _, times = convtune.time_variant(*spec, variant=rep.winner, reps=30, warmup=5)
    y = convtune.conv2d(x, w, stride=case.stride, padding=case.padding, groups=case.groups,
                        precision=precision)
    return {"winner": rep.winner, "ms": statistics.median(times) * 1e3, "tune_s": rep.tuning_s,
            "err": rel_err(y, ref)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--budget", type=float, default=None, help="tuning seconds (default: convtune's)")
    args = ap.parse_args()
    info = convtune.adapter_info()
    print(f"adapter: {info['name']}, tensor cores: {info['features']['tensor_cores']}")
    rows = []
    for case in PUBLIC_SUITE:
        rng = np.random.default_rng(0)
        x = rng.standard_normal(case.x_shape, dtype=np.float32)
        w = rng.standard_normal(case.w_shape, dtype=np.float32)
        ref = reference(case, x, w)
        row = {"shape": case.label(), "flops": case.flops(), **cudnn(case, x, w, ref)}
        for p in ("highest", "high"):
            row[p] = convtune_mode(case, x, w, ref, p, args.budget)
        rows.append(row)
        hi, h = row["highest"], row["high"]
        print(
            f"{row['shape']:34s} highest {hi['ms']:7.3f} ms {case.flops() / hi['ms'] / 1e9:6.1f} TF/s "
            f"fp32 {row['fp32_ms']:7.3f} x{hi['ms'] / row['fp32_ms']:5.2f} err {hi['err']:.1e}/{row['fp32_err']:.1e} "
            f"{hi['winner']:28s} | high {h['ms']:7.3f} ms {case.flops() / h['ms'] / 1e9:6.1f} TF/s "
            f"tf32 {row['tf32_ms']:7.3f} x{h['ms'] / row['tf32_ms']:5.2f} err {h['err']:.1e}/{row['tf32_err']:.1e} "
            f"{h['winner']}",
            flush=True,
        )
    for p, ref_key in (("highest", "fp32_ms"), ("high", "tf32_ms")):
        geo = math.exp(sum(math.log(r[p]["ms"] / r[ref_key]) for r in rows) / len(rows))
        print(f"geometric mean {p} / cuDNN {ref_key[:4]}: {geo:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"adapter": info["name"], "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
