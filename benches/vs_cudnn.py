"""Side-by-side benchmark: convtune (tuned WGSL on Vulkan) against cuDNN (PyTorch) on the
same NVIDIA GPU, over the public shape suite. Writes its tables as Markdown and a JSON file;
the tables of the latest full run go into BENCHMARKS.md ("Against cuDNN"), earlier ones
into benches/results/HISTORY.md.

Usage (on the GPU machine, where PyTorch with CUDA is installed):
    CONVTUNE_COMMIT=$(git rev-parse --short HEAD) python benches/vs_cudnn.py \
        --chain --markdown vs_cudnn.md --json benches/results/vs_cudnn/vs_cudnn.json

Per shape: convtune GPU time (timestamp queries, median of 50) and its coefficient of
variation, convtune end to end (numpy in -> numpy out, median of 10) and PyTorch's (numpy ->
cuda -> conv -> cpu numpy, TF32 off, median of 5), cuDNN fp32 with TF32 off,
TF32, and fp16 channels-last (CUDA events, median of 50 runs queued behind a sleep kernel:
no host launch time), TFLOP/s, the ratio to cuDNN fp32,
the time to tune the shape cold, tuned vs default speed-up, peak device memory of one call
over the bytes of x + w + y, and the max relative error against PyTorch in float64.
Precision "highest" is compared with cuDNN fp32 (TF32 off); "high" (tuned separately) with
cuDNN TF32, each side's error measured against float64 on the same inputs. float16 data
(float16 x, w and result, channels-last on both sides) is compared with cuDNN fp16
(`--float16-only` runs just that table).
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
from typing import List

import numpy as np

import convtune
from convtune.__main__ import PUBLIC_SUITE

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_checks import chained_edsr  # noqa: E402


def cuda_torch():
    """PyTorch where it is installed and has a CUDA device, else None (the scripts then time
    convtune alone)."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def cuda_ms(fn, reps: int = 50) -> float:
    """Median GPU time of `fn`'s kernels between CUDA events, with every run queued before the
    GPU reaches it: a sleep kernel first holds the GPU while the host queues them all, so the
    host's launch time (tens of microseconds per PyTorch call) is not timed as GPU time, as
    convtune's timestamp queries do not time it either."""
    import torch

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    torch.cuda._sleep(100_000_000)  # ~50 ms at 2 GHz, longer than queueing `reps` runs takes
    for a, b in zip(starts, ends):
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(starts, ends))


def cudnn_times(case, x_np, w_np, ref) -> dict:
    """cuDNN's times per mode on these inputs, and its fp32 and TF32 errors against `ref`."""
    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.benchmark = True
    x = torch.from_numpy(x_np).cuda()
    w = torch.from_numpy(w_np).cuda()
    kw = dict(stride=case.stride, padding=case.padding, groups=case.groups)
    out = {}
    for name, tf32 in (("fp32", False), ("tf32", True)):
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        out[name] = cuda_ms(lambda: F.conv2d(x, w, **kw))
        out[name + "_err"] = rel_err(F.conv2d(x, w, **kw).cpu().numpy(), ref)
    torch.backends.cudnn.allow_tf32 = False
    xh = x.half().to(memory_format=torch.channels_last)
    wh = w.half().to(memory_format=torch.channels_last)
    out["fp16"] = cuda_ms(lambda: F.conv2d(xh, wh, **kw))
    return out


def torch_e2e_ms(case, x_np, w_np, reps: int = 5) -> float:
    """PyTorch's numpy in -> numpy out, as convtune's e2e column measures convtune: both
    arrays to the GPU, the conv, the result back as numpy (TF32 off; median of `reps`)."""
    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.allow_tf32 = False
    kw = dict(stride=case.stride, padding=case.padding, groups=case.groups)

    def once():
        return F.conv2d(torch.from_numpy(x_np).cuda(), torch.from_numpy(w_np).cuda(), **kw).cpu().numpy()

    once()
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        once()
        out.append(time.perf_counter() - t)
    return statistics.median(out) * 1e3


def torch_f64(case, x, w) -> np.ndarray:
    import torch

    return torch.nn.functional.conv2d(
        torch.from_numpy(x).cuda().double(), torch.from_numpy(w).cuda().double(),
        stride=case.stride, padding=case.padding, groups=case.groups,
    ).cpu().numpy()


def rel_err(y, ref) -> float:
    return float(np.abs(y.astype(np.float64) - ref).max() / np.abs(ref).max())


def tuned_gpu_times(spec, budget, precision: str):
    """(tuning report, wall seconds to tune, GPU seconds of 50 runs of the winner)."""
    t0 = time.perf_counter()
    report = convtune.tune(*spec, budget=budget, force=True, precision=precision)
    tune_wall = time.perf_counter() - t0
    _, times = convtune.time_variant(*spec, variant=report.winner, reps=50, warmup=5)
    return report, tune_wall, times


def bench_case(case, budget) -> dict:
    spec = (case.x_shape, case.w_shape, case.stride, case.padding, 1, case.groups)
    report, tune_wall, times = tuned_gpu_times(spec, budget, "highest")
    gpu = statistics.median(times)
    cv = statistics.pstdev(times) / statistics.mean(times)
    high, _, high_times = tuned_gpu_times(spec, budget, "high")
    high_gpu = statistics.median(high_times)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(case.x_shape, dtype=np.float32)
    w = rng.standard_normal(case.w_shape, dtype=np.float32)
    ref = torch_f64(case, x, w)
    kw = dict(stride=case.stride, padding=case.padding, groups=case.groups)
    y_high = convtune.conv2d(x, w, precision="high", **kw)
    y = convtune.conv2d(x, w, **kw)  # warm: pool, pipeline
    convtune.memory_stats(reset_peak=True)
    e2e = []
    for _ in range(10):
        t1 = time.perf_counter()
        y = convtune.conv2d(x, w, **kw)
        e2e.append(time.perf_counter() - t1)
    peak = convtune.memory_stats()["peak_device_bytes"]
    tensors = x.nbytes + w.nbytes + y.nbytes
    cudnn = cudnn_times(case, x, w, ref)
    torch_e2e = torch_e2e_ms(case, x, w)
    return {
        "shape": case.label(),
        "winner": report.winner,
        "default": report.default,
        "gpu_ms": gpu * 1e3,
        "cv": cv,
        "e2e_ms": statistics.median(e2e) * 1e3,
        "torch_e2e_ms": torch_e2e,
        "tflops": case.flops() / gpu / 1e12,
        "cudnn_fp32_ms": cudnn["fp32"],
        "cudnn_tf32_ms": cudnn["tf32"],
        "cudnn_fp16_ms": cudnn["fp16"],
        "ratio_fp32": gpu * 1e3 / cudnn["fp32"],
        "high_winner": high.winner,
        "high_ms": high_gpu * 1e3,
        "high_tflops": case.flops() / high_gpu / 1e12,
        "ratio_tf32": high_gpu * 1e3 / cudnn["tf32"],
        "high_err": rel_err(y_high, ref),
        "cudnn_fp32_err": cudnn["fp32_err"],
        "cudnn_tf32_err": cudnn["tf32_err"],
        "tune_s": tune_wall,
        "default_ms": report.default_ms,
        "tuned_ms": report.tuned_ms,
        "speedup_vs_default": report.speedup,
        "peak_over_tensors": peak / tensors,
        "rel_err_vs_torch_f64": rel_err(y, ref),
    }


def float16_case(case, budget) -> dict:
    """float16 data against cuDNN fp16, both channels-last (NHWC, as cuDNN's fp16 is timed):
    the tuned winner's GPU time, and each side's max relative error against float64 on the
    same float16 inputs."""
    import torch
    import torch.nn.functional as F

    rng = np.random.default_rng(1)
    fan_in = int(np.prod(case.w_shape[1:]))
    x = rng.standard_normal(case.x_shape).astype(np.float16)
    w = (rng.standard_normal(case.w_shape) / np.sqrt(fan_in)).astype(np.float16)
    xn = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    spec = (xn.shape, case.w_shape, case.stride, case.padding, 1, case.groups)
    kw = dict(layout="NHWC", dtype="float16")
    report = convtune.tune(*spec, budget=budget, force=True, **kw)
    _, times = convtune.time_variant(*spec, variant=report.winner, reps=50, warmup=5, **kw)
    gpu = statistics.median(times)
    y = convtune.conv2d(xn, w, stride=case.stride, padding=case.padding, groups=case.groups, layout="NHWC")
    ref = torch_f64(case, x, w)
    conv_kw = dict(stride=case.stride, padding=case.padding, groups=case.groups)
    xh = torch.from_numpy(x).cuda().to(memory_format=torch.channels_last)
    wh = torch.from_numpy(w).cuda().to(memory_format=torch.channels_last)
    torch.backends.cudnn.benchmark = True
    cudnn_ms = cuda_ms(lambda: F.conv2d(xh, wh, **conv_kw))
    return {
        "shape": case.label(),
        "f16_winner": report.winner,
        "f16_ms": gpu * 1e3,
        "f16_tflops": case.flops() / gpu / 1e12,
        "cudnn_fp16_ms": cudnn_ms,
        "ratio_fp16": gpu * 1e3 / cudnn_ms,
        "f16_err": rel_err(y.transpose(0, 3, 1, 2), ref),
        "cudnn_fp16_err": rel_err(F.conv2d(xh, wh, **conv_kw).float().cpu().numpy(), ref),
    }


def float16_markdown(rows) -> List[str]:
    geo = math.exp(sum(math.log(r["ratio_fp16"]) for r in rows) / len(rows))
    lines = [
        "## float16 data against cuDNN fp16",
        "",
        "float16 x and w, float16 result, both sides channels-last (convtune `layout=\"NHWC\"`, "
        "PyTorch `channels_last`); default tuning budget. err = max relative error vs float64 on "
        "the same float16 inputs.",
        "",
        "| shape | winner | GPU ms | TFLOP/s | cuDNN fp16 | ratio | err | cuDNN err |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | `{r['f16_winner']}` | {r['f16_ms']:.3f} | {r['f16_tflops']:.1f} | "
            f"{r['cudnn_fp16_ms']:.3f} | {r['ratio_fp16']:.2f} | {r['f16_err']:.1e} | {r['cudnn_fp16_err']:.1e} |"
        )
    lines += ["", f"**Geometric mean of convtune float16 / cuDNN fp16: {geo:.2f}** (target <= 2.0).", ""]
    return lines


def markdown(rows, meta, chain) -> str:
    def geomean(key):
        return math.exp(sum(math.log(r[key]) for r in rows) / len(rows))

    geo, geo_high = geomean("ratio_fp32"), geomean("ratio_tf32")
    edsr = next((r for r in rows if r["shape"].startswith("1,64,720,1280")), None)
    lines = [
        "# Benchmarks",
        "",
        f"Measured {meta['date']} on **{meta['gpu']}** (Vulkan driver {meta['driver']}), convtune "
        f"commit `{meta['commit']}`, PyTorch {meta['torch']} / cuDNN {meta['cudnn']}. "
        f"Command: `{meta['command']}`.",
        "",
        "fp32, NCHW. convtune GPU time from timestamp queries (median of 50 after warm-up, w "
        "resident as a weight Tensor's and cuDNN's are: its rearranged copy made once; CV over "
        "those 50); e2e = numpy in -> numpy out (median of 10); torch e2e = the same through "
        "PyTorch (`torch.from_numpy(x).cuda()`, likewise w, `F.conv2d`, `.cpu().numpy()`, TF32 "
        "off, median of 5); cuDNN times from CUDA events around each of 50 runs queued "
        "behind a sleep kernel (no host launch time) with `cudnn.benchmark`; fp16 is channels-last. ratio = convtune GPU / "
        "cuDNN fp32 (TF32 off). tune = cold tuning time of the shape; speed-up = tuned vs the "
        "untuned default; peak = most device-local bytes in use during one call / bytes of "
        "x + w + y; err = max relative error vs PyTorch float64.",
        "",
        "| shape (N,C,H,W -> K, RxS, stride, pad) | winner | GPU ms | TFLOP/s | CV | e2e ms "
        "| torch e2e ms | cuDNN fp32 | TF32 | fp16 | ratio | tune s | speed-up | peak | err |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | `{r['winner']}` | {r['gpu_ms']:.3f} | {r['tflops']:.1f} | "
            f"{r['cv'] * 100:.1f}% | {r['e2e_ms']:.2f} | {r['torch_e2e_ms']:.2f} | {r['cudnn_fp32_ms']:.3f} | "
            f"{r['cudnn_tf32_ms']:.3f} | {r['cudnn_fp16_ms']:.3f} | {r['ratio_fp32']:.2f} | "
            f"{r['tune_s']:.1f} | {r['speedup_vs_default'] or float('nan'):.2f}x | "
            f"{r['peak_over_tensors']:.2f} | {r['rel_err_vs_torch_f64']:.1e} |"
        )
    lines += [
        "",
        f"**Geometric mean of convtune / cuDNN fp32: {geo:.2f}** (target <= 1.0)."
        + (f" EDSR body: {edsr['tflops']:.1f} TFLOP/s (target >= 35)." if edsr else ""),
        "",
        "## Precision \"high\" against cuDNN TF32",
        "",
        "The same shapes tuned for `precision=\"high\"` (TF32-class; the tensor-core family "
        "where the adapter has cooperative matrices), against cuDNN with TF32 on. err = max "
        "relative error vs float64 on the same inputs.",
        "",
        "| shape | winner | GPU ms | TFLOP/s | cuDNN TF32 | ratio | err | TF32 err | highest err | fp32 err |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | `{r['high_winner']}` | {r['high_ms']:.3f} | {r['high_tflops']:.1f} | "
            f"{r['cudnn_tf32_ms']:.3f} | {r['ratio_tf32']:.2f} | {r['high_err']:.1e} | "
            f"{r['cudnn_tf32_err']:.1e} | {r['rel_err_vs_torch_f64']:.1e} | {r['cudnn_fp32_err']:.1e} |"
        )
    lines += ["", f"**Geometric mean of convtune high / cuDNN TF32: {geo_high:.2f}** (target <= 1.0).", ""]
    lines += float16_markdown(rows)
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
    p.add_argument("--budget", type=float, default=None,
                   help="tuning seconds per shape and mode (default: convtune's, what users get)")
    p.add_argument("--only", default="", help="comma-separated indices into the suite")
    p.add_argument("--markdown", default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--chain", action="store_true", help="also time 10 chained EDSR convs")
    p.add_argument("--float16-only", action="store_true",
                   help="only the float16 table (float16 data against cuDNN fp16)")
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
    if args.float16_only:
        half = []
        for case in suite:
            r = float16_case(case, args.budget)
            half.append(r)
            print(f"{r['shape']:36s} {r['f16_winner']:28s} {r['f16_ms']:8.3f} ms {r['f16_tflops']:6.1f} TFLOP/s "
                  f"cuDNN fp16 {r['cudnn_fp16_ms']:.3f} ms ratio {r['ratio_fp16']:.2f} err {r['f16_err']:.1e} "
                  f"(cuDNN {r['cudnn_fp16_err']:.1e})", flush=True)
        md = "\n".join(float16_markdown(half))
        print(md)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "float16": half}, f, indent=1)
        return 0
    rows = []
    for case in suite:
        r = bench_case(case, args.budget)
        r.update({k: v for k, v in float16_case(case, args.budget).items() if k != "shape"})
        rows.append(r)
        print(f"{r['shape']:36s} {r['winner']:26s} {r['gpu_ms']:8.3f} ms {r['tflops']:5.1f} TFLOP/s "
              f"cuDNN {r['cudnn_fp32_ms']:.3f} ms ratio {r['ratio_fp32']:.2f} err {r['rel_err_vs_torch_f64']:.1e} "
              f"e2e {r['e2e_ms']:.2f} ms (torch {r['torch_e2e_ms']:.2f}) | "
              f"high {r['high_winner']:26s} {r['high_ms']:8.3f} ms vs TF32 {r['ratio_tf32']:.2f} "
              f"err {r['high_err']:.1e} (TF32 {r['cudnn_tf32_err']:.1e})",
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
