"""The page's links and workload files: what a workshop teacher hands out and what people take home.

* Links that reproduce a setup: ``?preset=SLUG&slots=N&step=N``. ``engine.playground.from_link``
  applies the preset and the slot count when the page opens; ``step`` cannot be shown before a
  run exists, so ``link_step`` keeps it and ``apply_link_step`` moves the step slider there once,
  after the first run (later runs start at their default step again). ``setup_query`` writes
  such a query for the current page; the page adds its own address in the browser.
* Workload files: ``upload_workload`` fills the request table from a CSV or JSONL file;
  ``table_files`` writes the table as both.

Handlers are plain functions. Bad input is told in a warning toast whose message names the file
line or table row, and changes nothing on the page; a ``gr.Error`` would also lay an error badge
over the request table (as the Run button's handler, which says it in the status line too).
"""

from __future__ import annotations

import tempfile
from urllib.parse import urlencode

import gradio as gr

from engine import presets, workload_files
from engine.workload import parse_table

MAX_SLOTS = 16  # the slot slider's maximum

# Runs in the browser after ``setup_query``: prefix the page's own address (right behind a proxy
# or inside a Space's iframe too), copy it to the clipboard where allowed, and show it.
COPY_LINK_JS = """(query) => {
    const url = window.location.origin + window.location.pathname + query;
    try { navigator.clipboard.writeText(url).catch(() => {}); } catch (e) {}
    return url;
}"""


def setup_query(preset_name: str | None, num_slots, step_index, state) -> str:
    """The query string that reproduces this setup, e.g. ``?preset=seed&slots=3&step=12``.

    The preset is left out when the table is not a preset (after an upload); the step only when a
    run exists. An edited table is not in the link: only presets travel by link.
    """
    params = {}
    preset = presets.load_presets().get(preset_name or "")
    if preset is not None:
        params["preset"] = preset.get("slug") or preset_name
    params["slots"] = int(num_slots or 1)
    if state is not None:
        params["step"] = int(step_index or 0)
    return "?" + urlencode(params)


def link_step(request: gr.Request) -> int | None:
    """The link's ``step=N`` (a whole number >= 0), kept until the first run; None if absent."""
    params = dict(request.query_params) if request is not None else {}
    step = params.get("step", "").strip()
    return int(step) if step.isdigit() else None


def apply_link_step(state, pending_step: int | None) -> tuple:
    """After a run: the step slider at the link's step (clamped to the run), and the kept step
    cleared. Without a run or a kept step, nothing changes."""
    if state is None or pending_step is None:
        return gr.skip(), gr.skip()
    return min(max(int(pending_step), 0), max(state.num_steps - 1, 0)), None


def upload_workload(path: str | None) -> tuple:
    """Fill the request table from an uploaded CSV or JSONL file.

    Returns the table rows, the preset dropdown (cleared: the table is no preset now) and the
    explanation text; for a malformed file, a warning naming the file and the bad line, and no
    change.
    """
    if not path:
        return gr.skip(), gr.skip(), gr.skip()
    try:
        specs = workload_files.load_workload_file(path)
    except ValueError as exc:
        gr.Warning(str(exc), title="Not loaded")
        return gr.skip(), gr.skip(), gr.skip()
    arrivals = sum(spec.arrival_s > 0 for spec in specs)
    text = f"Uploaded {len(specs)} request{'s' if len(specs) != 1 else ''}"
    text += f", {arrivals} arriving after t = 0." if arrivals else "."
    return workload_files.table_rows(specs), None, text


def table_files(rows) -> list[str]:
    """The request table as ``workload.csv`` and ``workload.jsonl`` in a fresh temporary folder.

    Raises:
        ValueError: the table does not validate (the message names the row).
    """
    if hasattr(rows, "values") and hasattr(rows, "columns"):  # a pandas DataFrame
        rows = rows.values.tolist()
    specs = parse_table(rows)
    folder = tempfile.mkdtemp(prefix="cbp-table-")
    return [str(p) for p in workload_files.write_table_files(folder, specs)]


def show_table_files(rows) -> gr.File:
    """``table_files`` shown in the page's (until then hidden) file box; for a table that does
    not validate, a warning naming the row, and the file box as it was."""
    try:
        return gr.File(value=table_files(rows), visible=True)
    except ValueError as exc:
        gr.Warning(str(exc), title="No download")
        return gr.skip()
