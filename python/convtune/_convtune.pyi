"""Type stubs for the native module ``convtune._convtune`` (built from src/python.rs).

The public, documented API is the ``convtune`` package; these are its building blocks.
Shape-taking functions receive one already-normalised ``spec`` tuple: (x_shape, w_shape,
stride, padding, dilation, groups, bias_len), with ``stride`` and ``dilation`` as (h, w)
pairs, ``padding`` as an (h, w) pair or ``"same"``/``"valid"``, and ``bias_len`` as the bias
length or ``None``.
"""

import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union, final

import numpy as np
import numpy.typing as npt

__version__: str
__all__ = [
    "__version__",
    "ConvtuneError",
    "NoAdapterError",
    "OutOfMemoryError",
    "DeviceLostError",
    "ShaderError",
    "InternalError",
    "ConvtuneWarning",
    "conv2d",
    "devices",
    "adapter_info",
    "variant_space",
    "families",
    "variant_knobs",
    "default_variant",
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
    "_stop_tuning",
    "_set_poison",
    "_last_call_timings",
    "_reset_tuning_state",
    "_inject_faulty_candidate",
    "_inject_panic",
    "Tensor",
    "to_device",
    "conv2d_tensor",
    "memory_stats",
    "synchronize",
    "conv2d_footprint",
    "upload_footprint",
    "check_memory",
]

_Pair = Tuple[int, int]
_Padding = Union[str, Tuple[int, int]]
_Shape4 = Sequence[int]
#: (alpha1, alpha2, residual, activation, negative_slope, clamp_min, clamp_max).
_Epilogue = Tuple[float, float, bool, Optional[str], float, float, float]
#: (x_shape, w_shape, stride, (padding, padding_mode), dilation, groups, bias_len, epilogue,
#: layout, dtype, output_padding, pixel_shuffle), already normalised; x_shape in the layout's order; dtype
#: "float32" or "float16"; an output_padding pair makes it a transposed convolution, None a
#: plain one; pixel_shuffle r >= 1 (1: none).
_Spec = Tuple[_Shape4, _Shape4, _Pair, Tuple[_Padding, str], _Pair, int, Optional[int], Optional[_Epilogue], str, str, Optional[_Pair], int]
#: float32 data, or float16 data viewed as uint16 (its bits).
_Data = Union[npt.NDArray[np.float32], npt.NDArray[np.uint16]]
#: ``progress(done, total, candidate_name, shape_label)``; raising cancels tuning.
_Progress = Callable[[int, int, str, str], Any]

class ConvtuneError(RuntimeError): ...
class NoAdapterError(ConvtuneError): ...
class OutOfMemoryError(ConvtuneError): ...
class DeviceLostError(ConvtuneError): ...
class ShaderError(ConvtuneError): ...
class InternalError(ConvtuneError): ...
class ConvtuneWarning(UserWarning): ...

def conv2d(
    x: _Data,
    w: _Data,
    bias: Optional[npt.NDArray[np.float32]],
    stride: _Pair,
    padding: _Padding,
    dilation: _Pair,
    groups: int,
    variant: Optional[str] = None,
    progress: Optional[_Progress] = None,
    precision: Optional[str] = None,
    epilogue: Optional[_Epilogue] = None,
    z: Optional[_Data] = None,
    layout: Optional[str] = None,
    output_padding: Optional[_Pair] = None,
    pixel_shuffle: int = 1,
    padding_mode: Optional[str] = None,
) -> Union[npt.NDArray[np.float32], npt.NDArray[np.float16]]: ...
def devices() -> List[Dict[str, Any]]: ...
def adapter_info() -> Dict[str, Any]: ...
def variant_space() -> List[str]: ...
def families() -> Tuple[List[str], List[str]]: ...
def variant_knobs(name: str) -> Dict[str, Union[str, int]]: ...
def default_variant(
    spec: _Spec,
    precision: Optional[str] = None,
) -> str: ...
def wgsl(
    variant: str,
    spec: _Spec,
) -> str: ...
def time_variant(
    variant: Optional[str],
    spec: _Spec,
    reps: int = 10,
    warmup: int = 2,
    precision: Optional[str] = None,
) -> Tuple[str, List[float]]: ...
def tune(
    spec: _Spec,
    budget: Optional[float] = None,
    force: bool = False,
    progress: Optional[_Progress] = None,
    precision: Optional[str] = None,
) -> Dict[str, Any]: ...
def explain(
    spec: _Spec,
    variant: Optional[str] = None,
    progress: Optional[_Progress] = None,
    precision: Optional[str] = None,
) -> Dict[str, Any]: ...
def cache_path() -> Optional[Path]: ...
def cache_export(path: Union[str, os.PathLike[str]]) -> int: ...
def cache_import(path: Union[str, os.PathLike[str]]) -> int: ...
def cache_clear() -> None: ...
def set_tuning(mode: Optional[str] = None) -> None: ...
def tuning_mode() -> str: ...
def wait_tuning(timeout: Optional[float] = None) -> List[Dict[str, Any]]: ...
def tuning_status() -> Dict[str, Any]: ...
def _stop_tuning(grace: float) -> None: ...
def _set_poison(on: bool) -> None: ...
def _last_call_timings() -> Tuple[List[Tuple[str, float]], Optional[int]]:
    """This thread's last host-array conv2d: (phase, seconds) in order, minor page faults."""
def _reset_tuning_state() -> None: ...
def _inject_faulty_candidate(on: bool) -> None: ...
def _inject_panic(n: int) -> None: ...

@final
class Tensor:
    """A float32 or float16 tensor resident on the GPU, NCHW or NHWC."""

    @property
    def layout(self) -> str: ...
    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def _dims(self) -> Tuple[int, int, int, int]: ...
    @property
    def unbatched(self) -> bool: ...
    @property
    def dtype(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    def numpy(self) -> Union[npt.NDArray[np.float32], npt.NDArray[np.float16]]: ...

def to_device(x: _Data, layout: Optional[str] = None, unbatched: bool = False) -> Tensor: ...
def conv2d_tensor(
    x: Tensor,
    w: Optional[_Data],
    bias: Optional[npt.NDArray[np.float32]],
    stride: _Pair,
    padding: _Padding,
    dilation: _Pair,
    groups: int,
    variant: Optional[str] = None,
    progress: Optional[_Progress] = None,
    precision: Optional[str] = None,
    epilogue: Optional[_Epilogue] = None,
    z: Optional[_Data] = None,
    z_tensor: Optional[Tensor] = None,
    layout: Optional[str] = None,
    output_padding: Optional[_Pair] = None,
    pixel_shuffle: int = 1,
    w_tensor: Optional[Tensor] = None,
    padding_mode: Optional[str] = None,
) -> Tensor: ...
def memory_stats(reset_peak: bool = False) -> Dict[str, int]: ...
def synchronize() -> None: ...

#: Bytes by purpose: [(label, bytes), ...].
_Parts = List[Tuple[str, int]]

def conv2d_footprint(spec: _Spec, x_on_device: bool) -> Tuple[_Parts, _Parts]:
    """(host, GPU) bytes a conv2d needs, from the shapes alone; validates the shape."""
def upload_footprint(shape: Sequence[int]) -> Tuple[_Parts, _Parts]:
    """(host, GPU) bytes ``to_device`` needs for an array of this shape."""
def check_memory(what: str, host: _Parts, device: _Parts) -> None:
    """Raises OutOfMemoryError when the bytes exceed the host's or the GPU's memory."""
