"""Many threads, one GPU: every kind of call at once, every result checked against float64.

Each thread runs ``calls`` calls drawn from a fixed mix — 3x3 (stride 1 and 2), 1x1 with the
fused epilogue, depthwise, a 7x7 stem, ``conv_transpose2d``, ``pixel_shuffle``, device
``Tensor`` inputs with weight Tensors shared by every thread, and a two-layer Tensor chain —
in every precision mode the adapter has, so tuning of the same and of different shapes races
(run it with ``CONVTUNE_TUNE=auto``, or ``background``: then the worker's jobs must end
without error too), while one more thread clears the tuning cache now and
then. A call that raises (anything, ``BaseException`` included) or returns a result outside
its mode's bound counts as failed.

``tests/test_storm.py`` runs it small on the CI's CPU adapter with the polling waits forced
(``CONVTUNE_SPIN_US``); the GPU runs use it as a script::

    CONVTUNE_TUNE=auto python tests/storm.py --threads 16 --calls 50

It prints one line per failure and a closing ``N passed, N failed`` line; the exit code is 1
when any call failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import traceback

import numpy as np

import convtune
from convtune.reference import (
    apply_epilogue,
    conv2d_reference,
    conv_transpose2d_reference,
    pixel_shuffle_reference,
)

JOIN_TIMEOUT_S = 900  # a hang fails the run instead of blocking it


def modes():
    """(precision, float16 data) for every mode the adapter runs."""
    out = [("highest", False), ("high", False)]
    if convtune.adapter_info()["features"]["shader_f16"]:
        out.append(("highest", True))
    return out


def bound(half: bool, precision: str, depth: int = 1) -> float:
    """The relative error a mode allows (as tests/reference.check_mode_bound), per layer."""
    return depth * (4 * 2.0**-11 if half else (1e-5 if precision == "highest" else 4e-3))


def rounded(a: np.ndarray, half: bool) -> np.ndarray:
    """``a`` as the call passes it (float16 or float32)."""
    return a.astype(np.float16 if half else np.float32)


class Case:
    """One call: ``run`` returns (got, want as float64, layers deep)."""

    def __init__(self, name, run):
        self.name, self.run = name, run


def _conv(rng, half, precision, xs, ws, **kw):
    x = rounded(rng.standard_normal(xs), half)
    w = rounded(rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:])), half)
    got = convtune.conv2d(x, w, precision=precision, **kw)
    return got, conv2d_reference(x, w, **kw), 1


def cases(size: int, shared_w):
    """The mix; ``size`` varies the spatial size so threads tune different shapes too."""
    hw = 8 + size

    def conv3(rng, half, prec):
        return _conv(rng, half, prec, (2, 8, hw, hw + 1), (16, 8, 3, 3), padding=1)

    def conv3_s2(rng, half, prec):
        return _conv(rng, half, prec, (1, 8, hw, hw), (8, 8, 3, 3), stride=2, padding=1)

    def depthwise(rng, half, prec):
        return _conv(rng, half, prec, (1, 16, hw, hw), (16, 1, 3, 3), padding=1, groups=16)

    def stem(rng, half, prec):
        return _conv(rng, half, prec, (1, 3, 2 * hw, 2 * hw), (8, 3, 7, 7), stride=2, padding=3)

    def epilogue_1x1(rng, half, prec):
        x = rounded(rng.standard_normal((2, 16, hw, hw)), half)
        w = rounded(rng.standard_normal((8, 16, 1, 1)) / 4, half)
        b = rng.standard_normal(8).astype(np.float32)
        z = rounded(rng.standard_normal((2, 8, hw, hw)), half)
        got = convtune.conv2d(x, w, bias=b, z=z, alpha2=0.5, activation="relu", precision=prec)
        want = apply_epilogue(conv2d_reference(x, w), b, z=z, alpha2=0.5, activation="relu")
        return got, want, 2

    def transposed(rng, half, prec):
        x = rounded(rng.standard_normal((1, 8, hw // 2, hw // 2)), half)
        w = rounded(rng.standard_normal((8, 4, 3, 3)) / 8, half)
        kw = dict(stride=2, padding=1, output_padding=1)
        return convtune.conv_transpose2d(x, w, precision=prec, **kw), conv_transpose2d_reference(x, w, **kw), 1

    def shuffled(rng, half, prec):
        x = rounded(rng.standard_normal((1, 4, hw, hw)), half)
        w = rounded(rng.standard_normal((16, 4, 3, 3)) / 6, half)
        got = convtune.conv2d(x, w, padding=1, pixel_shuffle=2, precision=prec)
        return got, pixel_shuffle_reference(conv2d_reference(x, w, padding=1), 2), 1

    def tensors(rng, half, prec):
        # x on the device and the weights every thread shares, as Tensors.
        w_host, w_dev = shared_w[half]
        x = rounded(rng.standard_normal((1, 8, hw, hw)), half)
        got = convtune.conv2d(convtune.to_device(x), w_dev, padding=1, precision=prec).numpy()
        return got, conv2d_reference(x, w_host, padding=1), 1

    def chain(rng, half, prec):
        # Two layers that never leave the device, the second on the first's output Tensor.
        x = rounded(rng.standard_normal((1, 8, hw, hw)), half)
        w1 = rounded(rng.standard_normal((8, 8, 3, 3)) / 8, half)
        w2 = rounded(rng.standard_normal((4, 8, 1, 1)) / 3, half)
        y1 = convtune.conv2d(convtune.to_device(x), w1, padding=1, precision=prec)
        got = convtune.conv2d(y1, w2, precision=prec).numpy()
        want = conv2d_reference(conv2d_reference(x, w1, padding=1), w2)
        return got, want, 3

    mix = [conv3, conv3_s2, depthwise, stem, epilogue_1x1, transposed, shuffled, tensors, chain]
    return [Case(f.__name__, f) for f in mix]


def check(got, want, half, prec, depth) -> str:
    """'' when ``got`` is ``want`` within the mode's bound, else what is wrong."""
    got = np.asarray(got)
    if got.shape != want.shape:
        return f"shape {got.shape}, want {want.shape}"
    if got.dtype != (np.float16 if half else np.float32):
        return f"dtype {got.dtype}"
    g = got.astype(np.float64)
    if not np.isfinite(g).all():
        return f"{int((~np.isfinite(g)).sum())} non-finite outputs"
    err = float(np.abs(g - want).max() / max(np.abs(want).max(), 1e-6))
    if err > bound(half, prec, depth):
        return f"relative error {err:.3g} > {bound(half, prec, depth):.3g}"
    return ""


def shared_weights(rng):
    """For float32 and float16: (host weights, the same on the device as one Tensor)."""
    out = {}
    for half in (False, True):
        w = rounded(rng.standard_normal((8, 8, 3, 3)) / 8, half)
        out[half] = (w, convtune.to_device(w))
    return out


def storm(threads: int, calls: int, clears: int = 3, seed: int = 0) -> tuple:
    """Runs the storm; returns (passed, failures as lines)."""
    rng = np.random.default_rng(seed)
    shared = shared_weights(rng)
    all_modes = modes()
    failures, passed = [], [0]
    lock = threading.Lock()
    start = threading.Barrier(threads + 1)
    stop = threading.Event()

    def worker(t):
        mix = cases(t % 3, shared)
        start.wait(timeout=120)
        for i in range(calls):
            r = np.random.default_rng([seed, t, i])
            case = mix[(t + i) % len(mix)]
            prec, half = all_modes[(t // len(mix) + i) % len(all_modes)]
            what = f"thread {t} call {i}: {case.name} {prec}{' float16' if half else ''}"
            try:
                got, want, depth = case.run(r, half, prec)
                wrong = check(got, want, half, prec, depth)
            except BaseException as e:  # noqa: BLE001 - a PanicException is a BaseException
                wrong = f"raised {type(e).__module__}.{type(e).__name__}: {e}"
                if os.environ.get("STORM_TRACEBACKS"):
                    traceback.print_exc()
            with lock:
                if wrong:
                    failures.append(f"{what}: {wrong}")
                else:
                    passed[0] += 1

    def clearer():
        start.wait(timeout=120)
        for _ in range(clears):
            if stop.wait(0.5):
                return
            try:
                convtune.cache_clear()
            except BaseException as e:  # noqa: BLE001
                with lock:
                    failures.append(f"cache_clear raised {type(e).__name__}: {e}")

    pool = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(threads)]
    side = threading.Thread(target=clearer, daemon=True)
    for th in pool + [side]:
        th.start()
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for th in pool:
        th.join(max(0.0, deadline - time.monotonic()))
    stop.set()
    side.join(30)
    hung = sum(th.is_alive() for th in pool + [side])
    if hung:
        failures.append(f"{hung} threads still running after {JOIN_TIMEOUT_S} s")
    if convtune.tuning_mode() in ("background", "auto"):
        # The worker's jobs (background tuning, auto mode's detached runs) must end too, and
        # none may fail.
        try:
            convtune.wait_tuning(timeout=JOIN_TIMEOUT_S)
        except TimeoutError as e:
            failures.append(str(e))
        failures += [f"background tuning of {d['problem']} failed: {d['error']}"
                     for d in convtune.tuning_status()["done"] if d["error"]]
    return passed[0], failures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--calls", type=int, default=6)
    p.add_argument("--clears", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    passed, failures = storm(a.threads, a.calls, a.clears, a.seed)
    for f in failures:
        print(f)
    info = convtune.adapter_info()
    print(f"# {a.threads} threads x {a.calls} calls on {info['name']}, CONVTUNE_TUNE="
          f"{os.environ.get('CONVTUNE_TUNE', 'auto')}, CONVTUNE_SPIN_US="
          f"{os.environ.get('CONVTUNE_SPIN_US', 'default')}: {time.perf_counter() - t0:.1f} s")
    print(f"{passed} passed, {len(failures)} failed")
    sys.stdout.flush()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
