"""How a layer's time grows with its batch, per tile: whether its grid of workgroups leaves
the GPU room (the time stays flat from N/2 to N) or fills it (the time doubles with the
batch), and each tile's rate once the grid is full. GPU machines with tensor cores.

Usage: python benches/batch_scaling.py [--batches 16,32,64,128]
"""

from __future__ import annotations

import argparse

import convtune
from timing import median_ms_or_why

# (C, H, W) of a 3x3 stride-1 layer with K = C, and the tiles to time on it.
LAYERS = {
    (256, 14, 14): ["coop_b256x64x32_s4x2_p1_l3", "coop_b256x128x16_s4x2_p1_l4", "coop_b128x128x32_s2x4_p1_l2",
                    "coop_b128x256x32_s2x4_p1_l2"],
    (512, 7, 7): ["coop_b128x128x64_s2x4_p1_l2_k2", "coop_b128x128x64_s2x4_p1_l2", "coop_b128x256x16_s2x4_p1_l2",
                  "coop_b256x128x16_s4x2_p1_l2"],
    (128, 28, 28): ["coop_b256x128x16_s4x2_p1_l4"],
    (64, 56, 56): ["coop_b512x64x16_s8x1_p1_l4"],
}
MODES = {"float16": dict(layout="NHWC", dtype="float16"), "high": dict(precision="high")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="16,32,64,128")
    batches = [int(b) for b in ap.parse_args().batches.split(",")]
    for (c, h, w), tiles in LAYERS.items():
        for mode, kw in MODES.items():
            for v in tiles:
                row = []
                for n in batches:
                    xs = (n, h, w, c) if mode == "float16" else (n, c, h, w)
                    ms, why = median_ms_or_why(xs, (c, c, 3, 3), 1, 1, variant=v, reps=30, warmup=5, **kw)
                    if ms is None:
                        row.append(f"N{n} - ({why[:40]})")
                        continue
                    row.append(f"N{n} {ms:.4f} ms ({2 * n * c * h * w * c * 9 / ms / 1e9:.0f} TFLOP/s)")
                print(f"{c},{h},{w} -> {c} 3x3 {mode} {v}: " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
