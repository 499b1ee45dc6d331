"""NHWC against NCHW: the same problems tuned and timed in both layouts.

Per public-suite shape and precision mode: the tuned winner and GPU time of the NCHW
problem and of the NHWC one (x as (N, H, W, C), y as (N, OH, OW, K), read and written in
place; `time_variant`, timestamp queries, median of --reps), and their ratio (target:
NHWC within 1.1x of NCHW, or faster).

    python benches/layouts.py                     # public suite, "highest" and "high"
    python benches/layouts.py --only 2,8 --precision high
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import List, Optional

import convtune
from convtune.__main__ import PUBLIC_SUITE


def time_layout(case, layout: str, precision: str, reps: int):
    x = (case.n, case.c, case.h, case.w) if layout == "NCHW" else (case.n, case.h, case.w, case.c)
    w = (case.k, case.c, case.r, case.s)
    kw = dict(stride=case.stride, padding=case.padding, layout=layout, precision=precision)
    convtune.tune(x, w, **kw)
    name, times = convtune.time_variant(x, w, reps=reps, **kw)
    return name, statistics.median(times)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", help="comma-separated indices into the public suite")
    p.add_argument("--precision", default="highest,high", help="comma-separated modes")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    suite = PUBLIC_SUITE if not args.only else [PUBLIC_SUITE[int(i)] for i in args.only.split(",")]
    rows = []
    for prec in [m.strip() for m in args.precision.split(",") if m.strip()]:
        for case in suite:
            a_name, a = time_layout(case, "NCHW", prec, args.reps)
            b_name, b = time_layout(case, "NHWC", prec, args.reps)
            label = f"{case.n},{case.c},{case.h},{case.w} -> {case.k}, {case.r}x{case.s}, s{case.stride}, p{case.padding}"
            rows.append(dict(shape=label, precision=prec, nchw=a_name, nchw_ms=a * 1e3, nhwc=b_name,
                             nhwc_ms=b * 1e3, ratio=b / a))
            print(f"{prec:8s} {label:34s} NCHW {a * 1e3:8.3f} ms {a_name:28s} NHWC {b * 1e3:8.3f} ms "
                  f"{b_name:28s} ratio {b / a:5.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"adapter": convtune.adapter_info()["name"], "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
