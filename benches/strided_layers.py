"""Strided and patch layers outside the public suite, tuned as a user gets them, against cuDNN
fp32 (TF32 off) on the same GPU; GPU machines (cuDNN's column is left out without PyTorch).

Usage: python benches/strided_layers.py [--precision highest] [--json out.json]
Set CONVTUNE_FAMILIES=direct,stem,gemm,wino,wgemm for what a GPU without cooperative matrices
gets. Each layer is tuned afresh (a temporary cache) at the default budget and its winner
timed by name with w resident (median of 50), as vs_cudnn.py times the public suite.
`explore_variants.py --suite strided` times every variant of a family on the same layers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

import convtune
from convtune.__main__ import Case

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# ResNet-50's 1x1 stride-2 projections, ConvNeXt-T's 4x4 stride-4 stem and 2x2 stride-2
# downsampling, ViT-B/16's patch embedding, a DCGAN discriminator's 4x4 stride 2.
STRIDED = [
    Case(32, 256, 56, 56, 512, 1, 1, 2, 0),
    Case(32, 512, 28, 28, 1024, 1, 1, 2, 0),
    Case(32, 3, 224, 224, 96, 4, 4, 4, 0),
    Case(32, 96, 56, 56, 192, 2, 2, 2, 0),
    Case(32, 192, 28, 28, 384, 2, 2, 2, 0),
    Case(32, 3, 224, 224, 768, 16, 16, 16, 0),
    Case(64, 128, 32, 32, 256, 4, 4, 2, 1),
]


def cudnn_fp32_ms(case: Case, reps: int = 50):
    """cuDNN fp32's (TF32 off) GPU ms for `case`, or None without PyTorch and CUDA."""
    from vs_cudnn import cuda_ms, cuda_torch

    torch = cuda_torch()
    if torch is None:
        return None
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    x = torch.randn(case.x_shape, device="cuda")
    w = torch.randn(case.w_shape, device="cuda")
    return cuda_ms(
        lambda: torch.nn.functional.conv2d(x, w, stride=case.stride, padding=case.padding, groups=case.groups), reps)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--precision", default="highest", choices=["highest", "high"])
    p.add_argument("--json", default=None)
    args = p.parse_args()
    # Tuned afresh, as a new user's first call is (the cache directory is read per call).
    os.environ.setdefault("CONVTUNE_CACHE_DIR", tempfile.mkdtemp(prefix="convtune-strided-"))
    info = convtune.adapter_info()
    print(f"adapter: {info['name']} ({info['backend']}), families: {os.environ.get('CONVTUNE_FAMILIES', 'all')}")
    rows = []
    for case in STRIDED:
        spec = (case.x_shape, case.w_shape, case.stride, case.padding)
        report = convtune.tune(*spec, precision=args.precision)
        _, times = convtune.time_variant(*spec, variant=report.winner, reps=50, warmup=5, precision=args.precision)
        ms = statistics.median(times) * 1e3
        ref = cudnn_fp32_ms(case)
        ratio = f"  {ms / ref:.2f}x cuDNN fp32 ({ref:.3f} ms)" if ref else ""
        print(f"{case.label():36s} {report.winner:34s} {ms:.4f} ms  {case.flops() / ms / 1e9:5.1f} TFLOP/s"
              f"  tune {report.tuning_s:.1f} s{ratio}")
        rows.append({"shape": case.label(), "winner": report.winner, "ms": ms, "cudnn_fp32_ms": ref,
                     "tune_s": report.tuning_s})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"adapter": info["name"], "precision": args.precision,
                       "families": os.environ.get("CONVTUNE_FAMILIES"), "layers": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
