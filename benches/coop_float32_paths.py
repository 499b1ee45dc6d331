"""float32 data in precision "high" on the tensor-core family: layout 1 (f16 conversion while
staging) against layouts 2 and 3 (a packed float16 copy written by a prologue after the max
pass), each against the same tile on float16 data. GPU machines only.

Usage: python benches/coop_float32_paths.py

Prints per layer and data (float16 NHWC, float32 NHWC, float32 NCHW) each tile's median GPU
ms of 7 runs (`convtune.time_variant`) and TFLOP/s (the direct method's FLOPs): the gap
between a tile's float16 and float32 times is what the max pass, the copies and the wider
output cost.
"""

from __future__ import annotations


import convtune
from timing import median_ms_or_why

LAYERS = [("EDSR", (1, 64, 720, 1280), (64, 64, 3, 3)), ("2,320,64,64", (2, 320, 64, 64), (320, 320, 3, 3)),
          ("32,256,14,14", (32, 256, 14, 14), (256, 256, 3, 3))]
TILES = ["coop_b128x64x16_s2x2_p1_l1", "coop_b128x128x16_s2x2_p1_l1", "coop_b512x64x16_s8x1_p1_l3",
         "coop_b256x128x16_s4x2_p1_l3", "coop_b256x64x32_s4x2_p1_l3", "coop_b128x128x64_s2x4_p1_l2",
         "coop_b128x64x16_s2x2_p1"]


def main():
    for label, (n, c, h, w), ws in LAYERS:
        flops = 2.0 * n * ws[0] * h * w * c * ws[2] * ws[3]
        for layout, dtype in [("NHWC", "float16"), ("NHWC", "float32"), ("NCHW", "float32")]:
            xs = (n, h, w, c) if layout == "NHWC" else (n, c, h, w)
            row = []
            for v in TILES:
                ms, _ = median_ms_or_why(xs, ws, 1, 1, variant=v, layout=layout, dtype=dtype,
                                         precision="high", reps=7, warmup=2)
                if ms is None:  # a tile this layout or adapter does not take
                    row.append(f"{v[5:]} -")
                    continue
                row.append(f"{v[5:]} {ms:.4f} ({flops / ms / 1e9:.0f})")
            print(f"{label} {layout} {dtype}: " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
