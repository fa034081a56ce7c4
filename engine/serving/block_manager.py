"""The block manager: which fixed-size KV blocks each sequence holds (vLLM's ``block_pool.py``,
``kv_cache_manager.py``). Plain Python, no torch. Token ``p`` lives in block
``table[p // block_size]`` at offset ``p % block_size``::

    block:    0    1    2    3    4    5    6    7
    owner:   R0   R0   R2   --   R0   R2   --   --      (-- free)
    R0's block table: [0, 1, 4]      R2's block table: [2, 5]

Prefix caching names a full block by the hash of its parent's hash and its tokens; a freed block
keeps its hash in an LRU queue until evicted::

    hash:       h0 = H(root, t0..t15)  h1 = H(h0, t16..t31)   (a partial block has no hash)
    refcount:   2    2    1    1    0c   0      (0c: free, but keeps its hash: cached)
    R0's table: [0, 1, 2]     R3's table: [0, 1, 3]     cached free blocks (LRU first): [4]

``vllm_order``, ``window`` (``FREED`` blocks) and groups (``for_group``): docs/engines.md."""

from __future__ import annotations

import hashlib
import math
from array import array
from collections import Counter, OrderedDict, deque
from collections.abc import Callable

ROOT_HASH = b""  # the parent hash of a sequence's first block
FREED = -1  # a table entry whose block fell out of the sliding window and went back to the pool


def blocks_for(num_tokens: int, block_size: int) -> int:
    return math.ceil(num_tokens / block_size)


def block_hash(parent_hash: bytes, token_ids: list[int]) -> bytes:
    """SHA-256 of the parent's hash and this block's token ids, vLLM's default: Python's ``hash``
    would collide on crafted inputs (GHSA-rm76-4mrf-v9r8)."""
    digest = hashlib.sha256(parent_hash)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


class BlockManager:
    """A pool of ``num_blocks`` KV blocks, their reference counts and one block table per request.
    Raises ValueError: fewer than one block, or a block size below 1."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        prefix_caching: bool = False,
        vllm_order: bool = False,
        window: int | None = None,
    ):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"A paged KV cache needs at least one block of at least one token "
                f"(got {num_blocks} blocks of {block_size})."
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.vllm_order = vllm_order
        self.window = window  # keys every layer sees (None: global attention, nothing freed)
        self.window_freed: dict[int, None] = {}  # free blocks a window freed, none taken since
        self.block_tables: dict[int, list[int]] = {}  # request id -> block ids in token order
        self.ref_counts = [0] * num_blocks  # sequences holding each block
        self._free: deque[int] = deque(range(num_blocks))  # free, no hash
        self._cached_free: OrderedDict[int, None] = OrderedDict()  # free, hashed; LRU first
        self._hash_of: dict[int, bytes] = {}  # block id -> its prefix hash (full, computed)
        # prefix hash -> its blocks, first registered first (more than one only with vllm_order)
        self._blocks_of: dict[bytes, dict[int, None]] = {}
        self._num_hashed: dict[int, int] = {}  # request id -> leading table blocks looked at
        self._num_freed: dict[int, int] = {}  # request id -> leading table entries FREED
        self._salt = b""  # appended to a prefix hash to key this group's blocks

    @classmethod
    def for_group(cls, pool: BlockManager, group: int, window: int | None) -> BlockManager:
        """A manager of KV cache group ``group`` (its own block tables and ``window``) that draws
        its blocks from ``pool``'s free lists and shares its reference counts and prefix cache."""
        manager = cls(pool.num_blocks, pool.block_size, pool.prefix_caching, pool.vllm_order)
        manager.window = window
        for name in ("window_freed", "ref_counts", "_free", "_cached_free", "_hash_of"):
            setattr(manager, name, getattr(pool, name))
        manager._blocks_of = pool._blocks_of
        manager._salt = bytes([group]) if group else b""
        return manager

    @property
    def group_windows(self) -> list[int | None]:
        """Each KV cache group's window: one group here (``KVCacheGroups``: several)."""
        return [self.window]

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds: plain free ones and cached free ones (evictable)."""
        return len(self._free) + len(self._cached_free)

    @property
    def num_used_blocks(self) -> int:
        """Blocks at least one sequence holds (a shared block counts once)."""
        return self.num_blocks - self.num_free_blocks

    def num_missing_blocks(self, request_id: int, num_tokens: int) -> int:
        have = len(self.block_tables.get(request_id, ()))
        return max(0, blocks_for(num_tokens, self.block_size) - have)

    def allocate(self, request_id: int, num_tokens: int) -> bool:
        """Grow ``request_id``'s table to ``num_tokens`` tokens; False (no change) if short. New
        blocks come from the free list, then from evicting cached free blocks, least recently used
        first."""
        missing = self.num_missing_blocks(request_id, num_tokens)
        if missing > self.num_free_blocks:
            return False
        table = self.block_tables.setdefault(request_id, [])
        for _ in range(missing):
            block = self._free.popleft() if self._free else self._evict()
            self.ref_counts[block] = 1
            self.window_freed.pop(block, None)
            table.append(block)
        return True

    def _evict(self) -> int:
        """Take the least recently used cached free block and forget its hash."""
        block, _ = self._cached_free.popitem(last=False)
        h = self._hash_of.pop(block)
        del self._blocks_of[h][block]
        if not self._blocks_of[h]:
            del self._blocks_of[h]
        return block

    def free(self, request_id: int) -> int:
        """Release ``request_id``'s blocks; the number released. A block no one else holds goes to
        the cached free queue if hashed (tail first), else to the free list's end (front, tail block
        first, with ``vllm_order``)."""
        table = [b for b in self.block_tables.pop(request_id, []) if b != FREED]
        self._num_hashed.pop(request_id, None)
        self._num_freed.pop(request_id, None)
        self._release(reversed(table) if self.prefix_caching or self.vllm_order else table)
        return len(table)

    def free_out_of_window(self, request_id: int, num_computed_tokens: int) -> int:
        """Before a step from position ``num_computed_tokens``, release ``request_id``'s blocks
        wholly before ``num_computed_tokens - window + 1``, the first key its first query reads
        (later queries read later keys), and mark their table entries ``FREED``. Returns the
        number released (0 without a window)."""
        table = self.block_tables.get(request_id)
        if self.window is None or not table:
            return 0
        start = self._num_freed.get(request_id, 0)
        end = min(len(table), max(0, num_computed_tokens - self.window + 1) // self.block_size)
        gone = table[start:end]
        if not gone:
            return 0
        table[start:end] = [FREED] * len(gone)
        self._num_freed[request_id] = end
        self._release(gone)  # in token order: the oldest is evicted first
        self.window_freed.update((b, None) for b in gone if self.ref_counts[b] == 0)
        return len(gone)

    def _release(self, blocks) -> None:
        """Drop one reference to each of ``blocks``, in order; a block no one holds then goes
        back to the pool (see ``free``)."""
        plain = []
        for block in blocks:
            self.ref_counts[block] -= 1
            assert self.ref_counts[block] >= 0, f"block {block} released more than held"
            if self.ref_counts[block] == 0:
                if block in self._hash_of:
                    self._cached_free[block] = None
                else:
                    plain.append(block)
        if self.vllm_order:
            self._free.extendleft(reversed(plain))  # vLLM's prepend_n: plain[0] ends up first
        else:
            self._free.extend(plain)

    def num_held_blocks(self, request_id: int) -> int:
        """Blocks ``request_id``'s table holds now (its ``FREED`` entries not counted)."""
        return sum(1 for b in self.block_tables.get(request_id, ()) if b != FREED)

    # --- prefix caching --------------------------------------------------------------------
    def hash_blocks(
        self, hashes: list[bytes], num_tokens: int, token_ids: Callable[[int, int], list[int]]
    ) -> list[bytes]:
        """Extend ``hashes`` (a sequence's chain, in place) to its first ``num_tokens // B`` full
        blocks; ``token_ids(start, end)`` gives the sequence's tokens. Tokens are only ever
        appended, so a chain computed once stays valid, through preemptions too."""
        size = self.block_size
        start, end = len(hashes), num_tokens // size
        if end > start:
            tokens = token_ids(start * size, end * size)
            for i in range(end - start):
                parent = hashes[-1] if hashes else ROOT_HASH
                hashes.append(block_hash(parent, tokens[i * size : (i + 1) * size]))
        return hashes

    def match_prefix(self, hashes: list[bytes]) -> list[int]:
        """The cached blocks of the longest prefix of ``hashes`` (block ids, in order); where a
        hash has two blocks, the first registered."""
        found = []
        for h in hashes:
            block = self.cached_block(h)
            if block is None:
                break
            found.append(block)
        return found

    def cached_block(self, h: bytes) -> int | None:
        """The block cached under prefix hash ``h`` (the first registered), None if none."""
        blocks = self._blocks_of.get(h + self._salt)
        return None if blocks is None else next(iter(blocks))

    def num_free_among(self, blocks: list[int]) -> int:
        """How many of ``blocks`` no sequence holds now (sharing them takes them off the pool)."""
        return sum(1 for b in blocks if b != FREED and self.ref_counts[b] == 0)

    @staticmethod
    def num_hit_blocks(hit: list[int]) -> int:
        return len(hit)

    def num_blocks_to_seat(self, hit: list[int], num_tokens: int) -> int:
        """Free blocks a sequence seated with prefix-cache ``hit`` takes to hold its first
        ``num_tokens`` tokens: its new blocks and the hit's blocks no one holds."""
        return blocks_for(num_tokens, self.block_size) - len(hit) + self.num_free_among(hit)

    def share(self, request_id: int, blocks: list[int]) -> None:
        """Start ``request_id``'s block table with cached ``blocks`` (from ``match_prefix``; leading
        ``FREED`` entries: out of the window of the sequence's next query)."""
        assert request_id not in self.block_tables, f"R{request_id} already holds blocks"
        num_freed = blocks.count(FREED)
        assert FREED not in blocks[num_freed:], "a hit freed a block inside the window"
        self._num_freed[request_id] = num_freed
        for block in blocks[num_freed:]:
            assert block in self._hash_of, f"block {block} is not a cached block"
            if self.ref_counts[block] == 0:
                del self._cached_free[block]
                self.window_freed.pop(block, None)
            self.ref_counts[block] += 1
        self.block_tables[request_id] = list(blocks)
        self._num_hashed[request_id] = len(blocks)

    def cache_blocks(self, request_id: int, hashes: list[bytes], num_full_blocks: int) -> None:
        """Register the first ``num_full_blocks`` blocks of ``request_id`` (full and computed) under
        ``hashes`` for later sequences. A duplicate of a hashed block stays unhashed (with
        ``vllm_order``, registered too, after the first)."""
        table = self.block_tables[request_id]
        assert num_full_blocks <= min(len(hashes), len(table)), "caching an unfilled block"
        for i in range(self._num_hashed.get(request_id, 0), num_full_blocks):
            h, block = hashes[i], table[i]
            if block == FREED:
                continue  # left the window before it was registered
            key = h + self._salt
            if key not in self._blocks_of or self.vllm_order:
                self._blocks_of.setdefault(key, {})[block] = None
                self._hash_of[block] = key
        self._num_hashed[request_id] = max(self._num_hashed.get(request_id, 0), num_full_blocks)

    def shared_blocks(self) -> dict[int, list[int]]:
        """Blocks held by two or more sequences: block id -> request ids (refcount = length)."""
        holders: dict[int, list[int]] = {}
        for rid, table in self.block_tables.items():
            for block in table:
                if block != FREED and self.ref_counts[block] > 1:
                    holders.setdefault(block, []).append(rid)
        return holders

    def cached_free_blocks(self) -> list[int]:
        """Free blocks that keep their hash, least recently used (next evicted) first."""
        return list(self._cached_free)

    def check_no_leaks(self, all_tables: list[list[int]] | None = None) -> None:
        """Reference counts match the block tables (``all_tables``: every group's over the pool;
        default this manager's), none negative, and free + used = total (AssertionError otherwise).
        """
        all_tables = list(self.block_tables.values()) if all_tables is None else all_tables
        tables = [[b for b in t if b != FREED] for t in all_tables]
        held = Counter(b for table in tables for b in table)
        free = [*self._free, *self._cached_free]
        assert all(len(set(t)) == len(t) for t in tables), "a block table holds one block twice"
        assert all(held[b] == 0 for b in self.window_freed), "a window-freed block is held"
        assert all(self.ref_counts[b] == held[b] for b in range(self.num_blocks)), (
            f"KV blocks leaked or doubled: reference counts {self.ref_counts} disagree with the "
            f"block tables"
        )
        assert sorted(free) == [b for b in range(self.num_blocks) if held[b] == 0], (
            f"KV blocks leaked or doubled: {len(held)} held + {len(free)} free != {self.num_blocks}"
        )
        assert all(b in self._blocks_of[h] for b, h in self._hash_of.items()), "hash map broken"
        registered = sum(len(blocks) for blocks in self._blocks_of.values())
        assert registered == len(self._hash_of), "hash map broken"
        assert self.vllm_order or registered == len(self._blocks_of), "a hash with two blocks"
        assert all(b in self._hash_of for b in self._cached_free), (
            "a cached free block lost its hash"
        )
