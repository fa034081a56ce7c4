"""The settings panel: preset, slots, checks, the engine knobs, precision, Run and Stop, the link.

``app.py`` builds it in the right-hand column beside the request editor and wires its components'
events (``engine.page.panels.page_panels.run_inputs`` lists what Run reads from it). It is its own
module because it is the page's largest panel: the KV cache, token budget, arrival and precision
knobs each carry labels and help text. Element ids (``elem_id``) are a contract: the browser tests
and users' scripts find components by them.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from engine.page.inputs import link_query, page_io, presets
from engine.page.panels import server_panels
from engine.serving.run_control import run_time_limit_s

# Short enough to show whole in the settings column (about 24 characters at 1,000 px): each
# one's meaning is in KV_MODE_INFO under the dropdown, which wraps.
KV_MODES = [
    ("paged (vLLM's blocks)", "paged"),
    ("in place, per slot", "slots"),
    ("concatenation (slow)", "concat"),
]
KV_MODE_INFO = (
    "Paged: blocks from a memory budget, with preemption, as vLLM. In place: each slot's own "
    "rows. Concatenation: the article's, O(n²)."
)
POLICIES = [
    ("decode first", "decode_first"),
    ("prefill first", "prefill_first"),
    ("vLLM's order", "vllm"),  # last: the /run API's values for the others stay as they were
]
# Each policy's hover text, by its label (assets/page.js sets it as the choice's title).
POLICY_HELP = {
    "decode first": "Running sequences' decodes take the token budget first; a prompt's "
    "prefill (chunked if need be) gets what is left.",
    "prefill first": "Prompts' prefills take the token budget first; decodes get what is left.",
    "vLLM's order": "vLLM V1's own scheduling, step for step: running requests in admission "
    "order, then waiting ones while budget is left; when blocks run out the newest running "
    "request is preempted (engine/serving/scheduler.py).",
}
SHOWN = link_query.PAGE_DEFAULTS  # what the page opens with (a link writes only other values)
PREFIX_CACHING_INFO = (
    "A prompt's full blocks that an earlier request computed are shared, not prefilled again "
    "(vLLM's automatic prefix caching); the block map shows shared blocks and the mask the keys "
    "taken from the cache. Paged KV mode only. The static engine cannot share: its waves "
    "prefill every prompt in full."
)


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
    # the host's precisions (a ``link_query.Precision``): what a link may choose and leaves out
    precision_state: gr.State | None = None


def settings_panel(
    chat_template: bool,
    server_names: list[str] = (),
    dtypes: list[str] = ("float32", "bfloat16"),
    dtype: str = "float32",
) -> SettingsPanel:
    """The right-hand column of settings; the engine knobs sit in a closed accordion, the
    precision (one of ``dtypes``, ``dtype`` first chosen) and batch-invariant mode last in it."""
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
        precision_state=gr.State(link_query.Precision(dtype, tuple(dtypes))),
    )


def _setup_inputs(chat_template: bool) -> tuple:
    """Preset, slots, chat template and the reference check, in the panel's order."""
    preset_dropdown = gr.Dropdown(
        choices=list(presets.load_presets()),
        value=presets.DEFAULT_PRESET,
        label="Preset",
        elem_id="preset_dropdown",
    )
    slots_slider = gr.Slider(
        1,
        page_io.MAX_SLOTS,
        value=page_io.DEFAULT_SLOTS,
        step=1,
        label="Slots (B)",
        elem_id="slots_slider",
    )
    chat_checkbox = gr.Checkbox(
        value=chat_template, label="Use chat template", elem_id="chat_checkbox"
    )
    reference_checkbox = gr.Checkbox(
        value=SHOWN["check_reference"],
        label="Check outputs against model.generate",
        elem_id="reference_checkbox",
    )
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
            dtypes, value=dtype, label="Precision (dtype)", elem_id="dtype_dropdown"
        )
        invariant = gr.Checkbox(
            value=SHOWN["batch_invariant"],
            label="Batch-invariant mode",
            elem_id="batch_invariant_checkbox",
        )
    return dtype_dropdown, invariant, gr.Markdown("", elem_id="precision_markdown")


def _engine_knobs() -> tuple:
    """The engine settings accordion's components, in ``SettingsPanel`` field order."""
    default = presets.ENGINE_DEFAULTS  # a preset sets these back when chosen
    kv_mode = gr.Dropdown(
        KV_MODES,
        value=default["kv_mode"],
        label="Continuous engine's KV cache",
        info=KV_MODE_INFO,
        elem_id="kv_mode_dropdown",
    )
    with gr.Row():
        kv_budget = gr.Number(
            value=default["kv_budget_mib"],
            label="Paged: KV budget, MiB (0 = room for every slot)",
            elem_id="kv_budget_number",
        )
        block_size = gr.Number(  # no precision=0: it rounds 7.5 quietly
            value=default["block_size"],
            label="Paged: tokens per block (1 to 256)",
            elem_id="block_size_number",
        )
    prefix_caching = gr.Checkbox(
        value=default["prefix_caching"],
        label="Paged: prefix caching",
        info=PREFIX_CACHING_INFO,
        elem_id="prefix_caching_checkbox",
    )
    token_budget = gr.Number(
        value=default["token_budget"],
        label="Token budget per step (0 = no limit)",
        elem_id="token_budget_number",
    )
    policy = gr.Radio(
        POLICIES,
        value=default["policy"],
        label="Who gets the budget first",
        elem_id="policy_radio",
    )
    arrival_rate = gr.Number(
        value=default["arrival_rate"],
        label="Arrivals: Poisson rate, requests/s (0 = the table's arrival_s)",
        elem_id="arrival_rate_number",
    )
    compare_hf = gr.Checkbox(
        value=SHOWN["compare_hf"],
        label="Also run transformers' built-in continuous batching",
        elem_id="compare_hf_checkbox",
    )
    knobs = (kv_mode, kv_budget, block_size, prefix_caching, token_budget, policy, arrival_rate)
    return (*knobs, compare_hf)
