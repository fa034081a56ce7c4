"""The code's shape: no history in its text (dates belong in docs/measurements.md and commit
messages) and no function over 60 lines, in ``engine/``, ``app.py`` and ``tools/``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")  # YYYY-MM-DD
# incident notes: a profiler session or a tracker's issue number, cited as history
INCIDENT = re.compile(r"\bpy-spy\b|\bissue \d+", re.IGNORECASE)
MAX_FUNCTION_LINES = 60


def _sources() -> list[Path]:
    folders = ("engine", "tools")
    return [ROOT / "app.py", *sorted(p for f in folders for p in (ROOT / f).rglob("*.py"))]


def _dated_lines(text: str) -> list[int]:
    """The line numbers of ``text`` that hold a YYYY-MM-DD date or an incident note."""
    lines = enumerate(text.splitlines(), 1)
    return [n for n, line in lines if DATE.search(line) or INCIDENT.search(line)]


def _long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int, int]]:
    """``(name, first line, lines)`` of each function in ``source`` longer than ``limit`` lines,
    decorators left out, its docstring counted."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                found.append((node.name, node.lineno, lines))
    return found


def test_the_date_check_finds_a_planted_date():
    """The check itself works: a dated note is found, a version or a plain number is not."""
    assert _dated_lines('"""Fixed (2026-12-03)."""\nx = 1\n') == [1], "a date was missed"
    assert _dated_lines("# slow (py-spy)\n# as in issue 26's room\n") == [1, 2], "a note was missed"
    assert _dated_lines("VERSION = '0.1.2'\nN = 2026\nPORT = 20-30\n") == [], "not a date"


def test_no_dates_in_the_code():
    """No module of ``engine/``, ``app.py`` or ``tools/`` carries a date or an incident note: a
    docstring says what is true now."""
    dated = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in _sources()
        for n in _dated_lines(path.read_text(encoding="utf-8"))
    ]
    assert len(_sources()) > 50, "the project's modules were not found"
    assert not dated, f"dates or incidents in the code (move them to docs/measurements.md): {dated}"


def test_the_length_check_finds_a_planted_long_function():
    """The check itself works: a 61-line function is listed, a 60-line one is not."""
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    assert _long_functions(f"def long():\n{body}") == [("long", 1, 61)], "a long one was missed"
    assert _long_functions(f"def short():\n{body[: body.rindex('    x59')]}") == []


def test_no_function_over_sixty_lines():
    """No function or method in ``engine/``, ``app.py`` or ``tools/`` is over 60 lines."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line} {name} ({lines} lines)"
        for path in _sources()
        for name, line, lines in _long_functions(path.read_text(encoding="utf-8"))
    ]
    assert not offenders, f"functions over {MAX_FUNCTION_LINES} lines: {offenders}"
