"""The introspection functions take shapes or the arrays themselves, and say clearly what
they expected when given something else."""

from __future__ import annotations

import numpy as np
import pytest

import convtune

X, W = (1, 4, 9, 8), (6, 4, 3, 3)
KW = dict(padding=1)


class Shaped:
    """Not an array, not torch: only a ``.shape``."""

    def __init__(self, shape):
        self.shape = shape


def _calls():
    """(name, call(x_shape, w_shape, **kw)) for each function taking x_shape, w_shape."""
    return [
        ("default_variant", convtune.default_variant),
        ("wgsl", lambda x, w, **kw: convtune.wgsl("direct_wg64x1_u1_k4w1", x, w, **kw)),
        ("explain", convtune.explain),
        ("tune", lambda x, w, **kw: convtune.tune(x, w, budget=0.05, **kw)),
        ("time_variant", lambda x, w, **kw: convtune.time_variant(x, w, reps=1, warmup=0, **kw)),
    ]


CALLS = _calls()
IDS = [name for name, _ in CALLS]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVTUNE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CONVTUNE_TUNE", "off")
    monkeypatch.setenv("CONVTUNE_PROGRESS", "0")
    convtune._convtune._reset_tuning_state()


def test_every_shape_taking_function_is_covered():
    import inspect

    takes_shapes = {name for name in convtune.__all__
                    if callable(getattr(convtune, name)) and not inspect.isclass(getattr(convtune, name))
                    and "x_shape" in inspect.signature(getattr(convtune, name)).parameters}
    assert takes_shapes == set(IDS)


def _key(name, result):
    """What must not depend on how the shapes were given (times do)."""
    if name == "time_variant":
        return result[0]
    if name == "explain":
        return (result.variant, result.shape, result.wgsl)
    if name == "tune":
        return (result.winner, result.shape)
    return result


@pytest.mark.parametrize("name,call", CALLS, ids=IDS)
def test_arrays_give_what_shapes_give(name, call):
    x = np.zeros(X, dtype=np.float32)
    w = np.zeros(W, dtype=np.float64)
    want = _key(name, call(X, W, **KW))
    assert _key(name, call(x, w, **KW)) == want
    assert _key(name, call(list(X), Shaped(W), **KW)) == want


def test_numpy_dims_and_device_tensors_are_accepted():
    dims = tuple(np.int64(d) for d in X)
    assert convtune.default_variant(dims, np.empty(W)) == convtune.default_variant(X, W)
    t = convtune.to_device(np.zeros(X, dtype=np.float32))
    assert convtune.wgsl("direct_wg64x1_u1_k4w1", t, W) == convtune.wgsl("direct_wg64x1_u1_k4w1", X, W)


def test_bias_may_be_the_array():
    b = np.zeros(W[0], dtype=np.float32)
    want = convtune.wgsl("direct_wg64x1_u1_k4w1", X, W, bias=True)
    assert convtune.wgsl("direct_wg64x1_u1_k4w1", X, W, bias=b) == want
    assert convtune.wgsl("direct_wg64x1_u1_k4w1", X, W, bias=W[0]) == want
    with pytest.raises(ValueError, match=r"bias must be 1-D"):
        convtune.default_variant(X, W, bias=np.zeros((2, 3)))
    with pytest.raises(TypeError, match=r"bias must be None, a bool, its length or a 1-D array"):
        convtune.default_variant(X, W, bias="yes")


BAD_TYPES = [
    (None, TypeError, "sequence of 4 ints .* or an array with .shape, got NoneType"),
    ("1,4,9,8", TypeError, "sequence of 4 ints .* or an array with .shape, got str"),
    (7, TypeError, "sequence of 4 ints .* or an array with .shape, got int"),
    (object(), TypeError, "sequence of 4 ints .* or an array with .shape, got object"),
    ({"n": 1}, ValueError, "sequence of 4 ints .*got 1 values"),  # a dict iterates its keys
    ((1, 4, 9.0, 8), TypeError, "must hold ints, got float 9.0"),
    ((1, 4, True, 8), TypeError, "must hold ints, got a bool"),
    ((1, 4, "9", 8), TypeError, "must hold ints, got str '9'"),
    (Shaped(None), TypeError, "the .shape of a Shaped is not a sequence of ints"),
]


@pytest.mark.parametrize("name,call", CALLS, ids=IDS)
@pytest.mark.parametrize("which", ["x_shape", "w_shape"])
@pytest.mark.parametrize("bad,exc,fragment", BAD_TYPES, ids=[repr(b[0])[:20] for b in BAD_TYPES])
def test_bad_types_name_the_argument(name, call, which, bad, exc, fragment):
    args = (bad, W) if which == "x_shape" else (X, bad)
    with pytest.raises(exc, match=rf"^{which}[ :].*{fragment}") as e:
        call(*args, **KW)
    assert "Spec" not in str(e.value) and "extract" not in str(e.value)


WRONG_LENGTHS = [(), (1, 4, 9), (1, 4, 9, 8, 1), [1]]


@pytest.mark.parametrize("name,call", CALLS, ids=IDS)
@pytest.mark.parametrize("bad", WRONG_LENGTHS, ids=[str(len(b)) for b in WRONG_LENGTHS])
def test_wrong_lengths_are_value_errors(name, call, bad):
    if len(bad) != 3:  # three ints are an unbatched x (test_unbatched.py)
        with pytest.raises(ValueError, match=rf"^x_shape must be a sequence of 4 ints.*got {len(bad)} values"):
            call(bad, W, **KW)
    with pytest.raises(ValueError, match=rf"^w_shape must be a sequence of 4 ints.*got {len(bad)} values"):
        call(X, bad, **KW)


@pytest.mark.parametrize("name,call", CALLS, ids=IDS)
def test_arrays_of_other_ranks_are_value_errors(name, call):
    with pytest.raises(ValueError, match=r"^x_shape must be 4-D .*ndarray of shape \(9, 8\)"):
        call(np.zeros((9, 8)), W, **KW)
    with pytest.raises(ValueError, match=r"^w_shape must be 4-D .*Shaped of shape \(6, 4, 3\)"):
        call(X, Shaped((6, 4, 3)), **KW)


@pytest.mark.parametrize("name,call", CALLS, ids=IDS)
def test_negative_dims_are_value_errors(name, call):
    with pytest.raises(ValueError, match=r"^x_shape dimensions must be >= 0, got \(1, -4, 9, 8\)"):
        call((1, -4, 9, 8), W, **KW)
    with pytest.raises(ValueError, match=r"^w_shape dimensions must be >= 0"):
        call(X, Shaped((6, 4, -3, 3)), **KW)
    with pytest.raises(ValueError, match=r"^x_shape dimension .* is too large"):
        call((1, 4, 2**70, 8), W, **KW)
