"""The run: one visitor's run from the button to the engines, and the page's model.

``engine_worker`` (where the engines run, ``CBP_ENGINE_PROCESS``: the core's worker on the engine
thread every torch call runs on, or in an engine process of its own, on CPUs of its own,
``cpu_split``), the ``run`` itself (one object from the queue to the answer, which the Run
handler polls), Run/Stop state (``run_handle``),
the page's knobs (``run_options``), the ``shared_model`` (the page's model: the core's worker
model here, or a view of the engine process's), the host's servers (``host_servers``), the turns
runs take on the model (``run_queue``), what a run costs (``run_cost``), and the recent runs by
setup (``recent_runs``). ``queue_ticket`` (a run's ticket in the queue, and the place and wait its
person is told) serves ``run_queue`` from inside. May import the core and the page rooms below it
(``figures``, ``inputs``).

Nothing is imported here: import the modules by name. ``__all__`` is the room's face.
"""

__all__ = [
    "engine_worker",
    "cpu_split",
    "run",
    "run_handle",
    "run_options",
    "shared_model",
    "host_servers",
    "run_queue",
    "run_cost",
    "recent_runs",
]
