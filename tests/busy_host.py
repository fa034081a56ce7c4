"""A host kept busy: one busy-loop process on each CPU, as other work on a shared machine.

The issue's checks of timing on a busy host run under ``busy_host()``: each loop is pinned to
its CPU at nice 0, so whatever the page or a server runs there shares it half and half.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys


@contextlib.contextmanager
def busy_host():
    """One spinning process per CPU this process may use, stopped when the block ends."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in cpus]
    try:
        for loop, cpu in zip(loops, cpus, strict=True):
            if hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(loop.pid, {cpu})
        yield cpus
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
