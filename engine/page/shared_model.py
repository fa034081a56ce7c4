"""The shared model: one loaded model with its runner and reference cache, for every run.

It is the one module-level mutable object the house style allows: loaded lazily (``get_model``) or
at start (``load_shared_model``), after the ``CBP_MODEL_ALLOWLIST`` check. Its ``lock`` is held by
the run in progress, so runs never overlap on the model. It loads and warms up on the page's engine
thread (``engine.page.engine_thread``), where every run goes too. Tests build their own
``SharedModel``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from engine.allowlist import check_model_allowed
from engine.config import EngineConfig
from engine.continuous import ContinuousEngine
from engine.loader import LoadedModel, load_model
from engine.model_runner import ModelRunner
from engine.page.engine_thread import ENGINE_THREAD
from engine.page.servers import PageServers
from engine.reference import ReferenceCache
from engine.static import StaticEngine
from engine.workload import parse_table, tokenize_requests


@dataclass
class SharedModel:
    """The loaded model with its runner and reference cache, shared by every run of the page."""

    loaded: LoadedModel
    runner: ModelRunner
    reference: ReferenceCache
    lock: threading.Lock = field(default_factory=threading.Lock)  # held by the one running run
    servers: PageServers | None = None  # the host's servers (app.py --vllm, --endpoint), if any

    @classmethod
    def from_loaded(cls, loaded: LoadedModel) -> SharedModel:
        runner = ModelRunner(loaded)
        return cls(loaded, runner, ReferenceCache(runner))

    @property
    def label(self) -> str:
        """The page's model line, e.g. "Model: SmolLM2-135M-Instruct · runs on CPU · float32"."""
        return f"Model: {self.loaded.name} · runs on {self.loaded.device_label}"

    def warm_up(self) -> None:
        """Run both engines once on two tiny requests, so one-time costs never reach a timing."""
        specs = parse_table([["Warm-up", 2], ["Warm up again", 3]])
        requests = tokenize_requests(
            specs, self.loaded.tokenizer, chat_template=False, max_context=self.loaded.max_context
        )
        config = EngineConfig(num_slots=2)
        StaticEngine(self.runner, config).run(requests)
        ContinuousEngine(self.runner, config).run(requests)


_shared_model: SharedModel | None = None  # the one lazily loaded shared model (see house style)


def load_shared_model(
    model: str | None = None, device: str | None = None, dtype: str | None = None
) -> SharedModel:
    """Load the model (``engine.loader.load_model`` arguments) and make it the shared one.

    Raises:
        ModelLoadError: the model is not on ``CBP_MODEL_ALLOWLIST`` (checked first), or fails to
            load (see ``load_model``).
    """
    global _shared_model
    check_model_allowed(model)
    # On the engine thread, which runs every run too: torch keeps one OpenMP pool (engine_thread)
    _shared_model = ENGINE_THREAD.call(_load_and_warm_up, model, device, dtype)
    return _shared_model


def _load_and_warm_up(model: str | None, device: str | None, dtype: str | None) -> SharedModel:
    shared = SharedModel.from_loaded(load_model(model, device, dtype))
    shared.warm_up()
    return shared


def get_model() -> SharedModel:
    """The shared model, loading the default one on first use."""
    return _shared_model if _shared_model is not None else load_shared_model()


def page_servers() -> PageServers | None:
    """The shared model's servers, without loading a model (None before one is loaded)."""
    return None if _shared_model is None else _shared_model.servers
