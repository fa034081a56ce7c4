"""Nobody leaves the page's queue except by Stop, closing the tab or a reload, on a busy host.

Gradio drives a Run handler's generator one yield at a time: after a waiting run yields its line,
Gradio sends it and asks for the next only when its event loop gets there, after every other
tab's outputs queued before it. On a host whose CPUs are all busy that can take longer than any
staleness bound tied to the handler's own polls, so these tests hold a yielded generator as a
late event loop does, with a busy-loop process on each CPU, while another waiting handler polls.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from test_run_turns import _events, _status, page  # noqa: F401  (``page`` is a fixture)

from engine.page.handlers.playground import STOPPED_IN_QUEUE
from engine.page.run.run_handle import RunHandle

STALE_S = 1.0  # the queue's bound for a polling handler, short so that a test can pass it
HELD_S = 4.0  # how long Gradio's late event loop holds a yielded generator here


@pytest.fixture
def busy_host():
    """A busy-loop process on each CPU for the test's length."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 1)
    ]
    yield spinners
    for spinner in spinners:
        spinner.kill()
        spinner.wait()


def _hold_the_model(page):  # noqa: F811
    holder = page.queue.join("someone else", 10)
    assert page.queue.wait_turn(holder, timeout_s=0), "the model was not free"
    return holder


def test_a_waiting_run_whose_line_gradio_holds_keeps_its_place(page, busy_host):  # noqa: F811
    """A waiting run's generator not resumed for longer than the queue's staleness bound (Gradio's
    event loop late on a busy host), while another waiting run polls, keeps its place, then runs
    and finishes: it never reads "Stopped before it started"."""
    page.queue.stale_s = STALE_S
    holder = _hold_the_model(page)
    held = _events(RunHandle(), replay=False)
    assert "Waiting for the model" in _status(next(held)), "the run did not wait"
    behind = []
    poller = threading.Thread(target=lambda: behind.extend(_events(RunHandle(), replay=False)))
    poller.start()  # its handler polls the queue every QUEUE_POLL_S meanwhile
    time.sleep(HELD_S)
    page.queue.leave(holder)
    rest = [_status(update) for update in held]
    poller.join(timeout=120)
    assert not any(STOPPED_IN_QUEUE in str(s) for s in rest), f"dropped from the queue: {rest}"
    assert "✓ all match" in str(rest[-1]), f"the held run did not finish: {rest[-1]}"
    assert "✓ all match" in str(_status(behind[-1])), "the run behind it did not finish"


def test_a_closed_tab_still_frees_its_place_at_once(page, busy_host):  # noqa: F811
    """Gradio closing a waiting run's generator (its tab went away) takes it out of the queue at
    once, however long the queue would keep a lent ticket."""
    holder = _hold_the_model(page)
    gone = _events(RunHandle(), replay=False)
    assert "Waiting for the model" in _status(next(gone)), "the run did not wait"
    assert page.queue.size() == 2, "the waiting run is not in the queue"
    gone.close()
    assert page.queue.size() == 1, "a closed tab's run kept its place"
    page.queue.leave(holder)


def test_a_tab_that_ends_its_session_leaves_the_queue(page, busy_host):  # noqa: F811
    """A tab closed or reloaded (``demo.unload``: ``RunHandle.session_ended``) takes its waiting
    run out of the queue, and the handler says it left, without waiting for staleness."""
    holder = _hold_the_model(page)
    handle = RunHandle()
    handle.press()
    handle.joined("tab-1")
    gone = _events(handle, replay=False)
    assert "Waiting for the model" in _status(next(gone)), "the run did not wait"
    handle.session_ended("tab-1")
    assert page.queue.size() == 1, "an ended session's run kept its place"
    page.queue.leave(holder)
    gone.close()
