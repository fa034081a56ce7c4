"""An edited request table in a link: packed, read back the same, bounded, and checked as typed."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import random
import string
import zlib
from types import SimpleNamespace
from urllib.parse import parse_qs

import gradio as gr
import pytest

from engine.page.inputs import link_table, page_io, presets
from engine.workloads.workload import parse_table

SKIP = gr.skip()
# An edited table as the page sends it: a cap typed as text, blank cells as None, NaN or "",
# arrivals, and per-request sampling settings (the seed column is text).
EDITED = [
    ["The capital of France is", 7, 0, None, None, None, None],
    ["Later, sampled", "5", 1.5, 0.7, 40, 0.9, "9223372036854775807"],
    ["Hot", 3.0, math.nan, 1.2, None, "", "3"],
    [None, None, None, None, None, None, None],  # a blank row: skipped, as in a typed table
    ["Ünïcödé & <b>tags</b>", 4, 0.25, None, None, None, None],
]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _pack(data: bytes) -> str:
    return _b64(zlib.compress(data))


def _opened(params: dict) -> dict:
    updates = page_io.from_link(SimpleNamespace(query_params=params))
    return dict(zip(page_io.LINK_OUTPUTS, updates, strict=True))


def test_an_edited_table_round_trips_through_the_link(recwarn):
    """An edited table (arrivals and sampling settings too) travels as table= instead of a preset
    and opens as the same requests, with no preset and a text saying where they came from."""
    query = page_io.setup_query(None, 2, 0, None, rows=EDITED, token_budget=32)
    params = {k: v[0] for k, v in parse_qs(query[1:]).items()}
    assert set(params) == {"slots", "budget", "table"}, f"the link names {set(params)}"
    assert link_table.BASE64URL.fullmatch(params["table"]), "the table is not URL-safe"
    opened = _opened(params)
    assert parse_table(opened["rows"]) == parse_table(EDITED), "the link's table differs"
    assert all(len(row) == 7 for row in opened["rows"]), "rows not padded to the table's width"
    assert opened["preset"] is None and opened["token_budget"] == 32, opened
    assert opened["preset_text"].startswith(page_io.LINKED_TEXT), opened["preset_text"]
    assert "4 requests, 2 arriving after t = 0, 2 sampled" in opened["preset_text"]
    assert not [str(w.message) for w in recwarn], "a good table warned"


def test_a_presets_table_travels_as_the_preset():
    """A table that is exactly a preset's (edited back, or cells as text) is linked by the
    preset's slug, not packed; one changed cap makes it a table."""
    rows, _, _ = presets.apply_preset(presets.by_slug("arrivals"))
    as_text = [[str(c) if c is not None else "" for c in row] for row in rows]
    query = page_io.setup_query(None, 3, 0, None, rows=as_text)
    assert query == "?preset=arrivals&slots=3", query
    edited = [list(row) for row in rows]
    edited[0][1] += 1
    query = page_io.setup_query(presets.by_slug("arrivals"), 3, 0, None, rows=edited)
    assert "preset=" not in query and "table=" in query, query


def test_a_table_too_long_for_a_link_is_left_out_with_a_warning():
    """Over the length limit, the link still carries slots and settings, and a warning says the
    table is too long for a link and to share it as a workload file."""
    rng = random.Random(0)  # random words do not compress: forty 120-character prompts overflow
    words = ["".join(rng.choices(string.ascii_letters, k=120)) for _ in range(40)]
    rows = [[word, 8] for word in words]
    with pytest.raises(ValueError, match=r"characters packed, over the 4,000 allowed"):
        link_table.encode_table(rows)
    with pytest.warns(UserWarning, match="too long for a link") as warned:
        query = page_io.setup_query(None, 4, 0, None, rows=rows, policy="vllm")
    assert "Download the table" in str(warned[0].message), str(warned[0].message)
    assert query == "?slots=4&policy=vllm", query
    short = [[word[:20], 8] for word in words]  # forty short requests fit
    assert len(link_table.encode_table(short)) <= link_table.MAX_TABLE_CHARS


def _bomb() -> str:
    return _pack(b"[" + b" " * (4 * link_table.MAX_TABLE_JSON_BYTES) + b"]")


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("not*base64!", "not base64url text"),
        ("A" * (link_table.MAX_TABLE_CHARS + 1), "longer than the 4,000 characters"),
        ("AAAA", "not zlib-compressed"),
        (_b64(zlib.compress(b'[["Hi", 4]]')[:-4]), "damaged (cut short"),
        (_b64(zlib.compress(b'[["Hi", 4]]') + b"more"), "with bytes after its end"),
        (_bomb(), "unpacks to over 262,144 bytes"),
        (_pack(b"[" * 100_000), "not JSON"),  # nested too deep to parse: no RecursionError
        (_pack(b"\xff\xfe"), "not JSON"),
        (_pack(b'{"prompt": "Hi"}'), "not a list of at most 256 request rows"),
        (_pack(json.dumps([["x", 1]] * 300).encode()), "not a list of at most 256"),
        (_pack(b"[[]]"), "row 1 is not a list of 1 to 7 cells"),
        (_pack(json.dumps([["Hi", 4, 0, 0, 0, 0, 0, 0]]).encode()), "row 1 is not a list"),
        (_pack(b'[["Hi", 4], ["Yo", {"cap": 3}]]'), "row 2 has a cell that is no text"),
        (_pack(b'[["Hi", true]]'), "row 1 has a cell"),
        (_pack(b'[["Hi", 1e999]]'), "row 1 has a cell"),
        (_pack(b'[["Hi", 1' + b"0" * 5000 + b"]]"), "not JSON"),  # an int too long to read
    ],
)
def test_a_corrupt_or_forged_table_warns_and_changes_nothing_else(value, said):
    """A table= value that does not decode to rows is named in a warning saying why; the table,
    preset and text stay, the link's other parameters still apply, and nothing raises."""
    with pytest.warns(UserWarning) as warned:
        opened = _opened({"table": value, "slots": "4", "x": "step"})
    messages = [str(w.message) for w in warned]
    assert any("table=" in m and said in m for m in messages), f"{said!r} not in {messages}"
    assert all(len(m) < 400 for m in messages), f"a warning quotes too much: {messages}"
    assert (opened["rows"], opened["preset"]) == (SKIP, SKIP), "a bad table changed the table"
    assert opened["num_slots"] == 4 and opened["x_axis"] == "step", opened


def test_a_linked_tables_bad_rows_are_named_as_a_typed_tables():
    """Rows that parse_table refuses are put in the table to be fixed, and a warning names each
    one as Run would (markup in a cell shown as text)."""
    rows = [["", 3], ["ok", 0], ["fine", 2], ["<img src=x>", "<b>9</b>"]]
    query = page_io.setup_query(None, 3, 0, None, rows=rows)
    params = {k: v[0] for k, v in parse_qs(query[1:]).items()}
    with pytest.raises(ValueError) as typed:
        parse_table(rows)
    with pytest.warns(UserWarning, match="rows to fix before Run") as warned:
        opened = _opened(params)
    message = str(warned[0].message)
    for part in ("Row 1: the prompt is blank", "Row 2: max_new_tokens 0 is out of range"):
        assert part in str(typed.value) and part in message, message
    assert "&lt;b&gt;9&lt;/b&gt;" in message and "<b>" not in message, message
    assert [row[:2] for row in opened["rows"]] == [[None, 3], ["ok", 0], ["fine", 2], rows[3]]
    assert opened["preset"] is None and "need fixing" in opened["preset_text"], opened


def test_a_link_before_any_run_carries_no_step():
    """Before the first Run (the page shows its recorded run) "Copy link" writes no step; after
    a run of the page's own it writes the slider's step."""
    from engine.page.handlers import recording

    recorded = recording.load_recording()
    before = page_io.setup_query(None, 3, 6, recorded, rows=EDITED)
    assert "step=" not in before, f"a link before any run carries a step: {before}"
    after = page_io.setup_query(
        None, 3, 6, dataclasses.replace(recorded, recorded=None), rows=EDITED
    )
    assert "step=6" in after, f"a link after a run lost its step: {after}"


def test_a_links_step_passes_on_until_a_run_spends_it():
    """On the recorded run of a page opened at ``step=3`` (no run yet), "Copy link" writes
    step=3, the link's, whatever the slider reads; after a run, the slider's step (issue 51,
    item 8)."""
    from engine.page.handlers import recording

    recorded = recording.load_recording()
    kept = page_io.setup_query("Article's six requests", 3, 6, recorded, link_step=3)
    assert "step=3" in kept, f"the link's step was lost: {kept}"
    ran = dataclasses.replace(recorded, recorded=None)
    after = page_io.setup_query("Article's six requests", 3, 5, ran, link_step=None)
    assert "step=5" in after, f"the slider's step after a run: {after}"
