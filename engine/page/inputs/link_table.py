"""An edited request table in a link: its rows packed into one URL-safe ``table=`` parameter.

Rows as compact JSON (``[["Hi", 4], ["Later", 3, 1.5]]``), zlib-compressed, base64url without
padding; read back with bounded work, then checked as a typed table is (``parse_table``).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import zlib

from engine.page.inputs import presets
from engine.workloads.workload import MAX_ROWS, TABLE_COLUMNS, parse_table

# The encoded table's length limit, in characters of the ``table=`` value: links are pasted into
# chats, mails and slides, and proxies cap the request line (nginx's default buffer is 8 KiB for
# the whole line). A table of long prompts is a workload file's job.
MAX_TABLE_CHARS = 4000
# What a ``table=`` value may unpack to, in bytes of JSON: zlib packs up to ~1,000:1, so a forged
# value could otherwise unpack to megabytes (a zip bomb); an honest table holds far less.
MAX_TABLE_JSON_BYTES = 256 * 1024
MAX_TABLE_ROWS = MAX_ROWS  # rows in a link: the default limit of requests per run
BASE64URL = re.compile(r"[A-Za-z0-9_-]+")


def preset_or_table(preset_name: str | None, rows) -> tuple[str | None, list | None]:
    """``(preset, None)`` for a preset's table (the dropdown's, or any preset it equals), else
    ``(None, rows)``; without ``rows``: the dropdown's preset."""
    shipped = presets.load_presets()
    chosen = preset_name if preset_name in shipped else None
    if rows is None:
        return chosen, None
    rows = listed_rows(rows)
    specs = _specs(rows)
    if specs is not None:
        for name in [chosen, *shipped] if chosen else shipped:
            if _specs(presets.apply_preset(name)[0]) == specs:
                return name, None
    return None, rows


def listed_rows(rows) -> list[list]:
    if hasattr(rows, "values") and hasattr(rows, "columns"):  # a pandas DataFrame
        rows = rows.values.tolist()
    return [list(row) for row in rows or []]


def _specs(rows) -> list | None:
    try:
        return parse_table(rows)
    except ValueError:
        return None


def compact_rows(rows) -> list[list]:
    """Rows as short JSON-ready lists, blanks dropped from row ends (``table_row`` pads back)."""
    compact = []
    for row in rows or []:
        cells = [_cell(cell) for cell in list(row)[: len(TABLE_COLUMNS)]]
        while cells and cells[-1] is None:
            cells.pop()
        if len(cells) == 3 and cells[2] == 0:
            cells.pop()
        if cells:
            compact.append(cells)
    return compact


def _cell(value):
    """A cell as JSON: None for blank, a plain int, float or str (an infinity as text)."""
    value = value.item() if hasattr(value, "item") else value
    if value is None or isinstance(value, bool):  # no table column holds a bool
        return None if value is None else str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if not math.isfinite(value):
            return str(value)
        return int(value) if value.is_integer() else value
    if isinstance(value, int):
        return value
    text = str(value)
    return text if text.strip() else None


def encode_table(rows) -> str:
    """The ``table=`` value for ``rows``; ValueError over ``MAX_TABLE_CHARS``,
    ``MAX_TABLE_JSON_BYTES`` or ``MAX_TABLE_ROWS``, or for a cell that cannot be written."""
    compact = compact_rows(rows)
    if len(compact) > MAX_TABLE_ROWS:
        raise ValueError(f"{len(compact)} rows, over the {MAX_TABLE_ROWS} a link holds")
    data = json.dumps(compact, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    if len(data) > MAX_TABLE_JSON_BYTES:
        raise ValueError(f"{len(data):,} bytes of text, over the {MAX_TABLE_JSON_BYTES:,} allowed")
    text = base64.urlsafe_b64encode(zlib.compress(data, 9)).decode("ascii").rstrip("=")
    if len(text) > MAX_TABLE_CHARS:
        raise ValueError(f"{len(text):,} characters packed, over the {MAX_TABLE_CHARS:,} allowed")
    return text


def decode_table(text: str) -> list[list]:
    """Full table rows from a ``table=`` value, reading at most ``MAX_TABLE_CHARS`` and unpacking
    at most ``MAX_TABLE_JSON_BYTES``; ValueError saying what is wrong with it."""
    if len(text) > MAX_TABLE_CHARS:
        raise ValueError(f"longer than the {MAX_TABLE_CHARS:,} characters a link's table may have")
    try:
        if not BASE64URL.fullmatch(text):
            raise binascii.Error
        packed = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("not a table this page wrote (not base64url text)") from None
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(packed, MAX_TABLE_JSON_BYTES + 1)  # never more than this
    except zlib.error:
        raise ValueError("damaged (not zlib-compressed data)") from None
    if len(data) > MAX_TABLE_JSON_BYTES or inflater.unconsumed_tail:
        raise ValueError(f"it unpacks to over {MAX_TABLE_JSON_BYTES:,} bytes")
    if not inflater.eof or inflater.unused_data:
        raise ValueError("damaged (cut short, or with bytes after its end)")
    try:
        rows = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ValueError("damaged (not JSON text)") from None
    _check_shape(rows)
    return [presets.table_row(row) for row in rows]


def _check_shape(rows) -> None:
    """ValueError unless ``rows`` is at most ``MAX_TABLE_ROWS`` lists of text, numbers or null."""
    if not isinstance(rows, list) or len(rows) > MAX_TABLE_ROWS:
        raise ValueError(f"not a list of at most {MAX_TABLE_ROWS} request rows")
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, list) or not 1 <= len(row) <= len(TABLE_COLUMNS):
            raise ValueError(f"row {number} is not a list of 1 to {len(TABLE_COLUMNS)} cells")
        for cell in row:
            plain = cell is None or (isinstance(cell, str | int) and not isinstance(cell, bool))
            if not (plain or (isinstance(cell, float) and math.isfinite(cell))):
                raise ValueError(f"row {number} has a cell that is no text, number or blank")
