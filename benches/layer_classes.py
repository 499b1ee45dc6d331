"""Layer classes against cuDNN: 5x5, dilated, depthwise, grouped and transposed layers taken
from known networks (outside the project's suites), each tuned cold at the default budget in a fresh
process per mode and timed kernel against kernel, as `vs_cudnn_networks.py` times a network's
layers ("highest" against fp32 with TF32 off, "high" against TF32, float16 NHWC against fp16
channels-last). Prints one row per layer and mode: both times, the ratio (lower is better) and
the kernel chosen.

Usage (GPU machine, with torch): python benches/layer_classes.py [--modes highest high float16]
    [--only dilated ...] [--nhwc]  (--nhwc: the float32 modes channels-last too, against cuDNN's
    channels-last, so that float16 and float32 compare in one layout)
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vs_cudnn_networks import cudnn_ms, run_child  # noqa: E402

# (class, x shape, w shape, stride, padding, dilation, groups[, output_padding: transposed,
# w then (C, K / groups, R, S)])
LAYERS = [
    ("5x5", (32, 64, 27, 27), (192, 64, 5, 5), 1, 2, 1, 1),  # AlexNet's second conv, batch 32
    ("5x5", (8, 48, 56, 56), (64, 48, 5, 5), 1, 2, 1, 1),  # an Inception-class 5x5 branch
    ("dilated", (8, 512, 28, 28), (512, 512, 3, 3), 1, 2, 2, 1),  # DeepLab-class, d2
    ("dilated", (1, 512, 64, 64), (512, 512, 3, 3), 1, 2, 2, 1),  # segmentation backbone, d2
    ("dilated", (1, 512, 64, 64), (512, 512, 3, 3), 1, 4, 4, 1),  # segmentation backbone, d4
    ("dilated", (1, 256, 64, 64), (256, 256, 3, 3), 1, 12, 12, 1),  # an ASPP head, d12
    ("depthwise", (32, 144, 56, 56), (144, 1, 3, 3), 1, 1, 1, 144),  # MobileNetV2, batch 32
    ("depthwise", (32, 96, 112, 112), (96, 1, 3, 3), 2, 1, 1, 96),  # MobileNetV2's stride-2, batch 32
    ("depthwise", (8, 240, 28, 28), (240, 1, 5, 5), 1, 2, 1, 240),  # EfficientNet-B0's 5x5, batch 8
    ("grouped", (8, 256, 56, 56), (256, 8, 3, 3), 1, 1, 1, 32),  # ResNeXt-50 32x4d
    ("transposed", (8, 256, 32, 32), (256, 256, 3, 3), 1, 2, 2, 1, 0),  # dilated, stride 1
    ("transposed", (8, 256, 16, 16), (256, 128, 3, 3), 2, 1, 1, 1, 1),  # a decoder's upsampler
    ("transposed", (16, 512, 8, 8), (512, 256, 4, 4), 2, 1, 1, 1, 0),  # DCGAN's generator, 512 -> 256
    ("transposed", (8, 128, 32, 32), (128, 64, 3, 3), 2, 2, 2, 1, 1),  # dilated d2 at stride 2 (spread-out kernel)
]


def problems(only: list) -> list:
    out = []
    for c, x, w, s, p, d, g, *op in LAYERS:
        if only and c not in only:
            continue
        q = {"class": c, "x": list(x), "w": list(w), "stride": [s, s], "padding": [p, p], "dilation": [d, d], "groups": g, "count": 1}
        if op:
            q.update(transposed=True, output_padding=[op[0], op[0]])
        out.append(q)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", nargs="+", default=["highest", "high", "float16"])
    p.add_argument("--only", nargs="*", default=[], help="classes to run (5x5, dilated, depthwise, grouped, transposed)")
    p.add_argument("--nhwc", action="store_true", help="float32 modes in NHWC (and cuDNN channels-last)")
    a = p.parse_args()
    import convtune

    probs = problems(a.only)
    print(f"# {convtune.adapter_info()['name']}: layer classes against cuDNN (kernel time), default budget, cold")
    print("| class | layer | mode | ours ms | cuDNN ms | ratio | kernel |")
    print("|---|---|---|---|---|---|---|")
    for mode in a.modes:
        theirs = [cudnn_ms(q, mode, a.nhwc) for q in probs]
        ours = run_child(probs, mode, a.nhwc)["problems"]
        for q, o, c in zip(probs, ours, theirs):
            k = q["w"][1] * q["groups"] if q.get("transposed") else q["w"][0]
            label = f"{'x'.join(map(str, q['x']))} k{k} {q['w'][2]}x{q['w'][3]} s{q['stride'][0]} d{q['dilation'][0]} g{q['groups']}"
            if q.get("transposed"):
                label += f" T op{q['output_padding'][0]}"
            shown = mode if mode == "float16" or not a.nhwc else f"{mode} NHWC"
            print(f"| {q['class']} | {label} | {shown} | {o['ms']:.4f} | {c:.4f} | **{o['ms'] / c:.2f}** | `{o['variant']}` |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
