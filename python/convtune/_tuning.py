"""Tuning reports and the tuning progress display (the tuner itself is in Rust)."""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, TextIO


@dataclass(frozen=True)
class TuneReport:
    """What tuning one shape found.

    ``candidates`` holds one dict per candidate, in the order they were tried:
    ``{name, knobs, status, median_ms, samples, detail, compile_ms, runoff_ms, at_s,
    measure_ms}``; ``status`` is
    one of ``ok``, ``pruned``, ``wrong``, ``compile error``, ``out of memory``, ``error`` or
    ``skipped (budget)``; ``samples`` are GPU milliseconds; ``compile_ms`` is the wall time
    of the candidate's compilation on its own thread (``None`` where it was not compiled);
    ``runoff_ms`` is the median of the runoff for the default and the three fastest others (timed
    again in turns after the others; the fastest there wins, and ``tuned_ms`` and
    ``default_ms`` are its times), ``None`` for the rest; ``at_s`` is when its validation
    began (seconds into the run) and ``measure_ms`` the wall time of its validation, warm-up
    and samples (``None`` where it was not run).
    """

    shape: str
    winner: str
    default: str
    default_ms: Optional[float]
    tuned_ms: Optional[float]
    speedup: Optional[float]
    tuning_s: float
    candidates: List[Dict[str, Any]]
    #: "tuned" when this call tuned, "cache" when the result came from the tuning cache.
    source: str = "tuned"
    reference: str = ""
    budget_s: float = 0.0
    tuned_at: str = ""
    adapter: str = ""
    #: The precision mode the winner was validated for ("highest" or "high").
    precision: str = "highest"
    #: The kernel families CONVTUNE_FAMILIES allowed; ``None`` when it allowed all.
    families: Optional[List[str]] = None
    #: Where ``tuning_s`` went, in seconds: ``setup`` (inputs, reference, GPU spin-up),
    #: ``compile``, ``validate``, ``timing``, ``other``; they add up to ``tuning_s``.
    #: ``None`` for reports cached before this was recorded.
    phases: Optional[Dict[str, float]] = None

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "TuneReport":
        names = cls.__dataclass_fields__.keys()
        return cls(**{k: v for k, v in d.items() if k in names})

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def __getitem__(self, key: str) -> Any:
        # Reports used to be plain dicts; keep report["winner"] working.
        if key not in self.__dataclass_fields__:
            raise KeyError(key)
        return getattr(self, key)

    def __str__(self) -> str:
        def ms(v: Optional[float]) -> str:
            return "-" if v is None else f"{v:.3f} ms"

        speedup = "-" if self.speedup is None else f"{self.speedup:.2f}x"
        lines = [
            f"{self.shape}: {self.winner} {ms(self.tuned_ms)} "
            f"({speedup} over default {self.default} {ms(self.default_ms)}); "
            f"tuning {self.tuning_s:.2f} s, from {self.source}, precision {self.precision}"
            + ("" if self.families is None else f", families {','.join(self.families)}"),
        ]
        if self.phases:
            lines.append("  tuning time: " + ", ".join(f"{k} {v:.2f} s" for k, v in self.phases.items()))
        for c in self.candidates:
            if c["status"] == "skipped (budget)":
                continue
            detail = f"  ({c['detail']})" if c.get("detail") else ""
            runoff = f"  runoff {ms(c['runoff_ms'])}" if c.get("runoff_ms") is not None else ""
            lines.append(f"  {c['name']:32s} {c['status']:14s} {ms(c['median_ms']):>12s}{runoff}{detail}")
        skipped = sum(c["status"] == "skipped (budget)" for c in self.candidates)
        if skipped:
            lines.append(f"  ... {skipped} more skipped (budget)")
        return "\n".join(lines)


@dataclass(frozen=True)
class Explanation:
    """What conv2d runs for a shape, and why.

    ``source`` is ``forced`` (the ``variant=`` argument), ``default`` (the untuned rule),
    ``cache`` (a stored tuning result) or ``tuned`` (tuned by this call); while a problem is
    tuned on the background worker, ``default, tuning in the background`` (background mode)
    or, in auto mode on GPUs once the budget is spent, ``best within the budget, ...`` (the
    fastest candidate validated so far) or ``reference kernel, ...`` (also at once, where the
    problem's run is queued behind another problem's); and ``size-generic:
    ...`` for a new size of a layer that has met many (``CONVTUNE_GENERIC_AFTER``). ``family`` is the
    variant's kernel family, ``precision`` the mode it was chosen for, and ``tensor_cores``
    is ``"available"`` or says why the tensor-core family cannot run on this adapter.
    ``families`` are the kernel families ``CONVTUNE_FAMILIES`` allows and ``excluded`` the
    ones it leaves out (empty without a restriction); a variant forced by name runs even
    when its family is excluded. ``dispatches`` are the GPU dispatches one run of the kernel
    makes, in order (``weights``, ``max``, ``prologue``, ``main``, ``finish``), repeated from
    the prologue on for each of ``chunks``; a call also copies its inputs in and its result
    out unless they are Tensors.
    """

    shape: str
    variant: str
    source: str
    mode: str
    knobs: Dict[str, Any]
    wgsl: str
    adapter: str
    report: Optional[TuneReport] = None
    candidates: List[Dict[str, Any]] = field(default_factory=list)
    family: str = ""
    precision: str = "highest"
    tensor_cores: str = ""
    families: List[str] = field(default_factory=list)
    excluded: List[str] = field(default_factory=list)
    dispatches: List[str] = field(default_factory=list)
    chunks: int = 1

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Explanation":
        report = TuneReport.from_dict(d["report"]) if d.get("report") else None
        return cls(
            shape=d["shape"],
            variant=d["variant"],
            source=d["source"],
            mode=d["mode"],
            knobs=d["knobs"],
            wgsl=d["wgsl"],
            adapter=d["adapter"],
            report=report,
            candidates=list(report.candidates) if report else [],
            family=d["family"],
            precision=d["precision"],
            tensor_cores=d["tensor_cores"],
            families=list(d.get("families", [])),
            excluded=list(d.get("excluded", [])),
            dispatches=list(d.get("dispatches", [])),
            chunks=int(d.get("chunks", 1)),
        )

    def __str__(self) -> str:
        knobs = ", ".join(f"{k}={v}" for k, v in self.knobs.items())
        head = (
            f"{self.shape} on {self.adapter}: {self.variant} ({knobs}); from {self.source}, "
            f"CONVTUNE_TUNE={self.mode}, precision {self.precision}; tensor cores: {self.tensor_cores}; "
            f"dispatches: {', '.join(self.dispatches)}" + (f" x {self.chunks} chunks" if self.chunks > 1 else "")
        )
        if self.excluded:
            head += f"; CONVTUNE_FAMILIES excludes {', '.join(self.excluded)}"
            if self.family in self.excluded:
                head += f" (the forced variant's family {self.family} runs because it was asked for by name)"
        return head if self.report is None else head + "\n" + str(self.report)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _tqdm_bar(stream: TextIO, total: int, desc: str, unit: str) -> Any:
    """A tqdm bar on ``stream``, or False where tqdm is not installed."""
    try:
        from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        return False
    return tqdm(total=total, desc=desc, file=stream, leave=False, unit=unit)


class _Display:
    """What both progress displays share: a tqdm bar where tqdm is installed, else one
    rewritten stderr line; nothing when the stream is not a terminal or
    ``CONVTUNE_PROGRESS=0``. The bar opens on the first draw."""

    def __init__(self, stream: Optional[TextIO], force: bool) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._force = force
        self._shown: Optional[bool] = None
        self._bar: Any = None
        self._plain_width = 0
        self._line = ""

    @property
    def _enabled(self) -> bool:
        # Decided at the first report, not at creation: a call that does not tune (most
        # calls) creates one and never asks.
        if self._shown is None:
            self._shown = self._force or (
                os.environ.get("CONVTUNE_PROGRESS", "1") != "0" and _is_terminal(self._stream)
            )
        return self._shown

    def _draw(self, open_bar: Callable[[], Any], position: float, postfix: str, line: str) -> None:
        """Moves the bar to ``position`` with ``postfix``, or rewrites the plain ``line``."""
        if self._bar is None:
            self._bar = open_bar()
        if self._bar is False:
            pad = " " * max(0, self._plain_width - len(line))
            self._plain_width = len(line)
            self._line = "\r" + line
            self._stream.write("\r" + line + pad)
            self._stream.flush()
        else:
            self._bar.n = position
            self._bar.set_postfix_str(postfix, refresh=False)
            self._bar.refresh()

    def _clear_line(self) -> None:
        self._stream.write("\r" + " " * self._plain_width + "\r")
        self._stream.flush()

    def close(self) -> None:
        if self._bar is False:
            self._clear_line()
        elif self._bar is not None:
            self._bar.close()
        self._bar = None
        self._plain_width = 0


class Progress(_Display):
    """A tuning progress display for the Rust tuner to call: ``(done, total, candidate, shape)``.

    Uses tqdm when it is installed, else rewrites one stderr line. Shows nothing when stderr
    is not a terminal or ``CONVTUNE_PROGRESS=0``; it is created cheaply for every call that
    might tune and only draws once tuning starts.
    """

    def __init__(self, stream: Optional[TextIO] = None, force: bool = False) -> None:
        super().__init__(stream, force)

    def __call__(self, done: int, total: int, candidate: str, shape: str) -> None:
        if not self._enabled:
            return
        line = f"convtune: tuning {shape} [{done}/{total}] {candidate}"
        self._draw(lambda: self._open(total, shape), done, candidate, line)
        if done >= total:
            self.close()

    def _open(self, total: int, shape: str) -> Any:
        return _tqdm_bar(self._stream, total, f"tuning {shape}", "variant")


class ListProgress(_Display):
    """One progress display across tuning a list of shapes, for the command line.

    Its position counts shapes: the shapes done plus the share of the current shape's
    candidates tried (a shape the cache already has jumps a whole step). Call ``start`` before
    each shape, pass the object as the tuner's progress callback, ``finish`` after the shape,
    ``close`` at the end. Shows nothing where ``Progress`` would show nothing.
    """

    def __init__(self, count: int, stream: Optional[TextIO] = None, force: bool = False) -> None:
        super().__init__(stream, force)
        self._count = count
        self._index = 0
        self._label = ""

    def write(self, text: str) -> None:
        """Prints a line to stdout without tearing the display (it is drawn again below)."""
        if self._bar is False and self._plain_width:
            self._clear_line()
        elif self._bar:
            self._bar.clear()
        print(text, flush=True)
        if self._bar is False and self._plain_width:
            self._stream.write(self._line)
            self._stream.flush()
        elif self._bar:
            self._bar.refresh()

    def start(self, index: int, label: str) -> None:
        self._index, self._label = index, label
        self._show(float(index), "")

    def __call__(self, done: int, total: int, candidate: str, shape: str) -> None:
        self._show(self._index + (done / total if total else 1.0), candidate)

    def finish(self) -> None:
        self._show(float(self._index + 1), "")

    def _show(self, position: float, candidate: str) -> None:
        if not self._enabled:
            return
        what = f"{self._label} {candidate}".rstrip()
        line = f"convtune: tuning [{position:.1f}/{self._count} shapes] {what}"
        self._draw(self._open, round(position, 2), what, line)

    def _open(self) -> Any:
        return _tqdm_bar(self._stream, self._count, "tuning", "shape")
