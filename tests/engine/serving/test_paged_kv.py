"""The paged KV cache: block bookkeeping, preemption under a small budget, no leaked blocks;
the scheduler owns the block manager and every KV mode's cache is a ``KVCache``."""

import random
from types import MappingProxyType

import pytest
from tiny_model import make_requests, tiny_runner

from engine.batching.continuous import ContinuousEngine
from engine.config import EngineConfig
from engine.fidelity.reference import ReferenceCache
from engine.serving.block_manager import BlockManager, blocks_for
from engine.serving.kv_cache import KVCache
from engine.serving.scheduler import Scheduler

SPECS = [
    ("the quick brown fox jumps", 40),
    ("hello world", 25),
    ("a", 30),
    ("Once upon a time", 33),
    ("z" * 30, 12),
    ("xyz", 3),
]
BLOCK_SIZE = 4


def test_blocks_for_rounds_up():
    assert [blocks_for(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_allocate_grows_tables_and_free_returns_blocks():
    blocks = BlockManager(num_blocks=5, block_size=4)
    assert blocks.allocate(7, 6)  # 2 blocks
    assert blocks.allocate(8, 4)  # 1 block
    assert blocks.allocate(7, 9)  # grows R7 to 3 blocks, in token order
    assert len(blocks.block_tables[7]) == 3 and blocks.num_free_blocks == 1
    assert not blocks.allocate(8, 12), "needs 2 more, 1 is free"
    assert len(blocks.block_tables[8]) == 1, "a failed allocation changes nothing"
    assert blocks.free(7) == 3 and blocks.num_free_blocks == 4
    assert blocks.free(7) == 0, "freeing twice frees nothing"
    blocks.check_no_leaks()


def test_random_allocations_never_leak_or_share_blocks():
    """Any sequence of allocations and frees keeps every block free or owned exactly once."""
    rng = random.Random(0)
    blocks = BlockManager(num_blocks=17, block_size=3)
    sizes: dict[int, int] = {}
    for _ in range(2000):
        rid = rng.randrange(6)
        if rng.random() < 0.3:
            blocks.free(rid)
            sizes.pop(rid, None)
        else:
            want = sizes.get(rid, 0) + rng.randrange(1, 7)
            if blocks.allocate(rid, want):
                sizes[rid] = want
        blocks.check_no_leaks()
        for r, n in sizes.items():
            assert len(blocks.block_tables[r]) == blocks_for(n, 3)


def test_check_no_leaks_catches_a_lost_block():
    blocks = BlockManager(num_blocks=3, block_size=2)
    blocks.allocate(0, 2)
    blocks.block_tables.clear()  # forget the owner without freeing
    with pytest.raises(AssertionError, match="leaked"):
        blocks.check_no_leaks()


@pytest.fixture(scope="module")
def runner():
    return tiny_runner(seed=5)


@pytest.fixture(scope="module")
def requests():
    return make_requests(SPECS)


@pytest.fixture(scope="module")
def reference(runner, requests):
    return ReferenceCache(runner).outputs(requests)


def _budget_mib(runner, num_blocks: int) -> float:
    return num_blocks * BLOCK_SIZE * runner.kv_bytes_per_token() / 2**20


@pytest.mark.parametrize("num_blocks", [17, 24, 40])
@pytest.mark.parametrize("token_budget", [None, 8])
@pytest.mark.parametrize("policy", ["decode_first", "vllm"])
def test_preemption_keeps_outputs_and_frees_every_block(
    runner, requests, reference, num_blocks, token_budget, policy
):
    """A pool too small for all slots preempts the newest sequence; outputs stay the reference
    (either policy)."""
    config = EngineConfig(
        4,
        kv_mode="paged",
        block_size=BLOCK_SIZE,
        kv_budget_mib=_budget_mib(runner, num_blocks),
        max_num_batched_tokens=token_budget,
        scheduling_policy=policy,
    )
    trace = ContinuousEngine(runner, config).run(requests)  # asserts no leak at the end
    assert trace.info["kv_blocks"] == num_blocks
    for r in trace.requests:
        assert r.output_token_ids == reference[r.request_id], f"R{r.request_id} differs"
    for step in trace.steps:
        assert step.kv_blocks_used <= num_blocks
        held = [b for table in step.block_tables.values() for b in table]
        assert len(held) == len(set(held)) == step.kv_blocks_used, "a block owned twice"
    preemptions = trace.metrics().num_preemptions
    assert preemptions == sum(r.num_preemptions for r in trace.requests)
    if num_blocks == 17:
        assert preemptions > 0, "17 blocks of 4 cannot hold four of these sequences at once"


def test_preempted_request_is_the_newest_and_restarts_from_scratch(runner, requests):
    """The victim is the latest arrival among the running ones; it prefills again from 0."""
    config = EngineConfig(
        4, kv_mode="paged", block_size=BLOCK_SIZE, kv_budget_mib=_budget_mib(runner, 17)
    )
    trace = ContinuousEngine(runner, config).run(requests)
    step = next(s for s in trace.steps if s.preempted)
    victim = step.preempted[0]
    before = trace.steps[step.index - 1]
    running_before = {s.request_id for s in before.seqs}
    assert victim == max(running_before), "requests arrive in id order; newest is the largest"
    assert victim not in {s.request_id for s in step.seqs}
    back = next(s for st in trace.steps[step.index :] for s in st.seqs if s.request_id == victim)
    assert back.num_cached_tokens == 0 and back.kind == "prefill"


def test_budget_too_small_for_one_request_is_refused(runner, requests):
    """A pool smaller than one request is refused, naming it as the page does (id and row)."""
    config = EngineConfig(
        2, kv_mode="paged", block_size=BLOCK_SIZE, kv_budget_mib=_budget_mib(runner, 3)
    )
    with pytest.raises(ValueError, match=r"^Request R\d+ \(row \d+\) needs .* Raise the KV"):
        ContinuousEngine(runner, config).run(requests)


def test_default_pool_holds_every_slot_without_preemption(runner, requests, reference):
    trace = ContinuousEngine(runner, EngineConfig(3, kv_mode="paged")).run(requests)
    assert trace.metrics().num_preemptions == 0
    assert {r.request_id: r.output_token_ids for r in trace.requests} == reference


def test_a_huge_budget_allocates_only_what_the_workload_can_use(runner, requests):
    """A budget of a million MiB gives the same pool as no budget: every slot's longest sequence."""
    huge = EngineConfig(3, kv_mode="paged", block_size=BLOCK_SIZE, kv_budget_mib=1e6)
    unset = EngineConfig(3, kv_mode="paged", block_size=BLOCK_SIZE)
    small = requests[:2]
    blocks = [ContinuousEngine(runner, c).run(small).info["kv_blocks"] for c in (huge, unset)]
    longest = max(r.num_prompt_tokens + r.max_new_tokens for r in small)
    assert blocks[0] == blocks[1] == 3 * blocks_for(longest, BLOCK_SIZE), blocks


def test_the_scheduler_builds_and_owns_the_block_manager():
    """Given a block count the scheduler builds its own BlockManager; without one it has none."""
    requests = make_requests(SPECS)
    paged = Scheduler(requests, 2, frozenset(), num_kv_blocks=9, block_size=3, prefix_caching=True)
    blocks = paged.block_manager
    assert isinstance(blocks, BlockManager), "paged mode: the scheduler must own a block manager"
    assert (blocks.num_blocks, blocks.block_size, blocks.prefix_caching) == (9, 3, True)
    assert Scheduler(requests, 2, frozenset()).block_manager is None, "slots mode has no blocks"


@pytest.mark.parametrize("kv_mode", ["slots", "paged", "concat"])
def test_every_kv_mode_builds_a_kv_cache(runner, kv_mode):
    """Each KV mode's cache implements the one KVCache interface the engines type against."""
    blocks = BlockManager(num_blocks=4, block_size=BLOCK_SIZE)
    cache = runner.new_kv_cache(
        kv_mode, 2, 16, 4, BLOCK_SIZE, MappingProxyType(blocks.block_tables)
    )
    assert isinstance(cache, KVCache), f"{type(cache).__name__} is not a KVCache"
    assert cache.bytes_per_token == runner.kv_bytes_per_token()


def test_the_paged_cache_reads_the_managers_block_tables_and_cannot_change_them(
    runner, requests, monkeypatch
):
    """The engine's paged cache sees the scheduler's block tables live, through a read-only view."""
    caches = []
    new_cache = runner.new_kv_cache

    def tracked_cache(*args, **kwargs):
        caches.append(new_cache(*args, **kwargs))
        return caches[-1]

    monkeypatch.setattr(runner, "new_kv_cache", tracked_cache)
    engine = ContinuousEngine(runner, EngineConfig(2, kv_mode="paged", block_size=BLOCK_SIZE))
    steps = engine.generate(requests[:2])
    live = None  # the cache's tables when a step ends: the next step is planned by then
    for _, (_, step) in zip(range(4), steps, strict=False):
        (cache,) = caches
        assert step.block_tables, "a paged step holds blocks"
        assert live in (None, step.block_tables), "the cache reads other tables"
        live = {rid: list(table) for rid, table in cache.block_tables.items()}
    with pytest.raises(TypeError):
        cache.block_tables[99] = [0]  # the scheduler's block manager alone changes them
    steps.close()
