"""Prefix caching in the continuous engine: outputs equal the reference, hits skip prefill."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_model import make_requests, tiny_runner

from engine.batching.continuous import ContinuousEngine
from engine.batching.static import StaticEngine
from engine.config import EngineConfig
from engine.fidelity.reference import ReferenceCache
from engine.sequence import Request

SYSTEM = "You are a terse helper; answer in one word. "  # 44 byte tokens
QUESTIONS = ["Sky colour?", "Two plus two?", "Capital of Peru?", "Opposite of up?", "Cat or dog?"]
LONG_QUESTIONS = ["Cat or dog?", "Name a tree.", "Why?", "Count: 1 2 3"]  # 40+ output tokens
SPECS = [(SYSTEM + q, 12) for q in QUESTIONS] + [
    ("unrelated words", 9),
    (SYSTEM + "Sky colour?", 6),
]


@pytest.fixture(scope="module")
def runner():
    return tiny_runner(seed=5)


@pytest.fixture(scope="module")
def references(runner):
    return ReferenceCache(runner)


def _run(runner, requests, num_slots=1, block_size=4, **options):
    config = EngineConfig(num_slots, kv_mode="paged", block_size=block_size, **options)
    return ContinuousEngine(runner, config).run(requests)  # asserts no leaked block at the end


def _check_outputs(trace, references, requests):
    expected = references.outputs(requests)
    for r in trace.requests:
        assert r.output_token_ids == expected[r.request_id], f"R{r.request_id} differs"


def _budget_mib(runner, num_blocks, block_size=4):
    return num_blocks * block_size * runner.kv_bytes_per_token() / 2**20


def _expected_hit(prompt: tuple, earlier: list[tuple], block_size: int) -> int:
    """Full blocks of the longest prefix shared with an earlier prompt, last token left out."""
    common = max((_common_length(prompt, e) for e in earlier), default=0)
    return min(common, len(prompt) - 1) // block_size * block_size


def _common_length(a: tuple, b: tuple) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("num_slots", [1, 3])
@pytest.mark.parametrize("token_budget", [None, 8])
@pytest.mark.parametrize("block_size", [4, 16])
def test_outputs_equal_plain_paging_and_the_reference(
    runner, references, num_slots, token_budget, block_size
):
    """Prefix caching changes which tokens are computed, never an output token."""
    requests = make_requests(SPECS)
    options = {"max_num_batched_tokens": token_budget, "block_size": block_size}
    plain = _run(runner, requests, num_slots, **options)
    cached = _run(runner, requests, num_slots, prefix_caching=True, **options)
    _check_outputs(cached, references, requests)
    for a, b in zip(plain.requests, cached.requests, strict=True):
        assert a.output_token_ids == b.output_token_ids, f"R{a.request_id}: on != off"
    assert cached.metrics().num_cached_tokens > 0, "the shared system prompt never hit"
    assert plain.metrics().num_cached_tokens == 0


def test_hit_tokens_are_not_prefilled(runner):
    """One slot: each request hits the full blocks it shares with earlier ones, and its first
    step feeds only the rest of its prompt."""
    requests = make_requests(SPECS)
    trace = _run(runner, requests, prefix_caching=True, kv_budget_mib=1e3)  # nothing evicted
    prompts = [r.prompt_token_ids for r in requests]
    for i, rec in enumerate(trace.requests):
        hit = _expected_hit(prompts[i], prompts[:i], 4)
        assert rec.num_cached_tokens == hit, f"R{i}: {rec.num_cached_tokens} cached, not {hit}"
        first = next(s for st in trace.steps for s in st.seqs if s.request_id == i)
        assert (first.num_cached_tokens, first.num_prefix_cached_tokens) == (hit, hit)
        assert first.num_new_tokens == rec.num_prompt_tokens - hit, f"R{i} prefilled hit tokens"
    rate = sum(r.num_cached_tokens for r in trace.requests) / sum(len(p) for p in prompts)
    assert trace.metrics().prefix_cache_hit_rate == pytest.approx(rate)


@pytest.mark.parametrize("length", [8, 9, 12])
def test_a_prompt_made_of_cached_blocks_still_computes_its_last_token(runner, references, length):
    """The same prompt again: everything but its last token may hit; that token is computed."""
    prompt = "abcdefghijklmnop"[:length]
    requests = make_requests([(prompt, 6), (prompt, 6)])
    trace = _run(runner, requests, prefix_caching=True)
    _check_outputs(trace, references, requests)
    second = trace.request(1)
    assert second.num_cached_tokens == (length - 1) // 4 * 4
    first_step = next(s for st in trace.steps for s in st.seqs if s.request_id == 1)
    assert first_step.num_new_tokens == length - second.num_cached_tokens >= 1


def test_a_prompt_shorter_than_a_block_never_hits(runner, references):
    """Prompts of fewer tokens than a block have no full block to share."""
    requests = make_requests([("ab", 7), ("ab", 7), ("abc", 5)])
    trace = _run(runner, requests, block_size=4, prefix_caching=True)
    _check_outputs(trace, references, requests)
    assert [r.num_cached_tokens for r in trace.requests] == [0, 0, 0]


def test_identical_prompts_admitted_together_both_compute_and_a_later_one_hits(runner, references):
    """Two equal prompts in one step share nothing (no KV exists yet); a third one, admitted
    after their prefill, hits their blocks; nothing leaks."""
    prompt = SYSTEM + "Same?"
    requests = make_requests([(prompt, 10), (prompt, 10), (prompt, 4)])
    trace = _run(runner, requests, num_slots=2, prefix_caching=True)
    _check_outputs(trace, references, requests)
    assert [r.num_cached_tokens for r in trace.requests][:2] == [0, 0]
    assert trace.request(2).num_cached_tokens == (len(prompt) - 1) // 4 * 4
    assert trace.steps[0].shared_blocks == {}, "two fresh prefills cannot share blocks"


def test_vllm_policy_shares_identical_prompts_admitted_together(runner, references):
    """The vllm policy caches blocks when it allocates them, as vLLM does: the second of two
    equal prompts admitted in one step hits the first's blocks in that very step, and the
    outputs stay the reference."""
    prompt = SYSTEM + "Same?"
    requests = make_requests([(prompt, 10), (prompt, 10)])
    trace = _run(runner, requests, num_slots=2, prefix_caching=True, scheduling_policy="vllm")
    _check_outputs(trace, references, requests)
    hit = (len(prompt) - 1) // 4 * 4
    assert [r.num_cached_tokens for r in trace.requests] == [0, hit]
    assert trace.steps[0].shared_blocks, "the first step already shares the prompt's blocks"


def test_blocks_filled_by_decoding_are_cached_too(runner, references):
    """A prompt that continues an earlier prompt with its output hits blocks decode filled."""
    first = make_requests([(SYSTEM, 20)])[0]
    output = references.output(first)
    ids = (*first.prompt_token_ids, *output[:16], 7, 8)
    second = Request(1, "continued", 5, ids)
    trace = _run(runner, [first, second], prefix_caching=True)
    _check_outputs(trace, references, [first, second])
    prompt_blocks = len(first.prompt_token_ids) // 4 * 4
    assert trace.request(1).num_cached_tokens > prompt_blocks, "only prompt blocks were cached"


def test_a_budget_full_of_cached_free_blocks_evicts_instead_of_preempting(runner, references):
    """Finished requests leave the pool full of cached blocks; new requests evict them, LRU
    first, and are preempted no more often than without prefix caching."""
    specs = [(f"{c * 3} distinct prompt {c}", 14) for c in "pqrstuvw"]
    requests = make_requests(specs)
    longest = max(len(p) + cap for p, cap in specs)
    budget = _budget_mib(runner, 2 * (-(-longest // 4)))  # just room for both slots
    plain = _run(runner, requests, 2, kv_budget_mib=budget)
    trace = _run(runner, requests, 2, kv_budget_mib=budget, prefix_caching=True)
    _check_outputs(trace, references, requests)
    total = trace.info["kv_blocks"]
    full = [s for s in trace.steps if s.kv_blocks_used + len(s.cached_free_blocks) == total]
    assert full, "the pool never filled up with held and cached free blocks"
    assert trace.metrics().num_preemptions == plain.metrics().num_preemptions == 0


def _delayed(requests, delay_s):
    """Every request but the first arrives ``delay_s`` later, so it can hit the first's blocks."""
    return [requests[0]] + [dataclasses.replace(r, arrival_s=delay_s) for r in requests[1:]]


def test_preempting_a_sequence_that_shares_blocks_leaves_the_others_blocks(runner, references):
    """Under a tight pool, a preempted sequence drops its references only: the blocks it shared
    stay in the other sequences' tables, and outputs still equal the reference."""
    requests = _delayed(make_requests([(SYSTEM + q, 40) for q in LONG_QUESTIONS]), 0.01)
    trace = _run(runner, requests, 3, kv_budget_mib=_budget_mib(runner, 30), prefix_caching=True)
    _check_outputs(trace, references, requests)
    checked = 0
    for prev, step in zip(trace.steps, trace.steps[1:], strict=False):
        for victim in step.preempted:
            shared = [b for b, rids in prev.shared_blocks.items() if victim in rids]
            others = {r: t for r, t in step.block_tables.items() if r != victim}
            for block in shared:
                holders = [r for r in prev.shared_blocks[block] if r != victim and r in others]
                assert all(block in others[r] for r in holders), f"block {block} lost"
                checked += len(holders)
            assert victim not in step.block_tables, f"R{victim} kept blocks after preemption"
    assert checked > 0, "no preempted sequence shared blocks: the test needs a tighter pool"


def test_trace_shares_blocks_consistently(runner):
    """Each step's shared blocks are exactly the blocks in two or more tables, used blocks count
    each block once, and cached free blocks are held by no one."""
    requests = _delayed(make_requests(SPECS), 0.005)
    trace = _run(runner, requests, 3, prefix_caching=True)
    assert any(step.shared_blocks for step in trace.steps), "no step shared a block"
    for step in trace.steps:
        holders = step.block_holders()
        assert step.shared_blocks == {b: r for b, r in holders.items() if len(r) > 1}
        assert step.kv_blocks_used == len(holders)
        assert not set(step.cached_free_blocks) & set(holders), "a held block is on the queue"
        for s in step.seqs:
            assert s.num_prefix_cached_tokens <= s.num_cached_tokens
            assert s.num_prefix_cached_tokens % 4 == 0


def test_static_engine_reports_no_cached_tokens(runner):
    """Static waves prefill every prompt in full: 0 cached tokens and a 0 hit rate."""
    trace = StaticEngine(runner, EngineConfig(3)).run(make_requests(SPECS))
    assert [r.num_cached_tokens for r in trace.requests] == [0] * len(SPECS)
    assert trace.metrics().prefix_cache_hit_rate == 0.0


PREFIXES = ["", "shared opening words ", "another common start, a bit longer "]
WORKLOADS = st.lists(
    st.tuples(st.sampled_from(PREFIXES), st.text("abcxyz ", max_size=9), st.integers(1, 14)),
    min_size=1,
    max_size=6,
)


@settings(max_examples=12, deadline=None)
@given(
    specs=WORKLOADS,
    num_slots=st.integers(1, 3),
    block_size=st.sampled_from([2, 4, 8]),
    token_budget=st.sampled_from([None, 3, 7]),
    tight=st.booleans(),
    policy=st.sampled_from(["decode_first", "vllm"]),
)
def test_any_workload_matches_the_reference(
    runner, references, specs, num_slots, block_size, token_budget, tight, policy
):
    """Random prompts with shared openings, slots, block sizes, budgets, pools and policies (the
    vllm policy shares blocks within a step): the outputs equal the reference, and the run leaks
    no block."""
    requests = make_requests([(p + s or "a", cap) for p, s, cap in specs])
    longest = max(r.num_prompt_tokens + r.max_new_tokens for r in requests)
    pool = -(-longest // block_size) + 1 if tight else None
    budget = None if pool is None else _budget_mib(runner, pool, block_size)
    budget_tokens = token_budget if token_budget is None else max(token_budget, num_slots)
    trace = _run(
        runner,
        requests,
        num_slots,
        block_size,
        max_num_batched_tokens=budget_tokens,
        kv_budget_mib=budget,
        prefix_caching=True,
        scheduling_policy=policy,
    )
    _check_outputs(trace, references, requests)


def test_with_prefix_caching_a_budget_may_hold_more_than_the_slots_need(runner):
    """Cached blocks are worth memory: a huge budget gives every request's blocks, not only
    every slot's longest sequence (the cap without prefix caching)."""
    requests = make_requests(SPECS)
    plain = _run(runner, requests, 2, kv_budget_mib=1e6)
    cached = _run(runner, requests, 2, kv_budget_mib=1e6, prefix_caching=True)
    every = sum(-(-(r.num_prompt_tokens + r.max_new_tokens) // 4) for r in requests)
    longest = max(r.num_prompt_tokens + r.max_new_tokens for r in requests)
    assert plain.info["kv_blocks"] == 2 * -(-longest // 4)
    assert cached.info["kv_blocks"] == every


def test_transformers_block_sharing_matches_the_reference(runner, references):
    """transformers' manager with allow_block_sharing, on prompts sharing over one 256-token
    page: outputs equal the reference; its cached-token counts are unknown (None)."""
    from engine.peers.transformers_engine import HFContinuousEngine

    opening = "a long shared opening, " * 13  # 299 byte tokens: one full page and more
    requests = make_requests([(opening + q, 8) for q in LONG_QUESTIONS])
    trace = HFContinuousEngine(runner, EngineConfig(2), block_sharing=True).run(requests)
    _check_outputs(trace, references, requests)
    assert trace.info == {"block_sharing": True}
    assert [r.num_cached_tokens for r in trace.requests] == [None] * len(requests)
    assert trace.metrics().prefix_cache_hit_rate is None
