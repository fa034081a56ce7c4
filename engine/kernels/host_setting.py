"""Host settings that name one of a few choices: a typo in a Space's settings is an error, not a
silent default. The reader is ``engine.settings.choice``."""

from __future__ import annotations

from engine.settings import choice as read_choice

__all__ = ["read_choice"]
