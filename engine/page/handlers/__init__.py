"""Handlers: the page's events as plain functions, testable without a browser.

``playground``: Run, Stop and the step slider (a Run followed through its ``engine.page.run.run``
object); ``recording``: the recorded run the page opens on (``make record``); ``opening``:
what a page opened from a setup link shows before its first Run; ``model_choice``: the model
picker, a model of the host's allowlist loaded where the engines run. May import the core and every
page room below it.

Nothing is imported here: import the modules by name. ``__all__`` is the room's face.
"""

__all__ = [
    "model_choice",
    "opening",
    "playground",
    "recording",
]
