"""The page's server threads yield the CPU to the run being measured.

A run is a measurement, and on a small host it shares the CPUs with the page that serves everyone
else: each new session and each update sent to a waiting run costs Gradio's server CPU time, and
with torch's OpenMP threads on every CPU, a server thread that takes one stalls every parallel
region of the step until it yields (docs/measurements.md, "Does the room slow the run being
measured?").

Linux keeps a nice value per thread, and a thread inherits its creator's. So the main thread, after
the engine thread's OpenMP pool is made (``engine.worker.engine_thread.ENGINE_THREAD``) and the
engine process is started, both at the nice value the process started with, raises its own nice
value before Gradio starts its server: the server's event loop and its worker threads are made
from it, and inherit it. The kernel's fair scheduler then gives a runnable engine thread about ten
times the CPU share of a server thread at nice +10, so the page still answers while a run
measures, more slowly. Raising one's own nice value needs no privilege; lowering it back would, so
only threads made later are affected. Elsewhere than Linux (macOS keeps one nice value per
process) nothing is changed. ``CBP_SERVER_NICE`` sets how many steps (``engine.settings``).
"""

from __future__ import annotations

import os
import sys

from engine import settings

ENV = "CBP_SERVER_NICE"


def server_nice(environ=None) -> int:
    """The nice steps for the page's server threads, from ``CBP_SERVER_NICE``.

    Raises:
        ValueError: not a whole number from 0 to 19.
    """
    text = settings.value(ENV, environ)
    if not text.isdigit() or not 0 <= int(text) <= 19:
        raise ValueError(f"{ENV}={text!r}: give a whole number from 0 to 19 (0: no change)")
    return int(text)


def lower_this_thread(steps: int) -> bool:
    """Raise the calling thread's nice value by ``steps`` (threads it makes later inherit it).

    Returns whether it changed: False for 0 steps, off Linux, or when the system refused.
    """
    if steps <= 0 or not sys.platform.startswith("linux"):
        return False
    thread_id = 0  # on Linux, PRIO_PROCESS with 0 names the calling thread only
    try:
        now = os.getpriority(os.PRIO_PROCESS, thread_id)
        os.setpriority(os.PRIO_PROCESS, thread_id, min(19, now + steps))
    except OSError:
        return False
    return True
