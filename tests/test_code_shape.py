"""The code's shape: no history in its text (dates belong in docs/measurements.md and commit
messages), in ``engine/`` and ``app.py``."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")  # YYYY-MM-DD


def _sources() -> list[Path]:
    return [ROOT / "app.py", *sorted((ROOT / "engine").rglob("*.py"))]


def _dated_lines(text: str) -> list[int]:
    """The line numbers of ``text`` that hold a YYYY-MM-DD date."""
    return [n for n, line in enumerate(text.splitlines(), 1) if DATE.search(line)]


def test_the_date_check_finds_a_planted_date():
    """The check itself works: a dated note is found, a version or a plain number is not."""
    assert _dated_lines('"""Fixed (2026-12-03)."""\nx = 1\n') == [1], "a date was missed"
    assert _dated_lines("VERSION = '0.1.2'\nN = 2026\nPORT = 20-30\n") == [], "not a date"


def test_no_dates_in_the_code():
    """No module of ``engine/`` nor ``app.py`` carries a date: a docstring says what is true now."""
    dated = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in _sources()
        for n in _dated_lines(path.read_text(encoding="utf-8"))
    ]
    assert len(_sources()) > 50, "the project's modules were not found"
    assert not dated, f"dates in the code (move the note to docs/measurements.md): {dated}"
