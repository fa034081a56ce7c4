"""The run: one visitor's run from the button to the engines, and the page's model. Modules:
``cpu_split``, ``model_line``, ``run``, ``run_handle``, ``run_options``, ``shared_model``,
``recent_runs``."""

__all__ = [
    "cpu_split",
    "model_line",
    "run",
    "run_handle",
    "run_options",
    "shared_model",
    "recent_runs",
]
