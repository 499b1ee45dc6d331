"""Padding modes against zero padding and against PyTorch's F.pad + conv.

Usage (on the GPU machine, where PyTorch with CUDA is installed):
    python benches/padding_modes.py [--modes reflect replicate circular]
        [--precisions highest high float16] [--budget 1]

Per layer, precision and mode: convtune tuned afresh at the default budget, its winner's GPU
time (median of 50 timestamp-query runs), against the same layer with zero padding tuned the
same way ("mode / zeros": the price of the mode's gather); PyTorch's
`F.conv2d(F.pad(x, mode), w)` (fp32 with TF32 off for "highest", TF32 for "high", fp16 for
float16), both kernels timed with CUDA events around queued runs (`vs_cudnn.cuda_ms`); and
convtune's peak GPU bytes during one call in each mode (`memory_stats`), to show that no
padded copy of x is made.
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


def mode_of(precision):
    """convtune's precision argument for a column of the table (float16 data has none)."""
    return None if precision == "float16" else precision


def gpu_ms(x, w, pad, mode, precision, variant=None, reps=50):
    name, times = convtune.time_variant(x, w, padding=pad, padding_mode=mode, variant=variant,
                                        reps=reps, precision=mode_of(precision))
    return name, statistics.median(times) * 1e3


def peak_bytes(x, w, pad, mode, precision):
    convtune.synchronize()
    convtune.memory_stats(reset_peak=True)
    convtune.conv2d(x, w, padding=pad, padding_mode=mode, precision=mode_of(precision))
    return convtune.memory_stats()["peak_device_bytes"]


def torch_ms(x, w, pad, mode, precision):
    from vs_cudnn import cuda_ms, cuda_torch

    torch = cuda_torch()
    if torch is None:
        return None
    F = torch.nn.functional
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = precision == "high"
    xt, wt = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
    if mode == "zeros":
        return cuda_ms(lambda: F.conv2d(xt, wt, padding=pad))
    return cuda_ms(lambda: F.conv2d(F.pad(xt, (pad,) * 4, mode=mode), wt))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--modes", nargs="+", default=["reflect", "replicate", "circular"])
    p.add_argument("--precisions", nargs="+", default=["highest", "high", "float16"])
    p.add_argument("--budget", type=float, default=None)
    p.add_argument("--smoke", action="store_true", help="tiny layers (a CPU adapter)")
    a = p.parse_args()
    print(f"# {convtune.adapter_info()['name']}; ms (GPU time)")
    print("| layer | precision | mode | convtune winner | ms | / zeros tuned | PyTorch F.pad + conv ms | convtune / PyTorch | peak GPU MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for xs, ws, pad in [((1, 4, 12, 10), (4, 4, 3, 3), 1)] if a.smoke else LAYERS:
        label = f"{'x'.join(map(str, xs))} -> {ws[0]}, {ws[2]}x{ws[3]} p{pad}"
        for precision in a.precisions:
            dt = np.float16 if precision == "float16" else np.float32
            x = rng.standard_normal(xs).astype(dt)
            w = (rng.standard_normal(ws) / np.sqrt(ws[1] * ws[2] * ws[3])).astype(dt)
            zeros_ms = None
            for mode in ["zeros"] + a.modes:
                rep = convtune.tune(x, w, padding=pad, padding_mode=mode, budget=a.budget, force=True,
                                    precision=mode_of(precision))
                _, ms = gpu_ms(x, w, pad, mode, precision, rep.winner)
                zeros_ms = zeros_ms or ms
                peak = peak_bytes(x, w, pad, mode, precision)
                t = torch_ms(x, w, pad, mode, precision)
                got = convtune.conv2d(x, w, padding=pad, padding_mode=mode, precision=mode_of(precision))
                ref = conv2d_reference(x[:1], w, padding=pad, padding_mode=mode)
                err = np.abs(np.asarray(got[:1], np.float64) - ref).max() / np.abs(ref).max()
                assert err < (4e-3 if precision == "float16" else 1e-5 if precision == "highest" else 4e-3), \
                    (label, precision, mode, err)
                print(f"| {label} | {precision} | {mode} | `{rep.winner}` | {ms:.4f} | {ms / zeros_ms:.2f} | "
                      f"{'' if t is None else f'{t:.4f}'} | {'' if t is None else f'{ms / t:.2f}'} | "
                      f"{'' if peak is None else f'{peak / 2**20:.1f}'} |", flush=True)


if __name__ == "__main__":
    main()
