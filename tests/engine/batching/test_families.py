"""Every decoder family, on its tiny random model: each engine and mode equals per-request
``generate`` token for token, past the sliding window, on the fused layers."""

import pytest
from family_models import FAMILIES, PAST_WINDOW_SPECS, WINDOW, family_runner
from tiny_model import make_requests

from engine.batching.continuous import ContinuousEngine
from engine.batching.static import StaticEngine
from engine.config import EngineConfig
from engine.fidelity.reference import ReferenceCache

SPECS = PAST_WINDOW_SPECS  # up to 8 windows long, a shared 16-token prefix
CONFIGS = {
    "static": (StaticEngine, EngineConfig(3)),
    "slots": (ContinuousEngine, EngineConfig(3)),
    "paged": (ContinuousEngine, EngineConfig(3, kv_mode="paged", block_size=4)),
    "concat": (ContinuousEngine, EngineConfig(3, kv_mode="concat")),
    "chunked": (ContinuousEngine, EngineConfig(3, max_num_batched_tokens=5)),
    "preempting": (ContinuousEngine, None),  # _config sizes its pool
    "prefix": (
        ContinuousEngine,
        EngineConfig(
            2, kv_mode="paged", block_size=4, prefix_caching=True, scheduling_policy="vllm"
        ),
    ),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    runner = family_runner(request.param)
    requests = make_requests(SPECS)
    return request.param, runner, requests, ReferenceCache(runner).outputs(requests)


def _config(name, runner, requests):
    engine_cls, config = CONFIGS[name]
    if name == "preempting":  # the smallest pool that runs the longest request: 4 slots share it
        blocks = max(-(-(r.num_prompt_tokens + r.max_new_tokens - 1) // 4) for r in requests)
        budget = blocks * 4 * runner.kv_bytes_per_token() / 2**20
        config = EngineConfig(4, kv_mode="paged", block_size=4, kv_budget_mib=budget)
    return engine_cls, config


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_family_equals_generate_past_the_window(family, name):
    """Each engine's outputs equal per-request generate, with prompts and outputs past the
    tiny sliding window, chunked prefill, preemption and prefix caching."""
    label, runner, requests, reference = family
    engine_cls, config = _config(name, runner, requests)
    trace = engine_cls(runner, config).run(requests)
    for r in trace.requests:
        assert r.output_token_ids == reference[r.request_id], (
            f"{label} {name}: R{r.request_id} {r.output_token_ids} != {reference[r.request_id]}"
        )
    if name == "prefix":
        assert trace.metrics().num_cached_tokens > 0, f"{label}: no prefix hit"


def test_family_runs_the_fused_layers(family):
    """Every family runs the fused layers, and its continuous steps went through them."""
    label, runner, requests, _ = family
    assert runner.layers_path == "fused", f"{label}: {runner.layers_path}"
    runner.decoder_layer_steps.update(dict.fromkeys(runner.decoder_layer_steps, 0))
    ContinuousEngine(runner, EngineConfig(3)).run(requests[:2])
    assert runner.decoder_layers == "fused", f"{label}: {runner.decoder_layer_steps}"


def test_family_batch_invariant_equals_generate(family):
    """Batch-invariant mode, static and continuous: outputs equal per-request generate."""
    label, runner, requests, reference = family
    for engine in (
        ContinuousEngine(runner, EngineConfig(2, kv_mode="paged", batch_invariant=True)),
        StaticEngine(runner, EngineConfig(2, batch_invariant=True)),
    ):
        trace = engine.run(requests)
        for r in trace.requests:
            assert r.output_token_ids == reference[r.request_id], f"{label} R{r.request_id}"


def test_windowed_prompts_reach_past_the_window():
    """The workload's longest sequences reach 5 windows, so a window ignored would show."""
    assert max(len(p.encode()) + n for p, n in SPECS) >= 5 * WINDOW
