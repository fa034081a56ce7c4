"""Workloads: the requests a run is given (``workload``, ``workload_files``) and the files a run is
taken away in (``export``). Import them by name."""

__all__ = [
    "workload",
    "workload_files",
    "export",
]
