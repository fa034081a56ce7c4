"""The page's model: one object every run uses, wherever the weights are.

``PageModel`` holds no weights, only its worker's facts (``engine.worker.model_facts``); its jobs
go to an engine process or the page's engine thread. Its precisions and models share its lock,
queue, recent runs and servers. The shared one is the one mutable global the house style allows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.batching.continuous import kv_pool_blocks
from engine.config import EngineConfig
from engine.fidelity import reference_store
from engine.fidelity.reference_store import StoredReferences
from engine.host_queue.run_cost import Work
from engine.host_queue.run_queue import RunQueue
from engine.host_servers.server_set import ServerSet
from engine.model.allowlist import check_model_allowed
from engine.page.run.cpu_split import CpuSplit
from engine.page.run.model_line import model_line
from engine.page.run.recent_runs import RecentRuns, replay_window_s
from engine.sequence import Request
from engine.serving.run_control import RunControl
from engine.worker import worker_model
from engine.worker.engine_thread import ENGINE_THREAD
from engine.worker.model_facts import ModelFacts, chosen_facts, model_facts
from engine.worker.transport import ThreadWorker, Worker
from engine.worker.worker_model import WorkerModel, engine_pace


@dataclass(kw_only=True)
class PageModel:
    facts: ModelFacts
    worker: Worker | None = field(default=None, repr=False)  # where its engine jobs run
    lock: threading.Lock = field(default_factory=threading.Lock)  # held by the one running run
    servers: ServerSet | None = None  # the host's servers (app.py --vllm, --endpoint), if any
    # the turns runs take on the model, and the recent runs by setup: one for every dtype's copy
    queue: RunQueue = field(default_factory=RunQueue, repr=False)
    recent: RecentRuns = field(default_factory=lambda: RecentRuns(replay_window_s()), repr=False)
    cpu_split: CpuSplit | None = None  # the engines' CPUs and the page's, when split
    variants: dict[str, PageModel] = field(default_factory=dict, repr=False)  # by dtype name
    # the other allowlisted model chosen last, by its id (``in_model``): shared, as the lock is
    models: dict[str, PageModel] = field(default_factory=dict, repr=False)
    references: dict[bool, StoredReferences] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.queue.shown_instead = lambda setup: self.recent.find(setup) is not None
        self.queue.start_left_s = self._start_left_s
        self.queue.starting = lambda: self.servers is not None and self.servers.starting()

    def _start_left_s(self, name: str) -> float:
        if self.servers is None or name not in self.servers.engines:
            return 0.0
        return self.servers.start_left_s(name)

    @classmethod
    def connect(cls, worker: Worker, **parts) -> PageModel:
        """Wait for ``worker``'s model, then ask it for its facts. Raises EngineProcessLost (the
        engine process ended first), or the exception its model's load raised."""
        worker.wait_ready()
        facts = worker.run(model_facts, (None,), RunControl(), untaken)
        return cls(facts=facts, worker=worker, **parts)

    def calibrate(self) -> tuple[Work, dict[str, float]]:
        """Time the pace in the worker and teach it to the queue: the work, its seconds by part."""
        counts, parts_s = self.worker.run(engine_pace, (), RunControl(), untaken)
        work = Work(**counts)
        self.queue.calibrate(work, parts_s)
        return work, parts_s

    @property
    def loaded(self):
        """The model less its weights (a ``ModelCard``): name, tokenizer, device, dtype."""
        return self.facts.card

    @property
    def model_id(self) -> str:
        return self.facts.model_id

    @property
    def dtype_name(self) -> str:
        return worker_model.dtype_name_of(self.loaded)

    @property
    def label(self) -> str:
        return worker_model.label_of(self.loaded)

    def dtype_choices(self) -> list[str]:
        return worker_model.dtype_choices(self.loaded.device, self.dtype_name)

    def in_dtype(self, name: str | None) -> PageModel:
        """This model in the dtype ``name``, loaded in the worker on first use."""
        return worker_model.variant_in(self, name)

    def _variant(self, dtype_name: str) -> PageModel:
        facts = self.worker.run(chosen_facts, (self.model_id, dtype_name), RunControl(), untaken)
        return PageModel(facts=facts, **self.page_parts())

    def holds(self, name: str | None) -> bool:
        """Whether ``in_model(name)`` answers at once: this model, or the one chosen last."""
        wanted = (name or "").strip()
        return wanted in ("", self.model_id) or wanted in self.models

    def in_model(self, name: str | None, on_stage: Callable[[str], None] | None = None):
        """The host's model ``name``, loaded in the worker in place of the one chosen before."""
        wanted = (name or "").strip()
        if not self.holds(wanted):
            check_model_allowed(wanted)  # before the worker is asked
            take = _stage_taker(on_stage)
            facts = self.worker.run(chosen_facts, (wanted, None), RunControl(), take)
            self.models.clear()  # as the worker let the one chosen before go
            self.models[wanted] = PageModel(facts=facts, **self.page_parts())
        return self if wanted in ("", self.model_id) else self.models[wanted]

    def page_parts(self) -> dict[str, Any]:
        """The parts every precision and model shares, as keywords for another's."""
        parts = ("worker", "lock", "servers", "queue", "recent", "cpu_split", "models")
        return {name: getattr(self, name) for name in parts}

    def reference_for(self, batch_invariant: bool) -> StoredReferences:
        """The stored references of ``batch_invariant``'s kind, under the worker's keys."""
        if batch_invariant not in self.references:
            identity = self.facts.reference_keys.get(batch_invariant)
            store = reference_store.open_store() if identity is not None else None
            eos = self.facts.card.eos_token_ids
            self.references[batch_invariant] = StoredReferences(store, identity, eos)
        return self.references[batch_invariant]

    def check_batch_invariant(self) -> None:
        if self.facts.batch_invariant_refusal is not None:
            raise ValueError(self.facts.batch_invariant_refusal)

    def check_kv_budget(self, config: EngineConfig, requests: list[Request]) -> None:
        kv_pool_blocks(config, requests, self.facts.card.kv_bytes_per_token)

    @property
    def label_markdown(self) -> str:
        return model_line(self.facts, self.cpu_split)

    def run_label_markdown(self, run_dtype: str | None) -> str:
        """The model line of a run in ``run_dtype`` (None: this model's own precision)."""
        variant = self.variants.get(run_dtype or self.dtype_name, self)
        return model_line(variant.facts, self.cpu_split, run_dtype)


def local_model(held: WorkerModel, **parts) -> PageModel:
    """The page's model of ``held``, whose jobs run on this process's engine thread."""
    return PageModel.connect(ThreadWorker(held), **parts)


def untaken(_entry) -> None:
    """The ``take`` of a job whose progress nobody shows (facts, pace, verdicts)."""


def _stage_taker(on_stage: Callable[[str], None] | None) -> Callable:
    if on_stage is None:
        return untaken
    return lambda entry: entry.note and on_stage(entry.note)


_shared_model: PageModel | None = None  # the one lazily loaded shared model (see house style)


def load_shared_model(
    model: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    calibrate: bool = True,
) -> PageModel:
    """Load the model (``load_model``'s arguments) and make it the shared one.

    Raises:
        ModelLoadError: the model is not on ``CBP_MODEL_ALLOWLIST``, or fails to load.
    """
    check_model_allowed(model)
    # On the engine thread, which runs every run too: torch keeps one OpenMP pool (worker_process)
    held = ENGINE_THREAD.call(worker_model.load_and_warm_up, model, device, dtype)
    shared = local_model(held)
    if calibrate:
        shared.calibrate()
    return use_model(shared)


def chosen_model(name: str | None, on_stage: Callable[[str], None] | None = None) -> PageModel:
    """The shared model's ``in_model(name)``; a load first waits for the run in progress.

    Raises:
        ModelLoadError: ``name`` is not on ``CBP_MODEL_ALLOWLIST``, or fails to load.
    """
    model = get_model()
    if model.holds(name):
        return model.in_model(name)
    check_model_allowed(name)
    tell = on_stage or (lambda _words: None)
    tell("waiting for the run in progress to end")
    with model.lock:
        return model.in_model(name, on_stage)


def use_model(model: PageModel) -> PageModel:
    global _shared_model
    _shared_model = model
    return model


def get_model() -> PageModel:
    """The shared model, loading the default one on first use."""
    return _shared_model if _shared_model is not None else load_shared_model()


def page_servers() -> ServerSet | None:
    """The shared model's servers, without loading a model (None before one is loaded)."""
    return None if _shared_model is None else _shared_model.servers
