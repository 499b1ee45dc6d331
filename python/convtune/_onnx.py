"""A model's convolutions, read from its ONNX file, to tune ahead of its first run.

Every ``Conv`` and ``ConvTranspose`` node becomes the problem the matching ``conv2d`` /
``conv_transpose2d`` call makes: x's shape from the graph (ONNX shape inference; a symbolic
batch dimension is set by ``batch``), strides, pads, dilations, group, ``auto_pad``,
``output_padding`` and bias, and the epilogue a fused call would take from the nodes that
follow it alone: an ``Add`` (the residual ``z``), then a ``Relu``, ``LeakyRelu`` or ``Clip``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple


class OnnxError(ValueError):
    """A file convtune cannot read the convolutions of (the message names the node)."""


@dataclass
class ConvNode:
    """One convolution of the model: its node names (nodes sharing a problem) and the
    arguments of ``convtune.tune`` for it."""

    names: List[str]
    x: Tuple[int, int, int, int]
    w: Tuple[int, int, int, int]
    kwargs: Dict[str, Any] = field(default_factory=dict)

    def key(self) -> tuple:
        return (self.x, self.w, tuple(sorted((k, repr(v)) for k, v in self.kwargs.items())))


def _onnx():
    try:
        import onnx
    except ImportError:
        raise ImportError("reading ONNX files needs the onnx package: pip install 'convtune[onnx]' "
                          "(or pip install onnx)") from None
    return onnx


def _attrs(node) -> Dict[str, Any]:
    onnx = _onnx()
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _set_batch(model, batch: Optional[int]) -> None:
    """Gives every graph input's symbolic leading dimension the value ``batch``."""
    inits = {i.name for i in model.graph.initializer}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        dims = inp.type.tensor_type.shape.dim
        for i, d in enumerate(dims):
            if d.HasField("dim_value"):
                continue
            if i == 0 and batch is not None:
                d.dim_value = batch
            elif i == 0:
                raise OnnxError(f"input {inp.name!r} has a symbolic batch dimension "
                                f"({d.dim_param or '?'}): give the batch size (--batch N)")
            else:
                raise OnnxError(f"input {inp.name!r} has a dynamic dimension {i} ({d.dim_param or '?'}): "
                                "convolutions need static spatial sizes")


def _shapes(model) -> Dict[str, Tuple[int, ...]]:
    shapes: Dict[str, Tuple[int, ...]] = {}
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[vi.name] = tuple(int(d.dim_value) for d in dims)
    for init in model.graph.initializer:
        shapes[init.name] = tuple(int(d) for d in init.dims)
    return shapes


def _scalar(model, name: str) -> Optional[float]:
    onnx = _onnx()
    for init in model.graph.initializer:
        if init.name == name:
            return float(onnx.numpy_helper.to_array(init).reshape(-1)[0])
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            return float(onnx.numpy_helper.to_array(_attrs(node)["value"]).reshape(-1)[0])
    return None


def _padding(name: str, attrs: Dict[str, Any], transposed: bool) -> Any:
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto == "VALID":
        return "valid"
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        if transposed:
            raise OnnxError(f"node {name!r}: auto_pad {auto} on a ConvTranspose is not supported; give pads")
        if any(s != 1 for s in attrs.get("strides", [1, 1])):
            raise OnnxError(f"node {name!r}: auto_pad {auto} with a stride above 1 is not supported; give pads")
        return "same"  # PyTorch's (and SAME_UPPER's) extra row and column at the bottom and right
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    if len(pads) != 4:
        raise OnnxError(f"node {name!r}: pads {pads} is not a 2-D convolution's")
    top, left, bottom, right = pads
    if (top, left) != (bottom, right):
        raise OnnxError(f"node {name!r}: asymmetric pads {pads} (begin {top, left}, end {bottom, right}) "
                        "are not supported by conv2d; pad x beforehand or use auto_pad SAME_UPPER")
    return (top, left)


def _epilogue(model, consumers: Dict[str, list], producers: Dict[str, int], out: str) -> Dict[str, Any]:
    """The epilogue a fused call takes from the nodes after ``out`` (each the only consumer).
    An ``Add`` of two convolutions' outputs fuses into the later one (the earlier one's
    output is its ``z``)."""
    kw: Dict[str, Any] = {}
    nxt = consumers.get(out, [])
    if len(nxt) == 1 and nxt[0].op_type == "Add":
        other = [i for i in nxt[0].input if i != out]
        mine = producers.get(out, -1)
        if any(producers.get(o, -1) > mine and _is_conv(model, producers.get(o, -1)) for o in other):
            return kw
        kw["z"] = True
        out = nxt[0].output[0]
        nxt = consumers.get(out, [])
    if len(nxt) == 1:
        node = nxt[0]
        if node.op_type == "Relu":
            kw["activation"] = "relu"
        elif node.op_type == "LeakyRelu":
            kw["activation"] = "leaky_relu"
            kw["negative_slope"] = float(_attrs(node).get("alpha", 0.01))
        elif node.op_type == "Clip":
            a = _attrs(node)
            lo = a.get("min") if "min" in a else (_scalar(model, node.input[1]) if len(node.input) > 1 and node.input[1] else None)
            hi = a.get("max") if "max" in a else (_scalar(model, node.input[2]) if len(node.input) > 2 and node.input[2] else None)
            if lo is not None and hi is not None:
                kw["activation"] = "clamp"
                kw["clamp"] = (float(lo), float(hi))
    return kw


def _is_conv(model, index: int) -> bool:
    return 0 <= index < len(model.graph.node) and model.graph.node[index].op_type in ("Conv", "ConvTranspose")


def conv_nodes(path: str, batch: Optional[int] = None) -> List[ConvNode]:
    """The model's distinct convolution problems, in graph order, each with its nodes' names."""
    onnx = _onnx()
    try:
        model = onnx.load(path)
    except FileNotFoundError:
        raise
    except Exception as e:  # protobuf's DecodeError and friends
        raise OnnxError(f"{path}: not an ONNX model ({type(e).__name__}: {e})") from None
    if not model.graph.node:
        raise OnnxError(f"{path}: not an ONNX model with a graph")
    _set_batch(model, batch)
    model = onnx.shape_inference.infer_shapes(model)
    shapes = _shapes(model)
    consumers: Dict[str, list] = {}
    producers: Dict[str, int] = {}
    for index, node in enumerate(model.graph.node):
        for i in node.input:
            consumers.setdefault(i, []).append(node)
        for o in node.output:
            producers[o] = index
    found: Dict[tuple, ConvNode] = {}
    for node in model.graph.node:
        if node.op_type not in ("Conv", "ConvTranspose"):
            continue
        name = node.name or f"{node.op_type}({node.output[0]})"
        transposed = node.op_type == "ConvTranspose"
        x, w = shapes.get(node.input[0]), shapes.get(node.input[1])
        if x is None or len(x) != 4:
            raise OnnxError(f"node {name!r}: its input's shape is not a known 4-D shape ({x}); "
                            "2-D convolutions with static sizes only")
        if w is None or len(w) != 4:
            raise OnnxError(f"node {name!r}: its weights' shape is not a known 4-D shape ({w})")
        a = _attrs(node)
        kw: Dict[str, Any] = dict(
            stride=tuple(a.get("strides", [1, 1])),
            padding=_padding(name, a, transposed),
            dilation=tuple(a.get("dilations", [1, 1])),
            groups=int(a.get("group", 1)),
        )
        if len(node.input) > 2 and node.input[2]:
            kw["bias"] = True
        if transposed:
            kw["transposed"] = True
            kw["output_padding"] = tuple(a.get("output_padding", [0, 0]))
        kw.update(_epilogue(model, consumers, producers, node.output[0]))
        conv = ConvNode([name], x, w, kw)  # type: ignore[arg-type]
        if conv.key() in found:
            found[conv.key()].names.append(name)
        else:
            found[conv.key()] = conv
    if not found:
        raise OnnxError(f"{path}: the model has no Conv or ConvTranspose node")
    return list(found.values())
