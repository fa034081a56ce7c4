"""The two engines this playground compares, each writing a ``Trace``: ``static`` (padded waves
behind a barrier, each ``wave`` through the packed forward pass) and ``continuous`` (iteration-level
scheduling, one packed row). Map: docs/architecture.md.

Nothing is imported here: import the modules by name.
"""

__all__ = [
    "static",
    "continuous",
]
