"""Markdown the page writes around text it did not write: a person's input, a server's message."""

from __future__ import annotations

import re

MAX_MESSAGE_CHARS = 400  # a server's message in a status line; the console has the whole of it


def plain_markdown(text: str) -> str:
    return re.sub(r"([\\`*_\[\]<>#|~])", r"\\\1", text)


def one_line(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """A multi-line message as its first and last lines, cut to ``limit`` characters."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    short = lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}"
    return short if len(short) <= limit else short[: limit - 1] + "…"
