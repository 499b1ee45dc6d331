"""The Python half of ``convtune.last_call_timings()``; the native half is recorded in Rust
(src/timing.rs) on the same thread and read only when asked for."""

from __future__ import annotations

import threading
from typing import Dict, List, Optional, Tuple

from . import _convtune

_local = threading.local()


def record(t0: float, t1: float, t2: float, t3: float, t4: float) -> None:
    """Keeps the boundaries of one conv2d call: arguments checked at t1, memory checked at
    t2, float32 copies made at t3, the native call returned at t4."""
    _local.last = (t0, t1, t2, t3, t4)


def last() -> Optional[dict]:
    rec = getattr(_local, "last", None)
    if rec is None:
        return None
    t0, t1, t2, t3, t4 = rec
    phases: List[Tuple[str, float]] = [("args", t1 - t0), ("memory_check", t2 - t1), ("float32", t3 - t2)]
    native, faults = _convtune._last_call_timings()
    phases += native
    out: Dict[str, float] = {}
    for name, dt in phases:
        out[name] = out.get(name, 0.0) + dt
    # What no phase covers: crossing into the native module, argument conversion, the GIL.
    out["other"] = (t4 - t0) - sum(out.values())
    return {"total": t4 - t0, "phases": out, "minor_faults": faults}
