"""Preset paragraphs name only columns the page's tables really have.

The rule for "a column named in a paragraph": a phrase "the X column" or "the X, Y and Z columns"
(no sentence punctuation, brackets or another "the" in between) names X, Y and Z, unless it goes
on "of the …" or "in the …" something that is not a table (the packed mask's key columns).
Ordinals ("the third column, arrival_s") name a place, not a column, and are skipped. A name
matches a header when both read the same in lower case with hyphens as spaces and the header's
unit (" s", " %") dropped: "the padding-waste column" is "padding waste %".
"""

from __future__ import annotations

import re

import pytest

from engine.page.inputs import presets
from engine.page.views.tables import METRICS_HEADERS, outputs_headers
from engine.workloads.workload import TABLE_COLUMNS

COLUMN_PHRASE = re.compile(
    r"\bthe ((?:(?!\bthe\b)[^.;:()])+?) columns?\b(?: (?:of|in) the ([\w .-]+?)\b(?=[.,;:)]|$))?"
)
ORDINALS = {"first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "last"}
HEADERS = [*METRICS_HEADERS, *outputs_headers(["static", "continuous"]), *TABLE_COLUMNS]


def _key(name: str) -> str:
    return re.sub(r" (s|%)$", "", name.lower().replace("-", " ").strip())


def named_columns(text: str) -> list[str]:
    """The column names ``text`` gives by the module's rule, in order."""
    names = []
    for match in COLUMN_PHRASE.finditer(text):
        where = match.group(2)
        if where is not None and "table" not in where:
            continue  # a figure's columns, not a table's
        parts = re.split(r",\s*(?:and\s+)?|\s+and\s+", match.group(1))
        names += [p.strip() for p in parts if p.strip() and p.strip().lower() not in ORDINALS]
    return names


def test_the_rule_finds_columns_in_the_usual_forms():
    """The rule reads single names, lists and hyphenated names, and skips ordinals and figures."""
    text = (
        "Compare the mean TTFT and p99 TTFT columns of the metrics table. See the steps column; "
        "the third column, arrival_s, is when. The waste shows in the padding-waste, tok/s and "
        "slot-utilisation columns. The pale key columns of the packed mask are cached."
    )
    wanted = ["mean TTFT", "p99 TTFT", "steps", "padding-waste", "tok/s", "slot-utilisation"]
    assert named_columns(text) == wanted, f"read {named_columns(text)}"


@pytest.mark.parametrize("name", list(presets.load_presets()))
def test_every_column_a_preset_names_is_a_real_table_header(name):
    """Each column a preset's paragraph names is a header of the metrics, outputs or request
    table."""
    headers = {_key(h) for h in HEADERS}
    text = presets.load_presets()[name]["description"]
    unknown = [c for c in named_columns(text) if _key(c) not in headers]
    assert not unknown, f"{name!r} names columns no table has: {unknown}"
