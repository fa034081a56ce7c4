"""The Run handler as a generator: live progress, cancellation within a step, the time limit.

The tiny random model runs a step in about a millisecond, so the continuous engine's forward pass
is slowed down (``SLOW_STEP_S``) to give the run a length the handler can watch and interrupt.
"""

from __future__ import annotations

import gc
import math
import re
import threading
import time
import weakref

import gradio as gr
import pytest
from tiny_model import tiny_runner

from engine.fidelity.reference import ReferenceCache
from engine.host_queue import run_cost
from engine.page.handlers import playground
from engine.page.run import shared_model
from engine.page.run.run_handle import RunHandle
from engine.page.run.shared_model import PageModel, local_model
from engine.page.views.progress_view import progress_line
from engine.page.views.run_view import RUN_OUTPUTS
from engine.serving.run_control import RunCancelled, RunControl, RunTimedOut, run_time_limit_s
from engine.worker.progress import EngineProgress
from engine.worker.transport import ThreadWorker
from engine.worker.worker_model import WorkerModel

ROWS = [["hello world", 4], ["abc", 30], ["the quick brown fox", 3], ["x", 12]]
KNOBS = (2, False, True, "slots", 0, "decode_first", False, 0, "time")  # slots and the knobs
SLOW_STEP_S = 0.02
STATUS_INDEX, OUTPUTS_INDEX, CONTINUOUS_TIMELINE_INDEX = (
    RUN_OUTPUTS.index(name)
    for name in ("status_markdown", "outputs_table", "continuous_timeline_plot")
)


@pytest.fixture
def shared(monkeypatch) -> PageModel:
    """A fresh tiny shared model, continuous steps of SLOW_STEP_S, its KV caches kept by weakref."""
    runner = tiny_runner()
    model = local_model(WorkerModel(runner.loaded, runner, ReferenceCache(runner)))
    model.forward_calls = []
    model.caches = []
    forward, new_cache = runner.forward_packed, runner.new_kv_cache

    def slow_forward(batch):
        model.forward_calls.append(time.monotonic())
        time.sleep(SLOW_STEP_S)
        return forward(batch)

    def tracked_cache(*args, **kwargs):
        cache = new_cache(*args, **kwargs)
        model.caches.append(weakref.ref(cache))
        return cache

    monkeypatch.setattr(runner, "forward_packed", slow_forward)
    monkeypatch.setattr(runner, "new_kv_cache", tracked_cache)
    monkeypatch.setattr(shared_model, "_shared_model", model)
    monkeypatch.setattr(playground, "PROGRESS_INTERVAL_S", 0.05)
    monkeypatch.setattr(
        "engine.worker.progress.SNAPSHOT_INTERVAL_S", 3600.0
    )  # finishes still shown
    return model


def _continuous_outputs(table: gr.Dataframe) -> list[str]:
    column = table.value["headers"].index("continuous output")
    return [row[column] for row in table.value["data"]]


def _tables_shown(updates) -> list[gr.Dataframe]:
    """The outputs table the page shows after each update: a skipped one leaves the last."""
    shown = []
    for update in updates:
        table = update[OUTPUTS_INDEX]
        shown.append(table if isinstance(table, gr.Dataframe) else shown[-1])
    return shown


def _until_continuous_runs(events):
    """Consume live updates until the status shows the continuous engine running."""
    for update in events:
        if "continuous batching:" in update[STATUS_INDEX]:
            return update
    raise AssertionError("the run ended before the continuous engine was seen running")


def test_progress_streams_before_the_run_ends(shared):
    """Live updates count steps and finished requests, and outputs fill in before the end."""
    updates = list(playground.run_event(ROWS, *KNOBS))
    final, live = updates[-1], updates[:-1]
    assert "✓ all match" in final[STATUS_INDEX], final[STATUS_INDEX]
    assert live and all(u[STATUS_INDEX].startswith("**Running**") for u in live), "no live status"
    final_outputs = _continuous_outputs(final[OUTPUTS_INDEX])
    tables = _tables_shown(live)
    partial = [
        outputs
        for u, table in zip(live, tables, strict=True)
        if "continuous batching:" in u[STATUS_INDEX]
        for outputs in [_continuous_outputs(table)]
        if any(outputs) and not all(outputs)
    ]
    assert partial, "no live update showed some continuous outputs while others were pending"
    for outputs in partial:
        for shown, done in zip(outputs, final_outputs, strict=True):
            assert shown in ("", done), f"live output {shown!r} is not the final {done!r}"
    num_static_steps = len(final[0].static.steps)
    static_done = f"static batching: {num_static_steps} steps, 4/4 requests done"
    in_continuous = [u[STATUS_INDEX] for u in live if "continuous batching:" in u[STATUS_INDEX]]
    assert in_continuous and all(static_done in s for s in in_continuous), in_continuous[:1]
    for u, table in zip(live, tables, strict=True):
        done = re.search(r"continuous batching: \d+ steps?, (\d+)/4", u[STATUS_INDEX])
        shown = sum(bool(text) for text in _continuous_outputs(table))
        assert done is None or int(done[1]) == shown, f"status {done[0]} but {shown} outputs"
    drawn = [
        u[CONTINUOUS_TIMELINE_INDEX] for u in live if "continuous batching:" in u[STATUS_INDEX]
    ]
    final_timeline = final[CONTINUOUS_TIMELINE_INDEX]
    assert any(isinstance(fig, type(final_timeline)) for fig in drawn), "timeline not drawn live"


def test_a_slow_taker_of_updates_is_sent_fewer(shared):
    """Where each update takes Gradio long to handle, the handler waits longer before the next."""

    def live_updates(handling_s: float) -> int:
        num_live = 0
        for update in playground.run_event(ROWS, *KNOBS):
            num_live += update[STATUS_INDEX].startswith("**Running**")
            time.sleep(handling_s)
        return num_live

    quick, slow = live_updates(0.0), live_updates(0.05)  # slow: each next update waits 2.5 s
    assert slow <= 2 < quick, (slow, quick)


def test_the_queue_learns_the_steps_as_the_handler_reads_them(shared, monkeypatch):
    """The run's steps reach the queue each time the handler's wait loop reads them, in order,
    timed when they were done: a handler Gradio did not iterate for a while (a busy page) reads
    them late, and the queue's pace of the running run is still right."""
    reported = []  # (steps, when done)
    progress = shared.queue.progress

    def counted(ticket, steps, done_s=None):
        reported.append((steps, done_s))
        progress(ticket, steps, done_s)

    monkeypatch.setattr(shared.queue, "progress", counted)
    events = playground.run_event(ROWS, *KNOBS)
    _until_continuous_runs(events)
    paused_at, paused_s = list(reported), time.monotonic()
    time.sleep(20 * SLOW_STEP_S)  # the handler is not iterated: Gradio is busy elsewhere
    read_s = time.monotonic()
    next(events)
    after_pause = reported[len(paused_at) :]
    events.close()
    assert after_pause and after_pause[-1][0] > paused_at[-1][0], (paused_at, after_pause)
    assert [s for s, _ in reported] == sorted(s for s, _ in reported), "steps out of order"
    done_during = [done_s for _, done_s in after_pause if paused_s <= done_s < read_s]
    assert done_during, f"steps read late are not timed when done: {after_pause}"


def test_closing_the_handler_stops_the_engine_within_a_step_and_frees_the_kv_cache(shared):
    """Gradio's cancel (closing the generator) stops the worker; its KV cache is released."""
    events = playground.run_event(ROWS, *KNOBS)
    _until_continuous_runs(events)
    events.close()
    closed_s = time.monotonic()
    assert shared.lock.acquire(timeout=5), "the cancelled run still holds the model"
    shared.lock.release()
    late = [t for t in shared.forward_calls if t > closed_s]
    assert len(late) <= 1, f"{len(late)} forward passes after the cancel"
    gc.collect()
    assert shared.caches and all(ref() is None for ref in shared.caches), "a KV cache is alive"
    follow_up = list(playground.run_event([["next user", 3]], *KNOBS))[-1]
    assert "✓ all match" in follow_up[STATUS_INDEX], "the next run failed after a cancel"


@pytest.mark.parametrize(
    ("late_s", "waiting"),
    [
        (30, "static batching: 0 steps, 0/2 requests done, waiting for arrivals"),
        (3, "continuous batching: 2 steps, 1/2 requests done, waiting for arrivals"),
    ],
)
def test_closing_the_handler_ends_a_wait_for_arrivals(shared, late_s, waiting):
    """Closed while an engine waits for a later arrival, the run frees the model within 1 s
    (not at the arrival), its KV cache goes, and the status said it was waiting."""
    events = playground.run_event([["early", 2, 0], ["late", 2, late_s]], *KNOBS)
    for update in events:
        if waiting in update[STATUS_INDEX]:
            break
    else:
        raise AssertionError(f"the status never said {waiting!r}")
    events.close()
    assert shared.lock.acquire(timeout=1.0), "the run still waits for its arrival after a close"
    shared.lock.release()
    gc.collect()
    assert all(ref() is None for ref in shared.caches), "a KV cache outlived the closed run"
    follow_up = list(playground.run_event([["next user", 3]], *KNOBS))[-1]
    assert "✓ all match" in follow_up[STATUS_INDEX], "the next run failed after the close"


def test_time_limit_stops_the_run_and_puts_the_previous_results_back(shared, monkeypatch):
    """Past CBP_RUN_TIME_LIMIT_S the run stops with a message; the earlier results come back."""
    previous = list(playground.run_event([["earlier run", 2]], *KNOBS))[-1]
    monkeypatch.setenv("CBP_RUN_TIME_LIMIT_S", "0.3")
    # past any margin: the run joins (a run refused up front is test_run_turns's) and is stopped
    monkeypatch.setattr(run_cost, "LIMIT_MARGIN", math.inf)
    events = playground.run_event(ROWS, *KNOBS, previous[0])
    updates = []
    with pytest.raises(gr.Error, match=r"longer than the limit of 0\.3 s"):
        for update in events:
            updates.append(update)
    status = updates[-1][STATUS_INDEX]
    assert "Stopped" in status and "Showing the previous run" in status, status
    assert "1 request" in status, f"the previous run's status is not shown: {status!r}"
    rows = updates[-1][OUTPUTS_INDEX].value["data"]
    assert [r[1] for r in rows] == ["earlier run"], f"previous outputs not restored: {rows}"
    assert shared.lock.acquire(timeout=5), "the timed-out run still holds the model"
    shared.lock.release()


def test_a_wait_in_the_queue_longer_than_the_limit_does_not_count_against_the_run(
    shared, monkeypatch
):
    """The run limit counts from a run's turn on the model: a run that waited in line longer
    than the limit (a busy room) still runs in full, instead of being stopped as it begins."""
    monkeypatch.setenv("CBP_RUN_TIME_LIMIT_S", "2")
    ahead = shared.queue.join("someone ahead", run_cost.Work.of_steps(10))
    assert shared.queue.wait_turn(ahead, 0.0), "the model was not free for the run ahead"
    threading.Timer(3.0, shared.queue.finish, (ahead, 3.0)).start()  # 3 s in line: over 2 s
    began_s = time.monotonic()
    final = list(playground.run_event([["waited in line", 3]], *KNOBS))[-1]
    assert time.monotonic() - began_s > 3.0, "the run did not wait for the run ahead"
    assert "✓ all match" in final[STATUS_INDEX], final[STATUS_INDEX]


def test_engine_value_error_mid_run_is_told_like_bad_input(shared, monkeypatch):
    """A ValueError from an engine mid-run (bad input only it could see) is no page error: the
    status line and a warning say it, and the earlier results come back."""
    previous = list(playground.run_event([["earlier run", 2]], *KNOBS))[-1]

    def refuse(batch):
        raise ValueError("KV memory budget exceeded")

    monkeypatch.setattr(shared.worker.model.runner, "forward_packed", refuse)
    with pytest.warns(UserWarning, match="KV memory budget exceeded"):
        updates = list(playground.run_event(ROWS, *KNOBS, previous[0]))
    status = updates[-1][STATUS_INDEX]
    assert status.startswith("**Stopped:** KV memory budget exceeded Showing the previous run:")
    assert [r[1] for r in updates[-1][OUTPUTS_INDEX].value["data"]] == ["earlier run"]


def test_progress_line_counts_each_engine():
    """The live status names each engine with its steps and, for the engines, requests done;
    before the first step it says the run is starting (its turn on the model is taken)."""
    progress = {
        "static": EngineProgress("static", num_steps=12, num_finished=4, num_requests=4),
        "continuous": EngineProgress("continuous", num_steps=5, num_finished=1, num_requests=4),
        "reference": EngineProgress("reference", num_steps=7),
    }
    line = progress_line(progress, elapsed_s=3.25, time_limit_s=600.0)
    assert line.startswith("**Running** · 3.2 s (limit 600 s)"), line
    for part in (
        "static batching: 12 steps, 4/4 requests done",
        "continuous batching: 5 steps, 1/4 requests done",
        "model.generate reference: 7 steps",
    ):
        assert part in line, f"{part!r} missing from {line!r}"
    first = progress_line({}, 1.0, None)  # the model's turn taken, no engine step yet
    assert "limit" not in first, "an off time limit is shown"
    assert first.endswith("· starting") and "waiting" not in first, f"a run said it waits: {first}"
    progress["continuous"].waiting = True
    line = progress_line(progress, elapsed_s=3.25, time_limit_s=None)
    assert "continuous batching: 5 steps, 1/4 requests done, waiting for arrivals" in line, line
    assert line.count("waiting") == 1, f"an engine that is not waiting is said to wait: {line}"


def test_stop_ends_the_run_through_its_handle_and_puts_the_previous_results_back(shared):
    """Stop (through the session's RunHandle, no Gradio cancel) ends the running engine within a
    step; the run itself then shows the previous results under "Stopped before the end"."""
    previous = list(playground.run_event([["kept result", 2]], *KNOBS))[-1]
    handle = RunHandle()
    handle.press()
    events = playground.run_event(ROWS, *KNOBS, previous[0], handle=handle)
    _until_continuous_runs(events)
    assert playground.stop_event(handle) == "running"
    stopped_s = time.monotonic()
    rest = list(events)
    late = [t for t in shared.forward_calls if t > stopped_s]
    assert len(late) <= 1, f"{len(late)} forward passes after Stop"
    status = rest[-1][STATUS_INDEX]
    assert status.startswith("**Stopped** before the end. Showing the previous run:"), status
    assert [r[1] for r in rest[-1][OUTPUTS_INDEX].value["data"]] == ["kept result"]
    assert handle.idle and handle.control is None, "the handle still holds the run"
    assert playground.stop_event(handle) == "idle", "Stop after the run found something to stop"


def test_run_control_raises_once_stopped_or_late():
    """check() passes, then raises RunCancelled after stop() and RunTimedOut after the deadline."""
    control = RunControl(time_limit_s=None)
    control.check()
    control.stop()
    with pytest.raises(RunCancelled):
        control.check()
    late = RunControl(time_limit_s=0.01)
    time.sleep(0.02)
    with pytest.raises(RunTimedOut, match="limit of 0.01 s"):
        late.check()


@pytest.mark.parametrize(
    ("value", "expected"), [(None, 600.0), ("0", None), ("2.5", 2.5), (" 30 ", 30.0)]
)
def test_time_limit_from_the_environment(monkeypatch, value, expected):
    """CBP_RUN_TIME_LIMIT_S: unset gives the default, 0 turns it off, numbers are seconds."""
    if value is None:
        monkeypatch.delenv("CBP_RUN_TIME_LIMIT_S", raising=False)
    else:
        monkeypatch.setenv("CBP_RUN_TIME_LIMIT_S", value)
    assert run_time_limit_s() == expected


@pytest.mark.parametrize("value", ["-1", "soon", "inf", "nan"])
def test_bad_time_limit_is_a_clear_error(monkeypatch, value):
    """A time limit that is not a number of seconds >= 0 names the variable."""
    monkeypatch.setenv("CBP_RUN_TIME_LIMIT_S", value)
    with pytest.raises(ValueError, match="CBP_RUN_TIME_LIMIT_S"):
        run_time_limit_s()


def _failing(_model, _watch):
    raise KeyError("boom")


def test_a_job_hands_its_error_to_the_caller():
    """An error in a job on the engine thread is raised by ``result()``, in the caller's thread."""
    job = ThreadWorker(None).submit(_failing, (), RunControl(), lambda _entry: None)
    assert job.wait(5), "the job did not end"
    with pytest.raises(KeyError, match="boom"):
        job.result()


def test_transformers_engine_is_stopped_by_its_poll():
    """A RunStopped raised by the poll ends transformers' engine; the model then runs normally."""
    from tiny_model import make_requests

    from engine.config import EngineConfig
    from engine.peers.transformers_engine import HFContinuousEngine

    runner = tiny_runner()
    requests = make_requests([("hello world", 200), ("abc", 200), ("xyz", 200)])
    polls = []

    def stop_at_second_poll(trace):
        polls.append(trace)
        if len(polls) == 2:
            raise RunCancelled("stopped by the test")

    engine = HFContinuousEngine(runner, EngineConfig(2))
    attention_before = runner.model.config._attn_implementation
    with pytest.raises(RunCancelled):
        engine.run(requests, on_wait=stop_at_second_poll)
    assert len(polls) == 2 and polls[0] is polls[1], "polled with the run's own trace"
    assert runner.model.config._attn_implementation == attention_before, "attention put back"
    after = engine.run(requests[:1])
    want = ReferenceCache(runner).output(requests[0])
    assert after.requests[0].output_token_ids == want, "the next run is still correct"
