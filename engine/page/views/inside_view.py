"""A scheduler from the inside: the first own record of its steps (``Trace.schedule``: the local
vLLM's, transformers'), drawn with our builders and compared with our schedule step by step.
"""

from __future__ import annotations

import html
import textwrap
from typing import Any

from engine.page.figures import block_map, mask_heatmaps, server_lanes, serving_metrics, timelines
from engine.page.figures.style import TITLE_LINE_PX, counted, message_figure
from engine.peers import schedule_comparison
from engine.trace import Trace

INSIDE_TITLE = "From the inside"
INSIDE_NOTE = (
    f"**{INSIDE_TITLE}** · these four charts come from a scheduler's **own record**: vLLM's "
    "(a server started with the recording scheduler) or, when it is ticked, transformers' "
    "continuous batching's. It writes each step it schedules (the requests' tokens, their KV "
    "blocks, prefix-cache hits, preemptions), so they show the same views as our engines' "
    "above, and move with the same step slider. The servers' lanes and `/metrics` chart further "
    "down are the **view from outside**: what the client saw, and what the server's gauges said."
)
STEP_VIEWS = ("timeline", "packed mask", "KV block map")  # what ``step_figures`` draws
LANES_NOTE = "{who} has no slots: a request takes the first free lane, until preempted or finished"
DEFAULT_HEIGHT_PX = 450  # plotly's height of a figure that sets none
SUBTITLE_LINE_CHARS = 100  # plotly never wraps a subtitle: longer lines are cut at the edge
NO_SERVER = (
    "No server ran in this run, nor transformers' continuous batching: tick one under "
    f"“{server_lanes.SERVERS_BOX}”, or “Also run transformers' built-in continuous batching”."
)
ROW_ORDER_NOTE = "rows in each scheduler's own order, which does not change the plan"


def own_record(runs: dict[str, Trace]) -> tuple[str, Trace] | None:
    """The first run whose trace carries its own record with steps: (name, record)."""
    for name, trace in runs.items():
        if trace.schedule is not None and trace.schedule.steps:
            return name, trace.schedule
    return None


def scheduler_name(record: Trace) -> str:
    if "vllm" in record.info:
        return "vLLM"
    return "transformers" if "transformers" in record.info else "the server"


def source_line(name: str, record: Trace) -> str:
    who = scheduler_name(record)
    version = record.info.get(who.lower())
    who = f"{who} {version}" if version else who
    return html.escape(
        f"From {name}'s own record: {who}'s scheduler, step by step (this machine's clock)"
    )


def blocks_note(record: Trace) -> str:
    who, reserved = scheduler_name(record), block_map.num_reserved_blocks(record.info)
    if not reserved:
        return f"{who}'s own block ids"
    which = "block 0" if reserved == 1 else f"blocks 0–{reserved - 1}"
    what = {"vLLM": "its null block", "transformers": "its trash blocks"}.get(who, "reserved")
    return f"{who}'s own block ids ({which}: {what}, never held: black)"


def labelled(fig: Any, title: str, *lines: str) -> Any:
    """``fig`` with ``title``, and ``lines`` (its source first; "" left out) in its subtitle."""
    subtitle = "<br>".join(line for line in (*lines, fig.layout.title.subtitle.text) if line)
    margin_t = 40 + TITLE_LINE_PX * (2 + subtitle.count("<br>"))
    grown_px = max(margin_t - (fig.layout.margin.t or 0), 0)  # the plot keeps its height
    return fig.update_layout(
        title_text=title,
        title_subtitle_text=subtitle,
        margin_t=margin_t,
        height=(fig.layout.height or DEFAULT_HEIGHT_PX) + grown_px,
    )


def no_record_figure(runs: dict[str, Trace], what: str) -> Any:
    title = f"{INSIDE_TITLE}: {what}"
    if not runs:
        return message_figure(title, NO_SERVER)
    reasons = [w for t in runs.values() for w in t.warnings if "own schedule" in w]
    text = (
        f"{', '.join(runs)}: no record of its own steps. Only a vLLM started with the "
        "recording scheduler keeps one (app.py --vllm does), and transformers' continuous "
        "batching; the lanes and /metrics chart below are the view from outside."
    )
    return message_figure(title, " ".join([text, *reasons]))


def plans_line(ours: Trace | None, name: str, record: Trace) -> str:
    """E.g. "plans alike with ours: 298 of 300 steps, first difference at step 6 (...)"."""
    if ours is None or not ours.steps:
        return ""
    compared = schedule_comparison.compare_schedules(ours, record)
    longest = max(compared["num_steps_ours"], compared["num_steps_vllm"])
    num_alike = round(compared["equal_step_fraction"] * longest)
    line = f"plans alike with ours (continuous): {num_alike} of {counted(longest, 'step')}"
    first = compared["first_difference"]
    if first is None:
        return line + ", no difference"
    reason = first["reason"].replace("vLLM", name)
    return f"{line}, first difference at step {first['step']} ({reason})"


def causes_lines(
    ours: Trace | None,
    name: str,
    record: Trace,
    server: Trace | None,
    run_dtype: str | None = None,
) -> list[str]:
    """Each known cause of a difference (``difference_causes``), a sentence each."""
    if ours is None or not ours.steps:
        return []
    if schedule_comparison.compare_schedules(ours, record)["first_difference"] is None:
        causes = schedule_comparison.queue_causes(ours, record)
    else:
        facts = (server.info.get("server") or {}) if server is not None else {}
        causes = schedule_comparison.difference_causes(
            ours,
            record,
            facts.get("run_dtype") or run_dtype,
            facts.get("dtype") or record.info.get("dtype"),
        )
    return [cause.replace("vLLM", name) for cause in causes]


def step_plan_line(ours: Trace | None, name: str, record: Trace, index: int) -> str:
    """E.g. "step 50 plans as ours (...)" or "step 6 differs from ours: ..."; "" without our run."""
    if ours is None or not ours.steps:
        return ""
    if index >= len(ours.steps):
        return f"ours ran {counted(len(ours.steps), 'step')}: no step {index} to compare"
    if schedule_comparison.step_plan(ours.steps[index]) == schedule_comparison.step_plan(
        record.steps[index]
    ):
        return f"step {index} plans as ours ({ROW_ORDER_NOTE})"
    reason = schedule_comparison.difference_reason(ours, record, index).replace("vLLM", name)
    return f"step {index} differs from ours: {reason}"


def step_figures(
    runs: dict[str, Trace],
    step_index: int,
    x_axis: str,
    x_max: float | None,
    ours: Trace | None = None,
    run_dtype: str | None = None,
) -> tuple[Any, Any, Any]:
    """The first own record's timeline, packed mask and KV block map at ``step_index``, labelled
    (or saying why there is none); with ``ours``, how its plan compares."""
    found = own_record(runs)
    if found is None:
        return tuple(no_record_figure(runs, what) for what in STEP_VIEWS)
    name, record = found
    at, past = clamped_step(name, len(record.steps), step_index)
    source = source_line(name, record)
    timeline = timelines.timeline_figure(record, x_axis, x_max, step_index)
    timeline = serving_metrics.add_serving_marks(timeline, record, x_axis)
    rows = list(timeline.layout.yaxis.categoryarray)  # the lanes, and the queue's row if drawn
    timeline.update_yaxes(  # a record has lanes, not slots: the axis says so; the queue its name
        tickvals=rows, ticktext=[lane_label(row, record) for row in rows]
    )
    lanes = counted(record.num_slots, "lane")
    num_ranks = int(record.info.get("dp_size") or 1)
    if num_ranks > 1:
        lanes += f" on {num_ranks} engine cores (data parallel)"
    mask = mask_heatmaps.mask_heatmap(record, at)
    blocks = block_map.block_map_figure(record, at)
    inside = f"{name} from the inside"
    return (
        labelled(
            timeline,
            f"{inside}: {lanes}",
            source,
            LANES_NOTE.format(who=scheduler_name(record)),
            _wrapped(plans_line(ours, name, record)),
            *(_wrapped(c) for c in causes_lines(ours, name, record, runs[name], run_dtype)),
        ),
        labelled(
            mask,
            f"{inside} · {mask.layout.title.text}",
            source,
            past,
            _wrapped(step_plan_line(ours, name, record, at)),
        ),
        labelled(
            blocks,
            f"{inside} · {blocks.layout.title.text}",
            source,
            html.escape(blocks_note(record)),
            past,
        ),
    )


def clamped_step(name: str, num_steps: int, step_index: int) -> tuple[int, str]:
    """The step ``step_index`` shows (clamped) and, past the last, a note saying so."""
    last = num_steps - 1
    past = f"{name} ran {counted(num_steps, 'step')}: its last, {last}, is shown"
    return min(max(step_index, 0), last), past if step_index > last else ""


def lane_label(row: str, record: Trace) -> str:
    """Row label: "slot 3" reads "lane 3" (with data parallelism "rank 1 · lane 0")."""
    num_ranks, per_rank = record.info.get("dp_size") or 1, record.info.get("lanes_per_rank")
    if not row.startswith("slot ") or num_ranks <= 1 or not per_rank:
        return row.replace("slot", "lane")
    rank, lane = divmod(int(row.removeprefix("slot ")), per_rank)
    return f"rank {rank} · lane {lane}"


def _wrapped(line: str) -> str:
    parts = textwrap.wrap(line, SUBTITLE_LINE_CHARS, break_on_hyphens=False)
    return "<br>".join(html.escape(part) for part in parts)


def usage_figure(runs: dict[str, Trace]) -> Any:
    """Tokens scheduled against the budget and KV blocks in use, per step of the first record."""
    what = "tokens and KV blocks per step"
    found = own_record(runs)
    if found is None:
        return no_record_figure(runs, what)
    name, record = found
    fig = serving_metrics.step_usage_figure(record)
    return labelled(fig, f"{name} from the inside: {what}", source_line(name, record))
