"""Worker: a run's engine work as one typed job and one typed result, wherever it runs.

``transport``: one worker interface (submit a job, wait for its progress and answer) and its
transport on the ``engine_thread``; ``worker_process``: the transport to a process of its own,
whose side is ``worker_main``. ``worker_model``: the model a worker holds. ``engines``: every
engine by name, the one factory. ``progress``: how far each engine got, sent as the run goes.
``comparison``: the engines, transformers' engine and the reference with its verdicts, as one
job. ``model_facts``: what a process without the weights needs of the model. May import every
core room below it, ``peers`` included; nothing in the core imports it.

Nothing is imported here: import the modules by name. ``__all__`` is the room's face.
"""

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
