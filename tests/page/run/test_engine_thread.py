"""The page's torch calls share one thread: the model load, the warm-up and every run."""

from __future__ import annotations

import threading

import pytest
from tiny_model import tiny_runner

from engine.page.run import engine_worker, shared_model
from engine.page.run.live_run import LiveRun
from engine.serving.run_control import RunControl


def _run_on_live_thread() -> int:
    with LiveRun(lambda _take: threading.get_ident(), RunControl()) as live:
        assert live.wait(10), "the work did not end"
    return live.result()


def test_the_load_warm_up_and_every_run_share_one_thread(monkeypatch):
    """load_shared_model loads and warms up on the thread every LiveRun then works on."""
    loaded = tiny_runner().loaded
    load_threads, warm_up_threads = [], []
    warm_up = shared_model.SharedModel.warm_up

    def load(*_args):
        load_threads.append(threading.get_ident())
        return loaded

    def recorded_warm_up(self):
        warm_up_threads.append(threading.get_ident())
        warm_up(self)

    monkeypatch.setattr(shared_model, "load_model", load)
    monkeypatch.setattr(shared_model.SharedModel, "warm_up", recorded_warm_up)
    monkeypatch.setattr(shared_model, "_shared_model", None)
    shared = shared_model.load_shared_model("embedded")
    assert shared.loaded is loaded and shared_model.get_model() is shared
    runs = [_run_on_live_thread(), _run_on_live_thread()]
    assert load_threads == warm_up_threads == runs[:1]
    assert runs == [engine_worker.ENGINE_THREAD.ident] * 2
    assert runs[0] != threading.get_ident(), "the work ran on the caller's thread"


def test_a_call_from_the_engine_thread_runs_at_once_and_errors_reach_the_caller():
    """call() on the engine thread itself runs directly (no deadlock); raised errors come back."""
    worker = engine_worker.EngineThread("test-engine")
    nested = worker.call(lambda: worker.call(threading.get_ident))
    assert nested == worker.ident != threading.get_ident()

    def failing():
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        worker.call(failing)
    assert worker.call(lambda: 7) == 7, "the thread died with the error"
