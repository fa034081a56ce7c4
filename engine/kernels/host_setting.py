"""Host settings read from the environment: a variable that names one of a few choices.

The host (not the page's user) picks kernels and layers with variables such as
``CBP_ENGINE_KERNEL`` and ``CBP_FUSED_LAYERS``; an unknown value is refused with the choices
spelled out, so a typo in a Space's settings is an error, not a silent default.
"""

from __future__ import annotations

from engine import settings


def read_choice(name: str, choices: dict[str, str]) -> str:
    """The value of the environment variable ``name`` (declared in ``engine.settings``),
    lower-cased; unset or empty gives its default (choice -> what it does, for the message).

    Raises:
        ValueError: a value not in ``choices``, naming the variable and every choice.
    """
    choice = settings.value(name).lower()
    if choice not in choices:
        spelled = " or ".join(f"{key!r} ({what})" for key, what in choices.items())
        raise ValueError(f"{name}={choice!r}: use {spelled}")
    return choice
