"""The settings panel: preset, slots, checks, the engine knobs, precision, Run and Stop, the link.
Knobs are built from their declarations (``engine.knobs``); this panel lays out their places.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, make_dataclass
from itertools import groupby

import gradio as gr

from engine.knobs import KNOB, KNOBS, Knob
from engine.page.inputs import link_query, presets
from engine.page.panels import knob_widgets, server_panels
from engine.serving.run_control import run_time_limit_s

# Each policy's hover text, by its label (assets/page.js sets it as the choice's title).
POLICY_LABELS = [label for label, _ in KNOB["policy"].labels]
POLICY_HELP = dict(zip(POLICY_LABELS, KNOB["policy"].hovers, strict=True))


# The knobs this panel shows (the x axis sits over the timelines: ``results_panel``).
PANEL_PLACES = ("model", "setup", "engine", "precision")


@dataclass(kw_only=True)
class SettingsControls:
    """The panel's components that are no knob: preset, Run and Stop, the setup link, notes."""

    preset_dropdown: gr.Dropdown
    precision_markdown: gr.Markdown  # what batch-invariant mode does, and where it does not reach
    run_button: gr.Button
    stop_button: gr.Button
    link_button: gr.Button
    link_textbox: gr.Textbox
    stop_reply_textbox: gr.Textbox  # hidden: what Stop found ("running", "queued", "idle")
    leave_queue_button: gr.Button  # hidden: clicked by the page to take a queued run out
    servers_checkbox: gr.CheckboxGroup | None = None  # the host's servers (hidden if none)
    run_note_markdown: gr.Markdown | None = None  # under Run: queued, running, shown at once
    live_button: gr.Button | None = None  # "Run live anyway", after a run shown at once
    # Run's ``replay_recent``: False as the /run API's default; the page sets it True on load
    replay_checkbox: gr.Checkbox | None = None
    live_state: gr.State | None = None  # "Run live anyway"'s ``replay_recent``: False
    click_number: gr.Number | None = None  # hidden: a press's or Stop's click number (RunHandle)
    # the host's precisions and models (a ``link_query.Precision``): what a link may choose
    precision_state: gr.State | None = None


SettingsPanel = make_dataclass(
    "SettingsPanel",
    [(k.elem_id, gr.components.Component) for k in KNOBS if k.place in PANEL_PLACES],
    bases=(SettingsControls,),
    kw_only=True,
)
SettingsPanel.__module__ = __name__
SettingsPanel.__doc__ = """Preset, slots, checks, the engine settings, Run and Stop, and the setup
link: the controls, and one field per knob of ``PANEL_PLACES`` named by its element id
(``Knob.elem_id``: ``slots_slider``, ``kv_mode_dropdown``)."""


HOST_PRECISION = link_query.Precision()  # the embedded model in float32 or bfloat16, no picker


def settings_panel(
    chat_template: bool, server_names: list[str] = (), precision=HOST_PRECISION
) -> SettingsPanel:
    """The right-hand column: knobs in a closed accordion, precision last; a model picker where
    the host's ``precision`` (a ``link_query.Precision``) offers several models."""
    models = list(precision.models) or [precision.model]
    dtypes, dtype = list(precision.dtypes), precision.dtype
    host = {  # what the host, not the knob's declaration, gives these components
        "model": {"choices": models, "value": models[0], "visible": len(models) > 1},
        "dtype": {"choices": dtypes, "value": dtype},
        "chat_template": {"value": chat_template},
    }
    knobs = _place_knobs("model", host)
    preset_dropdown = gr.Dropdown(
        choices=list(presets.load_presets()),
        value=presets.DEFAULT_PRESET,
        label="Preset",
        elem_id="preset_dropdown",
    )
    knobs |= _place_knobs("setup", host)
    servers = server_panels.servers_checkbox(list(server_names))
    with gr.Accordion("Engine settings", open=False):
        knobs |= _place_knobs("engine", host)
        with gr.Row():
            knobs |= _place_knobs("precision", host)
        precision_markdown = gr.Markdown("", elem_id="precision_markdown")
    run_note, live_button, run_button, stop_button = _run_controls()
    link_button, link_textbox, stop_reply, leave_queue = _link_controls()
    return SettingsPanel(
        preset_dropdown=preset_dropdown,
        precision_markdown=precision_markdown,
        run_button=run_button,
        stop_button=stop_button,
        link_button=link_button,
        link_textbox=link_textbox,
        stop_reply_textbox=stop_reply,
        leave_queue_button=leave_queue,
        servers_checkbox=servers,
        run_note_markdown=run_note,
        live_button=live_button,
        replay_checkbox=gr.Checkbox(False, visible=False, elem_id="replay_checkbox"),
        live_state=gr.State(False),
        click_number=gr.Number(0, visible=False, precision=0, elem_id="click_number"),
        precision_state=gr.State(precision),
        **knobs,
    )


def placed(place: str) -> list[Knob]:
    """The knobs at ``place``: those a preset sets first, then the rest in ``KNOBS`` order."""
    return sorted((k for k in KNOBS if k.place == place), key=lambda k: (not k.preset, k.preset))


def _place_knobs(place: str, host: dict[str, dict]) -> dict:
    """``place``'s knob components by element id; one ``row`` shares a ``gr.Row``."""
    found = {}
    for row, knobs in groupby(placed(place), key=lambda k: k.row):
        with gr.Row() if row else nullcontext():
            found |= {
                k.elem_id: knob_widgets.knob_component(k, **host.get(k.name, {})) for k in knobs
            }
    return found


def _link_controls() -> tuple:
    """E.g. "Copy link to this setup" and its textbox, the hidden Stop reply, "Leave the queue"."""
    link_button = gr.Button("Copy link to this setup", size="sm", elem_id="link_button")
    link_textbox = gr.Textbox(
        label="Link: preset or table, slots, step and engine settings",
        interactive=False,
        buttons=["copy"],
        elem_id="link_textbox",
    )
    stop_reply = gr.Textbox(visible="hidden", elem_id="stop_reply_textbox")
    leave_queue = gr.Button("Leave the queue", visible="hidden", elem_id="leave_queue_button")
    return link_button, link_textbox, stop_reply, leave_queue


def _run_controls() -> tuple:
    """The note under the settings, "Run live anyway", Run, Stop."""
    run_note = gr.Markdown(run_note_text(), elem_id="run_note_markdown")
    live_button = gr.Button(
        "Run live anyway", size="sm", visible=False, elem_id="live_button", variant="secondary"
    )
    with gr.Row():
        run_button = gr.Button("Run", variant="primary", elem_id="run_button")
        stop_button = gr.Button("Stop", variant="stop", elem_id="stop_button")
    return run_note, live_button, run_button, stop_button


def run_note_text() -> str:
    """The note under Run before a run: runs take turns, and the host's limit for one."""
    try:
        limit_s = run_time_limit_s()
    except ValueError:  # a bad host setting: the Run itself says so
        limit_s = None
    limit = f" Each run may take up to {limit_s:g} s here." if limit_s else ""
    return f"Runs take turns on the model, one at a time.{limit}"
