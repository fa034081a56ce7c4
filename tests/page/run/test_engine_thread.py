"""The page's torch calls share one thread (the load, the warm-up and every run), and the worker's
progress log paces what it sends."""

from __future__ import annotations

import threading

import pytest
from tiny_model import tiny_runner

from engine.page.run import shared_model
from engine.serving.run_control import RunCancelled, RunControl
from engine.trace import RequestRecord, Trace
from engine.worker import engine_thread, progress, worker_model
from engine.worker.transport import ThreadWorker


def _thread_ident(_model, _watch) -> int:
    return threading.get_ident()


def _run_on_live_thread() -> int:
    """The thread a job of the thread transport runs on."""
    return ThreadWorker(None).run(_thread_ident, (), RunControl(), lambda _entry: None)


def test_the_load_warm_up_and_every_run_share_one_thread(monkeypatch):
    """load_shared_model loads and warms up on the thread every job then runs on."""
    loaded = tiny_runner().loaded
    load_threads, warm_up_threads = [], []
    warm_up = worker_model.WorkerModel.warm_up

    def load(*_args):
        load_threads.append(threading.get_ident())
        return loaded

    def recorded_warm_up(self):
        warm_up_threads.append(threading.get_ident())
        warm_up(self)

    monkeypatch.setattr(worker_model, "load_model", load)
    monkeypatch.setattr(worker_model.WorkerModel, "warm_up", recorded_warm_up)
    monkeypatch.setattr(shared_model, "_shared_model", None)
    shared = shared_model.load_shared_model("embedded")
    assert shared.worker.model.loaded is loaded and shared_model.get_model() is shared
    runs = [_run_on_live_thread(), _run_on_live_thread()]
    assert load_threads == warm_up_threads == runs[:1]
    assert runs == [engine_thread.ENGINE_THREAD.ident] * 2
    assert runs[0] != threading.get_ident(), "the work ran on the caller's thread"


def test_a_call_from_the_engine_thread_runs_at_once_and_errors_reach_the_caller():
    """call() on the engine thread itself runs directly (no deadlock); raised errors come back."""
    worker = engine_thread.EngineThread("test-engine")
    nested = worker.call(lambda: worker.call(threading.get_ident))
    assert nested == worker.ident != threading.get_ident()

    def failing():
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        worker.call(failing)
    assert worker.call(lambda: 7) == 7, "the thread died with the error"


def test_a_progress_log_sends_each_snapshot_once_and_paces_unchanged_entries():
    """Paced (the process's pipe): the first step's entry carries a snapshot, an unchanged entry
    within the interval is not sent, a finished request brings a new snapshot and the last step
    is always sent, its trace None when the receiver has it; unpaced, every step is sent."""
    records = [RequestRecord(i, f"p{i}", max_new_tokens=2, num_prompt_tokens=3) for i in (0, 1)]
    trace = Trace(engine="continuous", num_slots=2, requests=records)
    sent = []
    log = progress.ProgressLog(RunControl(), sent.append, every_s=3600.0)
    log.watch("continuous", trace)
    log.watch("continuous", trace)  # nothing new: kept back
    records[0].finish_s = 0.2
    log.watch("continuous", trace)  # a request finished: a new snapshot
    log.watch("continuous", trace, done=True)
    assert [e.num_steps for e in sent] == [1, 3, 0], "an unchanged entry was sent, or one missed"
    assert [e.num_finished for e in sent] == [0, 1, 1]
    assert sent[0].trace is not trace and sent[1].trace.requests[0].finish_s == 0.2
    assert sent[2].trace is not None, "done: the last snapshot is always taken and sent"
    every = []
    unpaced = progress.ProgressLog(RunControl(), every.append)
    for _ in range(3):
        unpaced.watch("continuous", trace)
    assert [e.num_steps for e in every] == [1, 2, 3] and every[1].trace is None


def test_a_stopped_run_stops_at_its_next_watch():
    """Once its control is stopped, the log raises at the engines' next step."""
    control = RunControl()
    log = progress.ProgressLog(control, lambda _entry: None)
    log.watch("static", None)
    control.stop()
    with pytest.raises(RunCancelled):
        log.watch("static", None)
