"""Host settings read from the environment: a variable that names one of a few choices; a typo in a
Space's settings is an error, not a silent default."""

from __future__ import annotations

from engine import settings


def read_choice(name: str, choices: dict[str, str]) -> str:
    """``name`` (declared in ``engine.settings``) lower-cased; unset gives its default. Raises
    ValueError naming the variable and every choice."""
    choice = settings.value(name).lower()
    if choice not in choices:
        spelled = " or ".join(f"{key!r} ({what})" for key, what in choices.items())
        raise ValueError(f"{name}={choice!r}: use {spelled}")
    return choice
