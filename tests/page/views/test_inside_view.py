"""vLLM from the inside on the page: its own record of a real run (captured from vLLM 0.32,
``tests/captured_vllm.py``) drawn in our engines' views, moved by the step slider's handler, each
view labelled with where it comes from; a server without a record says why it has none."""

from __future__ import annotations

import dataclasses
import html
import re

import pytest
from captured_vllm import CAPS, PROMPT_LENS, captured_vllm_trace
from fake_traces import continuous_trace, static_trace

from engine.page.figures import serving_metrics
from engine.page.handlers import playground
from engine.page.views import inside_view, run_view, tables
from engine.page.views.run_view import RunState
from engine.trace import ServerSample, Trace

INSIDE = ("inside_timeline_plot", "inside_mask_plot", "inside_block_map_plot")


def _state(servers: dict[str, Trace]) -> RunState:
    static = static_trace(PROMPT_LENS, CAPS, num_slots=3)
    continuous = continuous_trace(PROMPT_LENS, CAPS, num_slots=3)
    return RunState(static, continuous, None, servers=servers)


@pytest.fixture(scope="module")
def vllm() -> Trace:
    """The captured run, with one /metrics sample (the capture kept none)."""
    trace = captured_vllm_trace()
    trace.server_samples = [ServerSample(0.2, {"num_requests_running": 2.0})]
    return trace


@pytest.fixture(scope="module")
def shown(vllm) -> run_view.RunResult:
    """The run as the page renders it (no download files)."""
    return run_view.render(_state({"vllm": vllm}), downloads=False)


def _inside_at(state: RunState, step: int, x_axis: str = "step") -> dict:
    """The step slider's handler at ``step``: the inside views, by output name."""
    figures = playground.update_step(state, step, x_axis)
    views = dict(zip(run_view.STEP_VIEW_OUTPUTS, figures, strict=True))
    return {name: views[name] for name in INSIDE}


def test_step_slider_walks_vllms_own_steps(shown, vllm):
    """The slider spans vLLM's steps (named in its label); at each, vLLM's packed mask has the
    tokens vLLM scheduled in that step, and its block map the blocks vLLM's tables held then."""
    record = vllm.schedule
    assert shown.state.num_steps >= len(record.steps)
    assert f"vllm 0–{len(record.steps) - 1} (its own record)" in run_view.slider_label(shown.state)
    masks = set()
    for k, step in enumerate(record.steps):
        views = _inside_at(shown.state, k)
        mask = views["inside_mask_plot"]
        assert mask.layout.title.text.startswith(f"vllm from the inside · Packed step {k}: ")
        assert len(mask.data[0].y) == step.num_scheduled_tokens, f"step {k}: other queries"
        blocks = views["inside_block_map_plot"]
        assert blocks.layout.title.text == f"vllm from the inside · KV block map at step {k}"
        held = {
            b
            for b, label in enumerate(c for row in blocks.data[0].text for c in row)
            if label.startswith("R")
        }
        assert held == set(step.block_holders()), f"step {k}: not vLLM's block ids"
        masks.add(mask.to_json())
    assert len(masks) > 1, "the mask did not change with the step"


def test_shared_prefix_blocks_preemptions_and_cache_hits(shown, vllm):
    """The block map names the prefix blocks R1 and R2 share (×2); the timeline and the tokens
    chart mark vLLM's preemption; R1's 64 cached prompt tokens show in its hover, in the outputs
    table and as pale key columns of its mask."""
    record = vllm.schedule
    k = next(i for i, s in enumerate(record.steps) if s.shared_blocks)
    blocks = _inside_at(shown.state, k)["inside_block_map_plot"]
    assert any(label.endswith("×2") for row in blocks.data[0].text for label in row)
    timeline = _inside_at(shown.state, 0)["inside_timeline_plot"]
    assert "preemption" in [t.name for t in timeline.data], "no preemption mark"
    hovers = [h for t in timeline.data if t.name == "R1" for h in t.hovertext]
    assert all("64 prompt tokens from the prefix cache" in h for h in hovers), hovers
    usage = shown.inside_usage
    assert "preemption" in [t.name for t in usage.data]
    assert usage.layout.title.text == "vllm from the inside: tokens and KV blocks per step"
    r1 = next(row for row in shown.outputs if row[0] == "R1")
    assert r1[-1].endswith("· vllm 64"), r1[-1]
    first = next(i for i, s in enumerate(record.steps) if 1 in {q.request_id for q in s.seqs})
    mask = _inside_at(shown.state, first)["inside_mask_plot"]
    assert "64 keys from the prefix cache" in mask.layout.title.subtitle.text


def test_each_view_says_where_it_comes_from(shown):
    """Inside views say they come from vLLM's own record; the lanes and /metrics chart that they
    are the view from outside; the page's note says both."""
    for name, fig in _inside_at(shown.state, 2, "time").items():
        assert fig.layout.title.subtitle.text.startswith("From vllm&#x27;s own record"), name
    assert shown.inside_usage.layout.title.subtitle.text.startswith("From vllm&#x27;s own")
    for fig in (shown.server_timeline, shown.server_chart):
        assert fig.layout.title.subtitle.text.startswith("View from outside"), fig.layout.title
    note = inside_view.INSIDE_NOTE
    assert "**own record**" in note and "**view from outside**" in note


def test_metrics_row_counts_vllms_own_steps(shown, vllm):
    """vLLM's metrics row takes steps, preemptions and the prefix-cache hit rate from its
    record, not "—" or the client's zero."""
    values = next(r for r in shown.metrics if r[0] == "vllm")
    row = dict(zip(tables.METRICS_HEADERS, values, strict=True))
    inside = vllm.schedule.metrics()
    assert row["steps"] == inside.num_steps == len(vllm.schedule.steps)
    assert row["preemptions"] == inside.num_preemptions > 0
    assert row["prefix-cache hit rate %"] == round(100 * inside.prefix_cache_hit_rate, 1) > 0


def test_without_a_record_the_inside_views_say_why(vllm):
    """A server without its own record: every inside view is a message that says so, and the
    step slider keeps our engines' range."""
    plain = Trace("gpu", 3, requests=vllm.requests, wall_s=vllm.wall_s)
    state = _state({"gpu": plain})
    assert state.num_steps == max(len(state.static.steps), len(state.continuous.steps))
    result = run_view.render(state, downloads=False)
    figures = [*_inside_at(state, 0).values(), result.inside_usage]
    for fig in figures:
        (note,) = fig.layout.annotations
        assert "gpu: no record of its own steps" in note.text, note.text
    none = run_view.render(_state({}), downloads=False)
    assert "No server ran" in none.inside_usage.layout.annotations[0].text


def test_labels_leave_the_plot_its_height(shown):
    """A label's extra subtitle lines grow the figure by the margin they take, so the plot area
    (the block map's one row of blocks) keeps its height."""
    from engine.page.figures import block_map

    record = shown.state.servers["vllm"].schedule
    plain = block_map.block_map_figure(record, 0)
    labelled = _inside_at(shown.state, 0)["inside_block_map_plot"]
    plot_px = [f.layout.height - f.layout.margin.t - f.layout.margin.b for f in (plain, labelled)]
    assert plot_px[0] == plot_px[1] > 0, f"plot area {plot_px[0]} px, labelled {plot_px[1]} px"


def test_downloads_carry_vllms_own_steps(vllm):
    """The run's traces.json holds vLLM's record and charts.html its three step views."""
    import json
    from pathlib import Path

    files = {Path(p).name: Path(p) for p in run_view.render(_state({"vllm": vllm})).downloads}
    traces = json.loads(files["traces.json"].read_text())
    assert len(traces["vllm"]["schedule"]["steps"]) == len(vllm.schedule.steps)
    charts = files["charts.html"].read_text()
    for heading in run_view.inside_headings("vllm"):
        assert f"<h2>{heading.replace(chr(39), '&#x27;')}</h2>" in charts, heading


def test_plans_alike_and_the_first_difference_beside_the_inside_view(vllm):
    """vLLM's timeline says how many steps plan alike with our continuous run and where the
    first difference is; its packed mask says whether the shown step plans as ours, and that
    the rows' order within a step does not change the plan."""
    record = vllm.schedule
    state = _state({"vllm": vllm})  # ours: another workload's schedule, unlike vLLM's
    subtitle = _inside_at(state, 0)["inside_timeline_plot"].layout.title.subtitle.text
    lines = html.unescape(subtitle).split("<br>")
    assert max(map(len, lines)) <= inside_view.SUBTITLE_LINE_CHARS, "a line plotly would cut"
    subtitle = subtitle.replace("<br>", " ")  # the long plans line comes wrapped
    found = re.search(
        r"plans alike with ours \(continuous\): (\d+) of (\d+) steps, first "
        r"difference at step (\d+) \((.+)\)",
        subtitle,
    )
    assert found, f"no plans line under vLLM's timeline: {subtitle!r}"
    k = int(found.group(3))
    mask = _inside_at(state, k)["inside_mask_plot"].layout.title.subtitle.text.replace("<br>", " ")
    assert f"step {k} differs from ours: " in mask, f"step {k}'s mask does not say so: {mask!r}"

    alike = dataclasses.replace(record, engine="continuous")  # a run that planned as vLLM did
    state = RunState(state.static, alike, None, servers={"vllm": vllm})
    subtitle = _inside_at(state, 0)["inside_timeline_plot"].layout.title.subtitle.text
    subtitle = subtitle.replace("<br>", " ")
    n = len(record.steps)
    assert f"plans alike with ours (continuous): {n} of {n} steps, no difference" in subtitle, (
        f"the same plans are not said to be alike: {subtitle!r}"
    )
    mask = _inside_at(state, 1)["inside_mask_plot"].layout.title.subtitle.text
    mask = html.unescape(mask).replace("<br>", " ")
    assert (
        "step 1 plans as ours (rows in each scheduler's own order, which does not change " in mask
    ), mask


def test_vllms_timeline_names_lanes_not_slots(shown):
    """vLLM's own timeline says it has lanes, not slots, on its axis as in its subtitle."""
    axis = shown.views.inside_timeline.layout.yaxis
    assert axis.ticktext, "vLLM's timeline axis has no lane labels (its axis reads slot 0, 1, ...)"
    lanes = [text for text in axis.ticktext if text != serving_metrics.QUEUE_ROW]
    assert lanes == [f"lane {i}" for i in range(len(lanes))], axis.ticktext


def test_vllms_queue_waits_are_labelled_as_the_queue_not_a_lane(shown):
    """Every row of vLLM's own timeline has a label: its queue waits' row says "queue" (without
    one, it read as a fourth lane under three labelled ones)."""
    fig = shown.views.inside_timeline
    assert any(t.name == "queue wait" for t in fig.data), "the captured run should have waits"
    axis = fig.layout.yaxis
    labels = dict(zip(axis.tickvals or (), axis.ticktext or (), strict=True))
    unlabelled = [row for row in axis.categoryarray if row not in labels]
    assert not unlabelled, f"rows without a label on vLLM's timeline: {unlabelled}"
    assert labels[serving_metrics.QUEUE_ROW] == serving_metrics.QUEUE_ROW, labels


def test_an_inside_timeline_on_our_longer_scale_says_where_its_record_ends(vllm):
    """When our static run takes more steps than vLLM's record, vLLM's timeline keeps our
    timelines' x scale and its subtitle says it is shared and where its own record ends."""
    state = _state({"vllm": vllm})
    longer = static_trace(PROMPT_LENS, [cap * 3 for cap in CAPS], num_slots=1)
    state = dataclasses.replace(state, static=longer)
    _, record = inside_view.own_record(state.servers)
    assert len(longer.steps) > len(record.steps), "the test needs our run to be the longer one"
    timeline = _inside_at(state, 0, "step")["inside_timeline_plot"]
    said = f"x axis shared with the other timelines · this run takes {len(record.steps)} steps"
    assert said in timeline.layout.title.subtitle.text, timeline.layout.title.subtitle.text
    assert timeline.layout.xaxis.range[1] == len(longer.steps), timeline.layout.xaxis.range


def _causes(state: RunState) -> str:
    subtitle = _inside_at(state, 0)["inside_timeline_plot"].layout.title.subtitle.text
    return html.unescape(subtitle).replace("<br>", " ")


def test_each_known_cause_of_unlike_plans_is_said_beside_the_comparison(vllm):
    """Beside "first difference at step k", one sentence per known cause (issue 51, item 7): the
    captured run's requests arrive over time (the client sends each when it arrives, nothing
    holds vLLM's steps for it), ours ran 2 slots to its 3, in bfloat16 to its float32, and without
    the prefix caching its record shows hits of; with every request at 0, a request that reached
    vLLM after its first step began is named instead of the arrivals."""
    from tiny_model import make_requests, tiny_runner

    from engine.batching.continuous import ContinuousEngine
    from engine.config import EngineConfig

    arrivals = {r.request_id: r.arrival_s for r in vllm.requests}
    specs = [("hello there", 4), ("a b c", 4), ("x", 4), ("yz", 4)]
    requests = [
        dataclasses.replace(r, arrival_s=arrivals[r.request_id]) for r in make_requests(specs)
    ]
    ours = ContinuousEngine(tiny_runner(), EngineConfig(2)).run(requests)
    server = dataclasses.replace(vllm, info={**vllm.info, "server": {"dtype": "float32"}})
    server.info["server"]["run_dtype"] = "bfloat16"
    state = RunState(_state({}).static, ours, None, servers={"vllm": server})
    said = _causes(state)
    assert "first difference at step" in said, said
    for cause in (
        "Arrivals: the client sends each request to vllm at its arrival time",
        "Slots: vllm runs up to 3 sequences at once, ours 2.",
        "Precision: vllm computes in float32, ours in bfloat16",
        "Prefix caching: vllm caches prompt prefixes, ours does not",
    ):
        assert cause in said, f"{cause!r} not said: {said!r}"

    at_once = [dataclasses.replace(r, arrival_s=0.0) for r in requests]
    ours = ContinuousEngine(tiny_runner(), EngineConfig(3)).run(at_once)
    first_s = vllm.schedule.steps[0].start_s
    late = [
        dataclasses.replace(r, arrival_s=first_s + 0.01 * (r.request_id == 1))
        for r in vllm.schedule.requests
    ]
    record = dataclasses.replace(vllm.schedule, requests=late)
    server = dataclasses.replace(vllm, schedule=record)
    said = _causes(RunState(_state({}).static, ours, None, servers={"vllm": server}))
    assert "R1 reached vllm only after its first step began" in said, said
    assert "Arrivals:" not in said and "Slots:" not in said, said


def test_a_queue_wait_and_a_records_precision_are_said_beside_the_comparison(vllm):
    """vLLM's first step 5 s after its requests were sent, ours at once: the wait is said even
    where the plans are alike (it lengthens every time to first token); an endpoint's record
    names its dtype, set against the run's (issue 51, item 7)."""
    ours = dataclasses.replace(vllm.schedule, engine="continuous")  # plans as vLLM's
    late = dataclasses.replace(
        vllm.schedule,
        steps=[
            dataclasses.replace(s, start_s=s.start_s + 5, end_s=s.end_s + 5)
            for s in vllm.schedule.steps
        ],
    )
    server = dataclasses.replace(vllm, schedule=late)
    said = _causes(RunState(_state({}).static, ours, None, servers={"vllm": server}))
    assert "no difference" in said, said
    # step 0 at 0.81 s + 5 s, the last request sent before it (R0) at 0.9 s; ours: 0.81 - 0.6
    queued = "Queue: vllm's first step began 4.9 s after the last request before it was sent, "
    assert queued + "ours 0.21 s after: the requests waited in vllm's queue" in said, said

    record = dataclasses.replace(vllm.schedule, info={**vllm.schedule.info, "dtype": "float32"})
    state = _state({"vllm": dataclasses.replace(vllm, schedule=record)})
    said = _causes(dataclasses.replace(state, dtype="bfloat16"))
    assert "Precision: vllm computes in float32, ours in bfloat16" in said, said
