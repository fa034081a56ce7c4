"""Which worker the page's engines run in (``CBP_ENGINE_PROCESS``): the engine thread in the
page's process, or an engine process of its own (``engine.worker.worker_process``)."""

from __future__ import annotations

from engine import settings

ENV = "CBP_ENGINE_PROCESS"
CHOICES = ("auto", "on", "off")


def engine_process_wanted(environ=None, on_zerogpu: bool = False) -> bool:
    """Whether ``app.py`` runs the engines in a ``ProcessWorker``, from ``CBP_ENGINE_PROCESS``:
    ``auto`` (the default: on, except on ZeroGPU, which lends its GPU to the page's own process
    only), ``on``, or ``off`` (a ``ThreadWorker``). On by default because the engines then get
    CPUs of their own (``cpu_split``), which a room cannot slow (docs/measurements.md, "CPUs of
    their own").

    Raises:
        ValueError: another value.
    """
    text = settings.value(ENV, environ).lower()
    if text not in CHOICES:
        raise ValueError(f"{ENV}={text!r}: give auto, on or off")
    return text == "on" or (text == "auto" and not on_zerogpu)
