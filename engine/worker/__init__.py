"""Worker: a run's engine work as one typed job and one typed result, wherever it runs.

``worker_process``: one worker interface, two transports (``ThreadWorker`` on the engine thread,
``ProcessWorker`` and its process loop, ``worker_main``, pinned to CPUs of its own); the worker
process imports the core only. ``worker_model``: the model a worker holds (weights, runner,
reference cache, its other precisions, warm-up, the pace in plain numbers). ``progress``: how far
each engine got (``ProgressLog``, ``EngineProgress``), sent as the run goes.

``comparison``: the static and continuous engines, transformers' engine and the reference with
its verdicts on one model, asked for with a ``ComparisonJob`` and answered with a
``ComparisonResult`` of core types (and ``JudgeJob``: verdicts of traces made elsewhere); the
engine process runs it, and so does the page's engine thread. ``model_facts``: what a process
without the weights needs of the model (its tokenizer, sizes, labels and reference keys), asked
for the same way. May import every core room below it, ``peers`` included; nothing in the core
imports it.

Nothing is imported here: import the modules by name. ``__all__`` is the room's face.
"""

__all__ = [
    "comparison",
    "model_facts",
    "progress",
    "worker_model",
    "worker_process",
]
