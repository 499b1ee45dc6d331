"""Upsampling layers: convtune's transposed convolutions against cuDNN, and its fused
pixel-shuffle store against the same conv without it and against PyTorch end to end.

Usage (on the GPU machine, where PyTorch with CUDA is installed; not run there yet: estimated
a few minutes on an H100, most of it tuning 30 problems at the default budget):
    CONVTUNE_COMMIT=$(git rev-parse --short HEAD) python benches/upsample_vs_torch.py
Without PyTorch or CUDA it times convtune alone (the torch columns are empty, with a note on
stderr); `--smoke` runs tiny shapes at budget 0 in the first mode only, as CI does on lavapipe
(benches/test_upsample_vs_torch.py).

Every problem is measured in each precision mode (`--modes`, default all three), against
cuDNN in the matching one, as benches/vs_cudnn.py does: "highest" (float32-class) against
cuDNN fp32 with TF32 off, "high" (TF32-class) against cuDNN with TF32 on, "float16"
(float16 data, both sides channels-last: convtune `layout="NHWC"`, PyTorch
`channels_last`) against cuDNN fp16. convtune's problems are tuned afresh at the default
budget (`force=True`; `--budget` to change it), then the winner's GPU time is the median of
`--reps` runs from timestamp queries (`convtune.time_variant`, through `_sweep.Tuned`, as the
sweeps measure); cuDNN's is the median of 50 CUDA-event-timed runs with `cudnn.benchmark`
(`vs_cudnn.cuda_ms`).

Decoder layers, `convtune.conv_transpose2d` against `torch.nn.functional.conv_transpose2d`:
    32,128,28,28 -> 64, 4x4, stride 2, p1          (a DCGAN/U-Net style x2 layer)
    1,256,64,64  -> 128, 2x2, stride 2              (U-Net's up-convolution)
    8,512,16,16  -> 256, 3x3, stride 2, p1, op1     (x2 with a 3x3 kernel)
FLOPs of a transposed convolution = 2 * N * C * H * W * (K/groups) * R * S: each input
element meets each weight of its group once. Beside each, the GPU time of a plain convtune
`conv2d` of exactly the same FLOPs: the stride-1 conv of the transposed conv's input grid
with the same kernel size, C -> K, groups and `padding="same"` (N, C, H, W) -> (N, K, H, W).
It reads the same x and the same number of weights and does the same multiply-adds, input
pixel by input pixel, as the transposed conv; what differs is the output, stride² times
larger for the transposed conv (each of its outputs sums only its stride phase's taps), and
the gather's irregular access. "vs conv" = transposed GPU time / that conv's GPU time: the
price of the transposition at equal arithmetic.

Upsamplers, conv 3x3 p1 then pixel shuffle (ESPCN/EDSR):
    1,64,360,640 -> 256, then shuffle 2   (-> 1,64,720,1280)
    1,64,180,320 -> 1024, then shuffle 4  (-> 1,64,720,1280)
GPU time of `conv2d(..., pixel_shuffle=r)` (the shuffle fused into the store) against the
same conv without the shuffle, both tuned (target: fused / plain <= 1.05); then wall time
end to end, median of `--e2e-reps` after 0.2 s of warm-up calls: numpy in -> numpy out (convtune's
`conv2d` on numpy arrays; PyTorch `torch.from_numpy(x).cuda()`, likewise w,
`F.pixel_shuffle(F.conv2d(...), r)`, `.cpu().numpy()`: the H2D and D2H copies included),
and on device tensors (a `convtune.Tensor` from `to_device` against a CUDA tensor, w on the
device on both sides: a `convtune.Tensor` and a CUDA tensor; each timed
from a synchronised start to `convtune.synchronize()` / `torch.cuda.synchronize()`).

err: max relative error of convtune's result against a float64 reference on the same inputs
(PyTorch's on the GPU where it has CUDA, else convtune.reference, with --smoke only).

Prints one table per part and writes JSON (`--out`, default
benches/results/upsample/upsample_vs_torch_<commit>.json, the commit from CONVTUNE_COMMIT or git).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional

import numpy as np

import convtune
from convtune import _sweep
from convtune.__main__ import _table
from convtune._shapes import Shape, parse_spec
from convtune.reference import conv2d_reference, conv_transpose2d_reference, pixel_shuffle_reference

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from vs_cudnn import cuda_ms, rel_err  # noqa: E402

MODES = ("highest", "high", "float16")

DECODERS = [
    "32x128x28x28 k64 4x4 s2 p1 T",
    "1x256x64x64 k128 2x2 s2 p0 T",
    "8x512x16x16 k256 3x3 s2 p1 T op1",
]
UPSAMPLERS = [
    "1x64x360x640 k256 3x3 s1 p1 ps2",
    "1x64x180x320 k1024 3x3 s1 p1 ps4",
]
# The same kinds of problem, small enough for lavapipe.
SMOKE_DECODERS = [
    "1x8x6x6 k4 4x4 s2 p1 T",
    "1x8x5x5 k4 2x2 s2 p0 T",
    "2x8x4x4 k4 3x3 s2 p1 T op1",
]
SMOKE_UPSAMPLERS = [
    "1x4x6x8 k16 3x3 s1 p1 ps2",
    "1x4x5x6 k32 3x3 s1 p1 ps4",
]


# --- shapes ------------------------------------------------------------------------------

def in_mode(shape: Shape, mode: str) -> Shape:
    """The problem as timed in ``mode``: float16 data is channels-last, as cuDNN's fp16 is."""
    return replace(shape, dtype="float16", layout="NHWC") if mode == "float16" else shape


def precision_of(mode: str) -> Optional[str]:
    return None if mode == "float16" else mode  # float16 data sets its own


def same_flop_conv(t: Shape) -> Shape:
    """The plain conv of a transposed one's FLOPs (module doc): stride 1 over its input grid,
    the same kernel size, C -> K, groups, padding "same"."""
    assert t.transposed and t.dilation == (1, 1)
    n, c, h, w = t.x
    _, kg, r, s = t.w
    return Shape(x=t.x, w=(kg * t.groups, c // t.groups, r, s), padding="same", groups=t.groups,
                 bias=t.bias, layout=t.layout, dtype=t.dtype)


def data(shape: Shape, seed: int = 0):
    """Inputs of ``shape`` as NCHW arrays (float16 in float16 mode), w scaled by its fan-in."""
    rng = np.random.default_rng(seed)
    dt = np.float16 if shape.dtype == "float16" else np.float32
    _, _, r, s = shape.w
    if shape.transposed:  # each output sums about (C/groups) R S / stride² products
        fan_in = max(1, shape.x[1] // shape.groups * r * s // (shape.stride[0] * shape.stride[1]))
    else:
        fan_in = shape.w[1] * r * s
    x = rng.standard_normal(shape.x).astype(dt)
    w = (rng.standard_normal(shape.w) / np.sqrt(fan_in)).astype(dt)
    return x, w


def to_layout(a: np.ndarray, layout: str) -> np.ndarray:
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1)) if layout == "NHWC" else a


def from_layout(a: np.ndarray, layout: str) -> np.ndarray:
    return a.transpose(0, 3, 1, 2) if layout == "NHWC" else a


def conv_kwargs(shape: Shape) -> Dict[str, Any]:
    kw: Dict[str, Any] = dict(stride=shape.stride, padding=shape.padding, groups=shape.groups,
                              dilation=shape.dilation)
    if shape.transposed:
        kw["output_padding"] = shape.output_padding
    return kw


def convtune_call(shape: Shape, x: Any, w: Any, mode: str) -> Any:
    """convtune's call for the problem (x numpy in the layout's order, or a Tensor)."""
    kw = conv_kwargs(shape)
    kw.update(layout=shape.layout, precision=precision_of(mode))
    if shape.transposed:
        return convtune.conv_transpose2d(x, w, **kw)
    return convtune.conv2d(x, w, pixel_shuffle=shape.pixel_shuffle, **kw)


# --- PyTorch -----------------------------------------------------------------------------

def torch_cuda():
    """The torch module where it has CUDA, else None (with a note on stderr)."""
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: timing convtune only (the torch columns stay empty)", file=sys.stderr)
        return None
    if not torch.cuda.is_available():
        print("PyTorch has no CUDA device: timing convtune only (the torch columns stay empty)", file=sys.stderr)
        return None
    torch.backends.cudnn.benchmark = True
    return torch


def torch_mode(torch, mode: str) -> None:
    tf32 = mode == "high"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32


def torch_op(shape: Shape) -> Callable:
    """PyTorch's computation of the problem on NCHW-indexed CUDA tensors."""
    import torch.nn.functional as F

    kw = conv_kwargs(shape)
    if shape.transposed:
        return lambda x, w: F.conv_transpose2d(x, w, **kw)
    if shape.pixel_shuffle != 1:
        return lambda x, w: F.pixel_shuffle(F.conv2d(x, w, **kw), shape.pixel_shuffle)
    return lambda x, w: F.conv2d(x, w, **kw)


def torch_tensors(torch, shape: Shape, x: np.ndarray, w: np.ndarray):
    """x and w (NCHW numpy) on the GPU; channels-last in float16 mode."""
    xt, wt = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
    if shape.dtype == "float16":
        xt, wt = xt.to(memory_format=torch.channels_last), wt.to(memory_format=torch.channels_last)
    return xt, wt


def reference(torch, shape: Shape, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """float64 result of the problem (NCHW) on the same inputs."""
    if torch is not None:
        xt, wt = torch.from_numpy(x).cuda().double(), torch.from_numpy(w).cuda().double()
        return torch_op(shape)(xt, wt).cpu().numpy()
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    if shape.transposed:
        return conv_transpose2d_reference(x64, w64, shape.stride, shape.padding, shape.output_padding,
                                          shape.groups, shape.dilation)
    y = conv2d_reference(x64, w64, shape.stride, shape.padding, shape.dilation, shape.groups)
    return pixel_shuffle_reference(y, shape.pixel_shuffle) if shape.pixel_shuffle != 1 else y


def wall_ms(fn: Callable[[], Any], sync: Callable[[], None], reps: int, warm_s: float = 0.2) -> float:
    """Median wall milliseconds of ``fn`` from a synchronised start to ``sync()``, after
    ``warm_s`` seconds of warm-up calls (at least one): the GPU at load clocks for either
    side, whatever ran before."""
    end = time.perf_counter() + warm_s
    while True:
        fn()
        sync()
        if time.perf_counter() >= end:
            break
    out = []
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t)
    return statistics.median(out) * 1e3


# --- measurements ------------------------------------------------------------------------

def decoder_row(shape: Shape, mode: str, tuned: _sweep.Tuned, torch, check: bool) -> Dict[str, Any]:
    s = in_mode(shape, mode)
    ct = tuned(s)
    conv = tuned(same_flop_conv(s))
    row: Dict[str, Any] = {
        "shape": s.label(), "mode": mode, "flops": s.flops(),
        "winner": ct["variant"], "gpu_ms": ct["seconds"] * 1e3, "cv": ct["cv"],
        "tflops": s.flops() / ct["seconds"] / 1e12,
        "same_flop_conv": same_flop_conv(s).label(), "conv_winner": conv["variant"],
        "conv_gpu_ms": conv["seconds"] * 1e3, "vs_conv": ct["seconds"] / conv["seconds"],
        "cudnn_ms": None, "ratio": None, "err": None,
    }
    x, w = data(s)
    if torch is not None:
        torch_mode(torch, mode)
        xt, wt = torch_tensors(torch, s, x, w)
        op = torch_op(s)
        row["cudnn_ms"] = cuda_ms(lambda: op(xt, wt))
        row["ratio"] = row["gpu_ms"] / row["cudnn_ms"]
        torch_mode(torch, "highest")
    if check:
        y = convtune_call(s, to_layout(x, s.layout), w, mode)
        row["err"] = rel_err(from_layout(y, s.layout), reference(torch, s, x, w))
    return row


def upsampler_row(shape: Shape, mode: str, tuned: _sweep.Tuned, torch, check: bool,
                  e2e_reps: int) -> Dict[str, Any]:
    s = in_mode(shape, mode)
    fused = tuned(s)
    plain = tuned(replace(s, pixel_shuffle=1))
    row: Dict[str, Any] = {
        "shape": s.label(), "mode": mode, "flops": s.flops(),
        "winner": fused["variant"], "gpu_ms": fused["seconds"] * 1e3, "cv": fused["cv"],
        "plain_winner": plain["variant"], "plain_gpu_ms": plain["seconds"] * 1e3,
        "fused_over_plain": fused["seconds"] / plain["seconds"],
        "tflops": s.flops() / fused["seconds"] / 1e12,
        "e2e_numpy_ms": None, "torch_e2e_numpy_ms": None,
        "e2e_device_ms": None, "torch_e2e_device_ms": None, "err": None,
    }
    x, w = data(s)
    xl = to_layout(x, s.layout)
    row["e2e_numpy_ms"] = wall_ms(lambda: convtune_call(s, xl, w, mode), lambda: None, e2e_reps)
    xd, wd = convtune.to_device(xl, s.layout), convtune.to_device(w)
    row["e2e_device_ms"] = wall_ms(lambda: convtune_call(s, xd, wd, mode), convtune.synchronize, e2e_reps)
    if torch is not None:
        torch_mode(torch, mode)
        op = torch_op(s)

        def numpy_round_trip():
            xt, wt = torch.from_numpy(xl).cuda(), torch.from_numpy(w).cuda()
            if s.layout == "NHWC":  # the NHWC array as a channels-last NCHW tensor, and back
                xt, wt = xt.permute(0, 3, 1, 2), wt.to(memory_format=torch.channels_last)
                return op(xt, wt).permute(0, 2, 3, 1).cpu().numpy()
            return op(xt, wt).cpu().numpy()

        row["torch_e2e_numpy_ms"] = wall_ms(numpy_round_trip, torch.cuda.synchronize, e2e_reps)
        xt, wt = torch_tensors(torch, s, x, w)
        row["torch_e2e_device_ms"] = wall_ms(lambda: op(xt, wt), torch.cuda.synchronize, e2e_reps)
        torch_mode(torch, "highest")
    if check:
        y = convtune_call(s, xl, w, mode)
        row["err"] = rel_err(from_layout(y, s.layout), reference(torch, s, x, w))
    return row


def fmt(v: Optional[float], spec: str = ".3f", suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def decoder_table(rows: List[Dict[str, Any]]) -> str:
    return _table(
        ["transposed conv", "mode", "winner", "GPU ms", "cuDNN ms", "ratio", "TFLOP/s", "conv ms", "vs conv", "err"],
        [[r["shape"], r["mode"], r["winner"], fmt(r["gpu_ms"]), fmt(r["cudnn_ms"]), fmt(r["ratio"], ".2f"),
          fmt(r["tflops"], ".3g"), fmt(r["conv_gpu_ms"]), fmt(r["vs_conv"], ".2f"), fmt(r["err"], ".1e")]
         for r in rows],
    )


def upsampler_table(rows: List[Dict[str, Any]]) -> str:
    return _table(
        ["conv + pixel shuffle", "mode", "winner", "fused ms", "plain ms", "fused/plain",
         "numpy e2e", "torch", "device e2e", "torch", "err"],
        [[r["shape"], r["mode"], r["winner"], fmt(r["gpu_ms"]), fmt(r["plain_gpu_ms"]),
          fmt(r["fused_over_plain"], ".2f"), fmt(r["e2e_numpy_ms"], ".2f"), fmt(r["torch_e2e_numpy_ms"], ".2f"),
          fmt(r["e2e_device_ms"], ".2f"), fmt(r["torch_e2e_device_ms"], ".2f"), fmt(r["err"], ".1e")]
         for r in rows],
    )


def commit() -> str:
    env = os.environ.get("CONVTUNE_COMMIT")
    if env:
        return env
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--smoke", action="store_true",
                   help="tiny shapes, budget 0, few reps, the first mode only unless --modes: a CPU driver's run")
    p.add_argument("--modes", default=None, help=f"comma-separated, of {', '.join(MODES)} (default: all)")
    p.add_argument("--budget", type=float, default=None, help="tuning seconds per problem (default: convtune's)")
    p.add_argument("--reps", type=int, default=None, help="GPU-timed runs per winner (default 50; --smoke 3)")
    p.add_argument("--e2e-reps", type=int, default=None, help="end-to-end runs (default 50; --smoke 2)")
    p.add_argument("--only", choices=("decoders", "upsamplers"), default=None)
    p.add_argument("--out", default=None, help="JSON file (default benches/results/upsample/upsample_vs_torch_<commit>.json)")
    args = p.parse_args(argv)
    modes = list(MODES[:1] if args.smoke else MODES) if args.modes is None else [
        m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        p.error(f"--modes: unknown {', '.join(bad) or '(none given)'}; accepted: {', '.join(MODES)}")
    reps = args.reps if args.reps is not None else (3 if args.smoke else 50)
    e2e_reps = args.e2e_reps if args.e2e_reps is not None else (2 if args.smoke else 50)
    if reps < 2 or e2e_reps < 1:
        p.error("--reps must be >= 2 and --e2e-reps >= 1")
    budget = args.budget if args.budget is not None else (0.0 if args.smoke else None)
    info = convtune.adapter_info()
    if "float16" in modes and not info["features"].get("shader_f16"):
        print("float16: the adapter has no 16-bit shader floats; skipping that mode", file=sys.stderr)
        modes.remove("float16")

    torch = torch_cuda()
    check = torch is not None or args.smoke
    sha = commit()
    out = args.out or os.path.join(HERE, "results", "upsample", f"upsample_vs_torch{'_smoke' if args.smoke else ''}_{sha}.json")
    meta = {
        "date": datetime.date.today().isoformat(), "adapter": info["name"],
        "driver": f"{info['driver']} {info['driver_info']}".strip(), "commit": sha,
        "torch": None if torch is None else torch.__version__,
        "cudnn": None if torch is None else torch.backends.cudnn.version(),
        "budget": budget, "reps": reps, "e2e_reps": e2e_reps, "modes": modes,
        "command": "python benches/upsample_vs_torch.py " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    print(f"adapter: {info['name']} ({info['backend']}, {info['type']}); modes {', '.join(modes)}; "
          f"budget {'default' if budget is None else budget}", file=sys.stderr)
    decoders = [parse_spec(s) for s in (SMOKE_DECODERS if args.smoke else DECODERS)]
    upsamplers = [parse_spec(s) for s in (SMOKE_UPSAMPLERS if args.smoke else UPSAMPLERS)]
    result: Dict[str, Any] = {"meta": meta, "decoders": [], "upsamplers": []}
    start = time.perf_counter()
    for mode in modes:
        tuned = _sweep.Tuned(budget=budget, precision=precision_of(mode), reps=reps, force=True)
        if args.only != "upsamplers":
            for shape in decoders:
                result["decoders"].append(decoder_row(shape, mode, tuned, torch, check))
                print(".", end="", file=sys.stderr, flush=True)
        if args.only != "decoders":
            for shape in upsamplers:
                result["upsamplers"].append(upsampler_row(shape, mode, tuned, torch, check, e2e_reps))
                print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    if result["decoders"]:
        print(decoder_table(result["decoders"]))
        print("GPU ms: tuned winner, median of timestamp-timed runs; cuDNN: F.conv_transpose2d, CUDA events; "
              "ratio = convtune / cuDNN; TFLOP/s = 2*N*C*H*W*(K/groups)*R*S / GPU time; conv ms: the "
              "same-FLOP stride-1 conv2d (C -> K, padding same on the input grid); vs conv = GPU ms / conv ms\n")
    if result["upsamplers"]:
        print(upsampler_table(result["upsamplers"]))
        print("fused: conv2d(..., pixel_shuffle=r); plain: the same conv without it (target fused/plain <= 1.05); "
              "e2e: wall ms, numpy in -> numpy out, and on device tensors (convtune.Tensor vs CUDA tensors, "
              "synchronised); torch: F.pixel_shuffle(F.conv2d(...))")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{time.perf_counter() - start:.0f} s; results in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
