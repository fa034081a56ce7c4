"""Figure and table builders, checked on hand-built traces (no model)."""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from fake_traces import STEP_S, continuous_trace, static_trace

from engine.page.figures import mask_heatmaps, style, timelines
from engine.serving.masks import packed_step_mask, padded_wave_mask
from engine.trace import DECODE, IDLE, PREFILL, RequestRecord, ScheduledSeq, StepRecord, Trace

PROMPT_LENS = [5, 6, 8, 9, 10, 7]
CAPS = [6, 50, 300, 30, 180, 45]  # the article's caps


@pytest.fixture
def static() -> Trace:
    return static_trace(PROMPT_LENS, CAPS, num_slots=3)


@pytest.fixture
def continuous() -> Trace:
    return continuous_trace(PROMPT_LENS, CAPS, num_slots=3)


def _shapes(fig, name: str) -> list:
    return [s for s in fig.layout.shapes if s.name == name]


def _request_bars(fig) -> dict[str, object]:
    return {t.name: t for t in fig.data if t.name.startswith("R")}


def _fused_step(trace: Trace) -> int:
    return next(
        i for i, step in enumerate(trace.steps) if {s.kind for s in step.seqs} == {PREFILL, DECODE}
    )


def test_request_color_is_stable_and_distinct():
    """A request always gets the same palette colour; neighbouring ids get different ones."""
    assert style.request_color(3) == style.request_color(3 + len(style.PALETTE))
    first = [style.request_color(i) for i in range(len(style.PALETTE))]
    assert len(set(first)) == len(first), f"palette colours repeat: {first}"


def test_continuous_timeline_has_one_bar_per_request(continuous):
    """Each continuous request is one bar spanning its first to its last step, in its colour."""
    bars = _request_bars(timelines.timeline_figure(continuous))
    assert sorted(bars) == [f"R{i}" for i in range(len(CAPS))], f"bar traces: {sorted(bars)}"
    for rec in continuous.requests:
        bar = bars[f"R{rec.request_id}"]
        assert len(bar.x) == 1, f"R{rec.request_id} drawn as {len(bar.x)} bars, expected 1"
        assert bar.y[0] == f"slot {rec.slot}", f"R{rec.request_id} in lane {bar.y[0]}"
        assert bar.base[0] == pytest.approx(rec.admit_s), "bar does not start at the prefill step"
        assert bar.base[0] + bar.x[0] == pytest.approx(rec.finish_s), "bar does not end at finish"
        assert bar.marker.color == style.request_color(rec.request_id), "bar colour differs"


def test_continuous_timeline_has_no_idle_or_barrier(continuous):
    """The continuous timeline draws neither idle rows nor wave barriers."""
    fig = timelines.timeline_figure(continuous)
    assert not [t for t in fig.data if not t.name.startswith("R")], "continuous has idle bars"
    assert not _shapes(fig, "barrier"), "continuous timeline has barriers"


def test_static_timeline_draws_idle_rows_and_one_barrier_per_wave(static):
    """Idle rows are one grey bar per early-finished request; a dashed barrier ends each wave
    that another follows (the run's end is no barrier: its label would leave the plot)."""
    fig = timelines.timeline_figure(static, x_axis="step")
    num_waves = len({s.wave for s in static.steps})
    assert num_waves > 1, "the fixture needs two waves"
    assert len(_shapes(fig, "barrier")) == num_waves - 1, "expected one barrier between waves"
    ends = [x.x0 for x in _shapes(fig, "barrier")]
    assert max(ends) < len(static.steps), f"a barrier at the run's end: {ends}"
    assert all(s.line.dash == "dash" for s in _shapes(fig, "barrier")), "barriers not dashed"
    (idle,) = [t for t in fig.data if not t.name.startswith("R")]
    idle_slot_steps = sum(s.kind == IDLE for step in static.steps for s in step.seqs)
    assert sum(idle.x) == idle_slot_steps, "idle bars do not cover every idle row-step"
    assert len(idle.x) == 4, "R0, R1 (wave 0) and R3, R5 (wave 1) idle after finishing"
    assert idle.marker.pattern.shape == "/", "idle rows are not hatched"


def test_barrier_labels_keep_apart_and_inside_the_chart():
    """Barrier labels (a fifth of the x range wide: a label on a phone) never share room: one slot,
    caps 20, 2, 20, 10 puts barriers at steps 20, 22 and 42 of 52; the first is labelled left of
    its line, the second right of it, the third (no room either side) is a line alone. A barrier
    near the axis is labelled right of its line."""
    fig = timelines.timeline_figure(static_trace([4] * 4, [20, 2, 20, 10], 1), x_axis="step")
    assert [s.x0 for s in _shapes(fig, "barrier")] == [20, 22, 42]
    labels = [(a.x, a.xanchor) for a in fig.layout.annotations if a.text == "barrier"]
    assert labels == [(20, "right"), (22, "left")], f"labels (x, anchor): {labels}"
    near = timelines.timeline_figure(static_trace([4] * 2, [2, 30], 1), x_axis="step")
    (label,) = [a for a in near.layout.annotations if a.text == "barrier"]
    assert (label.x, label.xanchor) == (2, "left"), "a label near the axis left the plot"


def _luminance(color: str) -> float:
    """WCAG relative luminance of "#rrggbb" or "rgb(a)(r,g,b[,a])" (alpha ignored)."""
    if color.startswith("#"):
        rgb = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    else:
        rgb = [float(v) for v in re.findall(r"[\d.]+", color)[:3]]
    linear = [c / 255 / 12.92 if c <= 10 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def _contrast(a: str, b: str) -> float:
    high, low = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_barrier_labels_read_on_the_light_and_the_dark_theme(static):
    """Each "barrier" label has a box of its own, near opaque, and its text contrasts with that
    box by at least 4.5:1 (WCAG AA), so it reads on white, on Gradio's dark background and over
    the grey idle rows alike."""
    labels = [
        a for a in timelines.timeline_figure(static).layout.annotations if a.text == "barrier"
    ]
    assert labels, "no barrier label drawn"
    for label in labels:
        box = label.bgcolor or "rgba(0,0,0,0)"
        alpha = float(re.findall(r"[\d.]+", box)[3]) if box.startswith("rgba") else 1.0
        assert alpha >= 0.8, f"the label's box is see-through ({box}): the theme shows through"
        text = label.font.color or style.TEXT_COLOR
        assert _contrast(text, box) >= 4.5, f"{text} on {box}: contrast {_contrast(text, box):.1f}"


def test_step_axis_spans_step_indices_and_x_max_is_honoured(continuous):
    """In step mode a bar covers [first step, last step + 1); x_max fixes the range."""
    fig = timelines.timeline_figure(continuous, x_axis="step", x_max=480)
    bar = _request_bars(fig)["R2"]  # the 300-token request, admitted at step 0
    assert (bar.base[0], bar.x[0]) == (0, 300), f"R2 spans {bar.base[0]} + {bar.x[0]}"
    assert list(fig.layout.xaxis.range) == [0, 480], "x_max not applied"


@pytest.mark.parametrize("x_axis", ["time", "step"])
def test_a_timeline_on_a_shared_x_axis_says_so_and_where_it_ends(static, continuous, x_axis):
    """Both engines' timelines run to the longer run's end, so bar lengths compare across them;
    each one's subtitle says its axis is shared and where its own run ends on it (the shorter
    run's empty right part read as a mistake), and both keep their plot's height."""
    x_max = max(timelines.x_extent(t, x_axis) for t in (static, continuous))
    for trace in (static, continuous):
        fig = timelines.timeline_figure(trace, x_axis, x_max)
        end = timelines.x_extent(trace, x_axis)
        own = f"ends at {end:.2f} s" if x_axis == "time" else f"takes {round(end)} steps"
        subtitle = fig.layout.title.subtitle.text or ""
        assert "x axis shared with the other timelines" in subtitle, f"{trace.engine}: {subtitle!r}"
        assert f"this run {own}" in subtitle, f"{trace.engine}: {subtitle!r}"
        assert list(fig.layout.xaxis.range) == [0, x_max]
        alone = timelines.timeline_figure(trace, x_axis)
        assert not alone.layout.title.subtitle.text, "an axis of its own is said to be shared"
        plot_px = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
        alone_px = alone.layout.height - alone.layout.margin.t - alone.layout.margin.b
        assert plot_px == alone_px, f"the subtitle took {alone_px - plot_px} px from the plot"


def test_cursor_sits_at_the_step(continuous):
    """The cursor is at the step's start time (time mode) or its index, and at the end past it."""
    at_time = _shapes(timelines.timeline_figure(continuous, cursor=7), "cursor")
    at_step = _shapes(timelines.timeline_figure(continuous, x_axis="step", cursor=7), "cursor")
    past = _shapes(timelines.timeline_figure(continuous, x_axis="step", cursor=10_000), "cursor")
    assert at_time[0].x0 == pytest.approx(7 * STEP_S), "time-mode cursor misplaced"
    assert at_step[0].x0 == 7, "step-mode cursor misplaced"
    assert past[0].x0 == len(continuous.steps), "cursor past the end not at the run's end"
    assert not _shapes(timelines.timeline_figure(continuous), "cursor"), "cursor without a step"


def test_a_gap_splits_a_slot_run():
    """Steps of one request in one slot merge into one bar only when they are consecutive."""
    trace = Trace(engine="continuous", num_slots=1)
    trace.requests = [RequestRecord(0, "p", 3, 2)]
    for i in (0, 1, 3):
        trace.steps.append(StepRecord(i, i, i + 1, [ScheduledSeq(0, 0, DECODE, 1, 2 + i)]))
    trace.steps.insert(2, StepRecord(2, 2, 3, []))
    bar = _request_bars(timelines.timeline_figure(trace, x_axis="step"))["R0"]
    assert list(zip(bar.base, bar.x, strict=True)) == [(0, 2), (3, 1)], "runs merged wrongly"


def test_hover_escapes_the_prompt():
    """A prompt's markup is escaped in hover text, never rendered."""
    trace = continuous_trace([3], [2], num_slots=1)
    trace.requests[0].prompt = "<b>bold</b>"
    hover = _request_bars(timelines.timeline_figure(trace))["R0"].hovertext[0]
    assert "&lt;b&gt;bold&lt;/b&gt;" in hover and "<b>bold" not in hover, hover


def test_packed_mask_heatmap_matches_the_engine_mask(continuous):
    """The packed heatmap is T x T_kv, its coloured cells are exactly the mask's allowed cells."""
    step_index = _fused_step(continuous)
    step = continuous.steps[step_index]
    cached = [s.num_cached_tokens for s in step.seqs]
    new = [s.num_new_tokens for s in step.seqs]
    mask = packed_step_mask(cached, new).numpy()
    fig = mask_heatmaps.mask_heatmap(continuous, step_index)
    z = np.asarray(fig.data[0].z)
    assert z.shape == mask.shape == (sum(new), sum(cached) + sum(new)), f"z is {z.shape}"
    assert np.array_equal(~np.isnan(z), mask), "coloured cells differ from the allowed cells"
    assert fig.layout.yaxis.autorange == "reversed", "queries do not read top-down"
    (split,) = _shapes(fig, "cached | new")
    assert split.x0 == sum(cached) - 0.5, "cached | new line misplaced"
    title = fig.layout.title.text
    assert f"T={sum(new)}" in title and f"T_kv={sum(cached) + sum(new)}" in title, title
    assert "1 prefill + 2 decode" in fig.layout.title.subtitle.text, fig.layout.title.subtitle.text


def test_packed_mask_colours_cells_by_request(continuous):
    """Each allowed cell holds its sequence's index, whose colour is that request's colour."""
    step_index = _fused_step(continuous)
    step = continuous.steps[step_index]
    fig = mask_heatmaps.mask_heatmap(continuous, step_index)
    z = np.asarray(fig.data[0].z)
    owners = [int(np.nanmax(row)) for row in z]
    expected = [i for i, s in enumerate(step.seqs) for _ in range(s.num_new_tokens)]
    assert owners == expected, "a query row is coloured by another sequence"
    scale = [c for _, c in fig.data[0].colorscale][::2]  # then paler: keys from a prefix cache
    assert scale[: len(step.seqs)] == [style.request_color(s.request_id) for s in step.seqs]
    assert fig.data[0].y[0].startswith(f"R{step.seqs[0].request_id} pos "), fig.data[0].y[0]


def test_huge_packed_step_is_aggregated():
    """A step over MAX_HEATMAP_CELLS is max-pooled into tiles, and the subtitle says so."""
    trace = Trace(engine="continuous", num_slots=2)
    trace.requests = [RequestRecord(0, "a", 1, 1000), RequestRecord(1, "b", 1, 3000)]
    seqs = [ScheduledSeq(0, 0, DECODE, 1, 1000), ScheduledSeq(1, 1, PREFILL, 3000, 0)]
    trace.steps = [StepRecord(0, 0.0, 1.0, seqs)]
    fig = mask_heatmaps.mask_heatmap(trace, 0)
    z = np.asarray(fig.data[0].z)
    assert z.size <= mask_heatmaps.MAX_HEATMAP_CELLS, f"{z.shape} handed to the browser"
    assert z.shape == (math.ceil(3001 / 6), 4001), f"unexpected tiling {z.shape}"
    assert set(np.unique(z[~np.isnan(z)])) == {0.0, 1.0}, "tiles lost a sequence"
    assert "aggregated" in fig.layout.title.subtitle.text, fig.layout.title.subtitle.text


def test_static_prefill_mask_shows_rows_padding(static):
    """Static step 0: rows stacked, request cells = padded mask, pad cells grey, none idle."""
    fig = mask_heatmaps.static_mask_heatmap(static, 0)
    z = np.asarray(fig.data[0].z)
    step = static.steps[0]
    width = max(s.num_new_tokens + s.num_padding_tokens for s in step.seqs)
    pads = [s.num_padding_tokens for s in step.seqs]
    mask = padded_wave_mask(pads, width, width).numpy()  # (B, Q, K)
    assert z.shape == (3 * width, width), f"z is {z.shape}"
    for b in range(3):
        block = z[b * width : (b + 1) * width]
        assert np.array_equal(block == b, mask[b]), f"row {b} cells differ from the padded mask"
    pad_cells = np.sum(z == 3)
    expected_pad = sum(p * (p + 1) // 2 + p * (width - p) for p in pads)
    assert pad_cells == expected_pad, f"{pad_cells} pad cells, expected {expected_pad}"
    assert not np.any(z == 4), "idle cells at a prefill step"
    assert fig.layout.yaxis.autorange == "reversed", "rows do not read top-down"


def test_static_decode_mask_shows_idle_rows(static):
    """A decode step after R0 finished: one query per row, R0's allowed cells drawn as idle."""
    step_index = 10  # wave 0, step 10: R0 (cap 6) is done, R1 and R2 still decode
    fig = mask_heatmaps.static_mask_heatmap(static, step_index)
    z = np.asarray(fig.data[0].z)
    width = 8
    assert z.shape == (3, width + step_index), f"z is {z.shape}"
    pad0 = static.steps[0].seqs[0].num_padding_tokens
    assert np.all(z[0, pad0:] == 4) and np.all(z[0, :pad0] == 3), "R0's finished row not idle"
    assert np.all(z[2] == 2), "R2 (no padding) should see every key"
    assert "1 idle row " in fig.layout.title.subtitle.text, fig.layout.title.subtitle.text


def test_counts_in_figure_text_agree_with_their_nouns():
    """One pad token, one key, one query, one idle row, one generated token: each is named in
    the singular ("1 pad token", never "1 pad tokens"); more than one in the plural."""
    assert style.counted(1, "pad token") == "1 pad token"
    assert style.counted(0, "query", "queries") == "0 queries"
    one_pad = static_trace([4, 5], [1, 2], num_slots=2)  # R0 left-padded by 1; done after step 0
    prefill = mask_heatmaps.static_mask_heatmap(one_pad, 0).layout.title.subtitle.text
    assert "1 pad token (" in prefill and "2 rows" in prefill, prefill
    decode = mask_heatmaps.static_mask_heatmap(one_pad, 1).layout.title.subtitle.text
    assert "× 1 query ×" in decode and "1 idle row (" in decode, decode
    single = continuous_trace([1], [1], num_slots=1)  # one 1-token prompt: 1 query, 1 key
    packed = mask_heatmaps.mask_heatmap(single, 0).layout.title.subtitle.text
    assert packed.startswith("1 query × 1 key ·"), packed
    hover = timelines.timeline_figure(single, x_axis="step").data[0].hovertext
    texts = [hover] if isinstance(hover, str) else list(hover or [])
    assert texts and all("generated 1 token<br>" in t for t in texts), texts


def test_side_by_side_mask_titles_sit_at_one_height(static, continuous):
    """The packed and the static mask (side by side on the page) hang their titles at the same
    fixed distance below the figure's top, though the static subtitle has two lines more (with
    Plotly's default the title is centred in a top margin that grows with the subtitle)."""
    figs = [
        mask_heatmaps.mask_heatmap(continuous, _fused_step(continuous)),
        mask_heatmaps.static_mask_heatmap(static, 0),
    ]
    subtitles = [f.layout.title.subtitle.text.count("<br>") for f in figs]
    assert subtitles[0] != subtitles[1], "the two subtitles no longer differ: a weaker test"
    for fig in figs:
        title = fig.layout.title
        placed = (title.y, title.yref, title.yanchor, title.pad.t)
        assert placed == (1, "container", "top", style.TITLE_TOP_PX), f"{title.text}: {placed}"


def test_figures_serialize_to_json(static, continuous):
    """Every figure serializes for the browser (NaN cells included)."""
    for fig in (
        timelines.timeline_figure(static, cursor=3),
        mask_heatmaps.mask_heatmap(continuous, _fused_step(continuous)),
        mask_heatmaps.static_mask_heatmap(static, 20),
    ):
        json.loads(fig.to_json())


def test_only_figure_builders_import_plotly():
    """House style: the figure builders (the modules of ``engine/page/figures/``) alone import
    plotly."""
    root = Path(__file__).resolve().parents[3]
    figures = root / "engine" / "page" / "figures"
    offenders = [
        str(p.relative_to(root))
        for p in [root / "app.py", *root.glob("engine/**/*.py")]
        if figures not in p.parents
        and any(f"{word} plotly" in p.read_text() for word in ("import", "from"))
    ]
    assert not offenders, f"plotly imported outside the figure builders: {offenders}"


def test_page_figures_carry_a_png_button_named_after_the_chart():
    """Every chart's JSON for the page has a config whose PNG file name comes from its title."""
    trace = continuous_trace(PROMPT_LENS, CAPS, num_slots=3)
    for fig in (
        timelines.timeline_figure(trace, "step", 20, 1),
        mask_heatmaps.mask_heatmap(trace, 1),
    ):
        sent = json.loads(fig.to_json())  # what gradio's Plot sends to the browser
        options = sent["config"]["toImageButtonOptions"]
        title_words = re.findall(r"[a-z0-9]+", fig.layout.title.text.lower())[:3]
        assert options["format"] == "png" and options["filename"].startswith("-".join(title_words))
        assert sent["data"] and sent["layout"], "the figure itself is missing"


def test_colours_repeat_only_with_a_visible_mark():
    """From R7 on a request shares a palette colour with an earlier one; its timeline bar then
    carries a pattern, and a mask in which two requests share a colour names both."""
    caps = [3] * 8
    trace = continuous_trace([4] * 8, caps, num_slots=8)
    assert style.request_color(0) == style.request_color(7)
    bars = _request_bars(timelines.timeline_figure(trace))
    patterns = {name: bar.marker.pattern.shape for name, bar in bars.items()}
    assert patterns["R7"] and not patterns["R0"], f"bar patterns: {patterns}"
    assert len({patterns[f"R{i}"] for i in range(7)}) == 1, "R0-R6 are unmarked alike"
    step = next(i for i, st in enumerate(trace.steps) if len(st.seqs) == 8)
    names = [a.text for a in mask_heatmaps.mask_heatmap(trace, step).layout.annotations]
    assert "<b>R0</b>" in names and "<b>R7</b>" in names, f"mask marks: {names}"
    assert "<b>R1</b>" not in names, "a request with a colour of its own is marked"


def test_charts_sent_to_the_page_carry_the_shared_template(static):
    """The look's template is applied as a chart is serialised: the JSON the page gets carries
    plotly_white, for a drawn chart and a message chart alike."""
    import plotly.io as pio
    from plotly.utils import PlotlyJSONEncoder

    white = pio.templates["plotly_white"].to_plotly_json()
    expected = json.loads(json.dumps(white, cls=PlotlyJSONEncoder))
    for fig in (timelines.timeline_figure(static), style.message_figure("Latency", "Later.")):
        assert json.loads(fig.to_json())["layout"]["template"] == expected, fig.layout.title.text


def test_a_message_chart_shows_its_text_whole_without_axes():
    """A message chart: its text escaped, in phone-wide lines that all fit, no axes, the title
    at the top left."""
    text = "The <b>servers</b> lanes are drawn when the run ends. " * 3
    fig = style.message_figure("Servers", text)
    lines = fig.layout.annotations[0].text.split("<br>")
    shown = [html.unescape(line) for line in lines]
    assert len(lines) >= 3 and all(len(line) <= style.MESSAGE_LINE_CHARS for line in shown)
    assert "&lt;b&gt;servers&lt;/b&gt;" in lines[0] + lines[1], lines
    assert fig.layout.xaxis.visible is False and fig.layout.yaxis.visible is False
    assert fig.layout.height >= 120 + style.TITLE_LINE_PX * len(lines)
    assert (fig.layout.title.text, fig.layout.title.x) == ("Servers", 0)
