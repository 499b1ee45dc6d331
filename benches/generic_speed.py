"""Size-generic kernels against exact-size ones: per suite shape and precision mode, the tuned
winner's GPU time compiled for the exact size, then the same variant run as its layer's
size-generic module (the layer made to switch over by one other size first), and whether the
winner takes that form at all; and the fastest size-generic module among the tuning's three
fastest candidates, which a size bucket's tuning runs (`autotune::tune_job`). Each side runs
in its own process (the engine keeps a shape's compiled kernel); both share a fresh tuning
cache, so the second finds the winner.

Usage: python benches/generic_speed.py [--suite public|default] [--precisions highest high float16] [--reps 30]
Prints a Markdown table and, per mode, the geometric means of generic / exact over the shapes
whose winner takes the generic form and over those where one of the three fastest does (issue
target: within 1.15x).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

from convtune.__main__ import SUITES

CHILD = r"""
import json, sys, statistics
import numpy as np
import convtune
case, precision, variant, reps = json.loads(sys.argv[1])
x, w, kw = case
kw = dict(kw)
if precision == "float16":
    kw.update(dtype="float16")
else:
    kw.update(precision=precision)
out = {}
if variant is None:
    report = convtune.tune(x, w, **kw)
    ok = sorted((c for c in report.candidates if c["status"] == "ok" and c["median_ms"] is not None),
                key=lambda c: c.get("runoff_ms") or c["median_ms"])
    variant = report.winner
    out["finalists"] = [variant] + [c["name"] for c in ok if c["name"] != variant][:2]
else:
    # Another size of the layer first: with CONVTUNE_GENERIC_AFTER=1 the next new size of it
    # (the one timed) runs the size-generic module.
    n, c, h, wd = x
    dt = np.float16 if precision == "float16" else np.float32
    other = np.random.default_rng(0).standard_normal((n, c, h + 2, wd + 2)).astype(dt)
    call = {k: v for k, v in kw.items() if k != "dtype"}
    convtune.conv2d(other, np.random.default_rng(1).standard_normal(w).astype(dt), variant=variant, **call)
before = convtune.memory_stats()["generic_kernels"]
_, times = convtune.time_variant(x, w, variant=variant, reps=reps, **kw)
out.update(variant=variant, ms=statistics.median(times) * 1e3, generic=convtune.memory_stats()["generic_kernels"] > before)
print(json.dumps(out))
"""


def child(case, precision, variant, reps, env):
    r = subprocess.run([sys.executable, "-c", CHILD, json.dumps([case, precision, variant, reps])],
                       capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=sorted(SUITES), default="public")
    p.add_argument("--precisions", nargs="+", default=["highest", "high", "float16"])
    p.add_argument("--reps", type=int, default=30)
    a = p.parse_args()
    cache = tempfile.mkdtemp(prefix="convtune-generic-speed-")
    base = dict(os.environ, CONVTUNE_CACHE_DIR=cache, CONVTUNE_PROGRESS="0", CONVTUNE_TUNE="cached")
    print("| mode | shape | winner | exact ms | its generic ms | / exact | fastest generic of the 3 fastest | ms | / exact |")
    print("|---|---|---|---|---|---|---|---|---|")
    for precision in a.precisions:
        ratios, bests = [], []
        for case in SUITES[a.suite]:
            spec = [list(case.x_shape), list(case.w_shape), dict(stride=case.stride, padding=case.padding, groups=case.groups)]
            exact = child(spec, precision, None, a.reps, dict(base, CONVTUNE_GENERIC_AFTER="0"))
            if "error" in exact:
                print(f"| {precision} | {case.label()} | error: {exact['error']} | | | | | | |", flush=True)
                continue
            gens = {v: child(spec, precision, v, a.reps, dict(base, CONVTUNE_GENERIC_AFTER="1")) for v in exact["finalists"]}
            took = {v: g["ms"] for v, g in gens.items() if "error" not in g and g["generic"]}
            gen = gens[exact["variant"]]
            if exact["variant"] in took:
                ratios.append(gen["ms"] / exact["ms"])
                mine = f"{gen['ms']:.4f} | {ratios[-1]:.2f}"
            else:
                mine = f"- | {gen.get('error', 'no size-generic form')}"
            if took:
                best = min(took, key=took.get)
                bests.append(took[best] / exact["ms"])
                theirs = f"`{best}` | {took[best]:.4f} | {bests[-1]:.2f}"
            else:
                theirs = "- | | "
            print(f"| {precision} | {case.label()} | `{exact['variant']}` | {exact['ms']:.4f} | {mine} | {theirs} |", flush=True)
        geo = lambda r: math.exp(sum(map(math.log, r)) / len(r)) if r else float("nan")  # noqa: E731
        print(f"| {precision} | **geomean** over {len(ratios)} / {len(bests)} | | | | **{geo(ratios):.2f}** | | | **{geo(bests):.2f}** |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
