"""convtune: fast, predictable conv2d on any Vulkan GPU.

``convtune.conv2d(x, w, stride, padding, dilation, groups, bias)`` follows
``torch.nn.functional.conv2d``: cross-correlation, ``x`` is (N, C, H, W), ``w`` is
(K, C/groups, R, S), the result is a new float32 array of shape (N, K, OH, OW).

Computation is float32. Inputs of other real numeric dtypes (float16, float64, signed and
unsigned integers) are cast to float32; bool, complex, object, string and datetime arrays
raise TypeError.
"""

from __future__ import annotations

import operator
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from . import _convtune
from ._convtune import (
    Tensor,
    ConvtuneError,
    DeviceLostError,
    NoAdapterError,
    OutOfMemoryError,
    ShaderError,
)

__version__: str = _convtune.__version__

__all__ = [
    "conv2d",
    "Tensor",
    "to_device",
    "memory_stats",
    "devices",
    "adapter_info",
    "default_variant",
    "variant_space",
    "variant_knobs",
    "wgsl",
    "time_variant",
    "ConvtuneError",
    "NoAdapterError",
    "OutOfMemoryError",
    "DeviceLostError",
    "ShaderError",
]

IntPair = Union[int, Tuple[int, int], Sequence[int]]
Padding = Union[int, Tuple[int, int], Sequence[int], str]


def _int(value: Any, name: str) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int or a pair of ints, got {type(value).__name__}") from None
    if not -(2**62) <= v <= 2**62:
        raise ValueError(f"{name} value {v} is too large")
    return v


def _pair(value: Any, name: str) -> Tuple[int, int]:
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{name} must be an int or an (h, w) pair, got {len(value)} values")
        return (_int(value[0], name), _int(value[1], name))
    v = _int(value, name)
    return (v, v)


def _padding(value: Any) -> Union[str, Tuple[int, int]]:
    if isinstance(value, str):
        if value not in ("same", "valid"):
            raise ValueError(f"padding must be an int, an (h, w) pair, 'same' or 'valid'; got {value!r}")
        return value
    return _pair(value, "padding")


_CASTABLE = "fiu"  # float, signed int, unsigned int


def _array(value: Any, name: str) -> np.ndarray:
    if value is None:
        raise TypeError(f"{name} must be an array, got None")
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor
        value = value.detach().cpu().numpy()
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} cannot be converted to an array: {e}") from None
    if arr.dtype.kind not in _CASTABLE:
        raise TypeError(
            f"{name} has dtype {arr.dtype}; convtune computes in float32 and accepts float and "
            f"integer arrays (cast to float32)"
        )
    # astype keeps 0-d arrays 0-d (ascontiguousarray would make them 1-d), so the ndim
    # checks below see what the caller passed.
    return arr.astype(np.float32, order="C", copy=False)


def _spec(x_shape, w_shape, stride, padding, dilation, groups, bias_len):
    return (
        tuple(x_shape),
        tuple(w_shape),
        _pair(stride, "stride"),
        _padding(padding),
        _pair(dilation, "dilation"),
        _int(groups, "groups"),
        bias_len,
    )


def conv2d(
    x: Any,
    w: Any,
    stride: IntPair = 1,
    padding: Padding = 0,
    dilation: IntPair = 1,
    groups: int = 1,
    bias: Optional[Any] = None,
    *,
    variant: Optional[str] = None,
) -> np.ndarray:
    """2-D convolution with PyTorch's semantics, computed on the GPU in float32.

    Args:
        x: input, shape (N, C, H, W); anything ``np.asarray`` takes (or a torch CPU tensor),
            or a ``convtune.Tensor`` already on the GPU.
        w: weights, shape (K, C/groups, R, S).
        stride: int or (sh, sw), each >= 1.
        padding: int or (ph, pw) >= 0, or ``"valid"`` (no padding) or ``"same"`` (stride 1
            only; like PyTorch, an even effective kernel pads one more at the bottom/right).
        dilation: int or (dh, dw), each >= 1.
        groups: C and K must both be divisible by it; ``groups == C`` is depthwise.
        bias: optional, shape (K,).
        variant: run this kernel variant (a name from ``variant_space()``) instead of the
            default rule.

    Returns:
        A new float32 array of shape (N, K, OH, OW); a ``convtune.Tensor`` on the GPU when
        ``x`` is one.

    Raises:
        TypeError: an argument of the wrong type or dtype.
        ValueError: a bad shape or parameter; the message names it.
        ConvtuneError: a GPU-side failure (subclasses name the kind).
    """
    on_device = isinstance(x, Tensor)
    xa = x if on_device else _array(x, "x")
    wa = _array(w, "w")
    if not on_device and xa.ndim != 4:
        raise ValueError(f"x must be 4-D (N, C, H, W), got shape {xa.shape}")
    if wa.ndim != 4:
        raise ValueError(f"w must be 4-D (K, C/groups, R, S), got shape {wa.shape}")
    ba = None
    if bias is not None:
        ba = _array(bias, "bias")
        if ba.ndim != 1:
            raise ValueError(f"bias must be 1-D with K={wa.shape[0]} elements, got shape {ba.shape}")
    if variant is not None and not isinstance(variant, str):
        raise TypeError(f"variant must be a str, got {type(variant).__name__}")
    _, _, s, p, d, g, _ = _spec(xa.shape, wa.shape, stride, padding, dilation, groups, None)
    if on_device:
        return _convtune.conv2d_tensor(xa, wa, ba, s, p, d, g, variant)
    return _convtune.conv2d(xa, wa, ba, s, p, d, g, variant)


def to_device(x: Any) -> Tensor:
    """Uploads a 4-D array to the GPU as a float32 ``convtune.Tensor``.

    ``conv2d`` accepts a Tensor as ``x`` and then returns a Tensor, so chained convolutions
    keep their intermediates on the GPU; ``Tensor.numpy()`` copies one back.
    """
    xa = _array(x, "x")
    if xa.ndim != 4:
        raise ValueError(f"x must be 4-D (N, C, H, W), got shape {xa.shape}")
    return _convtune.to_device(xa)


def memory_stats(reset_peak: bool = False) -> dict:
    """GPU memory of convtune's buffer pool.

    Keys: ``live_bytes`` (in use), ``idle_bytes`` (kept for reuse), ``allocations`` (buffers
    created so far), ``peak_device_bytes`` (most device-local bytes in use at once since the
    last reset). ``reset_peak=True`` starts a new peak measurement after reading.
    """
    return _convtune.memory_stats(reset_peak)


def _bias_len(bias: Union[None, int, bool], w_shape: Sequence[int]) -> Optional[int]:
    if bias is None or bias is False:
        return None
    if bias is True:
        return int(w_shape[0])
    return _int(bias, "bias")


def default_variant(
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    stride: IntPair = 1,
    padding: Padding = 0,
    dilation: IntPair = 1,
    groups: int = 1,
    bias: Union[None, bool, int] = None,
) -> str:
    """The variant the untuned rule picks for this shape on the current adapter."""
    return _convtune.default_variant(
        *_spec(x_shape, w_shape, stride, padding, dilation, groups, _bias_len(bias, w_shape))
    )


def wgsl(
    variant: str,
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    stride: IntPair = 1,
    padding: Padding = 0,
    dilation: IntPair = 1,
    groups: int = 1,
    bias: Union[None, bool, int] = None,
) -> str:
    """The WGSL source convtune generates for ``variant`` on this shape."""
    return _convtune.wgsl(
        variant, *_spec(x_shape, w_shape, stride, padding, dilation, groups, _bias_len(bias, w_shape))
    )


def time_variant(
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    stride: IntPair = 1,
    padding: Padding = 0,
    dilation: IntPair = 1,
    groups: int = 1,
    bias: Union[None, bool, int] = None,
    *,
    variant: Optional[str] = None,
    reps: int = 10,
    warmup: int = 2,
) -> Tuple[str, list]:
    """GPU seconds of ``reps`` runs of ``variant`` (default: the default rule's) on random data.

    Uses GPU timestamp queries when the adapter has them, else wall clock around a queue sync.
    Returns (variant name, list of seconds).
    """
    return _convtune.time_variant(
        variant,
        *_spec(x_shape, w_shape, stride, padding, dilation, groups, _bias_len(bias, w_shape)),
        reps=_int(reps, "reps"),
        warmup=_int(warmup, "warmup"),
    )


def devices() -> list:
    """Every adapter wgpu can see, best first: dicts with name, backend, type, driver, ids."""
    return _convtune.devices()


def adapter_info() -> dict:
    """The adapter convtune uses, with its limits and features."""
    return _convtune.adapter_info()


def variant_space() -> list:
    """Every variant name the shader generator can emit."""
    return _convtune.variant_space()


def variant_knobs(name: str) -> dict:
    """The knobs a variant is built with, e.g. ``{'family': 'direct', 'wg_x': 64, ...}``."""
    return _convtune.variant_knobs(name)
