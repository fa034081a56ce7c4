"""A run's engine work: static, continuous, transformers' engine, the reference and verdicts, then
the host's servers; in the page's engine thread or in the engine process.

``run_engines`` is what a run does once its turn on the model came. The engine part
(``engine_work``) runs where the model's ``engine_process`` says: in this process (None: the
caller's thread, the page's engine thread), or in the engine process
(``engine.page.run.engine_process``), where ``work_in_process`` does the same with the worker's
own copy of the model and sends its progress back. The host's servers always run here, after the
engines, as they are the page's (``engine.page.run.host_servers``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from engine.batching.continuous import ContinuousEngine
from engine.batching.static import StaticEngine
from engine.config import EngineConfig
from engine.page.run import host_servers
from engine.page.run.run_options import RunOptions
from engine.page.run.shared_model import SharedModel
from engine.page.views import divergence_view
from engine.page.views.run_view import RunState
from engine.peers.transformers_engine import HFContinuousEngine
from engine.sequence import Request
from engine.serving.run_control import RunControl, RunStopped


def run_engines(
    model: SharedModel,
    requests: list[Request],
    config: EngineConfig,
    options: RunOptions,
    watch: Callable[..., None] | None = None,
    control: RunControl | None = None,
) -> RunState:
    """Run every engine (and the reference) on ``requests``, one after the other.

    ``watch(engine, trace)`` is called after every step of every engine (``trace`` is None for
    the reference and transformers' engine), ``watch(engine, trace, waiting=True)`` every 0.05 s
    while an engine waits for arrivals, and ``watch(engine, trace, done=True)`` after each
    engine's last step; an exception it raises (``RunStopped``) ends the run within one step or
    wait. In the engine process, ``watch(engine, None, entry=progress)`` is called with each
    progress entry the worker sends instead, and ``control`` (the run's stop flag and time limit)
    reaches the worker. The model's lock is held throughout, so runs never overlap on the model.
    The chosen servers run last (``engine.page.run.host_servers.run_servers``, which reports
    their failures and stops instead of raising them).

    Raises:
        RunStopped: the run was stopped (``EngineProcessLost``: the engine process died).
        ValueError: bad input only an engine could see.
    """
    watch = watch or (lambda *_args, **_kwargs: None)
    with model.lock:
        try:
            state = _engines(model, requests, config, options, watch, control)
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


def _engines(model, requests, config, options, watch, control) -> RunState:
    """The engine part, here or in the engine process."""
    if model.engine_process is None:
        return engine_work(model, requests, config, options, watch)
    job = (model.dtype_name, requests, config, dataclasses.replace(options, servers=()))
    control = control or RunControl()
    return model.engine_process.run(work_in_process, job, control, watch)


def work_in_process(model: SharedModel, dtype_name: str, requests, config, options, watch):
    """``engine_work`` in the engine process, on its model in ``dtype_name``."""
    return engine_work(model.in_dtype(dtype_name), requests, config, options, watch)


def engine_work(model, requests, config, options, watch) -> RunState:
    """The engines, transformers' engine and the reference with its verdicts (no servers)."""
    runner, invariant = model.runner, config.batch_invariant
    static = StaticEngine(runner, EngineConfig(config.num_slots, batch_invariant=invariant)).run(
        requests,
        functools.partial(_on_step, watch, "static"),
        functools.partial(watch, "static", waiting=True),
    )
    watch("static", static, done=True)
    continuous = ContinuousEngine(runner, config).run(
        requests,
        functools.partial(_on_step, watch, "continuous"),
        functools.partial(watch, "continuous", waiting=True),
    )
    watch("continuous", continuous, done=True)
    hf = None
    if options.compare_hf:  # no step hook: checked every 0.1 s while results are awaited
        watch("hf_continuous", None)
        stop_check = functools.partial(watch, "hf_continuous", waiting=True)
        hf_config = dataclasses.replace(config, batch_invariant=False)  # the page says why
        hf_engine = HFContinuousEngine(runner, hf_config, block_sharing=config.prefix_caching)
        hf = hf_engine.run(requests, on_wait=stop_check)
    state = RunState(static, continuous, None, hf, None, dtype=model.dtype_name)
    state.batch_invariant = invariant
    if options.check_reference:
        source = model.reference_for(invariant)
        state.reference = source.outputs(requests, on_step=lambda: watch("reference", None))
        state.verdicts = divergence_view.judge_runs(runner, source, requests, state.traces())
    return state


def _on_step(watch: Callable, engine: str, trace, _step) -> None:
    """An engine's ``on_step``: let ``watch`` see the trace (or stop the run)."""
    watch(engine, trace)
