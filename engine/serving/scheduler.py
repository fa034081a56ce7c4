"""Iteration-level scheduler over ``B`` slots with a per-step token budget (Orca, vLLM): a finished
sequence's slot goes to the next waiting request on the same step; a long prompt is prefilled in
chunks (Sarathi). In the paged KV mode it owns the block manager: docs/engines.md."""

from __future__ import annotations

import heapq
import math
from collections import deque

from engine.sequence import Request, Sequence, SequenceStatus
from engine.serving.block_manager import BlockManager
from engine.serving.kv_cache_groups import KVCacheGroups
from engine.serving.planners import ScheduledStep, planner_for


class Scheduler:
    """First-come first-served admission into the lowest free slot, under a token budget.

    ``num_kv_blocks`` (paged KV) makes it own a ``BlockManager`` of that many ``block_size`` blocks
    (a ``KVCacheGroups`` with ``kv_groups``); ``policy`` picks the planner; ``window`` (keys every
    layer sees, None: global) lets out-of-window blocks go.
    """

    def __init__(
        self,
        requests: list[Request],
        num_slots: int,
        eos_token_ids: frozenset[int],
        max_num_batched_tokens: int | None = None,
        policy: str = "decode_first",
        num_kv_blocks: int | None = None,
        block_size: int = 16,
        prefix_caching: bool = False,
        window: int | None = None,
        kv_groups: list[int | None] | None = None,
    ):
        self.num_slots = num_slots
        self.eos_token_ids = eos_token_ids
        self.token_budget = max_num_batched_tokens
        self.planner = planner_for(policy)
        self.block_manager: BlockManager | KVCacheGroups | None = None
        vllm_order = policy == "vllm"
        if num_kv_blocks is not None and kv_groups is not None and len(kv_groups) > 1:
            self.block_manager = KVCacheGroups(
                num_kv_blocks, block_size, kv_groups, prefix_caching, vllm_order
            )
        elif num_kv_blocks is not None:
            self.block_manager = BlockManager(
                num_kv_blocks, block_size, prefix_caching, vllm_order, window
            )
        by_arrival = sorted(requests, key=lambda r: r.arrival_order)
        self.waiting: deque[Sequence] = deque(Sequence(r) for r in by_arrival)
        self.running: dict[int, Sequence] = {}  # slot -> sequence
        self._free_slots = list(range(num_slots))  # min-heap

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def next_arrival_s(self) -> float | None:
        """When the first waiting request arrives (None if nothing waits)."""
        return self.waiting[0].request.arrival_s if self.waiting else None

    def schedule(self, now_s: float = math.inf) -> ScheduledStep:
        """The next step: who runs, how many tokens each, who was preempted for it, and who was
        admitted for it (waiting requests that arrived by ``now_s``, in arrival order, as the
        planner decides)."""
        if self.block_manager is not None:
            for seq in self.running.values():
                self.block_manager.free_out_of_window(seq.request_id, seq.num_cached_tokens)
        step = self.planner.schedule(self, now_s)
        assert len(self.running) <= self.num_slots, "more running sequences than slots"
        assert self.token_budget is None or sum(step.num_new) <= self.token_budget, "over budget"
        return step

    @property
    def prefix_caching(self) -> bool:
        return self.block_manager is not None and self.block_manager.prefix_caching

    # --- what every planner uses ---------------------------------------------------------
    def next_arrived(self, now_s: float) -> Sequence | None:
        """The first waiting sequence, if it arrived by ``now_s`` and a slot is free."""
        if self.waiting and self._free_slots and self.waiting[0].request.arrival_s <= now_s:
            return self.waiting[0]
        return None

    def prefix_hit(self, seq: Sequence) -> list[int]:
        """Cached blocks of ``seq``'s longest cached prefix, leaving its last token to compute."""
        if not self.prefix_caching:
            return [] if self.block_manager is None else self.block_manager.match_prefix([])
        lookup = (seq.num_tokens - 1) // self.block_manager.block_size
        self.block_manager.hash_blocks(seq.block_hashes, seq.num_tokens - 1, seq.token_ids)
        return self.block_manager.match_prefix(seq.block_hashes[:lookup])

    def seat(self, hit: list[int]) -> Sequence:
        """Seat the first waiting sequence in the lowest free slot, sharing its prefix-cache
        blocks ``hit``; return it."""
        seq = self.waiting.popleft()
        blocks = self.block_manager
        if blocks is not None and blocks.num_hit_blocks(hit):
            blocks.share(seq.request_id, hit)
            seq.num_cached_tokens = blocks.num_hit_blocks(hit) * blocks.block_size
            seq.num_prefix_cached_tokens = seq.num_cached_tokens
            self.block_manager.free_out_of_window(seq.request_id, seq.num_cached_tokens)
        seq.slot = heapq.heappop(self._free_slots)
        seq.status = SequenceStatus.RUNNING
        self.running[seq.slot] = seq
        return seq

    def preempt(self, seq: Sequence) -> None:
        """Free ``seq``'s blocks and slot and put it back at the front of the queue, to be
        recomputed later."""
        self.block_manager.free(seq.request_id)
        self._release_slot(seq)
        seq.preempt()
        self.waiting.appendleft(seq)  # newest goes first, so older ones end up ahead of it

    def _release_slot(self, seq: Sequence) -> None:
        del self.running[seq.slot]
        heapq.heappush(self._free_slots, seq.slot)
        self.planner.release(seq)

    # --- after a step ----------------------------------------------------------------------
    def postprocess(self, step: ScheduledStep, next_tokens: list[int]) -> list[Sequence]:
        """Cache the step's tokens; append a token where the step reached a sequence's end (a
        prefill chunk short of it samples nothing). Frees finished sequences' slots and blocks;
        returns them."""
        finished = []
        for seq, n, token in zip(step.seqs, step.num_new, next_tokens, strict=True):
            seq.num_cached_tokens += n
            if self.prefix_caching:
                self.cache_full_blocks(seq)
            if seq.num_pending_tokens > 0:
                continue  # a partial prefill chunk: its logits are not a next token
            if seq.append_token(token, self.eos_token_ids):
                self._release_slot(seq)
                if self.block_manager is not None:
                    self.block_manager.free(seq.request_id)
                finished.append(seq)
        return finished

    def cache_full_blocks(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """Register the blocks ``seq`` filled with keys and values (prompt or output): those of
        its first ``num_tokens`` tokens (default: the computed ones)."""
        num_tokens = seq.num_cached_tokens if num_tokens is None else num_tokens
        num_full = num_tokens // self.block_manager.block_size
        self.block_manager.hash_blocks(seq.block_hashes, num_tokens, seq.token_ids)
        self.block_manager.cache_blocks(seq.request_id, seq.block_hashes, num_full)
