"""The page's view of a run: what it keeps between events, and every figure and table it shows.

``RUN_OUTPUTS`` names the Run event's outputs once, in the order ``app.py`` wires them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Any

import gradio as gr

from engine.page.figures import (
    block_map,
    mask_heatmaps,
    server_lanes,
    serving_metrics,
    timelines,
)
from engine.page.views import divergence_view, inside_view, run_status, tables
from engine.trace import DECODE, PREFILL, Trace
from engine.worker.comparison import ComparisonResult, traces_by_name
from engine.workloads import export

# The Run event's outputs, by elem_id (the state has none), in wiring order. The first ten are the
# /run API's original outputs; later ones are appended, so API clients keep their positions.
RUN_OUTPUTS = (
    "run_state",
    "static_timeline_plot",
    "continuous_timeline_plot",
    "packed_mask_plot",
    "static_mask_plot",
    "step_slider",
    "metrics_table",
    "outputs_table",
    "status_markdown",
    "downloads_file",
    "block_map_plot",
    "latency_cdf_plot",
    "step_usage_plot",
    "server_timeline_plot",
    "server_chart_plot",
    "divergence_dropdown",
    "divergence_markdown",
    "divergence_textbox",
    "divergence_table",
    "run_note_markdown",  # the line under Run: queued, running, done, or shown at once
    "live_button",  # "Run live anyway": shown with a run shown at once
    "inside_timeline_plot",  # a server's own record (inside_view): its timeline,
    "inside_mask_plot",  # packed mask and KV block map at the step, and its tokens and KV
    "inside_block_map_plot",
    "inside_usage_plot",
    "inside_column",  # shown when transformers' record is drawn on a page without servers
    "mask_layer_radio",  # the packed mask's layer type: shown for a model with sliding windows
)
CHART_HEADINGS = ("Static timeline", "Continuous timeline", "Packed mask", "Static mask")
INSIDE_HEADINGS = ("{name}'s own timeline", "{name}'s packed mask", "{name}'s KV block map")


def inside_headings(name: str) -> tuple[str, ...]:
    return tuple(heading.format(name=name) for heading in INSIDE_HEADINGS)


def run_outputs(**values) -> tuple:
    """The Run event's output tuple from values by name (others left as is); TypeError for a name
    not in ``RUN_OUTPUTS``."""
    unknown = set(values) - set(RUN_OUTPUTS)
    if unknown:
        raise TypeError(f"not Run outputs: {sorted(unknown)}")
    return tuple(values.get(name, gr.skip()) for name in RUN_OUTPUTS)


def outputs_table(
    rows: list[list] | None, engine_names: list[str], reference: str = "model.generate", **props
) -> gr.Dataframe:
    """The outputs table with headers and column widths for these engines."""
    output_width = f"{47 // len(engine_names)}%"
    return gr.Dataframe(
        value=rows,
        headers=tables.outputs_headers(engine_names, reference),
        column_widths=["7%", "16%", "6%", *[output_width] * len(engine_names), "16%", "8%"],
        **props,
    )


@dataclass
class RunState:
    """What the page keeps between events (in a ``gr.State``): the traces and the reference."""

    static: Trace
    continuous: Trace
    reference: dict[int, list[int]] | None
    hf_continuous: Trace | None = None  # transformers' own continuous batching, when compared
    recorded: Any = None  # the shipped run (``engine.page.handlers.recording.Recording``)
    servers: dict[str, Trace] = field(default_factory=dict)  # host-configured servers, by name
    server_failures: dict[str, str] = field(default_factory=dict)  # servers that failed: why
    # engine -> request id -> verdict entry (``divergence.judge_runs``); None: not judged
    verdicts: dict[str, dict[int, dict]] | None = None
    dtype: str | None = None  # the precision it ran in, e.g. "bfloat16" (None: not recorded)
    batch_invariant: bool = False

    @classmethod
    def from_comparison(cls, result: ComparisonResult) -> RunState:
        return cls(
            result.static,
            result.continuous,
            result.reference,
            result.hf_continuous,
            verdicts=result.verdicts,
            dtype=result.dtype,
            batch_invariant=result.batch_invariant,
        )

    def traces(self) -> dict[str, Trace]:
        return {**traces_by_name(self.static, self.continuous, self.hf_continuous), **self.servers}

    def inside_runs(self) -> dict[str, Trace]:
        """Runs whose own record the inside views may draw: servers first, then transformers'."""
        hf = {"hf_continuous": self.hf_continuous} if self.hf_continuous is not None else {}
        return {**self.servers, **hf}

    @property
    def num_steps(self) -> int:
        """Steps of the longest run, inside records included: the slider's range."""
        found = inside_view.own_record(self.inside_runs())
        inside = len(found[1].steps) if found else 0
        return max(len(self.static.steps), len(self.continuous.steps), inside)


class RunStateHolder(gr.State):
    """The page's ``run_state``: a ``gr.State`` whose config skips its first value (docs/page.md,
    "Gradio's costs")."""

    is_template = True  # a State to Gradio's frontend and API clients (``get_block_name``)

    def get_config(self) -> dict[str, Any]:
        return gr.components.Component.get_config(self, cls=_StateSettings)


class _StateSettings:
    """``gr.State``'s settings that its config carries: all but ``value`` (read: its signature)."""

    def __init__(self, render=True, *, time_to_live=None, delete_callback=None): ...


@dataclass
class StepViews:
    """The step-dependent figures (plotly or None), each of the output ``<field>_plot``."""

    static_timeline: Any
    continuous_timeline: Any
    packed_mask: Any
    static_mask: Any
    block_map: Any
    inside_timeline: Any = None
    inside_mask: Any = None
    inside_block_map: Any = None

    def as_tuple(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(self))

    def by_output(self) -> dict[str, Any]:
        return dict(zip(STEP_VIEW_OUTPUTS, self.as_tuple(), strict=True))


# What the step slider and the x-axis choice redraw, in ``StepViews.as_tuple`` order.
STEP_VIEW_OUTPUTS = tuple(f"{f.name}_plot" for f in fields(StepViews))


@dataclass
class RunResult:
    state: RunState
    step_index: int
    views: StepViews
    metrics: list[list]
    outputs: list[list]
    status: str
    downloads: list[str] | None = None  # file paths: CSV, whole-trace JSON, Perfetto trace
    latency_cdf: Any = None
    step_usage: Any = None
    server_timeline: Any = None
    server_chart: Any = None
    inside_usage: Any = None  # a server's own record: tokens and KV per step
    inside_shown: bool = False  # show the inside views (hidden on a page without servers)

    def as_outputs(self) -> tuple:
        """Values in ``RUN_OUTPUTS`` order."""
        return run_outputs(
            **self.views.by_output(),
            run_state=self.state,
            step_slider=gr.Slider(
                minimum=0,
                maximum=max(self.state.num_steps - 1, 1),
                value=self.step_index,
                label=slider_label(self.state),
            ),
            metrics_table=gr.Dataframe(
                value=self.metrics, headers=tables.metrics_headers(self.state.batch_invariant)
            ),
            outputs_table=outputs_table(
                self.outputs,
                list(self.state.traces()),
                "its solo run" if self.state.batch_invariant else "model.generate",
            ),
            status_markdown=self.status,
            downloads_file=self.downloads,
            latency_cdf_plot=self.latency_cdf,
            step_usage_plot=self.step_usage,
            server_timeline_plot=self.server_timeline,
            server_chart_plot=self.server_chart,
            **divergence_view.run_outputs(self.state, run_status.servers_note(self.state)),
            inside_usage_plot=self.inside_usage,
            inside_column=gr.Column(visible=True) if self.inside_shown else gr.skip(),
            mask_layer_radio=layer_radio(self.state.continuous),
        )


def render(
    state: RunState, x_axis: str = "time", status: str | None = None, downloads: bool = True
) -> RunResult:
    """Everything the page shows for a finished run, at its default step; files if ``downloads``."""
    step_index = default_step(state.continuous)
    views = step_views(state, step_index, x_axis)
    files = write_downloads(state, views if x_axis == "time" else None) if downloads else None
    return RunResult(
        state=state,
        step_index=step_index,
        views=views,
        metrics=tables.metrics_rows(state.traces(), run_status.reference_ok(state)),
        outputs=tables.outputs_rows(state.traces(), state.reference, state.verdicts),
        status=status or run_status.status_line(state),
        downloads=files,
        latency_cdf=serving_metrics.latency_cdf_figure(list(state.traces().values())),
        step_usage=serving_metrics.step_usage_figure(state.continuous),
        server_timeline=server_lanes.server_timeline_figure(state.servers, _x_max(state, "time")),
        server_chart=server_lanes.server_chart_figure(state.servers, state.continuous),
        inside_usage=inside_view.usage_figure(state.inside_runs()),
        inside_shown=state.hf_continuous is not None,
    )


def write_downloads(state: RunState, views: StepViews | None = None) -> list[str]:
    """The run's exports in a fresh folder: requests.csv, traces.json, Perfetto, charts.html;
    ``views``: its default step's views on the time axis, if already drawn."""
    folder = export.download_folder("cbp-run-")
    paths = export.write_files(folder, state.traces())
    if views is None:
        views = step_views(state, default_step(state.continuous), "time")
    charts = dict(zip(CHART_HEADINGS, views.as_tuple()[:4], strict=True))
    found = inside_view.own_record(state.inside_runs())
    if found is not None:  # and a scheduler's own steps, at that step
        charts |= zip(inside_headings(found[0]), views.as_tuple()[5:], strict=True)
    charts_path = folder / "charts.html"
    charts_path.write_text(
        export.charts_html({k: v for k, v in charts.items() if v is not None}), encoding="utf-8"
    )
    return [str(path) for path in [*paths, charts_path]]


def step_views(
    state: RunState, step_index: int, x_axis: str, layer: str = mask_heatmaps.GLOBAL_LAYERS
) -> StepViews:
    """Both timelines on one x scale, masks and block map at ``step_index`` (clamped to the run)."""
    step_index = min(max(int(step_index), 0), max(state.num_steps - 1, 0))
    x_max = _x_max(state, x_axis)
    window = mask_heatmaps.layer_types(state.continuous).get(layer)
    packed = partial(mask_heatmaps.mask_heatmap, window=window)
    views = StepViews(
        static_timeline=timeline(state.static, x_axis, x_max, step_index),
        continuous_timeline=timeline(state.continuous, x_axis, x_max, step_index),
        packed_mask=_at_step(packed, state.continuous, step_index),
        static_mask=_at_step(mask_heatmaps.static_mask_heatmap, state.static, step_index),
        block_map=_at_step(block_map.block_map_figure, state.continuous, step_index),
    )
    inside = inside_view.step_figures(
        state.inside_runs(), step_index, x_axis, x_max, state.continuous, state.dtype
    )
    views.inside_timeline, views.inside_mask, views.inside_block_map = inside
    return views


def layer_radio(trace: Trace) -> gr.Radio:
    """The layer-type selector for a new run: "global" chosen, shown only with sliding windows."""
    choices = list(mask_heatmaps.layer_types(trace))
    return gr.Radio(choices=choices, value=mask_heatmaps.GLOBAL_LAYERS, visible=len(choices) > 1)


def _x_max(state: RunState, x_axis: str) -> float:
    """The timelines' shared right end; in seconds, the servers' runs count too."""
    ends = [timelines.x_extent(state.static, x_axis), timelines.x_extent(state.continuous, x_axis)]
    if x_axis == "time":
        ends += [t.wall_s for t in state.servers.values()]
    found = inside_view.own_record(state.inside_runs())
    if found is not None:
        ends.append(timelines.x_extent(found[1], x_axis))
    return max(ends)


def timeline(trace: Trace, x_axis: str, x_max: float | None, step_index: int | None):
    fig = timelines.timeline_figure(trace, x_axis, x_max, step_index)
    return serving_metrics.add_serving_marks(fig, trace, x_axis)


def default_step(trace: Trace) -> int:
    """The first step that fuses a prefill with decodes (the article's point), else step 0."""
    for i, step in enumerate(trace.steps):
        kinds = {s.kind for s in step.seqs}
        if PREFILL in kinds and DECODE in kinds:
            return i
    return 0


# --- helpers -------------------------------------------------------------------------------------


def _at_step(builder: Callable, trace: Trace, step_index: int):
    """``builder(trace, step)`` at the run's last step past its end (None: no steps)."""
    if not trace.steps:
        return None
    at, note = inside_view.clamped_step(trace.engine, len(trace.steps), step_index)
    fig = builder(trace, at)
    if note:
        subtitle = fig.layout.title.subtitle.text
        fig.layout.title.subtitle.text = f"{note}<br>{subtitle}" if subtitle else note
    return fig


def slider_label(state: RunState) -> str:
    s, c = len(state.static.steps), len(state.continuous.steps)
    found = inside_view.own_record(state.inside_runs())
    inside = f", {found[0]} 0–{len(found[1].steps) - 1} (its own record)" if found else ""
    return (
        f"Step (one forward pass): static steps 0–{max(s - 1, 0)}, continuous 0–{max(c - 1, 0)}"
        f"{inside}; past an engine's last step, its views show that last step"
    )
