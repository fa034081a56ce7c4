"""KV cache groups: one block table per sequence per layer type, over one pool of blocks, for
models mixing sliding and global layers, as vLLM's ``HybridKVCacheCoordinator``::

    Gemma 2 (layer 0 sliding W = 8, layer 1 global), block size 4, R0 at 20 tokens:
    group 0 (global, layer 1):   R0's table [3, 0, 7, 2, 9]
    group 1 (window 8, layer 0): R0's table [FREED, FREED, 4, 5, 6]     blocks 0..9: one pool

It answers the scheduler as one ``BlockManager``; a prefix hit is the longest every group serves."""

from __future__ import annotations

from collections.abc import Callable

from engine.serving.block_manager import FREED, BlockManager


class KVCacheGroups:
    """One ``BlockManager`` per entry of ``windows`` (keys; None: global) over one pool."""

    window = None  # no window every layer shares (``BlockManager.window``)

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        windows: list[int | None],
        prefix_caching: bool = False,
        vllm_order: bool = False,
    ):
        pool = BlockManager(num_blocks, block_size, prefix_caching, vllm_order, windows[0])
        others = [BlockManager.for_group(pool, g, w) for g, w in enumerate(windows) if g]
        self.groups = [pool, *others]
        self.num_blocks, self.block_size = num_blocks, block_size
        self.prefix_caching, self.window_freed = prefix_caching, pool.window_freed
        self.block_tables = pool.block_tables

    @property
    def group_windows(self) -> list[int | None]:
        return [m.window for m in self.groups]

    @property
    def num_free_blocks(self) -> int:
        return self.groups[0].num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.groups[0].num_used_blocks

    def num_missing_blocks(self, request_id: int, num_tokens: int) -> int:
        """Blocks ``request_id`` still lacks in all groups to hold ``num_tokens`` tokens."""
        return sum(m.num_missing_blocks(request_id, num_tokens) for m in self.groups)

    def allocate(self, request_id: int, num_tokens: int) -> bool:
        """Grow ``request_id``'s table in every group to hold ``num_tokens`` tokens; False (no
        change) if the pool is short."""
        if self.num_missing_blocks(request_id, num_tokens) > self.num_free_blocks:
            return False
        for m in self.groups:
            assert m.allocate(request_id, num_tokens), "the pool shrank while allocating"
        return True

    def free(self, request_id: int) -> int:
        return sum(m.free(request_id) for m in self.groups)

    def free_out_of_window(self, request_id: int, num_computed_tokens: int) -> int:
        return sum(m.free_out_of_window(request_id, num_computed_tokens) for m in self.groups)

    def num_held_blocks(self, request_id: int) -> int:
        return sum(m.num_held_blocks(request_id) for m in self.groups)

    # --- prefix caching --------------------------------------------------------------------
    def hash_blocks(
        self, hashes: list[bytes], num_tokens: int, token_ids: Callable[[int, int], list[int]]
    ) -> list[bytes]:
        return self.groups[0].hash_blocks(hashes, num_tokens, token_ids)

    def match_prefix(self, hashes: list[bytes]) -> list[list[int]]:
        """Per group, the blocks of the longest prefix of ``hashes`` every group can serve
        (a sliding group's blocks before its window ``FREED``); empty lists on a miss."""
        for length in range(len(hashes), 0, -1):
            hit = [self._group_hit(m, hashes, length) for m in self.groups]
            if None not in hit:
                return hit
        return [[] for _ in self.groups]

    def _group_hit(self, m: BlockManager, hashes: list[bytes], length: int) -> list[int] | None:
        """``m``'s table for a hit of ``length`` blocks: the cached blocks the first query after
        it reads (position ``p = length * block_size`` reads keys from ``p - W + 1``), those
        before ``FREED``; None if one of them is not cached."""
        first = 0
        if m.window is not None:
            first = max(0, length * self.block_size - m.window + 1) // self.block_size
        blocks = [m.cached_block(h) for h in hashes[first:length]]
        return None if None in blocks else [FREED] * first + blocks

    @staticmethod
    def num_hit_blocks(hit: list[list[int]]) -> int:
        return len(hit[0])

    def num_free_among(self, hit: list[list[int]]) -> int:
        return sum(m.num_free_among(blocks) for m, blocks in zip(self.groups, hit, strict=True))

    def num_blocks_to_seat(self, hit: list[list[int]], num_tokens: int) -> int:
        return sum(
            m.num_blocks_to_seat(blocks, num_tokens)
            for m, blocks in zip(self.groups, hit, strict=True)
        )

    def share(self, request_id: int, hit: list[list[int]]) -> None:
        for m, blocks in zip(self.groups, hit, strict=True):
            m.share(request_id, blocks)

    def cache_blocks(self, request_id: int, hashes: list[bytes], num_full_blocks: int) -> None:
        for m in self.groups:
            m.cache_blocks(request_id, hashes, num_full_blocks)

    def shared_blocks(self) -> dict[int, list[int]]:
        return {b: rids for m in self.groups for b, rids in m.shared_blocks().items()}

    def cached_free_blocks(self) -> list[int]:
        return self.groups[0].cached_free_blocks()

    def check_no_leaks(self) -> None:
        """As ``BlockManager.check_no_leaks``, over the tables of every group."""
        self.groups[0].check_no_leaks([t for m in self.groups for t in m.block_tables.values()])
