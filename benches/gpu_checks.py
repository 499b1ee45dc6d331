"""Checks and timings for large problems on a real GPU (needs PyTorch for the reference).

1. 32,64,300,300 -> 64, 3x3, p1 (the shape that overflowed a 65535-workgroup grid elsewhere)
   checked against PyTorch float64.
2. Ten chained convolutions on the EDSR body shape (1,64,720,1280 -> 64, 3x3, p1), end to
   end: numpy in/out for each conv versus GPU-resident convtune.Tensor intermediates.
Prints a small table; `--json PATH` writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import convtune


def large_shape_check() -> dict:
    import torch

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 64, 300, 300), dtype=np.float32)
    w = rng.standard_normal((64, 64, 3, 3), dtype=np.float32)
    t0 = time.perf_counter()
    y = convtune.conv2d(x, w, padding=1)
    first = time.perf_counter() - t0
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ref = torch.nn.functional.conv2d(
        torch.from_numpy(x).to(dev, torch.float64), torch.from_numpy(w).to(dev, torch.float64), padding=1
    ).cpu().numpy()
    err = float(np.abs(y - ref).max() / np.abs(ref).max())
    return {"shape": "32,64,300,300 -> 64, 3x3, p1", "rel_err": err, "first_call_s": first,
            "nan_free": bool(np.isfinite(y).all())}


def chained_edsr(n_convs: int = 10, reps: int = 3) -> dict:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 64, 720, 1280), dtype=np.float32)
    ws = [rng.standard_normal((64, 64, 3, 3), dtype=np.float32) * 0.05 for _ in range(n_convs)]

    def host_chain():
        y = x
        for w in ws:
            y = convtune.conv2d(y, w, padding=1)
        return y

    def device_chain():
        t = convtune.to_device(x)
        for w in ws:
            t = convtune.conv2d(t, w, padding=1)
        return t.numpy()

    host_chain(), device_chain()  # warm-up: tuning, compilation, pool
    times = {}
    for name, f in (("numpy", host_chain), ("tensor", device_chain)):
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            out = f()
            samples.append(time.perf_counter() - t0)
        times[name] = statistics.median(samples)
        times[name + "_out"] = out
    diff = float(np.abs(times.pop("numpy_out") - times.pop("tensor_out")).max())
    return {"convs": n_convs, "numpy_io_s": times["numpy"], "tensor_s": times["tensor"],
            "speedup": times["numpy"] / times["tensor"], "max_abs_diff": diff}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json", default=None)
    args = p.parse_args()
    info = convtune.adapter_info()
    out = {"adapter": info["name"], "large": large_shape_check(), "edsr_chain": chained_edsr(),
           "memory": convtune.memory_stats()}
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
