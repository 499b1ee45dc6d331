"""Tuning a model ahead from its ONNX file (``convtune.tune_onnx``, ``python -m convtune tune
--onnx``): models built here with onnx.helper, every attribute the reader takes, the epilogue
a fused call would use, the problems then found in the cache by the calls a user makes, and
bad files refused with a message naming the node."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import convtune
from tuning_support import tuning_env  # noqa: F401  (a fixture)

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from convtune._onnx import OnnxError, conv_nodes  # noqa: E402


def _init(name, shape, rng):
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)


def _model(path, batch="N"):
    """x (batch, 4, 10, 12) -> Conv 3x3 p1 +bias -> Relu -> Conv 3x3 s2 d1 group 2 -> Add(skip)
    -> Clip(0, 6); x -> ConvTranspose 4x4 s2 p1 op0; x -> Conv 1x1 -> LeakyRelu; the first
    conv again without its Relu, twice (two nodes, one problem)."""
    rng = np.random.default_rng(0)
    inits = [
        _init("w1", (8, 4, 3, 3), rng), _init("b1", (8,), rng),
        _init("w2", (8, 4, 3, 3), rng),
        _init("w3", (4, 6, 4, 4), rng),
        _init("w4", (5, 4, 1, 1), rng),
        numpy_helper.from_array(np.array(0.0, np.float32), "lo"), numpy_helper.from_array(np.array(6.0, np.float32), "hi"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1], strides=[2, 2], group=2),
        helper.make_node("Conv", ["x", "w5"], ["skip"], name="down", strides=[2, 2]),
        helper.make_node("Add", ["c2", "skip"], ["a2"], name="add2"),
        helper.make_node("Clip", ["a2", "lo", "hi"], ["y1"], name="clip2"),
        helper.make_node("ConvTranspose", ["x", "w3"], ["y2"], name="up", strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "w4"], ["c4"], name="conv4"),
        helper.make_node("LeakyRelu", ["c4"], ["y3"], name="leaky", alpha=0.2),
        helper.make_node("Conv", ["x", "w1", "b1"], ["y4"], name="conv1_again", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "w1", "b1"], ["y5"], name="conv1_twin", pads=[1, 1, 1, 1]),
    ]
    inits.append(_init("w5", (8, 4, 1, 1), rng))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4, 10, 12])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y1", "y2", "y3", "y4", "y5")]
    graph = helper.make_graph(nodes, "g", [x], outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, path)
    return path


def test_the_reader_finds_each_problem_as_a_fused_call_makes_it(tmp_path):
    nodes = {tuple(n.names): n for n in conv_nodes(_model(str(tmp_path / "m.onnx")), batch=2)}
    conv1 = nodes[("conv1",)]
    assert conv1.x == (2, 4, 10, 12) and conv1.w == (8, 4, 3, 3)
    plain = dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1, bias=True)
    assert conv1.kwargs == dict(plain, activation="relu")
    assert nodes[("conv1_again", "conv1_twin")].kwargs == plain  # one problem, two nodes
    conv2 = nodes[("conv2",)]
    assert conv2.x == (2, 8, 10, 12) and conv2.kwargs["groups"] == 2 and conv2.kwargs["stride"] == (2, 2)
    # The Add of conv2's and down's outputs fuses into down, the later node (conv2's output is z).
    assert "z" not in conv2.kwargs and "activation" not in conv2.kwargs
    down = nodes[("down",)]
    assert down.kwargs["z"] is True and down.kwargs["activation"] == "clamp" and down.kwargs["clamp"] == (0.0, 6.0)
    up = nodes[("up",)]
    assert up.kwargs["transposed"] and up.kwargs["output_padding"] == (0, 0) and up.w == (4, 6, 4, 4)
    leaky = nodes[("conv4",)]
    assert leaky.kwargs["activation"] == "leaky_relu" and leaky.kwargs["negative_slope"] == pytest.approx(0.2)


def test_tune_onnx_fills_the_cache_the_calls_then_use(tmp_path, tuning_env):  # noqa: F811
    path = _model(str(tmp_path / "m.onnx"))
    rows = convtune.tune_onnx(path, batch=1, budget=0.1, export=tmp_path / "cache.json", progress=False)
    problems = conv_nodes(path, batch=1)
    assert len(rows) == len(problems) and all(r["winner"] in convtune.variant_space() for r in rows)
    assert os.path.getsize(tmp_path / "cache.json") > 0
    # The fused call of conv1 (bias + relu) finds its problem tuned: explain says from the cache.
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 4, 10, 12)).astype(np.float32)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    e = convtune.explain(x, w, padding=1, bias=b, activation="relu")
    assert "cache" in str(e.source).lower(), e.source


def test_the_command_line_tunes_a_model(tmp_path, tuning_env):  # noqa: F811
    path = _model(str(tmp_path / "m.onnx"))
    env = dict(os.environ, CONVTUNE_PROGRESS="0")
    out = subprocess.run([sys.executable, "-m", "convtune", "tune", "--onnx", path, "--batch", "1", "--budget", "0.1",
                          "--export", str(tmp_path / "c.json")], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "conv1" in out.stdout and "up" in out.stdout and (tmp_path / "c.json").exists()


def test_bad_files_get_clear_errors(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model at all")
    with pytest.raises(OnnxError, match="not an ONNX model"):
        conv_nodes(str(bad))
    path = _model(str(tmp_path / "m.onnx"))
    with pytest.raises(OnnxError, match="symbolic batch dimension"):
        conv_nodes(path)
    # Asymmetric pads, named by node.
    m = onnx.load(path)
    for a in m.graph.node[0].attribute:
        if a.name == "pads":
            a.ints[:] = [0, 0, 1, 1]
    onnx.save(m, str(tmp_path / "asym.onnx"))
    with pytest.raises(OnnxError, match="node 'conv1': asymmetric pads"):
        conv_nodes(str(tmp_path / "asym.onnx"), batch=1)
    # No convolution at all.
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])])
    onnx.save(helper.make_model(g), str(tmp_path / "noconv.onnx"))
    with pytest.raises(OnnxError, match="no Conv or ConvTranspose"):
        conv_nodes(str(tmp_path / "noconv.onnx"))
