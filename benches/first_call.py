"""A new problem's first call, in the "auto" and "background" tuning modes.

Usage:
    python benches/first_call.py [--suite public|default] [--precisions highest high float16]
        [--tuning auto background] [--network resnet50 --batch 8]

Per tuning mode and precision, in a fresh tuning cache: the wall time of the first ``conv2d``
of every suite shape (random numpy inputs, result read back), p50 / p95 / max, against the
budget (``CONVTUNE_TUNE_BUDGET``, default 1 s). In "background" mode also the seconds until
``wait_tuning()`` returns.

``--network``: every ``Conv2d`` of a torchvision network (``weights=None``; found with
forward hooks; needs torch and torchvision) in background mode: passes over its convolutions
(numpy in, numpy out) repeated until the worker has tuned every problem, each pass's wall
time, then a pass with every problem tuned: the first passes run the default rule's picks,
the last the tuned winners. Run on the GPU machine; on a CPU adapter use ``--suite default``.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time

import numpy as np

import convtune
from convtune.__main__ import SUITES


def fresh_cache():
    os.environ["CONVTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="convtune-first-call-")
    convtune._convtune._reset_tuning_state()


def inputs(x_shape, w_shape, precision, rng):
    dt = np.float16 if precision == "float16" else np.float32
    return rng.standard_normal(x_shape).astype(dt), (rng.standard_normal(w_shape) / 8).astype(dt)


def quantile(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def suite_rows(suite, precisions, tunings):
    budget = float(os.environ.get("CONVTUNE_TUNE_BUDGET", "1"))
    print(f"# first calls: {convtune.adapter_info()['name']}, budget {budget} s, "
          f"CONVTUNE_TUNE_DETACH={os.environ.get('CONVTUNE_TUNE_DETACH', '(default)')}; seconds")
    print("| tuning | precision | shapes | p50 | p95 | max | max - budget | until tuned | tuned geomean ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for tuning in tunings:
        for precision in precisions:
            fresh_cache()
            convtune.set_tuning(tuning)
            walls, calls = [], []
            # First calls back to back, as a network's first pass makes them: a tuning run
            # that outlives its call (auto on GPUs, background) goes on meanwhile.
            for case in suite:
                x, w = inputs(case.x_shape, case.w_shape, precision, rng)
                kw = dict(stride=case.stride, padding=case.padding, groups=case.groups,
                          precision=None if precision == "float16" else precision)
                t = time.perf_counter()
                convtune.conv2d(x, w, **kw)
                walls.append(time.perf_counter() - t)
                calls.append((x, w, kw, case.label()))
            t = time.perf_counter()
            done = convtune.wait_tuning()
            until = f"{time.perf_counter() - t:.1f} ({len(done)} on the worker)"
            # Every problem is tuned now: each run's report (phases of the whole run).
            reports = [convtune.explain(x, w, **kw).report for x, w, kw, _ in calls]
            convtune.set_tuning(None)
            tuned = [r.tuned_ms for r in reports if r is not None and r.tuned_ms]
            geo = math.exp(sum(math.log(v) for v in tuned) / len(tuned)) if tuned else float("nan")
            print(f"| {tuning} | {precision} | {len(walls)} | {quantile(walls, 0.5):.3f} | {quantile(walls, 0.95):.3f} | "
                  f"{max(walls):.3f} | {max(walls) - budget:+.3f} | {until} | {geo:.4f} ({len(tuned)}) |", flush=True)
            # Where the slowest first calls' problems spent their tuning time: the report's
            # phases, and the candidates whose measurement began past the budget (name,
            # status, when, how long).
            slowest = sorted(zip(walls, calls, reports), key=lambda t: -t[0])[:2]
            for wall, (_, _, _, label), report in slowest:
                if report is None or not report.phases:
                    continue
                late = "; ".join(f"{c['name']} {c['status']} at {c['at_s']:.2f} s for {c['measure_ms']:.0f} ms"
                                 for c in report.candidates if c.get("at_s") is not None and c["at_s"] > budget)
                parts = ", ".join(f"{k} {v:.2f}" for k, v in report.phases.items() if v >= 0.005)
                print(f"|  | {label} | {wall:.3f} s | run {report.tuning_s:.2f} s: {parts} | {late} | | | | |", flush=True)


def network_convs(name, batch):
    import torch
    import torchvision

    model = getattr(torchvision.models, name)(weights=None).eval()
    seen = {}

    def hook(mod, args, _out):
        x = args[0]
        key = (tuple(x.shape), tuple(mod.weight.shape), mod.stride, mod.padding, mod.dilation, mod.groups)
        seen[key] = seen.get(key, 0) + 1

    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.zeros(batch, 3, 224, 224))
    return seen


def network_passes(name, batch, precision, max_s=600.0):
    convs = network_convs(name, batch)
    rng = np.random.default_rng(1)
    layers = []
    for (xs, ws, st, pad, dil, g), count in convs.items():
        x, w = inputs(xs, ws, precision, rng)
        layers.append((x, w, dict(stride=st, padding=pad, dilation=dil, groups=g), count))
    mode = None if precision == "float16" else precision

    def one_pass():
        t = time.perf_counter()
        for x, w, kw, count in layers:
            for _ in range(count):
                convtune.conv2d(x, w, precision=mode, **kw)
        return time.perf_counter() - t

    fresh_cache()
    convtune.set_tuning("background")
    t0 = time.perf_counter()
    passes = []
    while time.perf_counter() - t0 < max_s:
        passes.append(one_pass())
        st = convtune.tuning_status()
        if not st["queued"] and st["in_progress"] is None:
            break
    until = time.perf_counter() - t0
    done = convtune.wait_tuning()
    tuned = statistics.median(one_pass() for _ in range(3))
    convtune.set_tuning(None)
    shown = ", ".join(f"{p:.3f}" for p in passes[:4]) + (f", ... {passes[-1]:.3f}" if len(passes) > 4 else "")
    print(f"| {name} b{batch} | {precision} | {len(convs)} / {sum(convs.values())} | {passes[0]:.3f} | {len(passes)} | "
          f"{until:.1f} | {len(done)} | {tuned:.3f} | {shown} |", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=sorted(SUITES), default="public")
    p.add_argument("--precisions", nargs="+", default=["highest", "high", "float16"])
    p.add_argument("--tuning", nargs="*", default=["auto", "background"])
    p.add_argument("--network", nargs="*", default=[], help="torchvision networks, in background mode")
    p.add_argument("--batch", type=int, default=8)
    a = p.parse_args()
    if a.suite and a.tuning:
        suite_rows(SUITES[a.suite], a.precisions, a.tuning)
    if a.network:
        print("\n# background mode over a network's convolutions: passes until every problem is tuned; seconds")
        print("| network | precision | distinct / layers | first pass | passes | until tuned | tuned | pass, all tuned | passes |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name in a.network:
            for precision in a.precisions:
                network_passes(name, a.batch, precision)
    return 0


if __name__ == "__main__":
    sys.exit(main())
