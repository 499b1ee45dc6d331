"""Unbatched inputs, as PyTorch takes them: x of shape (C, H, W) ((H, W, C) in NHWC) is a
batch of one, and the result drops the batch dimension exactly as PyTorch does; the epilogue's
z is then unbatched too."""

from __future__ import annotations

import numpy as np
import pytest

import convtune
from convtune.reference import apply_epilogue, conv2d_reference, conv_transpose2d_reference, pixel_shuffle_reference
from reference import check_close, nhwc

F16 = convtune.adapter_info()["features"]["shader_f16"]


def _inputs(seed, xs, ws):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32), rng


@pytest.mark.parametrize("kw", [dict(padding=1), dict(stride=2, padding=(1, 0), groups=2, dilation=(1, 2))])
def test_conv2d_of_an_unbatched_x_drops_the_batch(kw):
    x, w, _ = _inputs(1, (6, 11, 10), (4, 6 // kw.get("groups", 1), 3, 3))
    got = convtune.conv2d(x, w, **kw)
    want = conv2d_reference(x[None], w, **kw)[0]
    assert got.shape == want.shape
    check_close(got, want)
    check_close(got, convtune.conv2d(x[None], w, **kw)[0])


def test_nhwc_unbatched_is_h_w_c():
    x, w, _ = _inputs(2, (5, 9, 8), (7, 5, 3, 3))
    got = convtune.conv2d(np.ascontiguousarray(x.transpose(1, 2, 0)), w, padding=1, layout="NHWC")
    check_close(got, nhwc(conv2d_reference(x[None], w, padding=1))[0])


def test_epilogue_z_and_pixel_shuffle_are_unbatched_too():
    x, w, rng = _inputs(3, (4, 6, 7), (8, 4, 3, 3))
    b = rng.standard_normal(8).astype(np.float32)
    conv = conv2d_reference(x[None], w, padding=1)
    z = rng.standard_normal(conv.shape[1:]).astype(np.float32)
    got = convtune.conv2d(x, w, bias=b, padding=1, z=z, alpha2=0.5, activation="relu")
    check_close(got, apply_epilogue(conv, b, z=z[None], alpha2=0.5, activation="relu")[0])
    shuffled = convtune.conv2d(x, w, padding=1, pixel_shuffle=2)
    check_close(shuffled, pixel_shuffle_reference(conv, 2)[0])
    with pytest.raises(ValueError, match="z must be 3-D like the unbatched output"):
        convtune.conv2d(x, w, padding=1, z=z[None])


def test_conv_transpose2d_of_an_unbatched_x():
    x, w, _ = _inputs(4, (6, 5, 4), (6, 3, 3, 3))
    kw = dict(stride=2, padding=1, output_padding=1)
    got = convtune.conv_transpose2d(x, w, **kw)
    check_close(got, conv_transpose2d_reference(x[None], w, **kw)[0])


@pytest.mark.skipif(not F16, reason="the adapter has no 16-bit shader floats")
def test_float16_unbatched_stays_float16():
    x, w, _ = _inputs(5, (4, 8, 8), (4, 4, 3, 3))
    got = convtune.conv2d(x.astype(np.float16), w.astype(np.float16), padding=1)
    assert got.dtype == np.float16 and got.shape == (4, 8, 8)


def test_other_ranks_are_still_value_errors():
    x, w, _ = _inputs(6, (4, 8, 8), (4, 4, 3, 3))
    for bad in (x[0], x[None, None]):
        with pytest.raises(ValueError, match=r"x must be 4-D .* or unbatched 3-D"):
            convtune.conv2d(bad, w)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_unbatched_tensors_stay_unbatched_through_a_chain(layout):
    x, w, rng = _inputs(6, (4, 7, 6), (6, 4, 3, 3))
    w2 = rng.standard_normal((5, 6, 1, 1)).astype(np.float32)
    xin = np.ascontiguousarray(x.transpose(1, 2, 0)) if layout == "NHWC" else x
    t = convtune.to_device(xin, layout=layout)
    assert t.shape == xin.shape and t.unbatched and t._dims[0] == 1
    assert "shape=(" + ", ".join(map(str, xin.shape)) + ")" in repr(t)
    np.testing.assert_array_equal(t.numpy(), xin)
    z = rng.standard_normal((5, 7, 6)).astype(np.float32)
    zin = np.ascontiguousarray(z.transpose(1, 2, 0)) if layout == "NHWC" else z
    mid = convtune.conv2d(t, convtune.to_device(w), padding=1)
    out = convtune.conv2d(mid, w2, z=zin, alpha2=0.5)
    want = apply_epilogue(conv2d_reference(conv2d_reference(x[None], w, padding=1), w2), z=z[None], alpha2=0.5)[0]
    want = np.ascontiguousarray(want.transpose(1, 2, 0)) if layout == "NHWC" else want
    assert isinstance(out, convtune.Tensor) and out.unbatched and out.shape == want.shape
    check_close(out.numpy(), want)
    # z as an unbatched Tensor too; a batched z for an unbatched host x is refused above.
    check_close(convtune.conv2d(mid, w2, z=convtune.to_device(zin, layout=layout), alpha2=0.5).numpy(), want)


def test_introspection_takes_unbatched_shapes():
    x, w, _ = _inputs(7, (4, 9, 8), (6, 4, 3, 3))
    one = (1, 4, 9, 8)
    for xs in [(4, 9, 8), x, convtune.to_device(x)]:
        assert convtune.default_variant(xs, w.shape, padding=1) == convtune.default_variant(one, w.shape, padding=1)
        assert convtune.wgsl("direct_wg64x1_u1_k4w1", xs, w.shape, padding=1) == \
            convtune.wgsl("direct_wg64x1_u1_k4w1", one, w.shape, padding=1)
    name, times = convtune.time_variant((4, 9, 8), w.shape, padding=1, variant="direct_wg64x1_u1_k4w1", reps=2)
    assert name == "direct_wg64x1_u1_k4w1" and len(times) == 2 and min(times) > 0
    assert convtune.tune((4, 9, 8), w.shape, padding=1, budget=0.1).shape == convtune.tune(one, w.shape, padding=1, budget=0.1).shape
    assert str(convtune.explain((4, 9, 8), w.shape, padding=1)) == str(convtune.explain(one, w.shape, padding=1))
    with pytest.raises(ValueError, match="unbatched"):
        convtune.default_variant((9, 8), w.shape)
