"""What a link says of the engine settings: one short query parameter per setting (``PARAMS``),
only where it differs from the preset's default; the parameters: docs/hosting.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from engine import knob_values
from engine.knobs import KNOBS, Knob
from engine.page.inputs import presets

FLAG_WORDS = knob_values.LINK_WORDS  # a flag's words in a link: 1, 0, on, off, yes, no, ...


@dataclass(frozen=True)
class Precision:
    """The host's dtypes and models: the page's first, and those offered (no models: no picker)."""

    dtype: str = "float32"
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    model: str = "embedded"
    models: tuple[str, ...] = ()


# Each setting a link carries (its knob's ``url``), by its ``RunSettings`` field name, in the order
# a link writes them (``engine.knobs.KNOBS``); the slots are ``page_io``'s, written in every link.
PARAMS = {knob.name: knob for knob in KNOBS if knob.url and knob.name != "num_slots"}


def page_defaults(preset_name: str, precision: Precision) -> dict:
    """Each ``PARAMS`` setting as the page shows it on preset ``preset_name`` when it opens."""
    chat_template = bool(presets.load_presets()[preset_name]["chat_template"])
    own = presets.preset_settings(preset_name) | {"dtype": precision.dtype}
    own |= {"model": precision.model}
    defaults = {field: knob.default for field, knob in PARAMS.items()}
    return defaults | {"chat_template": chat_template} | own


def settings_params(values: Mapping, defaults: Mapping) -> dict[str, str]:
    """The query parameters for ``values`` that differ from ``defaults``, in ``PARAMS`` order."""
    params = {}
    for field, param in PARAMS.items():
        value = values.get(field)
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        text = _write(param, value)
        if text != _write(param, defaults[field]):
            params[param.url] = text
    return params


def link_settings(
    query: Mapping[str, str], defaults: Mapping, precision: Precision
) -> tuple[dict, list[tuple[str, str, str]]]:
    """The settings ``query`` names, by field, and its bad values as ``(parameter, value, why)``."""
    settings, bad = {}, []
    for field, param in PARAMS.items():
        text = query.get(param.url, "").strip()
        if not text:
            continue
        try:
            settings[field] = _read(param, text, precision)
        except ValueError as exc:
            kept = _shown(param, defaults[field])
            bad.append((param.url, text, f"{exc}; the page keeps {kept}"))
    return settings, bad


def _write(param: Knob, value) -> str:
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


def _read(param: Knob, text: str, precision: Precision):
    """The parameter's value from ``text``; ValueError saying what it takes."""
    if param.kind == "flag":
        return _parsed(knob_values.flag, text, "use 1 (on) or 0 (off)", knob_values.LINK_WORDS)
    if param.name == "model":  # a folder's name keeps its case
        if text not in (precision.model, *precision.models):
            offered = ", ".join(precision.models) or precision.model
            raise ValueError(f"this page offers {offered} (the host's CBP_MODEL_ALLOWLIST)")
        return text
    if param.kind == "choice":
        choices = param.choices or precision.dtypes
        if text.lower() not in choices:
            raise ValueError(f"use one of {', '.join(choices)}")
        return text.lower()
    if param.kind == "number":
        number = _parsed(knob_values.number, text, "not a number >= 0")
        return int(number) if number.is_integer() else number
    upper = f" to {param.high}" if param.high else ""
    why = f"not a whole number {'from ' if upper else '>= '}{param.low}{upper}"
    number = _parsed(knob_values.whole_number, text, why)
    if not param.low <= number <= (param.high or math.inf):
        raise ValueError(why)
    return number


def _parsed(parse, text: str, why: str, *args):
    try:
        return parse(text, "", *args)
    except ValueError:
        raise ValueError(why) from None


def _shown(param: Knob, value) -> str:
    """How a warning names the value the page keeps: "it off", "paged", "0 (no limit)"."""
    if param.kind == "flag":
        return "it on" if value else "it off"
    text = _write(param, value)
    return f"{text} ({param.zero})" if param.zero and text == "0" else text
