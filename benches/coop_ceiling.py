"""The tensor-core family's ceiling: how fast each tile design of the `coop` family runs a plain
GEMM, and how much of that a convolution of the same GEMM size keeps. GPU machines only.

Usage: python benches/coop_ceiling.py [--reps 10] [--dtype float16|float32|both] [--top 6]
                                      [--only SUBSTRING] [--match REGEX] [--json out.json]

Each GEMM C[M, N] = A[M, K] B[K, N] runs as a 1x1 NHWC convolution (x is A with K channels per
pixel, w is B), so it measures the family's own kernels (staging, tensor-core products,
epilogue) without im2col: M = N*OH*OW, N = output channels, K = C*R*S of the public suite's
compute-bound convolutions (>= 7 GFLOP, C >= 64), plus 8192^3. Every tile design the family
has is timed on every GEMM (`convtune.time_variant`, timestamp queries, median of --reps);
then, per convolution, the --top designs of its GEMM are timed on the convolution itself
(NHWC), with cuDNN's fp16 (channels-last) time beside it where PyTorch with CUDA is
importable. float16 data runs the single f16 pass; float32 runs `precision="high"` (f32
converted to f16 while staging). TFLOP/s = 2*M*N*K / GPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import convtune

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import median_ms_or_why  # noqa: E402
from vs_cudnn import cuda_ms  # noqa: E402

# (name, x (N, C, H, W), w (K, C, R, S), stride, padding, dilation)
CONVS = [
    ("32,64,56,56 -> 64 3x3", (32, 64, 56, 56), (64, 64, 3, 3), 1, 1, 1),
    ("32,128,56,56 -> 128 3x3 s2", (32, 128, 56, 56), (128, 128, 3, 3), 2, 1, 1),
    ("32,256,14,14 -> 256 3x3", (32, 256, 14, 14), (256, 256, 3, 3), 1, 1, 1),
    ("32,512,7,7 -> 512 3x3", (32, 512, 7, 7), (512, 512, 3, 3), 1, 1, 1),
    ("2,320,64,64 -> 320 3x3", (2, 320, 64, 64), (320, 320, 3, 3), 1, 1, 1),
    ("8,512,32,32 -> 512 3x3 d2", (8, 512, 32, 32), (512, 512, 3, 3), 1, 2, 2),
    ("EDSR 1,64,720,1280 -> 64 3x3", (1, 64, 720, 1280), (64, 64, 3, 3), 1, 1, 1),
]


def out_size(h, r, stride, pad, dil):
    return (h + 2 * pad - dil * (r - 1) - 1) // stride + 1


def gemm_of(conv):
    _, x, w, stride, pad, dil = conv
    oh, ow = out_size(x[2], w[2], stride, pad, dil), out_size(x[3], w[3], stride, pad, dil)
    return x[0] * oh * ow, w[0], x[1] * w[2] * w[3]


def gemm_problem(m, n, k):
    """A 1x1 NHWC convolution that is the GEMM (m, n, k): m pixels of k channels."""
    width = max(d for d in range(1, 1025) if m % d == 0)
    return (1, k, m // width, width), (n, k, 1, 1)


def designs(dtype, match=""):
    """Every unsplit coop variant that runs the single f16 pass on channels-last data (whose
    name matches the regular expression `match`)."""
    out = []
    for name in convtune.variant_space():
        if not re.search(match, name):
            continue
        knobs = convtune.variant_knobs(name)
        # Split-K is for short grids, a matter of filling the GPU rather than of the design.
        # (Layout 3 stages the input windows of kernels wider than 1x1: not a GEMM design.)
        if knobs["family"] != "coop" or knobs["split"] != 1 or knobs["layout"] in (0, 3) or knobs["splits"] > 1:
            continue
        if knobs["layout"] == 2 and dtype != "float16":
            continue
        out.append(name)
    return out


def time_ms(x, w, stride, pad, dil, dtype, variant, reps):
    """Median GPU ms of `variant` on NHWC data (x given as (N, C, H, W)), or None and why a
    design cannot run this shape (tile, memory): skipped."""
    n, c, h, wd = x
    return median_ms_or_why((n, h, wd, c), w, stride, pad, dil, variant=variant, reps=reps, warmup=2,
                            layout="NHWC", dtype=dtype, precision="high")


def cudnn_fp16_ms(conv):
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    _, x, w, stride, pad, dil = conv
    torch.backends.cudnn.benchmark = True
    xt = torch.randn(x, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    wt = torch.randn(w, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    return cuda_ms(lambda: torch.nn.functional.conv2d(xt, wt, stride=stride, padding=pad, dilation=dil))


def tflops(m, n, k, ms):
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12 if ms else None


def run(dtype, args, out):
    names = designs(dtype, args.match)
    gemms = [("8192^3", (8192, 8192, 8192))] + [(c[0], gemm_of(c)) for c in CONVS]
    if args.only:
        gemms = [g for g in gemms if args.only in g[0]]
    table = {}
    for label, (m, n, k) in gemms:
        x, w = gemm_problem(m, n, k)
        row = {}
        for name in names:
            ms, why = time_ms(x, w, 1, 0, 1, dtype, name, args.reps)
            row[name] = {"ms": ms, "tflops": tflops(m, n, k, ms), "skipped": why}
        table[label] = {"mnk": [m, n, k], "designs": row}
        out[dtype] = {"gemm": table, "conv": {}}
        save(args, out)
        best = sorted((v["tflops"], d) for d, v in row.items() if v["tflops"])[-3:][::-1]
        print(f"[{dtype}] GEMM {label} M={m} N={n} K={k}: "
              + ", ".join(f"{d} {t:.0f}" for t, d in best), flush=True)
    out[dtype] = {"gemm": table, "conv": {}}

    print(f"\n### {dtype}: GEMM TFLOP/s per design (1x1 NHWC; '-' = cannot run)\n")
    labels = list(table)
    print("| design | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    for name in names:
        cells = []
        for label in labels:
            t = table[label]["designs"][name]["tflops"]
            cells.append(f"{t:.0f}" if t else "-")
        print(f"| `{name}` | " + " | ".join(cells) + " |")

    print(f"\n### {dtype}: the convolutions, best GEMM designs run on the conv itself (NHWC)\n")
    print("| conv | GEMM best | GEMM TFLOP/s | conv best | conv ms | conv TFLOP/s | cuDNN fp16 ms | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for conv in CONVS:
        label = conv[0]
        if label not in table:
            continue
        m, n, k = table[label]["mnk"]
        ranked = sorted(((v["tflops"], d) for d, v in table[label]["designs"].items() if v["tflops"]),
                        reverse=True)[: args.top]
        if not ranked:
            continue
        _, x, w, stride, pad, dil = conv
        conv_row = {}
        for _, name in ranked:
            ms, why = time_ms(x, w, stride, pad, dil, dtype, name, args.reps)
            conv_row[name] = {"ms": ms, "tflops": tflops(m, n, k, ms), "skipped": why}
        done = [(v["ms"], d) for d, v in conv_row.items() if v["ms"]]
        cud = cudnn_fp16_ms(conv)
        out[dtype]["conv"][label] = {"designs": conv_row, "cudnn_fp16_ms": cud}
        save(args, out)
        if not done:
            continue
        ms, best = min(done)
        ratio = f"{ms / cud:.2f}" if cud else "-"
        cud_s = f"{cud:.3f}" if cud else "-"
        print(f"| {label} | `{ranked[0][1]}` | {ranked[0][0]:.0f} | `{best}` | {ms:.3f} | "
              f"{tflops(m, n, k, ms):.0f} | {cud_s} | {ratio} |", flush=True)


def save(args, out):
    """Results so far, so a run cut short still leaves them."""
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--dtype", choices=["float16", "float32", "both"], default="float16")
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--only", default="", help="GEMMs whose label contains this")
    ap.add_argument("--match", default="", help="designs whose name matches this regex")
    ap.add_argument("--json")
    args = ap.parse_args()
    info = convtune.adapter_info()
    print(f"adapter: {info.get('name')} ({info.get('driver', '')} {info.get('driver_info', '')})")
    if not info.get("features", {}).get("cooperative_matrix"):
        print("this adapter has no cooperative matrices: nothing to measure")
        return
    out = {"adapter": info.get("name")}
    for dtype in (["float16", "float32"] if args.dtype == "both" else [args.dtype]):
        run(dtype, args, out)
    save(args, out)


if __name__ == "__main__":
    main()
