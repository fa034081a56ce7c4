"""The three wings: the core imports no page and no UI library, the bench no page, and no cycles."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UI_LIBRARIES = ("gradio", "plotly", "spaces")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (lazy imports inside functions count too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _core_sources() -> list[Path]:
    return [p for p in _sources("engine") if p.parent == ROOT / "engine"]


def test_core_imports_no_page_and_no_ui_library():
    """No module of ``engine/`` itself imports gradio, plotly, spaces or ``engine.page``."""
    offenders = []
    for path in _core_sources():
        for name in _imports(path):
            if name.split(".")[0] in UI_LIBRARIES or name.startswith("engine.page"):
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert len(_core_sources()) > 20, "the core's modules were not found"
    assert not offenders, f"the serving core reaches up into the page: {offenders}"


def test_bench_imports_no_page_and_no_ui_library():
    """``engine/bench/`` depends on the core only: no page, no gradio, no plotly."""
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _sources("engine/bench")
        for name in _imports(path)
        if name.split(".")[0] in UI_LIBRARIES or name.startswith("engine.page")
    ]
    assert _sources("engine/bench"), "engine/bench/ was not found"
    assert not offenders, f"the bench imports the page: {offenders}"


def test_import_graph_has_no_cycles():
    """The project's import graph (app.py and engine/, lazy imports included) is acyclic."""
    paths = [ROOT / "app.py", *_sources("engine")]
    modules = {_module_name(p): p for p in paths}
    graph = {
        name: {m for m in _imports(path) if m in modules and m != name}
        for name, path in modules.items()
    }
    cycle = _find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle in ``graph`` as a list of names (first == last), or None (depth-first search)."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for succ in sorted(graph[node]):
            if state.get(succ) == "open":
                return stack[stack.index(succ) :] + [succ]
            if succ not in state and (found := visit(succ)):
                return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_cycle_finder_finds_a_planted_cycle():
    """The cycle check itself works: a planted a -> b -> a cycle is reported."""
    assert _find_cycle({"a": {"b"}, "b": {"a"}, "c": set()}) == ["a", "b", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None
