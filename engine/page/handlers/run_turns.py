"""A pressed Run's way to the model: a recent identical run at once, or a true place in the queue.

Runs are measurements, so they take turns on the model (``engine.page.run.run_queue``). Before a
run joins the queue, ``recent`` looks for the same setup measured on this host within the replay
window (``engine.page.run.recent_runs``); if there is one, the page shows it at once, labelled,
with a "Run live anyway" button. Otherwise the run joins the queue and ``wait_for_turn`` streams
its place, the total and the estimated wait until the model is its own; if an identical run
finishes while it waits, that run is shown instead (a replay-allowed Run only).

The estimate counts a run's work in steps: static waves to their longest caps, continuous steps
(all tokens over the slots, at least the longest cap), a ``model.generate`` pass per request when
the outputs are checked (each token a step) and transformers' engine when it is compared. The queue
learns this host's seconds per such step from the runs that finish here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from engine.config import EngineConfig
from engine.page.run.recent_runs import RecentRun, replay_label
from engine.page.run.run_handle import Turn
from engine.page.run.run_options import RunOptions
from engine.page.run.run_queue import RunQueue, Ticket
from engine.page.run.shared_model import SharedModel
from engine.page.views import progress_view, run_status
from engine.page.views.run_view import render
from engine.sequence import Request

QUEUE_POLL_S = 1.0  # how often a waiting run looks at its place
# A waiting run's line is sent when its words change, else every this many seconds: each send
# costs the server about 14 ms of CPU (Gradio rebuilds every skipped output's component), taken
# from the run being measured. A closed tab's generator stops at its next send, so its ticket
# goes stale (``run_queue.STALE_S``) within this many seconds more.
QUEUE_RESEND_S = 5.0
TURN, STOPPED = "turn", "stopped"  # how a wait ended (else: an identical run to show)


def static_steps(requests: list[Request], config: EngineConfig) -> int:
    """Estimated static steps: each wave runs to its longest cap."""
    b = config.num_slots
    return sum(
        max(r.max_new_tokens for r in requests[i : i + b]) for i in range(0, len(requests), b)
    )


def continuous_steps(requests: list[Request], config: EngineConfig) -> int:
    """Estimated continuous steps: all tokens spread over the slots, at least the longest cap."""
    caps = [r.max_new_tokens for r in requests]
    return max(math.ceil(sum(caps) / config.num_slots), max(caps))


def work_steps(requests: list[Request], config: EngineConfig, options: RunOptions) -> int:
    """A run's work in steps, for the queue's estimate (see the module docstring)."""
    steps = static_steps(requests, config) + continuous_steps(requests, config)
    if options.check_reference:
        steps += sum(r.max_new_tokens for r in requests)
    if options.compare_hf:
        steps += continuous_steps(requests, config)
    return steps


def setup_key(
    model: SharedModel, requests: list[Request], config: EngineConfig, options: RunOptions
) -> tuple:
    """What makes two runs identical: the model and its precision, the tokenized requests (prompt
    ids, caps, arrivals, sampling settings) and every engine knob. The x axis is not in it: it only
    changes how a run is drawn."""
    rows = tuple(
        (tuple(r.prompt_token_ids), r.max_new_tokens, r.arrival_s, repr(r.sampling))
        for r in requests
    )
    return (model.label, model.dtype_name, repr(config), repr(options), rows)


def replayed_outputs(recent: RecentRun, age_s: float, x_axis: str) -> tuple:
    """The Run event's outputs showing ``recent`` as what it is: an earlier real run, labelled."""
    label = replay_label(recent, age_s)
    status = f"**Shown at once:** {label}. {run_status.status_line(recent.state)}"
    result = render(recent.state, x_axis, status=status, downloads=False)
    result.downloads = recent.downloads
    return progress_view.with_run_note(
        result.as_outputs(), f"**Shown at once:** {label}.", live_button=True
    )


def wait_for_turn(
    queue: RunQueue, ticket: Ticket, turn: Turn, find_recent: Callable[[], RecentRun | None]
) -> Iterator[tuple]:
    """Yield the Run event's outputs with ``ticket``'s place until the model is its own.

    Returns (as the generator's value) ``TURN`` at its turn, ``STOPPED`` when Stop took it out of
    the queue, or the ``RecentRun`` of an identical setup that finished while it waited
    (``find_recent``): in a room, the first run of a setup serves everyone who waited for it.
    """
    sent, sent_s = None, -math.inf
    try:
        while not queue.wait_turn(ticket, timeout_s=QUEUE_POLL_S):
            if turn.stop_requested:
                return STOPPED
            if (recent := find_recent()) is not None:
                return recent
            line = progress_view.queue_line(queue.place(ticket), queue.s_per_step is not None)
            if line != sent or queue.clock() - sent_s >= QUEUE_RESEND_S:
                sent, sent_s = line, queue.clock()
                yield progress_view.queued_outputs(line)
    except ValueError:  # taken out of the queue: Stop
        return STOPPED
    if turn.stop_requested:
        return STOPPED
    return find_recent() or TURN  # the run before may have been this very setup
