"""What a process without the model's weights learns of the model, asked of the one that holds it
(the reference keys hold the holder's CPU thread count, so only the holder can give them)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.fidelity.reference_key import Identity
from engine.model.memory_account import memory_account, memory_summary, peak_rss_bytes
from engine.model.model_card import ModelCard
from engine.worker.comparison import ComparisonModel


@dataclass(frozen=True)
class ModelFacts:
    card: ModelCard  # tokenizer, config, device, dtype, EOS ids, context, KV bytes per token
    kernels: str  # the engines' matmul kernels (``ModelRunner.kernel_summary``)
    step: str  # how the continuous step runs (``ModelRunner.step_summary``)
    batch_invariant_refusal: str | None  # why batch-invariant mode cannot run; None: it can
    # the store's keys of the references, by batch-invariant mode (none without a store)
    reference_keys: dict[bool, Identity] = field(default_factory=dict)
    model_id: str = "embedded"  # the allowlist's name of the model (``WorkerModel.model_id``)
    memory: str = ""  # peak RSS and the bytes by part (``memory_account.memory_summary``)
    layer_windows: tuple[int | None, ...] = ()  # each layer's sliding window in keys; None: global
    # where the fused layers ran a decode step's layers: "C++" or "Python: <why>" (the bench
    # JSON's ``layers_step``); None where they were not made
    decode_step: str | None = None

    @property
    def dtype_name(self) -> str:
        """E.g. "float32"."""
        return str(self.card.dtype).removeprefix("torch.")


def model_facts(model: ComparisonModel, dtype: str | None, _watch: Callable) -> ModelFacts:
    """``facts_of`` the model in ``dtype`` (None: its own), loaded there on first use."""
    return facts_of(model.in_dtype(dtype))


def chosen_facts(
    model: ComparisonModel, name: str | None, dtype: str | None, watch: Callable
) -> ModelFacts:
    """``facts_of`` the host's model ``name`` in ``dtype``, each load stage told to ``watch``;
    ModelLoadError when ``name`` is not on the allowlist or fails to load."""
    stage = functools.partial(_told_stage, watch)
    return facts_of(model.in_model(name, stage).in_dtype(dtype))


LOAD = "load"  # the progress entry of a model's load (``chosen_facts``)


def _told_stage(watch: Callable, words: str) -> None:
    watch(LOAD, None, waiting=True, note=words)


def facts_of(model: ComparisonModel) -> ModelFacts:
    """What a process without ``model``'s weights needs of it."""
    runner = model.runner
    try:
        runner.require_batch_invariant()
        refusal = None
    except ValueError as exc:
        refusal = str(exc)
    modes = (False,) if refusal else (False, True)
    keys = {}
    if model.reference_for(False).store is not None:
        keys = {flag: model.reference_for(flag).identity for flag in modes}
    return ModelFacts(
        card=ModelCard.of(runner),
        kernels=runner.kernel_summary(),
        step=runner.step_summary(),
        batch_invariant_refusal=refusal,
        reference_keys=keys,
        model_id=getattr(model, "model_id", "embedded"),
        memory=memory_summary(memory_account(runner), peak_rss_bytes()),
        layer_windows=runner.layer_windows(),
        decode_step=runner.layers_step,
    )
