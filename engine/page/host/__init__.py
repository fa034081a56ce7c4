"""Hosting: the command line, the queue's polling, links, Spaces; the top room of the page."""

__all__ = [
    "launch",
    "zerogpu",
]
