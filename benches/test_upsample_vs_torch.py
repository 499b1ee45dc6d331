"""Smoke run of benches/upsample_vs_torch.py (``--smoke``: tiny decoder and upsampler shapes at
budget 0, the "highest" mode): it runs end to end on any adapter, with PyTorch or without
(the torch columns then stay empty), and its results are right. About 10 s on lavapipe."""

from __future__ import annotations

import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import convtune  # noqa: E402
import upsample_vs_torch as bench  # noqa: E402


def test_smoke_run_writes_its_table_and_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CONVTUNE_CACHE_DIR", str(tmp_path / "cache"))  # force=True tunes: not the user's cache
    out = tmp_path / "up.json"
    assert bench.main(["--smoke", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["meta"]["modes"] == ["highest"]
    decoders, upsamplers = result["decoders"], result["upsamplers"]
    assert [r["shape"] for r in decoders] == bench.SMOKE_DECODERS
    assert [r["shape"] for r in upsamplers] == bench.SMOKE_UPSAMPLERS
    # A decoder runs on its own family or in its lowered form on another (the runoff between
    # budget 0's must-time candidates decides which on a CPU adapter's noisy timings).
    space = set(convtune.variant_space())
    for r in decoders:
        assert r["winner"] in space and r["gpu_ms"] > 0 and r["conv_gpu_ms"] > 0
        assert r["vs_conv"] == pytest.approx(r["gpu_ms"] / r["conv_gpu_ms"])
        assert r["err"] <= 1e-5 and r["shape"] in printed
    for r in upsamplers:
        assert not r["winner"].startswith("tconv_") and r["fused_over_plain"] > 0
        assert r["e2e_numpy_ms"] > 0 and r["e2e_device_ms"] > 0
        assert r["err"] <= 1e-5 and r["shape"] in printed
    if result["meta"]["torch"] is None:
        assert all(r["cudnn_ms"] is None for r in decoders)
        assert all(r["torch_e2e_numpy_ms"] is None for r in upsamplers)


def test_same_flop_conv_has_the_transposed_conv_s_flops():
    for spec in bench.DECODERS + bench.SMOKE_DECODERS:
        t = bench.parse_spec(spec)
        c = bench.same_flop_conv(t)
        assert c.flops() == t.flops() and c.x == t.x and c.out_hw() == t.x[2:]
