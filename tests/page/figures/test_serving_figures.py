"""Serving figures (latency CDFs, budget and KV use per step, block map, queue and preemption
marks), checked against the records of a real paged run on the tiny model."""

import pytest
from family_models import family_runner
from tiny_model import make_requests, tiny_runner

from engine.batching.continuous import ContinuousEngine
from engine.batching.static import StaticEngine
from engine.config import EngineConfig
from engine.page.figures import block_map, serving_metrics, style, timelines
from engine.trace import PREFILL

SPECS = [("the quick brown fox", 30), ("hello world", 24), ("abc", 20), ("z" * 12, 9), ("q", 5)]
BLOCK_SIZE = 4


@pytest.fixture(scope="module")
def runner():
    return tiny_runner(seed=5)


@pytest.fixture(scope="module")
def paged(runner):
    """4 slots over 14 blocks of 4 tokens, a token budget of 8: preemption and chunking happen."""
    mib = 14 * BLOCK_SIZE * runner.kv_bytes_per_token() / 2**20
    config = EngineConfig(
        4, kv_mode="paged", block_size=BLOCK_SIZE, kv_budget_mib=mib, max_num_batched_tokens=8
    )
    trace = ContinuousEngine(runner, config).run(make_requests(SPECS))
    assert trace.metrics().num_preemptions > 0, "the fixture should preempt"
    return trace


@pytest.fixture(scope="module")
def static(runner):
    return StaticEngine(runner, EngineConfig(2)).run(make_requests(SPECS))


def test_cdf_has_one_line_per_engine_per_metric_through_every_value(paged, static):
    """Each panel has a line per engine whose x values are that engine's sorted request values."""
    fig = serving_metrics.latency_cdf_figure([static, paged])
    assert len(fig.data) == 3 * 2
    for line in fig.data:
        trace = {"static": static, "continuous": paged}[line.name]
        metric = {"x": "ttft_s", "x2": "tpot_s", "x3": "latency_s"}[line.xaxis]
        values = sorted(v for r in trace.requests if (v := getattr(r, metric)) is not None)
        assert list(line.x) == pytest.approx(values), f"{line.name} {metric}"
        assert line.y[-1] == pytest.approx(1.0) and list(line.y) == sorted(line.y)


def test_step_usage_stacks_tokens_under_the_budget_and_follows_kv_blocks(paged):
    """Prefill + decode bars add up to each step's tokens; the KV line is the blocks in use, its
    hover their share of the pool, whose line says its size (the servers chart's 100 %)."""
    fig = serving_metrics.step_usage_figure(paged)
    bars = [t for t in fig.data if t.type == "bar"]
    totals = [sum(b.y[i] or 0 for b in bars) for i in range(len(paged.steps))]
    assert totals == [st.num_scheduled_tokens for st in paged.steps]
    assert max(totals) <= 8
    assert any(s.y0 == 8 for s in fig.layout.shapes), "token budget line at 8"
    kv = next(t for t in fig.data if t.name == "KV blocks in use")
    assert list(kv.y) == [st.kv_blocks_used for st in paged.steps]
    assert list(kv.customdata) == [100 * st.kv_blocks_used / 14 for st in paged.steps]
    assert "of 14 blocks, %{customdata:.0f} % of the pool" in kv.hovertemplate
    pool = [a.text for a in fig.layout.annotations if a.text.startswith("the whole pool")]
    assert pool and "100 %:<br>14 blocks of 4 tokens, " in pool[0] and " MiB" in pool[0], pool
    marks = next(t for t in fig.data if t.name == "preemption")
    assert list(marks.x) == [st.index for st in paged.steps if st.preempted]


def test_step_usage_prefill_bars_show_on_a_narrow_chart(paged):
    """Prefill bars carry an outline in their colour (at least 2 px wide where a step is under a
    pixel, on a phone) and are absent, not zero, on decode-only steps (no outline along the
    axis); steps sit side by side."""
    fig = serving_metrics.step_usage_figure(paged)
    prefill, decode = (t for t in fig.data if t.type == "bar")
    assert prefill.name == "prefill tokens" and decode.name == "decode tokens"
    assert prefill.marker.line.width >= 2 and prefill.marker.line.color == prefill.marker.color
    assert not decode.marker.line.width, "decode bars outlined: one dark band at 300 steps"
    has_prefill = [any(s.kind == PREFILL for s in st.seqs) for st in paged.steps]
    assert any(has_prefill) and not all(has_prefill), "the fixture needs both kinds of step"
    assert [y is not None for y in prefill.y] == has_prefill, list(prefill.y)
    assert fig.layout.bargap == 0, "gaps between steps"


def test_block_map_colours_each_owned_block_by_its_request(paged):
    """Owned cells carry their request's colour code, free cells code 0, per the block tables."""
    step = max(paged.steps, key=lambda s: s.kv_blocks_used)
    fig = block_map.block_map_figure(paged, step.index)
    cells = [z for row in fig.data[0].z for z in row if z is not None]
    assert len(cells) == paged.info["kv_blocks"]
    assert sum(1 for z in cells if z != 0) == step.kv_blocks_used
    cols = len(fig.data[0].z[0])
    for rid, table in step.block_tables.items():
        want = 1 + style.PALETTE.index(style.request_color(rid))
        for block in table:
            assert fig.data[0].z[block // cols][block % cols] == want, f"block {block} of R{rid}"
            label = fig.data[0].text[block // cols][block % cols]
            assert label == f"R{rid}", f"block {block} of R{rid} is labelled {label!r}"
            hover = fig.data[0].customdata[block // cols][block % cols]
            assert hover.startswith(f"block {block}: R{rid}, tokens "), hover
    assert fig.data[0].texttemplate == "%{text}", "the owners' names are not drawn on the blocks"


def test_block_map_explains_itself_without_paging(runner):
    trace = ContinuousEngine(runner, EngineConfig(2)).run(make_requests(SPECS[:2]))
    fig = block_map.block_map_figure(trace, 0)
    assert "paged" in fig.layout.annotations[0].text


@pytest.mark.parametrize("x_axis", ["time", "step"])
def test_timeline_marks_queue_waits_and_preemptions(paged, x_axis):
    """A queue bar per request that waited; a cross per preemption on the lane it left."""
    fig = serving_metrics.add_serving_marks(timelines.timeline_figure(paged, x_axis), paged, x_axis)
    queue = next(t for t in fig.data if t.name == "queue wait")
    waits = serving_metrics.queue_waits(paged)
    assert sum(1 for w in waits if w[3]) == paged.metrics().num_preemptions, "one per preemption"
    assert sorted(rid for rid, *_, again in waits if not again) == [
        r.request_id for r in paged.requests
    ]
    drawn = [w for w in waits if w[2] - w[1] > serving_metrics.MIN_QUEUE_S]
    assert len(queue.x) == len(drawn) > 0
    assert all(w >= 0 for w in queue.x)
    crosses = next(t for t in fig.data if t.name == "preemption")
    assert len(crosses.x) == paged.metrics().num_preemptions
    first = next(st for st in paged.steps if st.preempted)
    before = {s.request_id: s.slot for s in paged.steps[first.index - 1].seqs}
    assert crosses.y[0] == f"slot {before[first.preempted[0]]}"
    assert fig.layout.yaxis.categoryarray[0] == "queue"


def test_queue_waits_are_set_apart_from_the_lanes(paged):
    """The queue's row is no lane: a line parts it from the lanes, and its bars are half a lane's
    height (a lane's request bar takes plotly's default, 0.8 of its row)."""
    fig = serving_metrics.add_serving_marks(timelines.timeline_figure(paged), paged)
    queue = next(t for t in fig.data if t.name == "queue wait")
    lanes = [t for t in fig.data if t.type == "bar" and t.name != "queue wait"]
    assert queue.width is not None and queue.width <= 0.4, (
        f"queue bars as tall as a lane's: {queue.width}"
    )
    assert all(t.width is None for t in lanes), "a lane's bars changed height"
    parting = [s for s in fig.layout.shapes if s.y0 == s.y1 == 0.5 and s.yref == "y"]
    assert parting, "no line parts the queue's row from the lanes"


def test_a_token_budget_far_over_the_steps_is_named_not_drawn(paged):
    """A budget of 2048 tokens over steps of at most 8 (vLLM's own record) is not drawn, which
    would flatten the bars into the axis: a label names it "off this scale"."""
    import dataclasses

    wide = dataclasses.replace(paged, info={**paged.info, "token_budget": 2048})
    fig = serving_metrics.step_usage_figure(wide)
    assert not any(s.y0 == 2048 for s in fig.layout.shapes), "the 2048 line flattens the bars"
    labels = [a.text for a in fig.layout.annotations]
    assert "token budget 2048: off this scale" in labels, f"the budget is not named: {labels}"


def test_block_map_marks_blocks_freed_out_of_the_window():
    """A Mistral run (window 8) on a tight pool: blocks that fell out of a window and were not
    taken since are drawn in their own colour, hover and subtitle saying "freed: out of window"."""
    runner = family_runner("mistral")
    mib = 20 * BLOCK_SIZE * runner.kv_bytes_per_token() / 2**20
    config = EngineConfig(3, kv_mode="paged", block_size=BLOCK_SIZE, kv_budget_mib=mib)
    trace = ContinuousEngine(runner, config).run(make_requests(SPECS))
    step = max(trace.steps, key=lambda s: len(s.window_freed_blocks))
    freed = step.window_freed_blocks
    assert freed, "no block was freed out of the window"
    fig = block_map.block_map_figure(trace, step.index)
    cols = len(fig.data[0].z[0])
    code = 3 + len(style.PALETTE)
    colors = fig.data[0].colorscale
    assert colors[2 * code][1] == block_map.WINDOW_FREED_BLOCK_COLOR
    for block in range(trace.info["kv_blocks"]):
        z = fig.data[0].z[block // cols][block % cols]
        hover = fig.data[0].customdata[block // cols][block % cols]
        assert (z == code) == (block in freed), f"block {block}: code {z}, {hover}"
        assert ("freed: out of window" in hover) == (block in freed), hover
    subtitle = fig.layout.title.subtitle.text
    assert f"{len(freed)} blocks freed: out of window" in subtitle, subtitle


def test_block_map_shows_each_kv_cache_group_and_its_freed_blocks():
    """A Gemma 2 run (layer 0 sliding, window 8; layer 1 global): the map draws the blocks of
    both groups, each hover naming its group, and the sliding group's freed blocks in teal; the
    subtitle counts each group's blocks."""
    runner = family_runner("gemma2")
    config = EngineConfig(3, kv_mode="paged", block_size=BLOCK_SIZE)
    trace = ContinuousEngine(runner, config).run(make_requests(SPECS))
    step = max(trace.steps, key=lambda s: len(s.window_freed_blocks))
    freed = step.window_freed_blocks
    assert freed, "the sliding group freed no block"
    fig = block_map.block_map_figure(trace, step.index)
    cols, code = len(fig.data[0].z[0]), 3 + len(style.PALETTE)
    hovers = {}
    for block in range(trace.info["kv_blocks"]):
        z = fig.data[0].z[block // cols][block % cols]
        hovers[block] = fig.data[0].customdata[block // cols][block % cols]
        assert (z == code) == (block in freed), f"block {block}: code {z}, {hovers[block]}"
    for group, (name, tables) in enumerate(
        zip(["global, layer 1", "window 8, layer 0"], step.group_block_tables, strict=True)
    ):
        held = {b: rid for rid, table in tables.items() for b in table if b >= 0}
        assert held, f"group {group} holds no block"
        for block, rid in held.items():
            assert f"R{rid}" in hovers[block] and f"group {group} ({name})" in hovers[block]
        assert f"{name}: {len(held)}" in fig.layout.title.subtitle.text
    assert f"{len(freed)} blocks freed: out of a sliding window" in fig.layout.title.subtitle.text
