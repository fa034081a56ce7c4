"""Continuous Batching Playground: the Gradio page. Layout and event wiring only.

Handlers live in ``engine.playground`` and figures in ``engine.figures``. Run with
``python app.py [--model embedded|PATH|HUB_ID] [--device auto] [--dtype auto] [--port 7860]
[--share]``.
"""

from __future__ import annotations

import argparse

from engine import openmp_env

openmp_env.configure()  # before torch loads: the engines run in worker threads (see the module)

import gradio as gr  # noqa: E402

from engine import (  # noqa: E402
    page_io,
    playground,
    presets,
    share,
    shared_model,
    tables,
    tour,
    zerogpu,
)

TITLE = "Continuous Batching Playground"
INTRO = (
    "The same requests run twice on the same model. **Static batching** pads a wave of B requests "
    "and runs it until its longest request is done; the other slots idle behind the batch "
    "barrier. **Continuous batching** refills a slot the step its request finishes, and packs "
    "every in-flight token into one forward pass, a new prompt's prefill riding along with the "
    "others' decode steps behind a block-diagonal causal mask. Edit the requests, pick the number "
    "of slots and press Run; then drag the step slider to see each step's attention mask."
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags."""
    parser = argparse.ArgumentParser(description=TITLE)
    parser.add_argument("--model", default="embedded", help="embedded, a local folder or hub id")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    parser.add_argument("--dtype", default="auto", help="auto, float32, float16 or bfloat16")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--share",
        action="store_true",
        help="also print a public gradio.live link (waits a few seconds at most)",
    )
    return parser.parse_args(argv)


def build_demo(model_label: str) -> gr.Blocks:
    """The page: request editor and settings, timelines, step heatmaps, tables."""
    rows, chat_template, preset_text = presets.apply_preset(presets.DEFAULT_PRESET)
    with gr.Blocks(title=TITLE) as demo:
        gr.Markdown(f"# {TITLE}\n\n{INTRO}")
        gr.Markdown(model_label)
        with gr.Accordion("Guided tour: what to look at", open=False, elem_id="tour_accordion"):
            steps = tour.load_tour()
            with gr.Walkthrough(selected=1, elem_id="tour_walkthrough") as walkthrough:
                for number, step in enumerate(steps, start=1):
                    with gr.Step(step.title, id=number):
                        gr.Markdown(step.markdown())
                        if number < len(steps):  # visited steps' headers lead back
                            gr.Button("Next", size="sm", elem_id=f"tour_next_{number}").click(
                                tour.step_selector(number + 1),
                                None,
                                walkthrough,
                                queue=False,
                                api_visibility="undocumented",
                            )
        with gr.Row():
            with gr.Column(scale=3):
                requests_table = gr.Dataframe(
                    value=rows,
                    headers=playground.REQUEST_HEADERS,
                    datatype=["str", "number", "number"],
                    type="array",
                    interactive=True,
                    column_count=3,  # row_limits/column_limits: "not yet implemented" in 6.31
                    label="Requests (arrival_s: seconds after Run; 0 = at once)",
                    column_widths=["74%", "14%", "12%"],
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
                preset_markdown = gr.Markdown(preset_text, elem_id="preset_markdown")
            with gr.Column(scale=1):
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
                    value=True,
                    label="Check outputs against model.generate",
                    elem_id="reference_checkbox",
                )
                with gr.Accordion("Engine settings", open=False):
                    kv_mode_dropdown = gr.Dropdown(
                        [
                            ("paged: blocks from a memory budget, preemption (vLLM)", "paged"),
                            ("in place, per slot", "slots"),
                            ("article's concatenation (slow, O(n²))", "concat"),
                        ],
                        value="paged",
                        label="Continuous engine's KV cache",
                        elem_id="kv_mode_dropdown",
                    )
                    with gr.Row():
                        kv_budget_number = gr.Number(
                            value=0,
                            label="Paged: KV budget, MiB (0 = room for every slot)",
                            elem_id="kv_budget_number",
                        )
                        block_size_number = gr.Number(  # no precision=0: it rounds 7.5 quietly
                            value=16,
                            label="Paged: tokens per block (1 to 256)",
                            elem_id="block_size_number",
                        )
                    token_budget_number = gr.Number(
                        value=0,
                        label="Token budget per step (0 = no limit)",
                        elem_id="token_budget_number",
                    )
                    policy_radio = gr.Radio(
                        [("decode first", "decode_first"), ("prefill first", "prefill_first")],
                        value="decode_first",
                        label="Who gets the budget first",
                        elem_id="policy_radio",
                    )
                    arrival_rate_number = gr.Number(
                        value=0,
                        label="Arrivals: Poisson rate, requests/s (0 = the table's arrival_s)",
                        elem_id="arrival_rate_number",
                    )
                    compare_hf_checkbox = gr.Checkbox(
                        value=False,
                        label="Also run transformers' built-in continuous batching",
                        elem_id="compare_hf_checkbox",
                    )
                with gr.Row():
                    run_button = gr.Button("Run", variant="primary", elem_id="run_button")
                    stop_button = gr.Button("Stop", variant="stop", elem_id="stop_button")
                link_button = gr.Button("Copy link to this setup", size="sm", elem_id="link_button")
                link_textbox = gr.Textbox(
                    label="Link: preset, slots and step (an edited table is not in it)",
                    interactive=False,
                    buttons=["copy"],
                    elem_id="link_textbox",
                )
        status_markdown = gr.Markdown(
            "Press Run to compare the two engines.", elem_id="status_markdown"
        )
        x_axis_radio = gr.Radio(
            [("seconds", "time"), ("step index", "step")],
            value="time",
            label="Timeline x axis",
            elem_id="x_axis_radio",
        )
        with gr.Row():
            static_timeline_plot = gr.Plot(show_label=False, elem_id="static_timeline_plot")
            continuous_timeline_plot = gr.Plot(show_label=False, elem_id="continuous_timeline_plot")
        step_slider = gr.Slider(
            0, 1, value=0, step=1, label="Step (one forward pass)", elem_id="step_slider"
        )
        with gr.Row():
            packed_mask_plot = gr.Plot(show_label=False, elem_id="packed_mask_plot")
            static_mask_plot = gr.Plot(show_label=False, elem_id="static_mask_plot")
        block_map_plot = gr.Plot(show_label=False, elem_id="block_map_plot")
        metrics_table = gr.Dataframe(
            headers=tables.METRICS_HEADERS,
            interactive=False,
            wrap=True,
            label="Metrics",
            elem_id="metrics_table",
        )
        with gr.Row():
            latency_cdf_plot = gr.Plot(show_label=False, elem_id="latency_cdf_plot")
            step_usage_plot = gr.Plot(show_label=False, elem_id="step_usage_plot")
        outputs_table = gr.Dataframe(
            headers=tables.outputs_headers(["static", "continuous"]),
            datatype="str",  # plain text: model output is never rendered as HTML or Markdown
            interactive=False,
            wrap=True,
            label="Outputs",
            elem_id="outputs_table",
        )
        downloads_file = gr.File(
            label=(
                "Downloads: requests.csv · traces.json · trace.perfetto.json (ui.perfetto.dev) · "
                "charts.html (each chart's camera button also saves a PNG)"
            ),
            file_count="multiple",
            interactive=False,
            elem_id="downloads_file",
        )
        run_state = gr.State()
        link_step_state = gr.State()  # a link's step=N, applied after the first run
        run_outputs = [
            run_state,
            static_timeline_plot,
            continuous_timeline_plot,
            packed_mask_plot,
            static_mask_plot,
            step_slider,
            metrics_table,
            outputs_table,
            status_markdown,
            downloads_file,
            block_map_plot,
            latency_cdf_plot,
            step_usage_plot,
        ]  # in engine.run_view.RUN_OUTPUTS order (tested)

        demo.load(
            page_io.from_link,
            None,
            [preset_dropdown, requests_table, chat_checkbox, preset_markdown, slots_slider],
            api_visibility="undocumented",
        )
        demo.load(page_io.link_step, None, link_step_state, api_visibility="undocumented")
        preset_dropdown.input(
            presets.apply_preset,
            preset_dropdown,
            [requests_table, chat_checkbox, preset_markdown],
        )
        requests_table.input(  # a user's edit (not a preset or an upload): no preset any more
            presets.table_edited,
            None,
            [preset_dropdown, preset_markdown],
            api_visibility="undocumented",
        )
        run_event = run_button.click(
            zerogpu.on_gpu(playground.run_event),  # spaces.GPU on a ZeroGPU Space, else as is
            [
                requests_table,
                slots_slider,
                chat_checkbox,
                reference_checkbox,
                kv_mode_dropdown,
                token_budget_number,
                policy_radio,
                compare_hf_checkbox,
                arrival_rate_number,
                x_axis_radio,
                run_state,  # the previous run, put back if this one is stopped (not in the API)
                kv_budget_number,  # after the state: the API's earlier inputs keep their places
                block_size_number,
            ],
            run_outputs,
            concurrency_limit=1,
            concurrency_id="model",
            api_name="run",
            show_progress_on=status_markdown,  # one progress bar, queue place; results stay
        )
        stop_button.click(  # cancelling closes the Run generator: its worker stops within a step
            playground.stop_event,
            [run_state, x_axis_radio],
            run_outputs,
            cancels=[run_event],
            show_progress="hidden",
            api_visibility="undocumented",
        )
        run_event.success(
            page_io.apply_link_step,
            [run_state, link_step_state],
            [step_slider, link_step_state],
            api_visibility="undocumented",
        )
        link_button.click(
            page_io.setup_query,
            [preset_dropdown, slots_slider, step_slider, run_state],
            link_textbox,
            api_visibility="undocumented",
        ).then(None, link_textbox, link_textbox, js=page_io.COPY_LINK_JS)
        upload_button.upload(
            page_io.upload_workload,
            upload_button,
            [requests_table, preset_dropdown, preset_markdown],
            api_visibility="undocumented",
        )
        table_button.click(
            page_io.show_table_files,
            requests_table,
            table_file,
            api_visibility="undocumented",
        )
        view_inputs = [run_state, step_slider, x_axis_radio]
        view_outputs = [
            static_timeline_plot,
            continuous_timeline_plot,
            packed_mask_plot,
            static_mask_plot,
            block_map_plot,
        ]  # in engine.run_view.STEP_VIEW_OUTPUTS order
        for event, name in ((step_slider.change, "step"), (x_axis_radio.change, "x_axis")):
            event(
                playground.update_step,
                view_inputs,
                view_outputs,
                show_progress="hidden",
                trigger_mode="always_last",
                api_name=name,
                api_visibility="undocumented",
            )
    return demo


def main(argv: list[str] | None = None) -> None:
    """Load the model (so problems show at start), then serve the page."""
    args = parse_args(argv)
    try:
        shared = shared_model.load_shared_model(args.model, args.device, args.dtype)
    except ValueError as exc:  # ModelLoadError included: one line a person can act on
        raise SystemExit(f"error: {exc}") from None
    print(f"{shared.label} (loaded in {shared.loaded.load_s:.1f} s)", flush=True)
    demo = build_demo(shared.label)
    demo.queue()
    # quiet: Gradio's own launch lines would say "set share=True" even with --share.
    demo.launch(server_name=args.host, server_port=args.port, prevent_thread_lock=True, quiet=True)
    print(f"* Running on local URL: {demo.local_url}", flush=True)
    if args.share:
        share.open_share_link(demo)  # bounded wait; the page serves locally meanwhile
    demo.block_thread()


if __name__ == "__main__":
    main()
