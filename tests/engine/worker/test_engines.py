"""One engine factory and one order of a run's traces: outside the rooms that define the engines,
only ``engine.worker.engines.make_engine`` builds one, and only ``comparison.traces_by_name``
keys a run's traces by engine name."""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[3] / "engine"
ENGINE_CLASSES = {"StaticEngine", "ContinuousEngine", "HFContinuousEngine"}
# where the engines are defined, the factory, and the reference, whose room lies below ``worker``
MAY_BUILD = {
    "batching",
    "peers/transformers_engine.py",
    "worker/engines.py",
    "fidelity/reference.py",
}


def _modules():
    for path in sorted(ENGINE.rglob("*.py")):
        yield path.relative_to(ENGINE).as_posix(), ast.parse(path.read_text(encoding="utf-8"))


def _called_name(node: ast.Call) -> str | None:
    func = node.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)


def test_only_the_factory_builds_engines():
    """No module outside the engines' rooms and ``worker/engines.py`` calls an engine class."""
    found = [
        f"{name}:{node.lineno}"
        for name, tree in _modules()
        if not any(name == m or name.startswith(m + "/") for m in MAY_BUILD)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and _called_name(node) in ENGINE_CLASSES
    ]
    assert not found, f"engines built outside make_engine: {found}"


def test_only_traces_by_name_keys_traces_by_engine():
    """No dict literal outside ``comparison.traces_by_name`` maps ``"static"`` and
    ``"continuous"`` to variables (a run's traces, keyed by hand)."""
    found = []
    for name, tree in _modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Dict) or name == "worker/comparison.py":
                continue
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if {"static", "continuous"} <= keys and all(
                isinstance(v, ast.Name) for v in node.values
            ):
                found.append(f"{name}:{node.lineno}")
    assert not found, f"traces keyed by hand: {found}"
