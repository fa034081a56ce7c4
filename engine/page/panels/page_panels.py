"""Panel builders: the header and tour, the request editor and the downloads; and the page's
components by name (``COMPONENTS``)."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from types import SimpleNamespace

import gradio as gr

from engine.knobs import KNOBS
from engine.page.panels import tour
from engine.page.panels.requests_table import RequestsTable
from engine.page.panels.results_panel import ResultsPanel, by_elem_id
from engine.page.panels.settings_panel import SettingsPanel
from engine.page.run.run_options import RUN_INPUTS
from engine.page.views.run_view import RUN_OUTPUTS, RunState, RunStateHolder
from engine.workloads.workload import TABLE_COLUMNS

TITLE = "Continuous Batching Playground"
# Gradio deletes the files it cached for the page (downloads, uploads) hourly, those over a day old
DELETE_CACHE_S = (3600, 86400)
INTRO = (
    "The same requests run twice on the same model. **Static batching** pads a wave of B requests "
    "and runs it until its longest request is done; the other slots idle behind the batch "
    "barrier. **Continuous batching** refills a slot the step its request finishes, and packs "
    "every in-flight token into one forward pass, a new prompt's prefill riding along with the "
    "others' decode steps behind a block-diagonal causal mask. Edit the requests, pick the number "
    "of slots and press Run; then drag the step slider to see each step's attention mask."
)
# Each header whole ("max_new_tokens" is 14 monospace characters, ~135 px with its padding and
# menu) once the table is 860 px wide: assets/page.css keeps it so, and narrower screens scroll.
REQUEST_COLUMN_WIDTHS = ["34%", "16%", "11%", "13%", "8%", "8%", "10%"]
REQUESTS_LABEL = (
    "Requests (arrival_s: seconds after Run, 0 = at once; temperature, top_k, top_p, seed: "
    "all empty = greedy, any one set = sampled from the row's own seeded generator)"
)


def header(model_label: str) -> tuple[gr.Markdown, tour.TourPanel]:
    """Title, introduction, model line and tour; returns the model line and the tour."""
    gr.Markdown(f"# {TITLE}\n\n{INTRO}")
    model_line = gr.Markdown(model_label, elem_id="model_markdown")
    with gr.Accordion("Guided tour: what to look at", open=False, elem_id="tour_accordion"):
        return model_line, tour.tour_panel()


@dataclass
class RequestsPanel:
    table: gr.Dataframe
    upload_button: gr.UploadButton
    table_button: gr.Button
    table_file: gr.File
    preset_markdown: gr.Markdown
    warning_html: gr.HTML  # the last warning about the table or the link, until the next action


def requests_panel(rows: list[list], preset_text: str) -> RequestsPanel:
    table = RequestsTable(  # a gr.Dataframe whose API value Run's handler checks
        value=rows,
        headers=list(TABLE_COLUMNS),  # prompt, max_new_tokens, arrival_s, sampling settings
        # the seed is text: a browser number loses digits past 2^53, and seeds go to 2^63 - 1
        datatype=["str", "number", "number", "number", "number", "number", "str"],
        type="array",
        interactive=True,
        column_count=len(TABLE_COLUMNS),  # column_limits: not implemented in 6.31
        label=REQUESTS_LABEL,
        column_widths=REQUEST_COLUMN_WIDTHS,
        elem_id="requests_table",
    )
    with gr.Row():
        upload_button = gr.UploadButton(
            "Upload CSV or JSONL",
            file_types=[".csv", ".jsonl", ".json"],
            size="sm",
            elem_id="upload_button",
        )
        table_button = gr.Button(
            "Download the table (CSV, JSONL)", size="sm", elem_id="table_button"
        )
    table_file = gr.File(
        label="The table: workload.csv · workload.jsonl",
        file_count="multiple",
        interactive=False,
        visible=False,
        elem_id="table_file",
    )
    warning_html = gr.HTML("", elem_id="warning_html")  # page_io.warning_note; empty: nothing
    preset_markdown = gr.Markdown(preset_text, elem_id="preset_markdown")
    return RequestsPanel(
        table, upload_button, table_button, table_file, preset_markdown, warning_html
    )


def downloads_panel() -> gr.File:
    """The run's files: requests, traces, a Perfetto trace and the charts."""
    return gr.File(
        label=(
            "Downloads: requests.csv · traces.json · trace.perfetto.json (ui.perfetto.dev) · "
            "charts.html (each chart's camera button also saves a PNG)"
        ),
        file_count="multiple",
        interactive=False,
        elem_id="downloads_file",
    )


def run_state(shown: RunState | None) -> RunStateHolder:
    """The run a session keeps between events: ``shown`` (the recorded run) until it runs one."""
    return RunStateHolder(shown)


def run_outputs(
    run_state: gr.State, results: ResultsPanel, downloads: gr.File, settings: SettingsPanel
) -> list:
    """What Run and Stop write, in ``RUN_OUTPUTS`` order, by ``elem_id`` (KeyError: missing)."""
    found = by_elem_id(results, settings) | {"run_state": run_state, "downloads_file": downloads}
    return [found[name] for name in RUN_OUTPUTS]


# The component of each input the page names: Run's (``run_options.RUN_INPUTS``: the
# ``RunSettings`` fields and two states) and a link's (``page_io.LINK_INPUTS`` and
# ``LINK_OUTPUTS``). Each is written "panel.attribute", or the name of a ``gr.State`` (see
# ``page_components``): each knob's is its panel's field named by its element id
# (``Knob.elem_id``), the x axis's in the results, the others' in the settings.
COMPONENTS = {
    "rows": "requests.table",
    "preset_text": "requests.preset_markdown",
    "input_warning": "requests.warning_html",  # a link's warnings (page_io.warning_note)
    "preset": "settings.preset_dropdown",
    "server_names": "settings.servers_checkbox",
    "replay_recent": "settings.replay_checkbox",
    "step": "results.step_slider",  # a link's step
    "precision": "settings.precision_state",  # the host's precisions, for links
    "previous": "run_state",
    "link_step": "link_step_state",  # a link's step=N, kept until the first run
    "handle": "handle_state",
}
COMPONENTS |= {
    knob.name: f"{'results' if knob.place == 'results' else 'settings'}.{knob.elem_id}"
    for knob in KNOBS
}


def page_components(names, requests: RequestsPanel, settings: SettingsPanel, results, **states):
    """The components of ``names`` (``COMPONENTS`` keys) and ``states`` (KeyError: missing)."""
    page = SimpleNamespace(requests=requests, settings=settings, results=results, **states)
    return [operator.attrgetter(COMPONENTS[name])(page) for name in names]


def run_inputs(
    requests: RequestsPanel, settings: SettingsPanel, results, run_state, handle, live=False
):
    """What Run reads, in ``RUN_INPUTS`` order; ``live``: "Run live anyway"'s."""
    states = {"run_state": run_state, "handle_state": handle}
    components = page_components(RUN_INPUTS, requests, settings, results, **states)
    if live:
        components[RUN_INPUTS.index("replay_recent")] = settings.live_state
    return components
