"""Where the time of a numpy-in, numpy-out ``convtune.conv2d`` goes, phase by phase.

Usage:
    python benches/e2e_breakdown.py                      # suite picked by adapter type
    python benches/e2e_breakdown.py --suite issue        # the shapes of the GPU report
    python benches/e2e_breakdown.py --suite cpu --reps 5 --json out.json

Per shape: the median end-to-end time of ``conv2d`` over ``--reps`` calls after warm-up, the
median of each phase ``convtune.last_call_timings()`` measured in those calls, the GPU time
of the same kernel (``time_variant``, timestamp queries where the adapter has them), and a
bound: kernel + bytes up / upload bandwidth + bytes down / read-back bandwidth + 1 ms. With
PyTorch and CUDA importable, the bandwidths are those of pinned-memory CUDA copies, a second
("pageable") bound uses those of CUDA copies from and to pageable numpy arrays (memory like
the arrays a call gets and returns), and a column gives PyTorch's own end to end on the same
arrays (``torch.from_numpy(x).cuda()``, the same for ``w``, ``F.conv2d``,
``.cpu().numpy()``; TF32 off; median of ``--reps``);
otherwise (a CPU adapter, where the "device" is host memory) the bandwidth is that of a
host memcpy into an existing array.

Tuning follows ``CONVTUNE_TUNE`` (``--tune off`` skips it: on a CPU adapter the default
variant is what matters for the non-kernel phases).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

# (label, x shape, w shape, stride, padding)
SUITES = {
    # Shapes from the GPU report: kernel times of about 1, 18 and 60 ms on an H200.
    "issue": [
        ("alexnet-c2", (32, 96, 27, 27), (256, 96, 5, 5), 1, 2),
        ("resnet-3x3", (32, 256, 56, 56), (64, 256, 3, 3), 1, 0),
        ("edsr-tail", (1, 64, 720, 1280), (16, 64, 3, 3), 1, 1),
    ],
    # Public-suite shapes with short kernels, where a call's fixed costs show.
    "small": [
        ("seed-225", (1, 3, 225, 225), (32, 3, 3, 3), 1, 0),
        ("resnet-14", (32, 256, 14, 14), (256, 256, 3, 3), 1, 1),
        ("resnet-7", (32, 512, 7, 7), (512, 512, 3, 3), 1, 1),
    ],
    # Large tensors and few FLOPs, so a CPU Vulkan driver shows the non-kernel phases.
    "cpu": [
        ("tiny", (1, 3, 32, 32), (8, 3, 3, 3), 1, 1),
        ("alexnet-c2/16", (2, 96, 27, 27), (256, 96, 5, 5), 1, 2),
        ("wide-1x1", (8, 16, 128, 128), (16, 16, 1, 1), 1, 0),
        ("hd-1x1", (1, 16, 720, 1280), (16, 16, 1, 1), 1, 0),
    ],
}


def torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def median_ms(samples) -> float:
    return statistics.median(samples) * 1e3


def cuda_rate(torch, fn, nbytes: int) -> float:
    """Bytes per second of the CUDA copy `fn` makes of `nbytes` (median of 5 after one)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return nbytes / statistics.median(times)


def cuda_copy_bandwidths(torch, nbytes: int = 256 << 20) -> tuple:
    """(host->device, device->host) bytes per second of pinned-memory copies."""
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    return (cuda_rate(torch, lambda: dev.copy_(host), nbytes),
            cuda_rate(torch, lambda: host.copy_(dev), nbytes))


def cuda_pageable_bandwidths(torch, nbytes: int = 256 << 20) -> tuple:
    """(host->device, device->host) bytes per second of CUDA copies between pageable numpy
    arrays (pages already touched) and the GPU: what the CUDA driver itself reaches from
    memory like a numpy array's."""
    h = torch.from_numpy(np.ones(nbytes, dtype=np.uint8))
    b = torch.from_numpy(np.ones(nbytes, dtype=np.uint8))
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    return cuda_rate(torch, lambda: dev.copy_(h), nbytes), cuda_rate(torch, lambda: b.copy_(dev), nbytes)


def host_copy_bandwidth(nbytes: int = 128 << 20) -> float:
    """Bytes per second of a memcpy between two existing host arrays."""
    a = np.ones(nbytes, dtype=np.uint8)
    b = np.empty_like(a)
    np.copyto(b, a)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(b, a)
        times.append(time.perf_counter() - t)
    return nbytes / min(times)


def torch_e2e_ms(torch, x, w, stride, padding, reps) -> float:
    import torch.nn.functional as F

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False

    def once():
        return F.conv2d(torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda(),
                        stride=stride, padding=padding).cpu().numpy()

    for _ in range(2):
        once()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        once()
        times.append(time.perf_counter() - t)
    return median_ms(times)


def breakdown(convtune, x, w, stride, padding, reps):
    """(median e2e seconds, {phase: median seconds}, median minor faults, variant)."""
    convtune.conv2d(x, w, stride=stride, padding=padding)  # tune or load, compile, fill the pool
    totals, phases, faults = [], {}, []
    for _ in range(reps):
        t = time.perf_counter()
        convtune.conv2d(x, w, stride=stride, padding=padding)
        totals.append(time.perf_counter() - t)
        rec = convtune.last_call_timings()
        for name, dt in rec["phases"].items():
            phases.setdefault(name, []).append(dt)
        if rec["minor_faults"] is not None:
            faults.append(rec["minor_faults"])
    med = {name: statistics.median(v) for name, v in phases.items()}
    return statistics.median(totals), med, (statistics.median(faults) if faults else None)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=sorted(SUITES), default=None,
                   help="shape suite (default: 'cpu' on a CPU adapter, else 'issue')")
    p.add_argument("--only", default="", help="comma-separated shape labels of the suite to run")
    p.add_argument("--reps", type=int, default=5, help="timed calls per shape (median)")
    p.add_argument("--kernel-reps", type=int, default=5, help="timed kernel runs per shape")
    p.add_argument("--tune", choices=("auto", "cached", "off"), default=None,
                   help="sets CONVTUNE_TUNE for this run")
    p.add_argument("--json", default=None, help="also write the rows here")
    args = p.parse_args()
    if args.tune:
        os.environ["CONVTUNE_TUNE"] = args.tune
    import convtune

    info = convtune.adapter_info()
    suite = args.suite or ("cpu" if info["type"] == "Cpu" else "issue")
    torch = torch_cuda()
    pageable = None
    if torch is not None:
        up_bw, down_bw = cuda_copy_bandwidths(torch)
        bw_source = "pinned CUDA copies"
        pageable = cuda_pageable_bandwidths(torch)
    else:
        up_bw = down_bw = host_copy_bandwidth()
        bw_source = "host memcpy"
    print(f"adapter: {info['name']} ({info['type']}); copy bandwidth up {up_bw / 1e9:.1f} GB/s, "
          f"down {down_bw / 1e9:.1f} GB/s ({bw_source}); CONVTUNE_TUNE="
          f"{os.environ.get('CONVTUNE_TUNE', 'auto')}; median of {args.reps} calls")
    if pageable:
        print(f"CUDA copies from and to pageable numpy arrays: up {pageable[0] / 1e9:.1f} GB/s, "
              f"down {pageable[1] / 1e9:.1f} GB/s (the pageable bound)")
    rng = np.random.default_rng(0)
    rows = []
    only = set(filter(None, args.only.split(",")))
    for label, xs, ws, stride, padding in SUITES[suite]:
        if only and label not in only:
            continue
        x = rng.standard_normal(xs, dtype=np.float32)
        w = rng.standard_normal(ws, dtype=np.float32)
        e2e, phases, faults = breakdown(convtune, x, w, stride, padding, args.reps)
        variant = convtune.explain(xs, ws, stride=stride, padding=padding).variant
        _, ktimes = convtune.time_variant(xs, ws, stride, padding, variant=variant,
                                          reps=args.kernel_reps, warmup=1)
        kernel = statistics.median(ktimes)
        oh, ow = ((xs[i + 2] + 2 * padding - ws[i + 2]) // stride + 1 for i in (0, 1))
        y_bytes = 4 * xs[0] * ws[0] * oh * ow
        up_bytes = x.nbytes + w.nbytes

        def bound_at(up: float, down: float) -> float:
            """Kernel + the bytes at bandwidths `up` and `down` + 1 ms, in seconds."""
            return kernel + up_bytes / up + y_bytes / down + 1e-3

        bound = bound_at(up_bw, down_bw)
        row = {
            "shape": label, "x": xs, "w": ws, "stride": stride, "padding": padding,
            "variant": variant, "e2e_ms": e2e * 1e3, "kernel_ms": kernel * 1e3,
            "bound_ms": bound * 1e3, "minor_faults": faults,
            "phases_ms": {k: v * 1e3 for k, v in phases.items()},
        }
        if pageable:
            row["pageable_bound_ms"] = 1e3 * bound_at(*pageable)
        if torch is not None:
            row["torch_e2e_ms"] = torch_e2e_ms(torch, x, w, stride, padding, args.reps)
        rows.append(row)
        report(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"adapter": info["name"], "bandwidth": [up_bw, down_bw],
                       "pageable_bandwidth": list(pageable) if pageable else None, "rows": rows}, f, indent=1)
    return 0


def report(r) -> None:
    torch_part = ""
    if "torch_e2e_ms" in r:
        torch_part = f"  torch e2e {r['torch_e2e_ms']:8.2f} ms  ratio {r['e2e_ms'] / r['torch_e2e_ms']:.2f}"
    verdict = "within" if r["e2e_ms"] <= r["bound_ms"] else "OVER"
    pageable_part = ""
    if "pageable_bound_ms" in r:
        v = "within" if r["e2e_ms"] <= r["pageable_bound_ms"] else "OVER"
        pageable_part = f"  pageable bound {r['pageable_bound_ms']:8.2f} ms ({v})"
    print(f"\n{r['shape']}: x {r['x']} w {r['w']} stride {r['stride']} pad {r['padding']}  [{r['variant']}]")
    print(f"  e2e {r['e2e_ms']:8.2f} ms  kernel {r['kernel_ms']:8.2f} ms  bound {r['bound_ms']:8.2f} ms "
          f"({verdict}){pageable_part}{torch_part}  minor faults {r['minor_faults']}")
    for name, ms in r["phases_ms"].items():
        print(f"    {name:18s} {ms:9.3f} ms")


if __name__ == "__main__":
    sys.exit(main())
