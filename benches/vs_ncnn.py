"""convtune against ncnn's Vulkan backend on the same GPU, shape by shape.

Usage (GPU machine): run ncnn's harness first (`../shared/peers/ncnn_conv`, README there:
it writes `ncnn.json`), then

    python benches/vs_ncnn.py --ncnn $OUT/ncnn.json --json out.json --markdown out.md

For every shape of that file (batch 1) it tunes convtune at the default budget and times
the winner's GPU time (timestamp queries, median of 50, w resident as ncnn's weights are),
in `"highest"` against ncnn fp32 and on float16 data (channels-last) against ncnn fp16.
ncnn's harness gives two bounds on its GPU time (`gpu_ms`, an upper bound with its
recording; `gpu_ms_lo`, a lower one); the verdict compares against the lower bound where
the two agree within 25% (the large layers) and against the upper one elsewhere (its lower
bound breaks down on small layers). err is convtune's max relative error against float64
(PyTorch on the GPU where present, else numpy for shapes under 1 GFLOP).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from typing import Optional

import numpy as np

import convtune
from convtune.reference import conv2d_reference

# Where the two ncnn bounds agree this closely, the lower one is its GPU time.
AGREE = 1.25
MODES = {"fp32": dict(precision="highest"), "fp16": dict(layout="NHWC", dtype="float16")}


def ncnn_bound(r: dict) -> Optional[float]:
    """The ncnn time to beat: its lower bound where the bounds agree, else its upper one."""
    hi, lo = r.get("gpu_ms"), r.get("gpu_ms_lo")
    if hi is None:
        return None
    return lo if lo is not None and 0 < lo and hi <= AGREE * lo else hi


def reference(xs, ws, sh, x, w) -> Optional[np.ndarray]:
    kw = dict(stride=sh["stride"], padding=sh["pad"], dilation=sh["dilation"], groups=sh["groups"])
    try:
        import torch

        if torch.cuda.is_available():
            return torch.nn.functional.conv2d(torch.from_numpy(x).cuda().double(),
                                              torch.from_numpy(w).cuda().double(), **kw).cpu().numpy()
    except ImportError:
        pass
    gflop = 2 * np.prod(xs) * ws[0] * np.prod(ws[1:]) / sh["stride"] ** 2 / 1e9
    return conv2d_reference(x, w, **kw) if gflop < 1 else None


def convtune_case(sh: dict, precision: str) -> dict:
    xs = (sh["N"], sh["C"], sh["H"], sh["W"])
    ws = (sh["K"], sh["C"] // sh["groups"], sh["R"], sh["S"])
    mode = MODES[precision]
    half = precision == "fp16"
    rng = np.random.default_rng(3)
    dt = np.float16 if half else np.float32
    x = rng.standard_normal(xs).astype(dt)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(dt)
    to = (lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 1))) if half else (lambda a: a)
    spec = (to(x).shape, ws, sh["stride"], sh["pad"], sh["dilation"], sh["groups"])
    report = convtune.tune(*spec, force=True, **mode)
    _, times = convtune.time_variant(*spec, variant=report.winner, reps=50, warmup=5, **mode)
    y = convtune.conv2d(to(x), w, stride=sh["stride"], padding=sh["pad"], dilation=sh["dilation"],
                        groups=sh["groups"], **{k: v for k, v in mode.items() if k != "dtype"})
    ref = reference(xs, ws, sh, x, w)
    y = y.transpose(0, 3, 1, 2) if half else y
    err = None if ref is None else float(np.abs(y.astype(np.float64) - ref).max() / np.abs(ref).max())
    return {"winner": report.winner, "ms": statistics.median(times) * 1e3, "err": err}


def markdown(rows: list, meta: dict) -> str:
    out = [
        "# convtune against ncnn (Vulkan, same GPU)", "",
        f"Measured {meta['date']} on **{meta['adapter']}**, convtune commit `{meta['commit']}`, "
        f"ncnn {meta['ncnn_version']}. ncnn ms: its harness's lower - upper bound on GPU time; "
        "convtune ms: the tuned winner's GPU time (default budget). Verdict: convtune below "
        f"ncnn's lower bound where the two agree within {AGREE}x, below its upper bound elsewhere.", "",
        "| shape | mode | ncnn ms | convtune ms (winner) | convtune / ncnn | verdict | err | ncnn err |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lo = "-" if r["ncnn_lo"] is None else f"{r['ncnn_lo']:.4f}"
        hi = "-" if r["ncnn_hi"] is None else f"{r['ncnn_hi']:.4f}"
        ratio = "-" if r["bound"] is None else f"{r['ms'] / r['bound']:.2f}"
        verdict = "-" if r["bound"] is None else ("faster" if r["ms"] < r["bound"] else "**slower**")
        err = "-" if r["err"] is None else f"{r['err']:.1e}"
        nerr = "-" if r["ncnn_err"] is None else f"{r['ncnn_err']:.1e}"
        mode = "highest" if r["precision"] == "fp32" else "float16 NHWC"
        out.append(f"| {r['label']} | {r['precision']} / {mode} | {lo} - {hi} | {r['ms']:.4f} (`{r['winner']}`) "
                   f"| {ratio} | {verdict} | {err} | {nerr} |")
    faster = sum(1 for r in rows if r["bound"] is not None and r["ms"] < r["bound"])
    timed = sum(1 for r in rows if r["bound"] is not None)
    out += ["", f"**Faster than ncnn on {faster} of {timed}** shape and precision pairs ncnn timed."]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ncnn", required=True, help="ncnn.json written by ../shared/peers/ncnn_conv/run.py")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--markdown", help="write the table here")
    args = ap.parse_args()
    doc = json.load(open(args.ncnn))
    rows = []
    for r in doc["results"]:
        sh = dict(r["shape"], label=r["label"])
        if sh["N"] != 1 or r["precision"] not in MODES or r.get("gpu_ms") is None and r.get("e2e_ms") is None:
            continue
        ours = convtune_case(sh, r["precision"])
        err = r.get("err")
        row = {"label": r["label"], "precision": r["precision"], "ncnn_hi": r.get("gpu_ms"),
               "ncnn_lo": r.get("gpu_ms_lo"), "bound": ncnn_bound(r), "ncnn_err": err if isinstance(err, float) else None,
               **ours}
        rows.append(row)
        print(f"{row['label']:24s} {row['precision']}: ncnn {row['ncnn_lo']} - {row['ncnn_hi']} ms, "
              f"convtune {row['ms']:.4f} ms ({row['winner']})", flush=True)
    meta = {"date": datetime.date.today().isoformat(), "adapter": convtune.adapter_info()["name"],
            "commit": os.environ.get("CONVTUNE_COMMIT", "unknown"),
            "ncnn_version": doc.get("ncnn_version", doc.get("version", "?"))}
    if args.json:
        json.dump({"meta": meta, "rows": rows}, open(args.json, "w"), indent=1)
    if args.markdown:
        open(args.markdown, "w").write(markdown(rows, meta))
    print(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
