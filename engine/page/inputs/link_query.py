"""What a link says of the engine settings: one short query parameter per setting.

Every knob of the settings panel that Run reads has a parameter (``PARAMS``), e.g.
``kv=slots&budget=64&policy=vllm&chat=1&check=0&hf=1&x=step&dtype=bfloat16&invariant=1``.
``settings_params`` writes one only where the page differs from its default for the link's preset
(``page_defaults``), so a link to an untouched page stays ``?preset=seed&slots=3``.
``link_settings`` reads them back: each bad value comes back with why and what the page keeps
instead, and the others still apply. The table travels by ``engine.page.inputs.link_table``.

Plain functions, no gradio: ``engine.page.inputs.page_io`` turns these into the page's updates and
warnings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from engine.config import KV_MODES, MAX_BLOCK_SIZE, POLICIES
from engine.page.inputs import presets

FLAG_WORDS = {"1": True, "true": True, "on": True, "yes": True}
FLAG_WORDS |= {"0": False, "false": False, "off": False, "no": False}
# The page's defaults for the settings no preset sets (settings_panel and results_panel show them).
PAGE_DEFAULTS = {
    "check_reference": True,
    "compare_hf": False,
    "batch_invariant": False,
    "x_axis": "time",
}
X_AXES = ("time", "step")
MAX_SLOTS = 16  # the slot slider's maximum, and the most slots a run (or a link) may ask for


@dataclass(frozen=True)
class Precision:
    """The host's precisions: the dtype the page opens with, and the dtypes it offers."""

    dtype: str = "float32"
    dtypes: tuple[str, ...] = ("float32", "bfloat16")


@dataclass(frozen=True)
class LinkParam:
    """One setting's parameter: its ``name`` in the query and its ``kind``: "flag" (1 or 0),
    "choice" (one of ``choices``; none given: the host's dtypes), "whole" (a whole number from
    ``low`` to ``high``) or "number" (a finite number >= 0). ``zero`` says what 0 means."""

    name: str
    kind: str
    choices: tuple[str, ...] = ()
    low: int = 0
    high: int | None = None
    zero: str = ""


# Each setting a link carries, by its ``RunSettings`` field name, in ``LINK_OUTPUTS`` order.
PARAMS = {
    "chat_template": LinkParam("chat", "flag"),
    "prefix_caching": LinkParam("prefix_caching", "flag"),  # the name before the others existed
    "check_reference": LinkParam("check", "flag"),
    "kv_mode": LinkParam("kv", "choice", KV_MODES),
    "token_budget": LinkParam("budget", "whole", zero="no limit"),
    "policy": LinkParam("policy", "choice", POLICIES),
    "compare_hf": LinkParam("hf", "flag"),
    "arrival_rate": LinkParam("rate", "number", zero="the table's arrival_s"),
    "x_axis": LinkParam("x", "choice", X_AXES),
    "kv_budget_mib": LinkParam("kv_mib", "number", zero="room for every slot"),
    "block_size": LinkParam("block", "whole", low=1, high=MAX_BLOCK_SIZE),
    "dtype": LinkParam("dtype", "choice"),
    "batch_invariant": LinkParam("invariant", "flag"),
}


def page_defaults(preset_name: str, precision: Precision) -> dict:
    """Each ``PARAMS`` setting as the page shows it on preset ``preset_name`` when it opens (or the
    preset is chosen): the preset's chat template and engine settings, the host's dtype, and
    ``PAGE_DEFAULTS``."""
    chat_template = bool(presets.load_presets()[preset_name]["chat_template"])
    own = presets.preset_settings(preset_name) | {"dtype": precision.dtype}
    return {"chat_template": chat_template} | PAGE_DEFAULTS | own


def settings_params(values: Mapping, defaults: Mapping) -> dict[str, str]:
    """The query parameters for ``values`` (by ``PARAMS`` field; a blank or absent one is the
    default) that differ from ``defaults`` (``page_defaults``), in ``PARAMS`` order."""
    params = {}
    for field, param in PARAMS.items():
        value = values.get(field)
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        text = _write(param, value)
        if text != _write(param, defaults[field]):
            params[param.name] = text
    return params


def link_settings(
    query: Mapping[str, str], defaults: Mapping, precision: Precision
) -> tuple[dict, list[tuple[str, str, str]]]:
    """The settings ``query`` names, by field, and its bad values as ``(parameter, value, why)``,
    ``why`` ending in what the page keeps instead (``defaults``)."""
    settings, bad = {}, []
    for field, param in PARAMS.items():
        text = query.get(param.name, "").strip()
        if not text:
            continue
        try:
            settings[field] = _read(param, text, precision)
        except ValueError as exc:
            kept = _shown(param, defaults[field])
            bad.append((param.name, text, f"{exc}; the page keeps {kept}"))
    return settings, bad


def _write(param: LinkParam, value) -> str:
    """``value`` as the parameter's text: "1"/"0", the choice, or the number without ".0"."""
    if param.kind == "flag":
        return "1" if value else "0"
    if param.kind == "choice":
        return str(value).strip()
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return str(value).strip()  # not a number: written as is, and named when the link opens
    return str(int(number)) if number.is_integer() else repr(number)


def _read(param: LinkParam, text: str, precision: Precision):
    """The parameter's value from its query ``text``. Raises ValueError saying what it takes."""
    if param.kind == "flag":
        if text.lower() not in FLAG_WORDS:
            raise ValueError("use 1 (on) or 0 (off)")
        return FLAG_WORDS[text.lower()]
    if param.kind == "choice":
        choices = param.choices or precision.dtypes
        if text.lower() not in choices:
            raise ValueError(f"use one of {', '.join(choices)}")
        return text.lower()
    try:
        number = float(text)
    except (ValueError, OverflowError):
        number = math.nan
    if param.kind == "number":
        if not (math.isfinite(number) and number >= 0):
            raise ValueError("not a number >= 0")
        return int(number) if number.is_integer() else number
    if not (number.is_integer() and param.low <= number <= (param.high or math.inf)):
        upper = f" to {param.high}" if param.high else ""
        raise ValueError(f"not a whole number {'from ' if upper else '>= '}{param.low}{upper}")
    return int(number)


def _shown(param: LinkParam, value) -> str:
    """How a warning names the value the page keeps: "it off", "paged", "0 (no limit)"."""
    if param.kind == "flag":
        return "it on" if value else "it off"
    text = _write(param, value)
    return f"{text} ({param.zero})" if param.zero and text == "0" else text
