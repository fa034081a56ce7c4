"""The page while a run goes, and after one stopped early: progress line, live timelines, outputs.

``LiveTimelines`` paces the updates so that showing the run takes little from it.
"""

from __future__ import annotations

import math
import time

import gradio as gr

from engine.host_queue.run_queue import Place
from engine.page.figures import server_lanes
from engine.page.figures.style import counted, message_figure
from engine.page.views import tables
from engine.page.views.markup import one_line, plain_markdown
from engine.page.views.run_status import shown_instead
from engine.page.views.run_view import (
    RUN_OUTPUTS,
    RunState,
    outputs_table,
    render,
    run_outputs,
    timeline,
)
from engine.sequence import Request
from engine.trace import Trace, new_request_records
from engine.worker.progress import EngineProgress

ENGINE_LABELS = {
    "static": "static batching",
    "continuous": "continuous batching",
    "hf_continuous": "transformers' continuous batching",
    "reference": "model.generate reference",
}
LIVE_ENGINES = ("static", "continuous")  # the engines with a timeline and an outputs column
TIMELINE_CPU_SHARE = 0.02  # live timelines' drawing: at most this share of the run's time
UPDATE_SHARE = 0.02  # Gradio's handling of live updates: at most this share of the run's time
MAX_UPDATE_WAIT_S = 4.0  # ... but the live progress moves at least this often
SOON_S, SOON = 5.0, "a few seconds"  # an estimate under SOON_S is said so, not "0 s"
# Views drawn when a run ends, cleared at its first live update (with what the chart will show)
CLEARED_AT_START = {
    "packed_mask_plot": "Packed mask",
    "static_mask_plot": "Static mask",
    "block_map_plot": "KV block map",
    "latency_cdf_plot": "Latency",
    "step_usage_plot": "Tokens per step",
    "server_chart_plot": "Servers' throughput",
    "inside_timeline_plot": "From the inside: timeline",
    "inside_mask_plot": "From the inside: packed mask",
    "inside_block_map_plot": "From the inside: KV block map",
    "inside_usage_plot": "From the inside: tokens and KV per step",
}
DRAWN_AT_END = "Drawn when this run ends."
SKIP = gr.skip()  # an output left as it is


def progress_line(
    progress: dict[str, EngineProgress], elapsed_s: float, time_limit_s: float | None
) -> str:
    limit = f" (limit {time_limit_s:g} s)" if time_limit_s is not None else ""
    parts = [f"**Running** · {elapsed_s:.1f} s{limit}"]
    for name, p in progress.items():
        label = ENGINE_LABELS.get(name) or plain_markdown(name)  # a server: the host's name
        if name in LIVE_ENGINES:
            waiting = ", waiting for arrivals" if p.waiting else ""
            parts.append(
                f"{label}: {counted(p.num_steps, 'step')}, "
                f"{p.num_finished}/{p.num_requests} requests done" + waiting
            )
        elif name == "reference":
            parts.append(f"{label}: {counted(p.num_steps, 'step')}")
        else:
            parts.append(f"{label}: {_server_progress(p)}")
    if not progress:
        parts.append("starting")  # the turn is ours; no engine step yet
    return " · ".join(parts)


def servers_line(
    names: list[str],
    progress: dict[str, EngineProgress],
    done: dict[str, str],
    elapsed_s: float,
    time_limit_s: float | None,
) -> str:
    """The status line while the servers run: elapsed time, then each server's state."""
    limit = f" (limit {time_limit_s:g} s)" if time_limit_s is not None else ""
    parts = [f"**Running the servers** · {elapsed_s:.1f} s{limit} · our engines' results are below"]
    running = next((n for n in names if n not in done), None)
    for i, name in enumerate(names, 1):
        if name in done:
            state = done[name]
        elif name == running:
            entry = progress.get(name)
            state = _server_progress(entry) if entry is not None else "starting"
        else:
            state = "waiting its turn"
        parts.append(f"{plain_markdown(name)} ({i} of {len(names)}): {state}")
    return " · ".join(parts)


def queue_line(place: Place, measured: bool) -> str:
    """Markdown: a waiting run's place, the total, its wait so far and the estimate."""
    ahead = place.place - 1  # the run in progress included
    line = f"**Waiting for the model:** place {place.place} of {place.total}"
    if place.identical_ahead:  # the place is that run's
        before = f"{ahead} before it" if ahead else "in progress" if place.after_running else "next"
        line += f" (an identical run's, {before})"
    elif ahead == 0:
        line += " (yours is next)"
    elif place.after_running and ahead == 1:
        line += " (yours is next, after the run in progress)"
    else:
        line += f" ({ahead} before yours)"
    line += f" · waited {_coarse(place.waited_s)}"
    if place.estimate_s is not None:  # under 5 s, "0 s" read as if the run had been forgotten
        soon = place.estimate_s < SOON_S
        line += f" · estimate {SOON if soon else _coarse(place.estimate_s)}"
    elif not measured:
        line += " · no estimate yet: the first run on this host is being measured"
    if place.identical_ahead:  # its estimate is when that run ends
        return line + ". An identical run is ahead of yours: you are shown it when it ends."
    return line + ". Runs take turns: each is a measurement. Yours starts by itself."


def _coarse(seconds: float) -> str:
    """``seconds`` to 10 s under 90 s, else minutes (a line is re-sent only when it changes)."""
    return f"{round(seconds, -1):.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def previous_outputs(
    previous: RunState | None, message: str, x_axis: str | None = None, hide_live: bool = True
) -> tuple:
    """The outputs for a run that gave no results: ``message``, then the previous run, redrawn on
    ``x_axis`` (None: only named in the status line; the rest unchanged)."""
    changed = {"run_note_markdown": message}
    if hide_live:
        changed["live_button"] = gr.Button(visible=False)
    if x_axis is None:
        status = message if previous is None else f"{message} {shown_instead(previous)}"
        return run_outputs(status_markdown=status, **changed)
    if previous is None:
        return run_outputs(
            **dict.fromkeys(name for name in RUN_OUTPUTS if name.endswith("_plot")),
            metrics_table=[],
            outputs_table=outputs_table([], list(LIVE_ENGINES)),
            status_markdown=message,
            **changed,
        )
    shown = render(previous, x_axis, downloads=False)
    shown.status = f"{message} {shown_instead(previous, shown.status)}"
    values = dict(zip(RUN_OUTPUTS, shown.as_outputs(), strict=True))
    del values["run_state"], values["downloads_file"]  # both stay as they are
    return run_outputs(**values | changed)


def with_run_note(outputs: tuple, note: str, live_button: bool = False) -> tuple:
    values = dict(zip(RUN_OUTPUTS, outputs, strict=True))
    return run_outputs(
        **values | {"run_note_markdown": note, "live_button": gr.Button(visible=live_button)}
    )


def _server_progress(p: EngineProgress) -> str:
    if p.note is not None:
        return plain_markdown(one_line(p.note, 200))
    if p.trace is None or not p.trace.info.get("server"):
        return "running"
    streaming = sum(r.first_token_s is not None and r.finish_s is None for r in p.trace.requests)
    return f"{p.num_finished}/{p.num_requests} requests done, {streaming} streaming"


def live_outputs(
    progress: dict[str, EngineProgress],
    requests: list[Request],
    num_slots: int,
    x_axis: str,
    elapsed_s: float,
    time_limit_s: float | None,
    draw_timelines: bool = True,
) -> tuple:
    """Updates while the run goes; the rest (and timelines unless ``draw_timelines``) skipped."""
    traces = {name: _trace_so_far(progress, name, requests, num_slots) for name in LIVE_ENGINES}
    static, continuous = (
        timeline(trace, x_axis, None, None) if trace.steps and draw_timelines else gr.skip()
        for trace in traces.values()
    )
    servers = {  # server engines streaming now or done: their lanes and outputs so far
        name: p.trace
        for name, p in progress.items()
        if p.trace is not None and p.trace.info.get("server")
    }
    lanes = (
        server_lanes.server_timeline_figure(servers) if servers and draw_timelines else gr.skip()
    )
    traces.update(servers)
    return run_outputs(
        static_timeline_plot=static,
        continuous_timeline_plot=continuous,
        outputs_table=outputs_table(tables.outputs_rows(traces, None), list(traces)),
        status_markdown=progress_line(progress, elapsed_s, time_limit_s),
        server_timeline_plot=lanes,
    )


def cleared_outputs(outputs: tuple) -> tuple:
    """``outputs`` with the previous run's step views as placeholders, the metrics emptied."""
    values = dict(zip(RUN_OUTPUTS, outputs, strict=True))
    unset = {name for name, value in values.items() if isinstance(value, dict) and value == SKIP}
    for name in unset & {"static_timeline_plot", "continuous_timeline_plot"}:
        values[name] = _not_started(name.removesuffix("_timeline_plot"))
    if "server_timeline_plot" in unset:
        values["server_timeline_plot"] = message_figure(
            "Servers: one lane per request", DRAWN_AT_END
        )
    for name, title in CLEARED_AT_START.items():
        values[name] = message_figure(title, DRAWN_AT_END)
    values["metrics_table"] = []
    return tuple(values[name] for name in RUN_OUTPUTS)


def _not_started(name: str):
    label = ENGINE_LABELS[name]
    text = (
        f"{label.capitalize()}'s timeline starts when its first steps are done "
        "(the engines run one after another)."
    )
    return message_figure(f"{label.capitalize()}: timeline", text)


class LiveTimelines:
    """``live_outputs`` paced to a share of the run's CPU (docs/page.md, "A run's cost, and the
    live pacing")."""

    def __init__(self, cpu_share: float = TIMELINE_CPU_SHARE, update_share: float = UPDATE_SHARE):
        assert 0 < cpu_share <= 1 and 0 < update_share <= 1, (cpu_share, update_share)
        self.cpu_share = cpu_share
        self.update_share = update_share
        self.num_draws = 0
        self.update_cost_s = 0.0  # Gradio's handling of the last update, wall seconds
        self._next_s = -math.inf
        self._engines: tuple[str, ...] = ()
        self._table_rows: object = None  # the outputs table's rows as last sent
        self._handed_s: float | None = None  # when the last update was handed to Gradio
        self._cleared = False  # the first update cleared the previous run's views

    def wait_s(self, interval_s: float) -> float:
        paced_s = max(interval_s, self.update_cost_s / self.update_share)
        return min(paced_s, max(interval_s, MAX_UPDATE_WAIT_S))

    def resumed(self) -> None:
        """Gradio asks for the next update: handling the last one took it until now."""
        if self._handed_s is not None:
            self.update_cost_s = time.monotonic() - self._handed_s

    def outputs(self, progress: dict[str, EngineProgress], *args) -> tuple:
        """``live_outputs``, timelines when due, the table skipped when unchanged."""
        engines = tuple(n for n in LIVE_ENGINES if n in progress and progress[n].num_steps)
        draw = time.monotonic() >= self._next_s or engines != self._engines
        cpu_s = time.thread_time()
        outputs = live_outputs(progress, *args, draw_timelines=draw)
        if draw:
            self.num_draws += 1
            self._engines = engines
            self._next_s = time.monotonic() + (time.thread_time() - cpu_s) / self.cpu_share
        if not self._cleared:  # once, outside the redraws' CPU budget
            outputs, self._cleared = cleared_outputs(outputs), True
        outputs = self._unless_unchanged(outputs)
        self._handed_s = time.monotonic()
        return outputs

    def _unless_unchanged(self, outputs: tuple) -> tuple:
        index = RUN_OUTPUTS.index("outputs_table")
        # Its constructor's arguments (rows, headers, widths): a component made while the app
        # serves keeps no ``.value``.
        shown = outputs[index].constructor_args
        if shown == self._table_rows:
            return (*outputs[:index], gr.skip(), *outputs[index + 1 :])
        self._table_rows = shown
        return outputs


def _trace_so_far(
    progress: dict[str, EngineProgress], name: str, requests: list[Request], num_slots: int
) -> Trace:
    entry = progress.get(name)
    if entry is not None and entry.trace is not None:
        return entry.trace
    return Trace(engine=name, num_slots=num_slots, requests=new_request_records(requests))
