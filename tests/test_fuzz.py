"""Property-based fuzz of ``convtune.conv2d`` (hypothesis).

Every generated call must either

* return a float32 array that matches the float64 reference (``reference_conv2d`` on the
  inputs cast to float32, as the dtype policy says), with NaN and +/-Inf in exactly the
  reference's positions (the reference zero-pads and multiplies, so ``0 * inf = nan`` at the
  border is the ground truth), or
* raise one of the documented exceptions.

On top of that, an independent model of the documented argument rules says *which* outcome is
allowed: a well-formed call must succeed, an argument of the wrong type or dtype must raise
TypeError, a bad shape or parameter (including an output too large to represent, more than
2**31 - 1 elements) must raise ValueError (where a call has both kinds of problem, either is
accepted), and a zero-size tensor may raise ValueError or return a correctly shaped empty
array. ConvtuneError (a GPU-side failure) is never acceptable for these small problems.
Any other exception type, or a crash, fails.

The fuzz covers shapes (batch 0-3, channels 0-8, H/W 0-12, kernels 0-5), groups, stride,
padding (int, pair, 'same', 'valid', 1000, absurd values), dilation, bias
present/absent/wrong, the kernel variant, dtypes (float16/32/64/longdouble, signed and
unsigned ints, byte-swapped, and the rejected bool/complex/object/str/bytes/datetime/void),
memory layouts (Fortran order, negative strides, strided and transposed views, zero-stride
broadcasts, ``as_strided`` views with zero and overlapping strides, read-only, unaligned,
nested lists, memoryviews), NaN/Inf values and wrong types everywhere (None, str, float
stride, nested lists of the wrong depth, dict, set, object arrays, complex, ...).

Huge views: now and then x or w is a zero-stride view (``np.broadcast_to`` or
``as_strided``) of a random shape with more than 2**31 - 1 logical elements — up to
terabytes — over a few bytes. Such a call must raise ValueError before it copies anything;
a copy would take the process down (the child-process fuzz below would see the signal).

Environment:
    CONVTUNE_FUZZ_EXAMPLES  examples of the in-process fuzz (default 150)
    CONVTUNE_FUZZ_SUBPROCESS_EXAMPLES  examples of the crash-guard fuzz in a child (default 60)
    CONVTUNE_FUZZ_SEED      unset: derandomized (reproducible); an int: that seed;
                            'random': a fresh seed, printed in the failure message
    CONVTUNE_FUZZ_SHRINK=1  stop at the first generated failure and let hypothesis shrink it
                            (slower; the explicit examples are skipped). By default every
                            failure is collected and the run reports one example per kind.

conftest.py runs everything untuned (CONVTUNE_TUNE=off); the child process inherits that.

A failing example is printed as a ``Case(...)`` repr; the arrays are built from it
deterministically (``materialize``), so it replays outside the fuzz:

    cd tests && CONVTUNE_TUNE=off python -c "from test_fuzz import *; \
        from numpy import nan, inf, array; replay(Case(...))"
"""

from __future__ import annotations

import dataclasses
import math
import operator
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from typing import Any, Optional, Tuple

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, example, given, reject, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

import convtune
from reference import RTOL, check_close, output_shape, reference_conv2d, resolve_padding

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

N_EXAMPLES = int(os.environ.get("CONVTUNE_FUZZ_EXAMPLES", "150"))
N_SUBPROCESS_EXAMPLES = int(os.environ.get("CONVTUNE_FUZZ_SUBPROCESS_EXAMPLES", "60"))
_SEED_ENV = os.environ.get("CONVTUNE_FUZZ_SEED", "").strip()
if _SEED_ENV.lower() == "random":
    FUZZ_SEED: Optional[int] = random.SystemRandom().randrange(2**32)
elif _SEED_ENV:
    FUZZ_SEED = int(_SEED_ENV)
else:
    FUZZ_SEED = None  # derandomized
SHRINK = os.environ.get("CONVTUNE_FUZZ_SHRINK", "") == "1"

INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1
# Largest output the strategy may produce for a call that is expected to run (elements);
# 'padding=1000' on both axes of a 1x1x1x1 kernel gives ~4.0e6.
MAX_RUN_OUTPUT = 5_000_000
# ... and the largest multiply-add count.
MAX_RUN_MACS = 30_000_000


# --------------------------------------------------------------------------------------------
# Case description: plain data with a readable repr; arrays are built from it on demand.
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Arr:
    """A numeric array argument: shape, dtype, memory layout and how to fill it."""

    shape: Tuple[int, ...]
    dtype: str = "float32"
    layout: str = "c"
    seed: int = 0
    fill: str = "normal"  # normal | ints | scaled:<exp> | zeros
    specials: Tuple[Tuple[int, float], ...] = ()  # (flat index modulo size, nan/inf/-inf)


@dataclasses.dataclass(frozen=True)
class Bad:
    """A value that is not a numeric array of floats/ints (kind: one of BAD_ARRAY_KINDS)."""

    kind: str
    shape: Tuple[int, ...] = (1, 1, 2, 2)


@dataclasses.dataclass(frozen=True)
class Case:
    x: Any
    w: Any
    bias: Any = None
    stride: Any = 1
    padding: Any = 0
    dilation: Any = 1
    groups: Any = 1
    variant: Any = None
    style: str = "kw"  # kw | pos | minimal
    tags: Tuple[str, ...] = ()


class _Opaque:
    """An arbitrary object with no array interface."""

    def __repr__(self):
        return "_Opaque()"


def _bad_value(bad: Bad):
    """The object for a Bad spec (fresh each call: a generator is single use)."""
    shape = bad.shape
    ones = np.ones(shape)
    k = bad.kind
    if k == "none":
        return None
    if k == "str":
        return "abc"
    if k == "bytes":
        return b"\x00\x01\x02\x03"
    if k == "int":
        return 3
    if k == "float":
        return 2.5
    if k == "complex":
        return 1 + 2j
    if k == "dict":
        return {"x": ones}
    if k == "set":
        return {1.0, 2.0}
    if k == "object":
        return _Opaque()
    if k == "generator":
        return (float(i) for i in range(4))
    if k == "ragged":
        return [[[[1.0, 2.0]], [[1.0]]]]
    if k == "depth-1":  # nested list one level too shallow
        return ones[0].tolist()
    if k == "depth+1":  # one level too deep
        return ones[None].tolist()
    if k == "depth-2":
        return ones[0, 0].tolist()
    if k == "empty-list":
        return []
    if k == "0d-array":
        return np.array(1.5, np.float32)
    if k == "1d-array":
        return np.ones(4, np.float32)
    if k == "list-with-none":
        v = ones.tolist()
        v[0][0][0][0] = None
        return v
    if k == "list-of-str":
        return np.full(shape, "1").tolist()
    if k == "list-of-bool":
        return np.ones(shape, bool).tolist()
    if k == "list-of-complex":
        return (ones + 1j).tolist()
    if k == "object-array":
        return ones.astype(object)
    if k == "object-array-of-arrays":
        a = np.empty(2, dtype=object)
        a[0], a[1] = ones, ones
        return a
    raise AssertionError(f"unknown Bad kind {k!r}")


BAD_ARRAY_KINDS = (
    "none", "str", "bytes", "int", "float", "complex", "dict", "set", "object", "generator",
    "ragged", "depth-1", "depth+1", "depth-2", "empty-list", "0d-array", "1d-array",
    "list-with-none", "list-of-str", "list-of-bool", "list-of-complex", "object-array",
    "object-array-of-arrays",
)

GOOD_DTYPES = (
    "float32", "float64", "float16", "longdouble", "int8", "int16", "int32", "int64", "uint8",
    "uint16", "uint32", "uint64", ">f4", ">f8", "<f4", ">i4",
)
BAD_DTYPES = (
    "bool", "complex64", "complex128", "object", "U4", "S4", "datetime64[s]",
    "timedelta64[ms]", "void",
)
LAYOUTS = (
    "c", "fortran", "reversed", "reversed-last", "strided", "transposed", "broadcast",
    "as-strided", "readonly", "unaligned", "byteswapped", "list", "memoryview",
)
# x only: a convtune.Tensor already on the GPU (conv2d then returns a Tensor).
X_LAYOUTS = LAYOUTS + ("device",)


def _values(spec: Arr) -> np.ndarray:
    """float64 values of the spec in C order (specials included)."""
    rng = np.random.default_rng(spec.seed)
    shape = spec.shape
    if spec.fill == "ints":
        v = rng.integers(-3, 4, size=shape).astype(np.float64)
    elif spec.fill == "zeros":
        v = np.zeros(shape)
    elif spec.fill.startswith("scaled:"):
        v = rng.standard_normal(shape) * 10.0 ** int(spec.fill.split(":")[1])
    else:
        v = rng.standard_normal(shape)
    size = v.size
    if size:
        flat = v.reshape(-1)
        for idx, val in spec.specials:
            flat[idx % size] = val
    return v


def _with_dtype(v: np.ndarray, dtype: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return _with_dtype_(v, dtype)


def _with_dtype_(v: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "void":
        return np.zeros(v.shape, dtype=[("a", "<f4")])
    dt = np.dtype(dtype)
    kind = dt.kind
    if kind in "iu":
        v = np.nan_to_num(v, nan=0.0, posinf=3.0, neginf=-3.0)
        v = np.clip(np.round(v), 0 if kind == "u" else -100, 100)
        return v.astype(dt)
    if kind == "b":
        return v > 0
    if kind == "c":
        return (v + 0.5j * v).astype(dt)
    if kind == "O":
        return v.astype(object)
    if kind in "US":
        return v.astype(dt)
    if kind in "mM":
        return np.nan_to_num(v).astype(np.int64).astype(dt)
    with np.errstate(over="ignore", invalid="ignore"):
        return v.astype(dt)


def _layout(a: np.ndarray, layout: str, seed: int):
    """`a`'s values (up to the broadcast layout, which repeats one slice) in another layout."""
    rng = np.random.default_rng(seed + 7919)
    a = np.asarray(a)
    nd = a.ndim
    if nd == 0:  # a 0-d array stays 0-d (views and contiguity mean nothing for it)
        return a.tolist() if layout == "list" else a
    if layout == "c":
        return np.ascontiguousarray(a)
    if layout == "fortran":
        return np.asfortranarray(a)
    if layout in ("reversed", "reversed-last"):
        axes = [nd - 1] if layout == "reversed-last" else [
            i for i in range(nd) if rng.random() < 0.5
        ] or [0]
        sl = tuple(slice(None, None, -1) if i in axes else slice(None) for i in range(nd))
        base = np.ascontiguousarray(a[sl])
        return base[sl]  # negative strides, same values as a
    if layout == "strided":
        steps = [int(rng.integers(1, 4)) for _ in range(nd)]
        offs = [int(rng.integers(0, 2)) for _ in range(nd)]
        base = np.full([d * st_ + o for d, st_, o in zip(a.shape, steps, offs)], 7, a.dtype)
        sl = tuple(slice(o, o + d * st_, st_) for d, st_, o in zip(a.shape, steps, offs))
        base[sl] = a
        return base[sl]
    if layout == "transposed":
        perm = rng.permutation(nd)
        base = np.ascontiguousarray(a.transpose(perm))
        return base.transpose(np.argsort(perm))
    if layout == "broadcast":
        axis = int(rng.integers(0, nd)) if nd else 0
        if nd == 0 or a.shape[axis] == 0:
            return a
        return np.broadcast_to(a.take([0], axis=axis), a.shape)  # zero stride, read-only
    if layout == "as-strided":
        return _as_strided(a, rng)
    if layout == "readonly":
        b = a.copy()
        b.flags.writeable = False
        return b
    if layout == "unaligned":
        if a.dtype.itemsize <= 1 or a.dtype.kind == "O":
            return a
        buf = np.zeros(a.nbytes + 1, np.uint8)
        b = buf[1:].view(a.dtype).reshape(a.shape)
        b[...] = a
        return b
    if layout == "byteswapped":
        if a.dtype.kind == "O":
            return a
        return a.astype(a.dtype.newbyteorder())
    if layout == "list":
        return a.tolist()
    if layout == "memoryview":
        if a.dtype.kind in "OmMV":
            return a
        return memoryview(np.ascontiguousarray(a))
    raise AssertionError(f"unknown layout {layout!r}")


def _as_strided(a: np.ndarray, rng) -> np.ndarray:
    """A read-only view of `a`'s buffer with random strides per axis: zero (a broadcast),
    the natural one, or a smaller one whose rows overlap (a sliding window). No stride
    exceeds the natural one, so the view stays inside the buffer; its values are whatever
    it then shows."""
    base = np.ascontiguousarray(a)
    if base.size == 0:
        return base
    strides = []
    for natural in base.strides:
        mode = int(rng.integers(0, 3))
        if mode == 0:
            strides.append(0)
        elif mode == 1:
            strides.append(natural)
        else:
            strides.append(base.itemsize * int(rng.integers(0, natural // base.itemsize + 1)))
    return np.lib.stride_tricks.as_strided(base, base.shape, strides, writeable=False)


# Axes longer than this in a "huge-view" spec are zero-stride (the strategy's own dims are
# at most 13, its huge ones at least 2**12).
HUGE_AXIS = 64


def _huge_view(spec: Arr) -> np.ndarray:
    """A view of spec.shape (terabytes, maybe) over the values of a small array: the long
    axes have stride 0 (np.broadcast_to for even seeds, as_strided for odd ones)."""
    small_shape = tuple(1 if d > HUGE_AXIS else d for d in spec.shape)
    small = np.ascontiguousarray(
        _with_dtype(_values(dataclasses.replace(spec, shape=small_shape)), spec.dtype))
    if spec.seed % 2 == 0:
        return np.broadcast_to(small, spec.shape)
    strides = [0 if d > HUGE_AXIS else st_ for d, st_ in zip(spec.shape, small.strides)]
    return np.lib.stride_tricks.as_strided(small, spec.shape, strides, writeable=False)


def materialize_array(spec):
    if spec is None:
        return None
    if isinstance(spec, Bad):
        return _bad_value(spec)
    assert isinstance(spec, Arr), spec
    if spec.layout == "huge-view":
        return _huge_view(spec)
    a = _with_dtype(_values(spec), spec.dtype)
    if spec.layout == "device":
        if a.dtype.kind in "fiu" and a.ndim == 4 and a.size:
            return convtune.to_device(a)
        return a
    return _layout(a, spec.layout, spec.seed)


def materialize(case: Case):
    """The call's (args, kwargs) for conv2d."""
    x = materialize_array(case.x)
    w = materialize_array(case.w)
    b = materialize_array(case.bias)
    params = dict(stride=case.stride, padding=case.padding, dilation=case.dilation,
                  groups=case.groups)
    if case.style == "pos":
        args = (x, w, case.stride, case.padding, case.dilation, case.groups, b)
        kwargs = {}
    else:
        args = (x, w)
        defaults = dict(stride=1, padding=0, dilation=1, groups=1)
        kwargs = {}
        for name, v in params.items():
            if case.style == "minimal" and type(v) is int and v == defaults[name]:
                continue
            kwargs[name] = v
        if b is not None or case.style != "minimal":
            kwargs["bias"] = b
    if case.variant is not None or case.style == "kw":
        kwargs["variant"] = case.variant
    return args, kwargs


# --------------------------------------------------------------------------------------------
# The model of the documented argument rules
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Expect:
    type_problems: list
    value_problems: list
    big: list  # valid but beyond int32: the library may compute them or refuse with ValueError
    empty_shape: Optional[tuple] = None  # zero-size input: an empty result of this shape is OK
    out_shape: Optional[tuple] = None
    macs: int = 0
    # A variant named by the caller may exceed the adapter's workgroup limits: a ValueError
    # that says so ("the adapter allows") is then also a correct answer.
    named_variant: Optional[str] = None
    # float16 x and w: a float16 result, rounded once (the documented dtype policy).
    half: bool = False

    @property
    def allowed(self):
        if self.type_problems or self.value_problems:
            out = set()
            if self.type_problems:
                out.add("TypeError")
            if self.value_problems:
                out.add("ValueError")
            return out
        if self.big:
            return {"ok", "ValueError"}
        return {"ok"}

    def reasons(self) -> str:
        parts = [f"type: {p}" for p in self.type_problems]
        parts += [f"value: {p}" for p in self.value_problems]
        parts += [f"big: {p}" for p in self.big]
        return "; ".join(parts) or "a well-formed call"


def _model_int(v, name, e: Expect):
    if isinstance(v, (bool, np.bool_)):
        e.type_problems.append(f"{name} is a bool")
        return None
    try:
        return operator.index(v)
    except TypeError:
        e.type_problems.append(f"{name} is a {type(v).__name__}")
        return None


def _model_range(i, name, lo, e: Expect):
    if i < lo:
        e.value_problems.append(f"{name}={i} < {lo}")
        return False
    if i > UINT32_MAX:
        e.value_problems.append(f"{name}={i} is too large")
        return False
    if i > INT32_MAX:
        e.big.append(f"{name}={i}")
    return True


def _model_pair(v, name, lo, e: Expect):
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            e.value_problems.append(f"{name} has {len(v)} values")
            return None
        items = [_model_int(a, name, e) for a in v]
    else:
        i = _model_int(v, name, e)
        items = [i, i]
    if any(i is None for i in items):
        return None
    ok = [_model_range(i, name, lo, e) for i in items]
    return tuple(items) if all(ok) else None


_VARIANTS = None


def _fitting_variants():
    """{name: (likely fits the adapter, knobs)}. "Likely": the GEMM staging estimate assumes
    double buffering; the runner has the last word (see check_case)."""
    global _VARIANTS
    if _VARIANTS is None:
        limit = convtune.adapter_info()["limits"]["max_compute_workgroup_storage_size"]
        out = {}
        for name in convtune.variant_space():
            k = convtune.variant_knobs(name)
            if k["family"] in ("coop", "wcoop"):
                # Tensor-core variants meet "high", not the float32 bound this fuzz checks;
                # tests/test_precision.py and tests/test_winocoop.py cover them.
                continue
            if k["family"] == "tconv":
                continue  # transposed problems only: tests/test_conv_transpose.py
            if k["family"] == "dwise":
                continue  # NHWC depthwise problems only: tests/test_dwise.py
            if k["family"] == "wgemm":
                # F(6x6) meets "high", not the float32 bound this fuzz checks; the family's
                # own cases are tests/test_winogemm.py.
                continue

            if k["family"] == "gemm":
                fits = 2 * 4 * k["bk"] * (k["bm"] + k["bn"] + 1) <= limit
            elif k["family"] == "wino":
                fits = (k["m"] + 2) ** 2 * k["bc"] * (k["bt"] + k["bn"]) * 4 <= limit
            elif k["family"] == "stem":
                fits = 256 * k["tk"] * 4 <= limit and k["wg"] <= 1024
            else:
                fits = k["wg_x"] * k["wg_y"] <= 1024
            out[name] = (fits, k)
        _VARIANTS = out
    return _VARIANTS


def _model_array(value, name, want_ndim, e: Expect):
    if name == "x" and isinstance(value, convtune.Tensor):
        return np.empty(value.shape, value.dtype)  # only its shape and dtype matter to the model
    try:
        a = np.asarray(value)
    except (TypeError, ValueError) as err:
        e.type_problems.append(f"{name} cannot be converted ({err})")
        return None
    ok = True
    if a.dtype.kind not in "fiu":
        e.type_problems.append(f"{name} has dtype {a.dtype}")
        ok = False
    if a.ndim != want_ndim:
        e.value_problems.append(f"{name} is {a.ndim}-D")
        ok = False
    return a if ok else None


def expected_outcome(args, kwargs) -> Expect:
    """What the documentation allows for conv2d(*args, **kwargs)."""
    call = dict(stride=1, padding=0, dilation=1, groups=1, bias=None, variant=None)
    names = ("x", "w", "stride", "padding", "dilation", "groups", "bias")
    call.update(zip(names, args))
    call.update(kwargs)
    e = Expect([], [], [])
    x = _model_array(call["x"], "x", 4, e)
    w = _model_array(call["w"], "w", 4, e)
    b = None
    if call["bias"] is not None:
        b = _model_array(call["bias"], "bias", 1, e)
    if x is not None and w is not None:
        # float16 x and w compute in float16; float16 with another dtype is a TypeError.
        halves = [a.dtype == np.float16 for a in (x, w)]
        if any(halves) and not all(halves):
            e.type_problems.append("float16 mixed with another dtype")
        e.half = all(halves)
    variant = call["variant"]
    if variant is not None:
        if not isinstance(variant, str):
            e.type_problems.append(f"variant is a {type(variant).__name__}")
        elif variant not in _fitting_variants():
            e.value_problems.append(f"unknown variant {variant!r}")
        else:
            e.named_variant = variant
    stride = _model_pair(call["stride"], "stride", 1, e)
    dilation = _model_pair(call["dilation"], "dilation", 1, e)
    pad = call["padding"]
    if isinstance(pad, str):
        if pad not in ("same", "valid"):
            e.value_problems.append(f"padding={pad!r}")
            padding = None
        else:
            padding = pad
    else:
        padding = _model_pair(pad, "padding", 0, e)
    groups = _model_int(call["groups"], "groups", e)
    if groups is not None and not _model_range(groups, "groups", 1, e):
        groups = None
    if e.type_problems or e.value_problems:
        return e
    if x is None or w is None or (call["bias"] is not None and b is None):
        return e
    n, c, h, wd = (int(d) for d in x.shape)
    k, cg, r, s = (int(d) for d in w.shape)
    for name, a in (("x", x), ("w", w)):
        if a.size > INT32_MAX:
            e.value_problems.append(f"{name} has {a.size} elements")
    g = groups
    if c % g:
        e.value_problems.append(f"C={c} not divisible by groups={g}")
    if k % g:
        e.value_problems.append(f"K={k} not divisible by groups={g}")
    if cg != c // g:
        e.value_problems.append(f"w.shape[1]={cg} != C/groups={c // g}")
    if r == 0 or s == 0:
        e.value_problems.append("kernel size 0")
    if b is not None and b.shape[0] != k:
        e.value_problems.append(f"bias has {b.shape[0]} elements, K={k}")
    if padding == "same" and stride != (1, 1):
        e.value_problems.append(f"padding='same' with stride {stride}")
    if e.named_variant and e.named_variant.startswith("wino_"):
        m = _fitting_variants()[e.named_variant][1]["m"]
        if (r, s) != (3, 3) or stride != (1, 1) or dilation != (1, 1):
            e.value_problems.append(f"{e.named_variant} takes 3x3 filters at stride 1 and dilation 1 only")
        elif (m + 2) ** 2 * k * cg * 4 > 128 << 20:
            e.value_problems.append(f"{e.named_variant}'s transformed filters over 128 MiB")
    if e.named_variant and e.named_variant.startswith("stem_") and (g != 1 or cg * r * s > 256):
        e.value_problems.append(f"{e.named_variant} takes one group and at most 256 taps")
    if e.value_problems:
        return e
    (pt, pb), (pl, pr) = resolve_padding(padding, (r, s), dilation)
    eff_r = dilation[0] * (r - 1) + 1
    eff_s = dilation[1] * (s - 1) + 1
    if h + pt + pb < eff_r or wd + pl + pr < eff_s:
        e.value_problems.append("kernel larger than the padded input")
        return e
    oh = (h + pt + pb - eff_r) // stride[0] + 1
    ow = (wd + pl + pr - eff_s) // stride[1] + 1
    e.out_shape = (n, k, oh, ow)
    if 0 in (n, c, h, wd, k):
        e.value_problems.append(f"zero-size tensor x{x.shape} w{w.shape}")
        e.empty_shape = e.out_shape
        return e
    count = n * k * oh * ow
    if count > INT32_MAX:
        e.value_problems.append(f"output has {count} elements")
        return e
    e.macs = count * cg * r * s
    return e


# --------------------------------------------------------------------------------------------
# The property
# --------------------------------------------------------------------------------------------

DOCUMENTED = (TypeError, ValueError, convtune.ConvtuneError)


class TooExpensive(Exception):
    """A valid case whose output is too large to compute here (skipped, not a failure)."""


def _kind(e: BaseException) -> str:
    if isinstance(e, convtune.ConvtuneError):
        return "ConvtuneError"
    if isinstance(e, TypeError):
        return "TypeError"
    if isinstance(e, ValueError):
        return "ValueError"
    return type(e).__name__


# Inputs up to this many elements are copied to check conv2d leaves them alone; larger ones
# are huge read-only views (a copy would not fit in memory).
MAX_SNAPSHOT = 10**7


def _snapshot(v):
    if isinstance(v, np.ndarray) and v.dtype.kind in "fiu" and v.size <= MAX_SNAPSHOT:
        return (v, v.copy())
    return None


def _compare(got, ref, where: str, half: bool = False):
    assert isinstance(got, np.ndarray), f"returned {type(got).__name__} [{where}]"
    assert got.shape == ref.shape, f"shape {got.shape} != reference {ref.shape} [{where}]"
    assert got.dtype == (np.float16 if half else np.float32), f"dtype {got.dtype} [{where}]"
    if half:
        # The float16 result of the exact sum: Inf where it overflows float16's range.
        with np.errstate(all="ignore"):
            ref = np.where(np.isfinite(ref) & np.isinf(ref.astype(np.float16)), ref.astype(np.float16), ref)
        got = got.astype(np.float32)
    for label, fn in (("+inf", np.isposinf), ("-inf", np.isneginf)):
        g, r = fn(got), fn(ref)
        if not np.array_equal(g, r):
            extra = np.argwhere(g & ~r)
            missing = np.argwhere(r & ~g)
            raise AssertionError(
                f"{label} positions differ [{where}]: {len(extra)} {label} where the reference "
                f"is not (first {extra[:5].tolist()}, reference there "
                f"{ref[tuple(extra[:5].T)].tolist()}), {len(missing)} missing (first "
                f"{missing[:5].tolist()}, got there {got[tuple(missing[:5].T)].tolist()})"
            )
    inf = np.isinf(ref)
    check_close(np.where(inf, np.float32(0), got).astype(np.float32), np.where(inf, 0.0, ref),
                context=where, rtol=4 * 2.0**-11 if half else RTOL)


def check_case(case: Case) -> str:
    """Runs one case; raises AssertionError if the property fails. Returns the outcome."""
    args, kwargs = materialize(case)
    expect = expected_outcome(args, kwargs)
    where = f"{case!r}; model: {expect.reasons()}"
    if "ok" in expect.allowed and (math.prod(expect.out_shape) > MAX_RUN_OUTPUT
                                   or expect.macs > MAX_RUN_MACS):
        # The strategy keeps runnable cases cheap; only an absurd (beyond int32) stride or
        # dilation with an absurd padding can give a valid but huge output. Not run.
        if expect.big:
            raise TooExpensive(where)
        raise AssertionError(f"strategy bug: an expensive case [{where}]")
    snaps = [s for s in map(_snapshot, list(args) + list(kwargs.values())) if s is not None]
    on_device = isinstance(args[0], convtune.Tensor)
    host_x = _with_dtype(_values(case.x), case.x.dtype) if on_device else None
    try:
        got = convtune.conv2d(*args, **kwargs)
    except KeyboardInterrupt:
        raise
    except DOCUMENTED as e:
        kind = _kind(e)
        if (kind == "ValueError" and expect.named_variant
                and "the adapter allows" in str(e)):
            return "raised ValueError"
        assert kind in expect.allowed, (
            f"conv2d raised {type(e).__module__}.{type(e).__name__}: {e}\n"
            f"allowed: {sorted(expect.allowed)} [{where}]"
        )
        return "raised " + kind
    except BaseException as e:  # noqa: BLE001 - anything else (a pyo3 panic too) is a bug
        raise AssertionError(
            f"conv2d raised an undocumented {type(e).__module__}.{type(e).__name__}: {e} "
            f"[{where}]"
        ) from e
    for orig, copy in snaps:
        assert np.array_equal(orig, copy, equal_nan=orig.dtype.kind == "f"), (
            f"conv2d modified an input [{where}]"
        )
    if on_device:
        assert isinstance(got, convtune.Tensor), (
            f"conv2d of a Tensor returned {type(got).__name__} [{where}]"
        )
        assert tuple(got.shape) == tuple(expect.out_shape or ()), (
            f"Tensor shape {got.shape} != {expect.out_shape} [{where}]"
        )
        got = got.numpy()
    if "ok" not in expect.allowed:
        if (expect.empty_shape is not None and isinstance(got, np.ndarray)
                and got.shape == expect.empty_shape
                and got.dtype == (np.float16 if expect.half else np.float32)):
            return "empty"
        raise AssertionError(
            f"conv2d returned {type(got).__name__} of shape {getattr(got, 'shape', None)} but "
            f"should have raised {sorted(expect.allowed)} (true output shape "
            f"{expect.out_shape}) [{where}]"
        )
    call = dict(zip(("x", "w", "stride", "padding", "dilation", "groups", "bias"), args))
    call.update(kwargs)
    call.pop("variant", None)
    x32 = np.asarray(host_x if on_device else call.pop("x")).astype(np.float32)
    call.pop("x", None)
    w32 = np.asarray(call.pop("w")).astype(np.float32)
    b = call.pop("bias", None)
    b32 = None if b is None else np.asarray(b).astype(np.float32)
    with np.errstate(all="ignore"):
        ref = reference_conv2d(x32, w32, bias=b32, **call)
    _compare(got, ref, where, expect.half)
    return "ok"


def replay(case: Case) -> str:
    """check_case with output poisoning on, as under pytest (for replaying a printed case)."""
    convtune._convtune._set_poison(True)
    return check_case(case)


# --------------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------------


def _scramble(v: int) -> int:
    return ((v + 0x7F4A7C15) * 0x9E3779B1) % 2**32


def choice(seq):
    """sampled_from, but roughly uniform. Inside a large composite, hypothesis draws each
    choice's simplest value (index 0, the integer 0) far more often than the others, which
    would make the first element of every list and every 'rare' branch common; the drawn
    integer is scrambled first."""
    seq = tuple(seq)
    return st.integers(0, 2**32 - 1).map(lambda v: seq[_scramble(v) % len(seq)])


def pick(draw, seq):
    return draw(choice(seq))


def rare(draw, percent: int) -> bool:
    """True with about `percent` % probability."""
    return draw(choice(range(100))) < percent


def weighted(*pairs):
    """choice with integer weights: weighted((value, weight), ...)."""
    return choice([v for v, n in pairs for _ in range(n)])


BIG = (INT32_MAX, 2**31, UINT32_MAX, 2**32, 2**40, 2**62, 2**62 + 1, 2**63, 2**64, -(2**63))
BAD_PARAMS = (
    None, "1", 1.5, 2.0, np.float64(1.0), np.float32(2.0), True, False, np.bool_(True), 1j,
    {}, {"h": 1}, _Opaque(), b"1", [1], (1, 2, 3), (), ((1, 1), (1, 1)), (1, None), (1, 1.0),
    np.array([1, 1]), [True, 1], -1, 0, 2**64, -(2**64), float("nan"),
)
BAD_PADDINGS = ("SAME", "full", "", "same ", b"same", None, 0.5, -1, (0, -2), [1, 2, 3],
                True, ("same", "same"), np.float16(1))
BAD_VARIANTS = ("bogus", "", "direct", "gemm_b64x64", 123, b"direct_wg64x1_u1_k1w1", 1.0)


@st.composite
def arrays(draw, shape, role: str, tags: list, bad_value=False, bad_dtype=False):
    """An Arr for `shape` in a castable dtype, or (when asked) a Bad value or a rejected dtype."""
    if bad_value:
        kind = pick(draw, BAD_ARRAY_KINDS)
        tags.append(f"bad-{role}:{kind}")
        return Bad(kind, tuple(max(d, 1) for d in shape) if len(shape) == 4 else (1, 1, 2, 2))
    if bad_dtype:
        dtype = pick(draw, BAD_DTYPES)
        tags.append(f"bad-dtype:{dtype}")
    else:
        dtype = draw(weighted(("float32", 3), ("other", 2)))
        if dtype == "other":
            dtype = pick(draw, GOOD_DTYPES)
    layout = draw(weighted(("c", 1), ("other", 3)))
    if layout == "other":
        layout = pick(draw, X_LAYOUTS if role == "x" else LAYOUTS)
    fill = draw(weighted(("normal", 8), ("ints", 2), ("scaled", 1), ("zeros", 1)))
    if fill == "scaled":
        fill = f"scaled:{draw(st.integers(-12, 8))}"
    specials = ()
    if np.dtype("f4" if dtype == "void" else dtype).kind in "fcO" and rare(draw, 20):
        specials = tuple(draw(st.lists(
            st.tuples(st.integers(0, 10**6), choice([np.nan, np.inf, -np.inf])),
            min_size=1, max_size=3)))
        tags.append("specials")
    tags.append(f"layout:{layout}")
    tags.append(f"dtype:{dtype}")
    return Arr(tuple(shape), dtype, layout, draw(st.integers(0, 2**31)), fill, specials)


def _pair_value(draw, a: int, b: int):
    """(a, b) in one of the accepted spellings."""
    if a == b:
        form = draw(weighted(("int", 5), ("tuple", 2), ("list", 1), ("np", 1), ("np0d", 1)))
    else:
        form = draw(weighted(("tuple", 3), ("list", 1), ("nptuple", 1)))
    if form == "int":
        return a
    if form == "np":
        return np.int64(a)
    if form == "np0d":
        return np.array(a)
    if form == "list":
        return [a, b]
    if form == "nptuple":
        return (np.int32(a), np.uint8(b))
    return (a, b)


# What an invalid (or absurd) case gets wrong; one or two of these per such case.
CORRUPTIONS = (
    "bad-x", "bad-w", "bad-bias", "bad-dtype-x", "bad-dtype-w", "bad-dtype-bias", "bias-wrong",
    "bad-stride", "bad-padding", "bad-dilation", "bad-groups", "bad-variant", "break-cg",
    "break-k", "break-groups", "zero", "same-stride", "absurd", "absurd", "absurd",
)
# Share of cases with corruptions (the rest are well-formed, up to a kernel larger than the
# padded input, which small random shapes produce now and then).
CORRUPT_PERCENT = 40


@st.composite
def cases(draw):
    tags: list = []
    corrupt = set()
    if rare(draw, CORRUPT_PERCENT):
        corrupt = {pick(draw, CORRUPTIONS) for _ in range(draw(choice([1, 1, 2])))}
        tags += [f"corrupt:{c}" for c in sorted(corrupt)]
    regime = "normal"
    if not corrupt:
        regime = draw(weighted(("normal", 82), ("huge-pad", 12), ("huge-view", 6)))
    tags.append(f"regime:{regime}")
    small = regime == "huge-pad"

    # Groups and channels (sampled_from: hypothesis draws small integers far more often).
    gmode = draw(weighted(("one", 6), ("divisor", 3), ("depthwise", 2)))
    if small:
        gmode = "one"
    if gmode == "depthwise":
        c = draw(choice(range(1, 9)))
        g, cg = c, 1
        kg = draw(choice(range(1, max(1, 8 // c) + 1)))
    else:
        g = 1 if gmode == "one" else draw(choice([2, 3, 4]))
        cg = draw(weighted((1, 8), (2, 6), (3, 4), (4, 3), (5, 2), (8, 1)))
        cg = min(cg, 8 // g)
        kg = draw(weighted((1, 8), (2, 6), (3, 4), (4, 2), (8, 1)))
        kg = min(kg, max(1, 8 // g))
        c = g * cg
    if small:
        cg, kg, c = min(cg, 2), min(kg, 2), min(c, 2)
    n = draw(weighted((1, 12), (2, 6), (3, 4)))
    h = draw(choice(range(1, 13)))
    wd = draw(choice(range(1, 13)))
    r = draw(weighted((3, 12), (1, 10), (2, 8), (4, 4), (5, 4)))
    s = draw(weighted((3, 12), (1, 10), (2, 8), (4, 4), (5, 4)))
    if small:
        n = min(n, 1)
        r, s = min(r, 3), min(s, 3)
    if "zero" in corrupt:  # one zero-size dimension
        zero = draw(choice(["n", "c", "h", "w", "k", "r", "s"]))
        tags.append(f"zero:{zero}")
        n, h, wd, r, s = [0 if zero == z else v for z, v in
                          zip("nhwrs", (n, h, wd, r, s))]
        if zero == "c":
            cg = c = 0
        if zero == "k":
            kg = 0
    k = g * kg

    # Parameters.
    sh = draw(weighted((1, 6), (2, 3), (3, 2)))
    sw = draw(weighted((1, 6), (2, 3), (3, 2))) if draw(st.booleans()) else sh
    dh = draw(weighted((1, 8), (2, 2), (3, 1)))
    dw = draw(weighted((1, 8), (2, 2), (3, 1))) if draw(st.booleans()) else dh
    pmode = draw(weighted(("int", 5), ("pair", 3), ("same", 2), ("valid", 1)))
    if "same-stride" in corrupt:
        pmode = "same"
    if pmode == "same":
        padding: Any = "same"
        if "same-stride" in corrupt:  # 'same' needs stride 1
            sh = draw(choice([2, 3]))
        else:
            sh = sw = 1
    elif pmode == "valid":
        padding = "valid"
    else:
        ph = draw(choice(range(4)))
        pw = draw(choice(range(4))) if pmode == "pair" else ph
        padding = _pair_value(draw, ph, pw)
    if regime == "huge-pad":
        big = draw(choice([1000, 1001]))
        which = draw(weighted(("h", 3), ("w", 3), ("both", 2)))
        if which == "both":
            n, c, k, g, cg = min(n, 1), min(c, 1), min(k, 1), 1, min(c, 1)
            r, s = min(r, 2), min(s, 2)
            padding = draw(choice([big, (big, big), [big, big]]))
        else:
            other = draw(choice(range(4)))
            padding = (big, other) if which == "h" else (other, big)
        tags.append(f"huge-pad:{which}")
    if "zero" not in corrupt and not rare(draw, 20):
        # Mostly keep the dilated kernel within the padded input (small random images with
        # 5x5 kernels, dilation 3 and no padding would otherwise be empty convolutions often).
        (pt, pb), (pl, pr) = resolve_padding(
            padding if isinstance(padding, str) else tuple(np.broadcast_to(padding, 2)),
            (r, s), (dh, dw))
        eff_r, eff_s = dh * (r - 1) + 1, dw * (s - 1) + 1
        if h + pt + pb < eff_r:
            h = eff_r - pt - pb + pick(draw, range(3))
        if wd + pl + pr < eff_s:
            wd = eff_s - pl - pr + pick(draw, range(3))
    stride: Any = _pair_value(draw, sh, sw)
    dilation: Any = _pair_value(draw, dh, dw)
    groups: Any = g if not rare(draw, 10) else draw(
        choice([np.int64(g), np.array(g), np.uint8(g % 256)]))

    # Shape consistency.
    w_cg, w_k = cg, k
    if "break-cg" in corrupt:
        w_cg = max(cg + draw(choice([-1, 1])), 0)
    if "break-k" in corrupt:
        w_k = k + 1
    if "break-groups" in corrupt:
        groups = g + draw(choice([1, 2]))

    x_spec = draw(arrays((n, c, h, wd), "x", tags, "bad-x" in corrupt, "bad-dtype-x" in corrupt))
    w_spec = draw(arrays((w_k, w_cg, r, s), "w", tags, "bad-w" in corrupt,
                         "bad-dtype-w" in corrupt))
    bias_bad = {"bias-wrong", "bad-bias", "bad-dtype-bias"} & corrupt
    bmode = "bad" if bias_bad else draw(weighted(("none", 1), ("ok", 1)))
    bias: Any = None
    if bmode == "ok":
        bias = draw(arrays((w_k,), "bias", tags))
    elif bmode == "bad":
        if "bias-wrong" in corrupt:
            wrong = draw(choice(["short", "long", "2d", "0d"]))
            shape = {"short": (max(w_k - 1, 0),), "long": (w_k + 1,), "2d": (1, w_k),
                     "0d": ()}[wrong]
            tags.append(f"bias-wrong:{wrong}")
        else:
            shape = (w_k,)
        bias = draw(arrays(shape, "bias", tags, "bad-bias" in corrupt,
                           "bad-dtype-bias" in corrupt))
    tags.append(f"bias:{bmode}")

    if regime == "huge-view":
        x_spec, w_spec = _make_huge(draw, x_spec, w_spec, tags)

    # Absurd parameter values (some valid but beyond int32, most with gigantic outputs).
    if "absurd" in corrupt:
        which = draw(weighted(("padding", 3), ("stride", 1), ("dilation", 1), ("groups", 1)))
        # Weighted towards the int32/uint32 boundaries.
        v = draw(weighted(*[(b, 3 if b in (INT32_MAX, 2**31, UINT32_MAX) else 1) for b in BIG]))
        form = draw(choice(["both", "first", "second"]))
        val = v if form == "both" else ((v, 1) if form == "first" else (1, v))
        if which == "stride":
            stride = val
        elif which == "padding":
            padding = val
        elif which == "dilation":
            dilation = val
        else:
            groups = v
        tags.append(f"absurd:{which}")

    # Wrong types or values in the parameters.
    tags += [f"bad-param:{c[4:]}" for c in sorted(corrupt)
             if c in ("bad-stride", "bad-padding", "bad-dilation", "bad-groups")]
    if "bad-stride" in corrupt:
        stride = pick(draw, BAD_PARAMS)
    if "bad-padding" in corrupt:
        padding = pick(draw, BAD_PADDINGS)
    if "bad-dilation" in corrupt:
        dilation = pick(draw, BAD_PARAMS)
    if "bad-groups" in corrupt:
        groups = pick(draw, BAD_PARAMS)

    # The variant: usually the default rule.
    variant = None
    if "bad-variant" in corrupt:
        variant = pick(draw, BAD_VARIANTS)
    elif rare(draw, 15):
        rr, ss = max(r, 1), max(s, 1)
        names = sorted(
            name for name, (fits, kn) in _fitting_variants().items()
            if fits and (kn["family"] in ("gemm", "wino")
                         or rr * ss * kn["tk"] * kn["tw"] * max(kn["unroll"], 1) <= 256)
        )
        variant = pick(draw, names)
        tags.append(f"variant:{variant.split('_')[0]}")
    style = draw(weighted(("kw", 3), ("pos", 2), ("minimal", 2)))
    return Case(x_spec, w_spec, bias, stride, padding, dilation, groups, variant, style,
                tuple(tags))


# Long axes for huge views: beyond 2**32 (not even a valid dimension) included.
HUGE_DIMS = (2**12, 2**14, 2**16, 2**20, 2**24, 2**31, 2**32 + 3)


def _make_huge(draw, x_spec: Arr, w_spec: Arr, tags: list):
    """x (on its N, H and W axes) or w (on K, R or S) as a zero-stride view with more than
    2**31 - 1 elements; the other stays as drawn."""
    target = draw(choice(["x", "w"]))
    spec = x_spec if target == "x" else w_spec
    axes = (0, 2, 3)  # N, H, W of x; K, R, S of w (channels must match the other array)
    chosen = sorted({pick(draw, axes) for _ in range(draw(choice([1, 2, 3])))})
    shape = list(spec.shape)
    for ax in chosen:
        shape[ax] = pick(draw, HUGE_DIMS)
    if target == "w" and 0 in chosen:
        # A multiple of the drawn K stays divisible by groups (the bias then mismatches K,
        # one more ValueError).
        k = max(w_spec.shape[0], 1)
        shape[0] = max(shape[0] - shape[0] % k, k)
    while math.prod(shape) <= INT32_MAX:  # e.g. one axis of 2**12 on a small array
        shape[chosen[0]] *= 2**8
    tags.append(f"huge-view:{target}")
    tags.append("layout:huge-view")
    huge = dataclasses.replace(spec, shape=tuple(shape), layout="huge-view")
    return (huge, w_spec) if target == "x" else (x_spec, huge)


def _settings(n: int, child: bool = False):
    phases = [Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if SHRINK else [])
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=FUZZ_SEED is None and not child,
        database=None,
        phases=phases,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )


# The child's fixed seed when the parent is derandomized (so the two runs see different cases).
CHILD_SEED = 20_240_612


def _seeded(fn, child: bool = False):
    if FUZZ_SEED is not None:
        return hypothesis_seed(FUZZ_SEED + (1 if child else 0))(fn)
    if child:
        return hypothesis_seed(CHILD_SEED)(fn)
    return fn


# Explicit examples that always run, whatever hypothesis generates: every layout in a
# well-formed call, NaN/Inf, huge padding, and a few error paths.
EXAMPLES = [
    # Negative strides (x[..., ::-1]) and Fortran weights, NaN/Inf, bias.
    Case(Arr((2, 3, 7, 9), "float32", "reversed-last", 1, "normal", ((5, np.inf), (40, np.nan))),
         Arr((4, 3, 3, 2), "float32", "fortran", 2), Arr((4,), "float32", "strided", 3),
         stride=(2, 1), padding=1, tags=("example",)),
    # An infinite weight multiplies the zero padding: NaN on the border, +-inf inside.
    Case(Arr((1, 2, 6, 5), "float64", "reversed", 4, "ints"),
         Arr((3, 2, 3, 3), "float32", "transposed", 5, "normal", ((0, np.inf),)),
         padding="same", tags=("example",)),
    # Huge padding on both axes (cheap: 1x1 everything), and on one axis.
    Case(Arr((1, 1, 3, 4), "float32", "memoryview", 6), Arr((1, 1, 1, 2), "float16", "c", 7),
         padding=1000, tags=("example", "regime:huge-pad")),
    Case(Arr((2, 2, 5, 5), "int16", "broadcast", 8, "ints"), Arr((2, 2, 3, 3), ">f4", "c", 9),
         Arr((2,), "float32", "list", 10), padding=(1000, 1), dilation=(2, 1),
         tags=("example", "regime:huge-pad")),
    # Depthwise with a named GEMM variant; read-only and byte-swapped inputs.
    Case(Arr((2, 4, 9, 8), "float32", "byteswapped", 11),
         Arr((8, 1, 3, 3), "float32", "readonly", 12), groups=4, variant="gemm_b32x32x8_t4x4", padding=(0, 2), tags=("example",)),
    # x already on the GPU; nested lists; uint8.
    Case(Arr((1, 3, 6, 6), "float32", "device", 13),
         Arr((2, 3, 2, 2), "uint8", "list", 14, "ints"), stride=2, tags=("example",)),
    # Unaligned float32 and float64 arrays.
    Case(Arr((1, 2, 5, 4), "float64", "unaligned", 15),
         Arr((2, 2, 3, 3), "float32", "unaligned", 16), Arr((2,), "float32", "unaligned", 17),
         padding=1, tags=("example",)),
    # Kernel larger than the padded input; zero-size batch; wrong types.
    Case(Arr((1, 2, 3, 3)), Arr((1, 2, 5, 5)), padding=0, tags=("example",)),
    Case(Arr((0, 2, 3, 3)), Arr((1, 2, 2, 2)), tags=("example",)),
    Case(Bad("dict"), Arr((1, 2, 2, 2)), stride=1.5, tags=("example",)),
    Case(Arr((1, 2, 4, 4), "complex64"), Arr((1, 2, 2, 2), "bool"), tags=("example",)),
    Case(Bad("depth-1"), Arr((1, 2, 2, 2)), bias=Bad("none"), tags=("example",)),
    Case(Arr((1, 2, 4, 4)), Arr((1, 2, 2, 2)), padding=2**31 - 1, tags=("example",)),
    # Zero and overlapping strides from as_strided on x, w and bias, float16 x.
    Case(Arr((4, 3, 9, 9), "float16", "as-strided", 21),
         Arr((5, 3, 3, 3), "float32", "as-strided", 22), Arr((5,), "float32", "as-strided", 23),
         padding=1, tags=("example",)),
    # Terabyte views over a few bytes (broadcast_to for x, as_strided for w): ValueError.
    Case(Arr((2**20, 3, 2**12, 2**12), "float32", "huge-view", 24), Arr((4, 3, 3, 3)),
         tags=("example", "regime:huge-view")),
    Case(Arr((1, 2, 6, 6)), Arr((2**31, 2, 1, 1), "float64", "huge-view", 25),
         tags=("example", "regime:huge-view")),
    # A one-column input: kernel column 0 only ever sees padding, and holds a NaN.
    Case(Arr((1, 2, 6, 1)), Arr((2, 2, 3, 3), "float32", "c", 18, "normal", ((0, np.nan),)),
         padding=1, tags=("example",)),
]


def _with_examples(fn):
    for case in reversed(EXAMPLES):
        fn = example(case=case)(fn)
    return fn


def _signature(message: str) -> str:
    """A failure's kind: its first line without the case and with numbers blanked."""
    head = message.splitlines()[0] if message else ""
    head = head.split(" [Case(")[0]
    return re.sub(r"(?<![A-Za-z_\d])\d+", "N", head)[:160]


class Failures:
    """Property failures collected over a run: the count, and the first case of each kind."""

    def __init__(self):
        self.count = 0
        self.first = {}  # signature -> (message, case)

    def add(self, message: str, case: Case):
        self.count += 1
        self.first.setdefault(_signature(message), (message, case))

    def report(self, examples: int) -> str:
        seed = f" (CONVTUNE_FUZZ_SEED={FUZZ_SEED})" if FUZZ_SEED is not None else ""
        lines = [f"{self.count} of {examples} examples failed the property{seed}; "
                 f"{len(self.first)} kind(s), the first example of each "
                 f"(replay with check_case(<Case>)):"]
        for i, (sig, (msg, case)) in enumerate(self.first.items(), 1):
            lines.append(f"--- {i}. {sig}\n{msg[:3000]}")
        return "\n".join(lines)


def _layout_tags(case: Case) -> set:
    """The layouts a case's arrays have, so the explicit examples count in the coverage
    check too (their only tag is "example")."""
    return {f"layout:{a.layout}" for a in (case.x, case.w, case.bias) if isinstance(a, Arr)}


def _run_fuzz(n: int, given_name: str, explicit: bool, child: bool = False, log=None):
    """Runs a fuzz of n generated examples (plus the explicit ones). By default every failure is
    collected and the run goes on, so one run reports every kind of failure it met; with
    CONVTUNE_FUZZ_SHRINK=1 the first failure propagates and hypothesis shrinks it."""
    seen_tags: Counter = Counter()
    outcomes: Counter = Counter()
    failures = Failures()

    def body(case):
        if log is not None:
            log(case)
        try:
            outcome = check_case(case)
        except TooExpensive:
            reject()
        except AssertionError as e:
            if SHRINK:
                raise
            failures.add(str(e), case)
            outcome = "FAILED"
        outcomes[outcome] += 1
        for t in set(case.tags) | _layout_tags(case):
            seen_tags[t, outcome == "ok"] += 1

    body.__name__ = body.__qualname__ = given_name
    fn = given(case=cases())(body)
    if explicit and not SHRINK:  # shrinking is for generated failures
        fn = _with_examples(fn)
    fn = _seeded(_settings(n, child)(fn), child)
    fn()
    return seen_tags, outcomes, failures


def test_fuzz_conv2d():
    tags, outcomes, failures = _run_fuzz(N_EXAMPLES, "fuzz_conv2d", explicit=True)
    total = sum(outcomes.values())
    assert failures.count == 0, failures.report(total) + f"\noutcomes: {dict(outcomes)}"
    assert total >= min(N_EXAMPLES, 100), outcomes
    if FUZZ_SEED is not None or N_EXAMPLES < 150:
        return
    # The run covers what it is meant to (so a strategy edit that silently stops generating,
    # say, wrong types is noticed). Kept coarse: the derandomized stream changes with the
    # hypothesis version (6.170's generated no huge padding or terabyte views in 150 cases);
    # the explicit examples pin every layout, huge padding and terabyte views.
    computed = {t for (t, ok), _ in tags.items() if ok}
    raised = {t for (t, ok), _ in tags.items() if not ok}
    assert outcomes["ok"] >= 0.35 * total, outcomes
    assert outcomes["raised TypeError"] >= 3 and outcomes["raised ValueError"] >= 8, outcomes
    for layout in X_LAYOUTS:
        assert f"layout:{layout}" in computed, (layout, sorted(computed))
    for want in ("specials", "bias:ok", "bias:none", "regime:huge-pad"):
        assert want in computed, (want, sorted(computed))
    assert "regime:huge-view" in raised and "regime:huge-view" not in computed, sorted(raised)
    assert sum(t.startswith("dtype:") and t != "dtype:float32" for t in computed) >= 4
    assert sum(t.startswith("corrupt:") for t in raised) >= 8, sorted(raised)


# --------------------------------------------------------------------------------------------
# The same property in a child process, so an abort or segfault is a test failure
# --------------------------------------------------------------------------------------------


# Address space the child may add to what it has once its device is open: the fuzz's
# runnable cases need a few MB each.
CHILD_HEADROOM = 2 << 30


def _subprocess_main(n: int) -> int:
    """Entry point of the child: a smaller, differently seeded fuzz, each case printed before
    it runs (so a crash names it). Exit status 0: all passed; 1: property failures."""
    import faulthandler

    faulthandler.enable()
    convtune._convtune._set_poison(True)
    assert os.environ.get("CONVTUNE_TUNE") == "off", "the child must run untuned (see the parent)"
    if sys.platform.startswith("linux"):
        # A copy of a huge view then fails at once with MemoryError (a property failure)
        # instead of filling gigabytes, or, where memory is overcommitted, getting the
        # process killed. The device is opened first: the driver maps much of its memory then.
        from address_space import limit_address_space

        convtune.conv2d(np.ones((1, 1, 2, 2), np.float32), np.ones((1, 1, 1, 1), np.float32))
        limit_address_space(CHILD_HEADROOM)
    count = [0]

    def log(case):
        count[0] += 1
        print(f"CASE {count[0]}: {case!r}", flush=True)

    _, outcomes, failures = _run_fuzz(n, "fuzz_conv2d_in_child", explicit=False, child=True,
                                      log=log)
    print(f"DONE {count[0]} cases: {dict(outcomes)}", flush=True)
    if failures.count:
        print(failures.report(count[0]), file=sys.stderr, flush=True)
        return 1
    return 0


def _run_child(code: str, timeout: int = 300) -> Optional[str]:
    """Runs `code` in a fresh interpreter; None when it exits 0, else why it failed, naming the
    last "CASE ..." line it printed (the case that was running when it died)."""
    env = dict(os.environ)
    env["CONVTUNE_TUNE"] = "off"  # as in conftest (which also set a private cache dir)
    if FUZZ_SEED is not None:
        env["CONVTUNE_FUZZ_SEED"] = str(FUZZ_SEED)
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        last = [ln for ln in out.splitlines() if ln.startswith("CASE ")][-1:]
        return f"the child fuzz hung (> {timeout} s); last case started: {last}"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("CASE ")]
    done = [ln for ln in proc.stdout.splitlines() if ln.startswith("DONE ")]
    rc = proc.returncode
    if rc == 0:
        return None
    if rc == 1 and done:  # the child ran to the end; some cases failed the property
        return f"child fuzz: {done[0]}\n{proc.stderr[-12000:]}"
    last = lines[-1] if lines else "(none)"
    how = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
    return (
        f"the child fuzz process died ({how}) after starting {len(lines)} cases.\n"
        f"Last case started (the likely culprit): {last}\n"
        f"--- stderr (tail) ---\n{proc.stderr[-6000:]}"
    )


def test_fuzz_in_subprocess_never_crashes():
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {TESTS_DIR!r})
        import test_fuzz
        sys.exit(test_fuzz._subprocess_main({N_SUBPROCESS_EXAMPLES}))
    """)
    problem = _run_child(code)
    if problem:
        pytest.fail(problem)


def test_crash_guard_names_the_case_that_killed_the_child():
    """The harness itself: a child that aborts mid-case is reported with that case."""
    code = textwrap.dedent("""
        import os
        print("CASE 1: Case(fine)", flush=True)
        print("CASE 2: Case(the culprit)", flush=True)
        os.abort()
    """)
    problem = _run_child(code, timeout=60)
    assert problem is not None
    assert "died" in problem and "Case(the culprit)" in problem, problem
    assert f"signal {signal.SIGABRT.value}" in problem or "exit status" in problem, problem


# --------------------------------------------------------------------------------------------
# Regression: output sizes computed in 32 bits
# --------------------------------------------------------------------------------------------

OVERFLOW_CASES = [
    # (x shape, w shape, kwargs): true output shapes with more than 2**31 - 1 elements
    ((1, 1, 3, 3), (1, 1, 1, 1), dict(padding=2**31 - 1)),
    ((1, 1, 3, 3), (1, 1, 1, 1), dict(padding=(2**31 - 1, 0))),
    ((1, 1, 3, 3), (1, 1, 1, 1), dict(padding=(0, 2**31 - 1))),
    ((1, 1, 3, 3), (1, 1, 1, 1), dict(padding=(2**31, 0))),
    ((1, 1, 3, 3), (1, 1, 1, 1), dict(padding=2**32 - 1)),
]


@pytest.mark.parametrize("x_shape, w_shape, kwargs", OVERFLOW_CASES,
                         ids=[str(c[2]) for c in OVERFLOW_CASES])
def test_output_size_overflow_is_a_value_error(x_shape, w_shape, kwargs):
    """The output shape must be computed without wrapping at 2**32: an output of more than
    2**31 - 1 elements is a ValueError, never a small wrong-shaped result or a ShaderError."""
    x = np.ones(x_shape, np.float32)
    w = np.ones(w_shape, np.float32)
    true = output_shape(x_shape, w_shape, kwargs.get("stride", 1), kwargs.get("padding", 0),
                        kwargs.get("dilation", 1))
    assert int(np.prod(true, dtype=object)) > INT32_MAX
    try:
        got = convtune.conv2d(x, w, **kwargs)
    except ValueError:
        return
    except convtune.ConvtuneError as e:
        pytest.fail(f"{type(e).__name__} instead of ValueError (true output shape {true}): "
                    f"{str(e)[:300]}")
    pytest.fail(f"returned shape {got.shape} (values {got.ravel()[:4]}), but the true output "
                f"shape is {true}")


# --------------------------------------------------------------------------------------------
# Regression: unaligned float32 arrays
# --------------------------------------------------------------------------------------------


def _unaligned(a: np.ndarray) -> np.ndarray:
    buf = np.zeros(a.nbytes + 1, np.uint8)
    u = buf[1:].view(a.dtype).reshape(a.shape)
    u[...] = a
    assert not u.flags.aligned and u.flags.c_contiguous
    return u


@pytest.mark.parametrize("which", ["x", "w", "bias"])
def test_unaligned_float32_arrays_are_accepted(which):
    """A C-contiguous float32 array at an odd address is a valid array ("anything np.asarray
    takes"); it must not be refused with "not contiguous or is misaligned"."""
    rng = np.random.default_rng(31)
    arrs = dict(x=rng.standard_normal((1, 2, 5, 5), dtype=np.float32),
                w=rng.standard_normal((3, 2, 3, 3), dtype=np.float32),
                bias=rng.standard_normal(3, dtype=np.float32))
    ref = reference_conv2d(arrs["x"], arrs["w"], padding=1, bias=arrs["bias"])
    arrs[which] = _unaligned(arrs[which])
    got = convtune.conv2d(arrs["x"], arrs["w"], padding=1, bias=arrs["bias"])
    check_close(got, ref, context=f"unaligned {which}")


# --------------------------------------------------------------------------------------------
# Regression: valid parameters beyond int32 reach the shader as i32 constants
# --------------------------------------------------------------------------------------------

BIG_PARAM_CASES = [
    # (w shape, kwargs): valid calls with small outputs (x is 1x1x3x3)
    ((1, 1, 1, 1), dict(stride=(2**31, 1))),
    ((1, 1, 1, 1), dict(stride=2**32 - 1)),
    ((1, 1, 1, 2), dict(dilation=(2**31, 1))),
]


@pytest.mark.parametrize("w_shape, kwargs", BIG_PARAM_CASES,
                         ids=[str(c[1]) for c in BIG_PARAM_CASES])
def test_valid_huge_parameters_compute_or_raise_value_error(w_shape, kwargs):
    """stride/dilation up to 2**32 - 1 pass validation; the call must then either compute the
    (tiny) output or refuse with ValueError ("too large"), not fail with a ShaderError from an
    i32 constant that cannot hold the value."""
    x = np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)
    w = np.ones(w_shape, np.float32)
    try:
        got = convtune.conv2d(x, w, **kwargs)
    except ValueError:
        return
    except convtune.ConvtuneError as e:
        pytest.fail(f"{type(e).__name__} for a valid call: {str(e)[:400]}")
    check_close(got, reference_conv2d(x, w, **kwargs))


# --------------------------------------------------------------------------------------------
# Regression: NaN/Inf weights over the padding when the input is one column wide
# --------------------------------------------------------------------------------------------


SPECIAL_OVER_PADDING_CASES = [
    # (x shape, kwargs, variant): kernel column 0 reads input column -1 (padding) for every
    # output of the first column tile; with W == 1, OW == 1 or OW <= the variant's column
    # tile, that tile is the whole output row.
    ((1, 1, 3, 1), dict(padding=1), None),
    ((1, 1, 3, 1), dict(padding=1), "direct_wg64x1_u0_k1w1"),
    ((1, 1, 3, 1), dict(padding=1), "direct_wg64x1_u1_k1w1"),
    ((1, 1, 3, 2), dict(padding=1, stride=(1, 3)), None),
    ((1, 1, 3, 4), dict(padding=1), "direct_wg16x4_u2_k4w4"),
    ((1, 1, 3, 1), dict(padding=1), "gemm_b32x32x8_t4x4"),
    ((1, 1, 3, 4), dict(padding=1), None),
]


@pytest.mark.parametrize("x_shape, kwargs, variant", SPECIAL_OVER_PADDING_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in SPECIAL_OVER_PADDING_CASES])
@pytest.mark.parametrize("special", [np.nan, np.inf], ids=["nan", "inf"])
def test_special_weight_over_padding(x_shape, kwargs, variant, special):
    """The reference (and PyTorch) multiply the zero padding: 0 * NaN and 0 * inf are NaN, so a
    NaN/inf weight in a kernel column that sees padding makes those outputs NaN. The direct
    kernels drop the term where the padding is known when the shader is compiled (the whole
    output row in one column tile), so those outputs stay finite."""
    x = np.ones(x_shape, np.float32)
    w = np.ones((1, 1, 3, 3), np.float32)
    w[0, 0, 1, 0] = special
    got = convtune.conv2d(x, w, variant=variant, **kwargs)
    with np.errstate(invalid="ignore"):
        ref = reference_conv2d(x, w, **kwargs)
    assert np.isnan(ref[..., 0]).all()
    _compare(got, ref, f"x{x_shape} {kwargs} variant={variant}, w[0,0,1,0]={special}")
