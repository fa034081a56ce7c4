"""The settings panel: preset, slots, checks, the engine knobs, precision, Run and Stop, the link.

Built in the right-hand column beside the request editor. Each knob's component takes its label,
help, range and default from the knob's declaration (``engine.knobs``); which widget it is, and
where, is this panel's.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from engine.knobs import KNOB
from engine.page.inputs import link_query, presets
from engine.page.panels import server_panels
from engine.serving.run_control import run_time_limit_s

# Each policy's hover text, by its label (assets/page.js sets it as the choice's title).
POLICY_LABELS = [label for label, _ in KNOB["policy"].labels]
POLICY_HELP = dict(zip(POLICY_LABELS, KNOB["policy"].hovers, strict=True))


@dataclass
class SettingsPanel:
    """Preset, slots, checks, the engine settings, Run and Stop, and the setup link."""

    preset_dropdown: gr.Dropdown
    slots_slider: gr.Slider
    chat_checkbox: gr.Checkbox
    reference_checkbox: gr.Checkbox
    kv_mode_dropdown: gr.Dropdown
    kv_budget_number: gr.Number
    block_size_number: gr.Number
    prefix_caching_checkbox: gr.Checkbox
    token_budget_number: gr.Number
    policy_radio: gr.Radio
    arrival_rate_number: gr.Number
    compare_hf_checkbox: gr.Checkbox
    dtype_dropdown: gr.Dropdown
    batch_invariant_checkbox: gr.Checkbox
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
    model_dropdown: gr.Dropdown | None = None  # the host's models; hidden where it has one


def settings_panel(
    chat_template: bool,
    server_names: list[str] = (),
    dtypes: list[str] = ("float32", "bfloat16"),
    dtype: str = "float32",
    models: list[str] = (),
) -> SettingsPanel:
    """The right-hand column of settings; the engine knobs sit in a closed accordion, the
    precision (one of ``dtypes``, ``dtype`` first chosen) and batch-invariant mode last in it.
    ``models``: the host's (``allowlist.offered_models``), the loaded one first; the model
    picker on top is shown where there are several."""
    models, dtypes = list(models) or ["embedded"], list(dtypes)
    model_dropdown = gr.Dropdown(
        models,
        value=models[0],
        label=KNOB["model"].label,
        info=KNOB["model"].info,
        visible=len(models) > 1,
        elem_id="model_dropdown",
    )
    preset_dropdown, slots_slider, chat_checkbox, reference_checkbox = _setup_inputs(chat_template)
    servers = server_panels.servers_checkbox(list(server_names))
    with gr.Accordion("Engine settings", open=False):
        knobs = _engine_knobs()
        precision = _precision_knobs(dtypes, dtype)
    run_note, live_button, run_button, stop_button = _run_controls()
    link_button, link_textbox, stop_reply, leave_queue = _link_controls()
    return SettingsPanel(
        preset_dropdown,
        slots_slider,
        chat_checkbox,
        reference_checkbox,
        *knobs,
        *precision,
        run_button,
        stop_button,
        link_button,
        link_textbox,
        stop_reply,
        leave_queue,
        servers_checkbox=servers,
        run_note_markdown=run_note,
        live_button=live_button,
        replay_checkbox=gr.Checkbox(False, visible=False, elem_id="replay_checkbox"),
        live_state=gr.State(False),
        click_number=gr.Number(0, visible=False, precision=0, elem_id="click_number"),
        precision_state=gr.State(
            link_query.Precision(dtype, tuple(dtypes), models[0], tuple(models[1:] and models))
        ),
        model_dropdown=model_dropdown,
    )


def _setup_inputs(chat_template: bool) -> tuple:
    """Preset, slots, chat template and the reference check, in the panel's order."""
    preset_dropdown = gr.Dropdown(
        choices=list(presets.load_presets()),
        value=presets.DEFAULT_PRESET,
        label="Preset",
        elem_id="preset_dropdown",
    )
    slots = KNOB["num_slots"]
    slots_slider = gr.Slider(
        slots.low,
        slots.high,
        value=slots.default,
        step=1,
        label=slots.label,
        elem_id="slots_slider",
    )
    chat_checkbox = gr.Checkbox(
        value=chat_template, label=KNOB["chat_template"].label, elem_id="chat_checkbox"
    )
    reference_checkbox = _knob(gr.Checkbox, "check_reference", "reference_checkbox")
    return preset_dropdown, slots_slider, chat_checkbox, reference_checkbox


def _link_controls() -> tuple:
    """ "Copy link to this setup" and its textbox; the hidden Stop reply and "Leave the queue"."""
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
    """The note under the settings (in view when Run is pressed), "Run live anyway", Run, Stop."""
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


def _precision_knobs(dtypes: list[str], dtype: str) -> tuple:
    """The dtype, the batch-invariant toggle and its note, in ``SettingsPanel`` field order."""
    with gr.Row():
        dtype_dropdown = gr.Dropdown(
            dtypes, value=dtype, label=KNOB["dtype"].label, elem_id="dtype_dropdown"
        )
        invariant = _knob(gr.Checkbox, "batch_invariant", "batch_invariant_checkbox")
    return dtype_dropdown, invariant, gr.Markdown("", elem_id="precision_markdown")


def _engine_knobs() -> tuple:
    """The engine settings accordion's components, in ``SettingsPanel`` field order, each at its
    knob's default (a preset sets these back when chosen: ``presets.ENGINE_DEFAULTS``)."""
    kv_mode = _knob(gr.Dropdown, "kv_mode", "kv_mode_dropdown")
    with gr.Row():
        kv_budget = _knob(gr.Number, "kv_budget_mib", "kv_budget_number")
        # no precision=0 for the block size: it would round 7.5
        block_size = _knob(gr.Number, "block_size", "block_size_number")
    prefix_caching = _knob(gr.Checkbox, "prefix_caching", "prefix_caching_checkbox")
    token_budget = _knob(gr.Number, "token_budget", "token_budget_number")
    policy = _knob(gr.Radio, "policy", "policy_radio")
    arrival_rate = _knob(gr.Number, "arrival_rate", "arrival_rate_number")
    compare_hf = _knob(gr.Checkbox, "compare_hf", "compare_hf_checkbox")
    knobs = (kv_mode, kv_budget, block_size, prefix_caching, token_budget, policy, arrival_rate)
    return (*knobs, compare_hf)


def _knob(widget: type, name: str, elem_id: str):
    """Knob ``name``'s ``widget`` (a checkbox, number box, dropdown or radio) with its label,
    help and default, and a choice knob's labelled choices (``engine.knobs``)."""
    knob = KNOB[name]
    choices = {"choices": list(knob.labels)} if knob.labels else {}
    info = knob.info or None
    return widget(value=knob.default, label=knob.label, info=info, elem_id=elem_id, **choices)
