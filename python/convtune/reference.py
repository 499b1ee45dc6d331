"""Float64 numpy references for conv2d and conv_transpose2d with PyTorch's semantics (slow;
for checking)."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np
from numpy.lib.stride_tricks import as_strided


def _pair(v: Any) -> Tuple[int, int]:
    return (int(v[0]), int(v[1])) if isinstance(v, (tuple, list)) else (int(v), int(v))


def _pads(padding: Any, eff: Tuple[int, int]) -> Tuple[int, int, int, int]:
    """(top, bottom, left, right); 'same' puts the odd pixel at the bottom/right like PyTorch."""
    if padding == "valid":
        return (0, 0, 0, 0)
    if padding == "same":
        th, tw = eff[0] - 1, eff[1] - 1
        return (th // 2, th - th // 2, tw // 2, tw - tw // 2)
    ph, pw = _pair(padding)
    return (ph, ph, pw, pw)


def conv2d_reference(
    x: Any,
    w: Any,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
    bias: Optional[Any] = None,
    padding_mode: str = "zeros",
) -> np.ndarray:
    """conv2d in float64, cross-correlation, NCHW; returns float64. ``padding_mode`` as
    ``torch.nn.Conv2d``'s: ``"zeros"``, ``"reflect"``, ``"replicate"`` or ``"circular"``
    (numpy's ``np.pad`` modes ``constant``, ``reflect``, ``edge`` and ``wrap``)."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    sh, sw = _pair(stride)
    dh, dw = _pair(dilation)
    n, c, _, _ = x.shape
    k, cg, r, s = w.shape
    eff = (dh * (r - 1) + 1, dw * (s - 1) + 1)
    top, bottom, left, right = _pads(padding, eff)
    np_mode: Any = {"zeros": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}[padding_mode]
    xp = np.ascontiguousarray(np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), mode=np_mode))
    hp, wp = xp.shape[2], xp.shape[3]
    oh = (hp - eff[0]) // sh + 1
    ow = (wp - eff[1]) // sw + 1
    st = xp.strides
    win = as_strided(
        xp,
        (n, c, oh, ow, r, s),
        (st[0], st[1], st[2] * sh, st[3] * sw, st[2] * dh, st[3] * dw),
        writeable=False,
    )
    win = win.reshape(n, groups, cg, oh, ow, r, s)
    wg = w.reshape(groups, k // groups, cg, r, s)
    y = np.einsum("ngchwrs,gkcrs->ngkhw", win, wg, optimize=True).reshape(n, k, oh, ow)
    if bias is not None:
        y = y + np.asarray(bias, dtype=np.float64)[None, :, None, None]
    return y


def conv_transpose2d_reference(
    x: Any,
    w: Any,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    groups: int = 1,
    dilation: Any = 1,
    bias: Optional[Any] = None,
) -> np.ndarray:
    """conv_transpose2d in float64, NCHW, ``torch.nn.functional.conv_transpose2d``'s argument
    order; w is (C, K/groups, R, S). Each input element scatters x * w into the outputs its
    taps reach: every tap's products land on a strided grid of the full output, which padding
    then crops on each side and output padding extends at the bottom and right."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    sh, sw = _pair(stride)
    ph, pw = _pair(padding)
    oph, opw = _pair(output_padding)
    dh, dw = _pair(dilation)
    n, c, h, wd = x.shape
    _, kg, r, s = w.shape
    cg, k = c // groups, kg * groups
    oh = (h - 1) * sh - 2 * ph + dh * (r - 1) + oph + 1
    ow = (wd - 1) * sw - 2 * pw + dw * (s - 1) + opw + 1
    full = np.zeros((n, k, (h - 1) * sh + dh * (r - 1) + 1 + oph, (wd - 1) * sw + dw * (s - 1) + 1 + opw))
    xg = x.reshape(n, groups, cg, h, wd)
    wg = w.reshape(groups, cg, kg, r, s)
    for i in range(r):
        for j in range(s):
            part = np.einsum("ngchw,gck->ngkhw", xg, wg[..., i, j], optimize=True).reshape(n, k, h, wd)
            full[:, :, i * dh:i * dh + (h - 1) * sh + 1:sh, j * dw:j * dw + (wd - 1) * sw + 1:sw] += part
    y = full[:, :, ph:ph + oh, pw:pw + ow]
    if bias is not None:
        y = y + np.asarray(bias, dtype=np.float64)[None, :, None, None]
    return y


def apply_epilogue(
    conv: Any,
    bias: Optional[Any] = None,
    *,
    z: Optional[Any] = None,
    alpha1: float = 1.0,
    alpha2: float = 1.0,
    activation: Optional[str] = None,
    negative_slope: float = 0.01,
    clamp: Optional[Tuple[float, float]] = None,
) -> np.ndarray:
    """``conv2d``'s fused epilogue in float64: ``act(alpha1 * conv + alpha2 * z + bias)``,
    ``conv`` being the bias-free convolution (``conv2d_reference`` without ``bias``)."""
    v = alpha1 * np.asarray(conv, dtype=np.float64)
    if z is not None:
        v = v + alpha2 * np.asarray(z, dtype=np.float64)
    if bias is not None:
        v = v + np.asarray(bias, dtype=np.float64)[None, :, None, None]
    with np.errstate(over="ignore", invalid="ignore"):
        if activation is None:
            return v
        if activation == "relu":
            return np.where(v < 0, 0.0, v)
        if activation == "leaky_relu":
            return np.where(v < 0, v * negative_slope, v)
        if activation == "silu":
            return v / (1.0 + np.exp(-v))
        if activation == "gelu":
            return 0.5 * v * (1.0 + np.tanh(0.7978845608028654 * (v + 0.044715 * v**3)))
        if activation == "clamp":
            assert clamp is not None
            return np.where(v < clamp[0], clamp[0], np.where(v > clamp[1], clamp[1], v))
    raise ValueError(f"unknown activation {activation!r}")


def pixel_shuffle_reference(y: Any, r: int) -> np.ndarray:
    """PyTorch's ``pixel_shuffle(y, r)`` of an (N, K, H, W) array in float64: channel
    c*r*r + i*r + j at (h, w) goes to channel c at (h*r + i, w*r + j)."""
    y = np.asarray(y, dtype=np.float64)
    n, k, h, w = y.shape
    if k % (r * r):
        raise ValueError(f"pixel_shuffle={r} needs channels divisible by {r * r}, got {k}")
    return y.reshape(n, k // (r * r), r, r, h, w).transpose(0, 1, 4, 2, 5, 3).reshape(n, k // (r * r), h * r, w * r)


def max_relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| scaled by the largest |want| (NaN where both are NaN counts as equal)."""
    got = np.asarray(got, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        same = (got == want) | (np.isnan(got) & np.isnan(want))
        diff = np.where(same, 0.0, np.abs(got - want))
    finite = want[np.isfinite(want)]
    scale = max(float(np.abs(finite).max()) if finite.size else 0.0, 1e-6)
    if np.isnan(diff).any():
        return float("inf")
    return float(diff.max() / scale) if diff.size else 0.0
