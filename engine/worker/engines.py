"""Every engine on one model, by name, from one ``EngineConfig``: the one engine factory, used by
the page, the worker and the bench, so a name means the same engine everywhere."""

from __future__ import annotations

import dataclasses
import warnings

from engine.batching.continuous import ContinuousEngine
from engine.batching.static import StaticEngine
from engine.config import EngineConfig
from engine.model.model_runner import ModelRunner
from engine.peers.transformers_engine import HFContinuousEngine

# The continuous engines by name, each with its KV cache ("continuous": the config's own mode)
KV_MODE_OF = {"continuous": "slots", "continuous_paged": "paged", "continuous_concat": "concat"}
ENGINE_NAMES = ("static", "static_generate", *KV_MODE_OF, "hf_continuous")


def make_engine(
    name: str, runner: ModelRunner, config: EngineConfig, prefix_caching: bool | None = None
):
    """The engine ``name`` (``ENGINE_NAMES``) on ``runner``: static engines take ``config``'s slots,
    continuous ones all of it; ``prefix_caching`` (None: ``config``'s) reaches engines sharing KV.
    Raises ValueError: an unknown name, or options ``EngineConfig`` refuses."""
    sharing = config.prefix_caching if prefix_caching is None else prefix_caching
    invariant = config.batch_invariant
    if name == "static":
        return StaticEngine(runner, EngineConfig(config.num_slots, batch_invariant=invariant))
    if name == "static_generate":  # the same waves on plain model.generate matmuls
        engine = StaticEngine(runner, EngineConfig(config.num_slots), engine_kernels=False)
        engine.name = name
        return engine
    if name in KV_MODE_OF:
        kv_mode = config.kv_mode if name == "continuous" else KV_MODE_OF[name]
        paged = kv_mode == "paged"
        own = dataclasses.replace(config, kv_mode=kv_mode, prefix_caching=paged and sharing)
        engine = ContinuousEngine(runner, own)
        engine.name = name
        return engine
    if name == "hf_continuous":
        hf_config = EngineConfig(config.num_slots, batch_invariant=invariant)
        with warnings.catch_warnings():  # its trace says so; the page and the bench tell people
            warnings.simplefilter("ignore", UserWarning)
            return HFContinuousEngine(runner, hf_config, block_sharing=sharing)
    raise ValueError(f"Unknown engine {name!r}; choose from {', '.join(ENGINE_NAMES)}.")
