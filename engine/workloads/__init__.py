"""Workloads: the requests a run is given, and the files a run is taken away in.

Holds the request table and its parsing (``workload``), workload files in and out
(``workload_files``) and a run's exports (``export``: CSV, JSON, Perfetto). May import the root
vocabulary only (``engine.config``, ``sequence``, ``sampling_params``, ``trace``).

Nothing is imported here: import the modules by name. ``__all__`` is the room's face.
"""

__all__ = [
    "workload",
    "workload_files",
    "export",
]
