"""Batch-invariant mode on the embedded SmolLM2 in bfloat16: packed logits equal solo logits."""

import pytest
import torch

from engine.batching.continuous import ContinuousEngine
from engine.batching.static import StaticEngine
from engine.config import EngineConfig
from engine.fidelity.divergence import MATCH
from engine.fidelity.reference import SoloReference
from engine.model.loader import load_model
from engine.model.model_runner import ModelRunner
from engine.workloads.workload import RequestSpec, seed_specs, tokenize_requests

pytestmark = pytest.mark.real_model

CAP = 6  # tokens per request: bfloat16 is emulated on CPUs without AVX512-BF16, and slow


@pytest.fixture(scope="module")
def runner():
    return ModelRunner(load_model(device="cpu", dtype="bfloat16"))


@pytest.fixture(scope="module")
def requests(runner):
    specs = [RequestSpec(s.prompt, CAP) for s in seed_specs()[:4]]
    return tokenize_requests(
        specs, runner.tokenizer, chat_template=False, max_context=runner.loaded.max_context
    )


@pytest.fixture(scope="module")
def solo(runner):
    return SoloReference(runner)


@pytest.mark.parametrize(
    "config",
    [
        EngineConfig(3, kv_mode="slots", max_num_batched_tokens=4, batch_invariant=True),
        EngineConfig(3, kv_mode="paged", block_size=4, batch_invariant=True),
        EngineConfig(3, kv_mode="concat", batch_invariant=True),
    ],
    ids=["slots-chunked", "paged", "concat"],
)
def test_seed_requests_packed_equal_solo_bitwise(runner, requests, solo, config):
    """Continuous engine, each KV mode (one with chunked prefill): logits as run alone."""
    assert runner.dtype == torch.bfloat16
    trace = ContinuousEngine(runner, config).run(requests)
    for rid, verdict in solo.verdicts(requests, trace).items():
        assert verdict.verdict == MATCH, f"R{rid}: {verdict.label} ({verdict.reason})"
        assert verdict.logits_equal, f"R{rid}: same tokens, logits not bitwise equal"


def test_seed_requests_in_static_waves_equal_solo_bitwise(runner, requests, solo):
    """Static engine's padded waves in batch-invariant mode: logits as run alone."""
    trace = StaticEngine(runner, EngineConfig(3, batch_invariant=True)).run(requests)
    for rid, verdict in solo.verdicts(requests, trace).items():
        assert verdict.verdict == MATCH and verdict.logits_equal, f"R{rid}: {verdict.reason}"
