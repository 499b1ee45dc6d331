"""Every error path of conv2d (and of the shape-taking helpers): the exception class and a
fragment of its message, and that a valid call still works after each error."""

from __future__ import annotations

import re

import numpy as np
import pytest

import convtune
from reference import check_close, reference_conv2d

RNG = np.random.default_rng(99)
X = RNG.standard_normal((2, 4, 8, 7), dtype=np.float32)  # N=2, C=4
W = RNG.standard_normal((6, 4, 3, 3), dtype=np.float32)  # K=6, groups=1
W2 = RNG.standard_normal((6, 2, 3, 3), dtype=np.float32)  # K=6, groups=2
B = RNG.standard_normal(6, dtype=np.float32)


@pytest.fixture(autouse=True)
def valid_call_still_works():
    """After every test here (each provokes errors), a valid conv2d still gives the right answer."""
    yield
    got = convtune.conv2d(X, W2, stride=(2, 1), padding=1, groups=2, bias=B)
    check_close(got, reference_conv2d(X, W2, stride=(2, 1), padding=1, groups=2, bias=B))


def _raises(exc, fragment, fn, *args, **kwargs):
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    # The exact class asked for, or a subclass of it; and the message names the problem.
    assert re.search(fragment, str(info.value)), f"{type(info.value).__name__}: {info.value}"
    return info.value


# (id, args, kwargs, exception, message fragment (regex))
VALUE_ERRORS = [
    # Ranks
    ("x-5d", (X[None], W), {}, "x must be 4-D"),
    ("x-2d", (X[0, 0], W), {}, "x must be 4-D"),
    ("w-3d", (X, W[0]), {}, "w must be 4-D"),
    ("w-5d", (X, W[None]), {}, "w must be 4-D"),
    # Channels and groups
    ("channel-mismatch", (X, W[:, :3]), {}, r"w\.shape\[1\] must be C/groups"),
    ("channel-mismatch-groups", (X, W), dict(groups=2), r"w\.shape\[1\] must be C/groups"),
    ("c-not-divisible", (X, W[:3, :1]), dict(groups=3), r"C=4 are not divisible by groups=3"),
    ("k-not-divisible", (X, W2[:5]), dict(groups=2), r"K=5 .*not divisible by groups=2"),
    ("groups-0", (X, W), dict(groups=0), "groups must be >= 1"),
    ("groups-negative", (X, W), dict(groups=-2), "groups must be >= 1"),
    # Stride, dilation, padding
    ("stride-0", (X, W), dict(stride=0), "stride must be >= 1"),
    ("stride-negative", (X, W), dict(stride=-1), "stride must be >= 1"),
    ("stride-pair-0", (X, W), dict(stride=(1, 0)), "stride must be >= 1"),
    ("stride-3-values", (X, W), dict(stride=(1, 2, 3)), r"stride must be an int or an \(h, w\) pair"),
    ("stride-1-value", (X, W), dict(stride=(1,)), r"stride must be an int or an \(h, w\) pair"),
    ("stride-too-large", (X, W), dict(stride=2**40), "stride must be <= 65535"),
    ("dilation-0", (X, W), dict(dilation=0), "dilation must be >= 1"),
    ("dilation-pair-0", (X, W), dict(dilation=(0, 1)), "dilation must be >= 1"),
    ("dilation-negative", (X, W), dict(dilation=-3), "dilation must be >= 1"),
    ("padding-negative", (X, W), dict(padding=-1), "padding must be >= 0"),
    ("padding-pair-negative", (X, W), dict(padding=(0, -1)), "padding must be >= 0"),
    ("padding-full", (X, W), dict(padding="full"), "padding must be an int, an .* 'same' or 'valid'"),
    ("padding-SAME", (X, W), dict(padding="SAME"), "padding must be an int, an .* 'same' or 'valid'"),
    ("padding-empty-str", (X, W), dict(padding=""), "padding must be an int, an .* 'same' or 'valid'"),
    ("padding-3-values", (X, W), dict(padding=(1, 1, 1)), r"padding must be an int or an \(h, w\) pair"),
    ("same-stride-2", (X, W), dict(padding="same", stride=2), "padding='same' needs stride 1"),
    ("same-stride-1x2", (X, W), dict(padding="same", stride=(1, 2)), "padding='same' needs stride 1"),
    # Empty outputs
    ("kernel-larger", (X, RNG.standard_normal((2, 4, 9, 3))), {}, "larger than the padded input"),
    ("kernel-larger-w", (X, RNG.standard_normal((2, 4, 3, 8))), {}, "larger than the padded input"),
    ("dilated-kernel-larger", (X, W), dict(dilation=4), "larger than the padded input"),
    ("kernel-larger-valid", (X, RNG.standard_normal((2, 4, 9, 1))), dict(padding="valid"),
     "larger than the padded input"),
    # Zero-size dimensions
    ("n-0", (X[:0], W), {}, "empty"),
    ("c-0", (X[:, :0], W[:, :0]), {}, "empty"),
    ("h-0", (X[:, :, :0], W), dict(padding=1), "empty"),
    ("h-0-unpadded", (X[:, :, :0], W[:, :, :1, :1]), {}, "empty"),
    ("w-0", (X[:, :, :, :0], W), dict(padding=2), "empty"),
    ("k-0", (X, W[:0]), {}, "empty"),
    ("r-0", (X, W[:, :, :0]), {}, "kernel size must be >= 1"),
    ("s-0", (X, W[:, :, :, :0]), {}, "kernel size must be >= 1"),
    # Bias
    ("bias-short", (X, W), dict(bias=B[:5]), "bias must have K=6 elements"),
    ("bias-long", (X, W), dict(bias=np.zeros(7, np.float32)), "bias must have K=6 elements"),
    ("bias-2d", (X, W), dict(bias=B[None]), "bias must be 1-D"),
    ("bias-2d-column", (X, W), dict(bias=B[:, None]), "bias must be 1-D"),
    ("bias-empty", (X, W), dict(bias=B[:0]), "bias must have K=6 elements"),
    # Variants
    ("variant-unknown", (X, W), dict(variant="bogus"), "unknown variant name"),
    ("variant-empty", (X, W), dict(variant=""), "unknown variant name"),
    ("variant-bad-knob", (X, W), dict(variant="direct_wg64x1_u3_k4w1"), "unknown variant name"),
    ("variant-truncated", (X, W), dict(variant="gemm_b64x64"), "unknown variant name"),
    ("variant-trailing", (X, W), dict(variant="gemm_b64x64x16_t4x4 "), "unknown variant name"),
]


@pytest.mark.parametrize("args, kwargs, fragment", [c[1:] for c in VALUE_ERRORS],
                         ids=[c[0] for c in VALUE_ERRORS])
def test_value_errors(args, kwargs, fragment):
    e = _raises(ValueError, fragment, convtune.conv2d, *args, **kwargs)
    assert not isinstance(e, convtune.ConvtuneError)


def test_zero_d_bias_is_rejected():
    """bias must be 1-D with K elements (as in PyTorch); a 0-d scalar is not, even when K=1."""
    x = np.ones((1, 1, 3, 3), np.float32)
    w = np.ones((1, 1, 1, 1), np.float32)
    _raises(ValueError, "bias must be 1-D", convtune.conv2d, x, w, bias=np.float32(5.0))
    _raises(ValueError, "bias must be 1-D", convtune.conv2d, x, w, bias=5.0)


@pytest.mark.parametrize("kwargs", [dict(stride=2**64), dict(dilation=(1, 2**70)),
                                    dict(padding=2**64), dict(groups=2**64)],
                         ids=["stride", "dilation", "padding", "groups"])
def test_huge_ints_are_value_errors(kwargs):
    """Out-of-range ints are 'a bad parameter' (ValueError), like 2**40 already is."""
    _raises(ValueError, "too large|must be", convtune.conv2d, X, W, **kwargs)


TYPE_ERRORS = [
    ("x-none", (None, W), {}, "x must be an array, got None"),
    ("w-none", (X, None), {}, "w must be an array, got None"),
    ("x-str", ("abc", W), {}, "x has dtype"),
    ("w-str", (X, "abc"), {}, "w has dtype"),
    ("x-ragged", ([[[[1.0, 2.0]], [[1.0]]]], W), {}, "x cannot be converted to an array"),
    ("stride-float", (X, W), dict(stride=1.5), "stride must be an int"),
    ("stride-float-pair", (X, W), dict(stride=(1, 2.0)), "stride must be an int"),
    ("stride-none", (X, W), dict(stride=None), "stride must be an int"),
    ("stride-str", (X, W), dict(stride="1"), "stride must be an int"),
    ("stride-bool", (X, W), dict(stride=True), "stride must be an int, got bool"),
    ("stride-bool-pair", (X, W), dict(stride=(1, True)), "stride must be an int, got bool"),
    ("stride-np-bool", (X, W), dict(stride=np.bool_(True)), "stride must be an int, got bool"),
    ("dilation-bool", (X, W), dict(dilation=False), "dilation must be an int, got bool"),
    ("dilation-float", (X, W), dict(dilation=2.0), "dilation must be an int"),
    ("padding-bool", (X, W), dict(padding=True), "padding must be an int, got bool"),
    ("padding-float", (X, W), dict(padding=0.5), "padding must be an int"),
    ("padding-none", (X, W), dict(padding=None), "padding must be an int"),
    ("groups-str", (X, W2), dict(groups="2"), "groups must be an int"),
    ("groups-float", (X, W2), dict(groups=2.0), "groups must be an int"),
    ("groups-bool", (X, W), dict(groups=True), "groups must be an int, got bool"),
    ("groups-tuple", (X, W2), dict(groups=(2, 2)), "groups must be an int"),
    ("variant-int", (X, W), dict(variant=123), "variant must be a str"),
]


@pytest.mark.parametrize("args, kwargs, fragment", [c[1:] for c in TYPE_ERRORS],
                         ids=[c[0] for c in TYPE_ERRORS])
def test_type_errors(args, kwargs, fragment):
    _raises(TypeError, fragment, convtune.conv2d, *args, **kwargs)


def test_bools_are_refused_after_the_equal_ints_were_seen():
    # Normalised shapes are kept per call signature; True == 1 must not find 1's entry.
    convtune.conv2d(X, W, stride=1, padding=(1, 1), groups=1)
    for kw in (dict(stride=True), dict(padding=(1, True)), dict(groups=True), dict(padding=True)):
        _raises(TypeError, "got bool", convtune.conv2d, X, W, **{"stride": 1, "padding": (1, 1), **kw})
    _raises(TypeError, "stride must be an int", convtune.conv2d, X, W, stride=1.0)


BAD_DTYPES = [
    np.bool_,
    np.complex64,
    np.complex128,
    object,
    np.str_,
    np.bytes_,
    "datetime64[s]",
    "timedelta64[ms]",
]


@pytest.mark.parametrize("dtype", BAD_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("which", ["x", "w", "bias"])
def test_bad_dtypes_are_type_errors(dtype, which):
    args = dict(x=X, w=W, bias=B)
    arr = args[which]
    if np.dtype(dtype).kind in "mM":
        bad = arr.astype(np.int64).astype(dtype)
    elif np.dtype(dtype).kind in "US":
        bad = arr.astype(dtype)
    else:
        bad = arr.astype(dtype)
    args[which] = bad
    _raises(TypeError, f"{which} has dtype", convtune.conv2d, args["x"], args["w"], bias=args["bias"])


def test_object_array_of_floats_is_a_type_error():
    _raises(TypeError, "x has dtype object", convtune.conv2d, X.astype(object), W)


def test_variant_beyond_adapter_limits():
    limit = convtune.adapter_info()["limits"]["max_compute_workgroup_storage_size"]
    too_big = []
    for name in convtune.variant_space():
        k = convtune.variant_knobs(name)
        if k["family"] == "gemm" and 4 * k["bk"] * (k["bm"] + k["bn"] + 1) > limit:
            too_big.append(name)
    if not too_big:
        pytest.skip("every variant fits this adapter")
    for name in too_big:
        _raises(ValueError, "the adapter allows", convtune.conv2d, X, W, variant=name)


# --------------------------------------------------------------------------------------------
# The shape-taking helpers validate the same way.
# --------------------------------------------------------------------------------------------

HELPER_ERRORS = [
    ("default-stride-0", convtune.default_variant, ((1, 4, 8, 8), (6, 4, 3, 3)), dict(stride=0),
     ValueError, "stride must be >= 1"),
    ("default-channels", convtune.default_variant, ((1, 4, 8, 8), (6, 3, 3, 3)), {},
     ValueError, r"w\.shape\[1\] must be C/groups"),
    ("default-same-stride", convtune.default_variant, ((1, 4, 8, 8), (6, 4, 3, 3)),
     dict(padding="same", stride=2), ValueError, "needs stride 1"),
    ("default-bias-len", convtune.default_variant, ((1, 4, 8, 8), (6, 4, 3, 3)), dict(bias=5),
     ValueError, "bias must have K=6"),
    ("default-empty", convtune.default_variant, ((1, 4, 2, 2), (6, 4, 3, 3)), {},
     ValueError, "larger than the padded input"),
    ("default-stride-bool", convtune.default_variant, ((1, 4, 8, 8), (6, 4, 3, 3)),
     dict(stride=True), TypeError, "got bool"),
    ("wgsl-unknown", convtune.wgsl, ("bogus", (1, 4, 8, 8), (6, 4, 3, 3)), {},
     ValueError, "unknown variant name"),
    ("wgsl-groups", convtune.wgsl, ("direct_wg64x1_u1_k4w1", (1, 4, 8, 8), (6, 4, 3, 3)),
     dict(groups=3), ValueError, "not divisible by groups"),
    ("time-unknown", convtune.time_variant, ((1, 4, 8, 8), (6, 4, 3, 3)), dict(variant="bogus"),
     ValueError, "unknown variant name"),
    ("time-dilation-0", convtune.time_variant, ((1, 4, 8, 8), (6, 4, 3, 3)), dict(dilation=0),
     ValueError, "dilation must be >= 1"),
    ("knobs-unknown", convtune.variant_knobs, ("bogus",), {}, ValueError, "unknown variant name"),
]


@pytest.mark.parametrize("fn, args, kwargs, exc, fragment", [c[1:] for c in HELPER_ERRORS],
                         ids=[c[0] for c in HELPER_ERRORS])
def test_helper_errors(fn, args, kwargs, exc, fragment):
    _raises(exc, fragment, fn, *args, **kwargs)


# --------------------------------------------------------------------------------------------
# Exception classes
# --------------------------------------------------------------------------------------------


def test_exception_hierarchy():
    assert issubclass(convtune.ConvtuneError, RuntimeError)
    for cls in (convtune.NoAdapterError, convtune.OutOfMemoryError, convtune.DeviceLostError,
                convtune.ShaderError):
        assert issubclass(cls, convtune.ConvtuneError), cls
        assert issubclass(cls, RuntimeError), cls
        assert cls is not convtune.ConvtuneError
        assert not issubclass(cls, (ValueError, TypeError)), cls
        assert cls.__name__ in convtune.__all__
    assert not issubclass(convtune.ConvtuneError, (ValueError, TypeError))
    assert convtune.ConvtuneError is convtune._convtune.ConvtuneError
    # The classes can be raised and caught like any exception.
    with pytest.raises(convtune.ConvtuneError):
        raise convtune.ShaderError("x")


def test_many_errors_in_a_row_then_a_valid_call():
    for _ in range(20):
        with pytest.raises(ValueError):
            convtune.conv2d(X, W, stride=0)
        with pytest.raises(ValueError):
            convtune.conv2d(X, W, variant="bogus")
        with pytest.raises(TypeError):
            convtune.conv2d(X.astype(bool), W)
    got = convtune.conv2d(X, W, padding="same")
    check_close(got, reference_conv2d(X, W, padding="same"))
