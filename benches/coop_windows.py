"""The tensor-core family's staged input windows (`_l3`, `_l4`) against its gathering tiles
(`_l2`) on float16 NHWC 3x3 layers. GPU machines only.

Usage: python benches/coop_windows.py [--reps 5] [--top 8] [--names v1,v2] [--float32] [--json out.json]

Times the usual layout 2 winners and every layout 3 and 4 variant (`convtune.time_variant`,
timestamp queries, median of --reps) on each layer and prints the fastest --top with
TFLOP/s (the direct method's FLOPs) and their time over the best layout 2 tile's. --names
adds variants to time (any of `convtune.variant_space()`, e.g. a layout 1 tile). --float32 runs float32 data in
`precision="high"`: the layout 1 tiles the tuner offers against layouts 2 and 3 on the packed
float16 copy a prologue writes (runnable by name, not tuned yet).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import convtune

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from coop_ceiling import time_ms  # noqa: E402

# (label, x (N, C, H, W), w (K, C, R, S), padding)
CONVS = [
    ("EDSR 1,64,720,1280 -> 64", (1, 64, 720, 1280), (64, 64, 3, 3), 1),
    ("32,64,56,56 -> 64", (32, 64, 56, 56), (64, 64, 3, 3), 1),
    ("2,320,64,64 -> 320", (2, 320, 64, 64), (320, 320, 3, 3), 1),
    ("32,256,14,14 -> 256", (32, 256, 14, 14), (256, 256, 3, 3), 1),
    ("32,128,28,28 -> 128", (32, 128, 28, 28), (128, 128, 3, 3), 1),
    ("UNet 1,128,256,256 -> 128", (1, 128, 256, 256), (128, 128, 3, 3), 1),
]
GATHERING = ["coop_b256x64x16_s4x2_p1_l2", "coop_b128x64x16_s2x2_p1_l2", "coop_b128x128x32_s2x4_p1_l2",
             "coop_b128x128x16_s2x2_p1_l2"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--names", default="", help="more variants to time, comma-separated")
    ap.add_argument("--float32", action="store_true", help='float32 data, precision "high"')
    ap.add_argument("--json")
    args = ap.parse_args()
    windows = [v for v in convtune.variant_space()
               if v.startswith("coop_") and convtune.variant_knobs(v)["layout"] >= 3]
    windows += [v for v in args.names.split(",") if v]
    dtype, base = ("float32", "_l1") if args.float32 else ("float16", "_l2")
    gathering = [v.replace("_l2", base) for v in GATHERING]
    if args.float32:
        windows += GATHERING  # layout 2 on the packed copy
    out = {"adapter": convtune.adapter_info(), "rows": []}
    for label, (n, c, h, wd), w, pad in CONVS:
        flops = 2.0 * n * w[0] * h * wd * c * w[2] * w[3]
        timed = []
        for v in gathering + windows:
            ms, _ = time_ms((n, c, h, wd), w, 1, pad, 1, dtype, v, args.reps)
            if ms is not None:  # else a tile this adapter or shape cannot take
                timed.append((ms, v))
        timed.sort()
        if not any(v in gathering for _, v in timed):
            print(f"\n{label}: no tensor-core variant ran on this adapter", flush=True)
            continue
        best_l2 = min(ms for ms, v in timed if v in gathering)
        print(f"\n{label} ({dtype})  best {base[1:]}: {best_l2:.4f} ms", flush=True)
        for ms, v in timed[:args.top]:
            print(f"  {v:36s} {ms:8.4f} ms {flops / ms / 1e9:6.1f} TFLOP/s {ms / best_l2:5.2f}x", flush=True)
        out["rows"] += [{"conv": label, "variant": v, "ms": ms} for ms, v in timed]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
