"""What NVIDIA's own libraries reach on the public suite's GEMM sizes, next to what a WGSL
tensor-core kernel can: the ceiling a Vulkan conv is measured against.

For each compute-bound conv of the public suite, the plain GEMM of its implicit-GEMM view
(M = N*OH*OW pixels, N = K output channels, K = C*R*S terms) through cuBLAS (`torch.matmul`)
in fp16, TF32 and fp32, and the conv itself through cuDNN in each precision; TFLOP/s = 2*M*N*K
over GPU time (CUDA events around runs queued behind a sleep kernel, as `vs_cudnn.py` times
cuDNN). The WGSL side is the standalone cooperative-matrix GEMM probe run at the same sizes
(`benches/results/HISTORY.md`, "The ceiling on the suite's layers", says how).

Usage (GPU machine, PyTorch with CUDA):
    python benches/gemm_vs_cublas.py --json gemm_vs_cublas.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vs_cudnn import cuda_ms  # noqa: E402

# (label, conv as (N, C, H, W, K, R, S, stride, pad), GEMM (M, N, K) the WGSL probe can run:
# whole 256-row tiles, so 32,512,7,7's M of 1568 is timed as 1536 on both sides).
LAYERS = [
    ("8192^3 GEMM", None, (8192, 8192, 8192)),
    ("32,256,56,56 -> 64 1x1", (32, 256, 56, 56, 64, 1, 1, 1, 0), (100352, 64, 256)),
    ("32,64,56,56 -> 256 1x1", (32, 64, 56, 56, 256, 1, 1, 1, 0), (100352, 256, 64)),
    ("32,64,56,56 -> 64 3x3", (32, 64, 56, 56, 64, 3, 3, 1, 1), (100352, 64, 576)),
    ("32,128,56,56 -> 128 3x3 s2", (32, 128, 56, 56, 128, 3, 3, 2, 1), (25088, 128, 1152)),
    ("32,256,14,14 -> 256 3x3", (32, 256, 14, 14, 256, 3, 3, 1, 1), (6272, 256, 2304)),
    ("32,512,7,7 -> 512 3x3", (32, 512, 7, 7, 512, 3, 3, 1, 1), (1536, 512, 4608)),
    ("1,64,720,1280 -> 64 3x3 (EDSR)", (1, 64, 720, 1280, 64, 3, 3, 1, 1), (921600, 64, 576)),
]


def tflops(flop: float, ms: float) -> float:
    return flop / (ms * 1e-3) / 1e12


def gemm_row(m: int, n: int, k: int) -> dict:
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.rand((m, k), device="cuda", generator=g) - 0.5
    b = torch.rand((k, n), device="cuda", generator=g) - 0.5
    flop = 2.0 * m * n * k
    out = {}
    for name, tf32 in (("fp32", False), ("tf32", True)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        out[name] = tflops(flop, cuda_ms(lambda: a @ b))
    torch.backends.cuda.matmul.allow_tf32 = False
    ah, bh = a.half(), b.half()
    out["fp16"] = tflops(flop, cuda_ms(lambda: ah @ bh))
    return out


def conv_row(conv) -> dict:
    import torch
    import torch.nn.functional as F

    n, c, h, w, k, r, s, st, p = conv
    torch.backends.cudnn.benchmark = True
    x = torch.rand((n, c, h, w), device="cuda") - 0.5
    wt = torch.rand((k, c, r, s), device="cuda") - 0.5
    oh, ow = (h + 2 * p - r) // st + 1, (w + 2 * p - s) // st + 1
    flop = 2.0 * n * k * oh * ow * c * r * s
    out = {}
    for name, tf32 in (("fp32", False), ("tf32", True)):
        torch.backends.cudnn.allow_tf32 = tf32
        out[name] = tflops(flop, cuda_ms(lambda: F.conv2d(x, wt, stride=st, padding=p)))
    torch.backends.cudnn.allow_tf32 = False
    xh = x.half().to(memory_format=torch.channels_last)
    wh = wt.half().to(memory_format=torch.channels_last)
    out["fp16"] = tflops(flop, cuda_ms(lambda: F.conv2d(xh, wh, stride=st, padding=p)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    import torch

    rows = []
    print(f"{torch.cuda.get_device_name()}, PyTorch {torch.__version__}")
    print("TFLOP/s | cuBLAS fp16 / TF32 / fp32 | cuDNN conv fp16 / TF32 / fp32")
    for label, conv, (m, n, k) in LAYERS:
        row = {"layer": label, "m": m, "n": n, "k": k, "cublas": gemm_row(m, n, k)}
        if conv is not None:
            row["cudnn"] = conv_row(conv)
        rows.append(row)
        gb, cd = row["cublas"], row.get("cudnn", {})
        conv_s = " / ".join(f"{cd[p]:.0f}" for p in ("fp16", "tf32", "fp32")) if cd else "-"
        print(f"{label:<32} {m}x{n}x{k}: {gb['fp16']:.0f} / {gb['tf32']:.0f} / {gb['fp32']:.0f} | {conv_s}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
