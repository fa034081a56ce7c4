"""The model line under the page's title, details on hover (``<abbr>``), e.g. ``Model:
gemma-3-270m-q4_k_m · runs on CPU · float32 · Gemma 3 · 268 M parameters · sliding window 512 on
15 of 18 layers · fused layers · decode step: C++ · matmul kernels · peak RSS 4.1 GB``.
"""

from __future__ import annotations

import html
from pathlib import Path

from engine.model.model_card import identity_words
from engine.page.run.cpu_split import CpuSplit
from engine.worker.model_facts import ModelFacts

# transformers' model_type -> the family in words, for the families the engines run
FAMILY_NAMES = {
    "llama": "Llama",
    "mistral": "Mistral",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "gemma": "Gemma",
    "gemma2": "Gemma 2",
    "gemma3": "Gemma 3",
    "gemma3_text": "Gemma 3",
    "phi3": "Phi-3",
    "olmo2": "OLMo 2",
    "granite": "Granite",
    "smollm3": "SmolLM3",
}


def model_line(
    facts: ModelFacts, cpu_split: CpuSplit | None = None, run_dtype: str | None = None
) -> str:
    """The line (Markdown with HTML hovers) for ``facts``; ``run_dtype``: the shown run's
    precision when it is not the one ``facts`` were loaded in."""
    card = facts.card
    where = card.device_label
    if run_dtype and run_dtype != facts.dtype_name:
        loaded = f"loaded in {facts.dtype_name} · this run {run_dtype}"
        where = where.replace(facts.dtype_name, loaded)
    words = [f"Model: {_name(card)}", f"runs on {html.escape(where)}"]
    words += [html.escape(word) for word in _identity(card)]
    window = window_words(facts.layer_windows)
    words += [window] if window else []
    words += _step_words(facts)
    words.append(_hover("matmul kernels", facts.kernels))
    if facts.memory:  # "peak RSS 1.9 GB; weights ...": the peak shown
        words.append(_hover(facts.memory.split(";")[0], facts.memory))
    if cpu_split is not None:
        where = cpu_split.describe()
        words.append(_hover(cpu_split.short(), where[:1].upper() + where[1:]))
    return " · ".join(words)


def window_words(layer_windows: tuple[int | None, ...]) -> str:
    """E.g. "sliding window 512 on 15 of 18 layers", "sliding window 4096" (every layer),
    "" (all global)."""
    windowed = [w for w in layer_windows if w is not None]
    if not windowed:
        return ""
    sizes = "/".join(str(w) for w in sorted(set(windowed)))
    if len(windowed) == len(layer_windows):
        return f"sliding window {sizes}"
    return f"sliding window {sizes} on {len(windowed)} of {len(layer_windows)} layers"


def family_words(model_type: str | None) -> str | None:
    """The family in words (``FAMILY_NAMES``), else the model_type as transformers names it."""
    return FAMILY_NAMES.get(model_type, model_type) if model_type else None


def _name(card) -> str:
    """A path's file or folder name (``.gguf`` dropped), its full path and the weights' source
    on hover; any other name (a hub id, the embedded model's) as it is."""
    name, source = str(card.name), card.source
    if not _is_path(name):
        return html.escape(name) if not source or source in name else _hover(name, source)
    short = Path(name).name.removesuffix(".gguf")
    hover = name if not source or source == name else f"{name} (weights: {source})"
    return _hover(short, hover)


def _is_path(name: str) -> bool:
    """Whether ``name`` is a file or folder path rather than a hub id ("org/model")."""
    return "/" in name and (name.startswith(("/", "~", ".")) or Path(name).expanduser().exists())


def _identity(card) -> list[str]:
    """Family in words and parameter count (``identity_words``, the family named)."""
    words = identity_words(card)
    model_type = getattr(card.config, "model_type", None)
    if words and model_type and words[0] == model_type:
        words[0] = family_words(model_type)
    return words


def _step_words(facts: ModelFacts) -> list[str]:
    """Which layers the step runs (the step summary on hover) and where a decode step's layers
    ran: "decode step: C++", or "decode step: Python" with the reason on hover."""
    step = facts.step
    layers = "fused layers" if step.endswith("the fused layers") else "transformers' layers"
    words = [_hover(layers, step)]
    if facts.decode_step == "C++":
        words.append("decode step: C++")
    elif facts.decode_step:
        words.append(_hover("decode step: Python", facts.decode_step))
    return words


def _hover(shown: str, title: str) -> str:
    return f'<abbr title="{html.escape(title, quote=True)}">{html.escape(shown)}</abbr>'
