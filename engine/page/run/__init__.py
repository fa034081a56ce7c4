"""The run: one visitor's run from the button to the engine thread, and the shared model.

The ``engine_thread`` every torch call runs on, the ``engine_process`` that runs the engines in a
process of their own (``CBP_ENGINE_PROCESS``) on CPUs of their own (``cpu_split``), the
``live_run`` watched step by step, Run/Stop state (``run_handle``), the page's knobs
(``run_options``), the ``shared_model``, the host's servers (``host_servers``), the turns runs
take on the model (``run_queue``), what a run costs (``run_cost``), and the recent runs by setup
(``recent_runs``). ``queue_ticket`` (a run's ticket in the queue, and the place and wait its
person is told) serves ``run_queue`` from inside. May import the core and the page rooms below it
(``figures``, ``inputs``).

Nothing is imported here: import the modules by name. ``__all__`` is the room's face.
"""

__all__ = [
    "engine_thread",
    "engine_process",
    "cpu_split",
    "live_run",
    "run_handle",
    "run_options",
    "shared_model",
    "host_servers",
    "run_queue",
    "run_cost",
    "recent_runs",
]
