"""A looser mode is never slower: each shape tuned (default budget) as a user would get it in
"highest", then "high", then on float16 data, and the tuned winners timed; and the cost of a
shape past a tile multiple (C = K = 66 against 64) per FLOP in each mode. GPU machines.

Usage: python benches/mode_order.py [--reps 20] [--json out.json]

Prints per shape and mode the winner and its GPU time (`time_variant`, timestamp queries,
median of --reps), "high" / "highest" and float16 / float32 (the faster float32 mode), and
for the 66-channel shape its time per FLOP over the 64-channel one's.
"""

from __future__ import annotations

import argparse
import json
import statistics

import convtune

# (label, x (N, C, H, W), w (K, C, R, S), stride, padding)
SHAPES = [
    ("YOLO stem 16,3,640,640 -> 16 3x3 s2", (16, 3, 640, 640), (16, 3, 3, 3), 2, 1),
    ("1,256,14,14 -> 256 3x3", (1, 256, 14, 14), (256, 256, 3, 3), 1, 1),
    ("depthwise 32,144,56,56 g144", (32, 144, 56, 56), (144, 1, 3, 3), 1, 1),
    ("8,64,56,56 -> 64 3x3", (8, 64, 56, 56), (64, 64, 3, 3), 1, 1),
    ("8,66,56,56 -> 66 3x3", (8, 66, 56, 56), (66, 66, 3, 3), 1, 1),
]

MODES = [("highest", "float32"), ("high", "float32"), ("high", "float16")]


def tuned_ms(x, w, stride, pad, precision, dtype, reps):
    groups = x[1] // w[1]
    kw = dict(stride=stride, padding=pad, groups=groups, precision=precision, dtype=dtype)
    convtune.tune(x, w, **kw)
    name, t = convtune.time_variant(x, w, reps=reps, **kw)
    return name, statistics.median(t) * 1e3


def flops(x, w, stride, pad):
    oh = (x[2] + 2 * pad - w[2]) // stride + 1
    ow = (x[3] + 2 * pad - w[3]) // stride + 1
    return 2.0 * x[0] * w[0] * oh * ow * w[1] * w[2] * w[3]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    out = {"adapter": convtune.adapter_info()["name"], "rows": []}
    per_flop = {}
    for label, x, w, stride, pad in SHAPES:
        row = {"shape": label}
        for precision, dtype in MODES:
            name, ms = tuned_ms(x, w, stride, pad, precision, dtype, args.reps)
            row[f"{precision}/{dtype}"] = {"winner": name, "ms": ms}
        hi, hh, f16 = (row[f"{p}/{d}"]["ms"] for p, d in MODES)
        row["high_over_highest"] = hh / hi
        row["f16_over_f32"] = f16 / min(hi, hh)
        per_flop[label] = {m: row[m]["ms"] / flops(x, w, stride, pad) for m in row if "/" in m}
        out["rows"].append(row)
        print(f"{label}: " + ", ".join(f"{m} {row[m]['winner']} {row[m]['ms']:.4f} ms" for m in row if "/" in m)
              + f" | high/highest {hh / hi:.2f}, float16/float32 {f16 / min(hi, hh):.2f}", flush=True)
    a, b = per_flop.get("8,64,56,56 -> 64 3x3"), per_flop.get("8,66,56,56 -> 66 3x3")
    if a and b:
        out["c66_over_c64_per_flop"] = {m: b[m] / a[m] for m in a}
        print("C = K = 66 over 64, time per FLOP: "
              + ", ".join(f"{m} {b[m] / a[m]:.2f}" for m in a))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
