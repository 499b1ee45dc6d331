"""The tensor-core family's inner-loop options, each against the same tile without it.
GPU machines only.

Usage: python benches/coop_options.py [--tiles b128x128x16_s2x2,...] [--opts 0,8,...]
                                      [--only SUBSTRING] [--reps 8] [--warmup 5] [--json out.json]

Options (a bit set, the `_o` suffix of a variant name): 1 = layout 2 gathers float16 vectors
and stages them as loaded; 2 = the kernel window's (r, s) decode and tests once per (r, s)
instead of per step; 4 = two staging buffers, one barrier per step; 8 = the gathers test
only the tile edges the shape can cut, and none is issued past the last step; 16 (with 8):
those are issued, their index clamped, instead of a branch around them. Every design is first
checked against the float64 reference on a small random problem (a wrong design is reported
and not timed), then timed (`convtune.time_variant`, median of --reps) on float16 NHWC data:
a plain GEMM as a 1x1 convolution and the public suite's compute-bound 3x3 layers.
TFLOP/s = the direct method's FLOPs / GPU time.
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

import convtune
from convtune.reference import conv2d_reference

TILES = ["b128x128x16_s2x2", "b128x256x32_s2x4", "b128x256x16_s2x4", "b256x64x16_s4x2",
         "b128x64x16_s2x2", "b256x128x16_s4x2", "b128x128x32_s2x4", "b256x128x32_s4x2",
         "b256x64x32_s4x2", "b256x64x16_s4x1", "b256x64x32_s4x1", "b128x64x32_s2x1"]
OPTS = [0, 8, 24, 26]
# (label, x (N, C, H, W), w (K, C, R, S), stride, padding)
PROBLEMS = [
    ("GEMM 8192^3 (1x1)", (1, 8192, 64, 128), (8192, 8192, 1, 1), 1, 0),
    ("EDSR 1,64,720,1280 -> 64 3x3", (1, 64, 720, 1280), (64, 64, 3, 3), 1, 1),
    ("32,64,56,56 -> 64 3x3", (32, 64, 56, 56), (64, 64, 3, 3), 1, 1),
    ("2,320,64,64 -> 320 3x3", (2, 320, 64, 64), (320, 320, 3, 3), 1, 1),
    ("32,256,14,14 -> 256 3x3", (32, 256, 14, 14), (256, 256, 3, 3), 1, 1),
]


def name(tile, opt):
    base = f"coop_{tile}_p1_l2"
    return base if opt == 0 else f"{base}_k1_o{opt}"


# Small float16 NHWC problems: ragged tile edges; whole pixel, channel and reduction tiles
# (the edges `_o8` stops testing), padded and 1x1. (x (N, H, W, C), w, padding)
CHECKS = [((2, 19, 23, 64), (40, 64, 3, 3), 1), ((2, 16, 16, 64), (256, 64, 3, 3), 1),
          ((1, 8, 64, 64), (256, 64, 1, 1), 0)]


def check(variant, rng):
    """Max error relative to max |y| over the CHECKS problems."""
    worst = 0.0
    for xs, ws, pad in CHECKS:
        x = rng.standard_normal(xs).astype(np.float16)
        w = rng.standard_normal(ws).astype(np.float16)
        got = convtune.conv2d(x, w, 1, pad, layout="NHWC", variant=variant).astype(np.float64)
        want = conv2d_reference(x.transpose(0, 3, 1, 2).astype(np.float64), w.astype(np.float64), 1, pad)
        want = want.transpose(0, 2, 3, 1)
        worst = max(worst, float(np.max(np.abs(got - want)) / np.max(np.abs(want))))
    return worst


def flops(x, w, stride, pad):
    n, c, h, wd = x
    k, _, r, s = w
    oh = (h + 2 * pad - r) // stride + 1
    ow = (wd + 2 * pad - s) // stride + 1
    return 2.0 * n * k * oh * ow * c * r * s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiles", default=",".join(TILES))
    ap.add_argument("--opts", default=",".join(map(str, OPTS)))
    ap.add_argument("--only", default="")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    tiles = args.tiles.split(",")
    opts = [int(o) for o in args.opts.split(",")]
    problems = [p for p in PROBLEMS if args.only in p[0]]
    out = {"adapter": convtune.adapter_info(), "rows": []}
    ok = {}
    for tile in tiles:
        for opt in opts:
            v = name(tile, opt)
            try:
                err = check(v, rng)
            except Exception as e:  # a design this adapter cannot build
                print(f"{v}: {str(e).splitlines()[0][:120]}", flush=True)
                continue
            ok[v] = err < 4e-3
            print(f"{v}: error {err:.2e}{'' if ok[v] else '  WRONG: not timed'}", flush=True)
    for label, x, w, stride, pad in problems:
        n, c, h, wd = x
        print(f"\n{label}", flush=True)
        for tile in tiles:
            base = None
            for opt in opts:
                v = name(tile, opt)
                if not ok.get(v):
                    continue
                try:
                    _, t = convtune.time_variant((n, h, wd, c), w, stride, pad, variant=v, reps=args.reps,
                                                 warmup=args.warmup, layout="NHWC", dtype="float16")
                except Exception as e:
                    print(f"  {v:40s} skipped: {str(e).splitlines()[0][:90]}", flush=True)
                    continue
                ms = statistics.median(t) * 1e3
                base = base or (ms if opt == 0 else None)
                rel = f"{ms / base:5.2f}x" if base else "     "
                tf = flops(x, w, stride, pad) / (ms * 1e-3) / 1e12
                print(f"  {v:40s} {ms:8.4f} ms {tf:6.1f} TFLOP/s {rel}", flush=True)
                out["rows"].append({"problem": label, "variant": v, "ms": ms, "tflops": tf})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
