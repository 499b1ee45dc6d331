"""Adapter discovery, adapter_info and time_variant."""

from __future__ import annotations

import math

import pytest

import convtune


def test_devices_lists_adapters():
    devs = convtune.devices()
    assert isinstance(devs, list) and devs
    for d in devs:
        assert isinstance(d, dict)
        for key in ("name", "backend", "type", "driver"):
            assert key in d, (key, d)
            assert isinstance(d[key], str), (key, d)
        assert d["name"]
        assert d["backend"]
    # Indices are the positions CONVTUNE_ADAPTER selects by.
    assert [d["index"] for d in devs] == list(range(len(devs)))


def test_adapter_info_limits_and_features():
    info = convtune.adapter_info()
    assert isinstance(info, dict)
    for key in ("name", "backend", "type", "driver"):
        assert isinstance(info[key], str)
    assert info["name"] in [d["name"] for d in convtune.devices()]
    limits = info["limits"]
    assert isinstance(limits, dict)
    assert isinstance(limits["max_storage_buffer_binding_size"], int)
    assert limits["max_storage_buffer_binding_size"] > 0
    for key in ("max_compute_invocations_per_workgroup", "max_compute_workgroup_storage_size",
                "max_compute_workgroups_per_dimension"):
        assert limits[key] > 0, key
    features = info["features"]
    assert isinstance(features, dict)
    assert features, "no features reported"
    assert all(isinstance(v, bool) for v in features.values()), features
    assert "timestamp_query" in features


@pytest.mark.parametrize("reps", [1, 3, 5])
def test_time_variant_default(reps):
    x_shape, w_shape = (1, 3, 32, 32), (8, 3, 3, 3)
    name, times = convtune.time_variant(x_shape, w_shape, padding=1, reps=reps, warmup=1)
    assert name == convtune.default_variant(x_shape, w_shape, padding=1)
    assert name in convtune.variant_space()
    assert isinstance(times, list) and len(times) == reps
    assert all(isinstance(t, float) and t > 0 and math.isfinite(t) for t in times), times


@pytest.mark.parametrize("variant", ["direct_wg16x4_u2_k2w2", "gemm_b32x32x8_t4x4"])
def test_time_variant_named(variant):
    name, times = convtune.time_variant((2, 4, 20, 17), (6, 2, 3, 2), stride=2, padding=1,
                                        groups=2, bias=True, variant=variant, reps=4, warmup=0)
    assert name == variant
    assert len(times) == 4
    assert all(t > 0 and math.isfinite(t) for t in times), times


def test_time_variant_does_not_disturb_conv2d():
    import numpy as np

    from reference import check_close, reference_conv2d

    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 3, 16, 16), dtype=np.float32)
    w = rng.standard_normal((8, 3, 3, 3), dtype=np.float32)
    convtune.time_variant(x.shape, w.shape, padding=1, reps=2)
    check_close(convtune.conv2d(x, w, padding=1), reference_conv2d(x, w, padding=1))
