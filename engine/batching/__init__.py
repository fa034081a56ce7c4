"""The two engines this playground compares, each writing a ``Trace``.

``static``: padded waves behind a batch barrier, each ``wave`` run through the packed forward
pass. ``continuous``: iteration-level scheduling with every in-flight token packed in one row.
May import every core room below it (``workloads``, ``serving``, ``kernels``, ``model``).

Nothing is imported here: import the modules by name. ``__all__`` is the room's face.
"""

__all__ = [
    "static",
    "continuous",
]
