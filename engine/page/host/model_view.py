"""The engine process's model as the page's process sees it: a tokenizer and facts, no weights.

With an engine process (``engine.page.run.engine_process``) the weights live there alone. The page
still tokenizes requests, checks a KV budget and batch-invariant mode before a run joins the
queue, labels the model and prices a run's reference pass; ``ModelView`` does all of that from
the ``engine.worker.model_facts.ModelFacts`` the engine process answers (its tokenizer and config
travel with them), and reads the reference store itself under the keys those facts give
(``engine.fidelity.stored_references``). Everything else goes to the engine process through
``run``, as ``EngineProcess.run`` jobs: a run's engine work, the facts of another precision
(loaded there on first use), the pace at start (``connect``). It answers what the page asks of
a model (``engine.page.run.shared_model.PageModel``), as a ``SharedModel`` does in-process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.batching.continuous import kv_pool_blocks
from engine.config import EngineConfig
from engine.fidelity import reference_store
from engine.fidelity.stored_references import StoredReferences
from engine.page.run.cpu_split import CpuSplit
from engine.page.run.engine_process import EngineProcess
from engine.page.run.host_servers import PageServers
from engine.page.run.recent_runs import RecentRuns, replay_window_s
from engine.page.run.run_cost import Work
from engine.page.run.run_queue import RunQueue
from engine.page.run.shared_model import dtype_choices, engine_pace, model_line, wanted_dtype
from engine.sequence import Request
from engine.serving.run_control import RunControl
from engine.worker.model_facts import ModelFacts, model_facts


def _unwatched(*_args, **_kwargs) -> None:
    """The ``watch`` of a job nobody watches (facts, pace)."""


@dataclass
class ModelView:
    """The engine process's model in one precision, seen from the page (see the module
    docstring); its other precisions share its lock, queue and recent runs."""

    facts: ModelFacts
    engine: EngineProcess  # where the weights are, and every job goes
    lock: threading.Lock = field(default_factory=threading.Lock)  # held by the one running run
    servers: PageServers | None = None  # the host's servers (app.py --vllm, --endpoint), if any
    variants: dict[str, ModelView] = field(default_factory=dict, repr=False)
    queue: RunQueue = field(default_factory=RunQueue, repr=False)
    recent: RecentRuns = field(default_factory=lambda: RecentRuns(replay_window_s()), repr=False)
    cpu_split: CpuSplit | None = None  # the engines' CPUs and the page's, when split
    references: dict[bool, StoredReferences] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.queue.shown_instead = lambda setup: self.recent.find(setup) is not None

    @classmethod
    def connect(cls, engine: EngineProcess, **fields) -> tuple[ModelView, Work, dict[str, float]]:
        """Wait for ``engine``'s model, then ask it for its facts and its pace (timed where the
        runs run), which the view's queue learns. Returns the view and the pace's work and
        seconds in each part.

        Raises:
            EngineProcessLost: it ended first.
            Exception: its model failed to load (its exception).
        """
        engine.wait_ready()
        view = cls(engine.run(model_facts, (None,), RunControl(), _unwatched), engine, **fields)
        work, parts_s = engine.run(engine_pace, (), RunControl(), _unwatched)
        view.queue.calibrate(work, parts_s)
        return view, work, parts_s

    @property
    def loaded(self):
        """The model as ``LoadedModel``'s readers see it, less its weights (a ``ModelCard``):
        what the host's servers are configured from."""
        return self.facts.card

    @property
    def dtype_name(self) -> str:
        """The model's dtype, e.g. "float32"."""
        return self.facts.dtype_name

    @property
    def tokenizer(self) -> Any:
        """The model's own tokenizer, as the engine process loaded it."""
        return self.facts.card.tokenizer

    @property
    def max_context(self) -> int:
        """The model's context, in tokens."""
        return self.facts.card.max_context

    def dtype_choices(self) -> list[str]:
        """The precisions the page offers (``shared_model.dtype_choices``)."""
        return dtype_choices(self.facts.card.device, self.dtype_name)

    def in_dtype(self, name: str | None) -> ModelView:
        """The engine process's model in the dtype ``name`` (None, "" or "auto": this one),
        loaded there on first use; its facts are asked for once.

        Raises:
            ValueError: a name the page does not offer on this device, or a dtype the device
                cannot run, naming both; checked here, before anything loads.
        """
        device = self.facts.card.device
        wanted = wanted_dtype(name, device, self.dtype_choices(), self.dtype_name)
        if wanted == self.dtype_name:
            return self
        if wanted not in self.variants:
            facts = self.run(model_facts, (wanted,), RunControl(), _unwatched)
            self.variants[wanted] = ModelView(
                facts,
                self.engine,
                lock=self.lock,
                servers=self.servers,
                queue=self.queue,
                recent=self.recent,
                cpu_split=self.cpu_split,
            )
        return self.variants[wanted]

    def reference_for(self, batch_invariant: bool) -> StoredReferences:
        """Which references of ``batch_invariant``'s kind the store holds: the engine process
        computes them, under the keys its facts gave."""
        if batch_invariant not in self.references:
            identity = self.facts.reference_keys.get(batch_invariant)
            store = reference_store.open_store() if identity is not None else None
            eos = self.facts.card.eos_token_ids
            self.references[batch_invariant] = StoredReferences(store, identity, eos)
        return self.references[batch_invariant]

    def check_batch_invariant(self) -> None:
        """Refuse batch-invariant mode for a model it does not support.

        Raises:
            ValueError: the engine process's reason.
        """
        if self.facts.batch_invariant_refusal is not None:
            raise ValueError(self.facts.batch_invariant_refusal)

    def check_kv_budget(self, config: EngineConfig, requests: list[Request]) -> None:
        """Refuse, before any engine starts, a paged KV budget that cannot hold some request.

        Raises:
            ValueError: some request alone needs more KV blocks than the budget holds.
        """
        kv_pool_blocks(config, requests, self.facts.card.kv_bytes_per_token)

    def run(self, fn: Callable, args: tuple, control: RunControl, watch: Callable) -> Any:
        """``fn(model, *args, watch)`` in the engine process (``EngineProcess.run``)."""
        return self.engine.run(fn, args, control, watch)

    @property
    def label(self) -> str:
        """The page's model line, e.g. "Model: SmolLM2-135M-Instruct · runs on CPU · float32"."""
        return f"Model: {self.facts.card.name} · runs on {self.facts.card.device_label}"

    @property
    def label_markdown(self) -> str:
        """The model line as the page shows it (``model_line``), with the engine process's
        kernels and step."""
        return model_line(self.label, self.facts.kernels, self.facts.step, self.cpu_split)
