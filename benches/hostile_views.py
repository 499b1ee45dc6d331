"""Hostile inputs on a real GPU machine: views whose dense size is far beyond memory.

Each case passes a float32 (or float16) view of about a terabyte over a few bytes
(``np.broadcast_to``, ``as_strided``) as x or w, or asks for a huge output through padding,
then runs a normal small conv2d and checks it against the float64 reference. Every case
must end in an exception (ValueError for an impossible shape, convtune.OutOfMemoryError
naming the bytes and the limit) without the process being killed, even where memory is
overcommitted (``vm.overcommit_memory = 1``). The last cases are supported shapes (6 GiB
views, a 6 GiB output) run under an address-space limit 4 GiB above the process's size:
they must be OutOfMemoryError. Prints one line per case, then
"ok: process survived, next call works".

    python benches/hostile_views.py
"""

from __future__ import annotations

import re
import sys
import time

import numpy as np

try:
    import resource
except ImportError:  # not on Windows
    resource = None  # type: ignore[assignment]

import convtune
from convtune.reference import conv2d_reference, max_relative_error

TB_X = (2**16, 4, 2**10, 2**10)  # 2**38 float32 elements: 1 TiB
W_SMALL = np.ones((2, 4, 3, 3), np.float32)


def _cases():
    one = np.ones((1, 1, 1, 1), np.float32)
    tiny = np.ones(4, np.float32)
    return {
        "x broadcast_to 1 TiB": lambda: convtune.conv2d(np.broadcast_to(np.float32(1.5), TB_X), W_SMALL),
        "x as_strided 1 TiB": lambda: convtune.conv2d(
            np.lib.stride_tricks.as_strided(tiny, TB_X, (0, 4, 0, 0)), W_SMALL),
        "x float16 broadcast_to 1 TiB": lambda: convtune.conv2d(
            np.broadcast_to(np.float16(1), TB_X), W_SMALL.astype(np.float16)),
        "w broadcast_to 1 TiB": lambda: convtune.conv2d(
            np.ones((1, 4, 16, 16), np.float32), np.broadcast_to(np.float32(1), (2**28, 4, 16, 16))),
        "w as_strided 1 TiB": lambda: convtune.conv2d(
            np.ones((1, 4, 16, 16), np.float32),
            np.lib.stride_tricks.as_strided(tiny, (2**28, 4, 16, 16), (0, 4, 0, 0))),
        "bias broadcast_to 2**33": lambda: convtune.conv2d(
            np.ones((1, 4, 8, 8), np.float32), W_SMALL, bias=np.broadcast_to(np.float32(1), (2**33,))),
        "huge padding (output beyond 2**31 elements)": lambda: convtune.conv2d(
            one, np.ones((1000, 1, 1, 1), np.float32), padding=20000),
        "huge padding, Tensor input": lambda: convtune.conv2d(
            convtune.to_device(one), np.ones((1, 1, 1, 1), np.float32), padding=30000),
        "to_device broadcast_to 1 TiB": lambda: convtune.to_device(np.broadcast_to(np.float32(1), TB_X)),
        "Tensor input, w as_strided 1 TiB": lambda: convtune.conv2d(
            convtune.to_device(np.ones((1, 4, 16, 16), np.float32)),
            np.lib.stride_tricks.as_strided(tiny, (2**28, 4, 16, 16), (0, 4, 0, 0))),
    }


def _limited_cases():
    """Shapes convtune supports whose copies or output exceed the room an address-space
    limit leaves: these must be OutOfMemoryError, raised before anything is allocated."""
    one = np.ones((1, 1, 1, 1), np.float32)
    x6 = (8, 3, 8192, 8192)  # 1.6e9 elements: 6 GiB as float32, from 4 bytes
    return {
        "x broadcast_to 6 GiB": lambda: convtune.conv2d(np.broadcast_to(np.float32(1), x6), W_SMALL[:, :3]),
        "x float16 as_strided 6 GiB": lambda: convtune.conv2d(
            np.lib.stride_tricks.as_strided(np.ones(1, np.float16), x6, (0, 0, 0, 0)), W_SMALL[:, :3].astype(np.float16)),
        "huge padding (6 GiB output)": lambda: convtune.conv2d(one, one, padding=20000),
    }


def _address_space_limit(headroom: int):
    """Caps the address space at the current size plus `headroom`; returns the old limit
    (None where there is no RLIMIT_AS or /proc/self/status)."""
    if resource is None:
        return None
    try:
        with open("/proc/self/status") as f:
            found = re.search(r"VmSize:\s+(\d+) kB", f.read())
    except OSError:
        return None
    if found is None:
        return None
    size = int(found.group(1)) * 1024
    old = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (size + headroom, old[1]))
    return old


def _run(call):
    """Runs one case: (1 if it did not raise ValueError/OutOfMemoryError else 0, what it did,
    milliseconds)."""
    t0 = time.perf_counter()
    try:
        call()
        outcome = "returned without an exception"
        bad = 1
    except Exception as e:  # noqa: BLE001 - the type is what is reported
        outcome = f"{type(e).__module__}.{type(e).__name__}: {e}"
        bad = int(not isinstance(e, (ValueError, convtune.OutOfMemoryError)))
    ms = (time.perf_counter() - t0) * 1e3
    return bad, outcome, ms


def _next_call_works(rng) -> bool:
    x = rng.standard_normal((2, 4, 12, 10), dtype=np.float32)
    w = rng.standard_normal((3, 4, 3, 3), dtype=np.float32)
    y = convtune.conv2d(x, w, padding=1)
    return max_relative_error(y, conv2d_reference(x, w, 1, 1)) <= 1e-5


def main() -> int:
    info = convtune.adapter_info()
    print(f"adapter: {info['name']} ({info['backend']}), device heap {info['device_heap_bytes']} bytes, "
          f"max buffer {info['limits']['max_buffer_size']} bytes")
    rng = np.random.default_rng(0)
    failed = 0
    for name, call in _cases().items():
        bad, outcome, ms = _run(call)
        next_ok = _next_call_works(rng)
        failed += bad + (not next_ok)
        print(f"{name}: {outcome} [{ms:.1f} ms; next conv2d {'ok' if next_ok else 'WRONG'}]", flush=True)
    for name, call in _limited_cases().items():
        old = _address_space_limit(4 << 30)
        if old is None:
            print(f"{name}: skipped (no RLIMIT_AS here)")
            continue
        try:
            bad, outcome, ms = _run(call)
        finally:
            resource.setrlimit(resource.RLIMIT_AS, old)
        bad += "OutOfMemoryError" not in outcome
        next_ok = _next_call_works(rng)
        failed += bad + (not next_ok)
        print(f"{name}, address space limited to 4 GiB more: {outcome} [{ms:.1f} ms; next conv2d "
              f"{'ok' if next_ok else 'WRONG'}]", flush=True)
    if failed:
        print(f"FAILED: {failed} case(s) did not raise ValueError/OutOfMemoryError or broke the next call")
        return 1
    print("ok: process survived, next call works")
    return 0


if __name__ == "__main__":
    sys.exit(main())
