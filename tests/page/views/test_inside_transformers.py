"""transformers' continuous batching from the inside on the page: its own record (recorded by
``engine.peers.transformers_scheduler`` on the tiny model) drawn in the views vLLM's record is
drawn in, its block map showing transformers' two reserved (trash) block ids as reserved, never
free; a server's record, when one ran too, comes first."""

from __future__ import annotations

import gradio as gr
import pytest
from captured_vllm import captured_vllm_trace
from tiny_model import make_requests, tiny_runner

from engine.batching.continuous import ContinuousEngine
from engine.batching.static import StaticEngine
from engine.config import EngineConfig
from engine.page.handlers import playground
from engine.page.views import run_view
from engine.page.views.run_view import RunState

SPECS = [("hello world", 5), ("a", 20), ("the quick brown fox jumps", 12), ("xyz", 3)]
NUM_SLOTS = 3


@pytest.fixture(scope="module")
def state() -> RunState:
    """Our two engines and transformers' on the tiny model, as the page keeps a run with
    "Also run transformers' built-in continuous batching" ticked."""
    from engine.peers.transformers_engine import HFContinuousEngine

    runner, requests, config = tiny_runner(seed=5), make_requests(SPECS), EngineConfig(NUM_SLOTS)
    static = StaticEngine(runner, config).run(requests)
    continuous = ContinuousEngine(runner, config).run(requests)
    hf = HFContinuousEngine(runner, config).run(requests)
    assert hf.schedule is not None and hf.schedule.steps, hf.warnings
    return RunState(static, continuous, None, hf)


def _inside_at(state: RunState, step: int) -> dict:
    """The step slider's handler at ``step``: the inside views, by output name."""
    figures = playground.update_step(state, step, "step")
    views = dict(zip(run_view.STEP_VIEW_OUTPUTS, figures, strict=True))
    return {name: fig for name, fig in views.items() if name.startswith("inside_")}


def test_transformers_steps_are_drawn_from_the_inside(state):
    """The slider spans transformers' record; at each step its packed mask holds the tokens
    transformers scheduled, each view says it comes from transformers' own record, and the
    inside views are shown on a page without servers."""
    record = state.hf_continuous.schedule
    assert f"hf_continuous 0–{len(record.steps) - 1} (its own record)" in (
        run_view.slider_label(state)
    )
    for k, step in enumerate(record.steps):
        views = _inside_at(state, k)
        mask = views["inside_mask_plot"]
        assert mask.layout.title.text.startswith(f"hf_continuous from the inside · Packed step {k}")
        assert len(mask.data[0].y) == step.num_scheduled_tokens, f"step {k}: other queries"
        for name, fig in views.items():
            subtitle = fig.layout.title.subtitle.text
            assert subtitle.startswith("From hf_continuous&#x27;s own record: transformers "), name
    shown = run_view.render(state, downloads=False)
    assert shown.inside_usage.layout.title.text.startswith("hf_continuous from the inside")
    column = dict(zip(run_view.RUN_OUTPUTS, shown.as_outputs(), strict=True))["inside_column"]
    assert isinstance(column, gr.Column) and column.visible, "the inside views stay hidden"
    without = RunState(state.static, state.continuous, None)
    values = run_view.render(without, downloads=False).as_outputs()
    outputs = dict(zip(run_view.RUN_OUTPUTS, values, strict=True))
    assert outputs["inside_column"] == gr.skip(), "a run without transformers changed visibility"


def test_the_block_map_shows_transformers_reserved_ids_as_reserved(state):
    """transformers' first two block ids (its trash blocks) are never held: the block map marks
    them reserved, never free, at every step, and counts the blocks in use out of the rest."""
    record = state.hf_continuous.schedule
    reserved = record.info["kv_reserved_blocks"]
    assert reserved == 2, record.info
    usable = record.info["kv_blocks"] - reserved
    for k, step in enumerate(record.steps):
        blocks = _inside_at(state, k)["inside_block_map_plot"]
        hovers = [h for row in blocks.data[0].customdata for h in row]
        assert hovers[:reserved] == [f"block {b}: reserved, never held" for b in range(reserved)]
        labels = [label for row in blocks.data[0].text for label in row]
        held = {b for b, label in enumerate(labels) if label.startswith("R")}
        assert held == set(step.block_holders()), f"step {k}: not transformers' block ids"
        assert not held & set(range(reserved)), f"step {k}: a reserved id held"
        used = f"{step.kv_blocks_used}/{usable} blocks in use ({reserved} more reserved, black)"
        assert used in blocks.layout.title.subtitle.text, blocks.layout.title.subtitle.text
        assert "blocks 0–1: its trash blocks" in blocks.layout.title.subtitle.text


def test_a_servers_record_comes_before_transformers(state):
    """With vLLM's record and transformers' in one run, the inside views draw vLLM's (the
    servers first), and vLLM's null block is reserved, never free."""
    both = RunState(state.static, state.continuous, None, state.hf_continuous)
    both.servers = {"vllm": captured_vllm_trace()}
    views = _inside_at(both, 0)
    assert views["inside_timeline_plot"].layout.title.text.startswith("vllm from the inside")
    blocks = views["inside_block_map_plot"]
    assert blocks.data[0].customdata[0][0] == "block 0: reserved, never held"
