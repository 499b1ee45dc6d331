"""A variant timed by name the way the bench scripts report it: `convtune.time_variant`'s
GPU timestamps, the median in milliseconds."""

from __future__ import annotations

import statistics
from typing import Optional, Tuple

import convtune


def median_ms(x, w, stride=1, padding=0, dilation=1, *, variant: str, reps: int = 30, warmup: int = 5,
              **kw) -> float:
    """Median GPU milliseconds of ``variant`` on the problem (``conv2d``'s shape arguments)."""
    _, times = convtune.time_variant(x, w, stride, padding, dilation, variant=variant, reps=reps,
                                     warmup=warmup, **kw)
    return statistics.median(times) * 1e3


def median_ms_or_why(x, w, stride=1, padding=0, dilation=1, *, variant: str, reps: int = 30,
                     warmup: int = 5, **kw) -> Tuple[Optional[float], Optional[str]]:
    """``median_ms``, or ``None`` and the first line of the reason where the variant cannot run
    the problem here (a tile too large for the shape or the adapter, memory)."""
    try:
        return median_ms(x, w, stride, padding, dilation, variant=variant, reps=reps, warmup=warmup, **kw), None
    except (ValueError, convtune.OutOfMemoryError) as e:
        return None, str(e).splitlines()[0][:100]
