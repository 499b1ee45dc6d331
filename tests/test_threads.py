"""conv2d from many Python threads at once, and the GIL released while the GPU works.

tests/test_correctness.py already runs one shape from 8 threads; here every thread runs its own
mix of shapes, parameters, variants and input kinds (so pipelines are compiled, cached and
looked up concurrently), all threads also race on one shared shape that nobody has compiled
yet, and a separate test checks that a long conv2d lets a pure-Python thread run.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time

import numpy as np
import pytest

import convtune
from reference import check_close, reference_conv2d

N_THREADS = 8
JOIN_TIMEOUT_S = 240  # a deadlock fails the test instead of hanging the run


def _thread_calls(t: int):
    """The 6 calls of thread t: (x_shape, w_shape, kwargs, input kind). Every shape depends on
    t, so no two threads share one; each thread mixes families, groups, strides and inputs."""
    return [
        ((1 + t % 2, 3, 10 + t, 9), (4, 3, 3, 3), dict(padding=1), "c"),
        ((2, 4, 8, 7 + t), (6, 2, 3, 2), dict(stride=(2, 1), padding=(1, 0), groups=2, bias=True),
         "reversed"),
        ((1, 6, 9 + t, 11), (6, 1, 5, 5), dict(padding="same", groups=6, bias=True), "fortran"),
        ((1, 5, 12, 6 + t), (8, 5, 1, 1), {}, "float64"),
        ((3, 2, 7 + t, 13), (3, 2, 3, 3), dict(dilation=2, padding=2,
                                               variant="gemm_b32x32x8_t4x4"), "nan"),
        ((1, 8, 6 + t, 10), (16, 8, 3, 3), dict(stride=2, padding="valid", bias=True,
                                                variant="direct_wg8x8_u4_k2w2"), "device"),
    ]


# One shape every thread runs first, right after the start barrier: all threads miss the
# pipeline cache for the same key at the same moment.
SHARED = ((2, 4, 11, 10), (5, 4, 3, 2), dict(stride=(1, 2), padding=(2, 1), bias=True), "c")


def _inputs(rng, x_shape, w_shape, kwargs, kind):
    x = rng.standard_normal(x_shape, dtype=np.float32)
    w = rng.standard_normal(w_shape, dtype=np.float32)
    b = rng.standard_normal(w_shape[0], dtype=np.float32) if kwargs.get("bias") else None
    if kind == "nan":
        x[tuple(int(rng.integers(0, d)) for d in x_shape)] = np.nan
    return x, w, b


def _as_passed(x, kind):
    """x as the thread passes it to conv2d (same values)."""
    if kind == "reversed":
        return np.ascontiguousarray(x[..., ::-1])[..., ::-1]
    if kind == "fortran":
        return np.asfortranarray(x)
    if kind == "float64":
        return x.astype(np.float64)
    if kind == "device":
        return convtune.to_device(x)
    return x


def _worker(t, barrier, results, errors):
    try:
        calls = [SHARED] + _thread_calls(t)
        out = []
        barrier.wait(timeout=60)
        for i, (x_shape, w_shape, kwargs, kind) in enumerate(calls):
            # Fresh inputs for every call, different in every thread.
            rng = np.random.default_rng([2024, t, i])
            x, w, b = _inputs(rng, x_shape, w_shape, kwargs, kind)
            kw = {k: v for k, v in kwargs.items() if k != "bias"}
            y = convtune.conv2d(_as_passed(x, kind), w, bias=b, **kw)
            if kind == "device":
                assert isinstance(y, convtune.Tensor), type(y)
                y = y.numpy()
            out.append((x, w, b, kw, y, f"thread {t} call {i}: x{x_shape} w{w_shape} {kwargs} "
                                        f"{kind}"))
        results[t] = out
    except BaseException as e:  # noqa: BLE001 - reported by the main thread
        errors[t] = e


def test_mixed_shapes_from_8_threads():
    barrier = threading.Barrier(N_THREADS)
    results, errors = {}, {}
    threads = [
        threading.Thread(target=_worker, args=(t, barrier, results, errors), daemon=True,
                         name=f"conv-{t}")
        for t in range(N_THREADS)
    ]
    for th in threads:
        th.start()
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for th in threads:
        th.join(timeout=max(0.0, deadline - time.monotonic()))
    hung = [th.name for th in threads if th.is_alive()]
    assert not hung, f"threads still running after {JOIN_TIMEOUT_S} s (deadlock?): {hung}"
    assert not errors, {t: f"{type(e).__name__}: {e}" for t, e in errors.items()}
    assert sorted(results) == list(range(N_THREADS))

    outputs = []
    for t in range(N_THREADS):
        assert len(results[t]) == 1 + len(_thread_calls(t))
        for x, w, b, kw, y, where in results[t]:
            assert isinstance(y, np.ndarray) and y.dtype == np.float32, where
            kw = {k: v for k, v in kw.items() if k != "variant"}
            check_close(y, reference_conv2d(x, w, bias=b, **kw), context=where)
            outputs.append(y)
    # Every call got its own output array.
    for a, b in itertools.combinations(outputs, 2):
        assert not np.shares_memory(a, b)
    # The shared shape, with different inputs per thread, gave different answers per thread.
    shared = [results[t][0][4] for t in range(N_THREADS)]
    assert all(not np.array_equal(shared[0], s) for s in shared[1:])


def test_one_weight_tensor_from_8_threads():
    # Every thread runs a transposed convolution (lowered: a weight pass whose output the
    # tensor keeps) and a channels-last pixel shuffle (permuted weight rows, kept too) on the
    # same two weight Tensors, starting together: threads that miss the kept copy at once
    # each make one, and every result must be right.
    rng = np.random.default_rng(99)
    wT = (rng.standard_normal((6, 4, 4, 4)) / 4).astype(np.float32)
    wS = (rng.standard_normal((16, 6, 3, 3)) / 6).astype(np.float32)
    wTt, wSt = convtune.to_device(wT), convtune.to_device(wS)
    barrier = threading.Barrier(N_THREADS)
    results, errors = {}, {}

    def work(t):
        try:
            out = []
            barrier.wait(timeout=60)
            for i in range(3):
                x = np.random.default_rng([7, t, i]).standard_normal((1 + t % 2, 6, 5, 4)).astype(np.float32)
                yT = convtune.conv_transpose2d(convtune.to_device(x), wTt, stride=2, padding=1)
                xh = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
                yS = convtune.conv2d(convtune.to_device(xh, "NHWC"), wSt, padding=1, pixel_shuffle=2)
                out.append((x, yT.numpy(), yS.numpy()))
            results[t] = out
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors[t] = e

    threads = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(N_THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=JOIN_TIMEOUT_S)
    assert not any(th.is_alive() for th in threads), "threads still running (deadlock?)"
    assert not errors, {t: f"{type(e).__name__}: {e}" for t, e in errors.items()}
    from convtune.reference import conv_transpose2d_reference, pixel_shuffle_reference
    for t in range(N_THREADS):
        for x, yT, yS in results[t]:
            check_close(yT, conv_transpose2d_reference(x, wT, stride=2, padding=1), context=f"thread {t} transposed")
            want = pixel_shuffle_reference(reference_conv2d(x, wS, padding=1), 2).transpose(0, 2, 3, 1)
            check_close(yS, want, context=f"thread {t} shuffled")


# --------------------------------------------------------------------------------------------
# The GIL is released while the GPU works
# --------------------------------------------------------------------------------------------


class _Counter:
    """A pure-Python thread that increments a counter as fast as it can."""

    def __init__(self):
        self.n = 0
        self._stop = False
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gil-counter")

    def _run(self):
        self._started.set()
        while not self._stop:
            self.n += 1

    def __enter__(self):
        self._thread.start()
        self._started.wait(10)
        time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self._stop = True
        self._thread.join(10)

    def rate_during(self, fn):
        """Counter increments per second while this thread runs fn(); (rate, seconds)."""
        c0, t0 = self.n, time.perf_counter()
        fn()
        c1, t1 = self.n, time.perf_counter()
        return (c1 - c0) / (t1 - t0), t1 - t0


def _hold_gil_for(seconds: float):
    """A C loop that never releases the GIL (builtin sum over itertools.repeat), sized to last
    about `seconds`."""
    n = 1_000_000
    t0 = time.perf_counter()
    sum(itertools.repeat(1, n))
    per = max((time.perf_counter() - t0) / n, 1e-10)
    count = int(seconds / per)
    return lambda: sum(itertools.repeat(1, count))


def test_gil_is_released_during_gpu_work():
    if hasattr(sys, "_is_gil_enabled") and not sys._is_gil_enabled():
        pytest.skip("free-threaded Python: there is no GIL to release")
    rng = np.random.default_rng(77)
    x = rng.standard_normal((2, 32, 128, 128), dtype=np.float32)
    w = rng.standard_normal((64, 32, 3, 3), dtype=np.float32)
    y = convtune.conv2d(x, w, padding=1)  # compile outside the measurement
    check_close(y, reference_conv2d(x, w, padding=1))

    def conv_for_a_while():
        # At least 0.3 s of GPU work (one call is ~0.3-0.5 s on lavapipe; faster GPUs repeat).
        t0 = time.perf_counter()
        while True:
            convtune.conv2d(x, w, padding=1)
            if time.perf_counter() - t0 >= 0.3:
                return

    with _Counter() as counter:
        free, _ = counter.rate_during(lambda: time.sleep(0.3))
        conv, conv_s = counter.rate_during(conv_for_a_while)
        held, held_s = counter.rate_during(_hold_gil_for(conv_s))
        free2, _ = counter.rate_during(lambda: time.sleep(0.3))
    free = max(free, free2)
    report = (f"counter rate /s: GIL free (sleep) {free:.3g}, during conv2d {conv:.3g} "
              f"({conv_s:.2f} s), GIL held {held:.3g} ({held_s:.2f} s)")
    print(report)
    # The method itself: holding the GIL must (nearly) stop the counter.
    assert held < 0.2 * free, "calibration failed, cannot tell: " + report
    # conv2d must not hold the GIL: the counter keeps going (it competes with lavapipe's
    # worker threads for the CPU cores, so well below the free rate is fine).
    assert conv > 0.1 * free, "the GIL seems to be held during conv2d: " + report
    assert conv > 5 * held, "the GIL seems to be held during conv2d: " + report
