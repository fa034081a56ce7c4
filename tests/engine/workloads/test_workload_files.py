"""Workload uploads: CSV and JSONL parse into specs, bad lines are named, downloads load back."""

from __future__ import annotations

import csv
import io
import json

import pytest

from engine.workloads import workload_files
from engine.workloads.workload import RequestSpec, parse_table
from engine.workloads.workload_files import load_workload_file, to_csv, to_jsonl, write_table_files

SPECS = [
    RequestSpec("Hello, world", 4),
    RequestSpec('She said "hi",\nthen left', 7, 0.5),
    RequestSpec("Ünïcödé", 2, 1.25),
]


def _write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_csv_upload_reads_columns_in_any_order(tmp_path):
    """A CSV with reordered columns, extra columns, blank rows and a BOM gives the right specs."""
    text = (
        "\ufeffarrival_s,engine,max_new_tokens,prompt\n"
        "0.5,static,3,First\n"
        ",,,\n"
        ',static,5,"Second, with a comma"\n'
    )
    specs = load_workload_file(_write(tmp_path, "w.csv", text))
    assert specs == [
        RequestSpec("First", 3, 0.5),
        RequestSpec("Second, with a comma", 5, 0.0),
    ], f"parsed {specs}"


def test_csv_and_jsonl_downloads_load_back(tmp_path):
    """What the table download writes loads back to the same specs, quotes and newlines included."""
    paths = write_table_files(tmp_path, SPECS)
    assert [p.name for p in paths] == ["workload.csv", "workload.jsonl"]
    for path in paths:
        assert load_workload_file(path) == SPECS, f"{path.name} did not round-trip"
    rows = list(csv.DictReader(io.StringIO(to_csv(SPECS))))
    assert rows[1]["prompt"] == SPECS[1].prompt, "CSV quoting lost the newline or quotes"
    objs = [json.loads(line) for line in to_jsonl(SPECS).splitlines()]
    assert objs[2] == {"prompt": "Ünïcödé", "max_new_tokens": 2, "arrival_s": 1.25}


def test_uploaded_rows_fit_the_table(tmp_path):
    """Rows from an upload parse through the page's own table parser unchanged."""
    from engine.workloads.workload_files import table_rows

    assert parse_table(table_rows(SPECS)) == SPECS


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("bad.csv", "prompt,max_new_tokens\nok,3\nbad,zero\n", "bad.csv line 3: max_new_tokens"),
        ("bad.csv", "prompt,max_new_tokens\nok,3\n,4\n", "bad.csv line 3: the prompt is blank"),
        ("bad.csv", "prompt,max_new_tokens,arrival_s\nok,3,-1\n", "bad.csv line 2: arrival_s"),
        ("bad.csv", "prompt,max_new_tokens\nok,3,extra\n", "bad.csv line 2: more cells"),
        ("bad.csv", "text,cap\nok,3\n", "bad.csv line 1: the header must name"),
        ("bad.csv", "prompt,max_new_tokens\n", "The workload is empty"),
        ("bad.jsonl", '{"prompt": "ok", "max_new_tokens": 3}\n{"prompt": "x"\n', "line 2"),
        ("bad.txt", "prompt,max_new_tokens\nok,3\n", "upload a .csv or .jsonl file"),
    ],
)
def test_malformed_files_name_the_bad_line(tmp_path, name, text, message):
    """A malformed upload raises ValueError whose message names the file and the bad line."""
    with pytest.raises(ValueError) as excinfo:
        load_workload_file(_write(tmp_path, name, text))
    assert message in str(excinfo.value), f"message {str(excinfo.value)!r} lacks {message!r}"


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_every_bad_line_of_an_upload_is_named_at_once(tmp_path, suffix):
    """An upload with seven bad lines among good ones names the first five bad lines in one
    message and counts the other two; the good lines are not named."""
    good, bad = ("ok", 3), [("", 3), ("x", 0), ("y", "abc"), ("z", -1), ("", 1), ("w", 0), ("v", 0)]
    rows = [good, *bad[:3], good, *bad[3:]]
    if suffix == ".csv":
        text = "prompt,max_new_tokens\n" + "".join(f"{p},{c}\n" for p, c in rows)
        first = 2  # the header is line 1
    else:
        text = "".join(json.dumps({"prompt": p, "max_new_tokens": c}) + "\n" for p, c in rows)
        first = 1
    with pytest.raises(ValueError) as excinfo:
        load_workload_file(_write(tmp_path, f"many{suffix}", text))
    message = str(excinfo.value)
    bad_lines = [first + i for i, row in enumerate(rows) if row != good]
    named = [line for line in range(first, first + len(rows)) if f"line {line}:" in message]
    assert named == bad_lines[:5], f"named lines {named}, bad {bad_lines}: {message!r}"
    assert message.endswith("… and 2 more bad lines."), message


def test_header_message_names_every_optional_column(tmp_path):
    """A header without the required columns is told every column a table may have: arrival_s
    and the four sampling columns too."""
    with pytest.raises(ValueError) as excinfo:
        load_workload_file(_write(tmp_path, "h.csv", "text,cap\nok,3\n"))
    message = str(excinfo.value)
    for name in ("arrival_s", "temperature", "top_k", "top_p", "seed"):
        assert name in message, f"the header message omits {name}: {message!r}"


def test_csv_line_numbers_count_multiline_prompts(tmp_path):
    """A bad row after a prompt spanning two lines is reported at its own physical line."""
    text = 'prompt,max_new_tokens\n"two\nlines",3\nbad,0\n'
    with pytest.raises(ValueError, match="line 4: max_new_tokens 0 is out of range"):
        load_workload_file(_write(tmp_path, "m.csv", text))


def test_non_utf8_csv_is_refused_clearly(tmp_path):
    """A Latin-1 file is refused with a message asking for UTF-8."""
    path = tmp_path / "latin.csv"
    path.write_bytes("prompt,max_new_tokens\ncaf\xe9,3\n".encode("latin-1"))
    with pytest.raises(ValueError, match="not UTF-8"):
        load_workload_file(path)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_prompt_over_the_csv_field_limit_gets_the_prompt_limit_message(tmp_path, suffix):
    """A 200,000-character prompt (over csv's own 131,072) is refused as over the prompt limit,
    in CSV as in JSONL, and the csv module's field limit is as it was afterwards."""
    prompt = "x" * 200_000
    if suffix == ".csv":
        text = f"prompt,max_new_tokens\nshort,3\n{prompt},3\n"
    else:
        text = json.dumps({"prompt": prompt, "max_new_tokens": 3}) + "\n"
    field_limit = csv.field_size_limit()
    with pytest.raises(ValueError) as excinfo:
        load_workload_file(_write(tmp_path, "long" + suffix, text))
    line = 3 if suffix == ".csv" else 1
    wanted = f"long{suffix} line {line}: the prompt has 200000 characters, over the limit of 20000."
    assert str(excinfo.value) == wanted, f"message {str(excinfo.value)!r}"
    assert csv.field_size_limit() == field_limit, "the csv field limit stayed changed"


def test_host_raised_prompt_limit_admits_a_csv_cell_over_131072(tmp_path, monkeypatch):
    """With CBP_MAX_PROMPT_CHARS raised past csv's own field limit, such a CSV prompt loads."""
    monkeypatch.setenv("CBP_MAX_PROMPT_CHARS", "200000")
    path = _write(tmp_path, "long.csv", f"prompt,max_new_tokens\n{'y' * 150_000},3\n")
    assert load_workload_file(path) == [RequestSpec("y" * 150_000, 3)]


@pytest.mark.parametrize("name", ["big.csv", "big.jsonl"])
def test_upload_over_the_byte_limit_is_refused_before_parsing(tmp_path, monkeypatch, name):
    """A file over max_upload_bytes is refused, naming the file and the limit, unread."""
    monkeypatch.setenv("CBP_MAX_ROWS", "2")
    monkeypatch.setenv("CBP_MAX_PROMPT_CHARS", "100")
    limit = workload_files.max_upload_bytes()
    assert limit == 2 * (4 * 100 + workload_files.MAX_CELLS_BYTES), f"limit {limit}"
    path = tmp_path / name
    path.write_bytes(b"\xff" * (limit + 1))  # not even text: refused by size first
    with pytest.raises(ValueError) as excinfo:
        load_workload_file(path)
    wanted = f"{name} has {limit + 1:,} bytes, over the upload limit of {limit:,} bytes"
    assert wanted in str(excinfo.value), f"message {str(excinfo.value)!r}"


@pytest.mark.parametrize("name", ["binary.csv", "binary.json", "binary.jsonl"])
def test_binary_upload_gets_one_message_naming_the_file_whatever_its_extension(tmp_path, name):
    """A PNG renamed .csv, .json or .jsonl is refused with the same message, naming the file."""
    path = tmp_path / name
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    with pytest.raises(ValueError) as excinfo:
        load_workload_file(path)
    wanted = f"{name} is not UTF-8 text; save it as UTF-8."
    assert str(excinfo.value) == wanted, f"message {str(excinfo.value)!r}"


def test_table_arrival_column_is_optional():
    """The table's third column sets arrival_s; blank or missing means 0."""
    specs = parse_table([["a", 2, 1.5], ["b", 3, ""], ["c", 4, None], ["d", 5]])
    assert [s.arrival_s for s in specs] == [1.5, 0.0, 0.0, 0.0], specs
    with pytest.raises(ValueError, match="Row 2: arrival_s"):
        parse_table([["a", 2], ["b", 3, "soon"]])
