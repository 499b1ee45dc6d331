"""Throughput of small calls from 1 to N Python threads on one device: calls per second of a
tiny numpy conv2d (upload, kernel, read-back, wait) and of a tiny device-Tensor call read back
with ``.numpy()``, each thread with its own inputs; every result checked against the first
thread's float64 reference once at the end. Threads share the device, its queue and the
waits: with the GIL released during GPU work, N threads should not run fewer calls than one.

Usage: python benches/thread_throughput.py [--seconds 2] [--threads 1 2 4 8 16] [--rounds 3] [--phases]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Optional

import numpy as np

import convtune
from convtune.reference import conv2d_reference

X, W = (1, 8, 8, 8), (8, 8, 3, 3)


def numpy_call(x, w):
    return convtune.conv2d(x, w, padding=1)


def tensor_call(x, w):
    return convtune.conv2d(convtune.to_device(x), w, padding=1).numpy()


def rate(call, threads: int, seconds: float, phases: Optional[dict] = None) -> float:
    """Calls per second of ``call`` run in a loop by ``threads`` threads for ``seconds``;
    with ``phases``, each call's phase times (``last_call_timings``) appended by name."""
    counts = [0] * threads
    wrong = []
    start = threading.Barrier(threads + 1)

    def work(t):
        rng = np.random.default_rng(t)
        x = rng.standard_normal(X, dtype=np.float32)
        w = rng.standard_normal(W, dtype=np.float32)
        want = conv2d_reference(x, w, padding=1)
        # The first call may tune or compile: the clock starts once every thread has made it.
        y = call(x, w)
        start.wait(timeout=600)
        stop = time.perf_counter() + seconds
        while time.perf_counter() < stop:
            y = call(x, w)
            counts[t] += 1
            if phases is not None:
                timings = convtune.last_call_timings() or {}
                for k, v in timings.get("phases", {}).items():
                    phases.setdefault(k, []).append(v)
        if np.abs(y - want).max() > 1e-4 * np.abs(want).max():
            wrong.append(t)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    start.wait(timeout=600)
    t0 = time.perf_counter()
    for th in pool:
        th.join()
    elapsed = time.perf_counter() - t0
    assert not wrong, f"wrong results in threads {wrong}"
    return sum(counts) / elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds over the thread counts (median)")
    p.add_argument("--phases", action="store_true",
                   help="also print each call phase's median ms (where many threads' calls wait)")
    a = p.parse_args()
    info = convtune.adapter_info()
    print(f"# {info['name']}, {X} -> {W[0]}, 3x3; calls per second (x one thread's)")
    for name, call in (("numpy", numpy_call), ("tensor", tensor_call)):
        # Rounds over every thread count, interleaved, so that a drift of the machine (clocks,
        # another process) spreads over all counts; each count's median over the rounds.
        rates: dict = {n: [] for n in a.threads}
        for _ in range(a.rounds):
            for n in a.threads:
                phases: Optional[dict] = {} if a.phases else None
                rates[n].append(rate(call, n, a.seconds, phases))
                if phases:
                    print(f"{name:6s} {n:3d} threads, median ms: "
                          + ", ".join(f"{k} {statistics.median(v) * 1e3:.3f}" for k, v in phases.items()))
        one = statistics.median(rates[a.threads[0]])
        for n in a.threads:
            r = statistics.median(rates[n])
            spread = f", rounds {min(rates[n]):.0f}-{max(rates[n]):.0f}" if a.rounds > 1 else ""
            print(f"{name:6s} {n:3d} threads: {r:9.0f} calls/s ({r / one:.2f}x{spread})", flush=True)


if __name__ == "__main__":
    main()
