"""Which worker the page's engines run in: the engine thread, or an engine process of its own."""

from __future__ import annotations

from engine import settings

ENV = "CBP_ENGINE_PROCESS"
CHOICES = ("auto", "on", "off")


def engine_process_wanted(environ=None, on_zerogpu: bool = False) -> bool:
    """Whether ``app.py`` runs the engines in a ``ProcessWorker`` (``CBP_ENGINE_PROCESS``:
    docs/hosting.md); raises ValueError for another value."""
    text = settings.value(ENV, environ).lower()
    if text not in CHOICES:
        raise ValueError(f"{ENV}={text!r}: give auto, on or off")
    return text == "on" or (text == "auto" and not on_zerogpu)
