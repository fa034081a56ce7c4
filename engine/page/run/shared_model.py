"""The shared model: one loaded model with its runner and reference cache, for every run.

It is the one module-level mutable object the house style allows: loaded lazily (``get_model``) or
at start (``load_shared_model``), after the ``CBP_MODEL_ALLOWLIST`` check. Its ``lock`` is held by
the run in progress, so runs never overlap on the model. It loads and warms up on the page's engine
thread (``engine.page.run.engine_thread``), where every run goes too. Tests build their own
``SharedModel``.

Precision is a page setting: ``in_dtype`` gives the same model in another dtype (float32 or
bfloat16, plus float16 on CUDA), loaded (on the engine thread) the first time it is asked for and
kept beside the first (SmolLM2-135M: about 270 MB in bfloat16), sharing its lock. A dtype the
device cannot run is refused before any weight loads, naming both (``engine.model.dtype_support``).
"""

from __future__ import annotations

import copy
import html
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.batching.continuous import ContinuousEngine
from engine.batching.static import StaticEngine
from engine.config import EngineConfig
from engine.fidelity import reference_store
from engine.fidelity.reference import ReferenceCache, SoloReference
from engine.fidelity.reference_key import Identity
from engine.model.allowlist import check_model_allowed
from engine.model.device import describe_device, parse_dtype
from engine.model.dtype_support import check_dtype_supported
from engine.model.loader import LoadedModel, load_model
from engine.model.model_runner import ModelRunner
from engine.page.run.cpu_split import CpuSplit
from engine.page.run.engine_thread import ENGINE_THREAD
from engine.page.run.host_servers import PageServers
from engine.page.run.recent_runs import RecentRuns, replay_window_s
from engine.page.run.run_cost import REFERENCE, Work
from engine.page.run.run_queue import RunQueue
from engine.workloads.workload import parse_table, tokenize_requests

# Timed at start for the queue's first estimates (``SharedModel.calibrate_pace``): a tour run in
# small, 28 static steps (two waves) and about 20 continuous steps on 3 slots.
CALIBRATION_TABLE = [
    ["Explain what a KV cache stores.", 16],
    ["Name three colours.", 4],
    ["Why is the sky blue?", 8],
    ["Write one sentence about batching.", 12],
]


@dataclass
class SharedModel:
    """The loaded model with its runner and reference cache, shared by every run of the page."""

    loaded: LoadedModel
    runner: ModelRunner
    reference: ReferenceCache
    lock: threading.Lock = field(default_factory=threading.Lock)  # held by the one running run
    servers: PageServers | None = None  # the host's servers (app.py --vllm, --endpoint), if any
    # dtype name -> the same model in that dtype; None: convert a copy of this one's weights
    loader: Callable[[str], LoadedModel] | None = field(default=None, repr=False)
    variants: dict[str, SharedModel] = field(default_factory=dict, repr=False)
    solo_reference: SoloReference | None = field(default=None, repr=False)  # made on first use
    # the turns runs take on the model, and the recent runs by setup: one for every dtype's copy
    queue: RunQueue = field(default_factory=RunQueue, repr=False)
    recent: RecentRuns = field(default_factory=lambda: RecentRuns(replay_window_s()), repr=False)
    # the engine process (engine.page.run.engine_process) the runs' engines go to; None: the
    # engine thread, in this process (tests, ZeroGPU, CBP_ENGINE_PROCESS=off)
    engine_process: Any = field(default=None, repr=False)
    # the engine process's matmul kernels (``engine_facts``), which the page's label names; None:
    # this process's runner's
    engine_kernels: str | None = None
    engine_step: str | None = None  # the engine process's ``ModelRunner.step_summary()``
    cpu_split: CpuSplit | None = None  # the engines' CPUs and the page's, when split

    def __post_init__(self) -> None:
        self.queue.shown_instead = lambda setup: self.recent.find(setup) is not None

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, **fields) -> SharedModel:
        runner = ModelRunner(loaded)
        # kept on disk too (CBP_REFERENCE_CACHE): a setup's reference is computed once per host
        return cls(loaded, runner, ReferenceCache(runner, reference_store.open_store()), **fields)

    @property
    def dtype_name(self) -> str:
        """The loaded dtype, e.g. "float32"."""
        return str(self.loaded.dtype).removeprefix("torch.")

    def dtype_choices(self) -> list[str]:
        """The precisions the page offers: float32 and bfloat16, plus float16 on CUDA (or when
        the model was loaded in it)."""
        half = self.loaded.device.type == "cuda" or self.dtype_name == "float16"
        return ["float32", "bfloat16", *(["float16"] if half else [])]

    def in_dtype(self, name: str | None) -> SharedModel:
        """This model in the dtype ``name`` (None, "" or "auto": this one), loaded on first use.

        Raises:
            ValueError: a name the page does not offer on this device, or a dtype the device
                cannot run, naming both; checked before any weight loads (nothing is lost).
        """
        text = (name or "auto").strip().lower()
        if text in ("auto", self.dtype_name):
            return self
        wanted = str(parse_dtype(text, self.loaded.device)).removeprefix("torch.")
        if wanted == self.dtype_name:
            return self
        device = self.loaded.device_label.split(" · ")[0]
        if wanted not in self.dtype_choices():
            raise ValueError(
                f"{wanted} is offered on CUDA only, and this model runs on {device}: "
                f"choose {' or '.join(self.dtype_choices())}."
            )
        if wanted not in self.variants:
            check_dtype_supported(self.loaded.device, getattr(torch, wanted))
            self.variants[wanted] = ENGINE_THREAD.call(self._variant, wanted)
        return self.variants[wanted]

    def _variant(self, dtype_name: str) -> SharedModel:
        """This model in ``dtype_name``, loaded (or converted) and warmed up; same lock."""
        loaded = self.loader(dtype_name) if self.loader else _converted(self.loaded, dtype_name)
        variant = SharedModel.from_loaded(
            loaded,
            lock=self.lock,
            loader=self.loader,
            servers=self.servers,
            queue=self.queue,
            recent=self.recent,
            engine_process=self.engine_process,
        )
        if self.engine_process is not None:  # its runs run there: no kernels, no compile here
            variant.runner.keep_eager("the engines run in the engine process")
        variant.warm_up(engines=self.engine_process is None)
        return variant

    def reference_for(self, batch_invariant: bool):
        """The reference runs are compared with: ``model.generate`` (``ReferenceCache``), or in
        batch-invariant mode each request alone in that mode (``SoloReference``)."""
        if not batch_invariant:
            return self.reference
        if self.solo_reference is None:
            self.solo_reference = SoloReference(self.runner, store=self.reference.store)
        return self.solo_reference

    @property
    def label(self) -> str:
        """The page's model line, e.g. "Model: SmolLM2-135M-Instruct · runs on CPU · float32"."""
        return f"Model: {self.loaded.name} · runs on {self.loaded.device_label}"

    @property
    def label_markdown(self) -> str:
        """The model line as the page shows it: ``label``, then "matmul kernels" whose hover text
        says which kernel runs at which row counts and how it was chosen (measured on this host,
        read from an earlier start, or named by ``CBP_ENGINE_KERNEL``), the engine process's when
        the engines run there; and, when the CPUs are split, how many the engines have."""
        summary = html.escape(self.engine_kernels or self.runner.kernel_summary(), quote=True)
        line = f'{self.label} · <abbr title="{summary}">matmul kernels</abbr>'
        step = self.engine_step or self.runner.step_summary()
        words = "eager step" if step.startswith("step: eager") else "compiled step"
        line += f' · <abbr title="{html.escape(step, quote=True)}">{words}</abbr>'
        if self.cpu_split is not None:
            where = self.cpu_split.describe()
            where = html.escape(where[:1].upper() + where[1:], quote=True)
            line += f' · <abbr title="{where}">{self.cpu_split.short()}</abbr>'
        return line

    def warm_up(self, engines: bool = True) -> None:
        """Key the reference store (hashing the weights, about a second for SmolLM2-135M), so the
        queue's estimates know from the first Run which references are stored already
        (``engine.page.run.run_cost``); and with ``engines``, run both engines once on two tiny
        requests, so one-time costs never reach a timing. Without (the page's copy, when an
        engine process runs the runs) no engine runs here, so this process never makes the
        engines' kernels: their weight copies are several times the model's size."""
        if self.reference.store is not None:
            self.reference.identity  # noqa: B018  (a cached property: computed here, once)
        if not engines:
            return
        specs = parse_table([["Warm-up", 2], ["Warm up again", 3]])
        requests = tokenize_requests(
            specs, self.loaded.tokenizer, chat_template=False, max_context=self.loaded.max_context
        )
        config = EngineConfig(num_slots=2)
        StaticEngine(self.runner, config).run(requests)
        ContinuousEngine(self.runner, config).run(requests)

    def calibrate_pace(self) -> tuple[Work, dict[str, float]]:
        """Time the pace (``time_pace``) and teach it to the run queue (``RunQueue.calibrate``),
        so a room's first estimates come from a quiet, warm page.
        Returns the work timed and its seconds in each part (the engines' and ``"reference"``)."""
        work, parts_s = self.time_pace()
        self.queue.calibrate(work, parts_s)
        return work, parts_s

    def time_pace(self) -> tuple[Work, dict[str, float]]:
        """Time both engines and the reference (``model.generate``, one request at a time, kept
        in memory only) on ``CALIBRATION_TABLE`` (3 slots): a few seconds at start with the
        embedded model on a small CPU. Its step counts are the traces'.
        Returns the work timed and its seconds in each part (the engines' and ``"reference"``)."""
        specs = parse_table(CALIBRATION_TABLE)
        requests = tokenize_requests(
            specs, self.loaded.tokenizer, chat_template=False, max_context=self.loaded.max_context
        )
        config = EngineConfig(num_slots=3)
        static = StaticEngine(self.runner, config).run(requests)
        continuous = ContinuousEngine(self.runner, config).run(requests)
        reference = ReferenceCache(self.runner)  # no store: these outputs are no one's run
        references = reference.missing(requests)
        start_s = time.perf_counter()
        reference.outputs(requests)
        work = Work(
            static_steps=len(static.steps),
            continuous_steps=len(continuous.steps),
            prompt_tokens=sum(len(r.prompt_token_ids) for r in requests),
            references=references,
        )
        parts_s = {"static": static.wall_s, "continuous": continuous.wall_s}
        parts_s[REFERENCE] = time.perf_counter() - start_s
        return work, parts_s


@dataclass(frozen=True)
class EngineFacts:
    """What the page learns from the engine process once it is ready (``engine_facts``)."""

    kernels: str  # its matmul kernels (``ModelRunner.kernel_summary``), chosen for its own threads
    work: Work  # the pace table's work (``SharedModel.time_pace``), timed where the runs run
    parts_s: dict[str, float]  # ... its seconds in each part
    # its references' keys in the store, by batch-invariant mode (none without a store)
    reference_keys: dict[bool, Identity] = field(default_factory=dict)
    step: str | None = None  # how its continuous step runs (``ModelRunner.step_summary``)

    def teach(self, page: SharedModel) -> None:
        """Give the page's model what it needs of these: the kernels for its model line, the pace
        for its queue, and the store's keys of the references the engine process computes, so
        its estimates count a stored reference as stored (``ReferenceCache.key_as``)."""
        page.engine_kernels = self.kernels
        page.engine_step = self.step
        page.queue.calibrate(self.work, self.parts_s)
        for batch_invariant, identity in self.reference_keys.items():
            page.reference_for(batch_invariant).key_as(identity)


def engine_facts(model: SharedModel, watch=None) -> EngineFacts:
    """What the page learns from the engine process once it is ready, as one of its jobs
    (``EngineProcess.run``): its matmul kernels (``ModelRunner.kernel_summary``: it chose them
    for its own CPUs and threads), its pace (``SharedModel.time_pace``), timed where the runs
    will run, and its references' keys in the store (their thread count is the process's)."""
    work, parts_s = model.time_pace()
    keys = {}
    if model.reference.store is not None:
        keys = {flag: model.reference_for(flag).identity for flag in (False, True)}
    summary = model.runner.kernel_summary()
    return EngineFacts(summary, work, parts_s, keys, model.runner.step_summary())


def _converted(loaded: LoadedModel, dtype_name: str) -> LoadedModel:
    """A copy of ``loaded`` with its weights cast to ``dtype_name`` (models without a loader)."""
    start_s = time.perf_counter()
    dtype = getattr(torch, dtype_name)
    converted = copy.copy(loaded)
    converted.model = copy.deepcopy(loaded.model).to(dtype=dtype).eval()
    converted.dtype = dtype
    if "device_label" in vars(converted):  # a plain namespace (tests): the label is a value
        converted.device_label = describe_device(loaded.device, dtype)
    converted.load_s = time.perf_counter() - start_s
    return converted


_shared_model: SharedModel | None = None  # the one lazily loaded shared model (see house style)


def load_shared_model(
    model: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    calibrate: bool = True,
    runs_engines: bool = True,
) -> SharedModel:
    """Load the model (``engine.model.loader.load_model`` arguments) and make it the shared one;
    ``calibrate``: time the queue's pace here (False when an engine process will time it);
    ``runs_engines``: False when an engine process runs the runs, so this copy never runs an
    engine: no compiled step, no kernel weight copies.

    Raises:
        ModelLoadError: the model is not on ``CBP_MODEL_ALLOWLIST`` (checked first), or fails to
            load (see ``load_model``).
    """
    global _shared_model
    check_model_allowed(model)
    # On the engine thread, which runs every run too: torch keeps one OpenMP pool (engine_thread)
    _shared_model = ENGINE_THREAD.call(
        load_and_warm_up, model, device, dtype, calibrate, runs_engines
    )
    return _shared_model


def load_and_warm_up(
    model: str | None,
    device: str | None,
    dtype: str | None,
    calibrate: bool = True,
    runs_engines: bool = True,
) -> SharedModel:
    """``load_model(model, device, dtype)`` as a warmed-up ``SharedModel``, on the calling thread
    (the engine thread, or the engine process's main thread); ``calibrate``: time its pace for the
    queue's estimates too (``SharedModel.calibrate_pace``; the engine process has no queue);
    ``runs_engines``: False keeps its step eager and runs no engine at warm-up (which would
    compile the step and make the kernels' weight copies)."""
    loaded = load_model(model, device, dtype)
    shared = SharedModel.from_loaded(
        loaded, loader=lambda name: load_model(model, str(loaded.device), name)
    )
    if not runs_engines:
        shared.runner.keep_eager("the engines run in the engine process")
    shared.warm_up(engines=runs_engines)
    if calibrate:
        shared.calibrate_pace()
    return shared


def get_model() -> SharedModel:
    """The shared model, loading the default one on first use."""
    return _shared_model if _shared_model is not None else load_shared_model()


def page_servers() -> PageServers | None:
    """The shared model's servers, without loading a model (None before one is loaded)."""
    return None if _shared_model is None else _shared_model.servers
