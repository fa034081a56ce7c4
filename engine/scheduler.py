"""Iteration-level scheduler over ``B`` slots with a per-step token budget.

Orca (OSDI '22) and vLLM's ``Scheduler``: every step runs the running sequences; when a sequence
finishes, its slot goes to the next waiting request at once, on that same step, so its prefill rides
in the very next forward pass.

``max_num_batched_tokens`` (the token budget) caps the tokens of one step. With the
``"decode_first"`` policy every decoding sequence gets its one token first and prefills share what
is left; ``"prefill_first"`` serves prefills first (transformers' schedulers offer both). A prompt
that does not fit what is left is prefilled in chunks over several steps (chunked prefill, Sarathi,
OSDI '24); its cached prefix grows chunk by chunk and only its last chunk samples a token.
Plain Python bookkeeping, per sequence, never per token.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from engine.sequence import Request, Sequence, SequenceStatus


class Scheduler:
    """First-come first-served admission into the lowest free slot, under a token budget."""

    def __init__(
        self,
        requests: list[Request],
        num_slots: int,
        eos_token_ids: frozenset[int],
        max_num_batched_tokens: int | None = None,
        policy: str = "decode_first",
    ):
        self.num_slots = num_slots
        self.eos_token_ids = eos_token_ids
        self.token_budget = max_num_batched_tokens
        self.policy = policy
        by_arrival = sorted(requests, key=lambda r: r.arrival_order)
        self.waiting: deque[Sequence] = deque(Sequence(r) for r in by_arrival)
        self.running: dict[int, Sequence] = {}  # slot -> sequence
        self._free_slots = list(range(num_slots))  # min-heap

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def next_arrival_s(self) -> float | None:
        """When the first waiting request arrives (None if nothing waits)."""
        return self.waiting[0].request.arrival_s if self.waiting else None

    def admit(self, now_s: float = math.inf) -> list[Sequence]:
        """Fill free slots with waiting requests that arrived by ``now_s``, in arrival order."""
        admitted = []
        while self.waiting and self._free_slots and self.waiting[0].request.arrival_s <= now_s:
            seq = self.waiting.popleft()
            seq.slot = heapq.heappop(self._free_slots)
            seq.status = SequenceStatus.RUNNING
            self.running[seq.slot] = seq
            admitted.append(seq)
        return admitted

    def schedule(self) -> tuple[list[Sequence], list[int]]:
        """The next step: sequences in slot order (the packed order) and their new-token counts."""
        assert len(self.running) <= self.num_slots, "more running sequences than slots"
        grants = self._grant_tokens()
        seqs = [self.running[slot] for slot in sorted(self.running) if slot in grants]
        num_new = [grants[s.slot] for s in seqs]
        assert self.token_budget is None or sum(num_new) <= self.token_budget, "budget exceeded"
        return seqs, num_new

    def _grant_tokens(self) -> dict[int, int]:
        """Slot -> tokens this step, by policy, within the budget."""
        decodes = [s for s in self.running.values() if not s.is_prefill]
        prefills = sorted(
            (s for s in self.running.values() if s.is_prefill), key=_fcfs
        )  # admission order
        order = decodes + prefills if self.policy == "decode_first" else prefills + decodes
        left = self.token_budget if self.token_budget is not None else math.inf
        grants = {}
        for seq in order:
            n = min(seq.num_pending_tokens, left)
            if n > 0:
                grants[seq.slot] = int(n)
                left -= n
        return grants

    def postprocess(
        self, seqs: list[Sequence], num_new: list[int], next_tokens: list[int]
    ) -> list[Sequence]:
        """Cache the step's tokens; append a token where the step reached the sequence's end.

        A sequence whose prefill chunk did not reach the end of its prompt samples nothing.
        Finished sequences free their slots. Returns the finished sequences.
        """
        finished = []
        for seq, n, token in zip(seqs, num_new, next_tokens, strict=True):
            seq.num_cached_tokens += n
            if seq.num_pending_tokens > 0:
                continue  # a partial prefill chunk: its logits are not a next token
            if seq.append_token(token, self.eos_token_ids):
                del self.running[seq.slot]
                heapq.heappush(self._free_slots, seq.slot)
                finished.append(seq)
        return finished


def _fcfs(seq: Sequence) -> tuple[float, int]:
    return seq.request.arrival_order
