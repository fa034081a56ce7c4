"""Gradio's queue without its busy polling (1 ms and 10 ms loops), so that the page's runs keep
the cores: docs/measurements.md, "What the page's idle queue costs its own CPU"."""

from __future__ import annotations

import warnings

import gradio as gr

# Gradio's queue attribute -> seconds between its looks when there is nothing to do.
QUIET_SLEEPS_S = {"sleep_when_free": 0.05, "progress_update_sleep_when_free": 0.1}


def quiet(demo: gr.Blocks) -> None:
    """Slow ``demo``'s queue polling (after ``demo.queue()``, else AssertionError)."""
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
