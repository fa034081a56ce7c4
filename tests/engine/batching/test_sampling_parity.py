"""Sampled requests on the tiny model: each one's tokens equal seeded ``model.generate`` run alone,
whatever the slots, arrivals, token budget or preemption, and depend on its own seed only."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_model import EOS_IDS, make_requests, tiny_runner

from engine.batching.continuous import ContinuousEngine
from engine.batching.static import StaticEngine
from engine.config import EngineConfig
from engine.fidelity.reference import NOT_COMPARED, ReferenceCache, comparison
from engine.peers.transformers_engine import HFContinuousEngine
from engine.sampling_params import MAX_SEED, SamplingParams
from engine.sequence import truncate_at_stop
from engine.serving.block_manager import blocks_for

BLOCK_SIZE = 4
SPECS = [
    ("hello world", 20),
    ("a", 30),
    ("the quick brown fox", 25),
    ("xyz", 12),
    ("Once upon a time", 40),
    ("z" * 30, 15),
]
SETTINGS = [
    SamplingParams(0.8, 10, 0.9, 1),
    None,  # greedy, in the same batch
    SamplingParams(1.0, 0, 1.0, 7),
    SamplingParams(1.3, 0, 0.7, MAX_SEED),
    SamplingParams(0.5, 3, 1.0, 5),
    SamplingParams(2.0, 0, 0.95, 123456789),
]


@pytest.fixture(scope="module")
def runner():
    return tiny_runner(seed=5)


@pytest.fixture(scope="module")
def requests():
    base = make_requests(SPECS)
    return [dataclasses.replace(r, sampling=p) for r, p in zip(base, SETTINGS, strict=True)]


def seeded_generate(runner, request) -> list[int]:
    """The ground truth, written out here: ``model.generate(do_sample=True, ...)`` run alone
    right after ``torch.manual_seed(seed)``, every default (top_k=50) overridden."""
    params = request.sampling
    ids = torch.tensor([request.prompt_token_ids])
    kwargs = {"do_sample": False}
    if params is not None and not params.is_greedy:
        kwargs = {
            "do_sample": True,
            "temperature": params.temperature,
            "top_k": params.top_k,
            "top_p": params.top_p,
        }
    with torch.random.fork_rng(devices=[]):
        if params is not None:
            torch.manual_seed(params.seed)
        out = runner.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=request.max_new_tokens,
            eos_token_id=list(EOS_IDS),
            pad_token_id=0,
            **kwargs,
        )
    tokens = out[0, ids.shape[1] :].tolist()
    return truncate_at_stop(tokens, request.max_new_tokens, EOS_IDS)


@pytest.fixture(scope="module")
def truth(runner, requests):
    return {r.request_id: seeded_generate(runner, r) for r in requests}


def _outputs(trace) -> dict[int, list[int]]:
    return {r.request_id: r.output_token_ids for r in trace.requests}


def _budget_mib(runner, num_blocks: int) -> float:
    return num_blocks * BLOCK_SIZE * runner.kv_bytes_per_token() / 2**20


def test_reference_cache_is_seeded_generate(runner, requests, truth):
    """The reference the page and bench compare with is seeded generate, token for token."""
    assert ReferenceCache(runner).outputs(requests) == truth
    assert truth[0] != truth[2], "two sampled requests should not agree by chance"


@pytest.mark.parametrize("num_slots", [1, 3, 8])
@pytest.mark.parametrize("kv_mode", ["slots", "paged", "concat"])
def test_continuous_sampling_equals_seeded_generate(runner, requests, truth, num_slots, kv_mode):
    """Sampled and greedy requests in one batch equal seeded generate at 1, 3 and 8 slots."""
    trace = ContinuousEngine(runner, EngineConfig(num_slots, kv_mode=kv_mode)).run(requests)
    assert _outputs(trace) == truth


@pytest.mark.parametrize("num_slots", [1, 3, 8])
def test_static_sampling_equals_seeded_generate(runner, requests, truth, num_slots):
    """The static engine's per-row samplers give seeded generate's tokens in padded waves."""
    trace = StaticEngine(runner, EngineConfig(num_slots)).run(requests)
    assert _outputs(trace) == truth


def test_sampling_survives_chunked_prefill_and_preemption(runner, requests, truth):
    """A small token budget and a KV pool too small for all slots change no sampled token."""
    config = EngineConfig(
        4,
        kv_mode="paged",
        block_size=BLOCK_SIZE,
        kv_budget_mib=_budget_mib(runner, 18),
        max_num_batched_tokens=6,
    )
    trace = ContinuousEngine(runner, config).run(requests)
    assert trace.metrics().num_preemptions > 0, "the pool was meant to force preemption"
    preempted = {r.request_id for r in trace.requests if r.num_preemptions}
    assert preempted & {0, 2, 3, 4, 5}, "no sampled request was preempted"
    assert _outputs(trace) == truth


def test_sampling_with_prefix_caching_equals_seeded_generate(runner):
    """Requests sharing a cached prompt prefix (paged KV, prefix caching) sample the same tokens."""
    shared = "the same long shared prefix, " * 2
    prefixed = make_requests([(shared + prompt, cap) for prompt, cap in SPECS])
    prefixed = [dataclasses.replace(r, sampling=p) for r, p in zip(prefixed, SETTINGS, strict=True)]
    expected = {r.request_id: seeded_generate(runner, r) for r in prefixed}
    config = EngineConfig(3, kv_mode="paged", block_size=BLOCK_SIZE, prefix_caching=True)
    trace = ContinuousEngine(runner, config).run(prefixed)
    assert trace.metrics().num_cached_tokens > 0, "no prompt token came from the prefix cache"
    assert _outputs(trace) == expected


def test_sampling_does_not_depend_on_arrival_times(runner, requests, truth):
    """Requests arriving over time (other neighbours, other slots) sample the same tokens."""
    arrivals = [0.0, 0.03, 0.0, 0.06, 0.01, 0.02]
    late = [dataclasses.replace(r, arrival_s=a) for r, a in zip(requests, arrivals, strict=True)]
    for engine in (
        ContinuousEngine(runner, EngineConfig(2)),
        StaticEngine(runner, EngineConfig(2)),
    ):
        assert _outputs(engine.run(late)) == truth, f"{engine.name} changed with arrivals"


def test_changing_one_seed_changes_only_that_request(runner, requests, truth):
    """A new seed for request 3 changes its tokens and leaves every other request's alone."""
    changed = list(requests)
    changed[3] = dataclasses.replace(
        requests[3], sampling=dataclasses.replace(requests[3].sampling, seed=42)
    )
    for engine in (
        ContinuousEngine(runner, EngineConfig(3)),
        StaticEngine(runner, EngineConfig(3)),
    ):
        out = _outputs(engine.run(changed))
        assert out[3] != truth[3], f"{engine.name}: seed 42 gave seed {MAX_SEED}'s tokens"
        assert out[3] == seeded_generate(runner, changed[3])
        assert {k: v for k, v in out.items() if k != 3} == {
            k: v for k, v in truth.items() if k != 3
        }, f"{engine.name}: another request's tokens moved with request 3's seed"


def test_temperature_zero_is_greedy(runner, requests):
    """Temperature 0 decodes greedily whatever the seed: the same tokens as no settings."""
    greedy = [dataclasses.replace(r, sampling=None) for r in requests]
    zero = [dataclasses.replace(r, sampling=SamplingParams(0.0, 5, 0.5, 9)) for r in requests]
    engine = ContinuousEngine(runner, EngineConfig(3))
    assert _outputs(engine.run(zero)) == _outputs(engine.run(greedy))


def test_transformers_engine_samples_but_is_not_compared(runner, requests, truth):
    """transformers' manager samples with its own stream: sampled records say not compared,
    and the greedy one (top_k=1 there) still equals the reference."""
    trace = HFContinuousEngine(runner, EngineConfig(3)).run(requests)
    states = [comparison(r, truth) for r in trace.requests]
    assert states == [NOT_COMPARED, "match", *[NOT_COMPARED] * 4], states
    for r in trace.requests:
        assert 1 <= len(r.output_token_ids) <= r.max_new_tokens
    same = sum(r.output_token_ids == truth[r.request_id] for r in trace.requests)
    assert same < len(requests), "its own stream should not reproduce every sampled output"


def test_greedy_workload_takes_the_greedy_path_in_transformers_engine(runner):
    """Without sampled requests, transformers' engine runs greedy and every record compares."""
    plain = make_requests(SPECS[:3])
    trace = HFContinuousEngine(runner, EngineConfig(2)).run(plain)
    reference = ReferenceCache(runner).outputs(plain)
    assert [comparison(r, reference) for r in trace.requests] == ["match"] * 3


PARAMS = st.one_of(
    st.none(),
    st.builds(
        SamplingParams,
        temperature=st.sampled_from([0.0, 0.4, 1.0, 1.7]),
        top_k=st.sampled_from([0, 1, 4, 20]),
        top_p=st.sampled_from([0.3, 0.8, 1.0]),
        seed=st.integers(min_value=0, max_value=MAX_SEED),
    ),
)
WORKLOADS = st.lists(
    st.tuples(
        st.text(alphabet="abcxyz ", min_size=1, max_size=24),
        st.integers(min_value=1, max_value=12),
        PARAMS,
        st.sampled_from([0.0, 0.0, 0.01, 0.03]),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(WORKLOADS)
def test_any_sampled_workload_gives_the_same_tokens_in_every_schedule(runner, rows):
    """Any workload: 1, 3 and 8 slots, arrivals, a token budget and preemption all give seeded
    generate's tokens for every request."""
    base = make_requests([(prompt, cap) for prompt, cap, _, _ in rows])
    requests = [
        dataclasses.replace(r, sampling=params, arrival_s=arrival)
        for r, (_, _, params, arrival) in zip(base, rows, strict=True)
    ]
    at_zero = [dataclasses.replace(r, arrival_s=0.0) for r in requests]
    truth = {r.request_id: seeded_generate(runner, r) for r in requests}
    longest = max(blocks_for(r.num_prompt_tokens + r.max_new_tokens, BLOCK_SIZE) for r in requests)
    paged = EngineConfig(
        4, kv_mode="paged", block_size=BLOCK_SIZE, kv_budget_mib=_budget_mib(runner, longest)
    )
    runs = [
        (EngineConfig(1), at_zero),
        (EngineConfig(3), at_zero),
        (EngineConfig(8), at_zero),
        (EngineConfig(3), requests),  # with the drawn arrival times
        (EngineConfig(3, max_num_batched_tokens=4), at_zero),  # chunked prefill
        (paged, at_zero),  # room for the longest request only: preemption
    ]
    for config, workload in runs:
        out = _outputs(ContinuousEngine(runner, config).run(workload))
        assert out == truth, f"{config} differs from seeded generate"
    assert _outputs(StaticEngine(runner, EngineConfig(3)).run(at_zero)) == truth, "static"
