"""Views: what the page shows of a run, as figures, tables and lines of text. Modules:
``run_view``, ``progress_view``, ``run_status``, ``tables``, ``divergence_view``,
``server_view``, ``inside_view``, ``markup``."""

__all__ = [
    "tables",
    "divergence_view",
    "run_status",
    "server_view",
    "inside_view",
    "run_view",
    "progress_view",
]
