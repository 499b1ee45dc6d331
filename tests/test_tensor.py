"""GPU-resident tensors: chained convolutions without host round trips."""

import textwrap

import numpy as np
import pytest

import convtune
from convtune.reference import conv2d_reference, max_relative_error
from reference import run_ok


def test_round_trip_and_attributes():
    x = np.random.default_rng(0).standard_normal((2, 3, 5, 7), dtype=np.float32)
    t = convtune.to_device(x)
    assert isinstance(t, convtune.Tensor)
    assert t.shape == (2, 3, 5, 7) and t.dtype == "float32" and t.nbytes == x.nbytes
    assert np.array_equal(t.numpy(), x)
    assert "Tensor" in repr(t)


def test_chained_convs_match_numpy_path():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 8, 20, 18), dtype=np.float32)
    ws = [rng.standard_normal((8, 8, 3, 3), dtype=np.float32) for _ in range(3)]
    b = rng.standard_normal(8, dtype=np.float32)
    t = convtune.to_device(x)
    ref = x.astype(np.float64)
    for w in ws:
        t = convtune.conv2d(t, w, padding=1, bias=b)
        ref = conv2d_reference(ref, w, 1, 1, 1, 1, b)
    assert isinstance(t, convtune.Tensor)
    assert max_relative_error(t.numpy(), ref) <= 1e-5


def test_queued_calls_finish_in_order_and_synchronize_waits():
    """Tensor calls return with their kernel queued; intermediates dropped while queued and
    reused by later calls must not disturb the chain."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 6, 16, 16), dtype=np.float32)
    ws = [(rng.standard_normal((6, 6, 3, 3)) * 0.3).astype(np.float32) for _ in range(12)]
    t = convtune.to_device(x)
    ref = x.astype(np.float64)
    for w in ws:
        t = convtune.conv2d(t, w, padding=1)
        ref = conv2d_reference(ref, w, 1, 1)
    convtune.synchronize()
    convtune.synchronize()  # nothing queued: returns at once
    assert max_relative_error(t.numpy(), ref) <= 1e-4


def test_tensor_input_with_all_parameters():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 6, 15, 11), dtype=np.float32)
    w = rng.standard_normal((4, 3, 3, 2), dtype=np.float32)
    y = convtune.conv2d(convtune.to_device(x), w, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)
    ref = conv2d_reference(x, w, (2, 1), (1, 2), (1, 2), 2)
    assert max_relative_error(y.numpy(), ref) <= 1e-5


def test_errors():
    with pytest.raises(ValueError, match="4-D"):
        convtune.to_device(np.zeros((3, 3), np.float32) + 1)
    with pytest.raises(TypeError, match="dtype"):
        convtune.to_device(np.ones((1, 1, 2, 2), dtype=complex))
    t = convtune.to_device(np.ones((1, 2, 4, 4), np.float32))
    with pytest.raises(ValueError, match="C/groups"):
        convtune.conv2d(t, np.ones((1, 3, 3, 3), np.float32))


def test_many_calls_keep_gpu_memory_bounded():
    """10,000 calls of mixed shapes: buffers come back to the pool, allocations stay few."""
    rng = np.random.default_rng(3)
    shapes = [((1, 3, 16, 16), (4, 3, 3, 3)), ((2, 4, 9, 7), (6, 4, 1, 1)), ((1, 8, 12, 12), (8, 1, 3, 3))]
    data = [(rng.standard_normal(a, dtype=np.float32), rng.standard_normal(b, dtype=np.float32)) for a, b in shapes]
    for i in range(200):  # warm the pool
        x, w = data[i % 3]
        convtune.conv2d(x, w, groups=8 if w.shape[1] == 1 else 1)
    before = convtune.memory_stats()
    for i in range(10_000):
        x, w = data[i % 3]
        convtune.conv2d(x, w, groups=8 if w.shape[1] == 1 else 1)
    after = convtune.memory_stats()
    assert after["live_bytes"] == 0
    assert after["idle_bytes"] <= max(before["idle_bytes"], 1) * 2
    assert after["allocations"] - before["allocations"] <= 10


def test_weights_as_a_tensor():
    # Weights uploaded once: a Tensor x's calls bind them as they are, a host x's call reads
    # them back; plain, transposed, float16, bias and residual alike.
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 8, 9, 7)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    z = rng.standard_normal((2, 16, 9, 7)).astype(np.float32)
    xt, wt = convtune.to_device(x), convtune.to_device(w)
    want = convtune.conv2d(x, w, padding=1, bias=b, z=z, activation="relu")
    for xa in (xt, x):
        got = convtune.conv2d(xa, wt, padding=1, bias=b, z=z, activation="relu")
        got = got.numpy() if isinstance(got, convtune.Tensor) else got
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    wT = rng.standard_normal((8, 4, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(
        convtune.conv_transpose2d(xt, convtune.to_device(wT), stride=2, padding=1).numpy(),
        convtune.conv_transpose2d(x, wT, stride=2, padding=1), rtol=1e-5, atol=1e-5)
    xh, wh = x.astype(np.float16), (w / 8).astype(np.float16)
    np.testing.assert_array_equal(
        convtune.conv2d(convtune.to_device(xh), convtune.to_device(wh), padding=1).numpy(),
        convtune.conv2d(convtune.to_device(xh), wh, padding=1).numpy())


def test_weight_tensor_errors():
    x = np.ones((1, 8, 5, 5), np.float32)
    xt = convtune.to_device(x)
    w = np.ones((4, 8, 3, 3), np.float32)
    with pytest.raises(TypeError, match="float16"):
        convtune.conv2d(xt, convtune.to_device(w.astype(np.float16)))
    with pytest.raises(ValueError, match="NHWC Tensor"):
        convtune.conv2d(xt, convtune.to_device(np.ones((4, 3, 3, 8), np.float32), "NHWC"))
    with pytest.raises(ValueError, match="C/groups"):
        convtune.conv2d(xt, convtune.to_device(np.ones((4, 7, 3, 3), np.float32)))


POLLED_CHAIN = textwrap.dedent("""
    import numpy as np, convtune
    from convtune.reference import conv2d_reference, max_relative_error
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 8, 24, 24), dtype=np.float32)
    ws = [(rng.standard_normal((8, 8, 3, 3)) * 0.3).astype(np.float32) for _ in range(6)]
    t, ref = convtune.to_device(x), x.astype(np.float64)
    for w in ws:
        t = convtune.conv2d(t, w, padding=1)
        ref = conv2d_reference(ref, w, 1, 1)
    convtune.synchronize()
    y = convtune.conv2d(x, ws[0], padding=1)  # a numpy call: its read-back waits too
    assert max_relative_error(t.numpy(), ref) <= 1e-4
    assert max_relative_error(y, conv2d_reference(x, ws[0], 1, 1)) <= 1e-5
    print("ok")
""")


@pytest.mark.parametrize("spin_us", ["0", "200", "1000000"])
def test_waits_that_poll_or_block_give_the_same_results(spin_us):
    """CONVTUNE_SPIN_US: waits poll the device for up to that long before blocking (CPU
    adapters default to 0; forcing it here runs the polling path on lavapipe too)."""
    run_ok(POLLED_CHAIN, CONVTUNE_SPIN_US=spin_us)
