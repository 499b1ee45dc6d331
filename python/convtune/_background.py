"""The tuning mode of this process and background tuning (``set_tuning("background")`` or
``CONVTUNE_TUNE=background``): a call on a problem without a tuning result runs the default
rule's pick at once and queues the problem; one worker thread tunes queued problems, each
candidate started only while no convtune call of this process is running, and stores each
winner in the tuning cache, where later calls find it."""

from __future__ import annotations

import atexit
from typing import List, Optional

from . import _convtune

MODES = ("auto", "background", "cached", "off")


def set_tuning(mode: Optional[str]) -> None:
    """Sets the tuning mode of this process over ``CONVTUNE_TUNE``: ``"auto"`` (tune a new
    problem at its first call), ``"background"`` (run the default rule's pick at once and
    tune on a worker thread), ``"cached"`` (the cache or the default rule, never tune) or
    ``"off"`` (the default rule only); ``None`` goes back to the variable."""
    if mode is not None and not isinstance(mode, str):
        raise TypeError(f"mode must be a str or None, got {type(mode).__name__}")
    _convtune.set_tuning(mode)


def tuning_mode() -> str:
    """The tuning mode calls run in now: ``set_tuning``'s, else ``CONVTUNE_TUNE``'s, else
    ``"auto"``."""
    return _convtune.tuning_mode()


def wait_tuning(timeout: Optional[float] = None) -> List[dict]:
    """Blocks until background tuning has nothing queued or running and returns the
    problems it finished since the last ``wait_tuning`` that returned them: dicts with
    ``problem`` (shape and precision), ``winner`` (``None`` where tuning failed, the problem
    then staying on the default rule), ``error`` and ``seconds``. Raises TimeoutError when
    ``timeout`` seconds pass first (what finished is kept for the next call)."""
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be a number of seconds or None, got {type(timeout).__name__}")
        timeout = float(timeout)
    return _convtune.wait_tuning(timeout)


def tuning_status() -> dict:
    """Background tuning now: ``mode`` (as ``tuning_mode``), ``queued`` (problems waiting,
    in order), ``in_progress`` (the problem being tuned, or ``None``) and ``done`` (the
    problems finished in this process, the latest 4,096, as ``wait_tuning`` returns them)."""
    return _convtune.tuning_status()


# At exit the worker drops its queue and stops at its next candidate; a problem it was
# tuning stores nothing, so the cache stays valid and exit does not wait for tuning.
atexit.register(_convtune._stop_tuning, 2.0)
