"""Gradio's queue without its busy polling, so that the page's runs keep both cores.

Gradio 6's queue (``gradio.queueing.Queue``) has two loops on the web server's event loop: one
looks for events to start, every ``sleep_when_free`` (1 ms on Linux, 50 ms on Windows), and one
for progress to send, every ``progress_update_sleep_when_free`` (10 ms; 100 ms on Windows). That
is about a thousand wake-ups a second whether or not anything is queued, each one time taken from
the engines' OpenMP threads, which wait for each other at every barrier (``python -m
tools.page_gap`` measures it; docs/measurements.md). ``quiet(demo)`` gives the queue
Windows' values: an event starts up to 50 ms later, and a progress bar is redrawn ten times a
second, neither of which a person sees on runs that take seconds.
"""

from __future__ import annotations

import warnings

import gradio as gr

# Gradio's queue attribute -> seconds between its looks when there is nothing to do.
QUIET_SLEEPS_S = {"sleep_when_free": 0.05, "progress_update_sleep_when_free": 0.1}


def quiet(demo: gr.Blocks) -> None:
    """Slow the polling of ``demo``'s queue (call it after ``demo.queue()``, before launch).

    Raises:
        AssertionError: ``demo.queue()`` was not called first.
    """
    queue = getattr(demo, "_queue", None)
    assert queue is not None, "quiet() before demo.queue()"
    missing = [name for name in QUIET_SLEEPS_S if not hasattr(queue, name)]
    if missing:
        warnings.warn(
            f"Gradio's queue has no {', '.join(missing)}: its polling is left as it is",
            stacklevel=2,
        )
        return
    for name, sleep_s in QUIET_SLEEPS_S.items():
        setattr(queue, name, sleep_s)
