"""The page's server threads yield the CPU to a run: made after the model loads, at a higher
nice value than the engine thread, which keeps the one the process started with; with the CPUs
split, the page keeps its nice value."""

from __future__ import annotations

import os
import sys
import threading
from types import SimpleNamespace

import pytest

from engine.page.host import launch, server_priority
from engine.page.run.cpu_split import CpuSplit
from engine.worker.engine_thread import ENGINE_THREAD

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="a nice value per thread is Linux's"
)


def _nice(thread_id: int = 0) -> int:
    return os.getpriority(os.PRIO_PROCESS, thread_id)


def _in_thread(fn):
    """``fn()``'s value, run in a fresh thread (so that a nice value it raises dies with it)."""
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("value", fn()))
    thread.start()
    thread.join(timeout=30)
    return out["value"]


def test_the_setting_is_read_and_checked():
    """``CBP_SERVER_NICE``: 10 when unset or empty, any whole number from 0 to 19, else a
    message that names the variable."""
    assert server_priority.server_nice({}) == 10
    assert server_priority.server_nice({"CBP_SERVER_NICE": " "}) == 10
    assert server_priority.server_nice({"CBP_SERVER_NICE": "0"}) == 0
    assert server_priority.server_nice({"CBP_SERVER_NICE": "19"}) == 19
    for bad in ("20", "-1", "ten", "2.5"):
        with pytest.raises(ValueError, match="CBP_SERVER_NICE"):
            server_priority.server_nice({"CBP_SERVER_NICE": bad})


@linux_only
def test_only_the_calling_thread_and_its_later_threads_are_lowered():
    """The calling thread's nice value rises by the steps, a thread it then makes inherits it,
    and the thread that made it keeps its own."""
    before = _nice()

    def lowered():
        changed = server_priority.lower_this_thread(3)
        return changed, _nice(), _in_thread(_nice)

    changed, own, child = _in_thread(lowered)
    assert changed and own == min(19, before + 3) and child == own, (before, own, child)
    assert _nice() == before, "the caller's caller was lowered too"
    assert _in_thread(lambda: server_priority.lower_this_thread(0)) is False


@linux_only
def test_serve_lowers_the_server_after_the_engine_thread_exists(monkeypatch):
    """``serve`` starts the engine process and takes the page's model from it, then lowers the
    thread that launches the page: the page's threads run at +CBP_SERVER_NICE, the engine thread
    and the engine process as before."""
    monkeypatch.setenv("CBP_SERVER_NICE", "4")
    monkeypatch.setenv("CBP_ENGINE_PROCESS", "on")
    base = _nice()
    engine_nice, server_nice, process_nice = [], [], []

    def fake_connect(*_args):
        engine_nice.append(ENGINE_THREAD.call(_nice))
        return SimpleNamespace(label="Model: fake", loaded=None, servers=None)

    def fake_engine_process(*_args):
        process_nice.append(_nice())  # the worker would inherit this thread's nice value
        return SimpleNamespace(close=lambda: None), None

    monkeypatch.setattr(launch, "configured_servers", lambda *_args: None)
    monkeypatch.setattr(launch, "_engine_process", fake_engine_process)
    monkeypatch.setattr(launch, "_connect", fake_connect)
    monkeypatch.setattr(launch, "_launch", lambda *a: server_nice.append(_in_thread(_nice)))
    _in_thread(lambda: launch.serve(lambda *a: None, []))
    assert server_nice == [min(19, base + 4)], (base, server_nice)
    assert ENGINE_THREAD.call(_nice) == engine_nice[0] == base, "the engine thread was lowered"
    assert process_nice == [base], f"the engine process was started at nice {process_nice}"


@linux_only
def test_serve_keeps_the_page_at_its_nice_value_on_cpus_of_its_own(monkeypatch):
    """With the CPUs split (the engine process on CPUs the page does not use) ``serve`` leaves
    the page's threads at the process's nice value: raised, they would yield only to the host's
    other work."""
    monkeypatch.setenv("CBP_SERVER_NICE", "4")
    base, server_nice = _nice(), []
    split = CpuSplit(engine=(1,), page=(0,))
    page_model = SimpleNamespace(label="Model: fake", loaded=None, servers=None)
    monkeypatch.setattr(launch, "configured_servers", lambda *_args: None)
    monkeypatch.setattr(
        launch, "_engine_process", lambda *_a: (SimpleNamespace(close=lambda: None), split)
    )
    monkeypatch.setattr(launch, "_connect", lambda *_args: page_model)
    monkeypatch.setattr(launch, "_launch", lambda *a: server_nice.append(_in_thread(_nice)))
    monkeypatch.setenv("CBP_ENGINE_PROCESS", "on")
    _in_thread(lambda: launch.serve(lambda *a: None, []))
    assert server_nice == [base], f"the page's threads ran at nice {server_nice}, not {base}"
