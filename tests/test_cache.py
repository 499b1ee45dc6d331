"""The on-disk tuning cache: round trip, key invalidation, corrupt and foreign files,
export/import across adapters, clearing, and two processes tuning at once.

Every test runs with its own CONVTUNE_CACHE_DIR and a 0.2 s budget (see tuning_support).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import convtune
from convtune import _convtune
from tuning_support import (  # noqa: F401  (tuning_env is a fixture)
    OTHER,
    SMALL,
    STRIDED,
    cache_file,
    check_conv2d,
    entries,
    env_with,
    explain,
    shape_matches,
    tune,
    tuning_env,
    write_entries,
)


def test_cache_path_follows_the_environment(tuning_env, monkeypatch, tmp_path):
    assert cache_file() == tuning_env / "tuning.json"
    monkeypatch.setenv("CONVTUNE_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert cache_file() == tmp_path / "elsewhere" / "tuning.json"


def test_round_trip(tuning_env, monkeypatch):
    r = tune(SMALL)
    (entry,) = entries()
    key, stored = entry["key"], entry["report"]
    info = convtune.adapter_info()
    assert key["adapter"]["vendor"] == info["vendor_id"] and key["adapter"]["device"] == info["device_id"]
    assert key["adapter"]["driver"] == info["driver"] and key["adapter"]["driver_info"] == info["driver_info"]
    assert key["adapter"]["backend"] == info["backend"]
    assert key["version"] == convtune.__version__
    for h in ("templates", "codegen", "candidates"):
        assert len(key[h]) == 64
    assert key["shape"] == {
        "n": 1, "c": 4, "h": 10, "w": 10, "k": 8, "r": 3, "s": 3, "stride": [1, 1], "pad": [1, 1],
        "pad_end": [1, 1], "dilation": [1, 1], "groups": 1, "bias": False, "dtype": "f32", "layout": "NCHW",
    }
    assert stored["winner"] == r.winner and stored["tuning_s"] == r.tuning_s
    assert stored["tuned_at"].endswith("Z")
    assert len(stored["candidates"]) == len(r.candidates)
    timed = [c for c in stored["candidates"] if c["status"] == "ok"]
    assert timed and all(c["samples_ms"] and c["median_ms"] for c in timed)

    # A new process (simulated: memory forgotten) gets the same answer from the file.
    _convtune._reset_tuning_state()
    monkeypatch.setenv("CONVTUNE_TUNE", "cached")
    e = explain(SMALL)
    assert e.source == "cache" and e.variant == r.winner
    back = tune(SMALL)
    assert back.source == "cache"
    assert [(c["name"], c["status"], c["median_ms"]) for c in back.candidates] == [
        (c["name"], c["status"], c["median_ms"]) for c in r.candidates
    ]


@pytest.mark.parametrize(
    "path, value",
    [
        (("version",), "0.0.0"),
        (("templates",), "0" * 64),
        (("codegen",), "0" * 64),
        (("candidates",), "0" * 64),
        (("adapter", "device"), 4242),
        (("adapter", "vendor"), 4242),
        (("adapter", "driver_info"), "some other driver"),
        (("adapter", "backend"), "metal"),
        (("shape", "bias"), True),
        (("shape", "pad_end"), [2, 2]),
    ],
    ids=lambda v: ".".join(v) if isinstance(v, tuple) else None,
)
def test_any_key_change_is_a_miss(tuning_env, monkeypatch, path, value):
    tune(SMALL)
    (entry,) = entries()
    node = entry["key"]
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    write_entries([entry])
    _convtune._reset_tuning_state()
    monkeypatch.setenv("CONVTUNE_TUNE", "cached")
    assert explain(SMALL).source == "default"
    # auto tunes it again and keeps the foreign entry apart.
    monkeypatch.setenv("CONVTUNE_TUNE", "auto")
    assert explain(SMALL).source == "tuned"
    assert len(entries()) == 2


def test_corrupt_file_is_warned_about_ignored_and_replaced(tuning_env, monkeypatch):
    tuning_env.mkdir(parents=True)
    cache_file().write_text('{"format": "convtune-tuning-cache", "format_versi')
    monkeypatch.setenv("CONVTUNE_TUNE", "cached")
    with pytest.warns(convtune.ConvtuneWarning, match="corrupt"):
        assert explain(SMALL).source == "default"
    monkeypatch.setenv("CONVTUNE_TUNE", "auto")
    _convtune._reset_tuning_state()
    with pytest.warns(convtune.ConvtuneWarning) as record:
        check_conv2d(SMALL)
    assert any("corrupt" in str(w.message) and "replacing" in str(w.message) for w in record)
    (entry,) = entries()
    assert shape_matches(entry, SMALL)
    assert (tuning_env / "tuning.json.bad").exists()
    _convtune._reset_tuning_state()
    monkeypatch.setenv("CONVTUNE_TUNE", "cached")
    assert explain(SMALL).source == "cache"


@pytest.mark.parametrize(
    "content",
    [
        {"format": "convtune-tuning-cache", "format_version": 999, "entries": {"new": "layout"}},
        {"format": "someone-else", "format_version": 1, "entries": []},
        [1, 2, 3],
    ],
    ids=["newer-version", "other-format", "not-an-object"],
)
def test_foreign_files_are_warned_about_and_ignored(tuning_env, monkeypatch, content):
    tuning_env.mkdir(parents=True)
    cache_file().write_text(json.dumps(content))
    monkeypatch.setenv("CONVTUNE_TUNE", "cached")
    with pytest.warns(convtune.ConvtuneWarning, match="ignoring"):
        assert explain(SMALL).source == "default"
    check_conv2d(SMALL)


def test_unusable_cached_winner_is_ignored(tuning_env, monkeypatch):
    tune(SMALL)
    (entry,) = entries()
    entry["report"]["winner"] = "direct_wg63x1_u9_k1w1"
    write_entries([entry])
    _convtune._reset_tuning_state()
    monkeypatch.setenv("CONVTUNE_TUNE", "cached")
    with pytest.warns(convtune.ConvtuneWarning, match="cannot run here"):
        assert explain(SMALL).source == "default"
    with pytest.warns(convtune.ConvtuneWarning, match="cannot run here"):
        check_conv2d(SMALL)


def test_export_import_between_machines(tuning_env, monkeypatch, tmp_path):
    a = tune(SMALL)
    tune(OTHER)
    # An entry for another GPU: must travel along but never apply here.
    foreign = json.loads(json.dumps(entries()[0]))
    foreign["key"]["adapter"].update(vendor=0x10DE, device=0x2330, name="NVIDIA H100", driver="NVIDIA")
    foreign["report"]["winner"] = "gemm_b128x128x8_t8x8"
    write_entries(entries() + [foreign])
    out = tmp_path / "export" / "tuning-export.json"
    assert convtune.cache_export(out) == 3
    assert json.loads(out.read_text())["format"] == "convtune-tuning-cache"

    monkeypatch.setenv("CONVTUNE_CACHE_DIR", str(tmp_path / "other-machine"))
    monkeypatch.setenv("CONVTUNE_TUNE", "cached")
    assert explain(SMALL).source == "default"
    assert convtune.cache_import(out) == 3
    e = explain(SMALL)
    assert e.source == "cache" and e.variant == a.winner
    assert explain(OTHER).source == "cache"
    assert len(entries()) == 3
    # Importing again replaces, it does not duplicate.
    assert convtune.cache_import(out) == 3
    assert len(entries()) == 3


def test_import_rejects_what_is_not_an_export(tuning_env, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    with pytest.raises(convtune.ConvtuneError, match="corrupt"):
        convtune.cache_import(bad)
    with pytest.raises(ValueError, match="no such file"):
        convtune.cache_import(tmp_path / "missing.json")


def test_cache_clear(tuning_env, monkeypatch):
    tune(SMALL)
    assert cache_file().exists()
    convtune.cache_clear()
    assert not cache_file().exists()
    monkeypatch.setenv("CONVTUNE_TUNE", "cached")
    assert explain(SMALL).source == "default"
    convtune.cache_clear()  # nothing to clear is fine


def test_unwritable_cache_dir_warns_and_still_works(tuning_env, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("CONVTUNE_CACHE_DIR", str(blocker / "cache"))
    with pytest.warns(convtune.ConvtuneWarning) as record:
        check_conv2d(SMALL)
    assert any("this process only" in str(w.message) for w in record)
    # Remembered in memory for the rest of the process.
    assert explain(SMALL).source == "cache"


CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np
    import convtune
    from convtune.reference import conv2d_reference, max_relative_error

    ready, go = sys.argv[1], sys.argv[2]
    cases = json.loads(sys.argv[3])
    open(ready, "w").close()
    deadline = time.time() + 60
    while not os.path.exists(go) and time.time() < deadline:
        time.sleep(0.01)
    errors = []
    for x_shape, w_shape, kw in cases:
        rng = np.random.default_rng(1)
        x = rng.standard_normal(x_shape).astype(np.float32)
        w = rng.standard_normal(w_shape).astype(np.float32)
        y = convtune.conv2d(x, w, **kw)
        ref = conv2d_reference(x, w, kw.get("stride", 1), kw.get("padding", 0), 1, kw.get("groups", 1))
        errors.append(max_relative_error(y, ref))
        e = convtune.explain(x_shape, w_shape, **kw)
        assert e.source in ("cache", "tuned"), e.source
    print(json.dumps(errors))
    """
)


def test_two_processes_tuning_at_once(tuning_env, tmp_path):
    """Both tune the same shape and one shape of their own, at the same moment."""
    procs = []
    for i, own in enumerate((OTHER, STRIDED)):
        cases = json.dumps([list(SMALL), list(own)])
        ready = tmp_path / f"ready{i}"
        procs.append((ready, subprocess.Popen(
            [sys.executable, "-c", CHILD, str(ready), str(tmp_path / "go"), cases],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_with(CONVTUNE_TUNE="auto"),
        )))
    deadline = time.time() + 60
    while not all(r.exists() for r, _ in procs) and time.time() < deadline:
        time.sleep(0.01)
    (tmp_path / "go").touch()
    for _, p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert all(e <= 1e-5 for e in json.loads(out.strip().splitlines()[-1]))
    stored = entries()
    assert len(stored) == 3, [e["key"]["shape"] for e in stored]
    for case in (SMALL, OTHER, STRIDED):
        assert sum(shape_matches(e, case) for e in stored) == 1
    assert not list(tuning_env.glob(".tuning-*.tmp"))
