"""convtune: fast, predictable conv2d on any Vulkan GPU.

``convtune.conv2d(x, w, stride, padding, dilation, groups, bias)`` follows
``torch.nn.functional.conv2d``: cross-correlation, ``x`` is (N, C, H, W), ``w`` is
(K, C/groups, R, S), the result is a new array of shape (N, K, OH, OW).

Data types: float16 ``x`` and ``w`` (numpy arrays or a float16 ``Tensor``) stay float16 on
the GPU (half the bytes), are multiplied and summed in float32 (on tensor cores where the
adapter has them) and give a float16 result, as PyTorch does; ``z`` must then be float16
too, the bias may be any float. As in PyTorch, float16 mixed with another dtype among x, w
and z is a TypeError. Otherwise computation is float32: inputs of other real numeric dtypes
(float64, signed and unsigned integers) are cast to float32 and the result is float32;
bool, complex, object, string and datetime arrays raise TypeError.

Autotuning: the first call with a new shape times the kernel variants that fit it, checks
each against a reference, and keeps the fastest in an on-disk cache (``cache_path()``).
Environment, read at every call:

- ``CONVTUNE_TUNE``: ``auto`` (default; tune new shapes, then use the cache),
  ``background`` (run the default rule's pick at once and tune new shapes on a worker
  thread: ``wait_tuning``, ``tuning_status``), ``cached`` (use the cache when it has the
  shape, else the default rule; never tune) or ``off`` (the default rule only);
  ``set_tuning`` sets it for the process.
- ``CONVTUNE_TUNE_BUDGET``: seconds of tuning per shape (default 1).
- ``CONVTUNE_CACHE_DIR``: where the cache lives (default: the user cache directory).
- ``CONVTUNE_PRINT_TUNING=1``: print one line per tuned shape to stderr.
- ``CONVTUNE_PROGRESS=0``: no progress bar while tuning (it only shows on a terminal).
- ``CONVTUNE_PRECISION``: the default ``precision`` (``highest`` unless set).
- ``CONVTUNE_TENSOR_CORES=0``: never use the tensor-core (cooperative-matrix) kernels.
- ``CONVTUNE_FAMILIES``: comma-separated kernel families (``direct``, ``gemm``, ``coop``,
  ``wino``)
  the tuner and the default rule may choose from, e.g. ``direct,gemm``; unset means all.
  An unknown name raises ValueError naming the accepted ones. Tuning results are cached
  per allowed set, so a restricted run never gets a winner of an excluded family from the
  cache. A ``variant=`` asked for by name still runs, whatever its family;
  ``explain().excluded`` lists the families left out.

Precision (``precision=`` on ``conv2d``, ``tune``, ``explain``, ``time_variant``), named after
``torch.set_float32_matmul_precision``: ``"highest"`` (default) gives float32-class results
(max relative error 1e-5 against a float64 reference); ``"high"`` allows TF32-class results
(11-bit products accumulated in float32, max relative error 4e-3), which lets the tuner use
tensor cores where the adapter has cooperative matrices. Results are float32 either way.
"""

from __future__ import annotations

import functools
import operator
import os
import time
from typing import Any, List, Optional, Protocol, Sequence, Tuple, Union

import numpy as np

from . import _convtune, _epilogue, _memory, _timings
from ._background import set_tuning, tuning_mode, tuning_status, wait_tuning
from ._convtune import (
    Tensor,
    ConvtuneError,
    ConvtuneWarning,
    DeviceLostError,
    InternalError,
    NoAdapterError,
    OutOfMemoryError,
    ShaderError,
)
from ._tuning import Explanation, Progress, TuneReport

__version__: str = _convtune.__version__

__all__ = [
    "tune_onnx",
    "conv2d",
    "conv_transpose2d",
    "Tensor",
    "to_device",
    "memory_stats",
    "synchronize",
    "last_call_timings",
    "devices",
    "adapter_info",
    "default_variant",
    "variant_space",
    "variant_knobs",
    "wgsl",
    "time_variant",
    "tune",
    "explain",
    "cache_path",
    "cache_export",
    "cache_import",
    "cache_clear",
    "set_tuning",
    "tuning_mode",
    "wait_tuning",
    "tuning_status",
    "TuneReport",
    "Explanation",
    "ConvtuneError",
    "ConvtuneWarning",
    "NoAdapterError",
    "OutOfMemoryError",
    "DeviceLostError",
    "ShaderError",
    "InternalError",
]

IntPair = Union[int, Tuple[int, int], Sequence[int]]
Padding = Union[int, Tuple[int, int], Sequence[int], str]


class HasShape(Protocol):
    """Anything with a ``.shape``: numpy arrays, torch tensors, ``convtune.Tensor``."""

    @property
    def shape(self) -> Sequence[int]: ...


#: What the introspection functions take for ``x_shape`` and ``w_shape``.
ShapeLike = Union[Sequence[int], HasShape]
#: What they take for ``bias``: whether calls have one, its length, or the bias itself.
BiasLike = Union[None, bool, int, HasShape]


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


def _shuffle(value: Any) -> int:
    """``pixel_shuffle`` as the native layer takes it: an int >= 1 (1, or ``None``: none)."""
    if value is None:
        return 1
    if isinstance(value, (bool, np.bool_)):
        raise TypeError("pixel_shuffle must be an int, got bool")
    try:
        r = operator.index(value)
    except TypeError:
        raise TypeError(f"pixel_shuffle must be an int, got {type(value).__name__}") from None
    if not 1 <= r <= 65535:
        raise ValueError(f"pixel_shuffle must be an int >= 1 (at most 65535), got {r}")
    return r


def _padding_mode(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"padding_mode must be a str, got {type(value).__name__}")
    if value not in ("zeros", "reflect", "replicate", "circular"):
        raise ValueError(f"padding_mode must be 'zeros', 'reflect', 'replicate' or 'circular', got {value!r}")
    return value


def _padding(value: Any) -> Union[str, Tuple[int, int]]:
    if isinstance(value, str):
        if value not in ("same", "valid"):
            raise ValueError(f"padding must be an int, an (h, w) pair, 'same' or 'valid'; got {value!r}")
        return value
    return _pair(value, "padding")


_CASTABLE = "fiu"  # float, signed int, unsigned int


def _view(value: Any, name: str) -> np.ndarray:
    """``value`` as an array of a castable dtype, without copying a numpy array or view: its
    shape is validated and its size checked before anything proportional to it is made."""
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
    return arr


_HALF = np.dtype(np.float16)
_SINGLE = np.dtype(np.float32)


def _data_dtype(x: Any, w: Optional[np.ndarray] = None, z: Any = None) -> str:
    """``"float16"`` when x is float16 data (an array or a Tensor), else ``"float32"``; a
    TypeError when float16 is mixed with another dtype among x, w and z (PyTorch's rule)."""
    def is_half(a: Any) -> bool:
        return a.dtype == "float16" if isinstance(a, Tensor) else a.dtype == _HALF

    given = [(n, a) for n, a in (("x", x), ("w", w), ("z", z)) if a is not None]
    half = [is_half(a) for _, a in given]
    if not any(half):
        return "float32"
    if all(half):
        return "float16"
    listing = ", ".join(f"{n} {a.dtype}" for n, a in given)
    raise TypeError(f"float16 data cannot be mixed with other dtypes ({listing}); cast them all to "
                    f"float16 (float16 result) or all to float32")


def _host_data(arr: np.ndarray, dtype: str) -> np.ndarray:
    """The C-contiguous, aligned array the GPU upload takes for ``dtype`` data: float32, or
    float16 viewed as uint16 (its bits); one copy at most."""
    if dtype == "float16":
        return np.require(arr, requirements=["C", "A"]).view(np.uint16)
    return _float32(arr)


def _float32(arr: np.ndarray) -> np.ndarray:
    """The C-contiguous, aligned float32 array the GPU upload takes; one copy at most (none
    for an array that already is one). Callers check the copy's size first (_memory)."""
    # astype keeps 0-d arrays 0-d (ascontiguousarray would make them 1-d).
    # require() also copies misaligned data (e.g. a float view of a byte buffer at an odd
    # offset), which the GPU upload cannot take. astype copies only to change the dtype or
    # order, and its copies are aligned, so the two never both copy.
    if arr.dtype == _SINGLE and arr.flags.c_contiguous and arr.flags.aligned:
        return arr  # the common case, without require()'s own checks
    return np.require(arr.astype(np.float32, order="C", copy=False), requirements=["C", "A"])


_Spec = Tuple[
    Tuple[int, ...], Tuple[int, ...], Tuple[int, int], Tuple[Union[str, Tuple[int, int]], str], Tuple[int, int], int,
    Optional[int], Optional["_epilogue.Normalised"], str, str, Optional[Tuple[int, int]], int,
]

DTYPES = ("float32", "float16")


def _dtype(value: Any) -> str:
    """A data type name from a str or anything numpy reads as a dtype (np.float16, ...)."""
    try:
        name = np.dtype(value).name if not isinstance(value, str) else value
    except TypeError:
        raise TypeError(f"dtype must be one of {DTYPES}, got {type(value).__name__}") from None
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {value!r}")
    return name

LAYOUTS = ("NCHW", "NHWC")


def _layout(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"layout must be \"NCHW\" or \"NHWC\", got {type(value).__name__}")
    if value not in LAYOUTS:
        raise ValueError(f"layout must be \"NCHW\" or \"NHWC\", got {value!r}")
    return value


PRECISIONS = ("highest", "high")


def _precision(value: Any) -> Optional[str]:
    """``None`` (use ``CONVTUNE_PRECISION``) or one of ``PRECISIONS``."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"precision must be one of {PRECISIONS} or None, got {type(value).__name__}")
    if value not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {value!r}")
    return value


_LAYOUTS = {"x_shape": "(N, C, H, W) (or 3 unbatched: (C, H, W))", "w_shape": "(K, C/groups, R, S)"}


def _shape4(value: Any, name: str) -> Tuple[int, int, int, int]:
    """A 4-D shape from a sequence of ints or from anything with a ``.shape`` (an array)."""
    expected = f"{name} must be a sequence of 4 ints {_LAYOUTS.get(name, '')} or an array with .shape"
    if isinstance(value, (str, bytes)) or value is None:
        raise TypeError(f"{expected}, got {type(value).__name__}")
    if not isinstance(value, (tuple, list)) and hasattr(value, "shape"):
        return _array_shape4(value, name)
    try:
        dims = tuple(value)
    except TypeError:
        raise TypeError(f"{expected}, got {type(value).__name__}") from None
    if len(dims) != 4:
        raise ValueError(f"{expected}; got {len(dims)} values: {dims!r}")
    return tuple(_dim(d, name, dims) for d in dims)  # type: ignore[return-value]


def _array_shape4(value: Any, name: str) -> Tuple[int, int, int, int]:
    try:
        dims = tuple(value.shape)
    except TypeError:
        raise TypeError(f"{name}: the .shape of a {type(value).__name__} is not a sequence of ints") from None
    if len(dims) != 4:
        raise ValueError(f"{name} must be 4-D {_LAYOUTS.get(name, '')}; got a {type(value).__name__} "
                         f"of shape {dims!r}")
    return tuple(_dim(d, name, dims) for d in dims)  # type: ignore[return-value]


def _dim(d: Any, name: str, dims: tuple) -> int:
    if isinstance(d, (bool, np.bool_)):
        raise TypeError(f"{name} must hold ints, got a bool in {dims!r}")
    try:
        v = operator.index(d)
    except TypeError:
        raise TypeError(f"{name} must hold ints, got {type(d).__name__} {d!r} in {dims!r}") from None
    if v < 0:
        raise ValueError(f"{name} dimensions must be >= 0, got {dims!r}")
    if v > 2**62:
        raise ValueError(f"{name} dimension {v} is too large")
    return v


def _spec(x_shape: Any, w_shape: Any, stride: Any, padding: Any, dilation: Any, groups: Any,
          bias_len: Optional[int], epilogue: Optional[_epilogue.Normalised] = None,
          layout: str = "NCHW", dtype: str = "float32",
          output_padding: Optional[Tuple[int, int]] = None, pixel_shuffle: int = 1,
          padding_mode: Any = "zeros") -> _Spec:
    """The normalised shape tuple, its padding a (padding, padding mode) pair; an
    ``output_padding`` pair makes it a transposed convolution's (``None``: a plain one);
    ``pixel_shuffle`` (1: none) as ``_shuffle`` returns it."""
    args = (x_shape, w_shape, stride, padding, dilation, groups, bias_len, layout, dtype, output_padding,
            pixel_shuffle, padding_mode)
    shape = _shapes_seen(args) if all(map(_plain, args)) else _normalised_shape(*args)
    return shape[:7] + (epilogue,) + shape[7:]


def _plain(v: Any) -> bool:
    """Whether ``v`` may key the cache of normalised shapes: ints (not bools, which compare
    equal to them but are refused), strs, None, or tuples of ints; anything else is
    normalised afresh."""
    t = type(v)
    return t is int or t is str or v is None or (t is tuple and all(type(e) is int for e in v))


@functools.lru_cache(maxsize=512)
def _shapes_seen(args: tuple) -> tuple:
    # A network calls conv2d with a few shapes over and over: normalising them took a third
    # of a Tensor call's Python time.
    return _normalised_shape(*args)


def _normalised_shape(x_shape: Any, w_shape: Any, stride: Any, padding: Any, dilation: Any, groups: Any,
                      bias_len: Optional[int], layout: str, dtype: str,
                      output_padding: Optional[Tuple[int, int]], pixel_shuffle: int,
                      padding_mode: Any = "zeros") -> tuple:
    return (
        _shape4(x_shape, "x_shape"),
        _shape4(w_shape, "w_shape"),
        _pair(stride, "stride"),
        (_padding(padding), _padding_mode(padding_mode)),
        _pair(dilation, "dilation"),
        _int(groups, "groups"),
        bias_len,
        _layout(layout),
        dtype,
        output_padding,
        pixel_shuffle,
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
    padding_mode: str = "zeros",
    z: Optional[Any] = None,
    alpha1: float = 1.0,
    alpha2: float = 1.0,
    activation: Optional[str] = None,
    negative_slope: float = 0.01,
    clamp: Optional[Tuple[float, float]] = None,
    layout: Optional[str] = None,
    variant: Optional[str] = None,
    precision: Optional[str] = None,
    pixel_shuffle: Optional[int] = None,
) -> np.ndarray:
    """2-D convolution with PyTorch's semantics, computed on the GPU with float32 sums, with an
    optional fused epilogue: ``y = act(alpha1 * conv(x, w) + alpha2 * z + bias)``.

    Args:
        x: input, shape (N, C, H, W), or unbatched (C, H, W) as PyTorch takes it (the result
            then has no batch dimension either, nor must ``z``); anything ``np.asarray`` takes (or a torch CPU tensor),
            or a ``convtune.Tensor`` already on the GPU.
        w: weights, shape (K, C/groups, R, S); an array, or a ``convtune.Tensor`` from
            ``to_device(w)`` (uploaded once: a Tensor ``x``'s calls then bind it as it is,
            where an array is uploaded on every call; a host ``x``'s call reads it back).
        stride: int or (sh, sw), each >= 1.
        padding: int or (ph, pw) >= 0, or ``"valid"`` (no padding) or ``"same"`` (stride 1
            only; like PyTorch, an even effective kernel pads one more at the bottom/right).
        dilation: int or (dh, dw), each >= 1.
        groups: C and K must both be divisible by it; ``groups == C`` is depthwise.
        bias: optional, shape (K,).
        padding_mode: what the padding holds, as ``torch.nn.Conv2d(padding_mode=...)``:
            ``"zeros"`` (the default), ``"reflect"`` (x mirrored about its edge; padding must
            be below x's size along each axis), ``"replicate"`` (the edge repeated) or
            ``"circular"`` (x wrapped around; padding at most x's size). Read in the kernel's
            gather: no padded copy of x. The modes other than zeros run on the FMA families
            (direct, stem, gemm, wino, wgemm), not the tensor-core ones.
        z: optional residual of the output's shape (N, K, OH, OW), a float array or a
            ``convtune.Tensor``; added after scaling by ``alpha2``. Must be finite.
        alpha1: scales the convolution's sum (before bias and z).
        alpha2: scales ``z``; only with ``z``.
        activation: applied last: ``None``, ``"relu"``, ``"leaky_relu"`` (slope
            ``negative_slope`` below zero), ``"silu"``, ``"gelu"`` (the tanh approximation,
            PyTorch's ``approximate="tanh"``) or ``"clamp"`` (to ``clamp=(min, max)``).
            NaN stays NaN through all of them. The epilogue runs inside the kernel's store
            step: no extra pass, no extra copy of y.
        layout: ``"NCHW"`` (PyTorch's; the default for arrays) or ``"NHWC"``: x is then
            (N, H, W, C) and the result (N, OH, OW, K) (z too), read and written in place by
            the kernels, no transpose; w stays (K, C/groups, R, S). A Tensor ``x`` brings its
            own layout (naming another is a ValueError).
        variant: run this kernel variant (a name from ``variant_space()``) instead of the
            tuned or default one.
        precision: ``"highest"`` (float32-class) or ``"high"`` (TF32-class, may use tensor
            cores); default ``CONVTUNE_PRECISION`` or ``"highest"``.
        pixel_shuffle: ``r`` >= 1 (``None`` or 1: none): depth-to-space fused into the
            store, ``torch.nn.functional.pixel_shuffle(y, r)`` without its pass or copy. Conv
            output channel c*r*r + i*r + j at pixel (oh, ow) is stored at channel c, pixel
            (oh*r + i, ow*r + j), after the epilogue: bias is per conv output channel and the
            activation applies per element, ``pixel_shuffle(act(alpha1 * conv + bias + ...))``,
            with ``z`` of the shuffled shape. K must be divisible by r*r. Runs on the FMA
            families (not the tensor-core one); an image that needs more than one storage
            binding is a ValueError.

    Returns:
        A new array of shape (N, K, OH, OW) ((N, OH, OW, K) in NHWC), or with
        ``pixel_shuffle=r`` (N, K/r², OH·r, OW·r) ((N, OH·r, OW·r, K/r²)); float16 for float16
        x and w (then z must be float16 too; float16 mixed with other dtypes is a
        TypeError, as in PyTorch), else float32; a
        ``convtune.Tensor`` on the GPU when ``x`` is one, returned as soon as its kernel is
        queued (``Tensor.numpy()`` and ``convtune.synchronize()`` wait for it).

    Raises:
        TypeError: an argument of the wrong type or dtype.
        ValueError: a bad shape or parameter; the message names it.
        OutOfMemoryError: the call needs more host or GPU memory than there is (checked
            before any copy, so a huge zero-stride view cannot exhaust memory); the message
            names the bytes needed and the limit.
        ConvtuneError: a GPU-side failure (subclasses name the kind).

    Warns:
        ConvtuneWarning: the tuning cache was unreadable, or tuning failed (the default
            variant is used then).
    """
    return _conv(x, w, stride, padding, dilation, groups, bias, z, alpha1, alpha2, activation,
                 negative_slope, clamp, layout, variant, precision, None, _shuffle(pixel_shuffle), padding_mode)


def conv_transpose2d(
    x: Any,
    w: Any,
    stride: IntPair = 1,
    padding: IntPair = 0,
    output_padding: IntPair = 0,
    groups: int = 1,
    dilation: IntPair = 1,
    bias: Optional[Any] = None,
    *,
    z: Optional[Any] = None,
    alpha1: float = 1.0,
    alpha2: float = 1.0,
    activation: Optional[str] = None,
    negative_slope: float = 0.01,
    clamp: Optional[Tuple[float, float]] = None,
    layout: Optional[str] = None,
    variant: Optional[str] = None,
    precision: Optional[str] = None,
    pixel_shuffle: Optional[int] = None,
) -> np.ndarray:
    """2-D transposed convolution with PyTorch's semantics
    (``torch.nn.functional.conv_transpose2d``, the same argument order), computed on the GPU
    with float32 sums and the same fused epilogue as ``conv2d``:
    ``y = act(alpha1 * conv_transpose(x, w) + alpha2 * z + bias)``.

    Computed either by every plain family through its lowered form (the stride phases
    stacked as output channels of one stride-1 convolution whose store scatters them) or by
    the ``tconv`` family's gather; no zero-inserted copy of x is made either way. Tuned and
    cached as its own problem.

    Args:
        x: input, shape (N, C, H, W) ((N, H, W, C) in NHWC), or unbatched without N (an
            array only; the result drops N too), an array or a
            ``convtune.Tensor``.
        w: weights, shape (C, K/groups, R, S) in either layout.
        stride: int or (sh, sw), each >= 1.
        padding: int or (ph, pw) >= 0: rows and columns taken off each side of the full
            output (no ``"same"``/``"valid"``, as in PyTorch).
        output_padding: int or (h, w) >= 0, each smaller than the stride or the dilation
            along its axis: rows and columns added at the bottom and right.
        groups: C must be divisible by it; K = w.shape[1] * groups.
        dilation: int or (dh, dw), each >= 1.
        bias: optional, shape (K,).
        z, alpha1, alpha2, activation, negative_slope, clamp, layout, variant, precision:
            as for ``conv2d`` (``variant`` names a variant of any family; dilated problems
            take ``tconv_...`` ones only).
        pixel_shuffle: ``r`` >= 1 (``None`` or 1: none): ``pixel_shuffle(y, r)`` of the
            result fused into the store, as for ``conv2d`` (K divisible by r²; dilation 1:
            it runs in the lowered form). z then has the shuffled shape.

    Returns:
        An array (or a Tensor for a Tensor ``x``) of shape (N, K, OH, OW) ((N, OH, OW, K) in
        NHWC), with OH = (H - 1) * sh - 2 * ph + dh * (R - 1) + output_padding_h + 1 and OW
        likewise (with ``pixel_shuffle=r``: (N, K/r², OH·r, OW·r)); float16 for float16
        data, else float32.

    Raises:
        TypeError, ValueError, OutOfMemoryError, ConvtuneError: as for ``conv2d``. An image
        of x or of the output larger than one GPU storage binding is a ValueError
        (transposed problems are not cut into bands of rows).
    """
    if isinstance(padding, str):
        raise TypeError(f"padding must be an int or an (h, w) pair for a transposed convolution, got {padding!r}")
    op = _pair(output_padding, "output_padding")
    return _conv(x, w, stride, padding, dilation, groups, bias, z, alpha1, alpha2, activation,
                 negative_slope, clamp, layout, variant, precision, op, _shuffle(pixel_shuffle))


def _conv(x: Any, w: Any, stride: Any, padding: Any, dilation: Any, groups: Any, bias: Any,
          z: Any, alpha1: Any, alpha2: Any, activation: Any, negative_slope: Any, clamp: Any,
          layout: Any, variant: Any, precision: Any,
          output_padding: Optional[Tuple[int, int]], pixel_shuffle: int = 1, padding_mode: Any = "zeros") -> Any:
    """``conv2d``, or ``conv_transpose2d`` with an ``output_padding`` pair."""
    w_dims = "(K, C/groups, R, S)" if output_padding is None else "(C, K/groups, R, S)"
    t0 = time.perf_counter()
    on_device = isinstance(x, Tensor)
    xv = x if on_device else _view(x, "x")
    # Weights on the GPU stay there for a Tensor x; a host x's call reads them back (its pieces
    # upload w with their part of x).
    if isinstance(w, Tensor) and w.layout != "NCHW":
        raise ValueError("w is an NHWC Tensor: weights keep their (K, C/groups, R, S) order in every "
                         "layout; upload them with to_device(w)")
    wt: Optional[Tensor] = w if on_device and isinstance(w, Tensor) else None
    wv: Any = wt if wt is not None else _view(w.numpy() if isinstance(w, Tensor) else w, "w")
    lay = x.layout if on_device and layout is None else _layout("NCHW" if layout is None else layout)
    for name, t in (("x", x), ("z", z)):
        if isinstance(t, Tensor) and t.layout != lay:
            raise ValueError(f"{name} is an {t.layout} Tensor but the call's layout is {lay}")
    # An unbatched x ((C, H, W), or (H, W, C) in NHWC), as PyTorch takes it: a batch of one
    # here, the batch dimension dropped from the result (and expected absent from z); an
    # unbatched Tensor is one already, and its result Tensor is unbatched too.
    unbatched = x.unbatched if on_device else xv.ndim == 3
    if unbatched and not on_device:
        xv = xv[None]
    if not on_device and xv.ndim != 4:
        raise ValueError(f"x must be 4-D ({', '.join(lay)}) or unbatched 3-D ({', '.join(lay[1:])}), "
                         f"got shape {xv.shape}")
    if len(wv.shape) != 4:
        raise ValueError(f"w must be 4-D {w_dims}, got shape {wv.shape}")
    bv = None
    if bias is not None:
        bv = _view(bias, "bias")
        if bv.ndim != 1:
            raise ValueError(f"bias must be 1-D with one element per output channel, got shape {bv.shape}")
    if variant is not None and not isinstance(variant, str):
        raise TypeError(f"variant must be a str, got {type(variant).__name__}")
    epi = _epilogue.normalise(z is not None, alpha1, alpha2, activation, negative_slope, clamp)
    zv, zt = _residual(z, on_device, unbatched)
    dt = _data_dtype(xv, wv, zt if zt is not None else zv)
    spec = _spec(x._dims if on_device else xv.shape, wv.shape, stride, padding, dilation, groups,
                 None if bv is None else int(bv.shape[0]), epi, lay, dt, output_padding, pixel_shuffle, padding_mode)
    copies = ([] if wt is not None else [("w", wv)]) + [("bias", bv), ("z", zv)] + ([] if on_device else [("x", xv)])
    prec = _precision(precision)
    t1 = time.perf_counter()
    _memory.check_conv2d(spec, on_device, copies)
    t2 = time.perf_counter()
    _, _, s, (p, mode), d, g, _, _, _, _, op, ps = spec
    xa: Any = x if on_device else _host_data(xv, dt)
    wa: Any = None if wt is not None else _host_data(wv, dt)
    ba = None if bv is None else _float32(bv)
    za = None if zv is None else _host_data(zv, dt)
    progress = Progress()
    t3 = time.perf_counter()
    y: Any
    try:
        if on_device:
            y = _convtune.conv2d_tensor(xa, wa, ba, s, p, d, g, variant, progress, prec, epi, za, zt, lay, op, ps, wt, mode)
        else:
            y = _convtune.conv2d(xa, wa, ba, s, p, d, g, variant, progress, prec, epi, za, lay, op, ps, mode)
    finally:
        progress.close()
    _timings.record(t0, t1, t2, t3, time.perf_counter())
    return y[0] if unbatched and not on_device else y


def _residual(z: Any, on_device: bool, unbatched: bool = False) -> Tuple[Optional[np.ndarray], Optional[Tensor]]:
    """``z`` as a host array or a device Tensor (a Tensor given with a host ``x`` is read
    back: the pieces of a host call upload their part of z alongside their part of x); with
    an unbatched ``x``, z is unbatched too and gets the batch of one back."""
    if z is None:
        return None, None
    if isinstance(z, Tensor):
        if on_device:
            return None, z
        z = z.numpy()
    zv = _view(z, "z")
    if unbatched:
        if zv.ndim != 3:
            raise ValueError(f"z must be 3-D like the unbatched output (K, OH, OW) (after any pixel_shuffle), "
                             f"got shape {zv.shape}")
        zv = zv[None]
    if zv.ndim != 4:
        raise ValueError(f"z must be 4-D, the output's shape (N, K, OH, OW) (after any pixel_shuffle), got shape {zv.shape}")
    if zv.size and not np.isfinite(zv).all():
        raise ValueError("z contains NaN or Inf; the residual must be finite")
    return zv, None


def to_device(x: Any, layout: str = "NCHW") -> Tensor:
    """Uploads a 4-D array to the GPU as a ``convtune.Tensor`` (float16 data stays float16,
    any other dtype becomes float32), whose axes are
    ``layout``'s (``"NCHW"`` or ``"NHWC"``): ``conv2d`` reads it so and returns its output
    in the same layout. A 3-D array is an unbatched x ((C, H, W), (H, W, C) in NHWC), as
    PyTorch takes it: its Tensor's ``shape`` and ``numpy()``, and the Tensors ``conv2d``
    returns for it, leave the batch axis out.

    ``conv2d`` accepts a Tensor as ``x`` and then returns a Tensor, so chained convolutions
    keep their intermediates on the GPU; ``Tensor.numpy()`` copies one back. Raises
    ValueError when the tensor exceeds one GPU buffer and OutOfMemoryError when its copy
    does not fit in memory, before copying.
    """
    lay = _layout(layout)
    xv = _view(x, "x")
    unbatched = xv.ndim == 3
    if unbatched:
        xv = xv[None]
    if xv.ndim != 4:
        raise ValueError(f"x must be 4-D ({', '.join(lay)}) or unbatched 3-D ({', '.join(lay[1:])}), got shape {xv.shape}")
    dt = _data_dtype(xv)
    _memory.check_upload(xv, dt)
    return _convtune.to_device(_host_data(xv, dt), lay, unbatched)


def last_call_timings() -> Optional[dict]:
    """Where the time of this thread's last ``conv2d`` call went, measured, not estimated.

    Returns ``None`` before the first call, else a dict: ``total`` (seconds from entering
    ``conv2d`` to its return), ``phases`` (name -> seconds, in the order they ran, summing
    to ``total``; ``other`` is the unmeasured remainder) and ``minor_faults`` (page faults
    the whole process took during the native part, ``None`` where unavailable). A call
    with a ``convtune.Tensor`` input returns with its kernel queued: its phases end with
    ``submit`` and ``previous_wait`` (the wait for the Tensor call before it).
    Phase names are listed in docs/timing.md.
    """
    return _timings.last()


def synchronize() -> None:
    """Waits until the GPU has finished every queued call.

    A ``conv2d`` on a ``convtune.Tensor`` returns as soon as its kernel is queued (it waits
    for the call before it instead), so a chain of calls keeps the GPU busy while Python
    prepares the next one. ``Tensor.numpy()`` waits by itself; call this to time a chain or
    to see a failed call's error before going on.
    """
    _convtune.synchronize()


def memory_stats(reset_peak: bool = False) -> dict:
    """GPU memory of convtune's buffer pool, and the compiled kernels it keeps.

    Keys: ``live_bytes`` (in use), ``idle_bytes`` (kept for reuse), ``allocations`` (buffers
    created so far), ``peak_device_bytes`` (most device-local bytes in use at once since the
    last reset); ``kernels_cached``, ``kernel_cache_limit`` (``CONVTUNE_KERNEL_CACHE``),
    ``kernels_per_layer`` (``CONVTUNE_KERNELS_PER_LAYER``), ``kernel_evictions`` and
    ``generic_kernels`` (size-generic modules held, at most 256 and 16 a layer, least
    recently used dropped first: ``CONVTUNE_GENERIC_AFTER``, docs/limits.md).
    ``reset_peak=True`` starts a new peak measurement after reading.
    """
    return _convtune.memory_stats(reset_peak)


def _bias_len(bias: Any, w_shape: Tuple[int, ...]) -> Optional[int]:
    if bias is None or bias is False:
        return None
    if bias is True:
        return int(w_shape[0])
    if hasattr(bias, "shape") and not isinstance(bias, (int, np.integer)):
        dims = tuple(bias.shape)
        if len(dims) != 1:
            raise ValueError(f"bias must be 1-D with K={w_shape[0]} elements, got shape {dims!r}")
        return _dim(dims[0], "bias", dims)
    if isinstance(bias, (bool, np.bool_)) or not isinstance(bias, (int, np.integer)):
        raise TypeError(f"bias must be None, a bool, its length or a 1-D array, got {type(bias).__name__}")
    return _int(bias, "bias")


_PROBLEM_KEYWORDS = ("z", "alpha1", "alpha2", "activation", "negative_slope", "clamp", "layout", "dtype",
                     "transposed", "output_padding", "pixel_shuffle", "padding_mode")


def _call_spec(x_shape, w_shape, stride, padding, dilation, groups, bias, keywords=None):
    """The normalised shape tuple the native functions take, from public-API arguments:
    shapes may be given as tuples or as the arrays themselves; ``keywords`` are the
    introspection call's extra keywords, ``conv2d``'s epilogue arguments (``z`` as a flag or
    the array), ``layout`` and ``dtype``; any other is a TypeError, as Python raises for an unknown
    keyword."""
    e = dict(keywords or {})
    unknown = sorted(set(e) - set(_PROBLEM_KEYWORDS))
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {', '.join(unknown)}; "
                        f"epilogue, layout and dtype keywords are {', '.join(_PROBLEM_KEYWORDS)}")
    layout = _layout(e.pop("layout", "NCHW"))
    # Arrays given as shapes bring their dtype: float16 data is its own problem.
    dtype = e.pop("dtype", None)
    if dtype is None:
        dtype = "float16" if str(getattr(x_shape, "dtype", "")) == "float16" else "float32"
    dtype = _dtype(dtype)
    # A transposed problem (w is (C, K/groups, R, S)) is named by transposed=True, with an
    # optional output_padding.
    transposed = e.pop("transposed", False)
    if not isinstance(transposed, (bool, np.bool_)):
        raise TypeError(f"transposed must be a bool, got {type(transposed).__name__}")
    op = e.pop("output_padding", None)
    if op is not None and not transposed:
        raise ValueError("output_padding needs transposed=True")
    op = _pair(0 if op is None else op, "output_padding") if transposed else None
    # A pixel-shuffled problem is its own (pixel_shuffle=r, 1 or None: none).
    ps = _shuffle(e.pop("pixel_shuffle", None))
    mode = e.pop("padding_mode", "zeros")
    spec = _spec(_batch_of_one(x_shape), w_shape, stride, padding, dilation, groups, None, padding_mode=mode)
    epi = None
    if e:
        epi = _epilogue.normalise(_epilogue.residual_flag(e.pop("z", None)), **e)
    k = spec[1][0] if op is None else spec[1][1] * spec[5]
    return spec[:6] + (_bias_len(bias, (k,)), epi, layout, dtype, op, ps)


def _batch_of_one(x_shape: Any) -> Any:
    """An unbatched x's shape (3 ints, or an array or Tensor of 3 dims) as the batch of one
    it is; any other as given (``_shape4`` checks it)."""
    if isinstance(x_shape, Tensor):
        return x_shape._dims
    dims = getattr(x_shape, "shape", x_shape) if not isinstance(x_shape, (tuple, list)) else x_shape
    try:
        if len(dims) == 3:
            return (1, *dims)
    except TypeError:
        pass
    return x_shape


def default_variant(
    x_shape: ShapeLike,
    w_shape: ShapeLike,
    stride: IntPair = 1,
    padding: Padding = 0,
    dilation: IntPair = 1,
    groups: int = 1,
    bias: BiasLike = None,
    *,
    precision: Optional[str] = None,
    **problem: Any,
) -> str:
    """The variant the untuned rule picks for this shape on the current adapter (keyword
    arguments ``layout``, ``dtype`` and the epilogue's as for ``tune``).

    Within the families ``CONVTUNE_FAMILIES`` allows: where it excludes the rule's family,
    the likeliest winner of the allowed ones serving ``precision``. Raises ValueError when
    the allowed families cannot run the shape here (e.g. ``coop`` alone without tensor cores,
    or ``wino`` alone on a filter other than 3x3 at stride 1).

    ``x_shape`` and ``w_shape`` (here and in ``wgsl``, ``time_variant``, ``tune`` and
    ``explain``) are 4-int sequences or the arrays themselves (anything with ``.shape``:
    numpy arrays, torch tensors, ``convtune.Tensor``); ``bias`` is whether calls have one,
    its length, or the bias array.
    """
    return _convtune.default_variant(
        _call_spec(x_shape, w_shape, stride, padding, dilation, groups, bias, problem),
        precision=_precision(precision),
    )


def wgsl(
    variant: str,
    x_shape: ShapeLike,
    w_shape: ShapeLike,
    stride: IntPair = 1,
    padding: Padding = 0,
    dilation: IntPair = 1,
    groups: int = 1,
    bias: BiasLike = None,
    **epilogue: Any,
) -> str:
    """The WGSL source convtune generates for ``variant`` on this shape (shapes or arrays,
    as for ``default_variant``); keyword arguments ``z``, ``alpha1``, ``alpha2``,
    ``activation``, ``negative_slope``, ``clamp`` add a fused epilogue as for ``conv2d``."""
    return _convtune.wgsl(
        variant, _call_spec(x_shape, w_shape, stride, padding, dilation, groups, bias, epilogue)
    )


def time_variant(
    x_shape: ShapeLike,
    w_shape: ShapeLike,
    stride: IntPair = 1,
    padding: Padding = 0,
    dilation: IntPair = 1,
    groups: int = 1,
    bias: BiasLike = None,
    *,
    variant: Optional[str] = None,
    reps: int = 10,
    warmup: int = 2,
    precision: Optional[str] = None,
    **epilogue: Any,
) -> Tuple[str, list]:
    """GPU seconds of ``reps`` runs of ``variant`` on random data (with the fused epilogue
    given by keywords ``z``, ``alpha1``, ... as for ``wgsl``).

    Without ``variant``, times the variant ``conv2d`` would run (tuned, cached or default, as
    ``CONVTUNE_TUNE`` says).

    Uses GPU timestamp queries when the adapter has them, else wall clock around a queue sync.
    The inputs stay on the device between runs: a kernel that reads w rearranged makes that
    copy in its first run and keeps it, as it does for a weight ``Tensor`` (an array ``w``
    given to ``conv2d`` is rearranged on every call).
    Returns (variant name, list of seconds).
    """
    return _convtune.time_variant(
        variant,
        _call_spec(x_shape, w_shape, stride, padding, dilation, groups, bias, epilogue),
        reps=_int(reps, "reps"),
        warmup=_int(warmup, "warmup"),
        precision=_precision(precision),
    )


def devices() -> list:
    """Every adapter wgpu can see, best first: dicts with name, backend, type, driver, ids."""
    return _convtune.devices()


def adapter_info() -> dict:
    """The adapter convtune uses, with its limits and features, ``device_heap_bytes``: the
    size of its largest device-local memory heap (``None`` where it cannot be read), and
    ``direct_inputs``: whether ``conv2d`` writes numpy inputs straight into device memory the
    host maps (a resizable BAR, or a CPU adapter) instead of through staging buffers and GPU
    copies (``CONVTUNE_DIRECT_UPLOAD=0`` turns it off)."""
    return _convtune.adapter_info()


def variant_space() -> list:
    """Every variant name the shader generator can emit."""
    return _convtune.variant_space()


def variant_knobs(name: str) -> dict:
    """The knobs a variant is built with, e.g. ``{'family': 'direct', 'wg_x': 64, ...}``."""
    return _convtune.variant_knobs(name)


def _budget(budget: Optional[float]) -> Optional[float]:
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, (int, float, np.integer, np.floating)):
        raise TypeError(f"budget must be a number of seconds, got {type(budget).__name__}")
    return float(budget)


def tune(
    x_shape: ShapeLike,
    w_shape: ShapeLike,
    stride: IntPair = 1,
    padding: Padding = 0,
    dilation: IntPair = 1,
    groups: int = 1,
    bias: BiasLike = None,
    *,
    budget: Optional[float] = None,
    force: bool = False,
    precision: Optional[str] = None,
    **epilogue: Any,
) -> TuneReport:
    """Tunes conv2d for one shape and stores the winner in the tuning cache.

    Returns the cached report when the cache already has the shape, unless ``force``.
    Ignores ``CONVTUNE_TUNE``: calling it is asking for tuning. Candidates come from the
    families ``CONVTUNE_FAMILIES`` allows (``report.families`` lists them when restricted).

    Args:
        x_shape, w_shape: shapes as 4-int sequences, or the arrays themselves (anything
            with ``.shape``).
        stride, padding, dilation, groups: as for ``conv2d``.
        bias: whether the calls have a bias (``True``, its length, or the bias array).
        budget: seconds to spend compiling and timing candidates, after the set-up (inputs,
            reference run, GPU spin-up; on a CPU adapter the set-up counts too); default
            ``CONVTUNE_TUNE_BUDGET`` or 1. Candidates
            compile on a pool of threads, and one starts only if it can be expected to
            compile within the budget; the default variant and the few top-ranked candidates are timed even past
            it, and so are those whose compiles were under way when it ended, while the
            last of those compiles finish (``report.phases["finish"]``: what is left of that
            wait).
        force: tune again even if the cache has the shape.
        precision: the precision mode to tune for (see ``conv2d``); each mode has its own
            cache entry.
        z, alpha1, alpha2, activation, negative_slope, clamp: the fused epilogue, as for
            ``conv2d`` (``z``: whether calls add a residual, or the residual itself); each
            epilogue is its own tuning problem.
        layout: ``"NCHW"`` or ``"NHWC"`` (x_shape then in that order), as for ``conv2d``.
        dtype: ``"float32"`` or ``"float16"`` (or a numpy dtype); arrays given as shapes
            bring their own. Each layout and dtype is its own tuning problem.
        pixel_shuffle: r, as for ``conv2d``: the shuffled problem is its own tuning problem
            (``default_variant``, ``wgsl``, ``time_variant`` and ``explain`` take it too).
        transposed, output_padding: a transposed convolution's problem (w_shape then
            (C, K/groups, R, S)).
    """
    return _tune_with(
        None, (x_shape, w_shape, stride, padding, dilation, groups),
        {"bias": bias, **epilogue},
        budget=budget, force=force, precision=precision,
    )


def tune_onnx(
    path: Union[str, "os.PathLike[str]"],
    batch: Optional[int] = None,
    precision: Union[None, str, Sequence[str]] = None,
    *,
    float16: bool = False,
    layout: str = "NCHW",
    budget: Optional[float] = None,
    force: bool = False,
    export: Union[None, str, "os.PathLike[str]"] = None,
    progress: bool = True,
) -> list:
    """Tunes every distinct convolution of an ONNX model ahead of its first run.

    Each ``Conv`` and ``ConvTranspose`` node becomes the problem the matching ``conv2d`` /
    ``conv_transpose2d`` call makes (x's shape from the graph's shape inference, strides,
    pads, dilations, group, ``auto_pad``, ``output_padding``, bias, and the epilogue a fused
    call takes from a following ``Add`` and ``Relu``/``LeakyRelu``/``Clip``); each distinct
    problem is tuned once per precision mode (``precision``: a mode or a list of them; default
    ``CONVTUNE_PRECISION`` or ``"highest"``), or in float16 with ``float16=True``, in
    ``layout``. ``batch`` sets a symbolic batch dimension (required where the model has one).
    ``export``: a path to write the tuning cache to, for ``cache_import`` on the machine that
    deploys the model (the same GPU and driver). Needs the ``onnx`` package
    (``pip install 'convtune[onnx]'``).

    Returns one dict per problem and mode: ``nodes`` (node names), ``shape`` (its spec),
    ``mode``, ``winner``, ``tuned_ms``, ``default_ms`` and ``tuning_s``. Raises ValueError
    (``convtune._onnx.OnnxError``) for a file it cannot read, naming the node.
    """
    from . import _onnx
    from ._tuning import ListProgress

    nodes = _onnx.conv_nodes(os.fspath(path), batch)
    if float16:
        modes: List[Optional[str]] = [None]
    elif precision is None or isinstance(precision, str):
        modes = [precision]
    else:
        modes = list(precision)
    lay = _layout(layout)
    jobs = []
    for node in nodes:
        n, c, h, w = node.x
        x_shape = (n, h, w, c) if lay == "NHWC" else (n, c, h, w)
        kwargs = dict(node.kwargs)
        args = (x_shape, node.w, kwargs.pop("stride"), kwargs.pop("padding"), kwargs.pop("dilation"), kwargs.pop("groups"))
        kwargs.update(layout=lay, dtype="float16" if float16 else "float32")
        jobs += [(node, mode, args, kwargs) for mode in modes]
    display = ListProgress(len(jobs)) if progress else None
    rows = []
    try:
        for i, (node, mode, args, kwargs) in enumerate(jobs):
            if display is not None:
                display.start(i, ",".join(node.names))
            report = _tune_with(display if display is not None else (lambda *a: None), args, kwargs,
                                budget=budget, force=force, precision=mode)
            if display is not None:
                display.finish()
            rows.append(dict(nodes=node.names, shape=report.shape, mode="float16" if float16 else (mode or "default"),
                             winner=report.winner, tuned_ms=report.tuned_ms, default_ms=report.default_ms,
                             tuning_s=report.tuning_s))
    finally:
        if display is not None:
            display.close()
    if export is not None:
        cache_export(export)
    return rows


def _tune_with(progress: Any, args: tuple, kwargs: dict, *, budget: Optional[float] = None,
               force: bool = False, precision: Optional[str] = None) -> TuneReport:
    """``tune(*args, **kwargs, ...)`` reporting to ``progress`` (a callable taking done, total,
    candidate, shape), or to a display of its own when ``None``: the command line draws one
    display across many shapes. ``kwargs`` are ``tune``'s: bias, and the epilogue, layout and
    dtype keywords (as ``Shape.kwargs()`` gives them)."""
    keywords = dict(kwargs)
    x_shape, w_shape, stride, padding, dilation, groups = args
    spec = _call_spec(x_shape, w_shape, stride, padding, dilation, groups, keywords.pop("bias", None), keywords)
    own = progress is None
    if own:
        progress = Progress()
    try:
        d = _convtune.tune(
            spec,
            budget=_budget(budget),
            force=bool(force),
            progress=progress,
            precision=_precision(precision),
        )
    finally:
        if own:
            progress.close()
    return TuneReport.from_dict(d)


def explain(
    x_shape: ShapeLike,
    w_shape: ShapeLike,
    stride: IntPair = 1,
    padding: Padding = 0,
    dilation: IntPair = 1,
    groups: int = 1,
    bias: BiasLike = None,
    *,
    variant: Optional[str] = None,
    precision: Optional[str] = None,
    **epilogue: Any,
) -> Explanation:
    """What ``conv2d`` runs for this shape and why: the variant, its knobs, its WGSL, where
    the choice came from (``forced``, ``default``, ``cache`` or ``tuned``) and, when tuning
    was involved, every candidate's time and status.

    Decides exactly as ``conv2d`` would, so under ``CONVTUNE_TUNE=auto`` it tunes a shape
    the cache does not have yet. ``excluded`` names the kernel families ``CONVTUNE_FAMILIES``
    left out of the choice. Keywords ``z``, ``alpha1``, ``alpha2``, ``activation``,
    ``negative_slope`` and ``clamp`` describe a fused epilogue, as for ``conv2d``.
    """
    if variant is not None and not isinstance(variant, str):
        raise TypeError(f"variant must be a str, got {type(variant).__name__}")
    progress = Progress()
    try:
        d = _convtune.explain(
            _call_spec(x_shape, w_shape, stride, padding, dilation, groups, bias, epilogue),
            variant=variant,
            progress=progress,
            precision=_precision(precision),
        )
    finally:
        progress.close()
    return Explanation.from_dict(d)


def cache_path() -> Optional[str]:
    """The tuning cache file in use now (``None`` when there is no cache directory)."""
    p = _convtune.cache_path()
    return None if p is None else str(p)


def cache_export(path: Union[str, "os.PathLike[str]"]) -> int:
    """Writes every tuning result (all adapters) to ``path``; returns how many.

    Import the file with ``cache_import`` on machines with the same GPU and driver; results
    for other adapters or convtune versions are kept apart and never used there.
    """
    return _convtune.cache_export(os.fspath(path))


def cache_import(path: Union[str, "os.PathLike[str]"]) -> int:
    """Merges a file written by ``cache_export`` into the tuning cache; returns how many
    entries it held. Raises ConvtuneError for a file that is not such an export."""
    return _convtune.cache_import(os.fspath(path))


def cache_clear() -> None:
    """Deletes the tuning cache file and forgets what this process remembered of it."""
    _convtune.cache_clear()
