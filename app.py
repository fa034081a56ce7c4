"""Continuous Batching Playground: the Gradio page. Layout and event wiring only.

Handlers live in ``engine.playground`` and figures in ``engine.figures``. Run with
``python app.py [--model embedded|PATH|HUB_ID] [--device auto] [--dtype auto] [--port 7860]``.
"""

from __future__ import annotations

import argparse

import gradio as gr

from engine import playground, presets, tables

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
    parser.add_argument("--share", action="store_true", help="create a public Gradio link")
    return parser.parse_args(argv)


def build_demo(model_label: str) -> gr.Blocks:
    """The page: request editor and settings, timelines, step heatmaps, tables."""
    rows, chat_template, preset_text = presets.apply_preset(presets.DEFAULT_PRESET)
    with gr.Blocks(title=TITLE) as demo:
        gr.Markdown(f"# {TITLE}\n\n{INTRO}")
        gr.Markdown(model_label)
        with gr.Row():
            with gr.Column(scale=3):
                requests_table = gr.Dataframe(
                    value=rows,
                    headers=playground.REQUEST_HEADERS,
                    datatype=["str", "number"],
                    type="array",
                    interactive=True,
                    column_count=2,  # row_limits/column_limits: "not yet implemented" in 6.31
                    label="Requests",
                    column_widths=["85%", "15%"],
                    elem_id="requests_table",
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
                    1, 16, value=3, step=1, label="Slots (B)", elem_id="slots_slider"
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
                            ("in place, per slot (fast)", "slots"),
                            ("article's concatenation (slow, O(n²))", "concat"),
                        ],
                        value="slots",
                        label="Continuous engine's KV cache",
                        elem_id="kv_mode_dropdown",
                    )
                    token_budget_number = gr.Number(
                        value=0,
                        precision=0,
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
                        label="Arrivals: Poisson rate, requests/s (0 = all at t = 0)",
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
        status_markdown = gr.Markdown(
            "Press Run to compare the two engines.", elem_id="status_markdown"
        )
        x_axis_radio = gr.Radio(
            [("seconds", "time"), ("step index", "step")], value="time", label="Timeline x axis"
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
        metrics_table = gr.Dataframe(
            headers=tables.METRICS_HEADERS,
            interactive=False,
            wrap=True,
            label="Metrics",
            elem_id="metrics_table",
        )
        outputs_table = gr.Dataframe(
            headers=tables.outputs_headers(["static", "continuous"]),
            datatype="str",  # plain text: model output is never rendered as HTML or Markdown
            interactive=False,
            wrap=True,
            label="Outputs",
            elem_id="outputs_table",
        )
        downloads_file = gr.File(
            label="Downloads: requests.csv · traces.json · trace.perfetto.json (ui.perfetto.dev)",
            file_count="multiple",
            interactive=False,
            elem_id="downloads_file",
        )
        run_state = gr.State()
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
        ]

        demo.load(
            playground.from_link,
            None,
            [preset_dropdown, requests_table, chat_checkbox, preset_markdown, slots_slider],
            api_visibility="undocumented",
        )
        preset_dropdown.input(
            presets.apply_preset,
            preset_dropdown,
            [requests_table, chat_checkbox, preset_markdown],
        )
        run_event = run_button.click(
            playground.run_event,
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
        view_inputs = [run_state, step_slider, x_axis_radio]
        view_outputs = [
            static_timeline_plot,
            continuous_timeline_plot,
            packed_mask_plot,
            static_mask_plot,
        ]
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
        shared = playground.load_shared_model(args.model, args.device, args.dtype)
    except ValueError as exc:  # ModelLoadError included: one line a person can act on
        raise SystemExit(f"error: {exc}") from None
    print(f"{shared.label} (loaded in {shared.loaded.load_s:.1f} s)", flush=True)
    demo = build_demo(shared.label)
    demo.queue()
    demo.launch(server_name=args.host, server_port=args.port, share=args.share)


if __name__ == "__main__":
    main()
