"""Performance cliffs: sweeps of one parameter at a time around a base shape, convtune's tuned
GPU time per FLOP against cuDNN's, to find sizes where one library falls off a cliff (a point
much slower per FLOP than its neighbours).

Sweeps (base N=8, C=K=64, H=W=56, 3x3, stride 1, padding 1 unless swept):
  C64, C128, C256   C = center-8 .. center+8, with C = K = center as the base
  K64, K128, K256   K likewise
  HW56, HW14        H = W = center-8 .. center+8
  pad               padding 0 .. 4
  N                 batch 8 .. 40 in steps of 4

Per point: convtune.tune afresh (force=True; default budget unless --budget; a point shared
by several sweeps is tuned once) then convtune.time_variant of the winner (GPU timestamps,
median of --reps); cuDNN through PyTorch (CUDA events, median of 50 queued runs, cudnn.benchmark) in fp32 with TF32
off, and with TF32 on as well under --precision high; under --precision float16, float16 data
in NHWC against cuDNN fp16 channels-last. Time per FLOP is GPU seconds / (2 *
multiply-adds).

Writes cliffs.json and one cliffs_<sweep>.png per sweep (when matplotlib is installed) into
--out (default benches/results/cliffs/; cliffs_small* with --small), and prints per sweep and library the min and max time per
FLOP and the worst ratio of a point over its better neighbour.

GPU machine (PyTorch with CUDA installed); 80 distinct points, an estimated 6 minutes on an
H100 at about 4.3 s per point (3.3 s of tuning, benches/results/HISTORY.md, plus timing both libraries):
    CONVTUNE_COMMIT=$(git rev-parse --short HEAD) python benches/cliffs.py --step 2
Every integer point (144 distinct points, about 10 minutes):  python benches/cliffs.py
CPU only (lavapipe; no cuDNN), small shapes:  python benches/cliffs.py --small --budget 0.5
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional

import convtune
from convtune import _shapes, _sweep
from convtune._shapes import Shape
from convtune._tuning import ListProgress

HERE = os.path.dirname(os.path.abspath(__file__))

# (name, parameter, base overrides, values); the values' step of the +-8 sweeps is --step.
FULL_BASE = "8x64x56x56 k64 3x3 s1 p1"
SMALL_BASE = "1x8x12x12 k8 3x3 s1 p1"


def sweeps(small: bool, step: int) -> List[Dict[str, Any]]:
    """The sweep list: the issue's grid, or a small one a CPU driver gets through."""
    out = []
    if small:
        centers, spread, hw_centers = (8, 16), 2, (12,)
        pads, batches = range(0, 3), range(1, 4)
    else:
        centers, spread, hw_centers = (64, 128, 256), 8, (56, 14)
        pads, batches = range(0, 5), range(8, 41, 4)
    around = lambda c: list(range(c - spread, c + spread + 1, step))  # noqa: E731
    for param in ("C", "K"):
        for c in centers:
            out.append({"name": f"{param}{c}", "param": param, "center": {"CK": c}, "values": around(c)})
    for c in hw_centers:
        out.append({"name": f"HW{c}", "param": "HW", "center": {"HW": c}, "values": around(c)})
    out.append({"name": "pad", "param": "pad", "center": {}, "values": list(pads)})
    out.append({"name": "N", "param": "N", "center": {}, "values": list(batches)})
    return out


def base_for(base: Shape, center: Dict[str, int]) -> Shape:
    for param, value in center.items():
        base = _sweep.at(base, param, value)
    return base


def cudnn_timers(precision: str) -> Dict[str, _sweep.Timer]:
    """cuDNN timers by name, or none (with a note) where PyTorch or CUDA is missing."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("cuDNN: PyTorch is not installed; timing convtune only", file=sys.stderr)
        return {}
    if not torch.cuda.is_available():
        print("cuDNN: no CUDA device; timing convtune only", file=sys.stderr)
        return {}
    sys.path.insert(0, HERE)
    from vs_cudnn import cuda_ms  # noqa: E402

    torch.backends.cudnn.benchmark = True

    def timer(tf32: bool, half: bool = False) -> _sweep.Timer:
        def run(shape: Shape) -> Optional[float]:
            torch.backends.cudnn.allow_tf32 = tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32
            try:
                x = torch.randn(shape.x, device="cuda")
                w = torch.randn(shape.w, device="cuda")
                if half:  # fp16 runs channels-last, cuDNN's fast layout for it
                    x = x.half().to(memory_format=torch.channels_last)
                    w = w.half().to(memory_format=torch.channels_last)
                kw = dict(stride=shape.stride, padding=shape.padding, dilation=shape.dilation, groups=shape.groups)
                return cuda_ms(lambda: F.conv2d(x, w, **kw)) / 1e3
            except RuntimeError as e:  # an unsupported shape or out of memory: no point
                print(f"cuDNN: {shape.label()}: {e}", file=sys.stderr)
                return None
            finally:
                torch.backends.cudnn.allow_tf32 = False
                torch.backends.cuda.matmul.allow_tf32 = False

        return run

    if precision == "float16":
        return {"cudnn_fp16": timer(False, half=True)}
    timers = {"cudnn_fp32": timer(False)}
    if precision == "high":
        timers["cudnn_tf32"] = timer(True)
    return timers


def environment(precision: str, budget: Optional[float], families: Optional[str]) -> Dict[str, Any]:
    info = convtune.adapter_info()
    env: Dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "adapter": info["name"],
        "driver": f"{info['driver']} {info['driver_info']}".strip(),
        "convtune": convtune.__version__,
        "commit": os.environ.get("CONVTUNE_COMMIT"),
        "precision": precision,
        "budget_s": budget,
        "families": families,
    }
    try:
        import torch

        env["torch"] = torch.__version__
        if torch.cuda.is_available():
            env["cuda_device"] = torch.cuda.get_device_name()
            env["cudnn"] = torch.backends.cudnn.version()
    except ImportError:
        pass
    return env


def plot(sweep: Dict[str, Any], path: str, precision: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4))
    labels = {"convtune": f"convtune ({precision})", "cudnn_fp32": "cuDNN fp32", "cudnn_tf32": "cuDNN TF32",
              "cudnn_fp16": "cuDNN fp16 (channels-last)"}
    for lib, label in labels.items():
        xs = [p["value"] for p in sweep["points"] if p.get(lib)]
        ys = [p[lib]["s_per_flop"] * 1e12 for p in sweep["points"] if p.get(lib)]
        if xs:
            ax.plot(xs, ys, marker="o", ms=3, label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(sweep["param"])
    ax.set_ylabel("ps per FLOP (lower is better)")
    ax.set_title(f"{sweep['name']}: {sweep['param']} swept around {sweep['base']}", fontsize=9)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def replot(json_path: str) -> int:
    """PNGs for a cliffs.json measured elsewhere (the GPU machine may lack matplotlib)."""
    with open(json_path) as f:
        result = json.load(f)
    stem = os.path.splitext(json_path)[0]
    precision = result["environment"].get("precision", "highest")
    for entry in result["sweeps"]:
        print(plot(entry, f"{stem}_{entry['name']}.png", precision))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--precision", choices=("highest", "high", "float16"), default="highest",
                   help="float16: float16 data, NHWC, against cuDNN fp16 channels-last")
    p.add_argument("--families", metavar="LIST", help="set CONVTUNE_FAMILIES, e.g. direct,gemm")
    p.add_argument("--budget", type=float, default=None, help="tuning seconds per point (default: convtune's, 1)")
    p.add_argument("--reps", type=int, default=20, help="timed runs of each tuned winner")
    p.add_argument("--step", type=int, default=1, help="step of the +-8 sweeps of C, K and H=W")
    p.add_argument("--only", metavar="NAMES", help="comma-separated sweep names to run (e.g. C64,HW14,pad)")
    p.add_argument("--small", action="store_true", help="small shapes, for a CPU Vulkan driver")
    p.add_argument("--out", default=os.path.join(HERE, "results", "cliffs"), help="output directory")
    p.add_argument("--replot", metavar="JSON", help="measure nothing: draw the plots of an earlier run's "
                   "cliffs.json (PNGs beside it, named after it)")
    args = p.parse_args(argv)
    if args.replot:
        return replot(args.replot)
    if args.step < 1 or args.reps < 2:
        p.error("--step must be >= 1 and --reps >= 2")
    if args.families is not None:
        os.environ["CONVTUNE_FAMILIES"] = args.families
    try:
        convtune._convtune.families()
    except ValueError as e:
        p.error(str(e))

    prefix = "cliffs_small" if args.small else "cliffs"
    todo = sweeps(args.small, args.step)
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in {s["name"] for s in todo}]
        if unknown:
            p.error(f"--only: unknown sweep(s) {', '.join(unknown)}; known: {', '.join(s['name'] for s in todo)}")
        todo = [s for s in todo if s["name"] in wanted]
    base = _shapes.parse_spec(SMALL_BASE if args.small else FULL_BASE)
    if args.precision == "float16":
        base = dataclasses.replace(base, dtype="float16", layout="NHWC")

    try:
        import matplotlib  # noqa: F401
        can_plot = True
    except ImportError:
        can_plot = False
        print("matplotlib is not installed: writing JSON only, no plots", file=sys.stderr)

    # float16 data sets its own precision.
    mode = None if args.precision == "float16" else args.precision
    tuned = _sweep.Tuned(budget=args.budget, precision=mode, reps=args.reps, force=True)
    others = cudnn_timers(args.precision)
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, f"{prefix}.json")
    result = {"environment": environment(args.precision, args.budget, args.families), "sweeps": []}
    total = sum(len(s["values"]) for s in todo)
    print(f"{result['environment']['adapter']}: {len(todo)} sweeps, {total} points, precision {args.precision}",
          file=sys.stderr)
    start = time.perf_counter()
    libs = ["convtune"] + list(others)
    for s in todo:
        sweep_base = base_for(base, s["center"])
        print(f"\n{s['name']}: {s['param']} = {s['values'][0]}..{s['values'][-1]} around {sweep_base.label()}",
              flush=True)

        progress = ListProgress(len(s["values"]))

        def show(pt: Dict[str, Any], param: str = s["param"], progress: ListProgress = progress) -> None:
            # As each point is done: a long run shows where it is even without a terminal.
            cells = [f"{param}={pt['value']:<4}", f"convtune {_sweep.ps(pt['convtune']['s_per_flop']):>8} ps/FLOP "
                     f"{pt['convtune']['variant']:28s}"]
            cells += [f"{lib} {_sweep.ps(pt[lib]['s_per_flop']) if pt.get(lib) else '-':>8}" for lib in others]
            progress.write("  " + "  ".join(cells))

        try:
            pts = _sweep.run(sweep_base, s["param"], s["values"], tuned, others, on_point=show, progress=progress)
        finally:
            progress.close()
        entry = {"name": s["name"], "param": s["param"], "base": sweep_base.label(), "points": pts,
                 "summary": {lib: _sweep.summarize(pts, lib) for lib in libs}}
        result["sweeps"].append(entry)
        for lib in libs:
            print("  " + _sweep.summary_line(s["param"], lib, entry["summary"][lib]))
        if can_plot:
            png = os.path.join(args.out, f"{prefix}_{s['name']}.png")
            print(f"  plot: {plot(entry, png, args.precision)}")
        # Written after every sweep, so an interrupted run keeps what it measured.
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
    print(f"\n{time.perf_counter() - start:.0f} s; results in {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
