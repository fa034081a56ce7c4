"""A pressed Run's way to the model: a recent identical run at once, or a true place in the queue.

Runs are measurements, so they take turns on the model (``engine.page.run.run_queue``). A run whose
setup (``setup_key``) was measured on this host within the replay window
(``engine.page.run.recent_runs``) is shown at once, labelled, with a "Run live anyway" button
(``replayed_outputs``). Otherwise it joins the queue with its work in parts (``run_work``: steps,
and the prompt positions each engine prefills), which the queue times at the pace it learns from the
runs that finish here (``run_parts_s``), and ``wait_for_turn`` streams its place; an identical run
that finishes meanwhile is shown instead. Its turn come, ``run_engines`` does the run's engine work.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Callable, Iterator

from engine.config import EngineConfig
from engine.page.run import host_servers
from engine.page.run.recent_runs import RecentRun, replay_label
from engine.page.run.run_cost import Work
from engine.page.run.run_handle import Turn
from engine.page.run.run_options import RunOptions
from engine.page.run.run_queue import RunQueue, Ticket
from engine.page.run.shared_model import PageModel
from engine.page.views import divergence_view, progress_view, run_status, tables
from engine.page.views.run_view import RunState, render
from engine.sequence import Request
from engine.serving.run_control import RunControl, RunStopped
from engine.worker.comparison import (
    ComparisonJob,
    JudgeJob,
    judge_in_worker,
    traces_by_name,
    work_in_worker,
)
from engine.worker.progress import EngineProgress, ProgressLog, Take
from engine.worker.worker_model import pace_parts

QUEUE_POLL_S = 1.0  # how often a waiting run looks at its place
# A waiting run's line is sent when its words change, else every this many seconds: each send
# costs the server CPU taken from the run being measured, times a room of waiting people
# (docs/measurements.md, "What a waiting room costs the page"). A run whose browser vanished stops
# at its next send, so its ticket goes stale (``run_queue.STALE_S``) within this many seconds more.
QUEUE_RESEND_S = 20.0
TURN, STOPPED = "turn", "stopped"  # how a wait ended (else: an identical run to show)


def _waves(requests: list[Request], config: EngineConfig) -> list[list[Request]]:
    """The static engine's waves: ``num_slots`` requests each, in order."""
    b = config.num_slots
    return [requests[i : i + b] for i in range(0, len(requests), b)]


def static_steps(requests: list[Request], config: EngineConfig) -> int:
    """Estimated static steps: each wave runs to its longest cap."""
    return sum(max(r.max_new_tokens for r in wave) for wave in _waves(requests, config))


def static_prefill_tokens(requests: list[Request], config: EngineConfig) -> int:
    """The static waves' prompt positions: each wave's rows left-padded to its longest prompt."""
    waves = _waves(requests, config)
    return sum(len(w) * max(len(r.prompt_token_ids) for r in w) for w in waves)


def continuous_steps(requests: list[Request], config: EngineConfig) -> int:
    """Estimated continuous steps: the caps packed onto the slots in arrival order, each request
    holding its slot for its cap's steps (plus its prefill chunks past the first under a token
    budget) and the next taking the first slot freed. ``max(sum / slots, longest)`` is only a
    lower bound: four caps 12, 20, 8, 30 on two slots take 50 steps, not 35."""
    budget = config.max_num_batched_tokens
    free_at = [0] * config.num_slots  # a heap: the step each slot is free from
    for r in sorted(requests, key=lambda r: r.arrival_s):
        chunks = math.ceil(len(r.prompt_token_ids) / budget) if budget else 1
        start = heapq.heappop(free_at)
        heapq.heappush(free_at, start + r.max_new_tokens + max(0, chunks - 1))
    return max(free_at)


def run_work(
    requests: list[Request], config: EngineConfig, options: RunOptions, reference=None
) -> Work:
    """A run's work in parts, for the queue's estimate (``engine.page.run.run_cost`` says what
    each part counts); ``reference``: the reference source, whose ``missing`` references are the
    reference pass's work (None: all of them)."""
    continuous = continuous_steps(requests, config)
    references, recheck = {}, None
    if options.check_reference and reference is not None:
        references, recheck = reference.missing(requests), reference.still_missing
    elif options.check_reference:
        references = {(r.prompt_token_ids, r.request_id): r.max_new_tokens for r in requests}
    return Work(
        static_steps=static_steps(requests, config),
        continuous_steps=continuous,
        hf_steps=continuous if options.compare_hf else 0,
        prompt_tokens=sum(len(r.prompt_token_ids) for r in requests),
        static_prefill_tokens=static_prefill_tokens(requests, config),
        references=references,
        min_wall_s=max((r.arrival_s for r in requests), default=0.0),
        recheck=recheck,
    )


def run_parts_s(state) -> dict[str, float]:
    """A finished run's seconds in each engine's steps and in their prefill, as its traces timed
    them (``engine.worker.worker_model.pace_parts``), for the queue."""
    return pace_parts(traces_by_name(state.static, state.continuous, state.hf_continuous))


def report_progress(queue: RunQueue, ticket: Ticket, progress: dict[str, EngineProgress]) -> None:
    """Tell the queue how many engine steps the running ``ticket``'s run has done."""
    steps = sum(p.num_steps for name, p in progress.items() if name in progress_view.LIVE_ENGINES)
    queue.progress(ticket, steps)


def setup_key(
    model: PageModel, requests: list[Request], config: EngineConfig, options: RunOptions
) -> tuple:
    """What makes two runs identical: the model and its precision, the tokenized requests (prompt
    ids, caps, arrivals, sampling settings) and every engine knob. The x axis is not in it: it only
    changes how a run is drawn. The precision is ``model``'s (the run's, its dtype chosen), so the
    knob is left out: a page's dropdown sends "float32" where an API client sends nothing, and
    both are the same run of the float32 model."""
    rows = tuple(
        (tuple(r.prompt_token_ids), r.max_new_tokens, r.arrival_s, repr(r.sampling))
        for r in requests
    )
    knobs = repr(dataclasses.replace(options, dtype=None))
    return (model.label, model.dtype_name, repr(config), knobs, rows)


def replayed_outputs(recent: RecentRun, age_s: float, x_axis: str) -> tuple:
    """The Run event's outputs showing ``recent`` as what it is: an earlier real run, labelled;
    its figures drawn once per x axis for everyone it is shown to (``RecentRun.drawn``)."""
    label = replay_label(recent, age_s)
    status = f"**Shown at once:** {label}. {run_status.status_line(recent.state)}"
    drawn = recent.drawn(x_axis, lambda: render(recent.state, x_axis, downloads=False))
    result = dataclasses.replace(drawn, status=status, downloads=recent.downloads)
    return progress_view.with_run_note(
        result.as_outputs(), f"**Shown at once:** {label}.", live_button=True
    )


def wait_for_turn(
    queue: RunQueue, ticket: Ticket, turn: Turn, find_recent: Callable[[], RecentRun | None]
) -> Iterator[tuple]:
    """Yield the Run event's outputs with ``ticket``'s place until the model is its own.

    Returns (as the generator's value) ``TURN`` at its turn, ``STOPPED`` when Stop took it out of
    the queue (at once: the queue wakes a ticket taken out, so no poll or resend delays it), or
    the ``RecentRun`` of an identical setup that finished while it waited (``find_recent``): in a
    room, the first run of a setup serves everyone who waited for it.
    """
    sent, sent_s = None, -math.inf
    try:
        while not queue.wait_turn(ticket, timeout_s=QUEUE_POLL_S):
            if turn.stop_requested:
                return STOPPED
            if (recent := find_recent()) is not None:
                return recent
            line = progress_view.queue_line(queue.place(ticket), queue.measured)
            if line != sent or queue.clock() - sent_s >= QUEUE_RESEND_S:
                sent, sent_s = line, queue.clock()
                yield progress_view.queued_outputs(line)
    except ValueError:  # taken out of the queue: Stop
        return STOPPED
    if turn.stop_requested:
        return STOPPED
    return find_recent() or TURN  # the run before may have been this very setup


def run_engines(
    model: PageModel,
    requests: list[Request],
    config: EngineConfig,
    options: RunOptions,
    take: Take | None = None,
    control: RunControl | None = None,
) -> RunState:
    """Run every engine (and the reference) on ``requests`` in ``model``'s worker, one after
    the other, then the chosen servers here (``host_servers.run_servers``, which reports their
    failures and stops instead of raising them).

    ``take`` receives each engine's progress (``EngineProgress``) as the worker sends it;
    ``control`` (the run's stop flag and time limit) ends the run within one step or wait. The
    model's lock is held throughout, so runs never overlap on the model.

    Raises:
        RunStopped: the run was stopped (``EngineProcessLost``: the engine process died).
        ValueError: bad input only an engine could see.
    """
    take = take or (lambda _entry: None)
    control = control or RunControl()
    job = ComparisonJob(
        requests,
        config,
        compare_hf=options.compare_hf,
        check_reference=options.check_reference,
        dtype=model.dtype_name,
    )
    with model.lock:
        try:
            state = RunState.from_comparison(
                model.worker.run(work_in_worker, (job,), control, take)
            )
            if options.servers:  # last: a server that fails or is stopped leaves the rest whole
                _run_servers(model, state, requests, config, options, control, take)
            return state
        except RunStopped as exc:
            # A fresh exception, raised while the lock is still held: the caught one's traceback
            # holds the engines' frames and their KV cache, which must go before the next run
            # can take the model.
            stopped = type(exc)(str(exc))
        raise stopped


def _run_servers(model: PageModel, state: RunState, requests, config, options, control, take):
    """The host's chosen servers' traces and failures into ``state``, watched here, then their
    verdicts into ``state.verdicts``: those the reference can judge (not another model's, not
    another precision's), labelled where differences are expected. After a stop, or without the
    reference check, none: the page then names their differences by request."""
    names = model.servers.check_names(options.servers)
    state.servers, state.server_failures = host_servers.run_servers(
        model.servers,
        names,
        requests,
        config.num_slots,
        ProgressLog(control, take).watch,
        dtype=state.dtype,
        batch_invariant=config.batch_invariant,
        prefix_caching=config.prefix_caching,
    )
    traces = {n: t for n, t in state.servers.items() if tables.compared(t)}
    if state.verdicts is None or not traces:
        return
    job = JudgeJob(requests, traces, state.dtype, state.batch_invariant)
    try:
        control.check()  # a stopped run asks the engine process for nothing more
        judged = model.worker.run(judge_in_worker, (job,), control, take)
    except RunStopped:
        return  # the servers' results stay, unjudged
    state.verdicts = {**state.verdicts, **divergence_view.expected_differences(judged, traces)}
