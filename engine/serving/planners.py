"""Planners: the scheduler's policies, one class each, behind ``schedule(scheduler, now_s)`` and
``release(seq)``. ``decode_first`` and ``prefill_first`` are transformers' orders; ``vllm`` follows
vLLM V1's ``Scheduler.schedule`` (docs/engines.md, "The `vllm` policy")."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from engine.sequence import Sequence, SequenceStatus
from engine.serving.block_manager import BlockManager


@dataclass
class ScheduledStep:
    """One step's plan: ``seqs`` in slot (packed) order, ``num_new[i]`` tokens each, and the
    sequences preempted and admitted for it."""

    seqs: list[Sequence]
    num_new: list[int]
    preempted: list[Sequence] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)


class SchedulerState(Protocol):
    """What a planner reads and calls on its ``engine.serving.scheduler.Scheduler``."""

    token_budget: int | None
    block_manager: BlockManager | None  # or a KVCacheGroups, which answers the same calls
    running: dict[int, Sequence]  # slot -> sequence
    prefix_caching: bool

    def next_arrived(self, now_s: float) -> Sequence | None: ...
    def prefix_hit(self, seq: Sequence) -> list[int]: ...
    def seat(self, hit: list[int]) -> Sequence: ...
    def preempt(self, seq: Sequence) -> None: ...
    def cache_full_blocks(self, seq: Sequence, num_tokens: int | None = None) -> None: ...


def fcfs(seq: Sequence) -> int:
    return seq.request.arrival_order


def budget_of(scheduler: SchedulerState) -> float:
    return scheduler.token_budget if scheduler.token_budget is not None else math.inf


class Planner:
    def schedule(self, scheduler: SchedulerState, now_s: float) -> ScheduledStep:
        raise NotImplementedError

    def release(self, seq: Sequence) -> None:
        """``seq`` left the running set (finished or preempted)."""


class _BudgetPlanner(Planner):
    """Seat every arrival whose first step fits, then share the budget in ``order``."""

    prefills_first = False

    def schedule(self, scheduler: SchedulerState, now_s: float) -> ScheduledStep:
        admitted = []
        while (seq := scheduler.next_arrived(now_s)) is not None:
            hit = scheduler.prefix_hit(seq)
            if not self._blocks_to_admit(scheduler, seq, hit):
                break
            admitted.append(scheduler.seat(hit))
        grants = self._grant_tokens(scheduler)
        preempted = []
        if scheduler.block_manager is not None:
            preempted = self._allocate_blocks(scheduler, grants)
        seqs = [scheduler.running[slot] for slot in sorted(scheduler.running) if slot in grants]
        return ScheduledStep(seqs, [grants[s.slot] for s in seqs], preempted, admitted)

    def _grant_tokens(self, scheduler: SchedulerState) -> dict[int, int]:
        running = scheduler.running.values()
        decodes = [s for s in running if not s.is_prefill]
        prefills = sorted((s for s in running if s.is_prefill), key=fcfs)  # admission order
        order = prefills + decodes if self.prefills_first else decodes + prefills
        left = budget_of(scheduler)
        grants = {}
        for seq in order:
            n = min(seq.num_pending_tokens, left)
            if n > 0:
                grants[seq.slot] = int(n)
                left -= n
        return grants

    @staticmethod
    def _blocks_to_admit(scheduler: SchedulerState, seq: Sequence, hit: list[int]) -> bool:
        """Whether ``seq``'s first step fits in the blocks the running sequences leave; ``hit``: its
        prefix-cache blocks (those no one holds leave the free pool when shared)."""
        blocks = scheduler.block_manager
        if blocks is None:
            return True
        cached = blocks.num_hit_blocks(hit) * blocks.block_size
        first_step = min(seq.num_tokens - cached, scheduler.token_budget or math.inf)
        reserved = sum(
            blocks.num_missing_blocks(s.request_id, s.num_tokens)
            for s in scheduler.running.values()
        )
        needed = blocks.num_blocks_to_seat(hit, cached + first_step)
        return needed + reserved <= blocks.num_free_blocks

    @staticmethod
    def _allocate_blocks(scheduler: SchedulerState, grants: dict[int, int]) -> list[Sequence]:
        """Blocks for each grant, oldest first; when they run out, the newest running sequence is
        preempted (maybe the asker). Returns the preempted."""
        preempted = []
        for seq in sorted((scheduler.running[slot] for slot in grants), key=fcfs):
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            need = seq.num_cached_tokens + grants[seq.slot]
            while not scheduler.block_manager.allocate(seq.request_id, need):
                victim = max(scheduler.running.values(), key=fcfs)
                grants.pop(victim.slot, None)
                scheduler.preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
        return preempted


class DecodeFirstPlanner(_BudgetPlanner):
    """``"decode_first"``: every decoding sequence gets its token first."""


class PrefillFirstPlanner(_BudgetPlanner):
    prefills_first = True


class VllmPlanner(Planner):
    def __init__(self) -> None:
        self.order: list[Sequence] = []  # vLLM's running order

    def release(self, seq: Sequence) -> None:
        self.order.remove(seq)

    def schedule(self, scheduler: SchedulerState, now_s: float) -> ScheduledStep:
        """Running requests in vLLM's order while budget is left, then, unless that preempted
        someone, the waiting ones that arrived by ``now_s``."""
        left = budget_of(scheduler)
        grants: dict[int, int] = {}  # slot -> tokens
        preempted: list[Sequence] = []
        for seq in list(self.order):
            if left <= 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted in this loop
            n = min(seq.num_pending_tokens, left)
            if not self._allocate(scheduler, seq, n, preempted):
                break
            grants[seq.slot] = n
            left -= n
        admitted = []
        while not preempted and left > 0 and (seq := self._admit_next(scheduler, now_s, left)):
            grants[seq.slot] = n = min(seq.num_pending_tokens, left)
            left -= n
            admitted.append(seq)
        seqs = [scheduler.running[slot] for slot in sorted(grants)]
        return ScheduledStep(seqs, [grants[s.slot] for s in seqs], preempted, admitted)

    def _allocate(
        self, scheduler: SchedulerState, seq: Sequence, n: int, preempted: list[Sequence]
    ) -> bool:
        """Blocks for ``seq``'s next ``n`` tokens, preempting the last running request until they
        fit (``allocate_slots``'s retry loop); False when ``seq`` itself was preempted."""
        blocks = scheduler.block_manager
        if blocks is None:
            return True
        while not blocks.allocate(seq.request_id, seq.num_cached_tokens + n):
            victim = self.order[-1]
            scheduler.preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return False
        if scheduler.prefix_caching:
            scheduler.cache_full_blocks(seq, seq.num_cached_tokens + n)
        return True

    def _admit_next(self, scheduler: SchedulerState, now_s: float, left: float) -> Sequence | None:
        """The first waiting request, admitted if it arrived, a slot is free and its whole prompt's
        blocks fit beyond its prefix-cache hit; None ends admission for the step."""
        seq = scheduler.next_arrived(now_s)
        if seq is None:
            return None
        blocks = scheduler.block_manager
        hit = scheduler.prefix_hit(seq)
        if blocks is not None:
            if blocks.num_blocks_to_seat(hit, seq.num_tokens) > blocks.num_free_blocks:
                return None
        scheduler.seat(hit)
        self.order.append(seq)
        fits = self._allocate(scheduler, seq, min(seq.num_pending_tokens, left), [])
        assert fits, "an admitted request's first blocks did not fit"
        return seq


PLANNERS = {
    "decode_first": DecodeFirstPlanner,
    "prefill_first": PrefillFirstPlanner,
    "vllm": VllmPlanner,
}


def planner_for(policy: str) -> Planner:
    return PLANNERS[policy]()
