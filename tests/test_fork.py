"""A process forked after convtune opened its device gets a clear ConvtuneError at its first
call, within seconds, naming the start methods that work (the device, its driver's threads and
convtune's locks do not survive fork); the parent keeps working; forking before the first
call works. Each scenario runs in its own interpreter, bounded by a timeout, so a hang fails
the test instead of the run."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

PRELUDE = """
import os, sys, time, warnings
import numpy as np
import convtune
from convtune.reference import conv2d_reference
warnings.simplefilter("ignore", DeprecationWarning)  # 3.12: fork with threads running
rng = np.random.default_rng(0)
x = rng.standard_normal((1, 4, 9, 8), dtype=np.float32)
w = rng.standard_normal((5, 4, 3, 3), dtype=np.float32)

def good():
    y = convtune.conv2d(x, w, padding=1)
    assert np.abs(y - conv2d_reference(x, w, padding=1)).max() < 1e-4

def child_call():
    try:
        good()
        return "worked"
    except convtune.ConvtuneError as e:
        return "error: " + str(e)

def reap(pid, r, seconds=30):
    # What the forked child wrote to pipe r, once it has exited; killed if it hangs.
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.read(r, 4096).decode()
        time.sleep(0.05)
    os.kill(pid, 9)
    raise SystemExit("the forked child hung")
"""


def run(body: str, timeout: float = 120) -> str:
    """Runs the prelude and ``body`` as a script file (spawned workers import it by path)."""
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "scenario.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(PRELUDE + textwrap.dedent(body))
        r = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, CONVTUNE_TUNE="off"))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    return r.stdout


def check_child_refused_and_parent_worked(out: str) -> None:
    assert "parent ok" in out, out
    said = [line for line in out.splitlines() if line.startswith("child:")]
    assert said, out
    for line in said:
        assert "forked" in line and "'spawn'" in line and "'forkserver'" in line, line


def test_os_fork_child_gets_an_error_at_once_and_the_parent_works():
    out = run("""
        good()
        r, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:
            t0 = time.monotonic()
            msg = child_call()
            os.write(wfd, f"child: {msg} ({time.monotonic() - t0:.2f} s)".encode())
            os._exit(0)
        os.close(wfd)
        print(reap(pid, r))
        good()
        print("parent ok")
    """)
    check_child_refused_and_parent_worked(out)


def test_fork_pool_workers_get_an_error_and_never_hang():
    out = run("""
        import multiprocessing as mp
        def work(i):
            return "child: " + child_call()
        if __name__ == "__main__":
            good()
            with mp.get_context("fork").Pool(2) as pool:
                for line in pool.map_async(work, range(4)).get(timeout=60):
                    print(line)
            good()
            print("parent ok")
    """)
    check_child_refused_and_parent_worked(out)


def test_forking_before_the_first_call_works():
    out = run("""
        pid = os.fork()
        if pid == 0:
            try:
                good()
                os._exit(0)
            except BaseException:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
        print("child status", os.waitstatus_to_exitcode(status))
        good()
    """)
    assert "child status 0" in out


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_spawned_workers_work_after_the_parent_used_the_device(method):
    out = run(f"""
        import multiprocessing as mp
        def work(i):
            good()
            return i
        if __name__ == "__main__":
            good()
            with mp.get_context("{method}").Pool(2) as pool:
                print("results", pool.map_async(work, range(2)).get(timeout=120))
    """, timeout=300)
    assert "results [0, 1]" in out


def test_a_child_forked_while_the_parent_tunes_in_the_background_exits_promptly():
    # The worker thread is not in the child: its status is empty, wait_tuning returns at
    # once and the exit hook does not wait for it; the parent's tuning goes on.
    out = run("""
        convtune.set_tuning("background")
        os.environ["CONVTUNE_TUNE_BUDGET"] = "5"
        good()
        # More problems queued behind it: with a warm driver shader cache one small problem
        # can finish tuning before the check below.
        for h in range(10, 16):
            convtune.conv2d(rng.standard_normal((1, 4, h, 8), dtype=np.float32), w, padding=1)
        assert convtune.tuning_status()["in_progress"] or convtune.tuning_status()["queued"]
        r, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:
            st = convtune.tuning_status()
            done = convtune.wait_tuning(timeout=10)
            msg = child_call()
            os.write(wfd, f"child: {st['queued']} {st['in_progress']} {done} {msg}".encode())
            # convtune's exit hook, as sys.exit would run it; then os._exit, as
            # multiprocessing's workers end: the exit handlers a child inherits from the
            # parent's GPU driver can hang it (docs/limits.md).
            convtune._convtune._stop_tuning(2.0)
            os._exit(0)
        os.close(wfd)
        print(reap(pid, r))
        assert convtune.wait_tuning(timeout=60)[0]["winner"]
        good()
        print("parent ok")
    """)
    check_child_refused_and_parent_worked(out)
    assert "child: [] None [] error:" in out, out
