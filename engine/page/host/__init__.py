"""Hosting: starting the page and serving it: the command line, the queue, links, Spaces.

``launch`` (``app.py``'s command line and the server), ``quiet_queue``, ``share`` (public links)
and ``zerogpu`` (ZeroGPU Spaces). The top room of the page: it may import every other.

Nothing is imported here: import the modules by name. ``__all__`` is the room's face;
``quiet_queue``, ``share`` serve it from inside.
"""

__all__ = [
    "launch",
    "zerogpu",
]
