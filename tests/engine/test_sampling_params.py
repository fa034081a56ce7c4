"""Sampling settings: validation, the optional table and file columns, clear bad-row messages."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.sampling_params import MAX_SEED, SamplingParams, parse_sampling, with_defaults
from engine.workloads.workload import RequestSpec, load_jsonl, parse_table
from engine.workloads.workload_files import load_workload_file, table_rows, to_csv, to_jsonl

SAMPLED = [
    RequestSpec("Hello", 4, 0.0, SamplingParams(0.7, 40, 0.9, 12345)),
    RequestSpec("greedy one", 3),
    RequestSpec('Ünï, "quoted"\nline', 5, 0.25, SamplingParams(1.0, 0, 0.5, MAX_SEED)),
]


def test_a_row_without_sampling_cells_is_greedy():
    """2-, 3- and 7-cell rows with blank sampling cells give no settings (greedy)."""
    rows = [["a", 2], ["b", 3, 0.5], ["c", 4, "", "", None, float("nan"), "  "]]
    assert [s.sampling for s in parse_table(rows)] == [None, None, None]


def test_sampling_cells_parse_with_defaults_for_the_blank_ones():
    """Given cells are read as numbers (strings too); blank ones take 1, 0, 1, 0."""
    specs = parse_table(
        [
            ["a", 2, "", "0.7", "5", " 0.9 ", "9223372036854775807"],
            ["b", 3, 0, None, None, None, 7.0],
            ["c", 3, 0, 0, None, None, None],
        ]
    )
    assert specs[0].sampling == SamplingParams(0.7, 5, 0.9, 2**63 - 1)
    assert specs[1].sampling == SamplingParams(1.0, 0, 1.0, 7)
    assert specs[2].sampling == SamplingParams(0.0, 0, 1.0, 0) and specs[2].sampling.is_greedy


@pytest.mark.parametrize(
    ("cells", "message"),
    [
        (["-0.5", "", "", ""], "Row 2: temperature -0.5 is below 0"),
        (["inf", "", "", ""], "Row 2: temperature inf is not a finite number"),
        (["warm", "", "", ""], "Row 2: temperature 'warm' is not a number"),
        (["", "", "0", ""], "Row 2: top_p 0 is outside (0, 1]"),
        (["", "", "1.01", ""], "Row 2: top_p 1.01 is outside (0, 1]"),
        (["", "", "nan", ""], "Row 2: top_p nan is outside (0, 1]"),
        (["", "-1", "", ""], "Row 2: top_k -1 is below 0"),
        (["", "2.5", "", ""], "Row 2: top_k 2.5 is not a whole number"),
        (["", "", "", "1.5"], "Row 2: seed 1.5 is not a whole number"),
        (["", "", "", "-1"], "Row 2: seed -1 is out of range; use 0 to 9223372036854775807"),
        (["", "", "", str(2**63)], f"Row 2: seed {2**63} is out of range"),
        (["", "", "", "1e19"], "Row 2: seed 1e19 is too large to read exactly"),
        (["", "", "", "seven"], "Row 2: seed 'seven' is not a whole number"),
    ],
)
def test_bad_sampling_cells_name_the_row_and_the_problem(cells, message):
    """Each bad case raises ValueError naming the row, the setting and what is allowed."""
    with pytest.raises(ValueError) as excinfo:
        parse_table([["fine", 2], ["bad", 3, 0, *cells]])
    assert str(excinfo.value).startswith(message), str(excinfo.value)


def test_sampling_params_refuse_bad_values_directly():
    """The dataclass itself refuses bad values, including a bool and a 5,000-digit seed."""
    for kwargs in (
        {"temperature": -1},
        {"top_p": 0},
        {"top_k": -3},
        {"top_k": True},
        {"seed": 10**5000},
        {"seed": 1.0},
        {"temperature": 10**400},
    ):
        with pytest.raises(ValueError):
            SamplingParams(**kwargs)


CELL = st.one_of(
    st.none(),
    st.text(max_size=8),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(),
    st.integers(min_value=10**4300, max_value=10**4400),
    st.booleans(),
    st.sampled_from(["0.5", "1", "0", "-0", "1e3", "٣", "１２", "nan", "inf", "2.0"]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(CELL, min_size=4, max_size=4))
def test_any_sampling_cells_give_valid_settings_or_a_clear_error(cells):
    """Arbitrary cells parse into settings within range, or raise a message naming the row."""
    try:
        params = parse_sampling(*cells, "Row 9")
    except ValueError as exc:
        assert str(exc).startswith("Row 9: "), f"unclear message: {exc}"
        return
    if params is not None:
        assert params.temperature >= 0 and 0 < params.top_p <= 1 and params.top_k >= 0
        assert isinstance(params.seed, int) and 0 <= params.seed <= MAX_SEED


def test_csv_and_jsonl_round_trip_the_sampling_settings(tmp_path):
    """Downloads carry the four columns when a request samples, and load back to the same specs."""
    for name, text in (("w.csv", to_csv(SAMPLED)), ("w.jsonl", to_jsonl(SAMPLED))):
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        assert load_workload_file(path) == SAMPLED, f"{name} did not round-trip:\n{text}"
    assert to_csv(SAMPLED).splitlines()[0] == (
        "prompt,max_new_tokens,arrival_s,temperature,top_k,top_p,seed"
    )
    lines = [json.loads(line) for line in to_jsonl(SAMPLED).splitlines()]
    assert lines[1] == {"prompt": "greedy one", "max_new_tokens": 3, "arrival_s": 0.0}
    assert lines[2]["seed"] == MAX_SEED


def test_a_greedy_workload_downloads_as_before():
    """Without sampling the CSV header and JSONL keys are the three they always were."""
    greedy = [RequestSpec("a", 2), RequestSpec("b", 3, 1.5)]
    assert to_csv(greedy).splitlines()[0] == "prompt,max_new_tokens,arrival_s"
    assert set(json.loads(to_jsonl(greedy).splitlines()[0])) == {
        "prompt",
        "max_new_tokens",
        "arrival_s",
    }


def test_table_rows_keep_three_columns_unless_asked():
    """The page's table rows stay 3 cells; with sampling_columns they are 7 and parse back."""
    assert all(len(row) == 3 for row in table_rows(SAMPLED))
    rows = table_rows(SAMPLED, sampling_columns=True)
    assert rows[1] == ["greedy one", 3, 0.0, None, None, None, None]
    assert parse_table(rows) == SAMPLED


def test_bad_sampling_in_files_names_the_line(tmp_path):
    """A bad value in an uploaded CSV or a bench JSONL names the file and its line."""
    csv_path = tmp_path / "bad.csv"
    csv_path.write_text("prompt,max_new_tokens,seed\nok,3,1\nbad,3,-4\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"^bad\.csv line 3: seed -4 is out of range"):
        load_workload_file(csv_path)
    jsonl = tmp_path / "bad.jsonl"
    rows = [{"prompt": "ok", "max_new_tokens": 2}, {"prompt": "x", "max_new_tokens": 2, "top_p": 2}]
    jsonl.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    with pytest.raises(ValueError, match=r"^bad\.jsonl line 2: top_p 2 is outside \(0, 1\]"):
        load_jsonl(jsonl)


def test_with_defaults_keeps_own_settings_and_numbers_the_others():
    """A request's own settings win; the others get the defaults and seed base + index."""
    own = SamplingParams(0.3, 1, 1.0, 99)
    defaults = SamplingParams(0.8, 0, 0.95, 1000)
    assert with_defaults(own, defaults, 1000, 4) is own
    assert with_defaults(None, defaults, 1000, 4) == SamplingParams(0.8, 0, 0.95, 1004)
    assert with_defaults(None, None, 0, 4) is None
    with pytest.raises(ValueError, match="seed .* out of range"):
        with_defaults(None, defaults, MAX_SEED, 1)
