"""The model picker's handler: the host's model chosen, loaded where the engines run, after the
run in progress; and the model line after a run, in the run's precision.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future

import gradio as gr

from engine.page.run import shared_model
from engine.page.views import progress_view

LOAD_POLL_S = 0.5  # how often the status line tells the load's stage and seconds


def choose_model_event(name: str | None) -> Iterator[tuple]:
    """``(model line, status line)`` updates: each load stage every ``LOAD_POLL_S``, then the
    end."""
    chosen = (name or "").strip()
    stage = ["asking the engine process"]
    loaded: Future = Future()
    threading.Thread(target=_load, args=(chosen, stage, loaded), daemon=True).start()
    start_s = time.monotonic()
    while True:
        try:
            model = loaded.result(timeout=LOAD_POLL_S)
            break
        except TimeoutError:
            seconds = time.monotonic() - start_s
            yield gr.skip(), f"**Loading** `{chosen}`: {stage[-1]} ({seconds:.0f} s)…"
        except ValueError as exc:  # ModelLoadError included: the loader's own words
            reason = progress_view.plain_markdown(str(exc))
            yield gr.skip(), f"**Not run:** `{chosen}` cannot run here, because: {reason}"
            return
    seconds = time.monotonic() - start_s
    yield model.label_markdown, f"**Model ready:** `{chosen}` ({seconds:.1f} s); Run runs on it."


def run_model_line(state, name: str | None):
    """After a Run: the model line of ``name`` in the precision of the run ``state`` shows."""
    model = shared_model.get_model()
    if state is None or not model.holds(name):
        return gr.skip()
    return model.in_model(name).run_label_markdown(state.dtype)


def _load(name: str, stage: list[str], loaded: Future) -> None:
    try:
        loaded.set_result(shared_model.chosen_model(name, stage.append))
    except BaseException as exc:  # handed to the handler, which tells ValueErrors
        loaded.set_exception(exc)
