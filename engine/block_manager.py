"""The block manager: which fixed-size KV blocks each sequence owns. Plain Python, no torch.

The paged KV cache (vLLM, "Efficient Memory Management for Large Language Model Serving with
PagedAttention", SOSP '23; ``vllm/v1/core/block_pool.py`` and ``kv_cache_manager.py``) splits KV
memory into blocks of ``block_size`` tokens. A sequence's *block table* lists its blocks in order,
so its token at position ``p`` lives in block ``table[p // block_size]`` at offset
``p % block_size``. Blocks come from a free list and go back to it when a sequence finishes or is
preempted, so memory is only held for tokens that exist, never for a worst-case reservation::

    block:    0    1    2    3    4    5    6    7
    owner:   R0   R0   R2   --   R0   R2   --   --      (-- free)
    R0's block table: [0, 1, 4]      R2's block table: [2, 5]
"""

from __future__ import annotations

import math
from collections import deque


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` tokens."""
    return math.ceil(num_tokens / block_size)


class BlockManager:
    """A free list of ``num_blocks`` KV blocks and one block table per request.

    Raises:
        ValueError: on fewer than one block or a block size below 1.
    """

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"A paged KV cache needs at least one block of at least one token "
                f"(got {num_blocks} blocks of {block_size})."
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self.block_tables: dict[int, list[int]] = {}  # request id -> block ids in token order

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def num_missing_blocks(self, request_id: int, num_tokens: int) -> int:
        """Blocks ``request_id`` still lacks to hold ``num_tokens`` tokens."""
        have = len(self.block_tables.get(request_id, ()))
        return max(0, blocks_for(num_tokens, self.block_size) - have)

    def allocate(self, request_id: int, num_tokens: int) -> bool:
        """Grow ``request_id``'s table to hold ``num_tokens`` tokens; False (no change) if short."""
        missing = self.num_missing_blocks(request_id, num_tokens)
        if missing > len(self._free):
            return False
        table = self.block_tables.setdefault(request_id, [])
        table.extend(self._free.popleft() for _ in range(missing))
        return True

    def free(self, request_id: int) -> int:
        """Return ``request_id``'s blocks to the free list; the number freed (0 if it had none)."""
        table = self.block_tables.pop(request_id, [])
        self._free.extend(table)
        return len(table)

    def check_no_leaks(self) -> None:
        """Every block is either free or in exactly one table.

        Raises:
            AssertionError: when a block is lost, shared or freed twice.
        """
        held = [b for table in self.block_tables.values() for b in table]
        every = sorted(held + list(self._free))
        assert every == list(range(self.num_blocks)), (
            f"KV blocks leaked or doubled: {len(held)} held + {len(self._free)} free "
            f"!= {self.num_blocks}"
        )
