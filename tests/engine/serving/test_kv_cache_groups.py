"""KV cache groups: Gemma 2 and 3 mix sliding-window and global layers, so each layer type keeps
its own block tables over one pool, the sliding groups free the blocks out of their window, the
outputs still equal per-request ``generate``, and a pool too small without freeing runs
unpreempted with it."""

import json
import math

import pytest
from family_models import PAST_WINDOW_SPECS, WINDOW, family_runner
from tiny_model import make_requests

from engine import trace_codec
from engine.batching.continuous import ContinuousEngine, kv_pool_blocks
from engine.config import EngineConfig
from engine.fidelity.reference import ReferenceCache
from engine.serving.block_manager import FREED
from engine.serving.kv_cache_groups import KVCacheGroups
from engine.serving.scheduler import Scheduler

BLOCK_SIZE = 4
# One layer per group (Gemma 2: 1 sliding + 1 global; Gemma 3: 2 sliding + 1 global, cut in
# groups of the smaller count, 1), 2 key/value heads of 16 float32s, keys and values:
# 2 * 2 * 16 * 4 = 256 bytes per token per block.
BLOCK_BYTES = BLOCK_SIZE * 256
NUM_GROUPS = {"gemma2": 2, "gemma3": 3}
# Four 1- or 2-token prompts decoding 30 tokens: each needs 8 blocks whole per group.
PREEMPT_SPECS = [("a", 30), ("b", 30), ("cd", 29), ("e", 30), ("fg", 29), ("h", 30)]

CONFIGS = {  # name -> EngineConfig fields beside kv_mode="paged", block_size=BLOCK_SIZE
    "plain": dict(num_slots=3),
    "chunked": dict(num_slots=3, max_num_batched_tokens=5),
    "preempting": dict(num_slots=4, blocks_per_group=8),  # on PREEMPT_SPECS
    "prefix": dict(num_slots=2, prefix_caching=True),
    "prefix_vllm": dict(num_slots=2, prefix_caching=True, scheduling_policy="vllm"),
}


@pytest.fixture(scope="module", params=["gemma2", "gemma3"])
def gemma(request):
    runner = family_runner(request.param)
    requests = make_requests(PAST_WINDOW_SPECS)
    return request.param, runner, requests, ReferenceCache(runner).outputs(requests)


def test_layer_types_make_groups():
    """Gemma 2's layers alternate sliding (0) and global (1); the tiny Gemma 3 has layers 0, 1
    sliding and 2 global: groups of one layer each, global first. Llama and Mistral: one."""
    assert family_runner("gemma2").kv_layer_groups() == [(None, [1]), (WINDOW, [0])]
    assert family_runner("gemma3").kv_layer_groups() == [(None, [2]), (WINDOW, [0]), (WINDOW, [1])]
    assert family_runner("llama").kv_layer_groups() == [(None, [0, 1])]
    assert family_runner("mistral").kv_layer_groups() == [(WINDOW, [0, 1])]


def test_a_hit_frees_the_sliding_blocks_before_its_window():
    """A 20-token prefix (5 blocks) cached in both groups: the next query, at 20, reads keys
    13.. in the window of 8, so the sliding group needs only blocks 3 (12-15) and 4; blocks
    0-2 enter its table FREED. Once the sliding group's blocks 3-5 are evicted, a hit of 5 or 4
    blocks (query 16 reads keys 9..: blocks 2, 3) cannot be served, one of 3 can (query 12
    reads keys 5..: blocks 1, 2)."""
    groups = KVCacheGroups(20, 4, [None, 8], prefix_caching=True)
    tokens = list(range(24))
    hashes = groups.hash_blocks([], 24, lambda a, b: tokens[a:b])
    assert groups.allocate(0, 24) and groups.num_used_blocks == 12
    groups.cache_blocks(0, hashes, 6)
    kept = [list(m.block_tables[0]) for m in groups.groups]
    assert groups.free(0) == 12
    hit = groups.match_prefix(hashes[:5])
    assert hit == [kept[0][:5], [FREED] * 3 + kept[1][3:5]]
    assert groups.num_blocks_to_seat(hit, 21) == (1 + 5) + (1 + 2), "new + free hit, per group"
    groups.groups[0].share(5, kept[0][:6])  # the global blocks leave the LRU queue
    assert groups.groups[1].allocate(9, 11 * 4)  # 8 plain free blocks, then 3 evicted: 5, 4, 3
    assert groups.groups[1].cached_free_blocks() == kept[1][:3][::-1]
    hit = groups.match_prefix(hashes[:5])
    assert hit == [kept[0][:3], [FREED] + kept[1][1:3]], hit
    groups.share(1, hit)
    assert groups.num_held_blocks(1) == 5 and groups.groups[1].block_tables[1][0] == FREED
    for rid in (1, 5, 9):
        groups.free(rid)
    groups.check_no_leaks()


def _budget_mib(family: str, blocks_per_group: int) -> float:
    return NUM_GROUPS[family] * blocks_per_group * BLOCK_BYTES / 2**20


def _run(family, runner, requests, name):
    fields = dict(CONFIGS[name])
    blocks = fields.pop("blocks_per_group", None)
    budget = None if blocks is None else _budget_mib(family, blocks)
    config = EngineConfig(kv_mode="paged", block_size=BLOCK_SIZE, kv_budget_mib=budget, **fields)
    return ContinuousEngine(runner, config).run(requests)  # asserts no block leaked


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_grouped_paged_run_equals_generate_and_frees_blocks(gemma, name):
    """Outputs equal generate; per sequence the global group holds every block of its tokens
    and a sliding group, on a step feeding n tokens from position c, only the blocks of keys
    c - 7 .. c + n - 1: W - 1 + n positions, at most ceil((8 - 1 + n) / 4) + 1 blocks (3 for
    a decode); the 67-token sequence's last step, from 66, has freed (66 - 8 + 1) // 4 = 14."""
    family, runner, requests, reference = gemma
    most_freed = 14
    if name == "preempting":
        requests = make_requests(PREEMPT_SPECS)
        reference = ReferenceCache(runner).outputs(requests)
        most_freed = 5  # a 31-token sequence's last step, from 30: (30 - 8 + 1) // 4 blocks
    trace = _run(family, runner, requests, name)
    groups = trace.info["kv_groups"]
    assert [g["window"] for g in groups] == [None] + [WINDOW] * (NUM_GROUPS[family] - 1)
    for r in trace.requests:
        assert r.output_token_ids == reference[r.request_id], (
            f"{family} {name}: R{r.request_id} {r.output_token_ids} != {reference[r.request_id]}"
        )
    freed = 0
    for step in trace.steps:
        assert step.block_tables == step.group_block_tables[0]
        for s in step.seqs:
            end = s.num_cached_tokens + s.num_new_tokens
            assert step.block_tables[s.request_id] == [
                b for b in step.block_tables[s.request_id] if b != FREED
            ], "the global group freed a block"
            assert len(step.block_tables[s.request_id]) == math.ceil(end / BLOCK_SIZE)
            bound = math.ceil((WINDOW - 1 + s.num_new_tokens) / BLOCK_SIZE) + 1
            for tables in step.group_block_tables[1:]:
                held = sum(1 for b in tables[s.request_id] if b != FREED)
                assert held <= bound, f"{name} step {step.index}: R{s.request_id} holds {held}"
                freed = max(freed, tables[s.request_id].count(FREED))
    assert freed == most_freed, f"{family} {name}: the longest sequence freed {freed} blocks"
    if name == "preempting":
        assert trace.info["kv_blocks"] == NUM_GROUPS[family] * 8
        assert trace.metrics().num_preemptions > 0, "4 slots on 8 blocks a group should preempt"
    if name.startswith("prefix"):
        assert trace.metrics().num_cached_tokens > 0, f"{name}: no prefix hit"
    for compact in (False, True):
        loaded = trace_codec.decode(json.loads(json.dumps(trace_codec.encode(trace, compact))))
        assert [s.group_block_tables for s in loaded.steps] == [
            s.group_block_tables for s in trace.steps
        ], f"the group tables do not survive the JSON trace (compact={compact})"
        assert [s.window_freed_blocks for s in loaded.steps] == [
            s.window_freed_blocks for s in trace.steps
        ], f"the window-freed blocks do not survive the JSON trace (compact={compact})"


def _schedule_all(kv_groups: list[int | None], num_blocks: int) -> tuple[int, int, int]:
    """Three 4-token prompts decoding 16 tokens each, no EOS: (preemptions, steps, most blocks
    held at once)."""
    scheduler = Scheduler(
        make_requests([("abcd", 16)] * 3),
        num_slots=3,
        eos_token_ids=frozenset(),
        num_kv_blocks=num_blocks,
        block_size=BLOCK_SIZE,
        kv_groups=kv_groups,
    )
    preempted = steps = most = 0
    while scheduler.has_work():
        step = scheduler.schedule()
        preempted, steps = preempted + len(step.preempted), steps + 1
        most = max(most, scheduler.block_manager.num_used_blocks)
        scheduler.postprocess(step, [7] * len(step.seqs))
    scheduler.block_manager.check_no_leaks()
    return preempted, steps, most


def test_freeing_a_sliding_group_avoids_preemption():
    """A global group and a sliding one (window 8) on one pool of 24 blocks. Each sequence's
    last step feeds position 18: the global group holds ceil(19 / 4) = 5 blocks, the sliding
    group those of keys 11..18, blocks 2-4: 8 a sequence, 24 for three, so one prefill step and
    15 decodes run unpreempted. Without freeing each holds 5 + 5 = 10 and three need 30: the
    pool fills at position 16 and someone is preempted and recomputed, in more steps."""
    assert _schedule_all([None, WINDOW], 24) == (0, 16, 24)
    preempted, steps, most = _schedule_all([None, None], 24)
    assert preempted > 0 and steps > 16 and most == 24, (preempted, steps, most)


def test_a_budget_too_small_for_a_request_in_every_group_is_refused():
    """A 1-token prompt capped at 30 caches 30 tokens: 8 blocks of 4 in each of 2 groups, 16 in
    all (a recompute prefills it whole in each group). 15 blocks' budget is refused in words
    that count per group (15 // 2 * 4 = 28 tokens each); 16 blocks is enough."""
    requests = make_requests([("a", 30)])
    for blocks in (15, 16):
        mib = blocks * BLOCK_BYTES / 2**20
        config = EngineConfig(1, kv_mode="paged", block_size=BLOCK_SIZE, kv_budget_mib=mib)
        if blocks == 15:
            with pytest.raises(ValueError, match="28 tokens in each of 2 KV cache groups"):
                kv_pool_blocks(config, requests, BLOCK_BYTES // BLOCK_SIZE, num_groups=2)
        else:
            assert kv_pool_blocks(config, requests, BLOCK_BYTES // BLOCK_SIZE, num_groups=2) == 16
