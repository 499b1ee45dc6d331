"""numpy in -> numpy out: staging is reused across calls, chunked copies land where they
belong, and last_call_timings() accounts for the call."""

from __future__ import annotations

import os
import textwrap
import threading
import time

import numpy as np
import pytest

import convtune
from convtune.reference import conv2d_reference, max_relative_error
from reference import run_ok


@pytest.fixture(autouse=True)
def _untuned(monkeypatch, tmp_path):
    monkeypatch.setenv("CONVTUNE_TUNE", "off")
    monkeypatch.setenv("CONVTUNE_CACHE_DIR", str(tmp_path))


def test_repeated_calls_allocate_nothing_new():
    """Upload staging goes back to the pool mapped, read-back staging and device buffers
    are reused: a steady stream of calls creates no buffers (several 4 MiB chunks here)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 400, 400), dtype=np.float32)  # 5 MB: two chunks each way
    w = rng.standard_normal((8, 8, 1, 1), dtype=np.float32)
    b = rng.standard_normal(8, dtype=np.float32)
    first = convtune.conv2d(x, w, bias=b)
    before = convtune.memory_stats()["allocations"]
    for _ in range(3):
        y = convtune.conv2d(x, w, bias=b)
    assert convtune.memory_stats()["allocations"] == before
    assert np.array_equal(y, first)
    assert max_relative_error(y, conv2d_reference(x, w, bias=b)) <= 1e-5


CHUNKED = textwrap.dedent("""
    import numpy as np, convtune
    from convtune.reference import conv2d_reference, max_relative_error
    rng = np.random.default_rng(1)
    cases = [((2, 3, 37, 29), (5, 3, 3, 3), 1, 1), ((1, 4, 61, 23), (3, 4, 5, 3), 2, (2, 1))]
    import os
    for binding in (10**9, 6000, 2500):
        os.environ["CONVTUNE_MAX_BINDING"] = str(binding)
        for xs, ws, stride, pad in cases:
            x = rng.standard_normal(xs, dtype=np.float32)
            w = rng.standard_normal(ws, dtype=np.float32)
            b = rng.standard_normal(ws[0], dtype=np.float32)
            y = convtune.conv2d(x, w, stride, pad, bias=b)
            err = max_relative_error(y, conv2d_reference(x, w, stride, pad, bias=b))
            assert err <= 1e-5, (binding, xs, err)
    del os.environ["CONVTUNE_MAX_BINDING"]
    t = rng.standard_normal((3, 5, 7, 11), dtype=np.float32)  # 1155 floats: ragged last chunk
    assert np.array_equal(convtune.to_device(t).numpy(), t)
    print("ok")
""")


@pytest.mark.parametrize("direct", ["0", "1"])
@pytest.mark.parametrize("threads", ["1", "3"])
def test_tiny_chunks_on_several_threads_match_the_reference(threads, direct):
    """1 KiB chunks: runs of row bands cross chunk boundaries, threads take every third
    chunk; results must still match, whole problems and split ones alike, with inputs
    written through staging or in place (CONVTUNE_DIRECT_UPLOAD)."""
    run_ok(CHUNKED, CONVTUNE_COPY_CHUNK_KB="1", CONVTUNE_COPY_THREADS=threads, CONVTUNE_DIRECT_UPLOAD=direct)


PIECES = textwrap.dedent("""
    import os
    import numpy as np, convtune
    from convtune.reference import conv2d_reference, max_relative_error
    rng = np.random.default_rng(3)
    # 3.2 MB and 1.1 MB uploads: cut into one chunk per copy thread, one submission each.
    x = rng.standard_normal((1, 8, 301, 331), dtype=np.float32)
    w = rng.standard_normal((3, 8, 3, 3), dtype=np.float32)
    y = convtune.conv2d(x, w, padding=1)
    assert max_relative_error(y, conv2d_reference(x, w, padding=1)) <= 1e-5
    t = rng.standard_normal((3, 7, 113, 117), dtype=np.float32)  # 1.1 MB, ragged pieces
    assert np.array_equal(convtune.to_device(x).numpy(), x)
    assert np.array_equal(convtune.to_device(t).numpy(), t)
    # float16, 900003 elements: cut over 3 threads, each piece would hold an odd count, which
    # put the next piece's GPU copy at an offset copies cannot start at.
    th = rng.standard_normal((1, 3, 300001, 1)).astype(np.float16)
    assert np.array_equal(convtune.to_device(th).numpy(), th)
    # float16 with an odd element count: the last piece ends on a half word.
    xh = rng.standard_normal((1, 3, 301, 331)).astype(np.float16)
    wh = rng.standard_normal((5, 3, 3, 3)).astype(np.float16)
    yh = convtune.conv2d(xh, wh, padding=1)
    assert max_relative_error(yh, conv2d_reference(xh, wh, padding=1)) <= 1e-2
    # A stream of calls reuses its input buffers (they come back mapped) and allocates nothing.
    before = convtune.memory_stats()["allocations"]
    for _ in range(3):
        x[0, 0, 0, 0] += 1.0
        y = convtune.conv2d(x, w, padding=1)
        assert max_relative_error(y, conv2d_reference(x, w, padding=1)) <= 1e-5
    assert convtune.memory_stats()["allocations"] == before
    if os.environ["CONVTUNE_DIRECT_UPLOAD"] == "0":
        assert not convtune.adapter_info()["direct_inputs"]
    print("ok")
""")


@pytest.mark.parametrize("direct", ["0", "1"])
@pytest.mark.parametrize("threads", ["1", "3", "8"])
def test_uploads_cut_across_copy_threads_land_where_they_belong(threads, direct):
    run_ok(PIECES, CONVTUNE_COPY_THREADS=threads, CONVTUNE_DIRECT_UPLOAD=direct)


def test_timings_account_for_the_whole_call():
    x = np.random.default_rng(2).standard_normal((2, 4, 20, 20))  # float64: a float32 copy
    w = np.ones((3, 4, 3, 3), dtype=np.float32)
    convtune.conv2d(x, w, padding=1)
    t0 = time.perf_counter()
    convtune.conv2d(x, w, padding=1)
    wall = time.perf_counter() - t0
    rec = convtune.last_call_timings()
    phases = rec["phases"]
    for name in ("args", "memory_check", "float32", "choose", "output_alloc", "upload", "submit",
                 "readback_submit", "gpu_wait", "download", "other"):
        assert name in phases, phases
    assert all(v >= 0 for k, v in phases.items() if k != "other"), phases
    assert phases["other"] >= -1e-6, phases
    assert sum(phases.values()) == pytest.approx(rec["total"], abs=1e-9)
    assert 0 < rec["total"] <= wall
    assert rec["minor_faults"] is None or rec["minor_faults"] >= 0


def test_timings_are_per_thread_and_cover_tensor_calls():
    w = np.ones((3, 4, 3, 3), dtype=np.float32)
    x = np.ones((1, 4, 8, 8), dtype=np.float32)
    seen = {}

    def other_thread():
        seen["before"] = convtune.last_call_timings()
        convtune.conv2d(convtune.to_device(x), w)
        seen["after"] = convtune.last_call_timings()

    convtune.conv2d(x, w)
    mine = convtune.last_call_timings()
    th = threading.Thread(target=other_thread)
    th.start()
    th.join()
    assert seen["before"] is None
    tensor_phases = seen["after"]["phases"]
    # A Tensor call returns with its kernel queued: it submits, and waits only for the call before.
    for name in ("choose", "pipeline", "buffers", "submit", "previous_wait"):
        assert name in tensor_phases, tensor_phases
    assert "gpu_wait" not in tensor_phases and "download" not in tensor_phases, tensor_phases
    assert sum(tensor_phases.values()) == pytest.approx(seen["after"]["total"], abs=1e-9)
    assert convtune.last_call_timings() == mine


def test_a_cpu_adapter_writes_inputs_in_place():
    """A CPU adapter's device memory is host memory: conv2d writes inputs there directly, so
    the in-place path is the one every CPU test run exercises."""
    info = convtune.adapter_info()
    if info["type"] != "Cpu" or os.environ.get("CONVTUNE_DIRECT_UPLOAD") == "0":
        pytest.skip("only a CPU adapter is sure to map its device memory")
    assert info["direct_inputs"]


def test_a_result_over_32_mib_is_read_back_whole():
    """Results over 32 MiB are fresh mappings whose pages are touched on the copy threads
    while x is written; every element must still come from the GPU."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 1, 1502, 1502), dtype=np.float32)
    w = rng.standard_normal((4, 1, 3, 3), dtype=np.float32)
    y = convtune.conv2d(x, w)
    assert y.nbytes > 32 << 20
    assert max_relative_error(y, conv2d_reference(x, w)) <= 1e-5
