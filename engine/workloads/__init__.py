"""Workloads: the requests a run is given (``workload``, ``workload_files``) and the files a run is
taken away in (``export``); docs/architecture.md.

Nothing is imported here: import the modules by name.
"""

__all__ = [
    "workload",
    "workload_files",
    "export",
]
