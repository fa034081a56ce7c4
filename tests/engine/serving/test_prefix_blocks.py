"""The prefix cache's bookkeeping: hash chains, reference counts, LRU eviction, no leaks."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.serving.block_manager import BlockManager

BLOCK = 4


def _tokens(values: list[int]):
    """``token_ids(start, end)`` over a fixed token list, as a sequence gives it."""
    return lambda start, end: values[start:end]


def _compute(blocks: BlockManager, rid: int, tokens: list[int], hashes=None) -> list[bytes]:
    """Give ``rid`` blocks for ``tokens`` and register its full blocks, as after its prefill."""
    hashes = [] if hashes is None else hashes
    assert blocks.allocate(rid, len(tokens)), "the test's pool is too small"
    blocks.hash_blocks(hashes, len(tokens), _tokens(tokens))
    blocks.cache_blocks(rid, hashes, len(tokens) // BLOCK)
    return hashes


def _lookup(blocks: BlockManager, tokens: list[int]) -> list[int]:
    hashes = blocks.hash_blocks([], len(tokens), _tokens(tokens))
    return blocks.match_prefix(hashes)


X, Y, Z = [10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]


def test_same_tokens_in_another_position_never_hit():
    """A block's hash names its whole prefix: Y after X is not Y at the start, nor after Z."""
    blocks = BlockManager(8, BLOCK, prefix_caching=True)
    _compute(blocks, 0, X + Y)
    assert _lookup(blocks, Y + X) == [], "Y at position 0 matched Y at position 4"
    assert _lookup(blocks, Z + Y) == [], "Y after Z matched Y after X"
    assert len(_lookup(blocks, X + Z)) == 1, "the shared first block X must hit"
    assert len(_lookup(blocks, X + Y + Z)) == 2, "the whole cached prefix must hit"


def test_partial_blocks_are_never_cached():
    """Only full blocks get a hash: a 7-token prefix caches one block of 4, not two."""
    blocks = BlockManager(8, BLOCK, prefix_caching=True)
    _compute(blocks, 0, X + Y[:3])
    assert len(_lookup(blocks, X + Y[:3] + [99])) == 1


def test_shared_blocks_count_references_and_survive_one_holder_leaving():
    """Two holders give a count of 2; freeing one leaves the block held, freeing both caches it."""
    blocks = BlockManager(6, BLOCK, prefix_caching=True)
    _compute(blocks, 0, X + Y + [1])
    hit = _lookup(blocks, X + Y + [2])
    assert len(hit) == 2
    blocks.share(1, hit)
    assert [blocks.ref_counts[b] for b in hit] == [2, 2]
    assert blocks.shared_blocks() == {hit[0]: [0, 1], hit[1]: [0, 1]}
    assert blocks.num_used_blocks == 3, "3 distinct blocks held: 2 shared and R0's partial one"
    blocks.free(0)
    assert [blocks.ref_counts[b] for b in hit] == [1, 1] and blocks.cached_free_blocks() == []
    blocks.free(1)
    assert sorted(blocks.cached_free_blocks()) == sorted(hit), "both keep their hash when free"
    assert blocks.num_free_blocks == 6 and blocks.num_used_blocks == 0
    blocks.check_no_leaks()


def test_eviction_is_least_recently_used_first_and_tail_first():
    """A dry pool evicts the cached block freed longest ago; a sequence's tail goes first."""
    blocks = BlockManager(4, BLOCK, prefix_caching=True)
    _compute(blocks, 0, X + Y)  # blocks 0, 1
    _compute(blocks, 1, Z + X)  # blocks 2, 3
    blocks.free(0)  # queue: 1 (R0's tail), 0
    blocks.free(1)  # queue: 1, 0, 3, 2
    assert blocks.cached_free_blocks() == [1, 0, 3, 2]
    hit = _lookup(blocks, X + Y + [5])
    blocks.share(2, hit)  # R2 reuses blocks 0 and 1: off the queue
    blocks.free(2)  # back at the most recent end, tail first
    assert blocks.cached_free_blocks() == [3, 2, 1, 0]
    assert blocks.allocate(3, 4)
    assert blocks.block_tables[3] == [3], "the least recently used block is evicted first"
    assert _lookup(blocks, Z + X) == [2], "Z+X lost its tail block, its head still hits"
    assert blocks.allocate(3, 8) and blocks.block_tables[3] == [3, 2]
    assert _lookup(blocks, Z + X) == [] and len(_lookup(blocks, X + Y + [5])) == 2
    blocks.check_no_leaks()


def test_plain_free_blocks_go_before_any_cached_block_is_evicted():
    """New blocks come from blocks without a hash while any is left."""
    blocks = BlockManager(4, BLOCK, prefix_caching=True)
    _compute(blocks, 0, X)
    blocks.free(0)
    assert blocks.allocate(1, 12)
    assert 0 not in blocks.block_tables[1], "the cached block was evicted while others were free"
    assert len(_lookup(blocks, X + [1])) == 1


def test_equal_blocks_computed_twice_keep_one_hash():
    """Two sequences that computed the same prefix in one step: the first owns the hash, the
    second's copy has none and goes back to the plain free list."""
    blocks = BlockManager(4, BLOCK, prefix_caching=True)
    _compute(blocks, 0, X + [1])
    _compute(blocks, 1, X + [1])
    assert _lookup(blocks, X + [2]) == blocks.block_tables[0][:1]
    blocks.free(1)
    assert blocks.cached_free_blocks() == [], "the duplicate must not enter the cached queue"
    blocks.free(0)
    assert blocks.cached_free_blocks() == [0]
    blocks.check_no_leaks()


@pytest.mark.parametrize(
    ("vllm_order", "d_hit", "a_hit"),
    [(False, [0], [2, 3]), (True, [], [2, 3])],
    ids=["default", "vllm"],
)
def test_a_copy_kept_cached_in_vllms_order_costs_an_older_prefix(vllm_order, d_hit, a_hit):
    """D, A, A again (its last block recomputed: a copy), then E in a dry pool of 5: by default
    the copy has no hash and is reused, so D's first block survives; in vLLM's order the copy
    keeps A's hash, E evicts both of D's blocks, and A still hits through the copy's original."""
    blocks = BlockManager(5, BLOCK, prefix_caching=True, vllm_order=vllm_order)
    d, a, e = X + Y, Y + Z, Z + X
    _compute(blocks, 0, d)  # blocks 0, 1
    blocks.free(0)
    _compute(blocks, 1, a)  # blocks 2, 3
    blocks.free(1)
    hashes = blocks.hash_blocks([], len(a) - 1, _tokens(a))
    blocks.share(2, blocks.match_prefix(hashes))  # a hit leaves the last token to compute
    assert blocks.block_tables[2] == [2]
    _compute(blocks, 2, a, hashes)  # block 4: A's second block again
    blocks.free(2)
    cached = [1, 0, 3, 4, 2] if vllm_order else [1, 0, 3, 2]
    assert blocks.cached_free_blocks() == cached, "the copy's place in the cached queue"
    _compute(blocks, 3, e)
    assert blocks.block_tables[3] == ([1, 0] if vllm_order else [4, 1]), "E's blocks"
    assert _lookup(blocks, d + [7]) == d_hit, "what is left of D"
    assert _lookup(blocks, a + [7]) == a_hit, "A hits its first registered blocks"
    blocks.check_no_leaks()


def test_vllms_order_reuses_a_freed_plain_block_first_and_frees_tails_first():
    """vLLM prepends freed blocks without a hash, a table's tail first, ahead of never-used
    ones (``free_blocks``), with or without prefix caching; the default appends them."""
    for prefix_caching in (False, True):
        blocks = BlockManager(6, BLOCK, prefix_caching=prefix_caching, vllm_order=True)
        assert blocks.allocate(0, 7) and blocks.block_tables[0] == [0, 1]
        blocks.free(0)
        assert blocks.allocate(1, 12) and blocks.block_tables[1] == [1, 0, 2], prefix_caching
        blocks.check_no_leaks()
    blocks = BlockManager(6, BLOCK)
    assert blocks.allocate(0, 7)
    blocks.free(0)
    assert blocks.allocate(1, 12) and blocks.block_tables[1] == [2, 3, 4]


def test_leak_check_catches_a_reference_the_tables_do_not_hold():
    """A block counted as held but in no table is a leak."""
    blocks = BlockManager(3, BLOCK, prefix_caching=True)
    _compute(blocks, 0, X)
    blocks.block_tables.clear()
    with pytest.raises(AssertionError, match="leaked"):
        blocks.check_no_leaks()


OPS = st.lists(
    st.tuples(
        st.sampled_from(["admit", "grow", "free"]),
        st.integers(0, 4),  # request id
        st.integers(0, 3),  # which shared prefix its tokens start with
        st.integers(1, 9),  # tokens
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(OPS, st.booleans())
def test_random_workloads_keep_counts_non_negative_and_free_plus_used_total(ops, vllm_order):
    """Any mix of admissions with lookups, growth, caching and frees keeps the books straight,
    in either free order."""
    blocks = BlockManager(12, BLOCK, prefix_caching=True, vllm_order=vllm_order)
    seqs: dict[int, tuple[list[int], list[bytes], int]] = {}  # rid -> tokens, hashes, computed
    for op, rid, prefix, n in ops:
        if op == "free" or (op == "admit" and rid in seqs):
            blocks.free(rid)
            seqs.pop(rid, None)
        elif op == "admit":
            tokens = [prefix] * 6 + [rid, n] * 6
            hashes = blocks.hash_blocks([], len(tokens) - 1, _tokens(tokens))
            hit = blocks.match_prefix(hashes)
            blocks.share(rid, hit)
            seqs[rid] = (tokens, hashes, len(hit) * BLOCK)
        elif rid in seqs:
            tokens, hashes, done = seqs[rid]
            want = min(len(tokens), done + n)
            if blocks.allocate(rid, want):
                blocks.hash_blocks(hashes, want, _tokens(tokens))
                blocks.cache_blocks(rid, hashes, want // BLOCK)
                seqs[rid] = (tokens, hashes, want)
        blocks.check_no_leaks()
        assert min(blocks.ref_counts) >= 0, "a negative reference count"
        assert blocks.num_free_blocks + blocks.num_used_blocks == blocks.num_blocks


@pytest.mark.parametrize("kv_mode", ["slots", "concat"])
def test_prefix_caching_needs_the_paged_kv_mode(kv_mode):
    """Prefix caching with a per-slot or concatenated cache is refused, naming the paged mode."""
    with pytest.raises(ValueError, match="Prefix caching needs the paged KV cache"):
        EngineConfig(2, kv_mode=kv_mode, prefix_caching=True)
    assert EngineConfig(2, kv_mode="paged", prefix_caching=True).prefix_caching
