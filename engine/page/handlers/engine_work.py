"""A run's engine work, then the host's servers; in the page's engine thread or in the engine
process.

``run_engines`` is what a run does once its turn on the model came. It asks the core for the
engine part as one ``engine.worker.comparison.ComparisonJob``, which runs where the model's
``engine_process`` says: in this process (None: the caller's thread, the page's engine thread),
or in the engine process (``engine.page.run.engine_process``), where ``work_in_worker`` runs it
on the worker's own copy of the model and sends its progress back. The ``ComparisonResult`` that
comes back (core types only) becomes the page's ``RunState``. The host's servers always run here,
after the engines, as they are the page's (``engine.page.run.host_servers``).
"""

from __future__ import annotations

from collections.abc import Callable

from engine.config import EngineConfig
from engine.page.run import host_servers
from engine.page.run.run_options import RunOptions
from engine.page.run.shared_model import SharedModel
from engine.page.views.run_view import RunState
from engine.sequence import Request
from engine.serving.run_control import RunControl, RunStopped
from engine.worker.comparison import ComparisonJob, run_job, work_in_worker


def run_engines(
    model: SharedModel,
    requests: list[Request],
    config: EngineConfig,
    options: RunOptions,
    watch: Callable[..., None] | None = None,
    control: RunControl | None = None,
) -> RunState:
    """Run every engine (and the reference) on ``requests``, one after the other.

    ``watch`` sees every engine's steps as ``engine.worker.comparison`` says; an exception it
    raises (``RunStopped``) ends the run within one step or wait. In the engine process,
    ``watch(engine, None, entry=progress)`` is called with each progress entry the worker sends
    instead, and ``control`` (the run's stop flag and time limit)
    reaches the worker. The model's lock is held throughout, so runs never overlap on the model.
    The chosen servers run last (``engine.page.run.host_servers.run_servers``, which reports
    their failures and stops instead of raising them).

    Raises:
        RunStopped: the run was stopped (``EngineProcessLost``: the engine process died).
        ValueError: bad input only an engine could see.
    """
    watch = watch or (lambda *_args, **_kwargs: None)
    job = ComparisonJob(
        requests,
        config,
        compare_hf=options.compare_hf,
        check_reference=options.check_reference,
        dtype=model.dtype_name,
    )
    with model.lock:
        try:
            state = RunState.from_comparison(_engines(model, job, watch, control))
            if options.servers:  # last: a server that fails or is stopped leaves the rest whole
                names = model.servers.check_names(options.servers)
                state.servers, state.server_failures = host_servers.run_servers(
                    model.servers,
                    names,
                    requests,
                    config.num_slots,
                    watch,
                    dtype=state.dtype,
                    batch_invariant=config.batch_invariant,
                )
            return state
        except RunStopped as exc:
            # A fresh exception, raised while the lock is still held: the caught one's traceback
            # holds the engines' frames and their KV cache, which must go before the next run
            # can take the model.
            stopped = type(exc)(str(exc))
        raise stopped


def _engines(model: SharedModel, job: ComparisonJob, watch: Callable, control):
    """The engine part, here or in the engine process."""
    if model.engine_process is None:
        return run_job(model, job, watch)
    return model.engine_process.run(work_in_worker, (job,), control or RunControl(), watch)
