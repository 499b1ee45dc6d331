"""The floor under a small call: what one trivial dispatch costs in timestamp time on this
adapter, and which calls run more than one dispatch (a weight pass, a max pass, a prologue,
a finishing pass) where a single one might do.

Part 1 times the smallest problems there are (1x1 convolutions of one pixel, a few
channels) with the default variant: their GPU time is the per-dispatch floor every kernel
pays. Part 2 lists, for the suite's shapes (and the network layers given with
``--network``, found by forward hooks: needs torch and torchvision) in every mode, the
kernel the call would run (``explain`` chooses as a call would under ``CONVTUNE_TUNE``:
tuning in ``auto`` mode, the default rule's pick under ``off``) and its dispatches, flagging
those with more than one.

Usage: python benches/dispatch_floor.py [--suite public|default] [--modes highest high float16]
       [--network resnet50 ...] [--batch 8] [--reps 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import convtune
from convtune.__main__ import SUITES

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def floor(reps: int) -> None:
    print("| trivial problem | variant | GPU us (median) | p10 / p90 us |")
    print("|---|---|---|---|")
    for x, w in [((1, 1, 1, 1), (1, 1, 1, 1)), ((1, 4, 1, 1), (4, 4, 1, 1)), ((1, 8, 2, 2), (8, 8, 1, 1))]:
        variant, times = convtune.time_variant(x, w, reps=reps, warmup=10)
        us = sorted(t * 1e6 for t in times)
        p = lambda q: us[min(len(us) - 1, int(q * (len(us) - 1)))]  # noqa: E731
        print(f"| {'x'.join(map(str, x))} -> {w[0]}, 1x1 | `{variant}` | {statistics.median(us):.2f} | {p(0.1):.2f} / {p(0.9):.2f} |",
              flush=True)


def problems(args) -> list:
    out = [(c.label(), c.x_shape, c.w_shape, dict(stride=c.stride, padding=c.padding, groups=c.groups))
           for c in SUITES[args.suite]]
    if args.network:
        from first_call import network_convs

        for name in args.network:
            for (xs, ws, st, pad, dil, g), count in network_convs(name, args.batch).items():
                label = f"{name}: {'x'.join(map(str, xs))} k{ws[0]} {ws[2]}x{ws[3]} s{st[0]} g{g} (x{count})"
                out.append((label, xs, ws, dict(stride=st, padding=pad, dilation=dil, groups=g)))
    return out


def explain(mode: str, xs, ws, kw):
    if mode == "float16":
        n, c, h, w = xs
        return convtune.explain((n, h, w, c), ws, layout="NHWC", dtype="float16", **kw)
    return convtune.explain(xs, ws, precision=mode, **kw)


def dispatches(args) -> None:
    rows = problems(args)
    # A first explain starts each problem's tuning (detached where the adapter runs it so);
    # the table shows the kernels chosen once every tuning has ended, as later calls run them.
    for mode in args.modes:
        for _, xs, ws, kw in rows:
            explain(mode, xs, ws, kw)
    convtune.wait_tuning()
    print("\n| mode | problem | variant (source) | dispatches |")
    print("|---|---|---|---|")
    many = 0
    for mode in args.modes:
        for label, xs, ws, kw in rows:
            e = explain(mode, xs, ws, kw)
            d = list(e.dispatches) + ([f"x {e.chunks} chunks"] if e.chunks > 1 else [])
            mark = "**" if len(e.dispatches) > 1 else ""
            many += len(e.dispatches) > 1
            print(f"| {mode} | {label} | `{e.variant}` ({e.source}) | {mark}{', '.join(d)}{mark} |", flush=True)
    print(f"\n{many} of {len(rows) * len(args.modes)} calls run more than one dispatch.")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=sorted(SUITES), default="public")
    p.add_argument("--modes", nargs="+", default=["highest", "high", "float16"])
    p.add_argument("--network", nargs="*", default=[])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--reps", type=int, default=200)
    args = p.parse_args()
    print(f"# {convtune.adapter_info()['name']}: the per-dispatch floor and the calls of more than one dispatch")
    floor(args.reps)
    dispatches(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
