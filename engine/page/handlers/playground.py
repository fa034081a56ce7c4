"""The page's handlers as plain functions: run both engines, then redraw a step without the model.

``app.py`` only lays out components and wires them to these functions, so everything the page does
can be tested without a browser. ``run_event`` (the Run button) runs the static and the
continuous engine (and, if asked, the per-request ``model.generate`` reference) on the same
tokenized requests and renders every output; ``update_step`` redraws the heatmaps and timeline
cursors from the stored traces.

Bad input never loses anything: ``run_event`` puts the engine's ``ValueError`` message in the
status line and a warning toast, and leaves the previous results on the page. The model is the
one shared module-level object (``engine.page.run.shared_model.get_model``): a ``SharedModel``
loaded once, or the engine process's ``ModelView``; tests put their own ``SharedModel`` (imported
from here) in its place. What the page shows of a run is built in
``engine.page.views.run_view``; the knobs are parsed in ``engine.page.run.run_options``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator

import gradio as gr

from engine.page.handlers import run_turns
from engine.page.handlers.run_turns import run_engines
from engine.page.inputs.page_io import apply_link_step, toast_text
from engine.page.run.live_run import LiveRun
from engine.page.run.run_handle import IDLE, REPEAT_PRESS, STOPPED_PRESS, RunHandle, Turn
from engine.page.run.run_options import (
    RUN_SIGNATURE,
    RunSettings,
    options_from_page,
    prepare,
    settings_from_run,
    view_inputs,
)
from engine.page.run.shared_model import PageModel, SharedModel, get_model  # noqa: F401
from engine.page.views import progress_view, run_status
from engine.page.views.run_view import (
    STEP_VIEW_OUTPUTS,
    RunResult,
    RunState,
    render,
    run_outputs,
    step_views,
)
from engine.serving.run_control import RunCancelled, RunControl, RunStopped, run_time_limit_s
from engine.workloads.workload import TABLE_COLUMNS

REQUEST_HEADERS = list(TABLE_COLUMNS)  # prompt, max_new_tokens, arrival_s, sampling settings
PROGRESS_INTERVAL_S = 0.5  # at most two live updates a second (fewer: progress_view)
STOPPED = "**Stopped** before the end."
STOPPED_IN_QUEUE = "**Stopped** before it started: it left the queue."
RUNNING_NOTE = "**Running:** its progress is in the status line below."
PRESSED_NOTE = "**Run pressed:** checking the table, then a place in the queue…"
PRESSED_STATUS = f"{PRESSED_NOTE} The results below stay as they are until it starts."


# --- handlers ------------------------------------------------------------------------------------


def run_event(*values, **named) -> Iterator[tuple]:
    """The Run button's handler: a generator streaming progress, then the finished results.

    Takes the Run event's inputs in ``run_options.RUN_INPUTS`` order (the /run API's positions;
    its signature, for Gradio and API clients, is ``run_options.RUN_SIGNATURE``) or by name, and
    builds the ``RunSettings`` from them (``settings_from_run``).

    Yields the tuple app.py's outputs expect: live updates every ``PROGRESS_INTERVAL_S``, or less
    often where Gradio's handling of them would take over ``progress_view.UPDATE_SHARE`` of the
    run, while the engines run on the engine thread or in the engine process (``LiveRun``),
    then ``RunResult.as_outputs()``.
    Stop sets the stop flag of this run's ``RunControl`` through the session's ``handle``
    (``engine.page.run.run_handle``): the worker stops within one step and the handler yields the
    ``previous`` results with "Stopped" and returns. When Gradio closes the generator (a closed
    tab) the worker stops too, and a closed or reloaded tab stops it at once through
    ``session_end_event`` (``demo.unload``). The chosen servers (``server_names``, the host's: see
    ``engine.page.run.host_servers``) run last.

    Bad input (a bad table, slot count or knob, a KV budget too small for a request, or a
    ``ValueError`` an engine raises mid-run), and a model that cannot load, is not an error of
    the event: the status line says why the run did not happen (a warning toast too), the
    earlier results stay on the page (put back, mid-run), and the handler returns. A Gradio
    error would lay its badge over that status line.

    Raises:
        gr.Error: the run passed ``CBP_RUN_TIME_LIMIT_S`` (after putting the ``previous``
            run's results back).
        TypeError: too many inputs, or a required one missing.
    """
    settings, previous, handle = settings_from_run(*values, **named)
    handle = handle if handle is not None else RunHandle()
    turn = handle.start()
    if turn.skip == REPEAT_PRESS:  # a second press during a run, or one already run: skipped
        yield run_outputs()
        return
    if turn.skip == STOPPED_PRESS:
        yield _left_queue_outputs(previous)
        return
    try:
        yield from _run(settings, previous, handle, turn)
    finally:
        handle.finish(turn)


run_event.__signature__ = RUN_SIGNATURE  # Gradio names /run's parameters and defaults from it


def _run(settings: RunSettings, previous, handle: RunHandle, turn: Turn):
    """``run_event``'s work once the run may start: check the input, then show a recent identical
    run at once, or wait for the model's turn, run, stream and finish (``run_turns``)."""
    try:
        options = options_from_page(settings)  # every input checked, the table's shape too
        x_axis, replay = view_inputs(settings)
        model = get_model()  # one that cannot load (a ValueError) is told as "Not run" too
        model = model.in_dtype(options.dtype)  # a dtype the device cannot run: refused here
        requests, config = prepare(model, settings.rows, settings.num_slots, options)
        key = run_turns.setup_key(model, requests, config, options)
        recent = model.recent.find(key) if replay else None
        if recent is None:
            reference = model.reference_for(config.batch_invariant)
            work = run_turns.run_work(requests, config, options, reference)
            setup = key if replay else None  # shown an identical run, if one ends
            ticket = model.queue.join(str(id(handle)), work, setup)
            handle.queued(turn, functools.partial(model.queue.leave, ticket))
    except ValueError as exc:
        yield _refused_outputs(previous, exc)
        return
    if recent is not None:
        yield run_turns.replayed_outputs(recent, model.recent.age_s(recent), x_axis)
        return
    find = functools.partial(model.recent.find, key) if replay else lambda: None
    try:
        waited = yield from run_turns.wait_for_turn(model.queue, ticket, turn, find)
        if waited == run_turns.STOPPED:
            yield _left_queue_outputs(previous)
            return
        if waited != run_turns.TURN:  # an identical run finished while this one waited
            yield run_turns.replayed_outputs(waited, model.recent.age_s(waited), x_axis)
            return
        run = (model, requests, config, options)
        done = functools.partial(_done, turn, ticket, key)
        watch = functools.partial(run_turns.report_progress, model.queue, ticket)
        attach = functools.partial(handle.attach, turn)
        yield from _run_live(run, attach, previous, x_axis, done, watch, lambda: turn.abandoned)
    finally:
        model.queue.leave(ticket)


def _done(turn: Turn, ticket, key, model: PageModel, state, result: RunResult, wall_s: float):
    """A live run finished: the queue learns its pace and frees the model; its setup is kept,
    unless its tab went away first (``Turn.abandoned``: nobody saw it end)."""
    if not turn.abandoned:
        model.recent.keep(key, state, result.downloads)  # first: those waiting for it see it
    model.queue.finish(ticket, wall_s, run_turns.run_parts_s(state))


def _run_live(
    run: tuple,
    attach: Callable,
    previous,
    x_axis: str,
    on_done: Callable,
    on_progress: Callable | None = None,
    abandoned: Callable[[], bool] = lambda: False,
):
    """The run itself, its turn on the model taken: ``attach(control)`` hands Stop its control;
    stream its progress, then its results (``on_progress(progress)`` is called as its steps are
    done: ``LiveRun``); ``on_done(model, state, result, wall_s)`` once it finished well. A run
    ``abandoned()`` by its tab ends there: nothing is rendered for nobody, and nothing is kept."""
    model, requests, config, options = run
    control = RunControl(_user_errors(run_time_limit_s))
    attach(control)
    started_s = time.monotonic()

    def work(take: Callable) -> RunState:  # the status line shows progress, not a Gradio bar
        return run_engines(model, requests, config, options, take, control)

    views = progress_view.LiveTimelines()  # updates and redraws paced within a CPU budget
    note = RUNNING_NOTE  # the first update says so under Run too
    with LiveRun(work, control, on_progress) as live:
        while not live.wait(views.wait_s(PROGRESS_INTERVAL_S)):
            elapsed_s = time.monotonic() - started_s
            progress = live.progress()
            update = views.outputs(
                progress, requests, config.num_slots, x_axis, elapsed_s, control.time_limit_s
            )
            yield update if note is None else progress_view.with_run_note(update, note)
            note = None
            views.resumed()

    def done(state: RunState, result: RunResult) -> None:
        on_done(model, state, result, time.monotonic() - started_s)

    if abandoned():
        return
    yield from _finished_outputs(live, previous, x_axis, done)


def _finished_outputs(
    live: LiveRun, previous: RunState | None, x_axis: str, on_done: Callable | None = None
) -> Iterator[tuple]:
    """The ended run's results; a stopped or refused run puts ``previous`` back and says why.
    ``on_done(state, result)`` is called with a finished run's results before they are sent.

    Raises:
        gr.Error: the run passed its time limit.
    """
    try:
        state = live.result()
    except RunCancelled:  # Stop (a closed tab ends at a yield: nobody sees this)
        yield _stopped_outputs(previous, STOPPED, x_axis)
        return
    except (RunStopped, ValueError) as exc:  # the time limit, or bad input only engines could see
        reason = progress_view.plain_markdown(str(exc))
        yield _stopped_outputs(previous, f"**Stopped:** {reason}", x_axis)
        if isinstance(exc, RunStopped):
            raise gr.Error(f"Run stopped: {toast_text(exc)}", print_exception=False) from None
        gr.Warning(toast_text(exc), title="Run stopped")  # bad input: told, as before the run
        return
    for name, message in state.server_failures.items():  # the rest is shown: a toast each
        gr.Warning(toast_text(message), title=f"{toast_text(name)}: no results")
    result = render(state, x_axis)
    if on_done is not None:
        on_done(state, result)
    yield progress_view.with_run_note(result.as_outputs(), "✓ **Finished:** results below.")


def run_pressed(handle: RunHandle | None, seq=0, request: gr.Request | None = None) -> tuple:
    """Run pressed (unqueued, before the run is sent or deferred): see ``RunHandle.press``;
    ``seq``: its click's number in the page's sequence of clicks (``page_io.RUN_CLICK_JS``).
    Returns the note under Run, "Run live anyway" and the status line: the note and the status
    line say Run was pressed (the status line no longer gives the previous run's line, which
    stayed until the run's first update) and the button goes, at once (it comes back only with a
    run shown at once), unless no run goes for this press (all three ``gr.skip()``). The handle
    is noted as the browser session's (``request``), for ``session_end_event``."""
    if handle is not None and request is not None:
        handle.joined(request.session_hash)
    if handle is not None and not handle.press(int(seq or 0)):
        return gr.skip(), gr.skip(), gr.skip()
    return PRESSED_NOTE, gr.Button(visible=False), PRESSED_STATUS


def session_end_event(handles: RunHandle) -> Callable:
    """``demo.unload``'s handler, for the page's first ``handles`` (which finds every session's):
    a session whose tab closed or reloaded has its run stopped as by Stop, at once, and never
    kept (``RunHandle.session_ended``). Gradio's own close of the Run handler waits for its next
    yield, and for the run's event stream to that tab to be seen gone."""

    def session_ended(request: gr.Request) -> None:
        handles.session_ended(request.session_hash)

    return session_ended


def stop_event(handle: RunHandle | None, seq=0) -> str:
    """The Stop button's handler (unqueued, like ``run_pressed``; ``seq``: its click's number in
    the page's sequence of clicks, ``page_io.STOP_CLICK_JS``). Stops this session's run through
    its ``RunControl`` or takes it out of the page's queue (the run then says "Stopped" itself),
    and marks the presses clicked before it. Returns what there was (``RunHandle.stop``):
    ``"running"``, ``"waiting"``, ``"queued"`` (a run in Gradio's own queue, on ZeroGPU: the page
    then cancels it) or ``"idle"`` (``stop_told`` says so in a toast)."""
    return handle.stop(int(seq or 0)) if handle is not None else IDLE


def stop_told(what: str) -> None:
    """After Stop (queued: a toast needs Gradio's queue): with nothing to stop, says so."""
    if what == IDLE:
        gr.Info("Nothing is running, so there is nothing to stop.", title="Stop")


def left_queue_event(handle: RunHandle | None, previous: RunState | None, x_axis: str) -> tuple:
    """The run waiting in Gradio's queue was cancelled (after Stop answered "queued"): why, and
    the previous run's status (its results still show; ``x_axis``: kept for the wiring)."""
    if handle is not None:
        handle.left_queue()
    return _left_queue_outputs(previous)


def _refused_outputs(previous: RunState | None, exc: ValueError) -> tuple:
    """A run refused for bad input: the reason in the status line and a warning toast; every other
    output, and the previous run's results with it, stays as it is."""
    gr.Warning(toast_text(exc), title="Not run")
    previous_status = None if previous is None else run_status.status_line(previous)
    return progress_view.refused_outputs(str(exc), previous_status)


def _left_queue_outputs(previous: RunState | None) -> tuple:
    """A run stopped before it started: while it waited only the status line and the note under
    Run changed, so only they are sent back, with the previous run's status line (its figures
    are not drawn again: on a CPU busy with the run in progress, at the server's lower priority,
    that redraw delayed "Stopped" by seconds)."""
    previous_status = None if previous is None else run_status.status_line(previous)
    return progress_view.queued_outputs(STOPPED_IN_QUEUE, previous_status)


def _stopped_outputs(previous: RunState | None, message: str, x_axis: str) -> tuple:
    shown = None if previous is None else render(previous, x_axis, downloads=False)
    return progress_view.stopped_outputs(shown, message)


def update_step(state: RunState | None, step_index, x_axis: str) -> tuple:
    """Redraw the heatmaps, block map and timeline cursors at a step (no model call)."""
    if state is None:
        return (gr.skip(),) * len(STEP_VIEW_OUTPUTS)
    return step_views(state, int(step_index or 0), x_axis).as_tuple()


def link_step_event(state: RunState | None, pending_step: int | None, x_axis: str) -> tuple:
    """After a run: the step slider at a link's kept step (``page_io.apply_link_step``) and the
    step views drawn at that step, in one update, so that the slider never reads a step the views
    do not show. Returns the slider, the kept step (cleared) and the step views; without a run or
    a kept step, nothing changes."""
    if state is None or pending_step is None:
        return (gr.skip(),) * (2 + len(STEP_VIEW_OUTPUTS))
    step, kept = apply_link_step(state, pending_step)
    return (step, kept, *step_views(state, step, x_axis).as_tuple())


def _user_errors(fn: Callable):
    """Call ``fn``; turn a ``ValueError`` (bad user input) into a ``gr.Error`` with its message."""
    try:
        return fn()
    except ValueError as exc:
        raise gr.Error(toast_text(exc), print_exception=False) from exc
