"""One run of the page's engines, rendered as the page renders it: the Run button's work without
its queue, live updates or Stop, for tests that look at a finished run's views."""

from __future__ import annotations

import gradio as gr

from engine.page.handlers.playground import run_engines
from engine.page.inputs.page_io import toast_text
from engine.page.run.run_options import RunOptions, prepare
from engine.page.run.shared_model import PageModel
from engine.page.views.run_view import RunResult, render


def run_and_render(
    rows, num_slots, options: RunOptions, model: PageModel, x_axis: str = "time"
) -> RunResult:
    """Run ``rows`` on ``num_slots`` slots with ``options`` (its precision: ``model.in_dtype``)
    and render the results; bad input raises ``gr.Error`` with the message the page shows."""
    try:
        model = model.in_dtype(options.dtype)
        requests, config = prepare(model, rows, num_slots, options)
    except ValueError as exc:
        raise gr.Error(toast_text(exc), print_exception=False) from exc
    return render(run_engines(model, requests, config, options), x_axis)
