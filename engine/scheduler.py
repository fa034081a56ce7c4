"""Iteration-level scheduler over ``B`` slots with a per-step token budget.

Orca (OSDI '22) and vLLM's ``Scheduler``: every step runs the running sequences; when a sequence
finishes, its slot goes to the next waiting request at once, on that same step, so its prefill rides
in the very next forward pass.

``max_num_batched_tokens`` (the token budget) caps the tokens of one step. With the
``"decode_first"`` policy every decoding sequence gets its one token first and prefills share what
is left; ``"prefill_first"`` serves prefills first (transformers' schedulers offer both). A prompt
that does not fit what is left is prefilled in chunks over several steps (chunked prefill, Sarathi,
OSDI '24); its cached prefix grows chunk by chunk and only its last chunk samples a token.

With a paged KV cache (``block_manager``), every scheduled sequence first gets the blocks its new
tokens need. When the pool runs dry, the newest running sequence is preempted (vLLM V1's
``Scheduler.schedule``): its blocks are freed and it goes back to the front of the queue, to be
recomputed later. A waiting request is admitted only when its first step's blocks are free beyond
what the running sequences need for their next tokens, so admission does not cause preemption.
Plain Python bookkeeping, per sequence, never per token.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

from engine.block_manager import BlockManager, blocks_for
from engine.sequence import Request, Sequence, SequenceStatus


@dataclass
class ScheduledStep:
    """One step's plan: ``seqs`` in slot order (the packed order), ``num_new[i]`` tokens each,
    and the sequences preempted to make room for it."""

    seqs: list[Sequence]
    num_new: list[int]
    preempted: list[Sequence] = field(default_factory=list)


class Scheduler:
    """First-come first-served admission into the lowest free slot, under a token budget."""

    def __init__(
        self,
        requests: list[Request],
        num_slots: int,
        eos_token_ids: frozenset[int],
        max_num_batched_tokens: int | None = None,
        policy: str = "decode_first",
        block_manager: BlockManager | None = None,
    ):
        self.num_slots = num_slots
        self.eos_token_ids = eos_token_ids
        self.token_budget = max_num_batched_tokens
        self.policy = policy
        self.blocks = block_manager
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
            if not self._blocks_to_admit(self.waiting[0]):
                break
            seq = self.waiting.popleft()
            seq.slot = heapq.heappop(self._free_slots)
            seq.status = SequenceStatus.RUNNING
            self.running[seq.slot] = seq
            admitted.append(seq)
        return admitted

    def schedule(self) -> ScheduledStep:
        """The next step: who runs, how many tokens each, and who was preempted for it."""
        assert len(self.running) <= self.num_slots, "more running sequences than slots"
        grants = self._grant_tokens()
        preempted = self._allocate_blocks(grants) if self.blocks is not None else []
        seqs = [self.running[slot] for slot in sorted(self.running) if slot in grants]
        num_new = [grants[s.slot] for s in seqs]
        assert self.token_budget is None or sum(num_new) <= self.token_budget, "budget exceeded"
        return ScheduledStep(seqs, num_new, preempted)

    def _blocks_to_admit(self, seq: Sequence) -> bool:
        """Whether ``seq``'s first step fits in the free blocks the running sequences leave."""
        if self.blocks is None:
            return True
        first_step = min(seq.num_pending_tokens, self.token_budget or math.inf)
        reserved = sum(
            self.blocks.num_missing_blocks(s.request_id, s.num_tokens)
            for s in self.running.values()
        )
        needed = blocks_for(seq.num_cached_tokens + first_step, self.blocks.block_size)
        return needed + reserved <= self.blocks.num_free_blocks

    def _allocate_blocks(self, grants: dict[int, int]) -> list[Sequence]:
        """Give each granted sequence, oldest first, the blocks for its new tokens.

        When blocks run out, preempt the newest running sequence (possibly the one asking) and
        drop its grant. Returns the preempted sequences.
        """
        preempted = []
        for seq in sorted((self.running[slot] for slot in grants), key=_fcfs):
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            need = seq.num_cached_tokens + grants[seq.slot]
            while not self.blocks.allocate(seq.request_id, need):
                victim = max(self.running.values(), key=_fcfs)
                grants.pop(victim.slot, None)
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
        return preempted

    def _preempt(self, seq: Sequence) -> None:
        self.blocks.free(seq.request_id)
        self._release_slot(seq)
        seq.preempt()
        self.waiting.appendleft(seq)  # newest goes first, so older ones end up ahead of it

    def _release_slot(self, seq: Sequence) -> None:
        del self.running[seq.slot]
        heapq.heappush(self._free_slots, seq.slot)

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

    def postprocess(self, step: ScheduledStep, next_tokens: list[int]) -> list[Sequence]:
        """Cache the step's tokens; append a token where the step reached the sequence's end.

        A sequence whose prefill chunk did not reach the end of its prompt samples nothing.
        Finished sequences free their slots and KV blocks. Returns the finished sequences.
        """
        finished = []
        for seq, n, token in zip(step.seqs, step.num_new, next_tokens, strict=True):
            seq.num_cached_tokens += n
            if seq.num_pending_tokens > 0:
                continue  # a partial prefill chunk: its logits are not a next token
            if seq.append_token(token, self.eos_token_ids):
                self._release_slot(seq)
                if self.blocks is not None:
                    self.blocks.free(seq.request_id)
                finished.append(seq)
        return finished


def _fcfs(seq: Sequence) -> tuple[float, int]:
    return seq.request.arrival_order
