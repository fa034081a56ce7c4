"""The reference store on the embedded SmolLM2: a continuous run's verdicts are the same whether
its references were computed (a cold store) or read from disk (a warm one)."""

from __future__ import annotations

import pytest

from engine.batching.continuous import ContinuousEngine
from engine.config import EngineConfig
from engine.fidelity import reference_store
from engine.fidelity.reference import ReferenceCache
from engine.model.model_runner import ModelRunner
from engine.workloads.workload import parse_table, tokenize_requests

pytestmark = pytest.mark.real_model

ROWS = [
    ["The capital of France is", 6],
    ["Once upon a time in a land far away,", 16],
    ["The history of the Roman Empire began", 12],
    ["Today's weather is so", 12, 0, 0.8, 40, 0.95, 3],  # sampled
]


def test_verdicts_are_the_same_with_a_cold_and_a_warm_store(embedded_model, tmp_path, monkeypatch):
    """The warm store answers every reference without a pass, and the continuous run's ✓ / ≈ / ✗
    verdicts (margins and logit records included) equal the cold store's."""
    monkeypatch.setenv("CBP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CBP_REFERENCE_CACHE", "on")
    runner = ModelRunner(embedded_model)
    requests = tokenize_requests(
        parse_table(ROWS),
        embedded_model.tokenizer,
        chat_template=False,
        max_context=embedded_model.max_context,
    )
    trace = ContinuousEngine(runner, EngineConfig(num_slots=3)).run(requests)

    cold = ReferenceCache(runner, reference_store.open_store())
    cold_verdicts = cold.verdicts(requests, trace)
    warm = ReferenceCache(runner, reference_store.open_store())
    passes = []
    run = warm._run
    monkeypatch.setattr(
        warm, "_run", lambda request, on_step: passes.append(1) or run(request, on_step)
    )
    warm_verdicts = warm.verdicts(requests, trace)

    assert not passes, f"{len(passes)} reference passes with a warm store"
    assert len(cold_verdicts) == len(requests), "a request got no verdict"
    assert warm_verdicts == cold_verdicts, "a stored reference changed a verdict"
    assert warm.outputs(requests) == cold.outputs(requests)
