"""The page while a run goes, and after one stopped early: progress line, live timelines, outputs.

``live_outputs`` turns a ``LiveRun``'s progress into updates for the Run event's outputs (in
``app.py``'s order): the status line counts steps and finished requests per engine, each started
engine's timeline is drawn from its latest trace snapshot, and the outputs table shows every
output finished so far. The run's state, masks, slider, metrics and downloads are left as they
are (``gr.skip()``) until the run ends. ``stopped_outputs`` puts the previous run's results back
with a status line saying why this one stopped.
"""

from __future__ import annotations

import gradio as gr

from engine import figures, tables
from engine.live_run import EngineProgress
from engine.sequence import Request
from engine.trace import Trace, new_request_records

ENGINE_LABELS = {
    "static": "static batching",
    "continuous": "continuous batching",
    "hf_continuous": "transformers' continuous batching",
    "reference": "model.generate reference",
}
LIVE_ENGINES = ("static", "continuous")  # the engines with a timeline and an outputs column


def progress_line(
    progress: dict[str, EngineProgress], elapsed_s: float, time_limit_s: float | None
) -> str:
    """One Markdown line: elapsed time, then steps done and requests finished per engine."""
    limit = f" (limit {time_limit_s:g} s)" if time_limit_s is not None else ""
    parts = [f"**Running** · {elapsed_s:.1f} s{limit}"]
    for name, p in progress.items():
        label = ENGINE_LABELS.get(name, name)
        if name in LIVE_ENGINES:
            parts.append(
                f"{label}: {p.num_steps} steps, {p.num_finished}/{p.num_requests} requests done"
            )
        elif name == "reference":
            parts.append(f"{label}: {p.num_steps} steps")
        else:
            parts.append(f"{label}: running")
    if not progress:
        parts.append("waiting for the model")
    return " · ".join(parts)


def live_outputs(
    progress: dict[str, EngineProgress],
    requests: list[Request],
    num_slots: int,
    x_axis: str,
    elapsed_s: float,
    time_limit_s: float | None,
) -> tuple:
    """Updates for the Run event's 10 outputs while the run goes (see the module docstring)."""
    traces = {name: _trace_so_far(progress, name, requests, num_slots) for name in LIVE_ENGINES}
    timelines = [
        figures.timeline_figure(trace, x_axis, None) if trace.steps else gr.skip()
        for trace in traces.values()
    ]
    outputs = outputs_table(tables.outputs_rows(traces, None), list(traces))
    status = progress_line(progress, elapsed_s, time_limit_s)
    skip = gr.skip()
    return (skip, *timelines, skip, skip, skip, skip, outputs, status, skip)


def stopped_outputs(previous_result, message: str) -> tuple:
    """The Run event's outputs after a stop: the previous results (a ``RunResult``) or empty.

    The run's state and downloads stay as they were; ``message`` leads the status line.
    """
    if previous_result is None:
        empty = outputs_table([], list(LIVE_ENGINES))
        return (gr.skip(), None, None, None, None, gr.skip(), [], empty, message, gr.skip())
    previous_result.status = f"{message} Showing the previous run: {previous_result.status}"
    _state, *shown, _downloads = previous_result.as_outputs()
    return (gr.skip(), *shown, gr.skip())


def outputs_table(rows: list[list], engine_names: list[str]) -> gr.Dataframe:
    """The outputs table with its headers and column widths for these engines."""
    output_width = f"{62 // len(engine_names)}%"
    return gr.Dataframe(
        value=rows,
        headers=tables.outputs_headers(engine_names),
        column_widths=["6%", "18%", "6%", *[output_width] * len(engine_names), "8%"],
    )


def _trace_so_far(
    progress: dict[str, EngineProgress], name: str, requests: list[Request], num_slots: int
) -> Trace:
    """The engine's latest snapshot, or an empty trace with every request if it has none yet."""
    entry = progress.get(name)
    if entry is not None and entry.trace is not None:
        return entry.trace
    return Trace(engine=name, num_slots=num_slots, requests=new_request_records(requests))
