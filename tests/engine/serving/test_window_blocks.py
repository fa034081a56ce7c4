"""A sliding window frees KV blocks: blocks wholly out of every layer's window go back to the
pool, the outputs still equal per-request ``generate``, and a pool too small for the whole
sequences runs without preemption."""

import math

import pytest
from family_models import PAST_WINDOW_SPECS, WINDOW, family_runner
from tiny_model import make_requests

from engine.batching.continuous import ContinuousEngine
from engine.config import EngineConfig
from engine.fidelity.reference import ReferenceCache
from engine.serving.block_manager import FREED, BlockManager
from engine.serving.scheduler import Scheduler

BLOCK_SIZE = 4
SPECS = PAST_WINDOW_SPECS  # up to 8 windows long, a shared 16-token prefix

# Four 1- or 2-token prompts decoding 30 tokens: each needs 8 blocks whole, 3 in its window;
# four at once need 12, so a pool of 8 (the least one request needs) still preempts.
PREEMPT_SPECS = [("a", 30), ("b", 30), ("cd", 29), ("e", 30), ("fg", 29), ("h", 30)]


def _budget_mib(runner, num_blocks: int) -> float:
    return num_blocks * BLOCK_SIZE * runner.kv_bytes_per_token() / 2**20


CONFIGS = {  # name -> EngineConfig fields beside kv_mode="paged", block_size=BLOCK_SIZE
    "plain": dict(num_slots=3),
    "chunked": dict(num_slots=3, max_num_batched_tokens=5),
    "preempting": dict(num_slots=4, blocks=8),  # on PREEMPT_SPECS
    "prefix": dict(num_slots=2, prefix_caching=True),
    "prefix_vllm": dict(num_slots=2, prefix_caching=True, scheduling_policy="vllm"),
}


@pytest.fixture(scope="module")
def mistral():
    runner = family_runner("mistral")
    requests = make_requests(SPECS)
    return runner, requests, ReferenceCache(runner).outputs(requests)


def _run(runner, requests, name):
    fields = dict(CONFIGS[name])
    blocks = fields.pop("blocks", None)
    budget = None if blocks is None else _budget_mib(runner, blocks)
    config = EngineConfig(kv_mode="paged", block_size=BLOCK_SIZE, kv_budget_mib=budget, **fields)
    return ContinuousEngine(runner, config).run(requests)  # asserts no block leaked


def test_freed_blocks_are_the_ones_before_the_first_query_window():
    """Window 6, block size 4, next query at 13 reads keys 8..: blocks of tokens 0-7 go."""
    blocks = BlockManager(num_blocks=4, block_size=4, window=6)
    assert blocks.allocate(0, 14)  # all 4 blocks: tokens 0-15
    assert blocks.free_out_of_window(0, 12) == 1, "query 12 reads keys 7..: block 1 stays"
    assert blocks.free_out_of_window(0, 13) == 1
    assert blocks.block_tables[0][:2] == [FREED, FREED] and blocks.num_free_blocks == 2
    assert blocks.num_held_blocks(0) == 2 and sorted(blocks.window_freed) == [0, 1]
    assert blocks.num_missing_blocks(0, 17) == 1, "the table still indexes positions"
    assert blocks.allocate(0, 17) and blocks.free(0) == 3
    assert list(blocks.window_freed) == [1], "block 0 was taken again"
    blocks.check_no_leaks()
    assert BlockManager(6, 4).free_out_of_window(0, 13) == 0, "no window, nothing freed"


def test_a_freed_cached_block_keeps_its_prefix():
    """With prefix caching a block freed out of the window keeps its hash (its keys are
    intact), so a later sequence with the same prefix still shares it."""
    blocks = BlockManager(num_blocks=8, block_size=4, prefix_caching=True, window=4)
    tokens = list(range(12))
    hashes = blocks.hash_blocks([], 12, lambda a, b: tokens[a:b])
    assert blocks.allocate(0, 12)
    blocks.cache_blocks(0, hashes, 3)
    assert blocks.free_out_of_window(0, 9) == 1  # query 9 reads keys 6..: block of 0-3 goes
    first = blocks.cached_free_blocks()
    assert len(first) == 1 and blocks.block_tables[0][0] == FREED
    assert blocks.match_prefix(hashes[:2]) == [first[0], blocks.block_tables[0][1]]
    blocks.share(1, blocks.match_prefix(hashes[:2]))
    assert blocks.window_freed == {}, "the shared block is held again"
    blocks.check_no_leaks()


def test_window_admits_what_a_global_pool_preempts():
    """Three sequences of 4 + 16 tokens need 5 blocks of 4 each whole (15), the pool has 9:
    without a window lockstep decodes fill it at token 13 and one is preempted; with a window
    of 4 each holds at most ceil(4 / 4) + 1 = 2 blocks (6 in all) and none is."""
    used = {}
    for window in (None, 4):
        scheduler = Scheduler(
            make_requests([("abcd", 16)] * 3),
            num_slots=3,
            eos_token_ids=frozenset(),
            num_kv_blocks=9,
            block_size=4,
            window=window,
        )
        preempted, most = 0, 0
        while scheduler.has_work():
            step = scheduler.schedule()
            preempted += len(step.preempted)
            most = max(most, scheduler.block_manager.num_used_blocks)
            scheduler.postprocess(step, [7] * len(step.seqs))
        scheduler.block_manager.check_no_leaks()
        used[window] = (preempted, most)
    assert used[None][0] > 0, f"9 blocks held three 19-token sequences unpreempted: {used}"
    assert used[4] == (0, 6), f"a window of 4 should need 6 blocks, no preemption: {used}"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_windowed_paged_run_equals_generate_and_frees_blocks(mistral, name):
    """Mistral (every layer slides, window 8), paged with blocks of 4: outputs equal generate,
    and a step feeding n tokens holds at most ceil((8 - 1 + n) / 4) + 1 blocks per sequence
    (the keys from its first query's window start to its last token), 3 for a decode."""
    runner, requests, reference = mistral
    assert runner.kv_window() == WINDOW == 8
    most_freed = 14  # the 67-token sequence's last step, from 66: (66 - 8 + 1) // 4 blocks
    if name == "preempting":
        requests = make_requests(PREEMPT_SPECS)
        reference = ReferenceCache(runner).outputs(requests)
        most_freed = 5  # a 31-token sequence's last step, from 30: (30 - 8 + 1) // 4 blocks
    trace = _run(runner, requests, name)
    assert trace.info["kv_window"] == WINDOW
    for r in trace.requests:
        assert r.output_token_ids == reference[r.request_id], (
            f"{name}: R{r.request_id} {r.output_token_ids} != {reference[r.request_id]}"
        )
    freed = 0
    for step in trace.steps:
        for s in step.seqs:
            table = step.block_tables[s.request_id]
            held = sum(1 for b in table if b != FREED)
            bound = math.ceil((WINDOW - 1 + s.num_new_tokens) / BLOCK_SIZE) + 1
            assert held <= bound, f"{name} step {step.index}: R{s.request_id} holds {held}"
            freed = max(freed, table.count(FREED))
    assert freed == most_freed, f"{name}: the longest sequence freed {freed} blocks"
    if name == "preempting":
        assert trace.metrics().num_preemptions > 0, "4 slots on 8 blocks should still preempt"
    if name.startswith("prefix"):
        assert trace.metrics().num_cached_tokens > 0, f"{name}: no prefix hit"


def test_pool_too_small_for_whole_sequences_runs_unpreempted(mistral):
    """Three slots on a 20-block pool: the first three requests need 17 + 8 + 4 = 29 blocks
    whole, more than the pool, yet with the window nobody is preempted."""
    runner, requests, reference = mistral
    whole = [math.ceil((r.num_prompt_tokens + r.max_new_tokens - 1) / BLOCK_SIZE) for r in requests]
    assert whole[:3] == [17, 8, 4] and sum(whole[:3]) > 20
    config = EngineConfig(
        3, kv_mode="paged", block_size=BLOCK_SIZE, kv_budget_mib=_budget_mib(runner, 20)
    )
    trace = ContinuousEngine(runner, config).run(requests)
    assert trace.info["kv_blocks"] == 20
    assert trace.metrics().num_preemptions == 0, "the window's freed blocks should suffice"
    assert max(s.kv_blocks_used for s in trace.steps) <= 20
    for r in trace.requests:
        assert r.output_token_ids == reference[r.request_id], f"R{r.request_id} differs"


def test_hybrid_models_keep_every_block():
    """Gemma 2/3 mix global and sliding layers: no window every layer shares (their sliding
    layers free blocks in KV cache groups instead: test_kv_cache_groups.py)."""
    for family in ("gemma2", "gemma3", "llama"):
        assert family_runner(family).kv_window() is None, family
