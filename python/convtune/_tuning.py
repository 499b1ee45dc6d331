"""Tuning reports and the tuning progress display (the tuner itself is in Rust)."""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, TextIO


@dataclass(frozen=True)
class TuneReport:
    """What tuning one shape found.

    ``candidates`` holds one dict per candidate, in the order they were tried:
    ``{name, knobs, status, median_ms, samples, detail}``; ``status`` is one of ``ok``,
    ``pruned``, ``wrong``, ``compile error``, ``out of memory``, ``error`` or
    ``skipped (budget)``; ``samples`` are GPU milliseconds.
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
            f"tuning {self.tuning_s:.2f} s, from {self.source}, precision {self.precision}",
        ]
        for c in self.candidates:
            if c["status"] == "skipped (budget)":
                continue
            detail = f"  ({c['detail']})" if c.get("detail") else ""
            lines.append(f"  {c['name']:32s} {c['status']:14s} {ms(c['median_ms']):>12s}{detail}")
        skipped = sum(c["status"] == "skipped (budget)" for c in self.candidates)
        if skipped:
            lines.append(f"  ... {skipped} more skipped (budget)")
        return "\n".join(lines)


@dataclass(frozen=True)
class Explanation:
    """What conv2d runs for a shape, and why.

    ``source`` is ``forced`` (the ``variant=`` argument), ``default`` (the untuned rule),
    ``cache`` (a stored tuning result) or ``tuned`` (tuned by this call). ``family`` is the
    variant's kernel family, ``precision`` the mode it was chosen for, and ``tensor_cores``
    is ``"available"`` or says why the tensor-core family cannot run on this adapter.
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
        )

    def __str__(self) -> str:
        knobs = ", ".join(f"{k}={v}" for k, v in self.knobs.items())
        head = (
            f"{self.shape} on {self.adapter}: {self.variant} ({knobs}); from {self.source}, "
            f"CONVTUNE_TUNE={self.mode}, precision {self.precision}; tensor cores: {self.tensor_cores}"
        )
        return head if self.report is None else head + "\n" + str(self.report)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Progress:
    """A tuning progress display for the Rust tuner to call: ``(done, total, candidate, shape)``.

    Uses tqdm when it is installed, else rewrites one stderr line. Shows nothing when stderr
    is not a terminal or ``CONVTUNE_PROGRESS=0``; it is created cheaply for every call that
    might tune and only draws once tuning starts.
    """

    def __init__(self, stream: Optional[TextIO] = None, force: bool = False) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = force or (
            os.environ.get("CONVTUNE_PROGRESS", "1") != "0" and _is_terminal(self._stream)
        )
        self._bar: Any = None
        self._plain_width = 0

    def __call__(self, done: int, total: int, candidate: str, shape: str) -> None:
        if not self._enabled:
            return
        if self._bar is None:
            self._bar = self._open(total, shape)
        if self._bar is False:
            self._plain(done, total, candidate, shape)
        else:
            self._bar.n = done
            self._bar.set_postfix_str(candidate, refresh=False)
            self._bar.refresh()
        if done >= total:
            self.close()

    def _open(self, total: int, shape: str) -> Any:
        try:
            from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]
        except ImportError:
            return False
        return tqdm(total=total, desc=f"tuning {shape}", file=self._stream, leave=False, unit="variant")

    def _plain(self, done: int, total: int, candidate: str, shape: str) -> None:
        line = f"convtune: tuning {shape} [{done}/{total}] {candidate}"
        pad = " " * max(0, self._plain_width - len(line))
        self._plain_width = len(line)
        self._stream.write("\r" + line + pad)
        self._stream.flush()

    def close(self) -> None:
        if self._bar is False:
            self._stream.write("\r" + " " * self._plain_width + "\r")
            self._stream.flush()
        elif self._bar is not None:
            self._bar.close()
        self._bar = None
        self._plain_width = 0
