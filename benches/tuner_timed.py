"""What a tuning budget buys: per layer, the winner, where the tuning time went and every
candidate that was compiled (rank, status, median ms, compile ms). GPU machines mostly.

Usage: python benches/tuner_timed.py [--budget S] [--json out.json]

Tunes each layer afresh (`force=True`) in the mode named beside it. Compile times include the
driver's shader cache where it is on: set `__GL_SHADER_DISK_CACHE=0` (NVIDIA) to see first-time
compiles.
"""

from __future__ import annotations

import argparse
import json

import convtune

# (label, x, w, stride, keywords, precision)
LAYERS = [
    ("EDSR float16", (1, 720, 1280, 64), (64, 64, 3, 3), 1, dict(layout="NHWC", dtype="float16"), None),
    ("EDSR high", (1, 64, 720, 1280), (64, 64, 3, 3), 1, {}, "high"),
    ("32,256,14,14 high", (32, 256, 14, 14), (256, 256, 3, 3), 1, {}, "high"),
    ("32,256,14,14 float16", (32, 14, 14, 256), (256, 256, 3, 3), 1, dict(layout="NHWC", dtype="float16"), None),
    ("32,128,56,56 s2 high", (32, 128, 56, 56), (128, 128, 3, 3), 2, {}, "high"),
    ("32,512,7,7 high", (32, 512, 7, 7), (512, 512, 3, 3), 1, {}, "high"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=None, help="seconds (default: CONVTUNE_TUNE_BUDGET or 1)")
    ap.add_argument("--json")
    args = ap.parse_args()
    out = {"adapter": convtune.adapter_info(), "budget": args.budget, "layers": []}
    for label, xs, ws, stride, kw, precision in LAYERS:
        r = convtune.tune(xs, ws, stride, 1, force=True, precision=precision, budget=args.budget, **kw)
        compiled = [(i, c) for i, c in enumerate(r.candidates) if c["status"] != "skipped (budget)"]
        phases = ", ".join(f"{k} {v:.2f}" for k, v in r.phases.items())
        print(f"{label}: {r.winner} {r.tuned_ms:.4f} ms; tuning {r.tuning_s:.2f} s ({phases}); "
              f"{len(compiled)} of {len(r.candidates)} candidates timed", flush=True)
        for i, c in compiled:
            ms = f"{c['median_ms']:.4f}" if c["median_ms"] is not None else "-"
            cm = f"{c['compile_ms']:.0f}" if c["compile_ms"] is not None else "-"
            print(f"  {i:3d} {c['name']:42s} {c['status']:14s} {ms:>8s} ms  compile {cm} ms")
        out["layers"].append({"layer": label, "winner": r.winner, "tuned_ms": r.tuned_ms, "tuning_s": r.tuning_s,
                              "phases": r.phases, "candidates": [c for _, c in compiled]})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
