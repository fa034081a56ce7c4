"""Views: what the page shows of a run, as figures, tables and lines of text.

A finished run (``run_view``), a running one (``progress_view``), the status line
(``run_status``), the metrics and outputs ``tables``, where outputs differ (``divergence_view``),
the servers' text (``server_view``), a server's own record of its steps in our views
(``inside_view``) and Markdown around a person's text (``markup``). May import
the core and the page rooms below it (``figures``, ``inputs``, ``run``).

Nothing is imported here: import the modules by name. ``__all__`` is the room's face; ``markup``
serves it from inside.
"""

__all__ = [
    "tables",
    "divergence_view",
    "run_status",
    "server_view",
    "inside_view",
    "run_view",
    "progress_view",
]
