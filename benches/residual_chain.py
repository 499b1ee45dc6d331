"""Ten chained EDSR residual blocks (conv -> relu -> conv -> x0.1 + skip) on device Tensors,
the relu and the scaled skip fused into the convolutions' store steps.

Prints, per precision mode, the wall time of the ten blocks (20 convolutions, the input
already on the GPU, the result left there) against the sum of the same kernels' GPU times
(`time_variant`, timestamp queries), and the ratio of the two: what running the chain costs
beyond its kernels (submission, waits, no elementwise passes). With PyTorch + CUDA present,
the same chain in PyTorch (cuDNN conv, relu, mul/add as separate kernels) for comparison.

    python benches/residual_chain.py                      # 1,64,720,1280 (EDSR at 720p)
    python benches/residual_chain.py --size 1,16,64,64    # small, e.g. on a CPU adapter
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Dict, List, Optional

import numpy as np

import convtune

BLOCKS = 10


def chain(h: "convtune.Tensor", ws: List[np.ndarray], precision: str) -> "convtune.Tensor":
    for i in range(BLOCKS):
        t = convtune.conv2d(h, ws[2 * i], padding=1, activation="relu", precision=precision)
        h = convtune.conv2d(t, ws[2 * i + 1], padding=1, z=h, alpha1=0.1, precision=precision)
    return h


def kernel_seconds(shape, ws, precision: str, reps: int) -> float:
    """GPU seconds of the chain's kernels: each block's two problems, timed as conv2d runs them."""
    w0 = ws[0].shape
    relu = convtune.time_variant(shape, w0, padding=1, activation="relu", precision=precision, reps=reps)
    skip = convtune.time_variant(shape, w0, padding=1, z=True, alpha1=0.1, precision=precision, reps=reps)
    return BLOCKS * (statistics.median(relu[1]) + statistics.median(skip[1]))


def torch_chain(x: np.ndarray, ws: List[np.ndarray], reps: int) -> Optional[float]:
    from vs_cudnn import cuda_torch

    torch = cuda_torch()
    if torch is None:
        return None
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    F = torch.nn.functional
    h0 = torch.from_numpy(x).cuda()
    tw = [torch.from_numpy(w).cuda() for w in ws]

    def run():
        h = h0
        for i in range(BLOCKS):
            t = F.relu(F.conv2d(h, tw[2 * i], padding=1))
            h = F.conv2d(t, tw[2 * i + 1], padding=1) * 0.1 + h
        torch.cuda.synchronize()

    run()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="1,64,720,1280", help="N,C,H,W of the blocks' input")
    p.add_argument("--reps", type=int, default=5, help="timed chains per mode (median)")
    p.add_argument("--precision", default="highest,high", help="comma-separated modes")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    n, c, hh, ww = (int(v) for v in args.size.split(","))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, hh, ww)).astype(np.float32)
    ws = [(rng.standard_normal((c, c, 3, 3)) * (0.5 / (3 * c**0.5))).astype(np.float32) for _ in range(2 * BLOCKS)]
    rows: List[Dict[str, Any]] = []
    for prec in [m.strip() for m in args.precision.split(",") if m.strip()]:
        h = convtune.to_device(x)
        chain(h, ws, prec).numpy()  # tunes both problems (CONVTUNE_TUNE=auto) and warms up
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            out = chain(h, ws, prec)
            convtune.synchronize()
            times.append(time.perf_counter() - t0)
        wall = statistics.median(times)
        kern = kernel_seconds(x.shape, ws, prec, reps=10)
        row = {"precision": prec, "size": [n, c, hh, ww], "chain_s": wall, "kernels_s": kern,
               "ratio": wall / kern, "finite": bool(np.isfinite(out.numpy()).all())}
        rows.append(row)
        print(f"{prec:8s} 10 blocks {wall * 1e3:8.2f} ms   sum of kernels {kern * 1e3:8.2f} ms   "
              f"ratio {wall / kern:5.2f}", flush=True)
    t = torch_chain(x, ws, args.reps)
    if t is not None:
        print(f"PyTorch (cuDNN fp32, relu/mul/add as own kernels): {t * 1e3:.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"adapter": convtune.adapter_info()["name"], "rows": rows, "torch_s": t}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
