"""The small layers of networks at small batch, where tensor-core tiles leave the GPU idle:
per layer and mode, the kernel a cold default-budget tuning picks and its time, cuDNN's
kernel time, and what a long tuning finds (its five fastest candidates, their places in the
model's ranking, and the fastest small tile: 32x32 to 64x64 outputs per workgroup). Shows
whether a miss is the kernels' (nothing fast enough exists) or the ranking's (the fast one
ranks past a default budget's reach).

Usage (GPU machine, with torch): python benches/small_layers.py [--modes high float16]
    [--budget 15] [--only 0 3 ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vs_cudnn_networks import cudnn_ms, run_child  # noqa: E402

# (network layer, x shape, w shape, stride, padding) at batch 8, 224x224 networks.
LAYERS = [
    ("resnet50 1x1 1024->512", (8, 1024, 14, 14), (512, 1024, 1, 1), 1, 0),
    ("resnet50 1x1 256->128", (8, 256, 56, 56), (128, 256, 1, 1), 1, 0),
    ("resnet50 1x1 512->128", (8, 512, 28, 28), (128, 512, 1, 1), 1, 0),
    ("resnet50 1x1 2048->512", (8, 2048, 7, 7), (512, 2048, 1, 1), 1, 0),
    ("resnet50 3x3 128", (8, 128, 28, 28), (128, 128, 3, 3), 1, 1),
    ("resnet50 3x3 256", (8, 256, 14, 14), (256, 256, 3, 3), 1, 1),
    ("resnet50 3x3 512", (8, 512, 7, 7), (512, 512, 3, 3), 1, 1),
    ("efficientnet 1x1 1152->192", (8, 1152, 7, 7), (192, 1152, 1, 1), 1, 0),
    ("efficientnet 1x1 480->80", (8, 480, 14, 14), (80, 480, 1, 1), 1, 0),
]

SMALL = ("b32x32", "b64x32", "b32x64", "b64x64")

EXPLORE = r"""
import json, sys, numpy as np, convtune
p, mode, budget = json.loads(sys.argv[1])
kw = dict(stride=p["stride"][0], padding=p["padding"][0])
if mode == "float16":
    x = (p["x"][0], p["x"][2], p["x"][3], p["x"][1])
    kw.update(layout="NHWC", dtype="float16")
else:
    x = tuple(p["x"])
    kw.update(precision=mode)
r = convtune.tune(x, tuple(p["w"]), budget=budget, force=True, **kw)
rows = [(i, c["name"], c.get("runoff_ms") or c["median_ms"]) for i, c in enumerate(r.candidates)
        if c["status"] == "ok" and (c.get("runoff_ms") or c["median_ms"])]
print(json.dumps({"winner": r.winner, "timed": len(rows), "offered": len(r.candidates), "rows": rows}))
"""


def explore(p: dict, mode: str, budget: float) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, CONVTUNE_CACHE_DIR=cache, CONVTUNE_PROGRESS="0")
        r = subprocess.run([sys.executable, "-c", EXPLORE, json.dumps([p, mode, budget])],
                           capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", nargs="+", default=["high", "float16"])
    ap.add_argument("--budget", type=float, default=15.0, help="seconds of the long tuning per layer and mode")
    ap.add_argument("--only", nargs="*", type=int, default=[], help="indices into the layer list")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import convtune

    picked = [l for i, l in enumerate(LAYERS) if not a.only or i in a.only]
    probs = [{"x": list(x), "w": list(w), "stride": [s, s], "padding": [q, q], "dilation": [1, 1], "groups": 1, "count": 1}
             for _, x, w, s, q in picked]
    print(f"# {convtune.adapter_info()['name']}: small layers, default budget (cold) and a {a.budget:g} s tuning")
    print("| layer | mode | cuDNN ms | default ms (ratio) | default pick | long: 5 fastest (ms, rank) | fastest small tile (ms, rank) | timed / offered |")
    print("|---|---|---|---|---|---|---|---|")
    out = []
    for mode in a.modes:
        ours = run_child(probs, mode)["problems"]
        for (label, *_), p, o in zip(picked, probs, ours):
            c = cudnn_ms(p, mode)
            e = explore(p, mode, a.budget)
            rows = sorted(e["rows"], key=lambda r: r[2])
            top = ", ".join(f"`{n}` {ms:.4f} #{i}" for i, n, ms in rows[:5])
            small = next((f"`{n}` {ms:.4f} #{i}" for i, n, ms in rows if any(t in n for t in SMALL)), "-")
            print(f"| {label} | {mode} | {c:.4f} | {o['ms']:.4f} ({o['ms'] / c:.2f}) | `{o['variant']}` | {top} | {small} | "
                  f"{e['timed']} / {e['offered']} |", flush=True)
            out.append({"layer": label, "mode": mode, "cudnn_ms": c, "default": o, "long": e})
            if a.json:
                with open(a.json, "w") as f:
                    json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
