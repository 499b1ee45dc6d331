"""Parameter sweeps around a base shape, for finding performance cliffs: a problem one channel
larger running much slower per FLOP than its neighbours. Shared by ``python -m convtune bench
--sweep`` and ``benches/cliffs.py``.

A sweep varies one parameter (``PARAMS``) over a range of values with everything else taken
from the base shape. Each point is tuned (``convtune.tune``) and its winner timed
(``convtune.time_variant``, GPU timestamps); other libraries can be timed beside it by passing
functions of the shape.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import convtune

from ._shapes import Shape, ShapeError
from ._tuning import ListProgress

#: Sweepable parameters (case-insensitive on input) and what each sets.
PARAMS = {
    "C": "input channels",
    "K": "output channels",
    "CK": "input and output channels together",
    "HW": "input height and width together",
    "pad": "padding on every side",
    "N": "batch size",
}
SWEEP_SYNTAX = f"PARAM=START:STOP[:STEP] with PARAM one of {', '.join(PARAMS)} (STOP included)"
#: More points than this is almost certainly a typo, and hours of tuning.
MAX_POINTS = 1000

# Per point: the base N=8, 3x3, stride 1, padding 1 of the cliff sweeps.
DEFAULT_BASE = "8x64x56x56 k64 3x3 s1 p1"


def parse_sweep(text: str) -> Tuple[str, List[int]]:
    """``"C=56:72"`` -> ``("C", [56, ..., 72])``; ValueError naming the problem otherwise."""
    if not isinstance(text, str):
        raise TypeError(f"a sweep must be a str, got {type(text).__name__}")
    m = re.fullmatch(r"\s*([A-Za-z]+)\s*=\s*(-?\d+):(-?\d+)(?::(-?\d+))?\s*", text)
    if not m:
        raise ValueError(f"sweep {text!r} is not {SWEEP_SYNTAX}")
    names = {p.lower(): p for p in PARAMS}
    param = names.get(m.group(1).lower())
    if param is None:
        raise ValueError(f"sweep {text!r}: unknown parameter {m.group(1)!r}; accepted: {', '.join(PARAMS)}")
    start, stop = int(m.group(2)), int(m.group(3))
    step = int(m.group(4)) if m.group(4) else 1
    if step < 1:
        raise ValueError(f"sweep {text!r}: STEP must be >= 1, got {step}")
    if stop < start:
        raise ValueError(f"sweep {text!r}: STOP ({stop}) is below START ({start})")
    least = 0 if param == "pad" else 1
    if start < least:
        raise ValueError(f"sweep {text!r}: {param} must be >= {least}, got START={start}")
    values = list(range(start, stop + 1, step))
    if len(values) > MAX_POINTS:
        raise ValueError(f"sweep {text!r} has {len(values)} points; at most {MAX_POINTS}")
    return param, values


def at(base: Shape, param: str, value: int) -> Shape:
    """The base shape with ``param`` set to ``value``."""
    n, c, h, w = base.x
    if param == "C":
        return base.with_channels(c=value)
    if param == "K":
        return base.with_channels(k=value)
    if param == "CK":
        return base.with_channels(c=value, k=value)
    if param == "HW":
        return replace(base, x=(n, c, value, value))
    if param == "pad":
        return replace(base, padding=(value, value))
    if param == "N":
        return replace(base, x=(value, c, h, w))
    raise ValueError(f"unknown sweep parameter {param!r}; accepted: {', '.join(PARAMS)}")


def points(base: Shape, param: str, values: Sequence[int]) -> List[Shape]:
    """The shapes of a sweep, each checked by convtune itself (ValueError naming the point)
    before any is tuned, so a bad point costs nothing."""
    out = []
    for v in values:
        try:
            shape = at(base, param, v)
            convtune.default_variant(*shape.args(), **shape.kwargs())
        except (ShapeError, ValueError) as e:
            raise ValueError(f"sweep point {param}={v}: {e}") from None
        out.append(shape)
    return out


class Tuned:
    """Tunes a shape and times its winner; remembers shapes already measured in this run, so
    points shared by several sweeps are tuned once."""

    def __init__(self, budget: Optional[float] = None, precision: Optional[str] = None,
                 reps: int = 20, force: bool = False) -> None:
        self.budget, self.precision, self.reps, self.force = budget, precision, reps, force
        self._seen: Dict[Shape, Dict[str, Any]] = {}

    def __call__(self, shape: Shape, progress: Optional[ListProgress] = None) -> Dict[str, Any]:
        if shape in self._seen:
            return self._seen[shape]
        report = convtune._tune_with(
            progress, shape.args(), shape.kwargs(), budget=self.budget, force=self.force,
            precision=self.precision,
        )
        _, times = convtune.time_variant(
            *shape.args(), **shape.kwargs(), variant=report.winner, reps=self.reps,
            precision=self.precision,
        )
        seconds = statistics.median(times)
        out = {
            "seconds": seconds,
            "variant": report.winner,
            "source": report.source,
            "tuning_s": report.tuning_s,
            "cv": statistics.pstdev(times) / statistics.mean(times) if len(times) > 1 else 0.0,
        }
        self._seen[shape] = out
        return out


#: A timer for another library: GPU seconds of one run of the shape, or None where it cannot.
Timer = Callable[[Shape], Optional[float]]


def run(
    base: Shape,
    param: str,
    values: Sequence[int],
    tuned: Tuned,
    others: Optional[Dict[str, Timer]] = None,
    on_point: Optional[Callable[[Dict[str, Any]], None]] = None,
    progress: Optional[ListProgress] = None,
) -> List[Dict[str, Any]]:
    """Measures every point of a sweep: one dict per point with the value, the shape, its
    FLOPs, and per library (``convtune`` and each of ``others``) the seconds and the seconds
    per FLOP (``None`` where a library could not run it). ``on_point`` sees each point as it
    is done; ``progress`` gets one step per point."""
    shapes = points(base, param, values)
    result = []
    for i, (v, shape) in enumerate(zip(values, shapes)):
        if progress is not None:
            progress.start(i, f"{param}={v}")
        flops = shape.flops()
        ct = dict(tuned(shape, progress))
        ct["s_per_flop"] = ct["seconds"] / flops
        point: Dict[str, Any] = {"value": v, "shape": shape.label(), "flops": flops, "convtune": ct}
        for name, timer in (others or {}).items():
            s = timer(shape)
            point[name] = None if s is None else {"seconds": s, "s_per_flop": s / flops}
        if progress is not None:
            progress.finish()
        result.append(point)
        if on_point is not None:
            on_point(point)
    return result


def summarize(pts: Sequence[Dict[str, Any]], lib: str) -> Optional[Dict[str, Any]]:
    """For one library over a sweep: the min and max time per FLOP and where, their ratio,
    and the worst cliff: the largest ratio of a point's time per FLOP over that of its better
    (faster per FLOP) neighbour. ``None`` when the library timed no point."""
    vals = [(p["value"], p[lib]["s_per_flop"]) for p in pts if p.get(lib)]
    if not vals:
        return None
    lo = min(vals, key=lambda t: t[1])
    hi = max(vals, key=lambda t: t[1])
    worst: Optional[Tuple[float, Any]] = None
    for i, (v, t) in enumerate(vals):
        near = [vals[j][1] for j in (i - 1, i + 1) if 0 <= j < len(vals)]
        if near:
            ratio = t / min(near)
            if worst is None or ratio > worst[0]:
                worst = (ratio, v)
    return {
        "min_s_per_flop": lo[1], "min_at": lo[0],
        "max_s_per_flop": hi[1], "max_at": hi[0],
        "max_over_min": hi[1] / lo[1],
        "worst_neighbour_ratio": None if worst is None else worst[0],
        "worst_neighbour_at": None if worst is None else worst[1],
    }


def ps(s_per_flop: float) -> str:
    """Seconds per FLOP in picoseconds, the unit the tables print (a GPU does tens of
    femtoseconds per FLOP, a CPU driver thousands of picoseconds)."""
    v = s_per_flop * 1e12
    return f"{v:.0f}" if v >= 1000 else f"{v:.4g}"


def summary_line(param: str, lib: str, s: Optional[Dict[str, Any]]) -> str:
    if s is None:
        return f"{lib}: no point timed"
    line = (
        f"{lib}: ps/FLOP min {ps(s['min_s_per_flop'])} at {param}={s['min_at']}, "
        f"max {ps(s['max_s_per_flop'])} at {param}={s['max_at']} (max/min {s['max_over_min']:.2f}x)"
    )
    if s["worst_neighbour_ratio"] is not None:
        line += (
            f"; worst vs better neighbour {s['worst_neighbour_ratio']:.2f}x "
            f"at {param}={s['worst_neighbour_at']}"
        )
    return line
