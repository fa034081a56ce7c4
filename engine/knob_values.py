"""A knob's value from what a person typed or a widget sent: one parser per kind.

``knob_value`` reads a value of any ``engine.knobs`` kind the way the page, the /run API and the
bench all take it: numbers as numbers or text (Gradio hands an edited field over as either, the
bench as text), blanks as the knob's ``unset``. Each refusal is one ``ValueError`` whose message
names the knob ("Token budget must be a whole number (got 'abc')."), shown as is. A link reads
its parameters with the same ``flag`` (with ``LINK_WORDS``), ``whole_number`` and ``number``,
and words its own refusals.
"""

from __future__ import annotations

import math

from engine.knobs import Knob

FLAG_WORDS = {"true": True, "false": False}  # a checkbox's value as an API client may send it
# ... and in a link, where a person types them
LINK_WORDS = FLAG_WORDS | {"1": True, "on": True, "yes": True}
LINK_WORDS |= {"0": False, "off": False, "no": False}


def knob_value(knob: Knob, value):
    """A knob's value as a run reads it: blank (or 0, for a knob whose 0 means "not set") is
    ``knob.unset``; a flag is true or false, a choice its text (checked by ``EngineConfig``, or
    for the dtype by its model), a number a whole one or a finite one >= 0.

    Raises:
        ValueError: a value that is not of the knob's kind, naming the knob.
    """
    if knob.kind == "flag":
        return flag(value, knob.named)
    text = "" if value is None else str(value).strip()
    if not text or (knob.zero and _is_zero(text)):  # 0, 0.0 (a number field), "0.00"
        return knob.unset
    if knob.kind == "choice":
        return text
    if knob.kind == "whole":
        return whole_number(value, knob.named)
    return number(value, knob.named)


def _is_zero(text: str) -> bool:
    """Whether ``text`` reads as the number 0 in any spelling."""
    try:
        return float(text) == 0
    except ValueError:
        return False


def whole_number(value, what: str) -> int:
    """A slider or number value -> int. Raises ValueError if it is missing or fractional."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{what} must be a whole number (got {value!r}).") from None
    if not number.is_integer():  # nan and inf are not
        raise ValueError(f"{what} must be a whole number (got {value!r}).")
    return int(number)


def flag(value, what: str, words: dict[str, bool] = FLAG_WORDS) -> bool:
    """A checkbox value -> bool: True or False (the page's), None (unticked), 0 or 1, or one of
    ``words`` in any case (an API client's "true" and "false"; a link's ``LINK_WORDS``). Raises
    ValueError for anything else, so that "yes please" is refused, not read as ticked."""
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in words:
        return words[value.strip().lower()]
    raise ValueError(f"{what} must be true or false (got {value!r}).")


def number(value, what: str) -> float:
    """A finite number >= 0 (0: the knob's default, where it has a ``zero``). Raises
    ValueError."""
    try:
        parsed = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{what} must be a number (got {value!r}).") from None
    if not math.isfinite(parsed):
        raise ValueError(f"{what} must be a number (got {value!r}).")
    if parsed < 0:
        raise ValueError(f"{what} must be positive, or 0 for the default (got {value}).")
    return parsed
