"""The compiled step: one inductor graph for every step, the same tokens as ``model.generate``.

Compiling takes seconds (a minute with a cold inductor cache), so the module compiles once: every
test that runs compiled shares ``compiled`` (its runner, hence its graph) and one inductor cache.
"""

import dataclasses
import shutil

import pytest
import torch
from tiny_model import make_requests, tiny_runner

from engine.batching.continuous import ContinuousEngine
from engine.config import EngineConfig
from engine.fidelity.reference import ReferenceCache
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.skipif(
    shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler"
)

# Very different prompt lengths and caps: steps of 1 to 300+ tokens, decode-only steps that split.
SPECS = [("z" * 200, 30), ("a", 40), ("hello", 25), ("y" * 120, 10), ("q", 60), ("x" * 300, 8)]


@pytest.fixture(scope="module")
def compiled(compile_cache_dir):
    """A tiny-model runner with the compiled step on, its caches in the session's folder."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CBP_COMPILED_STEP", "auto")
        patch.setenv("CBP_CACHE_DIR", compile_cache_dir)
        runner = tiny_runner()
        assert runner.step_mode == "compiled", runner.eager_reason
        yield runner


@pytest.fixture(scope="module")
def reference(compiled):
    return ReferenceCache(compiled)


def _check(trace, reference, requests, what: str) -> None:
    want = reference.outputs(requests)
    for r in trace.requests:
        assert r.output_token_ids == want[r.request_id], f"{what}: R{r.request_id} differs"


@pytest.mark.parametrize(
    "config",
    [
        EngineConfig(3),
        EngineConfig(4, kv_mode="paged", kv_budget_mib=32 * 8 * 512 / 2**20, block_size=8),
        EngineConfig(3, max_num_batched_tokens=32),
        EngineConfig(3, kv_mode="paged", prefix_caching=True, scheduling_policy="vllm"),
        EngineConfig(1),
    ],
    ids=["slots", "paged-preempting", "chunked-prefill", "prefix-cache-vllm", "one-slot"],
)
def test_compiled_outputs_equal_generate(compiled, reference, config):
    """Every greedy output of the compiled step equals per-request generate, token for token
    (the paged budget, 32 blocks of 8 tokens, preempts)."""
    requests = make_requests(SPECS[:5] if config.kv_budget_mib else SPECS)
    steps_before = compiled.decoder_layer_steps["compiled"]
    trace = ContinuousEngine(compiled, config).run(requests)
    _check(trace, reference, requests, str(config))
    ran = compiled.decoder_layer_steps["compiled"] - steps_before
    assert ran == len(trace.steps), f"{ran} of {len(trace.steps)} steps ran compiled"
    if config.kv_budget_mib:
        preempted = sum(r.num_preemptions for r in trace.requests)
        assert preempted > 0, "the small KV budget preempted nothing"


def test_prefix_cache_hits_under_the_compiled_step(compiled, reference):
    """Requests sharing a long prompt prefix reuse cached blocks and still equal generate."""
    shared = "s" * 64
    requests = make_requests([(shared + "a", 12), (shared + "bb", 9), (shared + "c", 15)])
    config = EngineConfig(1, kv_mode="paged", prefix_caching=True, block_size=8)
    trace = ContinuousEngine(compiled, config).run(requests)
    assert sum(r.num_cached_tokens for r in trace.requests) > 0, "no prefix-cache hit"
    _check(trace, reference, requests, "prefix cache")


def test_sampled_requests_equal_seeded_generate(compiled, reference):
    """Sampled requests draw the tokens seeded generate draws, compiled."""
    settings = [SamplingParams(0.8, 50, 0.95, 11), None, SamplingParams(1.2, 0, 0.9, 3)]
    requests = [
        dataclasses.replace(request, sampling=params)
        for request, params in zip(make_requests(SPECS[:3]), settings, strict=True)
    ]
    trace = ContinuousEngine(compiled, EngineConfig(3)).run(requests)
    _check(trace, reference, requests, "sampled")


def test_a_changing_token_count_does_not_recompile(compiled):
    """Steps of 1 token and of hundreds run one graph: no graph is compiled after the first."""
    requests = make_requests(SPECS)
    trace = ContinuousEngine(compiled, EngineConfig(3)).run(requests)
    sizes = {s.num_scheduled_tokens for s in trace.steps}
    assert 1 in sizes and max(sizes) > 100, f"the workload's token counts: {sorted(sizes)}"
    stats = compiled.compiled_step.stats
    assert stats.num_graphs == 1 and stats.recompiles == 0, stats
    assert compiled.step_mode == "compiled"


def test_batch_invariant_steps_stay_on_their_own_kernels(compiled):
    """A batch-invariant run never enters the compiled graph (its kernels are fixed-order)."""
    before = compiled.decoder_layer_steps["compiled"]
    ContinuousEngine(compiled, EngineConfig(3, batch_invariant=True)).run(make_requests(SPECS[:2]))
    assert compiled.decoder_layer_steps["compiled"] == before


def test_the_switch_turns_it_off_and_says_so(monkeypatch):
    """CBP_COMPILED_STEP=off runs eager and names the switch; a typo is refused, naming both
    choices."""
    monkeypatch.setenv("CBP_COMPILED_STEP", "off")
    runner = tiny_runner()
    assert runner.step_mode == "eager" and runner.eager_reason == "CBP_COMPILED_STEP=off"
    monkeypatch.setenv("CBP_COMPILED_STEP", "on")
    with pytest.raises(ValueError, match="CBP_COMPILED_STEP='on'.*'off'.*'auto'"):
        tiny_runner()


def test_without_a_compiler_the_step_runs_eager_saying_why(monkeypatch, tmp_path):
    """With no C++ compiler on PATH the step runs eager, says why, and still equals generate."""
    monkeypatch.setenv("CBP_COMPILED_STEP", "auto")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    runner = tiny_runner()
    assert runner.step_mode == "eager"
    assert "no C++ compiler" in runner.eager_reason, runner.eager_reason
    requests = make_requests(SPECS[:3])
    trace = ContinuousEngine(runner, EngineConfig(3)).run(requests)
    _check(trace, ReferenceCache(runner), requests, "eager")


def test_a_compile_error_falls_back_to_eager_saying_why(monkeypatch, tmp_path):
    """A compiler that fails: the run goes on eager, equal to generate, and the reason names the
    compile error."""
    monkeypatch.setenv("CBP_COMPILED_STEP", "auto")
    monkeypatch.setenv("CBP_CACHE_DIR", str(tmp_path))  # nothing cached: inductor must compile
    runner = tiny_runner()
    requests = make_requests(SPECS[:3])
    with torch._inductor.config.patch({"cpp.cxx": (None, "/bin/false")}):
        trace = ContinuousEngine(runner, EngineConfig(3)).run(requests)
    assert runner.step_mode == "eager"
    assert runner.eager_reason.startswith("compiling failed: "), runner.eager_reason
    _check(trace, ReferenceCache(runner), requests, "after a compile error")
