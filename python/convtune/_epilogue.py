"""The fused epilogue's arguments: ``y = act(alpha1 * conv(x, w) + alpha2 * z + bias)``.

Checked here so a bad value is a TypeError/ValueError naming the argument before anything
runs; the native layer takes the normalised tuple
(alpha1, alpha2, residual, activation, negative_slope, clamp_min, clamp_max).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import numpy as np

ACTIVATIONS = ("relu", "leaky_relu", "silu", "gelu", "clamp")

Normalised = Tuple[float, float, bool, Optional[str], float, float, float]


_F32_TINY = float(np.finfo(np.float32).tiny)
_F32_MAX = float(np.finfo(np.float32).max)


def _real(value: Any, name: str) -> float:
    if type(value) is float and _F32_TINY <= abs(value) <= _F32_MAX:
        return value  # the common case (the defaults): a plain, finite, in-range float
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    if v != 0.0 and not (_F32_TINY <= abs(v) <= _F32_MAX):
        raise ValueError(f"{name} = {v} is outside float32's normal range")
    return v


def normalise(residual: bool, alpha1: Any = 1.0, alpha2: Any = 1.0, activation: Any = None,
              negative_slope: Any = 0.01, clamp: Any = None) -> Optional[Normalised]:
    """The native tuple, or ``None`` when the epilogue is the plain ``conv + bias``."""
    a1 = _real(alpha1, "alpha1")
    a2 = _real(alpha2, "alpha2")
    if not residual and a2 != 1.0:
        raise ValueError("alpha2 scales the residual z, but no z was given")
    if activation is not None and not isinstance(activation, str):
        raise TypeError(f"activation must be None or a str, got {type(activation).__name__}")
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(f"activation must be None or one of {', '.join(map(repr, ACTIVATIONS))}, got {activation!r}")
    slope = _real(negative_slope, "negative_slope")
    lo = hi = 0.0
    if activation == "clamp":
        if clamp is None:
            raise ValueError("activation='clamp' needs clamp=(min, max)")
        if isinstance(clamp, (str, bytes)) or not hasattr(clamp, "__len__") or len(clamp) != 2:
            raise TypeError(f"clamp must be a (min, max) pair, got {clamp!r}")
        lo, hi = _real(clamp[0], "clamp min"), _real(clamp[1], "clamp max")
        if lo > hi:
            raise ValueError(f"clamp min must be <= max, got ({lo}, {hi})")
    elif clamp is not None:
        raise ValueError(f"clamp= is only used with activation='clamp', got activation={activation!r}")
    if a1 == 1.0 and not residual and activation is None:
        return None
    return (a1, a2, bool(residual), activation, slope, lo, hi)


def residual_flag(z: Any) -> bool:
    """Introspection functions take ``z`` as whether calls have a residual: ``None`` or a
    bool, or the array itself."""
    if z is None or isinstance(z, (bool, np.bool_)):
        return bool(z)
    if hasattr(z, "shape"):
        return True
    raise TypeError(f"z must be None, a bool or the residual array, got {type(z).__name__}")
