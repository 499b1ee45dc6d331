"""Command line: `python -m convtune {info,run,tune,bench}`.

Shapes on the command line and in `tune --file` files are spec strings, the form reports
print as `shape` (see `convtune._shapes`): `8x64x56x56 k64 3x3 s1 p1`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable, List, NamedTuple, Optional, Tuple

import numpy as np

import convtune
from convtune import _shapes, _sweep
from convtune._shapes import Shape
from convtune._tuning import ListProgress
from convtune.reference import conv2d_reference, max_relative_error


class Case(NamedTuple):
    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    stride: int = 1
    padding: int = 0
    groups: int = 1

    @property
    def x_shape(self):
        return (self.n, self.c, self.h, self.w)

    @property
    def w_shape(self):
        return (self.k, self.c // self.groups, self.r, self.s)

    def label(self) -> str:
        g = f" g{self.groups}" if self.groups != 1 else ""
        return (
            f"{self.n},{self.c},{self.h},{self.w} -> {self.k}, {self.r}x{self.s}, "
            f"s{self.stride}, p{self.padding}{g}"
        )

    def shape(self) -> Shape:
        return Shape(
            x=self.x_shape, w=self.w_shape, stride=(self.stride, self.stride),
            padding=(self.padding, self.padding), groups=self.groups,
        )

    def flops(self) -> float:
        # The suites use integer padding only.
        oh = (self.h + 2 * self.padding - self.r) // self.stride + 1
        ow = (self.w + 2 * self.padding - self.s) // self.stride + 1
        return 2.0 * self.n * self.k * oh * ow * (self.c // self.groups) * self.r * self.s


# Small enough to finish in a minute on a CPU Vulkan driver, varied enough to exercise each
# kernel family: a first layer, 3x3 bodies, a 1x1, a depthwise, a strided 5x5.
DEFAULT_SUITE: List[Case] = [
    Case(1, 3, 225, 225, 32, 3, 3, 1, 0),
    Case(1, 3, 64, 64, 16, 7, 7, 2, 3),
    Case(1, 16, 32, 32, 32, 3, 3, 1, 1),
    Case(2, 32, 16, 16, 64, 1, 1, 1, 0),
    Case(1, 32, 28, 28, 32, 3, 3, 1, 1, 32),
    Case(1, 16, 32, 32, 16, 5, 5, 2, 2),
]

# The public benchmark suite (fp32, NCHW); meant for real GPUs.
PUBLIC_SUITE: List[Case] = [
    Case(32, 3, 224, 224, 64, 7, 7, 2, 3),
    Case(32, 3, 224, 224, 64, 3, 3, 1, 1),
    Case(32, 64, 56, 56, 64, 3, 3, 1, 1),
    Case(32, 128, 56, 56, 128, 3, 3, 2, 1),
    Case(32, 256, 14, 14, 256, 3, 3, 1, 1),
    Case(32, 512, 7, 7, 512, 3, 3, 1, 1),
    Case(32, 256, 56, 56, 64, 1, 1, 1, 0),
    Case(32, 64, 56, 56, 256, 1, 1, 1, 0),
    Case(1, 64, 720, 1280, 64, 3, 3, 1, 1),
    Case(1, 3, 225, 225, 32, 3, 3, 1, 0),
]

SUITES = {"default": DEFAULT_SUITE, "public": PUBLIC_SUITE}


def _table(headers: List[str], rows: List[List[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.rjust(wd) if i else c.ljust(wd) for i, (c, wd) in enumerate(zip(cells, widths)))
    return "\n".join([line(headers), line(["-" * wd for wd in widths])] + [line(r) for r in rows])


def cmd_info(_args: argparse.Namespace) -> int:
    print(f"convtune {convtune.__version__}")
    print("adapters (best first; CONVTUNE_ADAPTER takes an index or a name substring):")
    for d in convtune.devices():
        print(f"  [{d['index']}] {d['name']}  ({d['backend']}, {d['type']}, driver {d['driver']} {d['driver_info']})")
    info = convtune.adapter_info()
    print(f"in use: [{info['index']}] {info['name']}")
    if info.get("loader_note"):
        print(f"note: {info['loader_note']}")
    allowed, excluded = convtune._convtune.families()
    print(f"kernel families: {', '.join(allowed)}"
          + (f" (CONVTUNE_FAMILIES excludes {', '.join(excluded)})" if excluded else ""))
    print("limits:")
    for k, v in info["limits"].items():
        print(f"  {k:40s} {v}")
    print("features:")
    for k, v in info["features"].items():
        print(f"  {k:40s} {'yes' if v else 'no'}")
    return 0


def _timed(shape: Shape, variant: str, reps: int, precision: Optional[str]) -> Tuple[float, float]:
    """Median GPU seconds of ``reps`` runs and their coefficient of variation."""
    _, times = convtune.time_variant(
        *shape.args(), **shape.kwargs(), variant=variant, reps=reps, precision=precision
    )
    mean = statistics.fmean(times)
    cv = statistics.stdev(times) / mean if len(times) > 1 and mean > 0 else 0.0
    return statistics.median(times), cv


def _e2e(shape: Shape, reps: int, precision: Optional[str]) -> float:
    """Median wall seconds of ``reps`` calls of ``convtune.conv2d`` from numpy arrays to a
    numpy result (upload, kernel, read-back and host work: what a caller waits for), after
    one call that warms the pool and the pipeline."""
    x_shape, w_shape, stride, padding, dilation, groups = shape.args()
    dtype = np.float16 if shape.dtype == "float16" else np.float32
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    bias = rng.standard_normal(shape.out_channels()).astype(np.float32) if shape.bias else None
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, bias=bias,
              layout=shape.layout, precision=precision)
    op: Callable[..., Any] = convtune.conv2d
    if shape.output_padding is not None:
        op = convtune.conv_transpose2d
        kw["output_padding"] = shape.output_padding
    if shape.pixel_shuffle != 1:
        kw["pixel_shuffle"] = shape.pixel_shuffle
    op(x, w, **kw)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        op(x, w, **kw)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# A labelled shape: suites keep their own labels, files and sweeps use spec strings.
Item = Tuple[str, Shape]


def _speedup_rows(items: List[Item], reps: int, chosen, precision: Optional[str] = None) -> List[List[str]]:
    """One row per shape: ``chosen(index, shape)`` gives (variant, source, tuning seconds or None)."""
    rows = []
    for i, (label, shape) in enumerate(items):
        variant, source, tuning_s = chosen(i, shape)
        default = convtune.default_variant(*shape.args(), **shape.kwargs(), precision=precision)
        d_med, _ = _timed(shape, default, reps, precision)
        t_med, t_cv = _timed(shape, variant, reps, precision)
        e2e = _e2e(shape, reps, precision)
        rows.append([
            label, variant, source, f"{d_med * 1e3:.3f}", f"{t_med * 1e3:.3f}", f"{e2e * 1e3:.3f}",
            f"{d_med / t_med:.2f}x", f"{shape.flops() / t_med / 1e9:.1f}", f"{t_cv * 100:.1f}%",
            "-" if tuning_s is None else f"{tuning_s:.1f}",
        ])
        print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return rows


_SUITE_SHAPE = "shape (N,C,H,W -> K, RxS, stride, pad)"
_SPEEDUP_HEADERS = ["winner", "from", "default ms", "tuned ms", "e2e ms", "speed-up", "GFLOP/s", "CV", "tuning s"]
_E2E_NOTE = "e2e: numpy in -> numpy out through convtune.conv2d, median of as many calls"



def _print_adapter() -> None:
    info = convtune.adapter_info()
    print(f"adapter: {info['name']} ({info['backend']}, {info['type']})")


def _suite_items(name: str) -> List[Item]:
    return [(c.label(), c.shape()) for c in SUITES[name]]


def _file_items(path: str, precision: Optional[str]) -> List[Item]:
    """The shapes of a file, each checked by convtune itself before anything is tuned, so a
    bad line late in a long file fails at once, naming the file and line."""
    items = []
    for where, shape in _shapes.load(path):
        try:
            convtune.default_variant(*shape.args(), **shape.kwargs(), precision=precision)
        except (TypeError, ValueError) as e:
            raise _shapes.ShapeError(f"{where}: {shape.label()}: {e}") from None
        items.append((shape.label(), shape))
    return items


def tune_all(items: List[Item], budget: Optional[float], force: bool,
             precision: Optional[str]) -> List[convtune.TuneReport]:
    """Tunes every shape under one progress display."""
    progress = ListProgress(len(items))
    reports = []
    try:
        for i, (label, shape) in enumerate(items):
            progress.start(i, label)
            reports.append(convtune._tune_with(
                progress, shape.args(), shape.kwargs(), budget=budget, force=force, precision=precision,
            ))
            progress.finish()
    finally:
        progress.close()
    return reports


def cmd_tune_onnx(args: argparse.Namespace) -> int:
    """Tunes a model's convolutions from its ONNX file and prints one row per problem and mode."""
    modes = None if args.precision is None else args.precision.split(",")
    for m in modes or []:
        if m not in ("highest", "high"):
            raise _shapes.ShapeError(f"--precision: {m!r} is not 'highest' or 'high'")
    _print_adapter()
    t0 = time.perf_counter()
    rows = convtune.tune_onnx(args.onnx, args.batch, modes, float16=args.float16, layout=args.layout,
                              budget=args.budget, force=args.force, export=args.export)
    took = time.perf_counter() - t0
    ms = lambda v: "-" if v is None else f"{v:.3f}"
    table = [[",".join(r["nodes"]), r["shape"], r["mode"], r["winner"], ms(r["tuned_ms"]), ms(r["default_ms"]),
              "-" if not r["tuned_ms"] or not r["default_ms"] else f"{r['tuned_ms'] / r['default_ms']:.2f}",
              f"{r['tuning_s']:.1f}"] for r in rows]
    print(_table(["nodes", "problem", "mode", "winner", "tuned ms", "default ms", "tuned / default", "tuning s"], table))
    problems = len({r["shape"] for r in rows})
    print(f"{args.onnx}: {problems} distinct problems, {len(rows)} tunings in {took:.1f} s; cache: {convtune.cache_path()}"
          + (f"; exported to {args.export}" if args.export else ""))
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    if args.onnx is not None:
        return cmd_tune_onnx(args)
    if args.precision is not None and args.precision not in ("highest", "high"):
        raise _shapes.ShapeError(f"--precision: {args.precision!r} is not 'highest' or 'high' (a list is for --onnx)")
    if args.file is not None:
        items, header = _file_items(args.file, args.precision), "shape"
    else:
        items, header = _suite_items(args.suite or "default"), _SUITE_SHAPE
    _print_adapter()
    reports = tune_all(items, args.budget, args.force, args.precision)

    def chosen(i: int, _shape: Shape):
        return reports[i].winner, reports[i].source, reports[i].tuning_s

    rows = _speedup_rows(items, args.reps, chosen, args.precision)
    print(_table([header] + _SPEEDUP_HEADERS, rows))
    print(f"{len(items)} shapes; ms: median of {args.reps} GPU-timed runs; {_E2E_NOTE}; CV: coefficient "
          f"of variation of the winner's runs; cache: {convtune.cache_path()}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.sweep is not None:
        return cmd_sweep(args)
    _print_adapter()

    def chosen(_i: int, shape: Shape):
        e = convtune.explain(*shape.args(), **shape.kwargs())
        tuning = e.report.tuning_s if e.report is not None and e.source == "tuned" else None
        return e.variant, e.source, tuning

    print(_table([_SUITE_SHAPE] + _SPEEDUP_HEADERS, _speedup_rows(_suite_items(args.suite or "default"), args.reps, chosen)))
    print(f"ms: median of {args.reps} GPU-timed runs; {_E2E_NOTE}; CV: coefficient of variation of the winner's runs; "
          f"from: where the variant came from (CONVTUNE_TUNE={os.environ.get('CONVTUNE_TUNE', 'auto')})")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    param, values = _sweep.parse_sweep(args.sweep)
    base = _shapes.parse_spec(args.base or _sweep.DEFAULT_BASE)
    tuned = _sweep.Tuned(budget=args.budget, precision=args.precision, reps=args.reps, force=args.force)
    _print_adapter()
    print(f"sweep {param} = {values[0]}..{values[-1]} ({len(values)} points) around {base.label()}")
    progress = ListProgress(len(values))
    try:
        pts = _sweep.run(base, param, values, tuned, progress=progress)
    finally:
        progress.close()
    rows = [
        [str(p["value"]), p["shape"], p["convtune"]["variant"], p["convtune"]["source"],
         f"{p['convtune']['seconds'] * 1e3:.3f}", _sweep.ps(p["convtune"]["s_per_flop"]),
         f"{p['flops'] / p['convtune']['seconds'] / 1e9:.1f}", f"{p['convtune']['cv'] * 100:.1f}%"]
        for p in pts
    ]
    print(_table([param, "shape", "winner", "from", "GPU ms", "ps/FLOP", "GFLOP/s", "CV"], rows))
    print(_sweep.summary_line(param, "convtune", _sweep.summarize(pts, "convtune")))
    print(f"GPU ms: median of {args.reps} GPU-timed runs of the tuned winner; ps/FLOP: GPU time per "
          f"floating-point operation (lower is better)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    suite = SUITES[args.suite]
    _print_adapter()
    rng = np.random.default_rng(args.seed)
    rows = []
    worst = 0.0
    for case in suite:
        x = rng.standard_normal(case.x_shape, dtype=np.float32)
        w = rng.standard_normal(case.w_shape, dtype=np.float32)
        t0 = time.perf_counter()
        y = convtune.conv2d(x, w, stride=case.stride, padding=case.padding, groups=case.groups)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        convtune.conv2d(x, w, stride=case.stride, padding=case.padding, groups=case.groups)
        e2e = time.perf_counter() - t0
        chosen = convtune.explain(case.x_shape, case.w_shape, case.stride, case.padding, 1, case.groups)
        name, times = convtune.time_variant(
            case.x_shape, case.w_shape, case.stride, case.padding, 1, case.groups,
            variant=chosen.variant, reps=args.reps,
        )
        gpu = statistics.median(times)
        err = "-"
        if not args.no_check:
            ref = conv2d_reference(x, w, case.stride, case.padding, 1, case.groups)
            e = max_relative_error(y, ref)
            worst = max(worst, e)
            err = f"{e:.1e}"
        rows.append([
            case.label(), name, chosen.source, f"{gpu * 1e3:.3f}", f"{case.flops() / gpu / 1e9:.1f}",
            f"{e2e * 1e3:.2f}", f"{first * 1e3:.1f}", err,
        ])
        print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    print(_table(
        ["shape (N,C,H,W -> K, RxS, stride, pad)", "variant", "from", "GPU ms", "GFLOP/s", "e2e ms",
         "first ms", "rel err"],
        rows,
    ))
    print(f"GPU ms: median of {args.reps} timed runs; e2e: numpy in -> numpy out; first: includes "
          f"tuning (CONVTUNE_TUNE={os.environ.get('CONVTUNE_TUNE', 'auto')}) and shader compile.")
    if not args.no_check and worst > 1e-5:
        print(f"error: max relative error {worst:.2e} exceeds 1e-5", file=sys.stderr)
        return 1
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m convtune", description=convtune.__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="list adapters and the limits/features of the one in use")
    run = sub.add_parser("run", help="run conv2d over a shape suite and print a table")
    run.add_argument("--suite", choices=sorted(SUITES), default="default")
    run.add_argument("--reps", type=int, default=10, help="timed runs per shape")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--no-check", action="store_true", help="skip the float64 reference check")
    precisions = ("highest", "high")
    tune = sub.add_parser(
        "tune", help="tune a shape suite or a file of shapes and print each winner's speed-up over the default",
        description="Tunes every shape under one progress display, then times each winner against the "
                    "default variant. --file takes a JSON list of objects {\"x\": [N,C,H,W], \"w\": "
                    "[K,C/groups,R,S], \"stride\": 1, \"padding\": 1, \"dilation\": 1, \"groups\": 1, "
                    "\"bias\": false, \"pixel_shuffle\": 1} or spec strings, or a text file of one spec string per line "
                    f"({_shapes.SPEC_SYNTAX}; '#' starts a comment).",
    )
    source = tune.add_mutually_exclusive_group()
    source.add_argument("--suite", choices=sorted(SUITES), default=None, help="a built-in suite (default: default)")
    source.add_argument("--file", metavar="PATH", help="shapes to tune: JSON or one shape spec per line")
    source.add_argument("--onnx", metavar="MODEL", help="tune every Conv and ConvTranspose of an ONNX model "
                        "(needs the onnx package: pip install 'convtune[onnx]')")
    tune.add_argument("--batch", type=int, default=None, help="--onnx: the batch size for a symbolic batch dimension")
    tune.add_argument("--float16", action="store_true", help="--onnx: tune the model's problems in float16")
    tune.add_argument("--layout", choices=("NCHW", "NHWC"), default="NCHW", help="--onnx: the layout the calls will use")
    tune.add_argument("--export", metavar="PATH", default=None, help="--onnx: write the tuning cache here (for cache_import)")
    tune.add_argument("--budget", type=float, default=None, help="tuning seconds per shape (default: CONVTUNE_TUNE_BUDGET or 1)")
    tune.add_argument("--force", action="store_true", help="tune again even when the cache has a shape")
    tune.add_argument("--reps", type=int, default=30, help="timed runs per variant for the table")
    tune.add_argument("--precision", default=None, metavar="MODE",
                      help="precision mode: highest or high (--onnx: a comma-separated list); default CONVTUNE_PRECISION or highest")
    tune.add_argument("--families", metavar="LIST", help="set CONVTUNE_FAMILIES for this run, e.g. direct,gemm")
    bench = sub.add_parser(
        "bench", help="time the default and the tuned variant over a shape suite, or sweep one parameter",
        description="Without --sweep: default vs tuned variant over a suite. With --sweep: tune and time "
                    "each point of a one-parameter sweep around --base and print the time per FLOP, "
                    f"its min/max and the worst step against the better neighbour. {_sweep.SWEEP_SYNTAX}; "
                    + "; ".join(f"{k}: {v}" for k, v in _sweep.PARAMS.items()) + ".",
    )
    bench.add_argument("--suite", choices=sorted(SUITES), default=None, help="a built-in suite (default: default)")
    bench.add_argument("--reps", type=int, default=30, help="timed runs per variant")
    bench.add_argument("--sweep", metavar="PARAM=START:STOP[:STEP]", help="sweep one parameter (STOP included)")
    bench.add_argument("--base", metavar="SPEC", default=None,
                       help=f"base shape of --sweep as a spec string (default: '{_sweep.DEFAULT_BASE}')")
    bench.add_argument("--budget", type=float, default=None, help="--sweep: tuning seconds per point (default: CONVTUNE_TUNE_BUDGET or 1)")
    bench.add_argument("--force", action="store_true", help="--sweep: tune again points the cache has")
    bench.add_argument("--precision", choices=precisions, default=None, help="--sweep: precision mode")
    bench.add_argument("--families", metavar="LIST", help="set CONVTUNE_FAMILIES for this run, e.g. direct,gemm")
    args = p.parse_args(argv)
    if getattr(args, "reps", 2) < 2:
        p.error("--reps must be at least 2")
    if args.cmd == "bench":
        if args.sweep is None:
            given = [f for f in ("base", "budget", "precision") if getattr(args, f) is not None]
            if given or args.force:
                p.error(f"--{(given or ['force'])[0]} applies to --sweep only")
        elif args.suite is not None:
            p.error("--suite and --sweep exclude each other")
    if getattr(args, "families", None) is not None:
        os.environ["CONVTUNE_FAMILIES"] = args.families
    try:
        if args.cmd != "info":
            # Checked before anything is tuned or printed: a bad name is reported alone.
            convtune._convtune.families()
        return {"info": cmd_info, "run": cmd_run, "tune": cmd_tune, "bench": cmd_bench}[args.cmd](args)
    except (ValueError, ImportError) as e:
        print(f"convtune: error: {e}", file=sys.stderr)
        return 2
    except convtune.ConvtuneError as e:
        print(f"convtune: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
