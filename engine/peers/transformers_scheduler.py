"""transformers' own schedule, step by step: a scheduler its manager picks by name, recording it.

``register()`` adds ``RecordingFIFOScheduler`` to ``SCHEDULER_MAPPING`` as ``SCHEDULER_TYPE``; no
method of transformers is patched. What it records and its limits: docs/engines.md, "From the
inside".
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

from engine.peers.vllm_record import ScheduleReplay
from engine.trace import RequestRecord, Trace

SCHEDULER_TYPE = "cbp_recording_fifo"  # the name ``ContinuousBatchingConfig.scheduler_type`` takes
SOURCE = "transformers' own scheduler record (engine.peers.transformers_scheduler)"


@dataclass
class PlannedSeq:
    request_id: str  # transformers' request id
    num_tokens: int  # tokens fed in this step (a prefill chunk, or 1 to decode)
    num_computed: int  # tokens in its KV cache before the step
    num_prompt: int  # its prompt (after a soft reset: prompt and the outputs it recomputes)
    num_generated: int  # tokens generated so far (since the latest soft reset)


@dataclass
class PlannedStep:
    """One forward pass of transformers' manager. Times are ``perf_counter`` seconds."""

    start_s: float  # schedule_batch was called
    end_s: float | None  # the loop came back for the next step (None: it never did)
    seqs: list[PlannedSeq]
    block_tables: dict[str, list[int]]  # every held table, first cache allocator
    preempted: list[str] = field(default_factory=list)  # sent back to waiting since the last step
    finished: list[str] = field(default_factory=list)  # freed since the last step


@dataclass
class ScheduleRecord:
    settings: dict
    steps: list[PlannedStep] = field(default_factory=list)
    record_s: float = 0.0


def register() -> str:
    """Put the recording scheduler into ``SCHEDULER_MAPPING`` (idempotent); returns its name."""
    from transformers.generation.continuous_batching.scheduler import SCHEDULER_MAPPING

    SCHEDULER_MAPPING[SCHEDULER_TYPE] = recording_fifo_scheduler()
    return SCHEDULER_TYPE


@functools.cache
def recording_fifo_scheduler() -> type:
    """``Recording`` mixed in before ``FIFOScheduler``, built on first use so that importing this
    module does not import transformers."""
    from transformers.generation.continuous_batching.scheduler import FIFOScheduler

    doc = "transformers' ``FIFOScheduler``, recording each step (``Recording``)."
    return type("RecordingFIFOScheduler", (Recording, FIFOScheduler), {"__doc__": doc})


class Recording:
    """The recording, mixed in before a transformers ``Scheduler`` class; ``record`` holds what it
    kept since the latest ``reset()``."""

    record: ScheduleRecord

    def reset(self) -> None:
        super().reset()
        self.record = ScheduleRecord(settings=self._settings())
        self._scheduled: set[str] = set()  # request ids scheduled at least once
        self._preempted: list[str] = []  # since the latest step
        self._finished: list[str] = []

    def _allocator(self):
        return next(iter(self.cache.cache_allocators.values()))

    def _settings(self) -> dict:
        import transformers

        allocator, pool = self._allocator(), self.cache.pool
        return {
            "transformers": transformers.__version__,
            "scheduler": _transformers_base(type(self)).__name__,
            "max_requests_per_batch": self.max_requests_per_batch,
            "max_batch_tokens": self.cache.max_batch_tokens,
            "num_blocks": allocator.num_blocks,  # blocks requests can hold
            # block ids run from 0 to this, the first sectors' (trash, never held) included
            "num_block_ids": (pool.num_sectors + pool.num_reserved_sectors)
            * allocator.blocks_per_sector,
            "num_trash_block_ids": pool.num_reserved_sectors * allocator.blocks_per_sector,
            "block_size": allocator.tokens_per_page,
            "prefix_sharing": bool(self.cache.use_prefix_sharing),
        }

    def schedule_batch(self, token_budget: int, cache_budget: int):
        start_s = time.perf_counter()
        result = super().schedule_batch(token_budget, cache_budget)
        t0 = time.perf_counter()
        if result[0]:  # None: the cache is full, the processor offloads and asks again
            self.record.steps.append(self._planned_step(result[0], start_s))
        self.record.record_s += time.perf_counter() - t0
        return result

    def _planned_step(self, planned, start_s: float) -> PlannedStep:
        seqs = [
            PlannedSeq(
                request_id=f.state.request_id,
                num_tokens=f.query_length,
                num_computed=f.state.position_offset,
                num_prompt=len(f.state.initial_tokens),
                num_generated=len(f.state.generated_tokens),
            )
            for f in planned
        ]
        tables = {rid: list(table) for rid, table in self._allocator().block_table.items()}
        step = PlannedStep(start_s, None, seqs, tables, self._preempted, self._finished)
        self._scheduled.update(s.request_id for s in seqs)
        self._preempted, self._finished = [], []
        return step

    def clear_cancelled_requests(self):
        steps = self.record.steps
        if steps and steps[-1].end_s is None:  # the loop is back: the latest step is over
            steps[-1].end_s = time.perf_counter()
        return super().clear_cancelled_requests()

    def finish_request(self, request_id: str) -> None:
        super().finish_request(request_id)
        self._finished.append(request_id)

    def add_waiting_request(self, state) -> None:
        super().add_waiting_request(state)
        if state.request_id in self._scheduled:  # evicted: offload_requests freed, then requeued
            self._preempted.append(state.request_id)
            if state.request_id in self._finished:
                self._finished.remove(state.request_id)


def _transformers_base(cls: type) -> type:
    """The first transformers class in ``cls``'s MRO (``FIFOScheduler``)."""
    return next(c for c in cls.__mro__ if c.__module__.startswith("transformers."))


def schedule_trace(
    record: ScheduleRecord,
    requests: list[RequestRecord],
    ids: dict[str, int],
    t0_s: float,
    name: str = "hf_continuous",
) -> Trace:
    """transformers' steps on ``requests`` as a ``Trace``, times in seconds since ``t0_s``
    (``perf_counter``). ``ids``: transformers' request id -> ours; other requests are skipped."""
    replay = ScheduleReplay(requests)
    prefix_sharing = bool(record.settings.get("prefix_sharing"))
    for planned in record.steps:
        preempted = [ids[h] for h in planned.preempted if h in ids]
        replay.release([ids[h] for h in planned.finished if h in ids], preempted)
        start_s = planned.start_s - t0_s
        end_s = (planned.start_s if planned.end_s is None else planned.end_s) - t0_s
        seqs = [
            _seq(replay, ids[p.request_id], p, start_s, end_s)
            for p in planned.seqs
            if p.request_id in ids
        ]
        if seqs:
            tables = {ids[h]: table for h, table in planned.block_tables.items() if h in ids}
            replay.add_step(start_s, end_s, seqs, preempted, tables, prefix_sharing)
    settings = record.settings
    info = {
        "source": SOURCE,
        "transformers": settings.get("transformers"),
        "scheduler": settings.get("scheduler"),
        "token_budget": settings.get("max_batch_tokens"),
        "prefix_caching": settings.get("prefix_sharing"),
        "async_batching": settings.get("async_batching"),
        "kv_blocks": settings.get("num_block_ids"),  # the block map draws every id
        "kv_blocks_usable": settings.get("num_blocks"),
        "kv_trash_blocks": settings.get("num_trash_block_ids"),
        "kv_reserved_blocks": settings.get("num_trash_block_ids"),  # the block map's name
        "block_size": settings.get("block_size"),
    }
    num_slots = settings.get("max_requests_per_batch") or 0
    return replay.trace(name, num_slots, info, record.record_s)


def _seq(replay: ScheduleReplay, rid: int, planned: PlannedSeq, start_s: float, end_s: float):
    if rid not in replay.lanes:  # new, or requeued after a preemption: an admission
        replay.take_lane(rid)
        replay.admit(rid, planned.num_computed, start_s)
    num_tokens = planned.num_prompt + planned.num_generated  # prompt and outputs so far
    return replay.scheduled(
        rid, planned.num_tokens, planned.num_computed, planned.num_prompt, num_tokens, end_s
    )
