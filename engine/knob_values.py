"""A knob's value from what a person typed or a widget sent: one parser per kind, shared by the
page, the /run API and the bench. A refusal is one ``ValueError`` naming the knob, shown as is."""

from __future__ import annotations

import math

from engine.knobs import Knob

FLAG_WORDS = {"true": True, "false": False}  # a checkbox's value as an API client may send it
# ... and in a link, where a person types them
LINK_WORDS = FLAG_WORDS | {"1": True, "on": True, "yes": True}
LINK_WORDS |= {"0": False, "off": False, "no": False}


def knob_value(knob: Knob, value):
    """A knob's value as a run reads it (blank, or a ``zero`` knob's 0: ``knob.unset``). Raises
    ValueError naming the knob."""
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
    try:
        return float(text) == 0
    except ValueError:
        return False


def whole_number(value, what: str) -> int:
    """Raises ValueError if it is missing or fractional."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{what} must be a whole number (got {value!r}).") from None
    if not number.is_integer():  # nan and inf are not
        raise ValueError(f"{what} must be a whole number (got {value!r}).")
    return int(number)


def flag(value, what: str, words: dict[str, bool] = FLAG_WORDS) -> bool:
    """True, False, None (unticked), 0, 1 or one of ``words`` in any case; anything else raises
    ValueError, so "yes please" is not read as ticked."""
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
    """A finite number >= 0. Raises ValueError."""
    try:
        parsed = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{what} must be a number (got {value!r}).") from None
    if not math.isfinite(parsed):
        raise ValueError(f"{what} must be a number (got {value!r}).")
    if parsed < 0:
        raise ValueError(f"{what} must be positive, or 0 for the default (got {value}).")
    return parsed
