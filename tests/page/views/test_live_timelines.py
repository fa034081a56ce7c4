"""Live timelines are redrawn within a CPU budget, and at once when an engine starts stepping."""

from __future__ import annotations

import dataclasses
import time

import gradio as gr
import plotly.graph_objects as go
from tiny_model import make_requests, tiny_runner

from engine.batching.continuous import ContinuousEngine
from engine.batching.static import StaticEngine
from engine.config import EngineConfig
from engine.page.views.progress_view import CLEARED_AT_START, MAX_UPDATE_WAIT_S, LiveTimelines
from engine.page.views.run_view import RUN_OUTPUTS
from engine.worker.progress import EngineProgress

STATIC = RUN_OUTPUTS.index("static_timeline_plot")
CONTINUOUS = RUN_OUTPUTS.index("continuous_timeline_plot")
STATUS = RUN_OUTPUTS.index("status_markdown")
TABLE = RUN_OUTPUTS.index("outputs_table")


def test_timelines_wait_for_their_budget_but_a_starting_engine_is_drawn_at_once():
    """A redraw comes only after its CPU cost over the share; a new engine's first steps draw."""
    runner = tiny_runner()
    requests = make_requests([("hello", 4), ("a longer prompt", 6)])
    static = StaticEngine(runner, EngineConfig(2)).run(requests)
    continuous = ContinuousEngine(runner, EngineConfig(2)).run(requests)
    progress = {"static": EngineProgress("static", len(static.steps), 2, 2, static)}
    views = LiveTimelines(cpu_share=1e-6)  # a redraw then waits for ages
    first = views.outputs(progress, requests, 2, "time", 1.0, None)
    assert isinstance(first[STATIC], go.Figure)
    second = views.outputs(progress, requests, 2, "time", 1.5, None)
    assert not isinstance(second[STATIC], go.Figure), "redrawn within the budget"
    assert "1.5 s" in second[STATUS], "the status line must update every poll"
    progress["continuous"] = EngineProgress("continuous", 1, 0, 2, continuous)
    third = views.outputs(progress, requests, 2, "time", 2.0, None)
    assert isinstance(third[CONTINUOUS], go.Figure), "a starting engine's timeline waited"
    assert views.num_draws == 2
    eager = LiveTimelines(cpu_share=1.0)  # waits as long as the draw's CPU took
    eager.outputs(progress, requests, 2, "time", 1.0, None)
    time.sleep(0.5)  # the draw's thread CPU time is at most its wall time: the redraw is due
    later = eager.outputs(progress, requests, 2, "time", 1.5, None)
    assert isinstance(later[CONTINUOUS], go.Figure), "no redraw once the budget allowed it"


def _progress(requests, runner, num_finished: int) -> dict[str, EngineProgress]:
    static = StaticEngine(runner, EngineConfig(2)).run(requests)
    if num_finished < len(requests):  # the records of a run in which only some have finished
        unfinished = {"output_token_ids": [], "output_text": "", "finish_s": None}
        static.requests = [
            r if i < num_finished else dataclasses.replace(r, **unfinished)
            for i, r in enumerate(static.requests)
        ]
    return {"static": EngineProgress("static", len(static.steps), num_finished, 2, static)}


def test_updates_wait_in_proportion_to_what_gradio_took_over_the_last():
    """After Gradio took g seconds over an update, the next waits g / update_share at least."""
    views = LiveTimelines(update_share=0.02)
    assert views.wait_s(0.5) == 0.5, "nothing handed over yet: the plain interval"
    progress = _progress(make_requests([("hello", 4), ("abc", 3)]), tiny_runner(), 2)
    views.outputs(progress, make_requests([("hello", 4), ("abc", 3)]), 2, "time", 1.0, None)
    time.sleep(0.1)  # Gradio's postprocessing and sending, as the handler sees it
    views.resumed()
    assert views.wait_s(0.5) >= min(0.1 / 0.02, MAX_UPDATE_WAIT_S), views.update_cost_s
    views.outputs(progress, make_requests([("hello", 4), ("abc", 3)]), 2, "time", 1.5, None)
    views.resumed()  # handled at once
    assert views.wait_s(0.5) == 0.5, views.update_cost_s


def test_a_slow_hand_over_never_freezes_the_progress_longer_than_the_cap():
    """Gradio taking 3 s over an update (a starved server thread) waits 4 s, not 150 s."""
    views = LiveTimelines(update_share=0.02)
    views.update_cost_s = 3.0
    assert views.wait_s(0.5) == MAX_UPDATE_WAIT_S, views.wait_s(0.5)
    assert views.wait_s(10.0) == 10.0, "a longer plain interval is kept"


def test_outputs_table_is_sent_only_when_its_rows_change():
    """An unchanged outputs table is skipped; a newly finished request sends it again."""
    requests, runner = make_requests([("hello", 4), ("abc", 3)]), tiny_runner()
    views = LiveTimelines()
    first = views.outputs(_progress(requests, runner, 1), requests, 2, "time", 1.0, None)
    same = views.outputs(_progress(requests, runner, 1), requests, 2, "time", 1.5, None)
    done = views.outputs(_progress(requests, runner, 2), requests, 2, "time", 2.0, None)
    assert isinstance(first[TABLE], gr.Dataframe) and isinstance(done[TABLE], gr.Dataframe)
    assert same[TABLE] == gr.skip(), "an unchanged table was sent again"
    assert first[TABLE].value != done[TABLE].value


def test_the_first_update_clears_the_previous_runs_views_and_says_when_they_come():
    """While static runs, the continuous timeline, the masks, the block map, the charts and the
    metrics must not show the previous run: the first update replaces them with charts that say
    when they are drawn; later updates leave them be."""
    runner = tiny_runner()
    requests = make_requests([("hello", 4), ("a longer prompt", 6)])
    static = StaticEngine(runner, EngineConfig(2)).run(requests)
    progress = {"static": EngineProgress("static", len(static.steps), 0, 2, static)}
    views = LiveTimelines()
    first = dict(
        zip(RUN_OUTPUTS, views.outputs(progress, requests, 2, "time", 1.0, None), strict=True)
    )
    cleared = [*CLEARED_AT_START, "continuous_timeline_plot", "server_timeline_plot"]
    for name in cleared:
        texts = [a.text for a in first[name].layout.annotations]
        assert any("Drawn when this run ends" in t or "starts when" in t for t in texts), name
    assert first["metrics_table"] == []
    assert isinstance(first["static_timeline_plot"], go.Figure), "static's steps are drawn"
    second = dict(
        zip(RUN_OUTPUTS, views.outputs(progress, requests, 2, "time", 1.5, None), strict=True)
    )
    assert all(not isinstance(second[name], go.Figure) for name in cleared), "cleared again"
    assert not isinstance(second["metrics_table"], list)
