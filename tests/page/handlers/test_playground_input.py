"""The Run handler on bad input: the status line says why, and nothing on the page is lost.

Every input error (the table, the slot count, each engine knob, arrivals past the wait limit) is
treated alike: ``run_event`` yields one update that changes the status line only, shows the same
message as a warning toast (outside Gradio, a ``UserWarning``), and returns without an error, so no
error badge covers the status line and the earlier results stay on the page.
"""

from __future__ import annotations

import gradio as gr
import pytest
from page_runs import run_and_render

from engine.page.handlers import playground, recording
from engine.page.run import shared_model
from engine.page.run.run_options import RunOptions
from engine.page.views import run_status, run_view
from engine.page.views.progress_view import plain_markdown
from engine.peers.server_process import free_port

try:
    from gradio_client import Client
except ImportError:  # gradio_client ships with gradio, but keep the module importable without it
    Client = None

ROWS = [["hello world", 5], ["abc", 12]]
STATUS_INDEX = 7  # the status line in /run's returned tuple (run_state is not returned)
FAR_OFF_RATE = "0.000001"  # requests/s: the second request arrives days after Run


@pytest.fixture(scope="module")
def previous(shared) -> run_view.RunState:
    """An earlier run's state, as the page keeps it."""
    options = RunOptions(check_reference=False)
    return run_and_render(ROWS, 2, options, shared).state


@pytest.fixture(autouse=True)
def no_model_calls(shared, monkeypatch):
    """The handler gets the tiny shared model, and any model call fails the test."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the model was called for a refused run")

    monkeypatch.setattr(shared_model, "_shared_model", shared)
    monkeypatch.setattr(shared.worker.model.runner, "forward_packed", forbidden)
    monkeypatch.setattr(shared.worker.model.runner, "generate", forbidden)


def _sampled(**settings) -> list[list]:
    """``ROWS`` with a third row, sampled with ``settings`` (the table's sampling columns)."""
    cells = [settings.get(name) for name in ("temperature", "top_k", "top_p", "seed")]
    return [*ROWS, ["sampled", 4, 0, *cells]]


def _run_args(rows=ROWS, slots=2, budget=0, rate=0, kv_mib="0", block="16", previous=None):
    """``run_event``'s arguments, in app.py's order, with the knobs that tests vary."""
    knobs = (False, False, "paged", budget, "decode_first", False, rate, "time")
    return (rows, slots, *knobs, previous, kv_mib, block)


def _refused(*run_args, **named) -> str:
    """Run the handler on bad input; check it changed the status line (and the note under Run,
    which says the same) only and warned with the same message; return the status line."""
    with pytest.warns(UserWarning) as warned:
        updates = list(playground.run_event(*run_args, **named))
    assert len(updates) == 1, f"{len(updates)} updates for a refused run"
    shown = dict(zip(run_view.RUN_OUTPUTS, updates[0], strict=True))
    status = shown.pop("status_markdown")
    note = shown.pop("run_note_markdown")
    assert note.startswith("**Not run:**") and status.startswith(note), (note, status)
    changed = [name for name, value in shown.items() if value != gr.skip()]
    assert not changed, f"a refused run changed {changed}"
    toasts = [str(w.message) for w in warned if plain_markdown(str(w.message)) in status]
    assert toasts, f"no warning carries the status line's message: {status!r}"
    return status


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (_run_args(rows=[["", 5]]), "Row 1: the prompt is blank"),
        (_run_args(rows=[["hi", 0]]), "max_new_tokens 0 is out of range"),
        (_run_args(slots=0), "at least 1"),
        (_run_args(slots=1.5), "Slots must be a whole number"),
        (_run_args(slots=3, budget=2), "at least the slot count"),
        (_run_args(budget="abc"), "Token budget must be a whole number"),
        (_run_args(rate=-1), "Arrival rate (requests/s) must be positive"),
        (_run_args(rate=FAR_OFF_RATE), "a run waits for arrivals at most 300 s"),
        (_run_args(kv_mib="-1"), "KV budget (MiB) must be positive"),
        (_run_args(kv_mib="abc"), "KV budget (MiB) must be a number"),
        (_run_args(block="2.5"), "Block size must be a whole number"),
        (_run_args(block="0"), "Block size must be a whole number"),
        (_run_args(block="100000"), "from 1 to 256"),
        (_run_args(rows=_sampled(temperature="-0.5")), "Row 3: temperature -0.5 is below 0"),
        (_run_args(rows=_sampled(top_p="0")), "Row 3: top_p 0 is outside (0, 1]"),
        (_run_args(rows=_sampled(top_p=1.5)), "Row 3: top_p 1.5 is outside (0, 1]"),
        (_run_args(rows=_sampled(top_k="-1")), "Row 3: top_k -1 is below 0"),
        (_run_args(rows=_sampled(top_k="2.5")), "Row 3: top_k 2.5 is not a whole number"),
        (_run_args(rows=_sampled(seed="1.5")), "Row 3: seed 1.5 is not a whole number"),
        (_run_args(rows=_sampled(seed="abc")), "Row 3: seed 'abc' is not a whole number"),
        (_run_args(rows=_sampled(seed="-1")), "Row 3: seed -1 is out of range; use 0 to"),
        (_run_args(rows=_sampled(seed=str(2**63))), f"Row 3: seed {2**63} is out of range"),
    ],
)
def test_bad_input_says_why_in_the_status_line_and_keeps_the_earlier_results(
    args, message, previous
):
    """Bad table, slots or knob: "Not run" and the message lead the status line, the previous
    run's status follows, and no other output (results, state, downloads) changes."""
    status = _refused(*args[:10], previous, *args[11:])
    assert status.startswith("**Not run:** "), status
    assert plain_markdown(message) in status, f"{message!r} not in {status!r}"
    earlier = f" Showing the previous run: {run_status.status_line(previous)}"
    assert status.endswith(earlier), f"the previous run's status is not kept: {status!r}"


def test_a_fresh_sessions_refusal_names_the_recorded_run_it_shows():
    """A fresh session keeps the recorded run (the first view): a refusal there says it shows
    the recorded run, not a previous run of that person's."""
    opening = recording.opening_result()
    if opening is None:
        pytest.skip("no recording ships")
    status = _refused(*_run_args(block="100000", previous=opening.state))
    shown = f" Showing the recorded run: {run_status.status_line(opening.state)}"
    assert status.endswith(shown), f"the recorded run is not named: {status!r}"


def test_every_bad_cell_of_every_bad_row_is_named_in_one_refusal():
    """Several bad rows: one refusal names every bad cell of each, with its column, value and
    allowed range (the first bad cell hides none, a bad seed none either), and changes nothing
    else, so every row typed stays in the table (issue 51, item 9)."""
    rows = [
        ["hi", 3, 0, -1, -4, 2, None],
        ["fine", 4],
        ["seeded", 3, 0, -1, -4, 2, "x"],
        ["b", 0, -1, "hot", 2.5, 0, -5],
    ]
    status = _refused(*_run_args(rows=rows))
    named = {
        "Row 1": ("temperature -1 is below 0", "top_k -4 is below 0", "top_p 2 is outside (0, 1]"),
        "Row 3": (
            "temperature -1 is below 0",
            "top_k -4 is below 0",
            "top_p 2 is outside (0, 1]",
            "seed 'x' is not a whole number",
        ),
        "Row 4": (
            "max_new_tokens 0 is out of range; use 1 to",
            "arrival_s",
            "temperature 'hot' is not a number",
            "top_k 2.5 is not a whole number",
            "top_p 0 is outside (0, 1]",
            "seed -5 is out of range; use 0 to",
        ),
    }
    starts = {row: status.index(row) for row in named}
    ends = sorted(starts.values())[1:] + [len(status)]
    for row, at in starts.items():
        part = status[at : next(end for end in ends if end > at)]
        for fragment in named[row]:
            assert plain_markdown(fragment) in part, f"{row}: {fragment!r} not in {part!r}"
    assert "Row 2" not in status, status


def test_bad_input_before_any_run_says_why_only():
    """With no earlier run the status line is the reason alone, and nothing else changes."""
    status = _refused(*_run_args(block="0"))
    assert status == "**Not run:** " + plain_markdown(
        "Block size must be a whole number of tokens from 1 to 256 (got 0)."
    ), status


def test_arrivals_past_the_time_limit_are_refused_like_other_bad_input(monkeypatch):
    """An arrival after CBP_RUN_TIME_LIMIT_S is refused in the status line, naming the limit."""
    monkeypatch.setenv("CBP_RUN_TIME_LIMIT_S", "20")
    status = _refused(*_run_args(rows=[["early", 3, 0], ["late", 3, 25]]))
    assert "at most 20 s" in status, status


def test_status_markdown_shows_typed_text_as_typed():
    """Markdown and HTML characters in a message are escaped, so the status shows them as typed."""
    assert plain_markdown("max_new_tokens *5* <b>x</b> `y` [z]") == (
        r"max\_new\_tokens \*5\* \<b\>x\</b\> \`y\` \[z\]"
    )
    assert plain_markdown("Row 2: 3 s.") == "Row 2: 3 s.", "plain text was changed"


def test_kv_budget_too_small_is_refused_before_any_engine_runs(shared, previous):
    """A paged KV budget of one block, too small for a request, is refused like other bad input
    ("Not run", no model call, previous results kept), and the message counts "1 block"."""
    one_block_mib = (
        1.5 * 16 * shared.worker.model.runner.kv_bytes_per_token() / 2**20
    )  # 1.5 blocks of 16
    args = _run_args(rows=[["hello world " * 3, 40]], kv_mib=str(one_block_mib))
    status = _refused(*args[:10], previous, *args[11:])
    assert status.startswith("**Not run:** Request R0 (row 1) needs"), status
    assert "holds 1 block of 16 tokens (16 tokens)" in status, status
    assert "1 blocks" not in status, status


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("check_reference", "yes please", "Check outputs against model.generate must be true"),
        ("chat_template", "maybe", "Use chat template must be true or false (got 'maybe')"),
        ("compare_hf", 2, "Also run transformers' continuous batching must be true or false"),
        ("prefix_caching", [1], "Prefix caching must be true or false"),
        ("batch_invariant", "on", "Batch-invariant mode must be true or false"),
    ],
)
def test_a_checkbox_input_that_is_not_true_or_false_is_refused(name, value, message):
    """A /run call with a checkbox input that is neither true nor false ("yes please") gets "Not
    run" naming that setting, never a run that reads it as ticked."""
    from engine.page.run.run_options import RUN_INPUTS

    named = dict(zip(RUN_INPUTS, _run_args(), strict=False)) | {name: value}
    status = _refused(**named)
    assert plain_markdown(message) in status, f"{message!r} not in {status!r}"


def test_checkbox_inputs_take_true_false_and_their_words():
    """True/False, 0/1, None and the words "true"/"false" in any case are a checkbox's values."""
    from engine.page.run.run_options import options_from_page, settings_from_run

    for value, expected in [
        (True, True),
        ("TRUE", True),
        (1, True),
        ("false", False),
        (None, False),
    ]:
        settings, _, _ = settings_from_run(*_run_args()[:3], value, *_run_args()[4:10])
        assert options_from_page(settings).check_reference is expected, f"{value!r} misread"


API_TABLE = {"headers": ["prompt", "max_new_tokens"], "data": ROWS}


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("num_slots", "abc", "Slots must be a whole number (got 'abc')"),
        ("num_slots", 17, "Slots must be at most 16 (got 17)"),
        ("rows", None, "The request table must be a table"),
        ("rows", "hello", "The request table must be a table"),
        ("rows", {"headers": ["prompt"], "data": "x"}, "The request table must be a table"),
        ("rows", {"headers": ["prompt"], "data": ["x"]}, "Row 1 must be a list of cells"),
        ("server_names", 5, "Servers must be a list of server names (got 5)"),
        ("x_axis", "bogus", "The x axis must be one of time, step (got 'bogus')"),
        ("replay_recent", "maybe", "replay_recent must be true or false (got 'maybe')"),
        ("arrival_rate", [1], "Arrival rate (requests/s) must be a number"),
        ("batch_invariant", "on", "Batch-invariant mode must be true or false"),
    ],
)
def test_a_run_input_of_the_wrong_type_is_refused_by_name(name, value, message):
    """Each /run input of the wrong type (slots "abc", rows None or "hello", ...) gets "Not run"
    naming it, and only it: no TypeError, no second message about the same input."""
    from engine.page.run.run_options import RUN_INPUTS

    named = dict(zip(RUN_INPUTS, _run_args(), strict=False)) | {name: value}
    status = _refused(**named)
    assert plain_markdown(message) in status, f"{message!r} not in {status!r}"
    assert status.count("must") == 1, f"more than one problem named: {status!r}"


def test_the_api_table_form_runs_as_its_rows():
    """The table as the page and the /run API send it ({"headers", "data"}) is read as its rows."""
    from engine.page.run.run_options import request_rows

    assert request_rows(API_TABLE) == ROWS
    assert request_rows(ROWS) == ROWS


@pytest.mark.skipif(Client is None, reason="the gradio_client package is not installed")
def test_served_run_api_says_not_run_for_inputs_of_the_wrong_type():
    """Through a served page, /run with num_slots="abc", rows=None, rows="hello" or
    check_reference="yes please" returns a "Not run" status line naming the input, instead of
    Gradio's opaque error."""
    import app

    demo = app.build_demo("Model: test")
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True)
    knobs = _run_args()[2:10]
    calls = [
        ("Slots must be a whole number", (API_TABLE, "abc", *knobs)),
        ("The request table must be a table", (None, 2, *knobs)),
        ("The request table must be a table", ("hello", 2, *knobs)),
        ("Check outputs against model.generate", (API_TABLE, 2, False, "yes please", *knobs[2:])),
    ]
    try:
        client = Client(demo.local_url, verbose=False)
        for message, args in calls:
            status = client.predict(*args, api_name="/run")[STATUS_INDEX]
            assert status.startswith("**Not run:**"), f"{args[:4]}: {status!r}"
            assert plain_markdown(message) in status, f"{message!r} not in {status!r}"
    finally:
        demo.close()
