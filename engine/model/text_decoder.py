"""The text-only causal LM inside a vision-language model (Gemma 3 4B and up, Mistral 3, Llava).

On text prompts such a model runs its language model and LM head only, so the engines take those
two parts in the text family's own causal LM class, as vLLM serves these checkpoints' text.
"""

from __future__ import annotations

from typing import Any

import torch


class TextDecoderError(ValueError):
    """The model holds no text decoder that transformers offers as a causal LM; says why."""


def text_decoder(net: Any) -> Any:
    """``net`` itself when it is a text causal LM, else its language model and LM head in the
    text family's causal LM class (no weight copied: the modules are shared).

    Raises:
        TextDecoderError: a multimodal model without a language model and LM head to take.
    """
    text_config = net.config.get_text_config()
    if text_config is net.config:
        return net
    language_model = _language_model(net)
    head = net.get_output_embeddings()
    if language_model is None or head is None:
        raise TextDecoderError(
            f"{type(net).__name__} holds no language model and LM head this app can run alone"
        )
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            causal = AutoModelForCausalLM.from_config(text_config)
    except ValueError as err:
        raise TextDecoderError(
            f"its text decoder ({text_config.model_type!r}) is not a causal LM in transformers"
        ) from err
    causal.model = language_model
    causal.lm_head = head
    causal.generation_config = net.generation_config
    _check_no_meta(causal)
    return causal


def _language_model(net: Any) -> Any:
    """The decoder stack: ``net.model.language_model``, or ``net.language_model`` (older)."""
    inner = getattr(net, "model", None)
    found = getattr(inner, "language_model", None) or getattr(net, "language_model", None)
    return getattr(found, "model", found) if hasattr(found, "lm_head") else found


def _check_no_meta(causal: Any) -> None:
    """Raises TextDecoderError if a part of the causal LM's class was not taken from ``net``."""
    left = [name for name, tensor in causal.state_dict().items() if tensor.is_meta]
    if left:
        raise TextDecoderError(f"its text decoder lacks {', '.join(left[:3])}")
