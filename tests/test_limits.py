"""Problems larger than one storage binding or one dispatch dimension run split, correctly."""

import warnings

import numpy as np
import pytest

import convtune
from convtune.reference import conv2d_reference, max_relative_error
from tuning_support import tuning_env  # noqa: F401 (a fixture)

CASES = [
    # x shape, w shape, stride, padding, dilation, groups, bias
    ((3, 4, 17, 13), (6, 4, 3, 3), 1, 1, 1, 1, True),
    ((2, 4, 30, 9), (4, 1, 5, 3), 2, (7, 1), (2, 1), 4, False),
    ((1, 2, 40, 5), (3, 2, 1, 1), 3, 20, 1, 1, True),
    ((2, 3, 9, 9), (2, 3, 4, 4), 1, "same", 1, 1, False),
    ((1, 3, 50, 7), (5, 3, 7, 3), 1, 3, 1, 1, True),
]


@pytest.mark.parametrize("binding", [3000, 700, 256])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_split_into_images_and_row_bands_matches_reference(monkeypatch, binding, case):
    """A small forced binding limit makes every case run as image chunks or row bands."""
    monkeypatch.setenv("CONVTUNE_MAX_BINDING", str(binding))
    xs, ws, stride, padding, dilation, groups, has_bias = CASES[case]
    rng = np.random.default_rng(case * 7 + binding)
    x = rng.standard_normal(xs, dtype=np.float32)
    w = rng.standard_normal(ws, dtype=np.float32)
    b = rng.standard_normal(ws[0], dtype=np.float32) if has_bias else None
    try:
        y = convtune.conv2d(x, w, stride, padding, dilation, groups, b)
    except ValueError as e:
        # Only acceptable when even one output row cannot fit the forced limit.
        assert "too wide" in str(e) or "largest storage binding" in str(e)
        return
    ref = conv2d_reference(x, w, stride, padding, dilation, groups, b)
    assert max_relative_error(y, ref) <= 1e-5


def test_bands_entirely_in_padding_follow_the_zero_padded_reference(monkeypatch):
    monkeypatch.setenv("CONVTUNE_MAX_BINDING", "256")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 2, 40, 5), dtype=np.float32)
    w = rng.standard_normal((3, 2, 1, 1), dtype=np.float32)
    w[1, 0, 0, 0] = np.inf  # 0 * inf = nan on padding rows, as in the reference
    b = rng.standard_normal(3, dtype=np.float32)
    y = convtune.conv2d(x, w, stride=3, padding=20, bias=b)
    ref = conv2d_reference(x, w, 3, 20, 1, 1, b)
    assert np.array_equal(np.isnan(y), np.isnan(ref))
    assert max_relative_error(y, ref) <= 1e-5


def test_input_larger_than_lavapipes_binding_limit():
    """x of 136 MB crosses a 128 MiB storage-binding limit (lavapipe's); a 1x1 conv keeps the
    reference cheap."""
    limit = convtune.adapter_info()["limits"]["max_storage_buffer_binding_size"]
    shape = (1, 64, 512, 1040)
    if 4 * np.prod(shape) <= limit:
        pytest.skip(f"adapter binds {limit} bytes; this input fits")
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape, dtype=np.float32)
    w = rng.standard_normal((3, 64, 1, 1), dtype=np.float32)
    y = convtune.conv2d(x, w)
    ref = np.einsum("kc,nchw->nkhw", w[:, :, 0, 0].astype(np.float64), x.astype(np.float64))
    assert max_relative_error(y, ref) <= 1e-5


def test_output_larger_than_lavapipes_binding_limit():
    """y of 151 MB with a 3x3 window: bands carry their halo rows."""
    limit = convtune.adapter_info()["limits"]["max_storage_buffer_binding_size"]
    xs, ws = (1, 2, 1024, 1024), (36, 2, 3, 3)
    if 4 * 36 * 1024 * 1024 <= limit:
        pytest.skip(f"adapter binds {limit} bytes; this output fits")
    rng = np.random.default_rng(2)
    x = rng.standard_normal(xs, dtype=np.float32)
    w = rng.standard_normal(ws, dtype=np.float32)
    y = convtune.conv2d(x, w, padding=1)
    # The reference for a band of rows around each split point (and the edges) suffices:
    # rows elsewhere run the same kernel on the same kind of band.
    for r0 in (0, 200, 450, 460, 500, 1016):
        r1 = r0 + 8
        lo, hi = max(r0 - 1, 0), min(r1 + 1, 1024)
        xp = np.pad(x[:, :, lo:hi], ((0, 0), (0, 0), (1 if r0 == 0 else 0, 1 if r1 == 1024 else 0), (1, 1)))
        ref = conv2d_reference(xp, w)
        assert max_relative_error(y[:, :, r0:r1], ref[:, :, : r1 - r0]) <= 1e-5, r0


def test_more_workgroups_than_one_dispatch_dimension_allows():
    limit = convtune.adapter_info()["limits"]["max_compute_workgroups_per_dimension"]
    rng = np.random.default_rng(3)
    # 1x1 conv over 200k pixels with the direct family (64 pixels per workgroup): > 65535 groups.
    x = rng.standard_normal((1, 1, 2000, 6600), dtype=np.float32)
    w = rng.standard_normal((1, 1, 1, 1), dtype=np.float32)
    assert 2000 * 6600 / 64 > limit
    y = convtune.conv2d(x, w, variant="direct_wg64x1_u1_k1w1")
    assert max_relative_error(y, x.astype(np.float64) * float(w[0, 0, 0, 0])) <= 1e-6


def test_a_problem_run_in_pieces_is_tuned_on_its_piece(tuning_env, monkeypatch):
    """A problem larger than one storage binding is tuned on the piece shape its kernels run
    and cached under the whole problem: no warning, and later calls find the entry."""
    monkeypatch.setenv("CONVTUNE_MAX_BINDING", "3000")
    monkeypatch.setenv("CONVTUNE_TUNE", "auto")
    xs, ws = (3, 4, 17, 13), (6, 4, 3, 3)  # 3536 bytes per image: row bands
    rng = np.random.default_rng(11)
    x = rng.standard_normal(xs, dtype=np.float32)
    w = rng.standard_normal(ws, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", convtune.ConvtuneWarning)
        y = convtune.conv2d(x, w, padding=1)
        e = convtune.explain(xs, ws, padding=1)
    assert max_relative_error(y, conv2d_reference(x, w, padding=1)) <= 1e-5
    assert e.source == "cache" and e.report is not None
    # The report is the piece's: one image, a band of its rows.
    assert e.report.shape.startswith("1x4x") and e.report.shape != "3x4x17x13 k6 3x3 s1 p1"
    assert e.variant == e.report.winner
