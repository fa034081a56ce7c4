"""A loaded model without its weights: its tokenizer, config and the facts a run is sized by.

A process that tokenizes requests, sizes a KV budget, labels the model or asks a server to load
the same weights needs none of the weights themselves. ``ModelCard.of(runner)`` takes those parts
of a runner's ``LoadedModel`` (the tokenizer and the config travel by pickle); the card answers
every attribute of a ``LoadedModel`` that such a process reads, less ``model``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.model.device import describe_device


@dataclass(frozen=True)
class ModelCard:
    """The parts of a ``LoadedModel`` that are not its weights."""

    name: str  # display name, e.g. "SmolLM2-135M-Instruct (embedded GGUF)"
    tokenizer: Any  # the loaded model's own tokenizer (pad token and padding side set)
    config: Any  # transformers' config of the model
    device: torch.device
    dtype: torch.dtype
    eos_token_ids: tuple[int, ...]
    max_context: int  # tokens
    load_s: float  # wall time of the weights' load where they are
    source: str | None = None  # the weights' folder or hub id (``LoadedModel.source``)
    kv_bytes_per_token: int = 0  # one token's keys and values across all layers, in ``dtype``

    @classmethod
    def of(cls, runner) -> ModelCard:
        """The card of ``runner``'s model (an ``engine.model.model_runner.ModelRunner``)."""
        loaded = runner.loaded
        return cls(
            name=loaded.name,
            tokenizer=loaded.tokenizer,
            config=loaded.model.config,
            device=torch.device(loaded.device),
            dtype=loaded.dtype,
            eos_token_ids=tuple(loaded.eos_token_ids),
            max_context=loaded.max_context,
            load_s=loaded.load_s,
            source=getattr(loaded, "source", None),
            kv_bytes_per_token=runner.kv_bytes_per_token(),
        )

    @property
    def device_label(self) -> str:
        """Device and dtype for people, as ``LoadedModel.device_label``."""
        return describe_device(self.device, self.dtype)


def model_config(loaded) -> Any:
    """The transformers config of ``loaded``: a ``LoadedModel``'s weights carry it, a
    ``ModelCard`` holds it."""
    model = getattr(loaded, "model", None)
    return model.config if model is not None else loaded.config
