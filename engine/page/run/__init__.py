"""The run: one visitor's run from the button to the engines, and the page's model. Modules:
``cpu_split``, ``model_line``, ``run``, ``run_handle``, ``run_options``, ``shared_model``,
``run_queue``, ``queue_ticket``, ``run_cost``, ``recent_runs``."""

__all__ = [
    "cpu_split",
    "model_line",
    "run",
    "run_handle",
    "run_options",
    "shared_model",
    "run_queue",
    "run_cost",
    "recent_runs",
]
