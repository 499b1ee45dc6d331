"""PyTorch's own test samples for ``torch.nn.functional.conv2d`` and ``conv_transpose2d`` (the
OpInfo sample and error inputs that ship in ``torch.testing``), run through convtune: every
sample, batched and unbatched, matches PyTorch's float64 result with PyTorch's output shape,
and every error input is refused (ValueError, TypeError or a ConvtuneError), but for mixed
integer/float dtypes, which convtune casts to float32 by design and computes. Skipped where torch is not
installed."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import convtune

torch = pytest.importorskip("torch")
try:
    import expecttest  # noqa: F401  (torch's test helpers import it; the samples do not use it)
except ImportError:
    import types
    import unittest

    sys.modules["expecttest"] = types.SimpleNamespace(TestCase=unittest.TestCase)  # type: ignore[assignment]
opinfo = pytest.importorskip("torch.testing._internal.common_methods_invocations")

# Each function's parameters after its input, in PyTorch's order: positional sample
# arguments are named by it.
PARAMS = {
    "nn.functional.conv2d": ("weight", "bias", "stride", "padding", "dilation", "groups"),
    "nn.functional.conv_transpose2d": ("weight", "bias", "stride", "padding", "output_padding", "groups", "dilation"),
}
OPS = {op.name: op for op in opinfo.op_db if op.name in PARAMS and not op.variant_test_name}


def _named(name, sample):
    named = dict(zip(PARAMS[name], sample.args))
    named.update(sample.kwargs)
    return named


def _numpy(v):
    return v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v


def _convtune_call(name, x, named):
    kw = {k: _numpy(v) for k, v in named.items()}
    w = kw.pop("weight")
    fn = convtune.conv_transpose2d if "transpose" in name else convtune.conv2d
    return fn(_numpy(x), w, **kw)


def _samples(name):
    return list(OPS[name].sample_inputs("cpu", torch.float64))


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_opinfo_samples_match_float64(name):
    if name not in OPS:
        pytest.skip(f"this torch has no OpInfo for {name}")
    samples = _samples(name)
    assert samples, name
    unbatched = 0
    for i, sample in enumerate(samples):
        named = _named(name, sample)
        want = OPS[name].op(sample.input, *sample.args, **sample.kwargs).numpy()
        got = _convtune_call(name, sample.input, named)
        context = f"{name} sample {i}: x {tuple(sample.input.shape)} {named.get('weight').shape} " \
                  f"{ {k: v for k, v in named.items() if k != 'weight' and not isinstance(v, torch.Tensor)} }"
        assert got.shape == want.shape, context
        unbatched += sample.input.ndim == 3
        scale = max(np.abs(want).max(), 1e-30)
        assert np.abs(got.astype(np.float64) - want).max() <= 1e-5 * scale, context
    assert unbatched, f"{name}: the samples hold no unbatched input"


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_opinfo_error_inputs_are_refused(name):
    if name not in OPS or OPS[name].error_inputs_func is None:
        pytest.skip(f"this torch has no error inputs for {name}")
    accepted = []
    for e in OPS[name].error_inputs("cpu"):
        s = e.sample_input
        if "should be the same" in str(e.error_regex):
            # Mixed dtypes (integer x and w, a float64 bias): convtune casts integer and
            # float64 data to float32 by design (docs/api.md), so it computes the float64
            # result of the values given where PyTorch refuses the mix.
            try:
                got = _convtune_call(name, s.input, _named(name, s))
            except (ValueError, TypeError, convtune.ConvtuneError):
                continue  # refused too (e.g. complex data)
            f64 = [v.double() if isinstance(v, torch.Tensor) else v for v in s.args]
            want = OPS[name].op(s.input.double(), *f64,
                                **{k: v.double() if isinstance(v, torch.Tensor) else v for k, v in s.kwargs.items()}).numpy()
            assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), e.error_regex
            continue
        try:
            _convtune_call(name, s.input, _named(name, s))
        except (ValueError, TypeError, convtune.ConvtuneError):
            continue
        accepted.append(f"x {tuple(s.input.shape)} {s.input.dtype} {_named(name, s)!r}: PyTorch raises "
                        f"{e.error_type.__name__} {e.error_regex!r}")
    assert not accepted, "\n".join(accepted)
