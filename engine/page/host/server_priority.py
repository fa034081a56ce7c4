"""The page's server threads yield the CPU to the run being measured, where they share it.

A thread inherits its creator's nice value (Linux keeps one per thread). So the main thread,
after the engine thread's OpenMP pool and the engine process are made, raises its own before
Gradio makes its server threads; at nice +10 the fair scheduler gives an engine thread about ten
times their CPU share. Why: docs/measurements.md, "Does the room slow the run being measured?".
With the CPUs split (the engine process on CPUs of its own) the page keeps its nice value: there
it would yield only to the host's other work (docs/measurements.md, "A press's note on a busy
host").
"""

from __future__ import annotations

import os
import sys

from engine import settings

ENV = "CBP_SERVER_NICE"


def server_nice(environ=None) -> int:
    """``CBP_SERVER_NICE``; raises ValueError for anything but a whole number from 0 to 19."""
    return settings.count(ENV, 0, 19, environ)


def lower_this_thread(steps: int) -> bool:
    """Raise this thread's nice value by ``steps``; False for 0, off Linux, or when refused."""
    if steps <= 0 or not sys.platform.startswith("linux"):
        return False
    thread_id = 0  # on Linux, PRIO_PROCESS with 0 names the calling thread only
    try:
        now = os.getpriority(os.PRIO_PROCESS, thread_id)
        os.setpriority(os.PRIO_PROCESS, thread_id, min(19, now + steps))
    except OSError:
        return False
    return True


def page_steps(steps: int, cpus_split: bool) -> int:
    """The nice steps for the page's server threads: ``steps``, or 0 where ``cpus_split`` (the
    engines run on CPUs the page does not use)."""
    return 0 if cpus_split else steps
