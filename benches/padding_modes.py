"""Padding modes against zero padding and against PyTorch's F.pad + conv.

Usage (on the GPU machine, where PyTorch with CUDA is installed):
    python benches/padding_modes.py [--modes reflect replicate circular] [--budget 1]

Per layer and mode, in "highest" (float32-class; PyTorch with TF32 off): convtune tuned
afresh at the default budget (the modes other than zeros run on the direct family only),
its winner's GPU time (median of 50 timestamp-query runs); the best direct variant for zero
padding, so that "mode / zeros, direct" is the price of the mode's gather alone; PyTorch's
`F.conv2d(F.pad(x, mode), w)`, both kernels timed with CUDA events around queued runs
(`vs_cudnn.cuda_ms`); and convtune's peak GPU bytes during one call in each mode
(`memory_stats`), to show that no padded copy of x is made.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

import convtune
from convtune.reference import conv2d_reference

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

LAYERS = [
    ((1, 64, 256, 256), (64, 64, 3, 3), 1),  # an image-to-image body layer
    ((8, 32, 128, 128), (32, 32, 3, 3), 1),
    ((1, 3, 512, 512), (32, 3, 7, 7), 3),  # a style-transfer network's first layer
]


def gpu_ms(x_shape, w_shape, pad, mode, variant=None, reps=50):
    name, times = convtune.time_variant(x_shape, w_shape, padding=pad, padding_mode=mode, variant=variant,
                                        reps=reps, precision="highest")
    return name, statistics.median(times) * 1e3


def peak_bytes(x, w, pad, mode):
    convtune.synchronize()
    convtune.memory_stats(reset_peak=True)
    convtune.conv2d(x, w, padding=pad, padding_mode=mode, precision="highest")
    return convtune.memory_stats()["peak_device_bytes"]


def torch_ms(x, w, pad, mode):
    from vs_cudnn import cuda_ms, cuda_torch

    torch = cuda_torch()
    if torch is None:
        return None
    F = torch.nn.functional
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    xt, wt = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
    if mode == "zeros":
        return cuda_ms(lambda: F.conv2d(xt, wt, padding=pad))
    return cuda_ms(lambda: F.conv2d(F.pad(xt, (pad,) * 4, mode=mode), wt))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--modes", nargs="+", default=["reflect", "replicate", "circular"])
    p.add_argument("--budget", type=float, default=None)
    p.add_argument("--smoke", action="store_true", help="tiny layers (a CPU adapter)")
    a = p.parse_args()
    print(f"# {convtune.adapter_info()['name']}, \"highest\"; ms (GPU time)")
    print("| layer | mode | convtune winner | ms | / zeros tuned | / zeros, direct | PyTorch F.pad + conv ms | convtune / PyTorch | peak GPU MB (zeros: same layer) |")
    print("|---|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for xs, ws, pad in [((1, 4, 12, 10), (4, 4, 3, 3), 1)] if a.smoke else LAYERS:
        x = rng.standard_normal(xs).astype(np.float32)
        w = (rng.standard_normal(ws) / np.sqrt(ws[1] * ws[2] * ws[3])).astype(np.float32)
        label = f"{'x'.join(map(str, xs))} -> {ws[0]}, {ws[2]}x{ws[3]} p{pad}"
        zeros = convtune.tune(xs, ws, padding=pad, budget=a.budget, force=True, precision="highest")
        _, z_ms = gpu_ms(xs, ws, pad, "zeros", zeros.winner)
        # The best direct variant for zero padding: tune with the direct family alone.
        os.environ["CONVTUNE_FAMILIES"] = "direct"
        zd = convtune.tune(xs, ws, padding=pad, budget=a.budget, force=True, precision="highest")
        del os.environ["CONVTUNE_FAMILIES"]
        _, zd_ms = gpu_ms(xs, ws, pad, "zeros", zd.winner)
        z_peak = peak_bytes(x, w, pad, "zeros")
        t0 = torch_ms(x, w, pad, "zeros")
        print(f"| {label} | zeros | `{zeros.winner}` | {z_ms:.4f} | 1.00 | {z_ms / zd_ms:.2f} | "
              f"{'' if t0 is None else f'{t0:.4f}'} | {'' if t0 is None else f'{z_ms / t0:.2f}'} | "
              f"{'' if z_peak is None else f'{z_peak / 2**20:.1f}'} |", flush=True)
        for mode in a.modes:
            rep = convtune.tune(xs, ws, padding=pad, padding_mode=mode, budget=a.budget, force=True, precision="highest")
            _, m_ms = gpu_ms(xs, ws, pad, mode, rep.winner)
            peak = peak_bytes(x, w, pad, mode)
            t = torch_ms(x, w, pad, mode)
            got = convtune.conv2d(x, w, padding=pad, padding_mode=mode, precision="highest")
            ref = conv2d_reference(x[:1], w, padding=pad, padding_mode=mode)
            err = np.abs(got[:1] - ref).max() / np.abs(ref).max()
            assert err < 1e-4, (label, mode, err)
            print(f"| {label} | {mode} | `{rep.winner}` | {m_ms:.4f} | {m_ms / z_ms:.2f} | {m_ms / zd_ms:.2f} | "
                  f"{'' if t is None else f'{t:.4f}'} | {'' if t is None else f'{m_ms / t:.2f}'} | "
                  f"{'' if peak is None else f'{peak / 2**20:.1f}'} |", flush=True)


if __name__ == "__main__":
    main()
