"""Gradio's queue without its busy polling, so that the page's runs keep both cores.

Gradio 6's queue (``gradio.queueing.Queue``) has two loops on the web server's event loop: one
looks for events to start, sleeping ``sleep_when_free`` between looks (1 ms on Linux, 50 ms on
Windows), and one looks for progress to send, every ``progress_update_sleep_when_free`` (10 ms;
100 ms on Windows). That is about a thousand wake-ups a second whether or not anything is queued,
and on a small host each one is time taken from the engines' OpenMP threads, which wait for each
other at every barrier; it was most of the gap between the page's run times and the bench's
(``python -m engine.bench.page_gap``; the figures are in docs/measurements.md).

``quiet(demo)`` gives the queue Windows' values: an event starts up to 50 ms later than it would,
and a progress bar is redrawn ten times a second, neither of which a person sees on runs that take
seconds. Should a Gradio release rename these attributes, ``quiet`` warns and leaves the queue as
it is (``tests/page/host/test_quiet_queue.py`` fails then, so the change is noticed).
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
