"""Continuous Batching Playground: the Gradio page, layout and event wiring only (panels in
``engine.page.panels``, handlers in ``engine.page.handlers``, the start in ``launch``). Run
with ``python app.py [--model embedded|PATH|HUB_ID] [--device auto] [--dtype auto] [--share]``."""

from __future__ import annotations

from engine.model import openmp_env

openmp_env.configure()  # before torch loads: the engines run in worker threads (see the module)

import gradio as gr  # noqa: E402

from engine.page.handlers import model_choice, opening, playground, recording  # noqa: E402
from engine.page.host import launch, zerogpu  # noqa: E402
from engine.page.inputs import page_io, presets  # noqa: E402
from engine.page.panels import page_panels, tour  # noqa: E402
from engine.page.panels.results_panel import results_panel  # noqa: E402
from engine.page.panels.settings_panel import HOST_PRECISION, settings_panel  # noqa: E402
from engine.page.run.run_handle import RunHandle  # noqa: E402
from engine.page.views import divergence_view as differences  # noqa: E402

HIDDEN = {"api_visibility": "undocumented"}
QUIET = {"show_progress": "hidden", **HIDDEN}
PRESS = {"queue": False, "trigger_mode": "multiple"}  # Run's press, Stop: in click order, each one
parse_args = launch.parse_args  # the command line, documented in engine.page.host.launch


def build_demo(model_label: str, server_names=(), precision=HOST_PRECISION) -> gr.Blocks:
    """The page: request editor and settings, timelines, step heatmaps, tables, the host's
    servers (by name only); on the recorded model it opens on the shipped recording
    (``engine.page.handlers.recording``). ``precision``: the host's precisions and models."""
    rows, chat_template, preset_text = presets.apply_preset(presets.DEFAULT_PRESET)
    shown = recording.opening_result(model_id=precision.model)
    with gr.Blocks(title=page_panels.TITLE, delete_cache=page_panels.DELETE_CACHE_S) as demo:
        model_line, tour_panel = page_panels.header(model_label)
        with gr.Row():
            with gr.Column(scale=3):
                requests = page_panels.requests_panel(rows, preset_text)
            with gr.Column(scale=1):
                settings = settings_panel(chat_template, server_names, precision)
        results = results_panel(shown, server_names, recording.opening_status(precision.model))
        downloads = page_panels.downloads_panel()
        run_state = page_panels.run_state(shown.state if shown is not None else None)
        handle_state = gr.State(RunHandle(gradio_queue=zerogpu.on_zerogpu()))  # per session: Stop
        demo.unload(playground.session_end_event(handle_state.value))  # a tab closed or reloaded
        link_step_state = gr.State()  # a link's step=N, applied after the first run
        outputs = page_panels.run_outputs(run_state, results, downloads, settings)
        link = wire_setup(demo, tour_panel, requests, settings, results, run_state, link_step_state)
        demo.load(page_io.link_step, None, link_step_state, **HIDDEN)
        run_events = wire_run(requests, settings, results, run_state, handle_state, outputs, link)
        wire_stop(settings, results, run_state, handle_state, outputs, run_events)
        step_in = [run_state, link_step_state, results.x_axis_radio]
        step_out = [results.step_slider, link_step_state, *results.step_views()]
        run_events[0].success(playground.link_step_event, step_in, step_out, **HIDDEN)
        wire_views(results, run_state)
        wire_precision(settings, results, run_state, model_line, run_events)
    return demo


def wire_precision(settings, results, run_state, model_line, run_events) -> None:
    """The precision note, a pick in "Where outputs differ", the model picker, the model line."""
    s, d, chosen = settings, results.divergence, [model_line, results.status_markdown]
    s.model_dropdown.change(model_choice.choose_model_event, s.model_dropdown, chosen, **QUIET)
    for event in run_events:
        event.then(model_choice.run_model_line, [run_state, s.model_dropdown], model_line, **QUIET)
    checks, note = [s.compare_hf_checkbox, s.batch_invariant_checkbox], differences.settings_note
    gr.on([c.change for c in checks], note, checks, s.precision_markdown, **QUIET)
    d.dropdown.input(differences.divergence_event, [run_state, d.dropdown], d.views(), **QUIET)


def wire_views(results, run_state) -> None:
    """The slider's moves, the x-axis and the mask's layer type redraw the step views."""
    r, views, inputs = results, results.step_views(), results.step_inputs(run_state)
    # preprocess=False: gr.Slider refuses a typed step out of range; step_views clamps it
    kwargs = dict(trigger_mode="always_last", preprocess=False, **QUIET)
    for event, name in ((r.step_slider.input, "step"), (r.x_axis_radio.change, "x_axis")):
        event(playground.update_step, inputs, views, api_name=name, **kwargs)
    picked = [*inputs[:3], r.mask_layer_radio]  # a pick, or a Run's reset to "global"
    r.mask_layer_radio.change(playground.layer_event, picked, [inputs[3], *views], **kwargs)


def wire_setup(demo, tour_panel, requests, settings, results, run_state, link_step_state):
    """Links, tour steps, presets, table edits, uploads, downloads; returns the link's event."""
    s, page = settings, (requests, settings, results)
    link_outputs = page_panels.page_components(page_io.LINK_OUTPUTS, *page)
    link = demo.load(page_io.from_link, s.precision_state, link_outputs, **HIDDEN)
    tour.wire_setups(tour_panel, link_outputs, s.precision_state, link_step_state)  # no Run
    demo.load(lambda: True, None, s.replay_checkbox, queue=False, **HIDDEN)  # Run may replay
    chosen = page_panels.page_components(presets.CHOSEN, *page)  # the engine knobs too
    choose = {"api_name": "apply_preset"}  # the endpoint's name before it also set the slots
    s.preset_dropdown.input(presets.choose_preset, s.preset_dropdown, chosen, **choose)
    edited = [s.preset_dropdown, requests.preset_markdown]  # a user's edit: no preset any more
    requests.table.input(presets.table_edited, None, edited, **HIDDEN)
    states = {"run_state": run_state, "link_step_state": link_step_state}
    link_query = page_panels.page_components(page_io.LINK_INPUTS, *page, **states)
    s.link_button.click(page_io.setup_query, link_query, s.link_textbox, **HIDDEN).then(
        None, s.link_textbox, s.link_textbox, js=page_io.COPY_LINK_JS
    )
    note = requests.warning_html  # the last warning, until the next action
    uploaded = [requests.table, s.preset_dropdown, requests.preset_markdown, note]
    button = requests.upload_button
    button.upload(page_io.upload_workload, button, uploaded, **HIDDEN)
    shown = [requests.table_file, note]
    requests.table_button.click(page_io.show_table_files, requests.table, shown, **HIDDEN)
    acts = [requests.table.input, s.preset_dropdown.input, s.run_button.click, s.live_button.click]
    gr.on(acts, None, None, note, js="() => ''", **HIDDEN)
    return link


def wire_run(requests, settings, results, run_state, handle_state, outputs, link):
    """Run: noted at once (unqueued), then the run itself, which shows a recent identical run or
    waits its turn on the model in the page's queue; "Run live anyway" skips the replay. After a
    ``link``: its setup's recent run, or the recorded run said to be another setup's."""
    s, run = settings, zerogpu.on_gpu(playground.run_event)  # spaces.GPU on ZeroGPU, else as is
    pressed, js = [handle_state, s.click_number], page_io.RUN_CLICK_JS  # numbered: RunHandle
    # "Run pressed" on the note and status line, with the press's tracker on the note
    noted = [s.run_note_markdown, s.live_button, results.status_markdown]
    on_note = {"show_progress_on": s.run_note_markdown}
    for button in (s.run_button, s.live_button):
        button.click(playground.run_pressed, pressed, noted, js=js, **on_note, **PRESS)
    kwargs = dict(concurrency_limit=zerogpu.run_concurrency(), trigger_mode="always_last")
    kwargs |= dict(preprocess=False)  # Run checks its inputs itself: a bad one says "Not run"
    kwargs |= dict(show_progress_on=results.status_markdown)  # one progress bar; results stay
    live = page_panels.run_inputs(requests, s, results, run_state, handle_state, live=True)
    live_event = s.live_button.click(run, live, outputs, **kwargs, **HIDDEN)
    run_inputs = page_panels.run_inputs(requests, s, results, run_state, handle_state)
    link.then(opening.link_opened, [s.preset_dropdown, *run_inputs], outputs, **QUIET)
    return s.run_button.click(run, run_inputs, outputs, api_name="run", **kwargs), live_event


def wire_stop(settings, results, run_state, handle_state, outputs, run_events) -> None:
    """Stop: through the session's RunHandle (unqueued, at once); a run still in Gradio's queue
    (ZeroGPU only) is cancelled, immediate for an event that has not started."""
    s, left = settings, [handle_state, run_state, results.x_axis_radio]
    reply, stopped, js = s.stop_reply_textbox, [handle_state, s.click_number], page_io.STOP_CLICK_JS
    stop = s.stop_button.click(playground.stop_event, stopped, reply, js=js, **PRESS, **QUIET)
    stop.then(playground.stop_told, reply, None, trigger_mode="multiple", **QUIET)  # its toast
    stop.then(None, reply, None, js=page_io.LEAVE_QUEUE_JS)
    s.leave_queue_button.click(
        playground.left_queue_event, left, outputs, cancels=list(run_events), queue=False, **QUIET
    )


def main(argv: list[str] | None = None) -> None:
    """Load the model (so problems show at start), then serve the page (``launch.serve``)."""
    launch.serve(build_demo, argv)


if __name__ == "__main__":
    main()
