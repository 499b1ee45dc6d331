"""Side-by-side benchmark: convtune (tuned WGSL on Vulkan) against cuDNN (PyTorch) on the
same NVIDIA GPU, over the public shape suite. Writes BENCHMARKS.md and a JSON file.

Usage (on the GPU machine, where PyTorch with CUDA is installed):
    CONVTUNE_COMMIT=$(git rev-parse --short HEAD) python benches/vs_cudnn.py \
        --budget 10 --markdown BENCHMARKS.md --json benches/results/vs_cudnn.json

Per shape: convtune GPU time (timestamp queries, median of 50) and its coefficient of
variation, convtune end to end (numpy in -> numpy out, median of 10), cuDNN fp32 with TF32 off,
TF32, and fp16 channels-last (CUDA events, median of 50), TFLOP/s, the ratio to cuDNN fp32,
the time to tune the shape cold, tuned vs default speed-up, peak device memory of one call
over the bytes of x + w + y, and the max relative error against PyTorch in float64.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time

import numpy as np

import convtune
from convtune.__main__ import PUBLIC_SUITE

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_checks import chained_edsr  # noqa: E402


def cuda_ms(fn, reps: int = 50) -> float:
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


def cudnn_times(case) -> dict:
    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.benchmark = True
    x = torch.randn(case.x_shape, device="cuda")
    w = torch.randn(case.w_shape, device="cuda")
    kw = dict(stride=case.stride, padding=case.padding, groups=case.groups)
    out = {}
    for name, tf32 in (("fp32", False), ("tf32", True)):
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        out[name] = cuda_ms(lambda: F.conv2d(x, w, **kw))
    torch.backends.cudnn.allow_tf32 = False
    xh = x.half().to(memory_format=torch.channels_last)
    wh = w.half().to(memory_format=torch.channels_last)
    out["fp16"] = cuda_ms(lambda: F.conv2d(xh, wh, **kw))
    return out


def torch_rel_err(case, x, w, y) -> float:
    import torch

    ref = torch.nn.functional.conv2d(
        torch.from_numpy(x).cuda().double(), torch.from_numpy(w).cuda().double(),
        stride=case.stride, padding=case.padding, groups=case.groups,
    ).cpu().numpy()
    return float(np.abs(y - ref).max() / np.abs(ref).max())


def bench_case(case, budget: float) -> dict:
    spec = (case.x_shape, case.w_shape, case.stride, case.padding, 1, case.groups)
    t0 = time.perf_counter()
    report = convtune.tune(*spec, budget=budget, force=True)
    tune_wall = time.perf_counter() - t0
    _, times = convtune.time_variant(*spec, variant=report.winner, reps=50, warmup=5)
    gpu = statistics.median(times)
    cv = statistics.pstdev(times) / statistics.mean(times)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(case.x_shape, dtype=np.float32)
    w = rng.standard_normal(case.w_shape, dtype=np.float32)
    kw = dict(stride=case.stride, padding=case.padding, groups=case.groups)
    y = convtune.conv2d(x, w, **kw)  # warm: pool, pipeline
    convtune.memory_stats(reset_peak=True)
    e2e = []
    for _ in range(10):
        t1 = time.perf_counter()
        y = convtune.conv2d(x, w, **kw)
        e2e.append(time.perf_counter() - t1)
    peak = convtune.memory_stats()["peak_device_bytes"]
    tensors = x.nbytes + w.nbytes + y.nbytes
    ref = cudnn_times(case)
    return {
        "shape": case.label(),
        "winner": report.winner,
        "default": report.default,
        "gpu_ms": gpu * 1e3,
        "cv": cv,
        "e2e_ms": statistics.median(e2e) * 1e3,
        "tflops": case.flops() / gpu / 1e12,
        "cudnn_fp32_ms": ref["fp32"],
        "cudnn_tf32_ms": ref["tf32"],
        "cudnn_fp16_ms": ref["fp16"],
        "ratio_fp32": gpu * 1e3 / ref["fp32"],
        "tune_s": tune_wall,
        "default_ms": report.default_ms,
        "tuned_ms": report.tuned_ms,
        "speedup_vs_default": report.speedup,
        "peak_over_tensors": peak / tensors,
        "rel_err_vs_torch_f64": torch_rel_err(case, x, w, y),
    }


def markdown(rows, meta, chain) -> str:
    geo = math.exp(sum(math.log(r["ratio_fp32"]) for r in rows) / len(rows))
    edsr = next((r for r in rows if r["shape"].startswith("1,64,720,1280")), None)
    lines = [
        "# Benchmarks",
        "",
        f"Measured {meta['date']} on **{meta['gpu']}** (Vulkan driver {meta['driver']}), convtune "
        f"commit `{meta['commit']}`, PyTorch {meta['torch']} / cuDNN {meta['cudnn']}. "
        f"Command: `{meta['command']}`.",
        "",
        "fp32, NCHW. convtune GPU time from timestamp queries (median of 50 after warm-up; CV over "
        "those 50); e2e = numpy in -> numpy out (median of 10); cuDNN times from CUDA events "
        "(median of 50) with `cudnn.benchmark`; fp16 is channels-last. ratio = convtune GPU / "
        "cuDNN fp32 (TF32 off). tune = cold tuning time of the shape; speed-up = tuned vs the "
        "untuned default; peak = most device-local bytes in use during one call / bytes of "
        "x + w + y; err = max relative error vs PyTorch float64.",
        "",
        "| shape (N,C,H,W -> K, RxS, stride, pad) | winner | GPU ms | TFLOP/s | CV | e2e ms "
        "| cuDNN fp32 | TF32 | fp16 | ratio | tune s | speed-up | peak | err |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | `{r['winner']}` | {r['gpu_ms']:.3f} | {r['tflops']:.1f} | "
            f"{r['cv'] * 100:.1f}% | {r['e2e_ms']:.2f} | {r['cudnn_fp32_ms']:.3f} | "
            f"{r['cudnn_tf32_ms']:.3f} | {r['cudnn_fp16_ms']:.3f} | {r['ratio_fp32']:.2f} | "
            f"{r['tune_s']:.1f} | {r['speedup_vs_default'] or float('nan'):.2f}x | "
            f"{r['peak_over_tensors']:.2f} | {r['rel_err_vs_torch_f64']:.1e} |"
        )
    lines += [
        "",
        f"**Geometric mean of convtune / cuDNN fp32: {geo:.2f}** (target <= 1.0)."
        + (f" EDSR body: {edsr['tflops']:.1f} TFLOP/s (target >= 35)." if edsr else ""),
    ]
    if chain:
        lines += [
            "",
            "## Chained convolutions on GPU-resident tensors",
            "",
            f"{chain['convs']} chained 1,64,720,1280 -> 64, 3x3, p1 convolutions, end to end "
            f"(median of 3): numpy in/out for each conv **{chain['numpy_io_s'] * 1e3:.0f} ms**; "
            f"`convtune.to_device` once, `Tensor` intermediates, `.numpy()` once "
            f"**{chain['tensor_s'] * 1e3:.0f} ms** ({chain['speedup']:.1f}x). Results identical "
            f"(max abs diff {chain['max_abs_diff']:.1e}).",
        ]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--budget", type=float, default=10.0, help="tuning seconds per shape")
    p.add_argument("--only", default="", help="comma-separated indices into the suite")
    p.add_argument("--markdown", default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--chain", action="store_true", help="also time 10 chained EDSR convs")
    args = p.parse_args()
    import torch

    info = convtune.adapter_info()
    meta = {
        "date": datetime.date.today().isoformat(),
        "gpu": info["name"],
        "driver": f"{info['driver']} {info['driver_info']}".strip(),
        "commit": os.environ.get("CONVTUNE_COMMIT", "unknown"),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "command": "python benches/vs_cudnn.py " + " ".join(sys.argv[1:]),
    }
    suite = PUBLIC_SUITE
    if args.only:
        suite = [suite[int(i)] for i in args.only.split(",")]
    rows = []
    for case in suite:
        r = bench_case(case, args.budget)
        rows.append(r)
        print(f"{r['shape']:36s} {r['winner']:26s} {r['gpu_ms']:8.3f} ms {r['tflops']:5.1f} TFLOP/s "
              f"cuDNN {r['cudnn_fp32_ms']:.3f} ms ratio {r['ratio_fp32']:.2f} err {r['rel_err_vs_torch_f64']:.1e}",
              flush=True)
    chain = chained_edsr() if args.chain else None
    md = markdown(rows, meta, chain)
    print(md)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(md)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows, "chain": chain}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
