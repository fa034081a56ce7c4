"""Hosting: the command line, the queue's polling, links, Spaces; the top room of the page.
Modules: ``launch``, ``quiet_queue``, ``server_priority``, ``share``, ``zerogpu``."""

__all__ = [
    "launch",
    "zerogpu",
]
