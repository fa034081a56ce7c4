"""A run's engine work: one typed job in, one typed result out, in core types only::

    static engine ─▶ continuous engine ─▶ transformers' engine ─▶ reference ─▶ verdicts
                                          (compare_hf)             (check_reference)

``JudgeJob`` judges traces made elsewhere (the page's servers) against the cached reference.
``watch``'s calls: docs/architecture.md, "One Run, module by module"."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from engine.config import EngineConfig
from engine.fidelity.divergence import judge_runs
from engine.kernels import cpu_share
from engine.model.model_runner import ModelRunner
from engine.sequence import Request
from engine.trace import Trace
from engine.worker.engines import make_engine

Watch = Callable[..., None]  # watch(engine, trace, done=False, waiting=False)


class ComparisonModel(Protocol):
    """What a job needs of the model it runs on (``WorkerModel`` is one)."""

    runner: ModelRunner

    @property
    def dtype_name(self) -> str: ...

    def in_dtype(self, name: str | None) -> ComparisonModel: ...

    def in_model(self, name: str | None, on_stage=None) -> ComparisonModel: ...

    def reference_for(self, batch_invariant: bool): ...


@dataclass(frozen=True)
class ComparisonJob:
    """What a run asks of the engines."""

    requests: list[Request]
    config: EngineConfig  # the continuous engine's; the static engine takes its slots and mode
    compare_hf: bool = False  # run transformers' continuous batching too
    check_reference: bool = False  # compute the reference and judge every engine against it
    dtype: str | None = None  # the precision to run in, e.g. "bfloat16" (None: the model's own)
    model: str | None = None  # the host's model to run on (None: the worker's own; ``in_model``)


@dataclass
class ComparisonResult:
    """What the engines answer: traces, reference outputs and verdicts."""

    static: Trace
    continuous: Trace
    hf_continuous: Trace | None = None  # transformers' own continuous batching, when compared
    reference: dict[int, list[int]] | None = None  # request id -> reference output ids
    # engine -> request id -> verdict entry (``judge_runs``); None: not judged
    verdicts: dict[str, dict[int, dict]] | None = None
    dtype: str | None = None  # the precision it ran in, e.g. "bfloat16"
    batch_invariant: bool = False

    def traces(self) -> dict[str, Trace]:
        return traces_by_name(self.static, self.continuous, self.hf_continuous)


def traces_by_name(
    static: Trace, continuous: Trace, hf_continuous: Trace | None = None
) -> dict[str, Trace]:
    """A run's engine traces by name, in the order shown: static, continuous, then transformers'
    when it ran (the page adds its servers after them)."""
    runs = {"static": static, "continuous": continuous}
    if hf_continuous is not None:
        runs["hf_continuous"] = hf_continuous
    return runs


def work_in_worker(model: ComparisonModel, job: ComparisonJob, watch: Watch) -> ComparisonResult:
    """The engines, transformers' engine and the reference with its verdicts, on the job's model
    (loaded first if another was chosen since) in the job's precision.

    Raises:
        RunStopped: ``watch`` stopped the run.
        ValueError: bad input only an engine could see, or a model that cannot load.
    """
    model = model.in_model(job.model).in_dtype(job.dtype)
    runner, config, requests = model.runner, job.config, job.requests
    invariant = config.batch_invariant
    result = ComparisonResult(
        static=_run_engine(make_engine("static", runner, config), requests, watch),
        continuous=_run_engine(make_engine("continuous", runner, config), requests, watch),
        dtype=model.dtype_name,
        batch_invariant=invariant,
    )
    if job.compare_hf:  # no step hook: checked every 0.1 s while results are awaited
        watch("hf_continuous", None)
        stop_check = functools.partial(watch, "hf_continuous", waiting=True)
        hf_config = dataclasses.replace(config, batch_invariant=False)  # the page says why
        hf_engine = make_engine("hf_continuous", runner, hf_config)
        result.hf_continuous = hf_engine.run(requests, on_wait=stop_check)
    if job.check_reference:
        source = model.reference_for(invariant)
        result.reference = source.outputs(requests, on_step=lambda: watch("reference", None))
        result.verdicts = judge_runs(runner, source, requests, result.traces())
    return result


def _run_engine(engine, requests: list[Request], watch: Watch) -> Trace:
    """One of our engines over ``requests``, every step and wait watched; its trace, with other
    work's share of this process's CPUs during the run (``info["others_cpu_share"]``)."""
    name = engine.name
    with cpu_share.OtherWork(cpus=cpu_share.own_cpus()) as others:
        trace = engine.run(
            requests,
            lambda trace, _step: watch(name, trace),
            functools.partial(watch, name, waiting=True),
        )
    trace.info["others_cpu_share"] = others.share
    trace.warnings += cpu_share.load_warning(name, others.share)
    watch(name, trace, done=True)
    return trace


@dataclass(frozen=True)
class JudgeJob:
    """Traces made elsewhere (servers), to judge against the reference of ``requests``."""

    requests: list[Request]
    traces: dict[str, Trace]  # by engine name
    dtype: str | None = None  # the run's precision, as in ``ComparisonJob``
    batch_invariant: bool = False  # the reference: each request alone, as in the run
    model: str | None = None  # the run's model, as in ``ComparisonJob``


def judge_in_worker(
    model: ComparisonModel, job: JudgeJob, _watch: Watch
) -> dict[str, dict[int, dict]]:
    """``job.traces`` judged on the job's model: engine -> request id -> verdict entry (a trace
    without logits is judged with the rounding bound counted twice)."""
    model = model.in_model(job.model).in_dtype(job.dtype)
    source = model.reference_for(job.batch_invariant)
    return judge_runs(model.runner, source, job.requests, job.traces)
