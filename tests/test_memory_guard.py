"""Sizes are checked before any copy: hostile views raise, views that fit are accepted.

A float32 view can describe terabytes with a few bytes behind it (``np.broadcast_to``,
``as_strided``), and a one-pixel input with a large padding asks for a huge output. Where
memory is overcommitted, copying or allocating such a thing is granted and the process is
killed while filling it. The hostile cases run in a child process under an address-space
limit (RLIMIT_AS), so a copy that slipped through shows as MemoryError or a signal, never as
a dead test run; each must end in ValueError (an impossible shape) or
convtune.OutOfMemoryError naming the bytes and the limit, and the next call must work.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np
import pytest

import convtune
from reference import check_close, reference_conv2d

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
GiB = 1 << 30
# Address space the child may add once its device is open.
HEADROOM = GiB

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="RLIMIT_AS and /proc/self/status are Linux's")


def _rng(seed):
    return np.random.default_rng(seed)


def _max_binding() -> int:
    limits = convtune.adapter_info()["limits"]
    return min(limits["max_storage_buffer_binding_size"], limits["max_buffer_size"])


# --------------------------------------------------------------------------------------------
# Views that fit are real inputs
# --------------------------------------------------------------------------------------------


def _sliding_rows(a: np.ndarray, rows: int) -> np.ndarray:
    """(N, C, rows, W) overlapping windows of `a`'s rows: row i of image n starts at row n."""
    n = a.shape[2] - rows + 1
    s = a.strides
    return np.lib.stride_tricks.as_strided(a, (n, a.shape[1], rows, a.shape[3]),
                                           (s[2], s[1], s[2], s[3]), writeable=False)


VIEWS = {
    # A batch of one image repeated, as np.broadcast_to makes it.
    "broadcast batch": lambda r: np.broadcast_to(r.standard_normal((1, 3, 12, 11), np.float32),
                                                 (6, 3, 12, 11)),
    # One row repeated down the image and one channel across channels, through as_strided.
    "zero strides": lambda r: np.lib.stride_tricks.as_strided(
        r.standard_normal(11, np.float32), (2, 3, 12, 11), (0, 0, 0, 4), writeable=False),
    "overlapping rows": lambda r: _sliding_rows(r.standard_normal((1, 3, 20, 9), np.float32), 8),
    "float16 broadcast": lambda r: np.broadcast_to(
        r.standard_normal((1, 3, 1, 11)).astype(np.float16), (4, 3, 12, 11)),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_views_that_fit_compute_the_reference(name):
    rng = _rng(sorted(VIEWS).index(name))
    x = VIEWS[name](rng)
    # float16 x takes float16 w (and gives a float16 result, rounded once).
    w = rng.standard_normal((5, 3, 3, 3), dtype=np.float32).astype(x.dtype)
    b = rng.standard_normal(5, dtype=np.float32)
    ref = reference_conv2d(np.asarray(x, np.float32), w, padding=1, bias=b)
    rtol = 4 * 2.0**-11 if x.dtype == np.float16 else 1e-5

    def close(got, context):
        assert got.dtype == x.dtype, context
        check_close(got.astype(np.float32), ref, context=context, rtol=rtol)

    close(convtune.conv2d(x, w, padding=1, bias=b), name)
    close(convtune.conv2d(convtune.to_device(x), w, padding=1, bias=b).numpy(), f"{name} through to_device")


def test_broadcast_weights_and_bias_compute_the_reference():
    rng = _rng(7)
    x = rng.standard_normal((2, 4, 9, 9), dtype=np.float32)
    w = np.broadcast_to(rng.standard_normal((1, 4, 3, 3), dtype=np.float32), (6, 4, 3, 3))
    b = np.broadcast_to(np.float32(rng.standard_normal()), (6,))
    check_close(convtune.conv2d(x, w, bias=b), reference_conv2d(x, np.asarray(w), bias=np.asarray(b)))


def test_a_broadcast_batch_is_copied_once():
    """Host memory while converting a broadcast batch: one float32 copy of it and the output,
    not two copies (numpy reports its allocations to tracemalloc)."""
    rng = _rng(8)
    x = np.broadcast_to(rng.standard_normal((1, 4, 64, 64)), (64, 4, 64, 64))  # float64
    w = rng.standard_normal((2, 4, 1, 1), dtype=np.float32)
    convtune.conv2d(x[:1], w)  # compile outside the measurement
    copy, out = x.size * 4, 64 * 2 * 64 * 64 * 4
    tracemalloc.start()
    try:
        y = convtune.conv2d(x, w)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < copy * 1.5 + out, f"peak {peak} bytes for a {copy}-byte copy and {out}-byte output"
    check_close(y[::21], reference_conv2d(np.asarray(x[::21], np.float32), w))


# --------------------------------------------------------------------------------------------
# What a call needs is known before it runs
# --------------------------------------------------------------------------------------------


def _footprint(x_shape, w_shape, padding=0, on_device=False):
    spec = convtune._spec(x_shape, w_shape, 1, padding, 1, 1, None)
    host, device = convtune._convtune.conv2d_footprint(spec, on_device)
    return dict(host), dict(device)


def test_footprint_counts_the_output_of_a_huge_padding():
    host, device = _footprint((1, 1, 1, 1), (3, 1, 1, 1), padding=9000)
    assert host["output"] == 4 * 3 * 18001 * 18001
    # The output is read back in pieces: the GPU holds one at a time.
    assert sum(device.values()) <= 2 * _max_binding() + 64


def test_impossible_shapes_are_value_errors_before_anything_is_copied():
    with pytest.raises(ValueError, match=r"x has 1099511627776 elements \(4\.00 TiB"):
        _footprint((2**20, 1, 2**10, 2**10), (1, 1, 1, 1))
    with pytest.raises(ValueError, match="largest storage buffer"):
        _footprint((1, 1, 1, 1), (1, 1, 1, 1), padding=20000, on_device=True)


# --------------------------------------------------------------------------------------------
# Hostile inputs, in a child under an address-space limit
# --------------------------------------------------------------------------------------------


def _huge_cases(max_binding: int):
    """name -> (build the call, expected exception). Builders run in the child."""
    big_w = (24576, 4, 64, 64)  # 1.5 GiB of float32 from 64 KiB
    big_w_bytes = 4 * int(np.prod(big_w))
    beyond_binding = ValueError if big_w_bytes > max_binding else convtune.OutOfMemoryError
    tb_x = (2**16, 4, 2**10, 2**10)  # 1 TiB of float32
    return {
        "x broadcast_to 1 TiB": (lambda: convtune.conv2d(
            np.broadcast_to(np.float32(1.5), tb_x), np.ones((2, 4, 3, 3), np.float32)), ValueError),
        "x as_strided 1 TiB": (lambda: convtune.conv2d(
            np.lib.stride_tricks.as_strided(np.ones(4, np.float32), tb_x, (0, 4, 0, 0)),
            np.ones((2, 4, 3, 3), np.float32)), ValueError),
        "w broadcast_to 1 TiB": (lambda: convtune.conv2d(
            np.ones((1, 4, 16, 16), np.float32),
            np.broadcast_to(np.float32(1), (2**28, 4, 16, 16))), ValueError),
        "x broadcast 3 GiB": (lambda: convtune.conv2d(
            np.broadcast_to(np.float32(1), (8, 3, 4096, 8192)), np.ones((2, 3, 3, 3), np.float32)),
            convtune.OutOfMemoryError),
        "x float16 broadcast 3 GiB": (lambda: convtune.conv2d(
            np.broadcast_to(np.float16(1), (16, 3, 4096, 8192)), np.ones((2, 3, 3, 3), np.float16)),
            convtune.OutOfMemoryError),
        "output of a huge padding": (lambda: convtune.conv2d(
            np.ones((1, 1, 1, 1), np.float32), np.ones((1, 1, 1, 1), np.float32), padding=20000),
            convtune.OutOfMemoryError),
        "w broadcast 1.5 GiB": (lambda: convtune.conv2d(
            np.ones((1, 4, 64, 64), np.float32), np.broadcast_to(np.float32(1), big_w)),
            beyond_binding),
        "to_device 1.5 GiB view": (lambda: convtune.to_device(
            np.broadcast_to(np.float32(1), (6, 4, 4096, 4096))), beyond_binding),
        "Tensor with w broadcast 1.5 GiB": (lambda: convtune.conv2d(
            convtune.to_device(np.ones((1, 4, 64, 64), np.float32)),
            np.broadcast_to(np.float32(1), big_w)), beyond_binding),
        # The native layer alone (no size check in front): numpy's failed allocation must
        # come out as MemoryError, not as a panic.
        "native output allocation": (lambda: convtune._convtune.conv2d(
            np.ones((1, 1, 1, 1), np.float32), np.ones((1, 1, 1, 1), np.float32), None, (1, 1),
            (20000, 20000), (1, 1), 1), MemoryError),
        "Tensor output of a huge padding": (lambda: convtune.conv2d(
            convtune.to_device(np.ones((1, 1, 1, 1), np.float32)), np.ones((1, 1, 1, 1), np.float32),
            padding=30000), ValueError),
    }


def _tensor_numpy_case():
    """Tensor.numpy() of a 64 MiB tensor under a limit 32 MiB above the current size."""
    from address_space import limit_address_space, vm_size  # noqa: F401

    import resource

    t = convtune.conv2d(convtune.to_device(np.ones((1, 1, 1, 1), np.float32)),
                        np.ones((1, 1, 1, 1), np.float32), padding=2047)
    saved = resource.getrlimit(resource.RLIMIT_AS)
    limit_address_space(32 << 20)
    try:
        t.numpy()
    finally:
        resource.setrlimit(resource.RLIMIT_AS, saved)


def _check_next_call(rng) -> None:
    x = rng.standard_normal((2, 3, 10, 9), dtype=np.float32)
    w = rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
    check_close(convtune.conv2d(x, w, padding=1), reference_conv2d(x, w, padding=1))


def _child_main(max_binding: int) -> int:
    """Runs every hostile case under the limit, printing one RESULT line each, then DONE."""
    import faulthandler

    from address_space import limit_address_space

    faulthandler.enable()
    rng = _rng(0)
    _check_next_call(rng)  # opens the device before the limit
    cap = limit_address_space(HEADROOM)
    print(f"LIMIT {cap}", flush=True)
    cases = {name: build for name, (build, _) in _huge_cases(max_binding).items()}
    cases["Tensor.numpy under a 32 MiB margin"] = _tensor_numpy_case
    for name, build in cases.items():
        print(f"CASE {name}", flush=True)
        try:
            build()
            outcome = "returned"
        except Exception as e:  # noqa: BLE001 - the type is what the parent checks
            outcome = f"{type(e).__name__}\t{e}"
        print(f"RESULT {name}\t{outcome}", flush=True)
        _check_next_call(rng)
    print("DONE", flush=True)
    return 0


@linux_only
def test_hostile_views_raise_and_the_process_survives():
    max_binding = _max_binding()
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {TESTS_DIR!r})
        import test_memory_guard
        sys.exit(test_memory_guard._child_main({max_binding}))
    """)
    env = dict(os.environ, CONVTUNE_TUNE="off")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=600)
    started = [ln[5:] for ln in proc.stdout.splitlines() if ln.startswith("CASE ")]
    assert proc.returncode == 0 and "DONE" in proc.stdout, (
        f"the child ended with {'signal ' + str(-proc.returncode) if proc.returncode < 0 else 'status ' + str(proc.returncode)}"
        f" during {started[-1:] or 'its set-up'}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    results = dict(ln[7:].split("\t", 1) for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    expected = {name: want.__name__ for name, (_, want) in _huge_cases(max_binding).items()}
    expected["Tensor.numpy under a 32 MiB margin"] = "OutOfMemoryError"
    assert set(results) == set(expected), proc.stdout
    wrong = {n: r for n, r in results.items() if r.split("\t")[0] != expected[n]}
    assert not wrong, f"expected {expected}, got:\n" + "\n".join(f"{n}: {r}" for n, r in wrong.items())
    for name, result in results.items():
        kind, message = result.split("\t", 1)
        if kind == "OutOfMemoryError":
            # The bytes needed, and the limit with where it comes from.
            assert re.search(r"needs \d+ bytes .* than the \d+ bytes .* available \(.*RLIMIT_AS", message), (name, message)
        elif kind == "ValueError":
            assert re.search(r"\d+ (bytes|elements)", message), (name, message)
