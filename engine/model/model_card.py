"""A loaded model without its weights: its tokenizer, config and the facts a run is sized by.
``ModelCard.of(runner)`` answers what a ``LoadedModel`` does, less ``model``, and pickles."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.model.device import describe_device


@dataclass(frozen=True)
class ModelCard:
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
    num_params: int = 0  # the weights' parameters, counted once where tied
    device_label: str = ""  # e.g. "CPU · float32" (``describe_device``), said where it runs

    @classmethod
    def of(cls, runner) -> ModelCard:
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
            num_params=count_params(loaded),
            device_label=describe_device(torch.device(loaded.device), loaded.dtype),
        )


def model_config(loaded) -> Any:
    model = getattr(loaded, "model", None)
    return model.config if model is not None else loaded.config


def count_params(loaded) -> int:
    model = getattr(loaded, "model", None)
    if model is None:
        return getattr(loaded, "num_params", 0)
    return sum(p.numel() for p in model.parameters())


def identity_words(loaded) -> list[str]:
    """The model line's words beside name and device, e.g. ``["llama", "135 M parameters"]``."""
    model = getattr(loaded, "model", None)
    config = getattr(loaded if model is None else model, "config", None)
    family = getattr(config, "model_type", None)
    words = [family] if family else []
    num_params = count_params(loaded)
    if num_params <= 0:
        return words
    units = ((1e9, " B"), (1e6, " M"), (1e3, " k"), (1, ""))
    scale, unit = next((scale, unit) for scale, unit in units if num_params >= scale)
    return [*words, f"{num_params / scale:.3g}{unit} parameters"]
