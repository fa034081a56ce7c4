"""Worker: a run's engine work as one typed job and one typed result, wherever it runs. Modules:
``transport``, ``engine_thread``, ``worker_process``, ``worker_main``, ``worker_model``,
``engines``, ``progress``, ``comparison``, ``model_facts``. Nothing in the core imports it."""

__all__ = [
    "comparison",
    "engine_thread",
    "engines",
    "model_facts",
    "progress",
    "transport",
    "worker_main",
    "worker_model",
    "worker_process",
]
