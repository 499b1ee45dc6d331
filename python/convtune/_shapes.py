"""Conv problem shapes as the command line takes them: spec strings in the form convtune
prints as a report's ``shape`` (``"8x64x56x56 k64 3x3 s1 p1"``), JSON objects, and files
holding a list of either.

Spec string: ``NxCxHxW kK RxS`` followed, in any order, by ``sS`` or ``sSH,SW`` (stride,
default 1), ``pP``, ``pPH,PW``, ``psame`` or ``pvalid`` (padding, default 0), ``dD`` or
``dDH,DW`` (dilation, default 1), ``gG`` (groups, default 1), ``+b`` (with bias), ``nhwc``
(x and y channels-last; the dims stay written N, C, H, W), ``f16`` (float16 data) and ``T``
(a transposed convolution, ``conv_transpose2d``: K is its output channels) with ``opP`` or
``opPH,PW`` (its output padding, default 0), and ``psR`` (``conv2d(..., pixel_shuffle=R)``:
depth-to-space by R fused into the store; K is the conv's output channels, divisible by R²,
the result has K/R² channels; ``ps1`` is no shuffle and reads as if absent; with ``T``, the
shuffle of the transposed convolution's output, ``conv_transpose2d(..., pixel_shuffle=R)``).

JSON object: ``{"x": [N, C, H, W], "w": [K, C/groups, R, S], "stride": 1, "padding": 1,
"dilation": 1, "groups": 1, "bias": false, "layout": "NCHW", "dtype": "float32"}``; only
``x`` and ``w`` are required (x always as N, C, H, W), pairs may be ``[h, w]`` lists and
padding may be ``"same"`` or ``"valid"``. A transposed convolution adds ``"transposed": true``
(and ``"output_padding"``); its ``w`` is then ``[C, K/groups, R, S]``, as PyTorch's. A fused
pixel shuffle adds ``"pixel_shuffle": R``.

Labels print the tokens in the order convtune's reports do (``T``/``op`` after ``d``, ``ps``
after ``g``, then ``+b``, ``nhwc``, ``f16``); a problem without a shuffle prints no ``ps``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Tuple, Union

Pair = Tuple[int, int]

SPEC_SYNTAX = ("NxCxHxW kK RxS [sS|sSH,SW] [pP|pPH,PW|psame|pvalid] [dD|dDH,DW] [T [opP|opPH,PW]] "
               "[gG] [psR] [+b] [nhwc] [f16] [reflect|replicate|circular]")
JSON_KEYS = ("x", "w", "stride", "padding", "dilation", "groups", "bias", "layout", "dtype",
             "transposed", "output_padding", "pixel_shuffle", "padding_mode")


class ShapeError(ValueError):
    """A shape spec, JSON item or shape file that cannot be read; the message says where."""


@dataclass(frozen=True)
class Shape:
    """One conv2d problem: the arguments ``convtune.tune`` and ``time_variant`` take."""

    x: Tuple[int, int, int, int]
    w: Tuple[int, int, int, int]
    stride: Pair = (1, 1)
    padding: Union[str, Pair] = (0, 0)
    dilation: Pair = (1, 1)
    groups: int = 1
    bias: bool = False
    layout: str = "NCHW"
    dtype: str = "float32"
    # A transposed convolution's output padding (w is then (C, K/groups, R, S)); None for a
    # plain one.
    output_padding: Optional[Pair] = None
    # Depth-to-space by this factor fused into the store (``conv2d(..., pixel_shuffle=r)``); 1:
    # none. w, out_channels() and flops() stay the conv's (K before the shuffle).
    pixel_shuffle: int = 1
    # What the padding holds (``conv2d(..., padding_mode=...)``).
    padding_mode: str = "zeros"

    @property
    def transposed(self) -> bool:
        return self.output_padding is not None

    def out_channels(self) -> int:
        return self.w[1] * self.groups if self.transposed else self.w[0]

    def args(self) -> tuple:
        """Positional arguments of ``convtune.tune``/``time_variant``/``default_variant``
        (x's dims in the layout's order)."""
        n, c, h, wd = self.x
        x = (n, h, wd, c) if self.layout == "NHWC" else self.x
        return (x, self.w, self.stride, self.padding, self.dilation, self.groups)

    def kwargs(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"bias": True} if self.bias else {}
        if self.layout != "NCHW":
            out["layout"] = self.layout
        if self.dtype != "float32":
            out["dtype"] = self.dtype
        if self.transposed:
            out.update(transposed=True, output_padding=self.output_padding)
        if self.pixel_shuffle != 1:
            out["pixel_shuffle"] = self.pixel_shuffle
        if self.padding_mode != "zeros":
            out["padding_mode"] = self.padding_mode
        return out

    def out_hw(self) -> Pair:
        (_, _, h, wd), (_, _, r, s) = self.x, self.w
        eff = (self.dilation[0] * (r - 1) + 1, self.dilation[1] * (s - 1) + 1)
        if self.output_padding is not None:
            assert isinstance(self.padding, tuple)
            return (
                (h - 1) * self.stride[0] - 2 * self.padding[0] + eff[0] + self.output_padding[0],
                (wd - 1) * self.stride[1] - 2 * self.padding[1] + eff[1] + self.output_padding[1],
            )
        if self.padding == "same":
            return (h, wd)
        pad = (0, 0) if self.padding == "valid" else self.padding
        assert isinstance(pad, tuple)
        return (
            (h + 2 * pad[0] - eff[0]) // self.stride[0] + 1,
            (wd + 2 * pad[1] - eff[1]) // self.stride[1] + 1,
        )

    def flops(self) -> float:
        """Multiply-adds times two, as cuDNN and the benchmark tables count them (a transposed
        convolution: one per input element, output channel of its group and tap)."""
        if self.transposed:
            n, c, h, wd = self.x
            _, kg, r, s = self.w
            return 2.0 * n * c * h * wd * kg * r * s
        oh, ow = self.out_hw()
        k, cg, r, s = self.w
        return 2.0 * self.x[0] * k * oh * ow * cg * r * s

    def label(self) -> str:
        """The spec string (``parse_spec`` reads it back)."""
        def pair(p: Pair) -> str:
            return str(p[0]) if p[0] == p[1] else f"{p[0]},{p[1]}"

        n, c, h, wd = self.x
        _, _, r, s = self.w
        out = f"{n}x{c}x{h}x{wd} k{self.out_channels()} {r}x{s} s{pair(self.stride)}"
        out += f" p{self.padding}" if isinstance(self.padding, str) else f" p{pair(self.padding)}"
        if self.dilation != (1, 1):
            out += f" d{pair(self.dilation)}"
        if self.output_padding is not None:
            out += " T" + (f" op{pair(self.output_padding)}" if self.output_padding != (0, 0) else "")
        if self.groups != 1:
            out += f" g{self.groups}"
        if self.pixel_shuffle != 1:
            out += f" ps{self.pixel_shuffle}"
        out += " +b" if self.bias else ""
        out += " nhwc" if self.layout == "NHWC" else ""
        return out + (" f16" if self.dtype == "float16" else "")

    def with_channels(self, c: int = 0, k: int = 0) -> "Shape":
        """This shape with C and/or K changed (0 keeps one); C/groups follows C."""
        n, c0, h, wd = self.x
        _, _, r, s = self.w
        c, k = c or c0, k or self.out_channels()
        if c % self.groups:
            raise ShapeError(f"groups={self.groups} must divide C={c}")
        if self.transposed:
            if k % self.groups:
                raise ShapeError(f"groups={self.groups} must divide K={k}")
            return replace(self, x=(n, c, h, wd), w=(c, k // self.groups, r, s))
        return replace(self, x=(n, c, h, wd), w=(k, c // self.groups, r, s))


_SPEC_TOKENS = {
    "stride": re.compile(r"s(\d+)(?:,(\d+))?"),
    "padding": re.compile(r"p(?:(same|valid)|(\d+)(?:,(\d+))?)"),
    "dilation": re.compile(r"d(\d+)(?:,(\d+))?"),
    "groups": re.compile(r"g(\d+)"),
    "bias": re.compile(r"\+b"),
    "layout": re.compile(r"nhwc"),
    "dtype": re.compile(r"f16"),
    "transposed": re.compile(r"T"),
    "output_padding": re.compile(r"op(\d+)(?:,(\d+))?"),
    "pixel_shuffle": re.compile(r"ps(\d+)"),
    "padding_mode": re.compile(r"(reflect|replicate|circular)"),
}


def _check_shuffle(r: int, k: int) -> None:
    """The pixel shuffle rules ``conv2d`` and ``conv_transpose2d`` apply, checked while
    reading the shape (K: the output channels before the shuffle)."""
    if r < 1:
        raise ShapeError(f"pixel shuffle r must be >= 1, got {r}")
    if r == 1:
        return
    if k % (r * r):
        raise ShapeError(f"pixel shuffle ps{r} needs K divisible by r*r = {r * r}, got K={k}")


def parse_spec(text: str) -> Shape:
    """A ``Shape`` from a spec string; ShapeError naming the bad token otherwise."""
    if not isinstance(text, str):
        raise TypeError(f"a shape spec must be a str, got {type(text).__name__}")
    tokens = text.split()
    if len(tokens) < 3:
        raise ShapeError(f"shape spec {text!r} is incomplete; expected {SPEC_SYNTAX}")
    m_x = re.fullmatch(r"(\d+)x(\d+)x(\d+)x(\d+)", tokens[0])
    m_k = re.fullmatch(r"k(\d+)", tokens[1])
    m_rs = re.fullmatch(r"(\d+)x(\d+)", tokens[2])
    for ok, tok, what in ((m_x, tokens[0], "NxCxHxW"), (m_k, tokens[1], "kK"), (m_rs, tokens[2], "RxS")):
        if not ok:
            raise ShapeError(f"shape spec {text!r}: {tok!r} is not {what}; expected {SPEC_SYNTAX}")
    assert m_x and m_k and m_rs
    n, c, h, wd = (int(v) for v in m_x.groups())
    k, r, s = int(m_k.group(1)), int(m_rs.group(1)), int(m_rs.group(2))
    found: Dict[str, re.Match] = {}
    for tok in tokens[3:]:
        for name, pattern in _SPEC_TOKENS.items():
            m = pattern.fullmatch(tok)
            if m:
                if name in found:
                    raise ShapeError(f"shape spec {text!r}: {name} given twice")
                found[name] = m
                break
        else:
            raise ShapeError(f"shape spec {text!r}: unrecognised {tok!r}; expected {SPEC_SYNTAX}")

    def pair(m: Any, default: Pair) -> Pair:
        if m is None:
            return default
        a = int(m.group(1))
        return (a, int(m.group(2)) if m.group(2) else a)

    padding: Union[str, Pair] = (0, 0)
    if "padding" in found:
        pm = found["padding"]
        padding = pm.group(1) or (int(pm.group(2)), int(pm.group(3) or pm.group(2)))
    groups = int(found["groups"].group(1)) if "groups" in found else 1
    if groups < 1 or c % groups:
        raise ShapeError(f"shape spec {text!r}: groups={groups} must be >= 1 and divide C={c}")
    transposed = "transposed" in found
    if "output_padding" in found and not transposed:
        raise ShapeError(f"shape spec {text!r}: an output padding (op) needs T (a transposed convolution)")
    if transposed and (k % groups or isinstance(padding, str)):
        raise ShapeError(f"shape spec {text!r}: a transposed convolution needs groups dividing K={k} "
                         "and a numeric padding")
    shuffle = int(found["pixel_shuffle"].group(1)) if "pixel_shuffle" in found else 1
    try:
        _check_shuffle(shuffle, k)
    except ShapeError as e:
        raise ShapeError(f"shape spec {text!r}: {e}") from None
    return Shape(
        x=(n, c, h, wd),
        w=(c, k // groups, r, s) if transposed else (k, c // groups, r, s),
        output_padding=pair(found.get("output_padding"), (0, 0)) if transposed else None,
        stride=pair(found.get("stride"), (1, 1)),
        padding=padding,
        dilation=pair(found.get("dilation"), (1, 1)),
        groups=groups,
        bias="bias" in found,
        layout="NHWC" if "layout" in found else "NCHW",
        dtype="float16" if "dtype" in found else "float32",
        pixel_shuffle=shuffle,
        padding_mode=found["padding_mode"].group(1) if "padding_mode" in found else "zeros",
    )


def _padding_mode(v: Any) -> str:
    if v not in ("zeros", "reflect", "replicate", "circular"):
        raise ShapeError(f"padding_mode must be \"zeros\", \"reflect\", \"replicate\" or \"circular\", got {json.dumps(v)}")
    return v


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ShapeError(f"{what} must be an integer, got {json.dumps(v)}")
    return v


def _ints(v: Any, n: int, what: str) -> tuple:
    if not isinstance(v, list) or len(v) != n:
        raise ShapeError(f"{what} must be a list of {n} integers, got {json.dumps(v)}")
    return tuple(_int(e, what) for e in v)


def _pair(v: Any, what: str) -> Pair:
    if isinstance(v, list):
        return _ints(v, 2, what)  # type: ignore[return-value]
    a = _int(v, what)
    return (a, a)


def from_json(item: Any) -> Shape:
    """A ``Shape`` from one JSON item: an object (see the module doc) or a spec string."""
    if isinstance(item, str):
        return parse_spec(item)
    if not isinstance(item, dict):
        raise ShapeError(f"expected an object with keys {', '.join(JSON_KEYS)} or a spec string, got {json.dumps(item)}")
    unknown = sorted(set(item) - set(JSON_KEYS))
    if unknown:
        raise ShapeError(f"unknown key(s) {', '.join(map(repr, unknown))}; accepted: {', '.join(JSON_KEYS)}")
    for key in ("x", "w"):
        if key not in item:
            raise ShapeError(f"missing {key!r} ({'[N, C, H, W]' if key == 'x' else '[K, C/groups, R, S]'})")
    padding: Union[str, Pair]
    p = item.get("padding", 0)
    if isinstance(p, str):
        if p not in ("same", "valid"):
            raise ShapeError(f"padding must be an integer, a pair, 'same' or 'valid', got {json.dumps(p)}")
        padding = p
    else:
        padding = _pair(p, "padding")
    bias = item.get("bias", False)
    if not isinstance(bias, bool):
        raise ShapeError(f"bias must be true or false, got {json.dumps(bias)}")
    layout = item.get("layout", "NCHW")
    if layout not in ("NCHW", "NHWC"):
        raise ShapeError(f"layout must be \"NCHW\" or \"NHWC\", got {json.dumps(layout)}")
    dtype = item.get("dtype", "float32")
    if dtype not in ("float32", "float16"):
        raise ShapeError(f"dtype must be \"float32\" or \"float16\", got {json.dumps(dtype)}")
    transposed = item.get("transposed", False)
    if not isinstance(transposed, bool):
        raise ShapeError(f"transposed must be true or false, got {json.dumps(transposed)}")
    if "output_padding" in item and not transposed:
        raise ShapeError("output_padding needs \"transposed\": true")
    if transposed and isinstance(padding, str):
        raise ShapeError(f"a transposed convolution's padding must be an integer or a pair, got {json.dumps(p)}")
    output_padding = _pair(item.get("output_padding", 0), "output_padding") if transposed else None
    w = _ints(item["w"], 4, "w")
    shuffle = _int(item.get("pixel_shuffle", 1), "pixel_shuffle")
    groups = _int(item.get("groups", 1), "groups")
    _check_shuffle(shuffle, w[1] * groups if transposed else w[0])
    return Shape(
        x=_ints(item["x"], 4, "x"),  # type: ignore[arg-type]
        w=w,  # type: ignore[arg-type]
        stride=_pair(item.get("stride", 1), "stride"),
        padding=padding,
        dilation=_pair(item.get("dilation", 1), "dilation"),
        groups=groups,
        bias=bias,
        layout=layout,
        dtype=dtype,
        output_padding=output_padding,
        pixel_shuffle=shuffle,
        padding_mode=_padding_mode(item.get("padding_mode", "zeros")),
    )


def _is_json(path: str, text: str) -> bool:
    return path.lower().endswith(".json") or text.lstrip()[:1] in ("[", "{")


def load(path: Union[str, "os.PathLike[str]"]) -> List[Tuple[str, Shape]]:
    """Every shape in a file, each with where it came from (``"file:line"`` for text,
    ``"file: item i"`` for JSON). JSON files hold a list (or ``{"shapes": [...]}``) of
    objects or spec strings; other files one spec string per line, ``#`` starting a comment.
    Raises ShapeError naming the file and the line or item."""
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ShapeError(f"cannot read shape file {name}: {e}") from None
    out: List[Tuple[str, Shape]] = []
    if _is_json(name, text):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ShapeError(f"{name}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
        if isinstance(data, dict) and set(data) == {"shapes"}:
            data = data["shapes"]
        if not isinstance(data, list):
            raise ShapeError(f"{name}: expected a JSON list of shapes (or {{\"shapes\": [...]}})")
        for i, item in enumerate(data, 1):
            where = f"{name}: item {i}"
            try:
                out.append((where, from_json(item)))
            except ShapeError as e:
                raise ShapeError(f"{where}: {e}") from None
    else:
        for lineno, line in enumerate(text.splitlines(), 1):
            spec = line.split("#", 1)[0].strip()
            if not spec:
                continue
            where = f"{name}:{lineno}"
            try:
                out.append((where, parse_spec(spec)))
            except ShapeError as e:
                raise ShapeError(f"{where}: {e}") from None
    if not out:
        raise ShapeError(f"{name}: no shapes in the file")
    return out
