"""Planners: the scheduler's policies, one class each, behind one interface.

A planner's ``schedule(scheduler, now_s)`` plans the next step of its ``Scheduler``
(``engine.serving.scheduler``, which holds the queues, slots and block manager): it seats the
waiting requests that arrived by ``now_s`` and fit, and returns who runs, how many tokens each,
who was preempted and who was admitted. ``release(seq)`` is told when a sequence leaves the
running set. ``SchedulerState`` names what a planner may use of the scheduler (which imports this
module, so it is not imported here).

* ``"decode_first"`` and ``"prefill_first"`` (transformers' schedulers offer both): seat every
  arrival whose first step fits the blocks the running sequences leave free, then give every
  decode its one token and the prefills what is left, oldest first, or the prefills first; the
  newest running sequence is preempted, and blocks enter the prefix cache once computed.
* ``"vllm"`` plans each step as vLLM V1's ``Scheduler.schedule`` (vLLM 0.32,
  ``vllm/v1/core/sched/scheduler.py``), so that our steps can equal vLLM's own record step for
  step (``engine.peers.schedule_comparison``): the running requests first, in vLLM's running
  order (admission order, a resumed request last), then waiting ones only while budget is left,
  each needing blocks for its whole prompt (``scheduler_reserve_full_isl``); the last running
  request is preempted, and nobody is admitted after a preemption; blocks enter the prefix cache
  when allocated (``allocate_slots``), not once computed, which is exact because each layer
  stores the whole step's keys before any attention reads them. docs/engines.md ("The `vllm`
  policy") says more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from engine.sequence import Sequence, SequenceStatus
from engine.serving.block_manager import BlockManager


@dataclass
class ScheduledStep:
    """One step's plan: ``seqs`` in slot order (the packed order), ``num_new[i]`` tokens each,
    the sequences preempted to make room for it and those admitted (seated) for it."""

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
    """First come, first served: a sequence's place in arrival order (admission order too)."""
    return seq.request.arrival_order


def budget_of(scheduler: SchedulerState) -> float:
    """The scheduler's token budget per step (``math.inf`` without one)."""
    return scheduler.token_budget if scheduler.token_budget is not None else math.inf


class Planner:
    """The interface: ``schedule`` and ``release``; see the module docstring."""

    def schedule(self, scheduler: SchedulerState, now_s: float) -> ScheduledStep:
        """Plan the next step, admitting the waiting requests that arrived by ``now_s``."""
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
        """Slot -> tokens this step, by policy, within the budget."""
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
        """Whether ``seq``'s first step fits in the free blocks the running sequences leave.

        ``hit``: its prefix-cache blocks; those no one holds leave the free pool when shared.
        """
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
        """Give each granted sequence, oldest first, the blocks for its new tokens.

        When blocks run out, preempt the newest running sequence (possibly the one asking) and
        drop its grant. Returns the preempted sequences.
        """
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
    """``"prefill_first"``: prefills, oldest first, get the budget before the decodes."""

    prefills_first = True


class VllmPlanner(Planner):
    """``"vllm"``: vLLM V1's ``Scheduler.schedule`` (see the module docstring)."""

    def __init__(self) -> None:
        self.order: list[Sequence] = []  # vLLM's running order

    def release(self, seq: Sequence) -> None:
        self.order.remove(seq)

    def schedule(self, scheduler: SchedulerState, now_s: float) -> ScheduledStep:
        """First the running requests in vLLM's order while budget is left (the ``while
        req_index < len(self.running) and token_budget > 0`` loop), each with its blocks; then,
        unless that preempted someone, the waiting requests that arrived by ``now_s``."""
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
        """Blocks for ``seq``'s next ``n`` tokens, preempting the last running request until
        they fit (``allocate_slots`` in ``schedule``'s retry loop); False when ``seq`` itself
        was preempted. New blocks are registered in the prefix cache at once."""
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
        """Admit the first waiting request if it arrived, a slot is free and blocks for its
        whole prompt (its tokens so far) are free beyond its prefix-cache hit, with blocks for
        its first ``min(pending, left)`` tokens; None otherwise (admission ends for the step)."""
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
    """A new planner for ``policy`` (one of ``engine.config.POLICIES``)."""
    return PLANNERS[policy]()
