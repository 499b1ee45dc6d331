"""Size checks made before any copy or allocation proportional to an input's size.

A zero-stride view (``np.broadcast_to``, ``as_strided``) can describe terabytes with a few
bytes behind it. Copying it to a dense float32 array must not be attempted when the copy
cannot fit: on a machine that overcommits memory the allocation succeeds and the kernel kills
the process while it is being filled. So every entry point validates the shapes from views,
asks the native module what the call needs (``*_footprint``), and checks that, plus the
copies it is about to make, against the host's and the GPU's memory (``check``) before it
touches any data.
"""

from __future__ import annotations

import functools
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np

from . import _convtune

Parts = List[Tuple[str, int]]


def copy_bytes(arr: np.ndarray, dtype: str = "float32") -> int:
    """Bytes of the C-contiguous ``dtype`` copy convtune makes of ``arr`` (0: used as is)."""
    target = np.dtype(dtype)
    if arr.dtype == target and arr.flags.c_contiguous and arr.flags.aligned:
        return 0
    return int(arr.size) * target.itemsize


def check(
    what: str,
    host: Sequence[Tuple[str, int]] = (),
    device: Sequence[Tuple[str, int]] = (),
    copies: Iterable[Tuple[str, Optional[np.ndarray]]] = (),
    dtype: str = "float32",
) -> None:
    """Raises ``convtune.OutOfMemoryError`` (naming the bytes and the limit) when a call
    needing ``host`` and ``device`` bytes, plus ``dtype`` copies of the named ``copies``
    arrays, would not fit in the host's or the GPU's memory.

    The one check for every entry point that copies or allocates: new inputs (residuals,
    other dtypes) add their arrays to ``copies`` or their bytes to ``host``/``device``.
    """
    parts: Parts = [(f"{name} as {dtype}", copy_bytes(arr, dtype)) for name, arr in copies
                    if arr is not None and copy_bytes(arr, dtype)]
    parts += [(str(label), int(b)) for label, b in host]
    _convtune.check_memory(what, parts, [(str(label), int(b)) for label, b in device])


def check_conv2d(spec, x_on_device: bool, copies: Iterable[Tuple[str, Optional[np.ndarray]]]) -> None:
    """Validates a conv2d problem (ValueError for an impossible one) and checks its memory."""
    host, device = _footprint(spec, x_on_device)
    check("conv2d", host, device, copies, spec[9])


@functools.lru_cache(maxsize=512)
def _footprint(spec, x_on_device: bool) -> Tuple[tuple, tuple]:
    # What a problem needs depends on the problem alone (an impossible one raises, and is not
    # kept): a network's repeated calls ask once per shape.
    host, device = _convtune.conv2d_footprint(spec, x_on_device)
    return tuple(host), tuple(device)


def check_upload(arr: np.ndarray, dtype: str = "float32") -> None:
    """Checks the memory ``to_device(arr)`` needs (ValueError beyond one GPU binding)."""
    host, device = _convtune.upload_footprint(list(arr.shape))
    check("to_device", host, device, [("x", arr)], dtype)
