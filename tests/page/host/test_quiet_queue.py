"""The page's queue polls at Windows' pace on every platform (``engine.page.host.quiet_queue``)."""

from __future__ import annotations

import gradio as gr
import pytest

from engine.page.host import quiet_queue


def _queued_demo() -> gr.Blocks:
    with gr.Blocks() as demo:
        gr.Button().click(lambda: None)
    demo.queue()
    return demo


def test_gradio_queue_still_has_the_polling_sleeps_it_sets():
    """Gradio's queue has both sleeps, each shorter than the quiet one (else nothing to do)."""
    queue = _queued_demo()._queue
    for name, quiet_s in quiet_queue.QUIET_SLEEPS_S.items():
        assert isinstance(getattr(queue, name), float), name  # AttributeError: Gradio renamed it
        assert getattr(queue, name) <= quiet_s, name


def test_quiet_sets_the_sleeps():
    """After ``quiet`` the queue sleeps 50 ms between looks for events, 100 ms for progress."""
    demo = _queued_demo()
    quiet_queue.quiet(demo)
    assert demo._queue.sleep_when_free == 0.05
    assert demo._queue.progress_update_sleep_when_free == 0.1


def test_quiet_warns_and_changes_nothing_on_a_queue_without_them():
    """A queue without the attributes (a future Gradio) gets a warning, not new attributes."""
    demo = _queued_demo()
    del demo._queue.progress_update_sleep_when_free
    before = demo._queue.sleep_when_free
    with pytest.warns(UserWarning, match="progress_update_sleep_when_free"):
        quiet_queue.quiet(demo)
    assert demo._queue.sleep_when_free == before
    assert not hasattr(demo._queue, "progress_update_sleep_when_free")


def test_the_served_page_runs_quiet(monkeypatch):
    """``launch`` quiets the queue of the page it serves (checked at the moment it launches)."""
    from engine.page.host import launch

    seen = {}
    monkeypatch.setattr(gr.Blocks, "launch", lambda self, **kw: seen.update(q=self._queue))
    monkeypatch.setattr(gr.Blocks, "block_thread", lambda self: None)
    monkeypatch.setattr(gr.Blocks, "local_url", "http://127.0.0.1:0/", raising=False)
    args = launch.parse_args(["--port", "0"])
    shared = type(
        "Shared",
        (),
        {"servers": None, "label_markdown": "m", "dtype_name": "float32", "model_id": "embedded"},
    )()
    shared.dtype_choices = lambda: ["float32"]
    launch._launch(lambda *a: _queued_demo(), shared, args)
    assert seen["q"].sleep_when_free == quiet_queue.QUIET_SLEEPS_S["sleep_when_free"]
