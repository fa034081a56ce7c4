"""The page's links and workload files: what a workshop teacher hands out and what people take home.

* Links that reproduce a setup: ``?preset=SLUG&slots=N&step=N``, and ``&prefix_caching=1`` when
  that toggle is on (links without it keep working, the toggle off). ``from_link`` applies the
  preset, the slot count and the toggle when the page opens; ``step`` cannot be shown before a
  run exists, so
  ``link_step`` keeps it and ``apply_link_step`` moves the step slider there once, after the
  first run (later runs start at their default step again). A value the page cannot use is named
  in a warning, with what the page uses instead. ``setup_query`` writes such a query for the
  current page; the page adds its own address in the browser.
* Workload files: ``upload_workload`` fills the request table from a CSV or JSONL file, sampling
  settings included; ``table_files`` writes the table as both (``engine.workloads.workload_files``).

Handlers are plain functions. Bad input is told in a warning toast whose message names the file
line or table row, and changes nothing on the page; a ``gr.Error`` would also lay an error badge
over the request table (as the Run button's handler, which says it in the status line too).
"""

from __future__ import annotations

import html
import tempfile
from urllib.parse import urlencode

import gradio as gr

from engine.page.inputs import presets
from engine.sampling_params import samples
from engine.workloads import workload_files
from engine.workloads.workload import parse_table

MAX_SLOTS = 16  # the slot slider's maximum
DEFAULT_SLOTS = 3  # the slot slider's value when the page opens
MAX_QUOTED_CHARS = 40  # of a bad link value, quoted in a warning
# What a link sets, in ``from_link``'s output order: the preset and its text, and the Run settings
# it sets, by their ``RunSettings`` field names (``engine.page.run.run_options``); app.py finds
# their components by these names (``engine.page.panels.page_panels.COMPONENTS``).
LINK_OUTPUTS = ("preset", "rows", "chat_template", "preset_text", "num_slots", "prefix_caching")

# Runs in the browser after ``setup_query``: prefix the page's own address (right behind a proxy
# or inside a Space's iframe too), copy it to the clipboard where allowed, and show it.
COPY_LINK_JS = """(query) => {
    const url = window.location.origin + window.location.pathname + query;
    try { navigator.clipboard.writeText(url).catch(() => {}); } catch (e) {}
    return url;
}"""


# Runs in the browser after Stop: a run still waiting in Gradio's queue (Stop answers "queued" only
# on ZeroGPU, engine.page.run.run_handle) is taken out of it by the hidden button whose click
# cancels the Run events (immediate for an event that has not started).
LEAVE_QUEUE_JS = """(reply) => {
    if (reply === "queued") document.getElementById("leave_queue_button")?.click();
    return [];
}"""


# Run in the browser before ``run_pressed`` and ``stop_event``: the press carries the number of
# the latest click on Run (or "Run live anyway"), Stop its own, in the page's one sequence of
# clicks (``assets/page.js``), by which the server acts in click order and tells Gradio's replay
# of a deferred click from a new click (``engine.page.run.run_handle``).
RUN_CLICK_JS = """(handle, seq) => [handle, window.cbpRunClick || 0]"""
STOP_CLICK_JS = """(handle, seq) => [handle, window.cbpStopClick || 0]"""


def setup_query(
    preset_name: str | None, num_slots, step_index, state, prefix_caching: bool = False
) -> str:
    """The query string that reproduces this setup, e.g. ``?preset=seed&slots=3&step=12``.

    The preset is left out when the table is not a preset (after an upload); the step only when a
    run exists; ``prefix_caching=1`` only when the toggle is on (a link without it: off, as
    before the toggle existed). An edited table is not in the link: only presets travel by link.
    """
    params = {}
    preset = presets.load_presets().get(preset_name or "")
    if preset is not None:
        params["preset"] = preset.get("slug") or preset_name
    params["slots"] = int(num_slots or 1)
    if state is not None:
        params["step"] = int(step_index or 0)
    if prefix_caching:
        params["prefix_caching"] = 1
    return "?" + urlencode(params)


def from_link(request: gr.Request) -> tuple:
    """Preset the page from its link: ``?preset=SLUG&slots=N&prefix_caching=1``; a bad value is
    named in a warning. A preset without ``slots`` brings the slot count its explanation speaks of;
    ``slots`` other than those adds a line to the explanation that says so (``slots_note``).

    Returns updates for ``LINK_OUTPUTS``: the preset dropdown, request table, chat checkbox,
    preset text, slots and the prefix-caching toggle (``gr.skip()`` where the link sets nothing
    usable: the page keeps its defaults).
    """
    params = _query_params(request)
    link = {"prefix_caching": _link_flag(params, "prefix_caching")}
    preset = params.get("preset", "").strip()
    name = presets.by_slug(preset) if preset else None
    if name is not None:
        rows, chat_template, text = presets.apply_preset(name)
        link |= {"preset": name, "rows": rows, "chat_template": chat_template, "preset_text": text}
    elif preset:
        slugs = ", ".join(p["slug"] for p in presets.load_presets().values() if p.get("slug"))
        shown = f"showing “{presets.DEFAULT_PRESET}” (presets: {slugs})"
        _warn_link("preset", preset, f"no such preset; {shown}")
    slots = params.get("slots", "").strip()
    fallback = presets.preset_slots(name) if name is not None else None  # what its text says
    if fallback is not None:
        link["num_slots"] = fallback
    if slots.isdigit() and 1 <= int(slots) <= MAX_SLOTS:
        link["num_slots"] = int(slots)
        shown = name if name is not None else presets.DEFAULT_PRESET  # whose text the page shows
        if int(slots) != presets.preset_slots(shown):
            text = link.get("preset_text") or presets.apply_preset(shown)[2]
            link["preset_text"] = text + slots_note(int(slots), presets.preset_slots(shown))
    elif slots:
        used = fallback or DEFAULT_SLOTS
        using = "1 slot" if used == 1 else f"{used} slots"
        why = f"not a whole number from 1 to {MAX_SLOTS}; using {using}"
        _warn_link("slots", slots, why)
    return tuple(link.get(name, gr.skip()) for name in LINK_OUTPUTS)


def slots_note(num_slots: int, preset_slots: int) -> str:
    """The line under a preset's explanation when a link set other slots than it speaks of, so
    the page does not contradict itself ("at 3 slots" beside a slider at 2)."""
    return (
        f"\n\n*This link set {num_slots} {'slot' if num_slots == 1 else 'slots'}; the "
        f"explanation above speaks of {preset_slots}, so its numbers may differ: set Slots to "
        f"{preset_slots} to see them as described.*"
    )


def _link_flag(params: dict[str, str], name: str):
    """A link's on/off value: ``1``/``true``/``on`` -> True, ``0``/``false``/``off`` -> False;
    ``gr.skip()`` when absent or unreadable (named in a warning)."""
    value = params.get(name, "").strip()
    if value.lower() in ("1", "true", "on", "yes"):
        return True
    if value.lower() in ("0", "false", "off", "no"):
        return False
    if value:
        _warn_link(name, value, "use 1 (on) or 0 (off); the page keeps it off")
    return gr.skip()


def link_step(request: gr.Request) -> int | None:
    """The link's ``step=N`` (a whole number >= 0), kept until the first run; None if absent or
    bad (a bad one is named in a warning)."""
    step = _query_params(request).get("step", "").strip()
    if step and not step.isdigit():
        _warn_link("step", step, "not a whole number >= 0; runs start at their default step")
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
    sampled = sum(samples(spec.sampling) for spec in specs)
    text = f"Uploaded {len(specs)} request{'s' if len(specs) != 1 else ''}"
    text += f", {arrivals} arriving after t = 0" if arrivals else ""
    text += f", {sampled} sampled (the others greedy)" if sampled else ""
    return workload_files.table_rows(specs, sampling_columns=True), None, text + "."


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


def _query_params(request: gr.Request | None) -> dict[str, str]:
    return dict(request.query_params) if request is not None else {}


def _warn_link(name: str, value: str, instead: str) -> None:
    """A warning toast: the link's ``name=value`` (clipped, as plain text) is unusable, and why."""
    if len(value) > MAX_QUOTED_CHARS:
        value = value[:MAX_QUOTED_CHARS] + "…"
    gr.Warning(f"The link's {name}={html.escape(value)!r} is ignored: {instead}.", title="Link")
