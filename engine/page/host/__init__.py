"""Hosting: starting the page and serving it: the command line, the queue, links, Spaces.

``launch`` (``app.py``'s command line, the model or the engine process, and the server),
``quiet_queue``, ``server_priority`` (the server's threads yield the CPU to a run), ``share``
(public links) and ``zerogpu`` (ZeroGPU Spaces). The top room of the page: it may import every
other.

Nothing is imported here: import the modules by name. ``__all__`` is the room's face;
``quiet_queue``, ``server_priority``, ``share`` serve it from inside.
"""

__all__ = [
    "launch",
    "zerogpu",
]
