"""Tuning a model ahead from its ONNX file: seconds per model and per distinct problem, cold,
in every precision mode, and the tuned layers against a longer budget's winners.

Usage (needs torch, torchvision and onnx; nothing is downloaded):
    python benches/onnx_tune_ahead.py [--models resnet50 unet] [--batch 8]
        [--precisions highest high float16] [--long 10 --long-layers 6]

Exports torchvision's ResNet-50 (``weights=None``) and a UNet-class encoder-decoder (3x3
convs, max-pool downs, 2x2 stride-2 transposed-conv ups, skip concatenations) with
``torch.onnx.export``, then per model and mode runs ``convtune.tune_onnx`` in a fresh
tuning cache at the default budget and prints: distinct problems, total seconds, seconds
per problem (p50, max), and the model's conv time as tuned (the sum over nodes of the
winners' times). ``--long S``: the ``--long-layers`` problems with the largest tuned time
are tuned again at S seconds, and both winners timed in alternation (``time_variant``,
three rounds of 20 runs; median of the round medians): default-budget / long-budget time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import convtune


def unet(torch):
    nn = torch.nn

    def block(i, o):
        return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.ReLU(), nn.Conv2d(o, o, 3, padding=1), nn.ReLU())

    class UNet(nn.Module):
        def __init__(self, widths=(64, 128, 256, 512)):
            super().__init__()
            self.downs = nn.ModuleList()
            c = 3
            for w in widths:
                self.downs.append(block(c, w))
                c = w
            self.mid = block(c, 2 * c)
            self.ups = nn.ModuleList()
            self.merges = nn.ModuleList()
            c = 2 * c
            for w in reversed(widths):
                self.ups.append(nn.ConvTranspose2d(c, w, 2, stride=2))
                self.merges.append(block(2 * w, w))
                c = w
            self.head = nn.Conv2d(c, 2, 1)

        def forward(self, x):
            skips = []
            for d in self.downs:
                x = d(x)
                skips.append(x)
                x = nn.functional.max_pool2d(x, 2)
            x = self.mid(x)
            for up, merge, skip in zip(self.ups, self.merges, reversed(skips)):
                x = merge(torch.cat([up(x), skip], 1))
            return self.head(x)

    return UNet()


def export(name, path, batch):
    import torch
    import torchvision

    if name == "unet":
        model, size = unet(torch), 256
    else:
        model, size = getattr(torchvision.models, name)(weights=None), 224
    model.eval()
    with torch.no_grad():
        torch.onnx.export(model, torch.zeros(batch, 3, size, size), path, dynamo=False, opset_version=17)


def time_pair(a, b, row, dtype, rounds=3, reps=20):
    """Median of the round medians of ``a``'s and ``b``'s GPU times on ``row``'s problem."""
    times = {a: [], b: []}
    for _ in range(rounds):
        for v in (a, b):
            _, t = convtune.time_variant(row["x"], row["w"], variant=v, reps=reps, precision=row["precision"],
                                         dtype=dtype, **row["kw"])
            times[v].append(statistics.median(t) * 1e3)
    return statistics.median(times[a]), statistics.median(times[b])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["resnet50", "unet"],
                   help="torchvision network names, unet, or paths of .onnx files")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--precisions", nargs="+", default=["highest", "high", "float16"])
    p.add_argument("--long", type=float, default=0.0)
    p.add_argument("--long-layers", type=int, default=6)
    a = p.parse_args()
    from convtune import _onnx

    tmp = tempfile.mkdtemp(prefix="convtune-onnx-")
    print(f"# {convtune.adapter_info()['name']}, batch {a.batch}, default budget; cold tuning caches")
    print("| model | mode | distinct problems | tuning s | s per problem p50 / max | conv ms as tuned | as default |")
    print("|---|---|---|---|---|---|---|")
    long_rows = []
    for name in a.models:
        path = name if name.endswith(".onnx") else os.path.join(tmp, f"{name}.onnx")
        if path != name:
            export(name, path, a.batch)
        nodes = _onnx.conv_nodes(path, a.batch)
        for mode in a.precisions:
            os.environ["CONVTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="convtune-onnx-cache-")
            convtune._convtune._reset_tuning_state()
            half = mode == "float16"
            t = time.perf_counter()
            rows = convtune.tune_onnx(path, a.batch, None if half else mode, float16=half, progress=False)
            took = time.perf_counter() - t
            per = [r["tuning_s"] for r in rows]
            tuned = sum(len(r["nodes"]) * r["tuned_ms"] for r in rows if r["tuned_ms"])
            default = sum(len(r["nodes"]) * r["default_ms"] for r in rows if r["default_ms"])
            print(f"| {name} | {mode} | {len(rows)} | {took:.1f} | {statistics.median(per):.2f} / {max(per):.2f} | "
                  f"{tuned:.3f} | {default:.3f} |", flush=True)
            # Where the default rule loses most (what background mode runs until tuned).
            worst = sorted((r for r in rows if r["tuned_ms"] and r["default_ms"]),
                           key=lambda r: -len(r["nodes"]) * (r["default_ms"] - r["tuned_ms"]))[:3]
            for r in worst:
                print(f"|  | default loses | {r['shape']} x{len(r['nodes'])} | `{r['default_ms']:.4f}` ms | "
                      f"{r['default_ms'] / r['tuned_ms']:.1f}x | `{r['winner']}` | |", flush=True)
            if a.long > 0:
                by_problem = {n.names[0]: n for n in nodes}
                for r in sorted(rows, key=lambda r: -(r["tuned_ms"] or 0))[: a.long_layers]:
                    node = by_problem[r["nodes"][0]]
                    row = dict(x=node.x, w=node.w, kw=dict(node.kwargs), precision=None if half else mode)
                    long = convtune.tune(node.x, node.w, budget=a.long, force=True, precision=row["precision"],
                                         dtype="float16" if half else "float32", **row["kw"])
                    short_ms, long_ms = time_pair(r["winner"], long.winner, row, "float16" if half else "float32")
                    long_rows.append((name, mode, r["shape"], r["winner"], long.winner, short_ms, long_ms))
    if long_rows:
        print(f"\n# the problems with the largest tuned time, default budget against {a.long} s; GPU ms")
        print("| model | mode | problem | default-budget winner | long-budget winner | ms | long ms | ratio |")
        print("|---|---|---|---|---|---|---|---|")
        for name, mode, shape, w1, w2, t1, t2 in long_rows:
            print(f"| {name} | {mode} | {shape} | `{w1}` | `{w2}` | {t1:.4f} | {t2:.4f} | {t1 / t2:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
