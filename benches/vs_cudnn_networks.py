"""Whole networks against cuDNN: every Conv2d of a torchvision network (random weights, no
download; problems found with forward hooks at 224x224), timed kernel against kernel in each
precision mode, a network's conv time being the sum over its layers of count x time.

Per network, batch size and mode, a fresh process with a fresh tuning cache makes one cold
first pass over the network's convolutions at the default settings (`CONVTUNE_TUNE=auto`,
the default budget; the pass's seconds are printed), waits for any tuning still under way,
then times each distinct problem's chosen kernel (`time_variant`: timestamp queries, median
of 30). cuDNN is timed as `benches/vs_cudnn.py` times it (`cudnn.benchmark` on, runs queued
behind a sleep kernel so that host launch time is not counted, median of 50): fp32 with
TF32 off against "highest", TF32 against "high", fp16 channels-last against float16 NHWC.

Usage (GPU machine, with torch and torchvision):
    python benches/vs_cudnn_networks.py [--networks resnet50 mobilenet_v3_large efficientnet_b0]
        [--batch 1 8] [--modes highest high float16] [--json out.json] [--worst 5]
Prints per network, batch and mode: distinct problems / layers, the conv-time ratio to
cuDNN, TFLOP/s of both, the cold first pass's seconds and the worst layers by ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

from convtune._shapes import Shape

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from first_call import network_convs  # noqa: E402
from vs_cudnn import cuda_ms  # noqa: E402

CUDNN_MODE = {"highest": "fp32", "high": "tf32", "float16": "fp16"}


def pair(v):
    return v[0] if v[0] == v[1] else tuple(v)


def child(job: dict) -> dict:
    """In a fresh process: the cold first pass at default settings, then each problem's
    chosen kernel timed."""
    import time

    import convtune

    mode = job["mode"]
    rng = np.random.default_rng(1)
    layers = []
    for p in job["problems"]:
        xs, ws = p["x"], p["w"]
        fan_in = int(np.prod(ws[1:]))
        x = rng.standard_normal(xs).astype(np.float32)
        w = (rng.standard_normal(ws) / np.sqrt(fan_in)).astype(np.float32)
        kw = dict(stride=pair(p["stride"]), padding=pair(p["padding"]), dilation=pair(p["dilation"]), groups=p["groups"])
        # A transposed problem (`layer_classes.py`): w is (C, K / groups, R, S).
        if p.get("transposed"):
            kw.update(output_padding=pair(p["output_padding"]))
        if mode == "float16":
            x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).astype(np.float16)
            w = w.astype(np.float16)
            call = dict(kw, layout="NHWC")
            spec_kw = dict(kw, layout="NHWC", dtype="float16")
        elif job.get("nhwc"):
            x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
            call = dict(kw, precision=mode, layout="NHWC")
            spec_kw = dict(call)
        else:
            call = dict(kw, precision=mode)
            spec_kw = dict(kw, precision=mode)
        conv = convtune.conv2d
        if p.get("transposed"):
            conv = convtune.conv_transpose2d
            spec_kw = dict(spec_kw, transposed=True)
        layers.append((x, w, call, spec_kw, p["count"], conv))
    t0 = time.perf_counter()
    for x, w, call, _, count, conv in layers:
        for _ in range(count):
            conv(x, w, **call)
    first_pass = time.perf_counter() - t0
    convtune.wait_tuning()
    out = []
    for x, w, _, spec_kw, _, _ in layers:
        e = convtune.explain(x.shape, w.shape, **spec_kw)
        _, times = convtune.time_variant(x.shape, w.shape, variant=e.variant, reps=30, warmup=5, **spec_kw)
        out.append({"variant": e.variant, "source": e.source, "ms": statistics.median(times) * 1e3})
    return {"first_pass_s": first_pass, "problems": out}


def cudnn_ms(p: dict, mode: str, nhwc: bool = False) -> float:
    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.benchmark = True
    rng = np.random.default_rng(1)
    x = torch.from_numpy(rng.standard_normal(p["x"]).astype(np.float32)).cuda()
    w = torch.from_numpy(rng.standard_normal(p["w"]).astype(np.float32)).cuda()
    kw = dict(stride=tuple(p["stride"]), padding=tuple(p["padding"]), dilation=tuple(p["dilation"]), groups=p["groups"])
    conv = F.conv2d
    if p.get("transposed"):
        conv = F.conv_transpose2d
        kw.update(output_padding=tuple(p["output_padding"]))
    tf32 = mode == "high"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    if mode == "float16":
        x = x.half().to(memory_format=torch.channels_last)
        w = w.half().to(memory_format=torch.channels_last)
    elif nhwc:
        x = x.to(memory_format=torch.channels_last)
        w = w.to(memory_format=torch.channels_last)
    with torch.no_grad():
        ms = cuda_ms(lambda: conv(x, w, **kw))
    torch.backends.cudnn.allow_tf32 = False
    return ms


def problems_of(network: str, batch: int) -> list:
    return [
        {"x": list(xs), "w": list(ws), "stride": list(st), "padding": list(pad), "dilation": list(dil), "groups": g, "count": count}
        for (xs, ws, st, pad, dil, g), count in network_convs(network, batch).items()
    ]


def run_child(problems: list, mode: str, nhwc: bool = False) -> dict:
    """``child`` in a fresh process with a fresh cache; ``nhwc``: float32 modes run
    channels-last too (float16 always does)."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, CONVTUNE_CACHE_DIR=cache, CONVTUNE_PROGRESS="0")
        job = json.dumps({"problems": problems, "mode": mode, "nhwc": nhwc})
        r = subprocess.run([sys.executable, __file__, "--child", job], capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"child failed ({mode}): {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def report(network: str, batch: int, mode: str, problems: list, ours: dict, theirs: list, worst: int) -> dict:
    rows = []
    for p, o, c in zip(problems, ours["problems"], theirs):
        f = Shape(tuple(p["x"]), tuple(p["w"]), tuple(p["stride"]), tuple(p["padding"]), tuple(p["dilation"]), p["groups"]).flops()
        rows.append(dict(p, ms=o["ms"], cudnn_ms=c, variant=o["variant"], source=o["source"], flops=f, ratio=o["ms"] / c))
    total = sum(r["count"] * r["ms"] for r in rows)
    total_cudnn = sum(r["count"] * r["cudnn_ms"] for r in rows)
    work = sum(r["count"] * r["flops"] for r in rows)
    ratio = total / total_cudnn
    layers = sum(r["count"] for r in rows)
    print(f"| {network} | {batch} | {mode} | {len(rows)} / {layers} | **{ratio:.2f}** | {total:.3f} / {total_cudnn:.3f} | "
          f"{work / total / 1e9:.1f} / {work / total_cudnn / 1e9:.1f} | {ours['first_pass_s']:.1f} |", flush=True)
    for r in sorted(rows, key=lambda r: -r["ratio"])[:worst]:
        label = f"{'x'.join(map(str, r['x']))} k{r['w'][0]} {r['w'][2]}x{r['w'][3]} s{r['stride'][0]} g{r['groups']} (x{r['count']})"
        print(f"|  |  |  | {label} | {r['ratio']:.2f} | {r['ms']:.4f} / {r['cudnn_ms']:.4f} | `{r['variant']}` | |", flush=True)
    return {"network": network, "batch": batch, "mode": mode, "ratio": ratio, "ms": total, "cudnn_ms": total_cudnn,
            "first_pass_s": ours["first_pass_s"], "rows": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--networks", nargs="+", default=["resnet50", "mobilenet_v3_large", "efficientnet_b0"])
    p.add_argument("--batch", nargs="+", type=int, default=[1, 8])
    p.add_argument("--modes", nargs="+", default=["highest", "high", "float16"], choices=sorted(CUDNN_MODE))
    p.add_argument("--worst", type=int, default=5)
    p.add_argument("--json", help="write every layer's times here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return 0
    import convtune

    print(f"# {convtune.adapter_info()['name']}: conv time against cuDNN (kernel time), default budget, cold first pass")
    print("| network | batch | mode | problems / layers | ratio | ms ours / cuDNN | TFLOP/s ours / cuDNN | first pass s |")
    print("|---|---|---|---|---|---|---|---|")
    results = []
    for network in a.networks:
        for batch in a.batch:
            problems = problems_of(network, batch)
            for mode in a.modes:
                theirs = [cudnn_ms(q, mode) for q in problems]
                results.append(report(network, batch, mode, problems, run_child(problems, mode), theirs, a.worst))
                # After each row: a run cut short (a machine's time limit) keeps what it measured.
                if a.json:
                    with open(a.json, "w") as f:
                        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
