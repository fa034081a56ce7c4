"""Workload parsing and validation: clear ValueErrors, numbers as strings accepted."""

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine.workloads.workload import (
    MAX_NEW_TOKENS_LIMIT,
    MAX_PROMPT_CHARS,
    MAX_ROWS,
    load_jsonl,
    parse_cap,
    parse_table,
    seed_specs,
    tokenize_requests,
)
from engine.workloads.workload_files import load_workload_file


def test_seed_is_the_articles_six_requests():
    """The seed workload is the article's six (prompt, cap) pairs."""
    specs = seed_specs()
    assert [s.max_new_tokens for s in specs] == [6, 50, 300, 30, 180, 45]
    assert specs[0].prompt == "The capital of France is"


def test_table_accepts_numbers_as_strings_and_skips_blank_rows():
    """Gradio sends edited numbers as strings; fully blank rows are ignored."""
    specs = parse_table([["Hi", "5"], ["", ""], ["Yo", 7.0], [None, None]])
    assert [(s.prompt, s.max_new_tokens) for s in specs] == [("Hi", 5), ("Yo", 7)]


@pytest.mark.parametrize(
    "rows, fragment",
    [
        ([], "empty"),
        ([["", ""]], "empty"),
        ([["   ", 5]], "Row 1: the prompt is blank"),
        ([["ok", 0]], "out of range"),
        ([["ok", -3]], "out of range"),
        ([["ok", "2.5"]], "not a whole number"),
        ([["ok", "abc"]], "not a number"),
        ([["ok", ""]], "empty"),
        ([["ok", MAX_NEW_TOKENS_LIMIT + 1]], "out of range"),
        ([["ok", 3]] * (MAX_ROWS + 1), "over the limit"),
    ],
)
def test_bad_tables_raise_clear_errors(rows, fragment):
    """Each bad table gets a ValueError whose message names the problem."""
    with pytest.raises(ValueError, match=fragment):
        parse_table(rows)


@given(st.integers(min_value=1, max_value=MAX_NEW_TOKENS_LIMIT))
def test_any_valid_cap_round_trips_through_its_string(cap):
    """Every cap in range parses from int, float and string forms to the same int."""
    assert parse_cap(cap, "r") == parse_cap(str(cap), "r") == parse_cap(float(cap), "r") == cap


@given(st.one_of(st.integers(max_value=0), st.integers(min_value=MAX_NEW_TOKENS_LIMIT + 1)))
def test_any_out_of_range_cap_is_refused(cap):
    """Caps below 1 or above the limit always raise ValueError."""
    with pytest.raises(ValueError):
        parse_cap(cap, "r")


def test_every_bad_row_is_named_at_once():
    """A table with several bad rows names each of them in one message (the good rows between
    them pass); past five, the rest are counted."""
    with pytest.raises(ValueError) as excinfo:
        parse_table([["", 3], ["ok", 3], ["ok", 0], ["ok", "abc"]])
    message = str(excinfo.value)
    for fragment in ("Row 1: the prompt is blank", "Row 3: max_new_tokens 0", "Row 4:"):
        assert fragment in message, f"{fragment!r} not named: {message!r}"
    assert "Row 2" not in message, f"a good row is named: {message!r}"
    with pytest.raises(ValueError) as excinfo:
        parse_table([["ok", 0]] * 8)
    message = str(excinfo.value)
    assert [f"Row {i}:" in message for i in range(1, 9)] == [True] * 5 + [False] * 3, message
    assert message.endswith("… and 3 more bad rows."), message


def test_jsonl_errors_name_the_line(tmp_path):
    """A malformed JSONL line is reported with its line number."""
    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps({"prompt": "a", "max_new_tokens": 3}) + "\n{oops\n")
    with pytest.raises(ValueError, match="w.jsonl line 2"):
        load_jsonl(path)


def test_jsonl_round_trip(tmp_path):
    """A well-formed JSONL file loads every request in order."""
    path = tmp_path / "w.jsonl"
    rows = [{"prompt": "a", "max_new_tokens": 3}, {"prompt": "b", "max_new_tokens": 9}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert [(s.prompt, s.max_new_tokens) for s in load_jsonl(path)] == [("a", 3), ("b", 9)]


class _Tok:
    def __call__(self, text, add_special_tokens=True, **kwargs):
        return {"input_ids": list(range(len(text)))}


def test_prompt_plus_cap_over_context_is_refused():
    """A prompt whose length plus cap passes the context is rejected, naming the request."""
    specs = parse_table([["short", 2], ["x" * 20, 5]])
    with pytest.raises(
        ValueError, match=r"Request R1 \(row 2\).*exceeds the model's context of 16"
    ):
        tokenize_requests(specs, _Tok(), chat_template=False, max_context=16)


def test_host_can_tighten_limits_through_the_environment(monkeypatch):
    """CBP_MAX_ROWS, CBP_MAX_NEW_TOKENS and CBP_MAX_PROMPT_CHARS take effect on the next parse."""
    monkeypatch.setenv("CBP_MAX_ROWS", "2")
    monkeypatch.setenv("CBP_MAX_NEW_TOKENS", "64")
    monkeypatch.setenv("CBP_MAX_PROMPT_CHARS", "10")
    assert len(parse_table([["a", 64], ["b", 1]])) == 2
    with pytest.raises(ValueError, match="over the limit of 2 per run"):
        parse_table([["a", 1]] * 3)
    with pytest.raises(ValueError, match="out of range; use 1 to 64"):
        parse_table([["a", 65]])
    with pytest.raises(ValueError, match="11 characters, over the limit of 10"):
        parse_table([["x" * 11, 3]])
    monkeypatch.setenv("CBP_MAX_ROWS", "lots")
    with pytest.raises(ValueError, match="CBP_MAX_ROWS='lots' must be a positive integer"):
        parse_table([["a", 1]])


def test_twenty_thousand_character_prompt_passes_the_character_limit():
    """The default character limit admits a 20,000-character prompt (the context check decides)."""
    assert parse_table([["x" * 20_000, 3]])[0].max_new_tokens == 3


# --- property-based: any cell values --------------------------------------------------------------

CELLS = st.one_of(
    st.none(),
    st.text(),
    st.text(alphabet=" \t\n\r\u00a0\u2003"),  # whitespace only, Unicode spaces included
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(),
    st.integers(min_value=10**4300, max_value=10**4400),  # too long for str()
    st.booleans(),
    st.integers(min_value=-5, max_value=3000).map(str),
    st.sampled_from(["2.5", "1e3", "  7 ", "٣", "0x10", "nan", "inf", "-0", "１２"]),
)
ROWS = st.lists(st.lists(CELLS, min_size=0, max_size=3), max_size=6)
USER_ERRORS = ("Row ", "The workload is empty", "requests is over the limit")


@settings(max_examples=300, deadline=None)
@given(ROWS)
@example([["p", 3, 10**5000]])  # an arrival_s too big for a float (found by this test)
@example([["p", 3, 1e400]])
@example([["NAN", 1]])  # a prompt typed as "NAN" is text, not an empty cell
def test_any_cells_give_valid_specs_or_a_clear_error(rows):
    """Arbitrary cells either parse into valid specs or raise ValueError naming the problem."""
    try:
        specs = parse_table(rows)
    except ValueError as exc:
        assert str(exc).startswith(USER_ERRORS), f"unclear message: {exc}"
        return
    limit = MAX_NEW_TOKENS_LIMIT
    typed = {row[0] for row in rows if row and isinstance(row[0], str)}  # "NaN" typed is text
    for spec in specs:
        assert isinstance(spec.prompt, str) and spec.prompt.strip(), f"blank prompt: {spec}"
        assert spec.prompt.lower() != "nan" or spec.prompt in typed, (
            f"an empty (NaN) cell became a prompt: {spec}"
        )
        assert isinstance(spec.max_new_tokens, int) and 1 <= spec.max_new_tokens <= limit, spec
        assert len(spec.prompt) <= MAX_PROMPT_CHARS, "prompt over the character limit"


@given(
    st.lists(
        st.tuples(
            st.text(min_size=1, max_size=200).filter(lambda p: p.strip()),
            st.integers(min_value=1, max_value=MAX_NEW_TOKENS_LIMIT),
            st.sampled_from([int, float, str, lambda n: f" {n} "]),
        ),
        min_size=1,
        max_size=MAX_ROWS,
    )
)
def test_valid_rows_round_trip(rows):
    """Valid rows, caps written as int, float or (padded) string, come back exactly, in order."""
    specs = parse_table([[prompt, form(cap)] for prompt, cap, form in rows])
    assert [(s.prompt, s.max_new_tokens) for s in specs] == [(p, c) for p, c, _ in rows]


def test_every_problem_of_a_row_is_named():
    """A row with a blank prompt, cap 0, arrival -1 and temperature -1 names all four problems,
    the row once, a sentence each; a good row beside it is not named."""
    with pytest.raises(ValueError) as excinfo:
        parse_table([["ok", 3], ["", 0, -1, -1]])
    message = str(excinfo.value)
    assert message.startswith("Row 2: the prompt is blank. "), (
        f"only one problem named: {message!r}"
    )
    for fragment in ("max_new_tokens 0 is out of range", "arrival_s must be", "temperature"):
        assert fragment in message, f"{fragment!r} not named: {message!r}"
    assert message.count("Row 2") == 1 and "Row 1" not in message, message


def test_every_bad_sampling_cell_of_a_row_is_named_at_once():
    """A row's bad temperature, top_k and top_p are named in one message, and a bad seed cell
    beside them hides none of them (issue 51, item 9)."""
    for seed, named in ((None, ()), ("x", ("seed 'x' is not a whole number",))):
        with pytest.raises(ValueError) as excinfo:
            parse_table([["hi", 3, 0, -1, -4, 2, seed]])
        message = str(excinfo.value)
        for fragment in ("temperature -1 is below 0", "top_k -4 is below 0", "top_p 2 is outside"):
            assert fragment in message, f"{fragment!r} not named (seed {seed!r}): {message!r}"
        for fragment in named:
            assert fragment in message, f"{fragment!r} not named: {message!r}"
        assert message.count("Row 1") == 1, message


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_every_problem_of_an_uploaded_line_is_named(tmp_path, suffix):
    """An uploaded line with a blank prompt, cap 0 and arrival -1 names all three problems."""
    path = tmp_path / f"w{suffix}"
    if suffix == ".csv":
        path.write_text("prompt,max_new_tokens,arrival_s\n,0,-1\n")
    else:
        path.write_text(json.dumps({"prompt": "", "max_new_tokens": 0, "arrival_s": -1}) + "\n")
    with pytest.raises(ValueError) as excinfo:
        load_workload_file(path)
    message = str(excinfo.value)
    for fragment in ("the prompt is blank", "max_new_tokens 0 is out of range", "arrival_s must"):
        assert fragment in message, f"{fragment!r} not named: {message!r}"
