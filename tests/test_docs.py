"""The docs against the tree: the module map names every module and nothing else, the README
stays a front door, and every link and path the docs name leads to something that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MODULE_MAP = ROOT / "docs" / "architecture.md"
README_MAX_LINES = 300

# A repository path in backquotes: `app.py`, or one under engine/, tools/, tests/ or assets/.
PATH_IN_QUOTES = re.compile(r"`((?:engine|tools|tests|assets)/[\w./-]*|app\.py)`")
# A Markdown link or image: [text](target) or ![alt](target); the text may wrap lines.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.MULTILINE)


def _pages() -> list[Path]:
    """README.md and every Markdown file under docs/."""
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def _prose(path: Path) -> str:
    """The file's text without its fenced code blocks (commands and JSON are not links)."""
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def _modules() -> set[str]:
    """Every module of the project, relative to the repo: app.py, engine/**/*.py and
    tools/**/*.py less packages' __init__.py and __main__.py."""
    modules = {
        path.relative_to(ROOT).as_posix()
        for folder in ("engine", "tools")
        for path in (ROOT / folder).rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    }
    return modules | {"app.py"}


def _named_paths(text: str) -> set[str]:
    return set(PATH_IN_QUOTES.findall(text))


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _broken_links(text: str, page: Path) -> list[str]:
    """Each relative link in ``text`` (on ``page``) whose file, or heading, does not exist."""
    broken = []
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        path = (page.parent / file_part).resolve() if file_part else page
        if ROOT not in path.parents or not path.is_file():
            broken.append(f"{target} (no such file)")
        elif anchor and path.suffix == ".md":
            headings = {_anchor(h) for h in HEADING.findall(_prose(path))}
            if anchor not in headings:
                broken.append(f"{target} (no such heading in {path.name})")
    return broken


def test_module_map_names_every_module():
    """docs/architecture.md names every module under engine/ and tools/, and app.py, by its
    path."""
    named = _named_paths(MODULE_MAP.read_text(encoding="utf-8"))
    missing = sorted(_modules() - named)
    assert not missing, f"docs/architecture.md does not name these modules: {missing}"


def test_module_map_names_no_missing_path():
    """Every path docs/architecture.md names exists in the tree (no module moved away)."""
    named = _named_paths(MODULE_MAP.read_text(encoding="utf-8"))
    assert len(named) > len(_modules()) // 2, "no paths found in docs/architecture.md"
    gone = sorted(p for p in named if not (ROOT / p).exists())
    assert not gone, f"docs/architecture.md names paths that do not exist: {gone}"


def test_readme_is_a_front_door():
    """README.md has at most 300 lines; reference material lives in docs/."""
    num_lines = len(README.read_text(encoding="utf-8").splitlines())
    assert num_lines <= README_MAX_LINES, (
        f"README.md has {num_lines} lines, over {README_MAX_LINES}: move sections to docs/"
    )


def test_relative_links_lead_to_files_and_headings():
    """Every relative link in README.md and docs/*.md names an existing file (and heading)."""
    broken = {
        page.relative_to(ROOT).as_posix(): links
        for page in _pages()
        if (links := _broken_links(page.read_text(encoding="utf-8"), page))
    }
    assert not broken, f"links to missing files or headings: {broken}"


def test_paths_named_in_the_docs_exist():
    """Every engine/, tools/, tests/ or assets/ path the README and docs/*.md name in backquotes
    exists."""
    gone = {
        page.relative_to(ROOT).as_posix(): missing
        for page in _pages()
        if (missing := sorted(p for p in _named_paths(_prose(page)) if not (ROOT / p).exists()))
    }
    assert not gone, f"the docs name paths that do not exist: {gone}"


def test_the_checks_find_planted_faults():
    """The checks themselves work: a missing file and heading are reported, quoted paths found."""
    text = "[a](docs/nowhere.md) [b](README.md#no-such) [c](https://x.org) [d](#two-commands)"
    assert _broken_links(text, README) == [
        "docs/nowhere.md (no such file)",
        "README.md#no-such (no such heading in README.md)",
    ]
    assert _named_paths("`engine/serving/gone.py` and `app.py`, not `engine.trace`") == {
        "engine/serving/gone.py",
        "app.py",
    }
    assert _anchor("Servers as engines: vLLM and OpenAI-compatible endpoints") == (
        "servers-as-engines-vllm-and-openai-compatible-endpoints"
    )
