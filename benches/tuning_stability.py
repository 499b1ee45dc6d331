"""Whether tuning picks the same kernel run to run: each public-suite layer with C >= 64 tuned
`--repeats` times afresh ("high" and float16 NHWC), each run's winner and the runoff's
finalists (first median / runoff median), then every distinct winner timed by name.

Usage: python benches/tuning_stability.py [--repeats N] [--budget S]
"""

from __future__ import annotations

import argparse

import convtune
from timing import median_ms
from convtune.__main__ import PUBLIC_SUITE

MODES = {"high": dict(precision="high"), "float16": dict(layout="NHWC", dtype="float16")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", type=float, default=None, help="tuning seconds per run (default: convtune's)")
    args = ap.parse_args()
    for c in PUBLIC_SUITE:
        if c.c < 64:
            continue
        ws = (c.k, c.c, c.r, c.s)
        for mode, kw in MODES.items():
            xs = (c.n, c.c, c.h, c.w) if mode == "high" else (c.n, c.h, c.w, c.c)
            label = f"{c.n},{c.c},{c.h},{c.w} -> {c.k} {c.r}x{c.s} s{c.stride} {mode}"
            winners = []
            for rep in range(args.repeats):
                r = convtune.tune(xs, ws, c.stride, c.padding, budget=args.budget, force=True, **kw)
                finalists = sorted((d["runoff_ms"], d["median_ms"], d["name"]) for d in r.candidates
                                   if d.get("runoff_ms") is not None)
                winners.append(r.winner)
                print(f"{label} run {rep}: {r.winner} {r.tuned_ms:.4f} ms | finalists (first / runoff ms): "
                      + ", ".join(f"{n} {m:.4f}/{ro:.4f}" for ro, m, n in finalists), flush=True)
            for v in sorted(set(winners)):
                print(f"    {v} by name: {median_ms(xs, ws, c.stride, c.padding, variant=v, reps=50, **kw):.4f} ms", flush=True)


if __name__ == "__main__":
    main()
