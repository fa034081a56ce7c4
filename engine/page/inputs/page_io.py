"""The page's links and workload files: what a workshop teacher hands out and what people take home.

Bad input is told in a toast and under the table (``warning_note``); the rest still applies.
Links: docs/hosting.md.
"""

from __future__ import annotations

import html
import inspect
from urllib.parse import urlencode

import gradio as gr

from engine.knobs import KNOB
from engine.page.figures.style import counted
from engine.page.inputs import link_query, link_table, presets
from engine.sampling_params import samples
from engine.workloads import export, workload_files
from engine.workloads.workload import parse_table

MAX_SLOTS = KNOB["num_slots"].high  # the slot slider's maximum
DEFAULT_SLOTS = KNOB["num_slots"].default  # the slot slider's value when the page opens
MAX_QUOTED_CHARS = 40  # of a bad link value, quoted in a warning
# What a link sets, in ``from_link``'s output order: the preset and its text, and the Run settings
# it sets, by their ``RunSettings`` field names (``engine.page.run.run_options``); app.py finds
# their components by these names (``engine.page.panels.page_panels.COMPONENTS``). The order is
# the API's: a new output goes at the end.
LINK_OUTPUTS = ("preset", "rows", "chat_template", "preset_text", "num_slots", "prefix_caching")
LINK_OUTPUTS += tuple(field for field in link_query.PARAMS if field not in LINK_OUTPUTS)
LINK_OUTPUTS += ("input_warning",)  # the link's warnings, kept in sight (``warning_note``)
# What ``setup_query`` reads, in its order (the API's: a new input goes at the end), named as in
# ``COMPONENTS``; ``previous`` is the run on the page, and ``precision`` the host's (a
# ``link_query.Precision`` in a ``gr.State``).
LINK_INPUTS = ("preset", "num_slots", "step", "previous", "prefix_caching", "rows", "precision")
LINK_INPUTS += tuple(field for field in link_query.PARAMS if field not in LINK_INPUTS)
LINK_INPUTS += ("link_step",)  # a link's step, kept until the first run (``link_step``)
LINKED_TEXT = "Requests from a link, not a preset's:"
TOO_LONG = (
    "The request table is too long for a link ({why}), so this link carries the rest of the "
    "setup without it. To share the table, download it (“Download the table” under it) and hand "
    "out the file: “Upload CSV or JSONL” loads it."
)
# Runs in the browser after ``setup_query``: prefix the page's own address (right behind a proxy
# or inside a Space's iframe too), copy it to the clipboard where allowed, and show it.
COPY_LINK_JS = """(query) => {
    const url = window.location.origin + window.location.pathname + query;
    try { navigator.clipboard.writeText(url).catch(() => {}); } catch (e) {}
    return url;
}"""


# Runs in the browser after Stop: a run still waiting in Gradio's queue (ZeroGPU) is taken out by
# the hidden button that cancels the Run events (docs/page.md, "Run and Stop, click by click").
LEAVE_QUEUE_JS = """(reply) => {
    if (reply === "queued") document.getElementById("leave_queue_button")?.click();
    return [];
}"""


# Run in the browser before ``run_pressed`` and ``stop_event``: each click's number in the page's
# one sequence (``assets/page.js``; docs/page.md, "Run and Stop, click by click").
RUN_CLICK_JS = """(handle, seq) => [handle, window.cbpRunClick || 0]"""
STOP_CLICK_JS = """(handle, seq) => [handle, window.cbpStopClick || 0]"""


def _link_signature() -> inspect.Signature:
    """``setup_query``'s parameters: the first four required, the rest default."""
    kind, required = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty
    default = {"prefix_caching": False} | dict.fromkeys(LINK_INPUTS[5:])
    parameters = [inspect.Parameter(n, kind, default=default.get(n, required)) for n in LINK_INPUTS]
    return inspect.Signature(parameters)


LINK_SIGNATURE = _link_signature()


def setup_query(*values, **named) -> str:
    """The query that reproduces this setup, e.g. ``?preset=seed&slots=3&step=12&budget=64``,
    from ``LINK_INPUTS`` by position or name; settings only where they differ from the preset's."""
    given = LINK_SIGNATURE.bind(*values, **named)
    given.apply_defaults()
    page = given.arguments
    name, table = link_table.preset_or_table(page["preset"], page["rows"])
    params = {}
    if name is not None:
        params["preset"] = presets.load_presets()[name].get("slug") or name
    params["slots"] = int(page["num_slots"] or 1)
    if page["previous"] is not None and getattr(page["previous"], "recorded", None) is None:
        params["step"] = int(page["step"] or 0)  # a run of this page's, not the recorded one
    elif page["link_step"] is not None:  # the step the page was linked at passes on, unspent
        params["step"] = int(page["link_step"])
    precision = page["precision"] or link_query.Precision()
    defaults = link_query.page_defaults(name or presets.DEFAULT_PRESET, precision)
    params |= link_query.settings_params(page, defaults)
    if table is not None:
        try:
            params["table"] = link_table.encode_table(table)
        except ValueError as exc:
            gr.Warning(TOO_LONG.format(why=html.escape(str(exc))), title="Link")
    return "?" + urlencode(params)


setup_query.__signature__ = LINK_SIGNATURE  # its inputs, by name, for help() and Gradio


def from_link(request: gr.Request, precision: link_query.Precision | None = None) -> tuple:
    return from_query(query_params(request), precision)


def from_query(
    params: dict[str, str], precision: link_query.Precision | None = None, whole: bool = False
) -> tuple:
    """Updates for ``LINK_OUTPUTS`` from a link's query (``gr.skip()`` where nothing usable); bad
    values are named and keep their default. ``whole``: also set what the preset sets (the tour)."""
    precision = precision or link_query.Precision()
    link = {}
    name = _link_preset(params, link)
    _link_slots(params, name, link)
    _link_table(params, link)
    defaults = link_query.page_defaults(name or presets.DEFAULT_PRESET, precision)
    opened = link_query.page_defaults(presets.DEFAULT_PRESET, precision)  # the page as it opens
    reset = ("chat_template", *presets.ENGINE_DEFAULTS) if whole else ()
    link |= {f: v for f, v in defaults.items() if f not in link and (v != opened[f] or f in reset)}
    settings, bad = link_query.link_settings(params, defaults, precision)
    for parameter, value, why in bad:
        _warn_link(link, parameter, value, why)
    step = params.get("step", "").strip()  # kept by ``link_step``; said here, with the rest
    if step and not step.isdigit():
        _warn_link(link, "step", step, "not a whole number >= 0; runs start at their default step")
    link |= settings
    if name is not None and "preset_text" in link:
        link["preset_text"] += switched_note(name, settings)
    if link.get("input_warning"):
        link["input_warning"] = warning_note("Link", link["input_warning"])
    elif whole:
        link["input_warning"] = ""
    return tuple(link.get(output, gr.skip()) for output in LINK_OUTPUTS)


def _link_preset(params: dict[str, str], link: dict) -> str | None:
    """The link's preset name (its rows, chat template and text put in ``link``), or None."""
    preset = params.get("preset", "").strip()
    name = presets.by_slug(preset) if preset else None
    if name is not None:
        rows, chat_template, text = presets.apply_preset(name)
        link |= {"preset": name, "rows": rows, "chat_template": chat_template, "preset_text": text}
    elif preset:
        slugs = ", ".join(p["slug"] for p in presets.load_presets().values() if p.get("slug"))
        shown = f"showing “{presets.DEFAULT_PRESET}” (presets: {slugs})"
        _warn_link(link, "preset", preset, f"no such preset; {shown}")
    return name


def _link_slots(params: dict[str, str], name: str | None, link: dict) -> None:
    """The link's slots in ``link`` (else the preset's), with ``slots_note`` when they differ."""
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
        why = f"not a whole number from 1 to {MAX_SLOTS}; using {counted(used, 'slot')}"
        _warn_link(link, "slots", slots, why)


def _link_table(params: dict[str, str], link: dict) -> None:
    """The link's ``table=`` in ``link``: bad rows applied and named, a bad value ignored."""
    text = params.get("table", "").strip()
    if not text:
        return
    try:
        rows = link_table.decode_table(text)
    except ValueError as exc:
        _warn_link(link, "table", text, f"{exc}; the page keeps its table")
        return
    try:
        summary = f" {table_summary(parse_table(rows))}."
    except ValueError as exc:
        message = "The link's table has rows to fix before Run: "
        gr.Warning(message + html.escape(str(exc)), title="Link")
        link.setdefault("input_warning", []).append(message + str(exc))
        summary = " some rows need fixing before Run (the warning names them)."
    link |= {"preset": None, "rows": rows, "preset_text": LINKED_TEXT + summary}


def table_summary(specs) -> str:
    """E.g. "3 requests, 1 arriving after t = 0, 2 sampled (the others greedy)"."""
    arrivals = sum(spec.arrival_s > 0 for spec in specs)
    sampled = sum(samples(spec.sampling) for spec in specs)
    text = counted(len(specs), "request")
    text += f", {arrivals} arriving after t = 0" if arrivals else ""
    return text + (f", {sampled} sampled (the others greedy)" if sampled else "")


def slots_note(num_slots: int, preset_slots: int) -> str:
    """The line under a preset's explanation when a link set other slots than it speaks of."""
    return (
        f"\n\n*This link set {counted(num_slots, 'slot')}; the "
        f"explanation above speaks of {preset_slots}, so its numbers may differ: set Slots to "
        f"{preset_slots} to see them as described.*"
    )


def switched_note(name: str, settings: dict) -> str:
    """The line under a preset's text when the link already did what it asks; "" otherwise."""
    switch = presets.load_presets()[name].get("check", {}).get("lower_mean_ttft")
    if switch is None or settings.get(switch) is not True:
        return ""
    what = switch.replace("_", " ")
    return (
        f"\n\n*This link turned {what} on already: Run measures the run with it; turn it off "
        "under Engine settings to see the run without.*"
    )


def link_step(request: gr.Request) -> int | None:
    return query_step(query_params(request))


def query_step(params: dict[str, str]) -> int | None:
    """A link's ``step=N`` (a whole number >= 0); None if absent or bad."""
    step = params.get("step", "").strip()
    return int(step) if step.isdigit() else None


def upload_workload(path: str | None) -> tuple:
    """Fill the table from an uploaded CSV or JSONL file (a bad one changes only the note)."""
    if not path:
        return gr.skip(), gr.skip(), gr.skip(), gr.skip()
    try:
        specs = workload_files.load_workload_file(path)
    except ValueError as exc:
        gr.Warning(toast_text(exc), title="Not loaded")
        return gr.skip(), gr.skip(), gr.skip(), warning_note("Not loaded", [str(exc)])
    text = f"Uploaded {table_summary(specs)}."
    return workload_files.table_rows(specs, sampling_columns=True), None, text, ""


def table_files(rows) -> list[str]:
    """The table as ``workload.csv`` and ``workload.jsonl`` in a new folder (ValueError: bad
    row)."""
    specs = parse_table(link_table.listed_rows(rows))
    folder = export.download_folder("cbp-table-")
    return [str(p) for p in workload_files.write_table_files(folder, specs)]


def show_table_files(rows) -> tuple:
    """``table_files`` shown in the file box, the note cleared; a bad table's row named instead."""
    try:
        return gr.File(value=table_files(rows), visible=True), ""
    except ValueError as exc:
        gr.Warning(toast_text(exc), title="No download")
        return gr.skip(), warning_note("No download", [str(exc)])


def warning_note(title: str, messages: list[str]) -> str:
    """The note under the table that keeps the last warnings in sight, each shown as written."""
    items = "".join(f"<li>{html.escape(message, quote=False)}</li>" for message in messages)
    title = html.escape(title, quote=False)
    return f'<div class="input-warning">⚠ <strong>{title}:</strong><ul>{items}</ul></div>'


def query_params(request: gr.Request | None) -> dict[str, str]:
    return dict(request.query_params) if request is not None else {}


def _warn_link(link: dict, name: str, value: str, instead: str) -> None:
    """A warning toast that the link's ``name=value`` is unusable, also kept in ``link``."""
    if len(value) > MAX_QUOTED_CHARS:
        value = value[:MAX_QUOTED_CHARS] + "…"
    why = toast_text(instead)
    gr.Warning(f"The link's {name}={html.escape(value)!r} is ignored: {why}.", title="Link")
    link.setdefault("input_warning", []).append(
        f"The link's {name}={value!r} is ignored: {instead}."
    )


def toast_text(message) -> str:
    """``message`` as a toast's HTML: escaping ``&`` and ``<`` is enough for no tag to form."""
    return str(message).replace("&", "&amp;").replace("<", "&lt;")
