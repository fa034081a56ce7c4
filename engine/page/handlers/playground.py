"""The page's handlers as plain functions, testable without a browser: Run, Stop, the step slider.

``app.py`` only lays out components and wires them to these.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator

import gradio as gr

from engine.page.figures.mask_heatmaps import GLOBAL_LAYERS
from engine.page.inputs.page_io import toast_text
from engine.page.run.recent_runs import RecentRun, replay_label
from engine.page.run.run import Ended, Left, Replay, Run, RunAnswer, Running, RunRequest, Waiting
from engine.page.run.run_handle import IDLE, REPEAT_PRESS, STOPPED_PRESS, RunHandle, Turn
from engine.page.run.run_options import (
    RUN_SIGNATURE,
    RunSettings,
    options_from_page,
    prepare,
    settings_from_run,
    view_inputs,
)
from engine.page.run.shared_model import chosen_model, get_model
from engine.page.views import divergence_view, progress_view, run_status, tables
from engine.page.views.run_view import (
    STEP_VIEW_OUTPUTS,
    RunState,
    render,
    run_outputs,
    step_views,
)
from engine.serving.run_control import RunCancelled, RunStopped

PROGRESS_INTERVAL_S = 0.5  # at most two live updates a second (fewer: progress_view)
QUEUE_POLL_S = 1.0  # how often a waiting run looks at its place
# A waiting run's line is sent when its words change, else every this many seconds: each send
# costs the server CPU taken from the run being measured, times a room of waiting people
# (docs/measurements.md, "What a waiting room costs the page"). A run whose browser vanished is
# closed by Gradio at its next send, within this many seconds, and leaves the queue then (the
# tab's ``demo.unload`` takes it out sooner).
QUEUE_RESEND_S = 20.0
STOPPED = "**Stopped** before the end."
STOPPED_IN_QUEUE = "**Stopped** before it started: it left the queue."
RUNNING_NOTE = "**Running:** its progress is in the status line below."
PRESSED_NOTE = "**Run pressed:** checking the table, then a place in the queue…"
PRESSED_STATUS = f"{PRESSED_NOTE} The results below stay as they are until it starts."


def run_event(*values, **named) -> Iterator[tuple]:
    """The Run button's handler: progress, then the ``RUN_OUTPUTS``; inputs in ``RUN_INPUTS``
    order or by name. Bad input goes to the status line (a Gradio error would badge over it).

    Raises:
        gr.Error: the run passed ``CBP_RUN_TIME_LIMIT_S``, or that setting is not a time limit.
        TypeError: too many inputs, or a required one missing.
    """
    settings, previous, handle = settings_from_run(*values, **named)
    handle = handle if handle is not None else RunHandle()
    turn = handle.start()
    if turn.skip == REPEAT_PRESS:  # a second press during a run, or one already run: skipped
        yield run_outputs()
        return
    if turn.skip == STOPPED_PRESS:
        yield progress_view.previous_outputs(previous, STOPPED_IN_QUEUE)
        return
    try:
        yield from _run(settings, previous, handle, turn)
    finally:
        handle.finish(turn)


run_event.__signature__ = RUN_SIGNATURE  # Gradio names /run's parameters and defaults from it


def _run(settings: RunSettings, previous, handle: RunHandle, turn: Turn):
    """``run_event``'s work once the run may start: check the input, then follow its ``Run``."""
    try:
        x_axis, replay = view_inputs(settings)
        run = Run(run_request(settings, replay), handle, turn)  # every input checked
    except ValueError as exc:  # a model that cannot load (a ValueError) is told as "Not run" too
        yield _refused_outputs(previous, exc)
        return
    with run:
        ended = yield from _follow(run, x_axis)
        if isinstance(ended, Ended) and not turn.abandoned:
            yield from _finished_outputs(run, ended, previous, x_axis)
        elif isinstance(ended, Left):
            yield progress_view.previous_outputs(previous, STOPPED_IN_QUEUE)


def run_request(settings: RunSettings, replay: bool = True) -> RunRequest:
    """The ``RunRequest`` of the page's inputs; ValueError for bad input or a failed model load."""
    options = options_from_page(settings)  # every input checked, the table's shape too
    model = chosen_model(options.model).in_dtype(options.dtype)  # a bad one: refused here
    if options.servers and model.model_id != get_model().model_id:
        raise ValueError(
            f"The host's servers serve {get_model().model_id}, not {model.model_id}: run them on "
            "that model, or run this one without them."
        )
    requests, config = prepare(model, settings.rows, settings.num_slots, options)
    return RunRequest(model, requests, config, options, replay, judged=tables.compared)


def _follow(run: Run, x_axis: str):
    """The handler's one wait loop: place, progress, servers; returns ``Ended`` or ``Left``."""
    sent, sent_s = None, -math.inf
    views = progress_view.LiveTimelines()  # updates and redraws paced within a CPU budget
    servers = _ServersStage(run, x_axis)
    note = RUNNING_NOTE  # the first update says so under Run too
    while True:
        wait_s = QUEUE_POLL_S if run.queued else views.wait_s(PROGRESS_INTERVAL_S)
        event = run.wait(wait_s)
        if isinstance(event, Waiting):
            queue = run.request.model.queue
            line = progress_view.queue_line(event.place, queue.measured)
            if line != sent or queue.clock() - sent_s >= QUEUE_RESEND_S:
                sent, sent_s = line, queue.clock()
                run.lend()  # Gradio holds the generator until it asks again: not stale meanwhile
                hidden = gr.Button(visible=False)
                yield run_outputs(status_markdown=line, run_note_markdown=line, live_button=hidden)
        elif isinstance(event, Running) and (event.shown is not None or servers.summary):
            yield servers.outputs(event)
        elif isinstance(event, Running):
            request = run.request
            update = views.outputs(
                event.progress,
                request.requests,
                request.config.num_slots,
                x_axis,
                event.elapsed_s,
                event.time_limit_s,
            )
            yield update if note is None else progress_view.with_run_note(update, note)
            note = None
            views.resumed()
        elif isinstance(event, Replay):
            recent = event.recent
            yield replayed_outputs(recent, run.request.model.recent.age_s(recent), x_axis)
            return None
        else:
            return event


class _ServersStage:
    """The page while the servers run: each answer so far drawn, the status line alone between."""

    def __init__(self, run: Run, x_axis: str):
        self.run, self.x_axis = run, x_axis
        self.summary = ""  # the status line of the answer shown last; "" before the first
        self.done: dict[str, str] = {}

    def outputs(self, event: Running) -> tuple:
        names = self.run.server_names
        if event.shown is None:
            line = self._line(event)
            return run_outputs(status_markdown=f"{line}  \n{self.summary}")  # nothing drawn
        state = run_state(event.shown)
        self.done = dict.fromkeys(state.servers, "done")
        self.done |= dict.fromkeys(state.server_failures, "no results")
        self.summary = run_status.status_line(state)
        status = f"{self._line(event)}  \n{self.summary}"
        result = render(state, self.x_axis, status=status, downloads=False)
        running = next((n for n in names if n not in self.done), "")
        plain = progress_view.plain_markdown
        so_far = ", ".join(["our engines", *map(plain, state.servers)])
        note = f"**Running:** results so far below ({so_far}); {plain(running)} runs now."
        return progress_view.with_run_note(result.as_outputs(), note)

    def _line(self, event: Running) -> str:
        return progress_view.servers_line(
            self.run.server_names, event.progress, self.done, event.elapsed_s, event.time_limit_s
        )


def _finished_outputs(
    run: Run, ended: Ended, previous: RunState | None, x_axis: str
) -> Iterator[tuple]:
    """The ended run's results (a stopped or refused run puts ``previous`` back and says why);
    raises gr.Error past the time limit."""
    try:
        state = run_state(ended.result())
    except RunCancelled:  # Stop (a closed tab ends at a yield: nobody sees this)
        yield progress_view.previous_outputs(previous, STOPPED, x_axis)
        return
    except (RunStopped, ValueError) as exc:  # the time limit, or bad input only engines could see
        reason = progress_view.plain_markdown(str(exc))
        yield progress_view.previous_outputs(previous, f"**Stopped:** {reason}", x_axis)
        if isinstance(exc, RunStopped):
            raise gr.Error(f"Run stopped: {toast_text(exc)}", print_exception=False) from None
        gr.Warning(toast_text(exc), title="Run stopped")  # bad input: told, as before the run
        return
    for name, message in state.server_failures.items():  # the rest is shown: a toast each
        gr.Warning(toast_text(message), title=f"{toast_text(name)}: no results")
    result = render(state, x_axis)
    recent = run.request.model.recent
    run.finish(lambda: recent.keep(run.key, state, result.downloads))
    yield progress_view.with_run_note(result.as_outputs(), "✓ **Finished:** results below.")


def run_state(answer: RunAnswer) -> RunState:
    state = RunState.from_comparison(answer.comparison)
    state.servers, state.server_failures = answer.servers, answer.server_failures
    if answer.server_verdicts:
        marked = divergence_view.expected_differences(answer.server_verdicts, answer.servers)
        state.verdicts = {**state.verdicts, **marked}
    return state


def run_engines(model, requests, config, options) -> RunState:
    """A whole run at once (``make record``, tests); raises as ``Ended.result``."""
    handle = RunHandle()
    request = RunRequest(model, requests, config, options, replay=False, judged=tables.compared)
    with Run(request, handle, handle.start()) as run:
        while not isinstance(ended := run.wait(QUEUE_POLL_S), Ended):
            pass
    return run_state(ended.result())


def replayed_outputs(recent: RecentRun, age_s: float, x_axis: str) -> tuple:
    """The Run outputs showing ``recent``, labelled; its figures drawn once per x axis."""
    label = replay_label(recent, age_s)
    status = f"**Shown at once:** {label}. {run_status.status_line(recent.state)}"
    drawn = recent.drawn(x_axis, lambda: render(recent.state, x_axis, downloads=False))
    result = dataclasses.replace(drawn, status=status, downloads=recent.downloads)
    return progress_view.with_run_note(
        result.as_outputs(), f"**Shown at once:** {label}.", live_button=True
    )


def run_pressed(handle: RunHandle | None, seq=0, request: gr.Request | None = None) -> tuple:
    """Run pressed (unqueued; ``seq``: the click's number): note, status line, "Run live anyway"."""
    if handle is not None and request is not None:
        handle.joined(request.session_hash)
    if handle is not None and not handle.press(int(seq or 0)):
        return gr.skip(), gr.skip(), gr.skip()
    return PRESSED_NOTE, gr.Button(visible=False), PRESSED_STATUS


def session_end_event(handles: RunHandle) -> Callable:
    """``demo.unload``'s handler: a closed tab's run is stopped at once and never kept."""

    def session_ended(request: gr.Request) -> None:
        handles.session_ended(request.session_hash)

    return session_ended


def stop_event(handle: RunHandle | None, seq=0) -> str:
    """The Stop button's handler (unqueued; ``seq``: the click's number)."""
    return handle.stop(int(seq or 0)) if handle is not None else IDLE


def stop_told(what: str) -> None:
    """After Stop (queued: a toast needs Gradio's queue): with nothing to stop, says so."""
    if what == IDLE:
        gr.Info("Nothing is running, so there is nothing to stop.", title="Stop")


def left_queue_event(handle: RunHandle | None, previous: RunState | None, x_axis: str) -> tuple:
    """The run waiting in Gradio's queue was cancelled: why, and the previous run's status."""
    if handle is not None:
        handle.left_queue()
    return progress_view.previous_outputs(previous, STOPPED_IN_QUEUE)


def _refused_outputs(previous: RunState | None, exc: ValueError) -> tuple:
    gr.Warning(toast_text(exc), title="Not run")
    note = f"**Not run:** {progress_view.plain_markdown(str(exc))}"
    return progress_view.previous_outputs(previous, note, hide_live=False)


def update_step(
    state: RunState | None, step_index, x_axis: str, layer: str = GLOBAL_LAYERS
) -> tuple:
    """Redraw the heatmaps, block map and timeline cursors at a step (no model call)."""
    if state is None:
        return (gr.skip(),) * len(STEP_VIEW_OUTPUTS)
    return step_views(state, int(step_index or 0), x_axis, layer or GLOBAL_LAYERS).as_tuple()


def layer_event(state: RunState | None, step_index, x_axis: str, layer: str) -> tuple:
    return (layer, *update_step(state, step_index, x_axis, layer))


def link_step_event(state: RunState | None, pending_step: int | None, x_axis: str) -> tuple:
    """After a run: slider and step views at the link's kept step, in one update."""
    if state is None or pending_step is None:
        return (gr.skip(),) * (2 + len(STEP_VIEW_OUTPUTS))
    step = min(max(int(pending_step), 0), max(state.num_steps - 1, 0))
    return (step, None, *step_views(state, step, x_axis).as_tuple())
