"""Workload files: a workload uploaded as CSV or JSONL into the page's table, and downloaded back,
both through the table's checks (``row_spec``); uploads are bounded in bytes."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path

from engine.sampling_params import FIELDS as SAMPLING_FIELDS
from engine.workloads.export import write_texts
from engine.workloads.workload import (
    TABLE_COLUMNS,
    RequestSpec,
    checked_count,
    limits,
    load_jsonl,
    raise_problems,
    read_workload_text,
    row_spec,
)

FIELDS = TABLE_COLUMNS[:3]  # every download's columns; the sampling ones follow where used
REQUIRED = ("prompt", "max_new_tokens")
MAX_CELLS_BYTES = 1024  # per row, for the cells other than the prompt (an upload's size bound)

# ``csv.field_size_limit`` is one setting for the whole process: a CSV read raises it to the
# file's length and puts it back, one read at a time, so no other reader sees it raised.
_FIELD_LIMIT_LOCK = threading.Lock()


def max_upload_bytes() -> int:
    """Every allowed row with a prompt at the character limit in 4-byte UTF-8, plus
    ``MAX_CELLS_BYTES`` for its other cells (about 21 MB by default)."""
    limit = limits()
    return limit.max_rows * (4 * limit.max_prompt_chars + MAX_CELLS_BYTES)


def load_workload_file(path: str | Path) -> list[RequestSpec]:
    """``.csv`` with a header row, or ``.jsonl``/``.json`` lines. Raises ValueError: another
    extension, over ``max_upload_bytes``, unreadable, or a bad line."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ValueError(f"Cannot read workload file {path.name}: {exc.strerror}.") from None
    limit = max_upload_bytes()
    if size > limit:
        raise ValueError(
            f"{path.name} has {size:,} bytes, over the upload limit of {limit:,} bytes; "
            "upload fewer or shorter requests."
        )
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return load_csv(path)
    if suffix in (".jsonl", ".json"):
        return load_jsonl(path)
    raise ValueError(f"{path.name}: upload a .csv or .jsonl file (got {suffix or 'no extension'}).")


def load_csv(path: str | Path) -> list[RequestSpec]:
    """A CSV workload; the header (line 1) names its columns in any order, blank rows skipped.
    Raises ValueError: a missing column, a row too long, unreadable text or bad values (each line
    named)."""
    path = Path(path)
    text = read_workload_text(path)
    reader = csv.DictReader(io.StringIO(text, newline=""))
    with _field_limit(len(text) + 1):
        try:
            return _read_rows(reader, path.name)
        except csv.Error as exc:
            where = f"{path.name} line {reader.line_num}"
            raise ValueError(f"{where}: not readable as CSV ({exc}).") from None


@contextlib.contextmanager
def _field_limit(max_chars: int) -> Iterator[None]:
    """``csv.field_size_limit`` at least ``max_chars`` inside the block, as it was after it."""
    with _FIELD_LIMIT_LOCK:
        old = csv.field_size_limit()
        csv.field_size_limit(max(old, max_chars))
        try:
            yield
        finally:
            csv.field_size_limit(old)


def _read_rows(reader: csv.DictReader, file_name: str) -> list[RequestSpec]:
    header = [name.strip() for name in reader.fieldnames or []]
    missing = [name for name in REQUIRED if name not in header]
    if missing:
        optional = ", ".join(name for name in TABLE_COLUMNS if name not in REQUIRED)
        raise ValueError(
            f"{file_name} line 1: the header must name the columns prompt and max_new_tokens "
            f"(and optionally {optional}); missing {', '.join(missing)}."
        )
    reader.fieldnames = header
    specs, problems = [], []
    try:
        for row in reader:
            where = f"{file_name} line {reader.line_num}"
            if None in row:
                problems.append(f"{where}: more cells than header columns (a stray comma?).")
            elif any((value or "").strip() for value in row.values()):
                try:
                    specs.append(_spec(row, where))
                except ValueError as exc:
                    problems.append(str(exc))
    except csv.Error as exc:  # the rest of the file cannot be read: what was found, and this
        problems.append(f"{file_name} line {reader.line_num}: not readable as CSV ({exc}).")
    raise_problems(problems, "bad lines")
    return checked_count(specs)


def _spec(row: dict, where: str) -> RequestSpec:
    arrival = (row.get("arrival_s") or "").strip()
    sampling = [row.get(name) for name in SAMPLING_FIELDS]
    return row_spec(row.get("prompt"), row.get("max_new_tokens"), arrival, sampling, where)


def table_rows(specs: list[RequestSpec], sampling_columns: bool = False) -> list[list]:
    """Specs as table rows ``[prompt, max_new_tokens, arrival_s]``
    (``+ [temperature, top_k, top_p, seed]`` with ``sampling_columns``)."""
    rows = []
    for s in specs:
        row = [s.prompt, s.max_new_tokens, s.arrival_s]
        if sampling_columns:
            values = s.sampling.to_dict() if s.sampling is not None else {}
            row += [values.get(name) for name in SAMPLING_FIELDS]
        rows.append(row)
    return rows


def to_csv(specs: list[RequestSpec]) -> str:
    sampling = any(s.sampling is not None for s in specs)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(TABLE_COLUMNS if sampling else FIELDS)
    writer.writerows(
        ["" if cell is None else cell for cell in row] for row in table_rows(specs, sampling)
    )
    return out.getvalue()


def to_jsonl(specs: list[RequestSpec]) -> str:
    lines = []
    for spec, row in zip(specs, table_rows(specs), strict=True):
        obj = dict(zip(FIELDS, row, strict=True))
        if spec.sampling is not None:
            obj |= spec.sampling.to_dict()
        lines.append(json.dumps(obj))
    return "\n".join(lines) + "\n"


def write_table_files(folder: str | Path, specs: list[RequestSpec]) -> list[Path]:
    return write_texts(folder, {"workload.csv": to_csv(specs), "workload.jsonl": to_jsonl(specs)})
