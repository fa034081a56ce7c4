"""The two engines this playground compares, each writing a ``Trace``: ``static`` (padded waves,
each ``wave`` through the packed forward pass) and ``continuous``. Import them by name."""

__all__ = [
    "static",
    "continuous",
]
