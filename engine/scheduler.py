"""Iteration-level scheduler over ``B`` slots (Orca, OSDI '22; vLLM's ``Scheduler``).

Every step runs all running sequences. When a sequence finishes, its slot is handed to the next
waiting request at once, on that same step, so its prefill rides in the very next forward pass.
Plain Python bookkeeping, per sequence, never per token.
"""

from __future__ import annotations

import heapq
from collections import deque

from engine.sequence import Request, Sequence, SequenceStatus


class Scheduler:
    """First-come first-served admission into the lowest free slot."""

    def __init__(self, requests: list[Request], num_slots: int, eos_token_ids: frozenset[int]):
        self.num_slots = num_slots
        self.eos_token_ids = eos_token_ids
        self.waiting: deque[Sequence] = deque(Sequence(r) for r in requests)
        self.running: dict[int, Sequence] = {}  # slot -> sequence
        self._free_slots = list(range(num_slots))  # min-heap

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def admit(self) -> list[Sequence]:
        """Fill free slots from the waiting queue; return the sequences admitted."""
        admitted = []
        while self.waiting and self._free_slots:
            seq = self.waiting.popleft()
            seq.slot = heapq.heappop(self._free_slots)
            seq.status = SequenceStatus.RUNNING
            self.running[seq.slot] = seq
            admitted.append(seq)
        return admitted

    def schedule(self) -> list[Sequence]:
        """The sequences of the next step, in slot order (that is the packed order)."""
        assert len(self.running) <= self.num_slots, "more running sequences than slots"
        return [self.running[slot] for slot in sorted(self.running)]

    def postprocess(self, seqs: list[Sequence], next_tokens: list[int]) -> list[Sequence]:
        """Mark the step's tokens cached, append each new token; free finished sequences' slots."""
        finished = []
        for seq, token in zip(seqs, next_tokens, strict=True):
            seq.num_cached_tokens = seq.num_tokens
            if seq.append_token(token, self.eos_token_ids):
                del self.running[seq.slot]
                heapq.heappush(self._free_slots, seq.slot)
                finished.append(seq)
        return finished
