"""The wings and their rooms: the core imports no page and no UI library, the bench no page,
nothing under ``engine/`` imports the maintainers' ``tools/`` or their clients, no cycles, and
inside each wing every room imports only the rooms below it, through their faces."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UI_LIBRARIES = ("gradio", "plotly", "spaces")
# The maintainers' tools and the clients only they use: the package needs none of them.
TOOLS_ONLY = ("tools", "gradio_client", "playwright")


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


def _project_sources() -> list[Path]:
    """``app.py``, the package (``engine/``) and the maintainers' tools (``tools/``)."""
    return [ROOT / "app.py", *_sources("engine"), *_sources("tools")]


def _core_sources() -> list[Path]:
    """Every module of the serving core: ``engine/`` less its page and bench wings."""
    wings = (ROOT / "engine" / "page", ROOT / "engine" / "bench")
    return [p for p in _sources("engine") if not any(w in p.parents for w in wings)]


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


def _tool_only(names: set[str]) -> list[str]:
    """The names among ``names`` that are the tools or a client only they use (``TOOLS_ONLY``)."""
    return sorted(n for n in names if n.split(".")[0] in TOOLS_ONLY)


def test_the_package_imports_no_tool_and_no_tool_client():
    """Nothing under ``engine/`` nor ``app.py`` imports ``tools``, ``gradio_client`` or
    ``playwright``, lazily or not: those are the maintainers' tools, not the package's."""
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in [ROOT / "app.py", *_sources("engine")]
        for name in _tool_only(_imports(path))
    ]
    assert _sources("tools"), "tools/ was not found"
    assert not offenders, f"the package reaches into the maintainers' tools: {offenders}"


def test_the_tools_check_finds_a_planted_import(tmp_path):
    """The tools check itself works: lazy imports of a tool and of a tool's client are found,
    look-alike names are not."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import toolsy, gradio\nfrom engine import trace\n"
        "def f():\n    from tools import room_load\n    import playwright.sync_api\n",
        encoding="utf-8",
    )
    assert _tool_only(_imports(planted)) == ["playwright.sync_api", "tools", "tools.room_load"]


def test_import_graph_has_no_cycles():
    """The project's import graph (app.py, engine/ and tools/, lazy imports included) is
    acyclic."""
    graph = _graph()
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


# The rooms of each wing, from the bottom up: a room imports only the rooms before it in its list.
# The core's root modules (config, sequence, sampling_params, token_logits, trace) sit below every
# core room; the page's rooms sit above the whole core.
CORE_ROOMS = [
    "workloads",
    "serving",
    "kernels",
    "model",
    "batching",
    "fidelity",
    "peers",
    "llamacpp",
    "host_servers",
    "host_queue",
    "worker",
]
PAGE_ROOMS = ["figures", "inputs", "run", "views", "handlers", "panels", "host"]
MAX_MODULES_PER_FOLDER = 12


def _rank(module: str) -> tuple[str, int] | None:
    """``(wing, height)`` of a module's room: the core's root is height -1; None outside both."""
    parts = module.split(".")
    if parts[:2] == ["engine", "page"]:
        return ("page", PAGE_ROOMS.index(parts[2])) if len(parts) > 3 else None
    if parts[0] != "engine" or len(parts) < 2 or parts[1] == "bench":
        return None
    if len(parts) == 2:
        return ("core", -1)
    return ("core", CORE_ROOMS.index(parts[1]))


def _upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import that runs from a room to a room above it (or beside it) in the same wing."""
    found = []
    for module, targets in graph.items():
        here = _rank(module)
        for target in targets:
            there = _rank(target)
            same_room = module.split(".")[:-1] == target.split(".")[:-1]
            if here and there and here[0] == there[0] and there[1] >= here[1] and not same_room:
                found.append(f"{module} imports {target}")
    return sorted(found)


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in _project_sources()}
    return {
        name: {m for m in _imports(path) if m in modules and m != name}
        for name, path in modules.items()
    }


def test_rooms_import_only_the_rooms_below_them():
    """In the core and in the page, no import runs up or sideways between rooms."""
    graph = _graph()
    rooms = {".".join(m.split(".")[:-1]) for m in graph if _rank(m) and _rank(m)[1] >= 0}
    assert len(rooms) == len(CORE_ROOMS) + len(PAGE_ROOMS), f"rooms found: {sorted(rooms)}"
    upward = _upward_imports(graph)
    assert not upward, f"imports that run back up between rooms: {upward}"


def test_the_order_check_finds_a_planted_upward_import():
    """The room check itself works: serving importing the model runner is reported."""
    planted = {"engine.serving.scheduler": {"engine.model.model_runner", "engine.trace"}}
    assert _upward_imports(planted) == [
        "engine.serving.scheduler imports engine.model.model_runner"
    ]
    assert _upward_imports({"engine.trace": {"engine.workloads.workload"}}), "root reached up"
    assert not _upward_imports({"engine.page.views.tables": {"engine.page.run.run"}})


def _rooms() -> list[Path]:
    return [p.parent for p in _sources("engine") + _sources("tools") if p.name == "__init__.py"]


def test_no_folder_holds_more_than_a_dozen_modules():
    """Each folder of ``engine/`` and ``tools/`` holds at most 12 modules (its ``__init__`` not
    counted)."""
    crowded = {
        str(room.relative_to(ROOT)): n
        for room in _rooms()
        if (n := len([p for p in room.glob("*.py") if p.name != "__init__.py"]))
        > MAX_MODULES_PER_FOLDER
    }
    assert not crowded, f"folders over {MAX_MODULES_PER_FOLDER} modules: {crowded}"


def test_every_room_says_what_it_holds_and_names_its_face():
    """Each room's ``__init__`` has a docstring naming every module and an ``__all__`` of real
    modules; it imports nothing (so importing one module never loads the room)."""
    problems = []
    for room in _rooms():
        init = room / "__init__.py"
        tree = ast.parse(init.read_text(encoding="utf-8"))
        doc = ast.get_docstring(tree) or ""
        modules = {p.stem for p in room.glob("*.py") if p.name != "__init__.py"}
        modules |= {p.parent.name for p in room.glob("*/__init__.py")}
        face = _dunder_all(tree)
        name = str(room.relative_to(ROOT))
        if room.name not in ("engine", "bench") and face is None:
            problems.append(f"{name}: no __all__")
        if face is not None and set(face) - modules:
            problems.append(f"{name}: __all__ names no such module: {set(face) - modules}")
        unnamed = sorted(m for m in modules if m != "__main__" and f"``{m}``" not in doc)
        if room.name != "bench" and unnamed:
            problems.append(f"{name}: its docstring does not name {unnamed}")
        if any(isinstance(node, ast.Import | ast.ImportFrom) for node in tree.body):
            problems.append(f"{name}: its __init__ imports")
    assert not problems, problems


def _dunder_all(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    return None


def test_outside_a_room_only_its_face_is_imported():
    """A module imported from another room is in its room's ``__all__``."""
    faces = {}
    for room in _rooms():
        face = _dunder_all(ast.parse((room / "__init__.py").read_text(encoding="utf-8")))
        if face is not None:
            faces[_module_name(room / "__init__.py")] = set(face)
    behind = []
    for module, targets in _graph().items():
        for target in targets:
            room, _, leaf = target.rpartition(".")
            if room in faces and not module.startswith(room + ".") and leaf not in faces[room]:
                if target in _graph():  # a module, not a name imported from one
                    behind.append(f"{module} imports {target}, which {room}.__all__ keeps inside")
    assert not behind, behind
