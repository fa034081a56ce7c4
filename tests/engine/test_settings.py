"""Settings: every variable declared once in ``engine.settings``, read there and nowhere else, and
``docs/hosting.md``'s table of variables the same as the module's."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from engine import settings

ROOT = Path(__file__).resolve().parents[2]
# Runs inside vLLM's own process and imports nothing of ours (its test: tests/engine/peers/
# test_vllm_record.py), so it reads CBP_VLLM_SCHEDULE_PATH and CBP_VLLM_RECORD_* itself; the table
# declares them.
READS_ITS_OWN = {Path("engine/peers/vllm_scheduler.py")}
ENVIRONMENT_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def _environment_uses(source: str) -> list[str]:
    """Each place ``source`` touches the process environment (``os.environ``, ``os.getenv``,
    ``from os import environ``, ...), as ``line N: text``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ENVIRONMENT_NAMES:
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                found.append(f"line {node.lineno}: os.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            names = {alias.name for alias in node.names} & ENVIRONMENT_NAMES
            found += [f"line {node.lineno}: from os import {name}" for name in sorted(names)]
    return found


def _project_modules() -> list[Path]:
    return [Path("app.py"), *(p.relative_to(ROOT) for p in sorted((ROOT / "engine").rglob("*.py")))]


def test_the_environment_check_finds_a_planted_read():
    """The check itself works: ``os.environ``, ``os.getenv`` and ``from os import environ`` are
    found, other ``os`` calls are not."""
    planted = "import os\nfrom os import environ\nx = os.environ.get('A')\ny = os.getenv('B')\n"
    assert len(_environment_uses(planted)) == 3, _environment_uses(planted)
    assert _environment_uses("import os\nos.replace('a', 'b')\nos.cpu_count()\n") == []


def test_only_the_settings_module_reads_the_environment():
    """No module of ``engine/`` or ``app.py`` but ``engine/settings.py`` reads or writes the
    environment (the recording scheduler, run by vLLM, excepted)."""
    offenders = []
    for path in _project_modules():
        if path in READS_ITS_OWN or path == Path("engine/settings.py"):
            continue
        uses = _environment_uses((ROOT / path).read_text(encoding="utf-8"))
        offenders += [f"{path} {use}" for use in uses]
    assert len(_project_modules()) > 50, "the project's modules were not found"
    assert not offenders, f"modules read the environment outside engine/settings.py: {offenders}"


def test_every_variable_named_in_the_code_is_declared():
    """Every ``CBP_*`` name that a module of ``engine/`` or ``app.py`` spells as a string is
    declared in ``settings.SETTINGS``."""
    declared = {s.name for s in settings.SETTINGS}
    undeclared = set()
    for path in _project_modules():
        for node in ast.walk(ast.parse((ROOT / path).read_text(encoding="utf-8"))):
            text = node.value if isinstance(node, ast.Constant) else None
            if isinstance(text, str) and re.fullmatch(r"CBP_[A-Z0-9_]+", text):
                if text not in declared:
                    undeclared.add(f"{path}: {text}")
    assert not undeclared, f"variables used but not declared in engine/settings.py: {undeclared}"


def test_each_variable_is_declared_once_with_a_meaning():
    """No name appears twice in the table, and each has a kind and a meaning."""
    names = [s.name for s in settings.SETTINGS]
    assert len(names) == len(set(names)), (
        f"declared twice: {sorted(n for n in names if names.count(n) > 1)}"
    )
    blank = [s.name for s in settings.SETTINGS if not s.kind or not s.meaning]
    assert not blank, f"settings without a kind or a meaning: {blank}"


def _docs_table() -> dict[str, str]:
    """``docs/hosting.md``'s "Hosting limits" table: variable name -> its default column, with
    backticks gone and "(none)" read as ""."""
    text = (ROOT / "docs" / "hosting.md").read_text(encoding="utf-8")
    section = text.split("## Hosting limits", 1)[1]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| `") or len(cells) < 3:
            continue
        names = [n.strip().strip("`") for n in cells[0].split(",")]
        defaults = [d.strip().strip("`") for d in cells[1].split(",")]
        if len(defaults) != len(names):  # one default for the row's names, or one each
            defaults = [cells[1].strip("`")] * len(names)
        for name, value in zip(names, defaults, strict=True):
            rows[name] = "" if value == "(none)" else value
    return rows


def test_the_hosting_docs_table_matches_the_settings_table():
    """``docs/hosting.md``'s table names every declared variable and no other, each with the
    module's default."""
    documented = _docs_table()
    declared = {s.name: s.default for s in settings.SETTINGS}
    assert len(documented) > 10, "docs/hosting.md's table of variables was not found"
    missing = sorted(set(declared) - set(documented))
    extra = sorted(set(documented) - set(declared))
    assert not missing, f"declared in engine/settings.py, missing from docs/hosting.md: {missing}"
    assert not extra, f"in docs/hosting.md's table, not declared in engine/settings.py: {extra}"
    differ = {n: (documented[n], declared[n]) for n in declared if documented[n] != declared[n]}
    assert not differ, f"defaults differ (docs, module): {differ}"


def test_a_blank_variable_reads_as_its_default(monkeypatch):
    """Unset or blank gives the declared default; a set value comes back without its spaces."""
    monkeypatch.delenv("CBP_SERVER_NICE", raising=False)
    assert settings.value("CBP_SERVER_NICE") == "10", "unset did not give the default"
    monkeypatch.setenv("CBP_SERVER_NICE", "   ")
    assert settings.value("CBP_SERVER_NICE") == "10", "blank did not give the default"
    monkeypatch.setenv("CBP_SERVER_NICE", " 3 ")
    assert settings.value("CBP_SERVER_NICE") == "3", "the value was not read, or kept its spaces"
    assert settings.value("CBP_SERVER_NICE", {"CBP_SERVER_NICE": "7"}) == "7", "environ ignored"


def test_an_undeclared_variable_is_refused():
    """Reading a name the table does not declare is an error, not a silent empty value."""
    with pytest.raises(KeyError, match="CBP_NOT_A_SETTING"):
        settings.value("CBP_NOT_A_SETTING")


def test_the_typed_readers_refuse_bad_text_with_the_declared_meaning():
    """``number``, ``count`` and ``choice`` read good text and refuse bad text with a message
    that names the variable and its declared meaning or choices."""
    window = "CBP_REPLAY_WINDOW_S"
    assert settings.number(window, {window: "2.5"}) == 2.5, "seconds were not read"
    for text in ("-1", "nan", "inf", "soon"):
        with pytest.raises(ValueError, match=f"{window}='{text}' must be a number of seconds >= 0"):
            settings.number(window, {window: text})
    nice = "CBP_SERVER_NICE"
    assert settings.count(nice, 0, 19, {nice: "0"}) == 0, "0 was not read as a count"
    with pytest.raises(ValueError, match=r"from 0 to 19 \(nice steps"):
        settings.count(nice, 0, 19, {nice: "20"})
    with pytest.raises(ValueError, match="CBP_MAX_ROWS='0' must be a positive integer"):
        settings.count("CBP_MAX_ROWS", environ={"CBP_MAX_ROWS": "0"})
    process = "CBP_ENGINE_PROCESS"
    assert settings.choice(process, environ={process: " ON "}) == "on", "case or spaces mattered"
    with pytest.raises(ValueError, match="CBP_ENGINE_PROCESS='yes': give auto, on or off"):
        settings.choice(process, environ={process: "yes"})
