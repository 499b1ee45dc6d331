"""Does the default tuning budget find the best kernel, and how long does a new shape's first call take?

Usage:
    python benches/tuner_budget.py                          # public suite, long budget 20 s
    CONVTUNE_FAMILIES=direct,gemm,wino python benches/tuner_budget.py --json out.json
    ... --budget 1 --long-winners out.json   # another short budget against the same long winners
    python benches/tuner_budget.py --suite default --long 5  # CPU adapters: smaller shapes

Per shape, in a fresh tuning cache (a temporary ``CONVTUNE_CACHE_DIR``):

1. **first call**: wall time of the first ``conv2d`` on the shape (tuning at the default
   budget included), and the tuning report's phases (setup, compile, validate, timing);
2. **long**: ``tune(..., budget=--long, force=True)``;
3. both winners timed with ``time_variant`` in alternation (``--rounds`` rounds of ``--reps``
   runs; median of the round medians), so ``default/long`` compares them on equal terms.

Targets (issue 9, FMA-only): default-budget winner within 5% of the long-budget winner's
time on every shape; first call median <= 1.5 s, max <= 3 s. The JSON keeps every
candidate of both reports, in the order tried, for fitting the ranking.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=("public", "default"), default="public")
    p.add_argument("--long", type=float, default=20.0, help="the long tuning budget, seconds")
    p.add_argument("--budget", type=float, default=None,
                   help="the short budget (sets CONVTUNE_TUNE_BUDGET; default: the library's)")
    p.add_argument("--long-winners", default=None,
                   help="a JSON this script wrote before: take its long-budget winners instead of "
                        "tuning again (the same adapter and families)")
    p.add_argument("--reps", type=int, default=20, help="timed runs per round")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per winner")
    p.add_argument("--precision", default=None, help="precision mode (default: highest)")
    p.add_argument("--only", default="", help="comma-separated indices of the suite's shapes")
    p.add_argument("--json", default=None, help="also write the rows here")
    args = p.parse_args()
    os.environ["CONVTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="convtune-tuner-budget-")
    if args.budget is None:
        os.environ.pop("CONVTUNE_TUNE_BUDGET", None)
    else:
        os.environ["CONVTUNE_TUNE_BUDGET"] = str(args.budget)
    earlier = {}
    if args.long_winners:
        with open(args.long_winners) as f:
            earlier = {r["shape"]: r["long"] for r in json.load(f)["rows"]}
    os.environ["CONVTUNE_TUNE"] = "auto"
    import convtune
    from convtune.__main__ import SUITES

    info = convtune.adapter_info()
    print(f"adapter: {info['name']} ({info['type']}); families "
          f"{os.environ.get('CONVTUNE_FAMILIES', 'all')}; long budget {args.long:g} s")
    rng = np.random.default_rng(0)
    only = {int(i) for i in args.only.split(",") if i}
    rows = []
    for i, case in enumerate(SUITES[args.suite]):
        if only and i not in only:
            continue
        xs, ws = case.x_shape, case.w_shape
        geo = dict(stride=case.stride, padding=case.padding, groups=case.groups)
        x = rng.standard_normal(xs, dtype=np.float32)
        w = rng.standard_normal(ws, dtype=np.float32)
        t = time.perf_counter()
        convtune.conv2d(x, w, precision=args.precision, **geo)
        first_s = time.perf_counter() - t
        short = convtune.explain(xs, ws, precision=args.precision, **geo).report
        if case.label() in earlier:
            long = earlier[case.label()]
        else:
            rep = convtune.tune(xs, ws, budget=args.long, force=True, precision=args.precision, **geo)
            long = {"winner": rep.winner, "tuning_s": rep.tuning_s, "phases": rep.phases,
                    "candidates": rep.candidates}
        times = {short.winner: [], long["winner"]: []}
        for _ in range(args.rounds):
            for v in times:
                _, ts = convtune.time_variant(xs, ws, variant=v, reps=args.reps, warmup=2,
                                              precision=args.precision, **geo)
                times[v].append(statistics.median(ts) * 1e3)
        short_ms = statistics.median(times[short.winner])
        long_ms = statistics.median(times[long["winner"]])
        tried = [c["name"] for c in long["candidates"] if c["status"] != "skipped (budget)"]
        row = {
            "shape": case.label(),
            "first_call_s": first_s,
            "short": {"winner": short.winner, "ms": short_ms, "tuning_s": short.tuning_s,
                      "phases": short.phases, "candidates": short.candidates},
            "long": {"winner": long["winner"], "ms": long_ms, "tuning_s": long["tuning_s"],
                     "phases": long["phases"], "candidates": long["candidates"],
                     "winner_rank": tried.index(long["winner"]) if long["winner"] in tried else None,
                     "from": args.long_winners or "this run"},
            "ratio": short_ms / long_ms,
        }
        rows.append(row)
        if args.json:  # after every shape: a run stopped at a time limit keeps what it has
            write(args.json, info, args, rows)
        timed = sum(c["status"] in ("ok", "pruned") for c in short.candidates)
        print(f"{row['shape']}: first call {first_s:.2f} s ({timed} timed; "
              + ", ".join(f"{k} {v:.2f}" for k, v in (short.phases or {}).items())
              + f"); default {short.winner} {short_ms:.3f} ms; long {long['winner']} {long_ms:.3f} ms "
              f"(tried {len(tried)}, winner #{row['long']['winner_rank']}); ratio {row['ratio']:.3f}",
              flush=True)
    if rows:
        firsts = [r["first_call_s"] for r in rows]
        ratios = [r["ratio"] for r in rows]
        print(f"\nfirst call: median {statistics.median(firsts):.2f} s, max {max(firsts):.2f} s "
              f"(targets 1.5 / 3); default vs long: worst {max(ratios):.3f}, "
              f"{sum(r <= 1.05 for r in ratios)} of {len(ratios)} within 5%")
    return 0


def write(path, info, args, rows) -> None:
    with open(path, "w") as f:
        json.dump({"adapter": info["name"], "families": os.environ.get("CONVTUNE_FAMILIES"),
                   "long_budget_s": args.long, "budget_s": args.budget, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
