"""The packed-mask heatmap of a sliding-window layer: the keys its window hides drawn as a band,
the same cells the engines' own mask (``engine.serving.masks``) hides, pooled big grids included."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fake_traces import continuous_trace

from engine.page.figures import mask_heatmaps
from engine.serving.masks import packed_layout, packed_step_mask
from engine.trace import DECODE, PREFILL, RequestRecord, ScheduledSeq, StepRecord, Trace

WINDOW = 4


@pytest.fixture
def trace() -> Trace:
    """A continuous run whose prompts (5 to 10 tokens) reach past a 4-key window."""
    run = continuous_trace([5, 6, 8, 9, 10, 7], [6, 12, 9, 7, 5, 8], num_slots=3)
    run.info["sliding_windows"] = [WINDOW]
    return run


def _fused_step(trace: Trace) -> int:
    return next(
        i for i, step in enumerate(trace.steps) if {s.kind for s in step.seqs} == {PREFILL, DECODE}
    )


def _step_mask(trace: Trace, step_index: int, window: int | None) -> np.ndarray:
    step = trace.steps[step_index]
    cached = [s.num_cached_tokens for s in step.seqs]
    return packed_step_mask(cached, [s.num_new_tokens for s in step.seqs], window).numpy()


def test_windowed_heatmap_hides_exactly_the_keys_past_the_window(trace):
    """With window W, the coloured cells are the engine's windowed mask, and the light-grey band
    is exactly the causal keys of the query's own request more than W - 1 positions back."""
    for step_index in (_fused_step(trace), len(trace.steps) - 1):
        fig = mask_heatmaps.mask_heatmap(trace, step_index, window=WINDOW)
        z = np.asarray(fig.data[0].z)
        band_code = 2 * len(trace.steps[step_index].seqs)
        windowed = _step_mask(trace, step_index, WINDOW)
        coloured = ~np.isnan(z) & (z != band_code)
        assert np.array_equal(coloured, windowed), f"step {step_index}: coloured ≠ windowed mask"
        step = trace.steps[step_index]
        layout = packed_layout(
            [s.num_cached_tokens for s in step.seqs], [s.num_new_tokens for s in step.seqs]
        )
        q_seq, q_pos = layout.q_seq.numpy()[:, None], layout.q_pos.numpy()[:, None]
        k_seq, k_pos = layout.k_seq.numpy()[None, :], layout.k_pos.numpy()[None, :]
        far_back = (q_seq == k_seq) & (q_pos - k_pos >= WINDOW)  # more than W - 1 back
        assert far_back.any(), f"step {step_index} reaches no key past the window: nothing checked"
        assert np.array_equal(z == band_code, far_back), f"step {step_index}: band misplaced"
        colour = fig.data[0].colorscale[-1][1]
        assert colour == mask_heatmaps.WINDOW_COLOR, f"band drawn in {colour}"
        subtitle = fig.layout.title.subtitle.text
        assert f"sliding layers, window {WINDOW}" in subtitle, subtitle
        assert f"{int(far_back.sum())} cells outside the window" in subtitle, subtitle


def test_global_heatmap_names_its_layers_only_for_a_windowed_model(trace):
    """Without a window the heatmap is the full causal mask (no band); its subtitle says "global
    layers" for a model with sliding windows, and nothing new for an all-global model's run."""
    step_index = _fused_step(trace)
    fig = mask_heatmaps.mask_heatmap(trace, step_index)
    z = np.asarray(fig.data[0].z)
    assert np.array_equal(~np.isnan(z), _step_mask(trace, step_index, None)), "not causal"
    assert "global layers" in fig.layout.title.subtitle.text, fig.layout.title.subtitle.text
    trace.info.pop("sliding_windows")
    plain = mask_heatmaps.mask_heatmap(trace, step_index).layout.title.subtitle.text
    assert "layers" not in plain, f"an all-global model's heatmap changed: {plain}"


def test_pooled_windowed_heatmap_keeps_the_diagonal_over_the_band():
    """A windowed step over MAX_HEATMAP_CELLS is pooled: a tile holding an attended key shows its
    request, a tile of hidden keys only shows the band, and no tile outside the request is drawn."""
    trace = Trace(engine="continuous", num_slots=1)
    trace.requests = [RequestRecord(0, "a", 1, 3000)]
    trace.steps = [StepRecord(0, 0.0, 1.0, [ScheduledSeq(0, 0, PREFILL, 3000, 0)])]
    fig = mask_heatmaps.mask_heatmap(trace, 0, window=64)
    z = np.asarray(fig.data[0].z)
    assert z.size <= mask_heatmaps.MAX_HEATMAP_CELLS, f"{z.shape} handed to the browser"
    assert z.shape == (math.ceil(3000 / 6), 3000), f"unexpected tiling {z.shape}"
    assert z[-1, -1] == 0 and z[-1, 0] == 2, "the last query's tile row lost its window or band"
    assert np.all(np.isnan(z[0, 6:])), "a key after every query of a tile is drawn"
    assert "aggregated" in fig.layout.title.subtitle.text, fig.layout.title.subtitle.text
