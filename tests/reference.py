"""A float64 numpy reference for conv2d and the comparison helpers the tests share.

Semantics are ``torch.nn.functional.conv2d``'s: cross-correlation, x (N, C, H, W),
w (K, C/groups, R, S), zero padding; ``padding='same'`` pads ``dilation*(k-1)`` in total
per axis, ``total // 2`` at the top/left and the rest at the bottom/right.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional, Tuple, Union

import numpy as np

# The acceptance bound: max|got - ref| / max(max|ref|, 1e-6).
RTOL = 1e-5


def _pair(v) -> Tuple[int, int]:
    if isinstance(v, (tuple, list)):
        assert len(v) == 2
        return int(v[0]), int(v[1])
    return int(v), int(v)


def resolve_padding(padding, kernel: Tuple[int, int], dilation: Tuple[int, int]):
    """Returns ((top, bottom), (left, right)) for an int, a pair, 'same' or 'valid'."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0), (0, 0)
        if padding == "same":
            out = []
            for k, d in zip(kernel, dilation):
                total = d * (k - 1)
                out.append((total // 2, total - total // 2))
            return tuple(out)
        raise ValueError(f"bad padding {padding!r}")
    ph, pw = _pair(padding)
    return (ph, ph), (pw, pw)


def output_shape(x_shape, w_shape, stride=1, padding=0, dilation=1):
    """(N, K, OH, OW) of the convolution; OH or OW may come out <= 0 (empty output)."""
    n, _, h, wd = x_shape
    k, _, r, s = w_shape
    sh, sw = _pair(stride)
    dh, dw = _pair(dilation)
    (pt, pb), (pl, pr) = resolve_padding(padding, (r, s), (dh, dw))
    eff_r = dh * (r - 1) + 1
    eff_s = dw * (s - 1) + 1
    oh = (h + pt + pb - eff_r) // sh + 1
    ow = (wd + pl + pr - eff_s) // sw + 1
    return n, k, oh, ow


def reference_conv2d(
    x,
    w,
    stride: Union[int, Tuple[int, int]] = 1,
    padding=0,
    dilation: Union[int, Tuple[int, int]] = 1,
    groups: int = 1,
    bias: Optional[np.ndarray] = None,
) -> np.ndarray:
    """float64 conv2d with PyTorch semantics. NaN/inf in x or w propagate as IEEE says."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    g = int(groups)
    assert c % g == 0 and k % g == 0 and cg == c // g, (x.shape, w.shape, g)
    kg = k // g
    sh, sw = _pair(stride)
    dh, dw = _pair(dilation)
    (pt, pb), (pl, pr) = resolve_padding(padding, (r, s), (dh, dw))
    _, _, oh, ow = output_shape(x.shape, w.shape, stride, padding, dilation)
    assert oh >= 1 and ow >= 1, "empty output"

    xp = np.zeros((n, c, h + pt + pb, wd + pl + pr), dtype=np.float64)
    xp[:, :, pt : pt + h, pl : pl + wd] = x
    # (N, G, CG, Hp, Wp) and (G, KG, CG, R, S)
    xp = xp.reshape(n, g, cg, xp.shape[2], xp.shape[3])
    wg = w.reshape(g, kg, cg, r, s)
    y = np.zeros((n, g, kg, oh * ow), dtype=np.float64)
    for i in range(r):
        for j in range(s):
            r0 = i * dh
            s0 = j * dw
            patch = xp[:, :, :, r0 : r0 + sh * (oh - 1) + 1 : sh, s0 : s0 + sw * (ow - 1) + 1 : sw]
            patch = patch.reshape(n, g, cg, oh * ow)
            # (G, KG, CG) @ (N, G, CG, P) -> (N, G, KG, P)
            y += np.matmul(wg[None, :, :, :, i, j], patch)
    y = y.reshape(n, k, oh, ow)
    if bias is not None:
        y = y + np.asarray(bias, dtype=np.float64).reshape(1, k, 1, 1)
    return y


def max_rel_err(got, ref) -> float:
    """max|got - ref| / max(max|ref|, 1e-6) over the positions where ref is not NaN."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    ok = ~np.isnan(ref)
    if not ok.any():
        return 0.0
    scale = max(float(np.max(np.abs(ref[ok]))), 1e-6)
    return float(np.max(np.abs(got[ok] - ref[ok]))) / scale


def check_close(got, ref, context: str = "", rtol: float = RTOL) -> None:
    """Asserts shape, float32 dtype, identical NaN positions and relative error <= rtol."""
    got = np.asarray(got)
    ref = np.asarray(ref)
    where = f" [{context}]" if context else ""
    assert got.shape == ref.shape, f"shape {got.shape} != reference {ref.shape}{where}"
    assert got.dtype == np.float32, f"dtype {got.dtype}, expected float32{where}"
    nan_got = np.isnan(got)
    nan_ref = np.isnan(ref)
    if not np.array_equal(nan_got, nan_ref):
        extra = np.argwhere(nan_got & ~nan_ref)
        missing = np.argwhere(nan_ref & ~nan_got)
        raise AssertionError(
            f"NaN positions differ{where}: {len(extra)} NaN where the reference is finite "
            f"(first {extra[:5].tolist()}; unwritten outputs show as NaN under poison), "
            f"{len(missing)} finite where the reference is NaN (first {missing[:5].tolist()})"
        )
    err = max_rel_err(got, ref)
    assert err <= rtol, f"max relative error {err:.3g} > {rtol:g}{where}"


def random_conv_inputs(rng: np.random.Generator, x_shape, w_shape, bias: bool):
    """Standard normal float32 x, w (and bias); never all zero."""
    x = rng.standard_normal(x_shape, dtype=np.float32)
    w = rng.standard_normal(w_shape, dtype=np.float32)
    b = rng.standard_normal((w_shape[0],), dtype=np.float32) if bias else None
    return x, w, b


def run_or_skip_tensor_core(variant: str, call):
    """``call()``'s result; the test is skipped where the tensor-core ``variant`` cannot take
    the shape (a split-K store) or exceeds the adapter's workgroup limits."""
    import pytest

    try:
        return call()
    except ValueError as e:
        if "cannot run on this shape" in str(e) or "the adapter allows" in str(e):
            pytest.skip(f"{variant}: {e}")
        raise


def run_or_skip_over_limits(variant: str, call):
    """``call()``'s result; skipped only where ``variant`` exceeds the adapter's limits (a
    variant refusing the shape is a failure)."""
    import pytest

    try:
        return call()
    except ValueError as e:
        if "the adapter allows" in str(e):
            pytest.skip(f"{variant}: {e}")
        raise


def split_k_case(knobs: dict, i: int) -> Tuple[bool, str, str]:
    """(float16 data?, layout, precision) the ``i``-th sampled tensor-core split-K variant of
    ``knobs`` is checked in: float16 for layout 2 and every other single-precision sample,
    NCHW for the other float32 ones (layout 1 copies NCHW float32 x channels-last; y keeps
    the problem's layout), "highest" for the split-precision tiles."""
    half = knobs["layout"] == 2 or (knobs["split"] == 1 and i % 2 == 0)
    layout = "NCHW" if i % 2 == 1 and not half else "NHWC"
    return half, layout, "highest" if knobs["split"] == 3 else "high"


def check_mode_bound(got, want, half: bool, precision: str, context: str) -> None:
    """All finite, and max |got - want| / max |want| within the mode's bound: four float16
    rounding steps for float16 data, else "highest"'s 1e-5 or "high"'s 4e-3."""
    g = np.asarray(got).astype(np.float64)
    bound = 4 * 2.0**-11 if half else (1e-5 if precision == "highest" else 4e-3)
    err = np.abs(g - want).max() / np.abs(want).max()
    assert np.isfinite(g).all() and err <= bound, f"{context}: error {err:.3g}"


def non_finite_inputs(rng: np.random.Generator, x_shape, w_shape):
    """Standard normal float32 x (one image, 3 channels or more) and w (6 output channels or
    more) with +Inf at x[0, 1, 3, 4], NaN at x[0, 2, 6, 7] and +Inf at w[5, 0, 0, 0]: padding
    multiplies that weight by zero (NaN, as zero padding gives), and the input Inf reaches
    exactly the outputs whose windows hold it."""
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    x[0, 1, 3, 4] = np.inf
    x[0, 2, 6, 7] = np.nan
    w[5, 0, 0, 0] = np.inf
    return x, w


def check_same_non_finites(got, want, context: str = "") -> np.ndarray:
    """Asserts that ``got`` holds NaN, +Inf and -Inf exactly where ``want`` does; returns the
    mask of ``want``'s finite elements, for comparing the rest within a bound."""
    for kind in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(kind(got), kind(want), err_msg=f"{kind.__name__} {context}")
    return np.isfinite(want)


def forced_conv(rng, x_shape, w_shape, variant: str, layout: str = "NCHW", dt=np.float32, **call):
    """x and w of standard normal values (w over its side), and `variant`'s result in NCHW
    order as float64, ``call`` passed to ``conv2d``."""
    import convtune

    x = rng.standard_normal(x_shape).astype(dt)
    w = (rng.standard_normal(w_shape) / w_shape[-1]).astype(dt)
    got = convtune.conv2d(nhwc(x) if layout == "NHWC" else x, w, layout=layout, variant=variant, **call)
    got = np.asarray(got, np.float64)
    return x, w, got.transpose(0, 3, 1, 2) if layout == "NHWC" else got


def forced_conv_within(rng, x_shape, w_shape, variant: str, layout: str, bound: float, **call) -> None:
    """``forced_conv`` on float32 data against the float64 reference of the same call:
    the output's shape, and its largest error within ``bound`` of the reference's max |y|."""
    from convtune.reference import conv2d_reference

    x, w, got = forced_conv(rng, x_shape, w_shape, variant, layout, **call)
    want = conv2d_reference(x.astype(np.float64), w.astype(np.float64), **call)
    assert got.shape == want.shape, (got.shape, want.shape, variant, layout)
    assert np.abs(got - want).max() <= bound * np.abs(want).max(), (variant, layout, call)


def nhwc(a) -> np.ndarray:
    """An (N, C, H, W) array as a C-contiguous (N, H, W, C) one."""
    return np.ascontiguousarray(np.asarray(a).transpose(0, 2, 3, 1))


def check_epilogue_in_both_layouts(rng, x, w, b, kw, rtol, acts=("silu", "relu"), **call) -> None:
    """conv2d with bias + residual z (alpha1 0.5, alpha2 -2) + activation, on channels-first
    and then channels-last x, y and z (activations ``acts``, one per layout), against the
    float64 reference; ``rtol`` is scaled by how much the activation shrinks max |y|."""
    import convtune
    from convtune.reference import apply_epilogue, conv2d_reference

    conv = conv2d_reference(x, w, **kw)
    z = rng.standard_normal(conv.shape).astype(np.float32)
    pre = np.abs(apply_epilogue(conv, b, z=z, alpha1=0.5, alpha2=-2.0)).max()
    for layout, t, act in (("NCHW", lambda a: a, acts[0]), ("NHWC", nhwc, acts[1])):
        want = apply_epilogue(conv, b, z=z, alpha1=0.5, alpha2=-2.0, activation=act)
        got = convtune.conv2d(t(x), w, bias=b, z=t(z), alpha1=0.5, alpha2=-2.0, activation=act,
                              layout=layout, **kw, **call)
        check_close(got, t(want), context=f"{call} {layout}", rtol=rtol * max(1.0, pre / np.abs(want).max()))


# A sample of FMA variants: direct with and without unrolling and register tiles, GEMM tiles,
# and a split-K GEMM.
FMA_SAMPLE = [
    "direct_wg64x1_u0_k1w1",
    "direct_wg64x1_u1_k4w4",
    "direct_wg128x1_u2_k8w2",
    "gemm_b32x32x8_t4x4",
    "gemm_b64x64x16_t4x8",
    "gemm_b32x32x16_t4x4_k4",
]


README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def readme_examples(test: str) -> list:
    """The code of every README ``python`` block marked ``<!-- run by tests/...::<test> ...
    -->`` on the line above it, in order: tests run the documented code itself, so the docs
    cannot drift from what works."""
    with open(README, encoding="utf-8") as f:
        lines = f.read().splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line.startswith("<!-- run by ") and f"::{test} " in line + " " and lines[i + 1] == "```python":
            end = lines.index("```", i + 2)
            blocks.append("\n".join(lines[i + 2:end]) + "\n")
    assert blocks, f"README.md has no python block marked for {test}"
    return blocks


def run_ok(code: str, **env: str) -> None:
    """Runs ``code`` in a fresh Python process with ``env`` added to this one's environment
    (settings read once per process) and checks that it exits cleanly having printed "ok"."""
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


#: Every variant and every drawn case run when set (the GPU machine's runs, the full sweep);
#: otherwise the per-variant sweeps run a spread sample, for a test command in minutes.
EXHAUSTIVE = os.environ.get("CONVTUNE_EXHAUSTIVE") == "1"

#: Variants per family a sampled sweep runs.
PER_FAMILY = 12


def swept(names, per_family: int = PER_FAMILY) -> list:
    """``names`` (variant names, in the generator's order), or with CONVTUNE_EXHAUSTIVE unset
    up to ``per_family`` of each family spread evenly over its list, its first and last
    included: every family and the range of its knobs, in a fraction of the time."""
    names = list(names)
    if EXHAUSTIVE:
        return names
    out = []
    for family in dict.fromkeys(n.split("_")[0] for n in names):
        of = [n for n in names if n.split("_")[0] == family]
        m = min(len(of), per_family)
        out += [of[0]] if m == 1 else [of[i * (len(of) - 1) // (m - 1)] for i in range(m)]
    return out


def swept_range(n: int, every: int = 3) -> range:
    """Indices of ``n`` drawn cases a sweep runs: all with CONVTUNE_EXHAUSTIVE, else every
    ``every``-th."""
    return range(n) if EXHAUSTIVE else range(0, n, every)

