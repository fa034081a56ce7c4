"""Prefix caching on the embedded SmolLM2: the shipped shared-prompt workload, token for token."""

import dataclasses
from pathlib import Path

import pytest

from engine.batching.continuous import ContinuousEngine
from engine.config import EngineConfig
from engine.fidelity.reference import ReferenceCache
from engine.model.model_runner import ModelRunner
from engine.workloads.workload import load_jsonl, tokenize_requests

pytestmark = pytest.mark.real_model

WORKLOAD = Path(__file__).resolve().parents[3] / "assets" / "workloads" / "shared_prefix.jsonl"


def test_shared_system_prompt_hits_and_matches_generate(embedded_model):
    """Three requests behind the ~575-token policy and one other: with prefix caching the later
    ones hit the policy's blocks, and every output equals per-request model.generate."""
    runner = ModelRunner(embedded_model)
    specs = load_jsonl(WORKLOAD)
    shared = [s for s in specs if s.prompt.startswith("You are Juniper")][:3]
    other = [s for s in specs if not s.prompt.startswith("You are Juniper")][:1]
    picked = [dataclasses.replace(s, max_new_tokens=6, arrival_s=0.0) for s in shared + other]
    picked = [picked[0]] + [dataclasses.replace(s, arrival_s=0.5) for s in picked[1:]]
    requests = tokenize_requests(
        picked, runner.tokenizer, chat_template=False, max_context=runner.loaded.max_context
    )
    reference = ReferenceCache(runner).outputs(requests)
    for prefix_caching in (False, True):
        config = EngineConfig(2, kv_mode="paged", prefix_caching=prefix_caching)
        trace = ContinuousEngine(runner, config).run(requests)
        for r in trace.requests:
            assert r.output_token_ids == reference[r.request_id], (
                f"prefix_caching={prefix_caching} R{r.request_id}: {r.output_text!r}"
            )
        cached = [r.num_cached_tokens for r in trace.requests]
        if prefix_caching:
            assert cached[0] == 0 and min(cached[1:3]) >= 512, f"cached tokens {cached}"
            assert cached[3] == 0, "the unrelated prompt hit the policy's blocks"
        else:
            assert cached == [0, 0, 0, 0]
