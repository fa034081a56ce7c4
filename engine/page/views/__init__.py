"""Views: what the page shows of a run, as figures, tables and lines of text."""

__all__ = [
    "tables",
    "divergence_view",
    "run_status",
    "server_view",
    "inside_view",
    "run_view",
    "progress_view",
]
