"""The model a worker holds: the weights with their runner and reference cache, in any precision
(``in_dtype``) or as another model of the host's allowlist (``in_model``). Every job runs on it."""

from __future__ import annotations

import copy
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.batching.continuous import kv_pool_blocks
from engine.config import EngineConfig
from engine.fidelity import reference_store
from engine.fidelity.reference import ReferenceCache, SoloReference
from engine.model.allowlist import check_model_allowed
from engine.model.device import describe_device, parse_dtype
from engine.model.dtype_support import check_dtype_supported
from engine.model.loader import DEFAULT_MODEL, LoadedModel, load_model
from engine.model.memory_account import (
    copies_to_release,
    memory_account,
    memory_bound_bytes,
    release_freed,
)
from engine.model.model_runner import ModelRunner
from engine.sequence import Request
from engine.trace import Trace
from engine.worker.comparison import traces_by_name
from engine.worker.engine_thread import ENGINE_THREAD
from engine.worker.engines import make_engine
from engine.worker.worker_process import ModelSpec
from engine.workloads.workload import parse_table, tokenize_requests

# Timed by ``time_pace`` for the queue's first estimates: a tour run in small, 28 static steps
# (two waves) and about 20 continuous steps on 3 slots, and one prompt long enough (about 80
# tokens; under 480 bytes for the tests' byte-level tokenizer) that its prefill is timed too.
CALIBRATION_TABLE = [
    ["Explain what a KV cache stores.", 16],
    ["Name three colours.", 4],
    ["Why is the sky blue?", 8],
    ["Write one sentence about batching.", 12],
    [
        "A serving engine keeps many requests in flight. Each step it picks the sequences "
        "that run, feeds their new tokens through the model in one batch and appends a token "
        "to each sequence that decodes. A new request's prompt is prefilled first: all of its "
        "tokens go through the model together, which costs more than a decode step, since "
        "every token is a row of every matrix product. Say this in one sentence.",
        4,
    ],
]
REFERENCE = "reference"  # the reference pass's part of the pace (the others: the engines' names)
PREFILL = "prefill"  # the engines' prefill, the part of their time beyond their steps

# A pace: the work timed (``static_steps``, ``continuous_steps``, ``prompt_tokens``,
# ``static_prefill_tokens``, ``references``: counts) and its seconds in each part ("static",
# "continuous", ``PREFILL``, ``REFERENCE``: ``pace_parts``).
Pace = tuple[dict[str, int], dict[str, float]]

log = logging.getLogger(__name__)


@dataclass
class WorkerModel:
    """The loaded model with its runner and reference cache (see the module docstring)."""

    loaded: LoadedModel
    runner: ModelRunner
    reference: ReferenceCache
    # dtype name -> the same model in that dtype; None: convert a copy of this one's weights
    loader: Callable[[str], LoadedModel] | None = field(default=None, repr=False)
    solo_reference: SoloReference | None = field(default=None, repr=False)  # made on first use
    variants: dict[str, Any] = field(default_factory=dict, repr=False, kw_only=True)  # by dtype
    # the allowlist's name of it: "embedded", a folder or a hub id
    model_id: str = field(default=DEFAULT_MODEL, kw_only=True)
    # the other allowlisted model chosen last, by its id, shared by every precision (``in_model``)
    models: dict[str, Any] = field(default_factory=dict, repr=False, kw_only=True)

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, **fields) -> WorkerModel:
        runner = ModelRunner(loaded)
        # kept on disk too (CBP_REFERENCE_CACHE): a setup's reference is computed once per host
        return cls(loaded, runner, ReferenceCache(runner, reference_store.open_store()), **fields)

    @property
    def dtype_name(self) -> str:
        return dtype_name_of(self.loaded)

    @property
    def label(self) -> str:
        return label_of(self.loaded)

    def in_dtype(self, name: str | None) -> WorkerModel:
        """This model in the dtype ``name`` (None, "" or "auto": this one), loaded on first use.
        Raises ValueError before any weight loads: a name not offered here, or a dtype the device
        cannot run."""
        return variant_in(self, name)

    def in_model(self, name: str | None, on_stage: Callable[[str], None] | None = None):
        """The host's model ``name`` (None, "" or this id: this one), loaded on first use in place
        of the one chosen before; ``on_stage(words)`` hears each stage of the load. Raises
        ModelLoadError: ``name`` is not on ``CBP_MODEL_ALLOWLIST``, or fails to load."""
        wanted = (name or "").strip()
        if wanted in ("", self.model_id):
            return self
        check_model_allowed(wanted)
        if wanted not in self.models:
            self.models.clear()  # its weights go before the next one's load
            self.models[wanted] = ENGINE_THREAD.call(self._load_other, wanted, on_stage)
        return self.models[wanted]

    def _load_other(self, name: str, on_stage: Callable[[str], None] | None) -> Any:
        tell = on_stage or (lambda _words: None)
        device = str(self.loaded.device)
        tell(f"reading the weights of {name}")
        loaded = load_model(name, device, None)
        loader = functools.partial(_load_in, name, device)
        other = WorkerModel.from_loaded(loaded, loader=loader, model_id=name, models=self.models)
        tell(f"warming up {name}")
        other.warm_up()
        return other

    def _variant(self, dtype_name: str) -> WorkerModel:
        """This model in ``dtype_name``, loaded (or converted) and warmed up on the engine
        thread."""
        return ENGINE_THREAD.call(self._load_variant, dtype_name)

    def _load_variant(self, dtype_name: str) -> WorkerModel:
        self.make_room(dtype_name, memory_bound_bytes())
        loaded = self.loader(dtype_name) if self.loader else _converted(self.loaded, dtype_name)
        fields = {"model_id": self.model_id, "models": self.models}
        variant = WorkerModel.from_loaded(loaded, loader=self.loader, **fields)
        variant.warm_up()
        return variant

    def make_room(self, dtype_name: str, bound_bytes: int | None) -> list[str]:
        """Before this model loads in ``dtype_name``: release the other precisions' kernel copies
        where it would not fit within ``bound_bytes`` beside them. Returns the precisions released.
        """
        if bound_bytes is None:
            return []
        held = {self.dtype_name: self.runner} | {n: m.runner for n, m in self.variants.items()}
        held.pop(dtype_name, None)  # its own weights are what the estimate counts
        accounts = {n: memory_account(r) for n, r in held.items()}
        size = getattr(torch, dtype_name).itemsize
        params = self.loaded.model.parameters()  # tied weights once
        incoming = sum(p.numel() for p in params) * size * (1 + self.runner.copies_max)
        released = copies_to_release(
            {n: a["weights_bytes"] + a["packed_total_bytes"] for n, a in accounts.items()},
            {n: a["packed_total_bytes"] for n, a in accounts.items()},
            int(incoming),
            bound_bytes,
        )
        for name in released:
            nbytes = held[name].release_copies()
            log.info(
                "Released %s's weight copies (%.0f MB) to load %s", name, nbytes / 1e6, dtype_name
            )
        if released:
            release_freed()
        return released

    def reference_for(self, batch_invariant: bool):
        """The reference runs are compared with: ``model.generate`` (``ReferenceCache``), or in
        batch-invariant mode each request alone in that mode (``SoloReference``)."""
        if not batch_invariant:
            return self.reference
        if self.solo_reference is None:
            self.solo_reference = SoloReference(self.runner, store=self.reference.store)
        return self.solo_reference

    def check_batch_invariant(self) -> None:
        """Raises ValueError: the model is not a Llama-style decoder."""
        self.runner.require_batch_invariant()

    def check_kv_budget(self, config: EngineConfig, requests: list[Request]) -> None:
        """Raises ValueError: a request alone needs more KV blocks than the paged budget holds."""
        kv_pool_blocks(config, requests, self.runner.kv_bytes_per_token())

    def warm_up(self) -> None:
        """Key the reference store (hashes the weights) and run both engines on two tiny requests,
        so one-time costs never reach a timing; then hand freed memory back to the OS."""
        if self.reference.store is not None:
            self.reference.identity  # noqa: B018  (a cached property: computed here, once)
        specs = parse_table([["Warm-up", 2], ["Warm up again", 3]])
        requests = tokenize_requests(
            specs, self.loaded.tokenizer, chat_template=False, max_context=self.loaded.max_context
        )
        config = EngineConfig(num_slots=2)
        for name in ("static", "continuous"):
            make_engine(name, self.runner, config).run(requests)
        release_freed()  # what packing and stacking freed, back to the OS

    def time_pace(self) -> Pace:
        """Time both engines and the reference on ``CALIBRATION_TABLE`` (a few seconds on a small
        CPU); returns a ``Pace``."""
        specs = parse_table(CALIBRATION_TABLE)
        requests = tokenize_requests(
            specs, self.loaded.tokenizer, chat_template=False, max_context=self.loaded.max_context
        )
        config = EngineConfig(num_slots=3)
        static = make_engine("static", self.runner, config).run(requests)
        continuous = make_engine("continuous", self.runner, config).run(requests)
        reference = ReferenceCache(self.runner)  # no store: these outputs are no one's run
        references = reference.missing(requests)
        start_s = time.perf_counter()
        reference.outputs(requests)
        work = {
            "static_steps": len(static.steps),
            "continuous_steps": len(continuous.steps),
            "prompt_tokens": sum(len(r.prompt_token_ids) for r in requests),
            "static_prefill_tokens": static.prefill_split()[0],
            "references": references,
        }
        parts_s = pace_parts(traces_by_name(static, continuous))
        parts_s[REFERENCE] = time.perf_counter() - start_s
        return work, parts_s


def pace_parts(traces: dict[str, Trace]) -> dict[str, float]:
    """A run's seconds per part of the queue's pace: each engine's steps less its prefill, and
    ``PREFILL``, their prefills together (``Trace.prefill_split``)."""
    parts_s = {PREFILL: 0.0}
    for name, trace in traces.items():
        prefill_s = trace.prefill_split()[1]
        parts_s[name] = trace.wall_s - prefill_s
        parts_s[PREFILL] += prefill_s
    return parts_s


def engine_pace(model: WorkerModel, _watch) -> Pace:
    """The pace (``WorkerModel.time_pace``) as a job: timed where the runs run."""
    return model.time_pace()


def dtype_name_of(loaded) -> str:
    """A ``LoadedModel``'s or ``ModelCard``'s dtype, e.g. "float32"."""
    return str(loaded.dtype).removeprefix("torch.")


def label_of(loaded) -> str:
    """The model line, e.g. "Model: SmolLM2-135M-Instruct · runs on CPU · float32"."""
    return f"Model: {loaded.name} · runs on {loaded.device_label}"


def variant_in(model, name: str | None):
    """``model`` (a ``WorkerModel`` or ``PageModel``) in the dtype ``name`` (None, "" or "auto":
    itself), made by ``model._variant`` on first use. Raises ValueError: see ``in_dtype``."""
    own = model.dtype_name
    offered = dtype_choices(model.loaded.device, own)
    wanted = wanted_dtype(name, model.loaded.device, offered, own)
    if wanted != own and wanted not in model.variants:
        model.variants[wanted] = model._variant(wanted)  # room made there
        return model.variants[wanted]
    target = model if wanted == own else model.variants[wanted]
    runner = getattr(target, "runner", None)  # none in the page's view of an engine process
    if model.variants and runner is not None and "engine_kernel" not in runner.__dict__:
        model.make_room(wanted, memory_bound_bytes())  # its released copies come back
    return target


def dtype_choices(device: torch.device, dtype_name: str) -> list[str]:
    """The precisions offered: float32 and bfloat16, plus float16 on CUDA (or when the model was
    loaded in it)."""
    half = device.type == "cuda" or dtype_name == "float16"
    return ["float32", "bfloat16", *(["float16"] if half else [])]


def wanted_dtype(name: str | None, device: torch.device, offered: list[str], own: str) -> str:
    """The dtype ``name`` asks for (None, "" or "auto": ``own``). Raises ValueError: not ``offered``
    here, or a dtype the device cannot run."""
    text = (name or "auto").strip().lower()
    if text in ("auto", own):
        return own
    wanted = str(parse_dtype(text, device)).removeprefix("torch.")
    if wanted == own:
        return own
    if wanted not in offered:
        where = describe_device(device, torch.float32).split(" · ")[0]
        raise ValueError(
            f"{wanted} is offered on CUDA only, and this model runs on {where}: "
            f"choose {' or '.join(offered)}."
        )
    check_dtype_supported(device, getattr(torch, wanted))
    return wanted


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


def load_and_warm_up(model: str | None, device: str | None, dtype: str | None) -> WorkerModel:
    """``load_model(...)`` warmed up on the calling thread; raises ModelLoadError."""
    loaded = load_model(model, device, dtype)
    loader = functools.partial(_load_in, model, str(loaded.device))
    held = WorkerModel.from_loaded(loaded, loader=loader, model_id=(model or DEFAULT_MODEL).strip())
    held.warm_up()
    return held


def _load_in(model: str | None, device: str, dtype_name: str) -> LoadedModel:
    """``model`` loaded on ``device`` in ``dtype_name``: a precision of it (``in_dtype``)."""
    return load_model(model, device, dtype_name)


def load_spec(spec: ModelSpec) -> WorkerModel:
    """The engine process's model: ``load_and_warm_up`` of ``spec``'s model, device and dtype."""
    return load_and_warm_up(spec.model, spec.device, spec.dtype)
