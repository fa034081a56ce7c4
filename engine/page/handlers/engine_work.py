"""A run's engine work, then the host's servers; in the page's engine thread or in the engine
process.

``run_engines`` is what a run does once its turn on the model came. It asks the core for the
engine part as one ``engine.worker.comparison.ComparisonJob``, sent through the model's ``run``
(``engine.page.run.shared_model.PageModel``): a ``SharedModel`` runs it on the calling thread (the
page's engine thread), a ``ModelView`` in the engine process (``engine.page.run.engine_process``);
either way ``work_in_worker`` runs it on the model with the weights, and the progress comes back
to ``watch``. The ``ComparisonResult`` that comes back (core types only) becomes the page's
``RunState``. The host's servers always run here, after the engines, as they are the page's
(``engine.page.run.host_servers``); with the reference check, their outputs are then judged
against the same reference by one more job on the model (``JudgeJob``), and the verdicts of a
server on quantized weights are labelled as expected differences
(``engine.page.views.divergence_view.expected_differences``).
"""

from __future__ import annotations

from collections.abc import Callable

from engine.config import EngineConfig
from engine.page.run import host_servers
from engine.page.run.run_options import RunOptions
from engine.page.run.shared_model import PageModel
from engine.page.views import divergence_view, tables
from engine.page.views.run_view import RunState
from engine.sequence import Request
from engine.serving.run_control import RunControl, RunStopped
from engine.worker.comparison import ComparisonJob, JudgeJob, judge_in_worker, work_in_worker


def run_engines(
    model: PageModel,
    requests: list[Request],
    config: EngineConfig,
    options: RunOptions,
    watch: Callable[..., None] | None = None,
    control: RunControl | None = None,
) -> RunState:
    """Run every engine (and the reference) on ``requests``, one after the other.

    ``watch`` sees every engine's steps as ``engine.worker.comparison`` says; an exception it
    raises (``RunStopped``) ends the run within one step or wait. With the engine process,
    ``watch(engine, None, entry=progress)`` is called with each progress entry the worker sends
    instead, and ``control`` (the run's stop flag and time limit) reaches the worker. The model's
    lock is held throughout, so runs never overlap on the model. The chosen servers run last
    (``engine.page.run.host_servers.run_servers``, which reports their failures and stops instead
    of raising them).

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
    control = control or RunControl()
    with model.lock:
        try:
            result = model.run(work_in_worker, (job,), control, watch)
            state = RunState.from_comparison(result)
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
                    prefix_caching=config.prefix_caching,
                )
                _judge_servers(model, state, requests, control, watch)
            return state
        except RunStopped as exc:
            # A fresh exception, raised while the lock is still held: the caught one's traceback
            # holds the engines' frames and their KV cache, which must go before the next run
            # can take the model.
            stopped = type(exc)(str(exc))
        raise stopped


def _judge_servers(model: PageModel, state: RunState, requests, control, watch) -> None:
    """The servers' verdicts into ``state.verdicts`` (those the reference can judge: not another
    model's, not another precision's), labelled where differences are expected. After a stop,
    or without the reference check, none: the page then names their differences by request."""
    traces = {n: t for n, t in state.servers.items() if tables.compared(t)}
    if state.verdicts is None or not traces:
        return
    job = JudgeJob(requests, traces, state.dtype, state.batch_invariant)
    try:
        control.check()  # a stopped run asks the engine process for nothing more
        judged = model.run(judge_in_worker, (job,), control, watch)
    except RunStopped:
        return  # the servers' results stay, unjudged
    state.verdicts = {**state.verdicts, **divergence_view.expected_differences(judged, traces)}
