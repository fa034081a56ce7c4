"""The output embedding (LM head) runs on the engines' kernel plan, over the kept rows only."""

import pytest
import torch
from tiny_model import make_requests, tiny_runner

from engine.batching.continuous import ContinuousEngine
from engine.config import EngineConfig
from engine.fidelity.reference import ReferenceCache

SPECS = [("z" * 40, 6), ("a", 9), ("hello there", 5)]


class RowSpy:
    """Stands in for the head's ``PlannedLinear``: records each call's row count, then runs it."""

    def __init__(self, planned):
        self.planned, self.rows = planned, []

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.rows.append(x.numel() // x.shape[-1])
        return self.planned(x)


@pytest.mark.parametrize("fused", ["auto", "off"])
def test_the_head_runs_the_plan_on_the_kept_rows_only(monkeypatch, fused):
    """Fused layers or transformers' own: each step's head call is the plan's, with one row per
    kept logits index (a prefill's other tokens never reach it), and outputs match generate."""
    monkeypatch.setenv("CBP_FUSED_LAYERS", fused)
    runner = tiny_runner()
    head = runner.model.get_output_embeddings()
    planned = runner.engine_kernel.modules.planned
    spy = planned[head] = RowSpy(planned[head])
    kept, computed = [], []
    forward_packed = runner.forward_packed

    def counted(batch, samplers=None):
        kept.append(len(batch.logits_indices))
        computed.append(batch.input_ids.shape[-1])
        return forward_packed(batch, samplers)

    monkeypatch.setattr(runner, "forward_packed", counted)
    requests = make_requests(SPECS)
    trace = ContinuousEngine(runner, EngineConfig(2)).run(requests)
    assert spy.rows == kept, f"head rows {spy.rows} against kept rows {kept}"
    assert max(c - k for c, k in zip(computed, kept, strict=True)) > 0, "no step dropped a row"
    reference = ReferenceCache(runner).outputs(requests)
    assert {r.request_id: r.output_token_ids for r in trace.requests} == reference
