"""Links and workload files in the page: setup links, the link's step, upload and table download."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs

import gradio as gr
import pytest

from engine.page.inputs import page_io, presets
from engine.workloads.workload import parse_table
from engine.workloads.workload_files import load_workload_file

SKIP = gr.skip()
NOTHING = (SKIP,) * len(page_io.LINK_OUTPUTS)  # a link that sets nothing


def _link(**params):
    return SimpleNamespace(query_params={k: str(v) for k, v in params.items()})


def test_setup_query_reproduces_preset_slots_and_step():
    """The query names the preset by slug, the slots, and the step only once a run exists."""
    name = presets.by_slug("long-tail")
    query = page_io.setup_query(name, 4, 12, previous=object())
    assert query.startswith("?"), query
    assert parse_qs(query[1:]) == {"preset": ["long-tail"], "slots": ["4"], "step": ["12"]}
    before_run = parse_qs(page_io.setup_query(name, 4.0, 12, previous=None)[1:])
    assert "step" not in before_run and before_run["slots"] == ["4"], before_run
    uploaded = parse_qs(page_io.setup_query(None, 2, 0, previous=None)[1:])
    assert uploaded == {"slots": ["2"]}, f"an uploaded table still names a preset: {uploaded}"


def test_link_query_parameters_preset_the_page(recwarn):
    """?preset=SLUG&slots=N gives the preset's rows and the slot count, without a warning."""
    link = page_io.from_link(_link(preset="one-long-many-short", slots=5))
    name, rows, chat_template, text, slots, prefix_caching = link[:6]
    assert link[6:] == NOTHING[6:], f"a link without settings set some: {link[6:]}"
    assert name == "One long, many short" and slots == 5 and prefix_caching == SKIP
    assert rows == presets.apply_preset(name)[0] and chat_template is False and text
    assert page_io.from_link(_link()) == NOTHING, "a plain link changed the page"
    long_tail = page_io.from_link(_link(preset="long-tail"))
    assert long_tail[4] == presets.preset_slots(long_tail[0]) == 4, "the preset's slots not set"
    assert page_io.from_link(None) == NOTHING, "no request changed the page"
    assert not [str(w.message) for w in recwarn], "a good link warned"


def test_link_preset_names_match_in_any_letter_case(recwarn):
    """?preset=SEED (or Long-Tail) opens that preset without a warning; the page's own links keep
    the canonical lower-case slug."""
    for given, slug in (
        ("SEED", "seed"),
        ("Long-Tail", "long-tail"),
        ("article's SIX requests", "seed"),
    ):
        updates = page_io.from_link(_link(preset=given))
        assert updates[0] == presets.by_slug(slug), f"preset={given!r} opened {updates[0]!r}"
        query = page_io.setup_query(updates[0], updates[4], 0, previous=None)
        assert parse_qs(query[1:])["preset"] == [slug], f"the link names {query}"
    assert not [str(w.message) for w in recwarn], "a preset in other letter case warned"
    assert presets.by_slug("") is None and presets.by_slug("SEEDS") is None


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ({"preset": "nope"}, "preset='nope' is ignored: no such preset; showing “Article's six"),
        ({"preset": "nope"}, "presets: seed, one-long-many-short"),
        ({"slots": "99"}, "slots='99' is ignored: not a whole number from 1 to 16; using 3 slots"),
        ({"slots": "0"}, "slots='0' is ignored"),
        ({"slots": "2.5"}, "slots='2.5' is ignored"),
        ({"preset": "<img src=x>"}, "preset='&lt;img src=x&gt;' is ignored"),
        ({"slots": "9" * 100}, f"slots='{'9' * 40}…' is ignored"),
    ],
)
def test_bad_link_values_are_named_with_what_is_used_instead(params, said):
    """A bad preset or slot count is skipped, and a warning names it (as plain text, clipped) and
    what the page uses instead; a good value beside it still applies."""
    good = {"slots": "4"} if "preset" in params else {"preset": "seed"}
    with pytest.warns(UserWarning) as warned:
        updates = page_io.from_link(_link(**params, **good))
    messages = [str(w.message) for w in warned]
    assert any(said in m for m in messages), f"{said!r} not in {messages}"
    if "preset" in params:  # the default preset's text stays, with the link's 4 slots noted
        assert updates[:3] == (SKIP,) * 3 and updates[4] == 4, updates
        assert "This link set 4 slots" in updates[3], updates[3]
    else:  # the preset's own slot count applies instead
        assert updates[0] == presets.by_slug("seed") and updates[4] == 3, updates


def test_a_links_slots_never_contradict_the_presets_text():
    """A link whose slots differ from those its preset's explanation speaks of ("at 3 slots")
    adds a line saying so under the explanation; at the preset's own slots, or without slots,
    the explanation stands alone."""
    seed = presets.by_slug("seed")
    description = presets.apply_preset(seed)[2]
    assert "at 3 slots" in description, "the seed preset's text no longer names its slots"
    text, slots = page_io.from_link(_link(preset="seed", slots=2))[3:5]
    assert slots == 2 and text.startswith(description), text
    assert "This link set 2 slots" in text and "speaks of 3" in text, text
    assert page_io.from_link(_link(preset="seed", slots=3))[3] == description
    assert page_io.from_link(_link(preset="seed"))[3] == description
    text = page_io.from_link(_link(slots=1))[3]  # no preset: the page shows the default one's
    assert text.startswith(presets.apply_preset(presets.DEFAULT_PRESET)[2]), text
    assert "This link set 1 slot;" in text, text
    assert page_io.from_link(_link(slots=3))[3] == SKIP, "the default preset's own slots noted"


def test_link_step_is_kept_for_after_a_run():
    """step=N is read from the link and kept (``link_step_event`` applies it after a run); a bad
    step is named in a warning, with the link's others."""
    assert page_io.link_step(_link(step=12)) == 12 and page_io.link_step(_link()) is None
    assert page_io.link_step(_link(step="-3")) is None
    with pytest.warns(UserWarning, match="step='-3' is ignored: not a whole number >= 0"):
        page_io.from_link(_link(step="-3"))


def test_upload_fills_the_table_and_clears_the_preset(tmp_path):
    """An uploaded CSV becomes table rows (with arrival_s); the preset dropdown is cleared."""
    path = tmp_path / "w.csv"
    path.write_text("prompt,max_new_tokens,arrival_s\nHi there,4,\nLater,3,1.5\n", encoding="utf-8")
    rows, preset, text, note = page_io.upload_workload(str(path))
    greedy = [None] * 4  # the sampling columns, empty
    assert rows == [["Hi there", 4, 0.0, *greedy], ["Later", 3, 1.5, *greedy]], rows
    assert preset is None and "2 requests" in text and "1 arriving after" in text, text
    assert note == "", f"an upload that loaded left a warning in sight: {note!r}"


def test_bad_upload_warns_naming_the_line_and_changes_nothing(tmp_path):
    """A malformed upload warns, naming every bad line of the file at once, and leaves table and
    preset as is."""
    path = tmp_path / "bad.jsonl"
    lines = '{"prompt": "a", "max_new_tokens": 2}\n{"prompt": "b"}\n'
    lines += '{"prompt": "c", "max_new_tokens": 0}\n'
    path.write_text(lines, encoding="utf-8")
    with pytest.warns(UserWarning, match="bad.jsonl line 2.* bad.jsonl line 3: max_new_tokens 0"):
        updates = page_io.upload_workload(str(path))
    assert updates[:3] == (SKIP, SKIP, SKIP), f"a bad upload changed the page: {updates}"
    assert "bad.jsonl line 3: max_new_tokens 0" in updates[3], f"not kept in sight: {updates[3]}"


def test_csv_prompt_over_131072_characters_warns_and_keeps_the_table(tmp_path):
    """A CSV prompt longer than csv's own field limit warns with the prompt limit's message (no
    csv.Error escapes to lay error badges on the page) and changes nothing."""
    path = tmp_path / "huge.csv"
    path.write_text(f"prompt,max_new_tokens\n{'x' * 300_000},4\n", encoding="utf-8")
    wanted = "huge.csv line 2: the prompt has 300000 characters, over the limit of 20000."
    with pytest.warns(UserWarning, match=wanted):
        updates = page_io.upload_workload(str(path))
    assert updates[:3] == (SKIP, SKIP, SKIP), f"a refused upload changed the page: {updates}"


def test_table_download_loads_back_as_the_same_workload():
    """The table's CSV and JSONL downloads load back to what the table itself parses to."""
    rows, _, _ = presets.apply_preset(presets.by_slug("arrivals"))
    paths = page_io.table_files(rows)
    assert [Path(p).name for p in paths] == ["workload.csv", "workload.jsonl"]
    for path in paths:
        assert load_workload_file(path) == parse_table(rows), f"{path} differs from the table"
    with pytest.raises(ValueError, match="Row 1"):
        page_io.table_files([["", 3, 0]])
    with pytest.warns(UserWarning, match="Row 1: the prompt is blank"):
        shown, note = page_io.show_table_files([["", 3, 0]])
    assert shown == SKIP, f"a bad table changed the file box: {shown}"
    assert "Row 1: the prompt is blank" in note, f"the refusal is not kept in sight: {note}"
    shown, note = page_io.show_table_files(rows)
    assert shown.visible is True and note == "", "the file box is not shown, or a note stays"


def test_arrivals_preset_arrives_over_time():
    """The "arrivals over time" preset has staggered arrivals and an explanation."""
    name = presets.by_slug("arrivals")
    rows, _, text = presets.apply_preset(name)
    arrivals = [spec.arrival_s for spec in parse_table(rows)]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0 and arrivals[-1] > 1, arrivals
    assert "arrival_s" in text and len(text) > 200, "the preset lacks its explanation"


def test_a_warning_quoting_a_cell_shows_its_markup_as_text():
    """Gradio renders a toast's message as HTML: a cell's markup quoted in a warning (a table
    shared through a link can carry any) arrives escaped, as text, never as a tag."""
    cell = "<img src=x onerror=alert(1)>"
    with pytest.warns(UserWarning) as warned:
        shown, note = page_io.show_table_files([["hi", cell, 0]])
    message = str(warned[0].message)
    assert shown == SKIP and "<img" not in note, note
    assert "&lt;img src=x onerror=alert(1)>" in message and "<img" not in message, message


def test_a_links_warnings_stay_in_sight_in_one_note(recwarn):
    """Every ignored link parameter is named in the note under the table (the toasts go in
    seconds), as text; a link without a bad parameter leaves the note as it is."""
    link = page_io.from_link(_link(preset="nope", slots=99, step="x", kv="<b>odd</b>"))
    note = dict(zip(page_io.LINK_OUTPUTS, link, strict=True))["input_warning"]
    for said in ("preset='nope' is ignored", "slots='99' is ignored", "step='x' is ignored"):
        assert said in note, f"{said!r} not kept in sight: {note}"
    assert "kv='&lt;b&gt;odd&lt;/b&gt;' is ignored" in note and "<b>" not in note, note
    assert page_io.from_link(_link(slots=4))[-1] == SKIP, "a good link changed the note"


def test_the_warning_note_is_cleared_by_the_next_action():
    """The note stays until the next action: a table edit, a preset chosen or Run (cleared in the
    browser) or the next upload or table download (which set it, or clear it)."""
    import app

    demo = app.build_demo("Model: test")
    by_id = {b._id: b for b in demo.blocks.values()}
    (note,) = [b for b in by_id.values() if getattr(b, "elem_id", "") == "warning_html"]
    setting = [fn for fn in demo.fns.values() if note in fn.outputs]
    clears = [fn for fn in setting if fn.fn is None and fn.js]
    cleared_by = {(by_id[i].elem_id, event) for fn in clears for i, event in fn.targets}
    for action in [("requests_table", "input"), ("preset_dropdown", "input")]:
        assert action in cleared_by, f"{action} leaves the warning: {cleared_by}"
    assert ("run_button", "click") in cleared_by, cleared_by
    handlers = {fn.fn for fn in setting}
    assert {page_io.upload_workload, page_io.show_table_files, page_io.from_link} <= handlers


def test_a_link_that_turned_prefix_caching_on_does_not_ask_to_turn_it_on():
    """Under the shared-system-prompt preset's "turn on prefix caching", a link that already
    turned it on says so; without it in the link, no such line."""
    text = page_io.LINK_OUTPUTS.index("preset_text")
    on = page_io.from_link(_link(preset="shared-system-prompt", prefix_caching=1))[text]
    assert "This link turned prefix caching on already" in on, on
    off = page_io.from_link(_link(preset="shared-system-prompt"))[text]
    assert "turned prefix caching on" not in off, off
