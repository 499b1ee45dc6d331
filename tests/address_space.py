"""An address-space limit (RLIMIT_AS) for child processes of the memory tests.

Under the limit an allocation beyond it fails at once, as on a machine that does not
overcommit memory; without it, on one that does, a huge copy is granted and the process is
killed while filling it. Linux only (the limit is read against /proc/self/status).
"""

from __future__ import annotations

import re
import resource


def vm_size() -> int:
    """This process's virtual size in bytes."""
    with open("/proc/self/status") as f:
        return int(re.search(r"VmSize:\s+(\d+) kB", f.read()).group(1)) * 1024


def limit_address_space(headroom: int) -> int:
    """Caps the address space at the current size plus `headroom` bytes; returns the cap.
    Call it after the GPU device is open: the driver maps much of its memory then."""
    cap = vm_size() + headroom
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    return cap
