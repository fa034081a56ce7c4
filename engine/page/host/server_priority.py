"""The page's server threads yield the CPU to the run being measured, where they share it.

Threads inherit their creator's nice value, so the main thread raises its own after the engines'
threads exist and before Gradio's: docs/page.md, "Server threads' nice value".
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
    """The nice steps for the page's server threads: 0 where the engines have CPUs of their own."""
    return 0 if cpus_split else steps
