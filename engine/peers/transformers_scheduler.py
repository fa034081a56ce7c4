"""transformers' own schedule, step by step: a scheduler its manager picks by name, recording it.

transformers' continuous batching (``transformers/generation/continuous_batching/``) builds its
scheduler in ``ContinuousBatchingManager._create_batch_processor`` (``continuous_api.py``) as
``SCHEDULER_MAPPING[continuous_batching_config.scheduler_type]`` (``scheduler.py``; the config's
comment: "For all types available, checks SCHEDULER_MAPPING"). ``register()`` adds
``RecordingFIFOScheduler`` to that mapping as ``SCHEDULER_TYPE``, and
``engine.peers.transformers_engine.run_batch`` asks for it by that name: transformers itself
constructs it, in our process, on the manager's generation thread. No method of transformers is
patched.

``RecordingFIFOScheduler`` is transformers' default ``FIFOScheduler`` (decoding requests first,
then split prefills, then waiting ones), unchanged: each override calls the base method and only
reads what it returned or the cache's block tables. It keeps one ``PlannedStep`` per forward pass
(``ScheduleRecord.steps``), following the processor's loop
(``ContinuousBatchProcessor.prepare_next_batch``, then the forward, then ``update_batch``):

* **start**: when ``schedule_batch`` is called (``perf_counter``);
* **plan**: what it returned, one ``FutureRequestState`` per request in batch order: the tokens it
  feeds (``query_length``: a prefill chunk, or 1 to decode), the tokens already in its KV cache
  (``state.position_offset``, which the batch's tensors advance only after scheduling; at a first
  admission with block sharing, its prefix match), its prompt and generated lengths;
* **blocks**: every held block table (request id -> block ids) of the first cache allocator (the
  only one for a model with full attention only: block ids of transformers' paged cache), read
  after ``schedule_batch`` allocated this step's blocks;
* **end**: when the loop next calls ``clear_cancelled_requests`` (the first scheduler call of every
  ``prepare_next_batch``): the forward pass, the sampling and ``update_batch`` are inside;
* **preempted**: requests sent back to waiting (``add_waiting_request`` again) after being
  scheduled: transformers' ``OffloadingManager.offload_requests`` calls ``finish_request`` then
  ``add_waiting_request`` on a request it evicts when blocks run out (a soft reset: recomputed
  from its prompt and outputs, unless a CPU swap space is set); **finished**: requests
  ``finish_request`` freed and did not requeue. Both are listed in the next step's record.

A ``schedule_batch`` that returns None (the cache is full: the processor offloads and asks again)
or an empty list (nothing to run) is no step: the processor runs no forward pass after it.

With ``use_async_batching`` (transformers turns it on with CUDA graphs when no attention mask is
needed, never on CPU) the next batch is scheduled before this one's outputs are back, so the end
is when the next batch's preparation starts, and a finished request's last plan may be one step
late; ``info["async_batching"]`` says which.

``schedule_trace`` turns the record into a ``Trace`` like ``engine.peers.vllm_record``'s: one
``StepRecord`` per forward pass, lanes, block tables, shared blocks, preemptions.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass, field

from engine.trace import DECODE, PREFILL, RequestRecord, ScheduledSeq, StepRecord, Trace

SCHEDULER_TYPE = "cbp_recording_fifo"  # the name ``ContinuousBatchingConfig.scheduler_type`` takes
SOURCE = "transformers' own scheduler record (engine.peers.transformers_scheduler)"


@dataclass
class PlannedSeq:
    """One request's share of a step, as transformers' scheduler planned it."""

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
    """Everything ``RecordingFIFOScheduler`` kept: the settings the plans depend on, the steps,
    and the time recording took (s)."""

    settings: dict
    steps: list[PlannedStep] = field(default_factory=list)
    record_s: float = 0.0


def register() -> str:
    """Put the recording scheduler into transformers' ``SCHEDULER_MAPPING`` (again: idempotent);
    returns ``SCHEDULER_TYPE``, the name to give ``ContinuousBatchingConfig.scheduler_type``."""
    from transformers.generation.continuous_batching.scheduler import SCHEDULER_MAPPING

    SCHEDULER_MAPPING[SCHEDULER_TYPE] = recording_fifo_scheduler()
    return SCHEDULER_TYPE


@functools.cache
def recording_fifo_scheduler() -> type:
    """``RecordingFIFOScheduler``: ``Recording`` mixed in before transformers' ``FIFOScheduler``
    (built on first use, so importing this module does not import transformers)."""
    from transformers.generation.continuous_batching.scheduler import FIFOScheduler

    doc = "transformers' ``FIFOScheduler``, recording each step (``Recording``)."
    return type("RecordingFIFOScheduler", (Recording, FIFOScheduler), {"__doc__": doc})


class Recording:
    """The recording, mixed in before a transformers ``Scheduler`` class; ``record`` is what it
    kept since the latest ``reset()`` (the processor resets it when its generation loop starts).
    Every override calls the base method first and changes nothing it returns."""

    record: ScheduleRecord

    def reset(self) -> None:
        super().reset()
        self.record = ScheduleRecord(settings=self._settings())
        self._scheduled: set[str] = set()  # request ids scheduled at least once
        self._preempted: list[str] = []  # since the latest step
        self._finished: list[str] = []

    def _allocator(self):
        """The first cache allocator (a model with full attention only has one)."""
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
        """One step's record from the ``FutureRequestState`` list ``schedule_batch`` returned."""
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
    (``perf_counter``).

    ``ids``: transformers' request id -> ours; other requests' plans are skipped. ``requests``:
    the engine trace's records; outputs are copied from them, the times are the record's:
    admitted at the start of the first step that schedules a request, first token at the end of
    the step that completes its prompt, finished at the end of its last step. A request takes the
    first free lane when it is scheduled (new or requeued) and leaves it when transformers
    preempts it or frees it, as a slot would be taken and freed.
    """
    replay = _Replay(requests, ids, t0_s, bool(record.settings.get("prefix_sharing")))
    for step in record.steps:
        replay.step(step)
    return replay.trace(name, record)


class _Replay:
    """Lanes and request facts, followed step by step."""

    def __init__(self, requests, ids: dict[str, int], t0_s: float, prefix_sharing: bool):
        self.ids, self.t0_s, self.prefix_sharing = ids, t0_s, prefix_sharing
        self.requests = {r.request_id: dataclasses.replace(r, token_times_s=[]) for r in requests}
        for rec in self.requests.values():
            rec.slot = rec.admit_s = rec.first_token_s = rec.finish_s = None
            rec.num_preemptions, rec.num_cached_tokens = 0, 0
        self.steps: list[StepRecord] = []
        self.lanes: dict[int, int] = {}  # our request id -> lane, while transformers runs it
        self.hits: dict[int, int] = {}  # our request id -> tokens cached at its latest admission

    def _ours(self, hf_ids: list[str]) -> list[int]:
        return [self.ids[h] for h in hf_ids if h in self.ids]

    def step(self, planned: PlannedStep) -> None:
        preempted = self._ours(planned.preempted)
        for rid in [*self._ours(planned.finished), *preempted]:
            self.lanes.pop(rid, None)
        for rid in preempted:
            self.requests[rid].num_preemptions += 1
        start_s = planned.start_s - self.t0_s
        end_s = (planned.start_s if planned.end_s is None else planned.end_s) - self.t0_s
        seqs = [self._seq(p, start_s, end_s) for p in planned.seqs if p.request_id in self.ids]
        if not seqs:
            return
        step = StepRecord(len(self.steps), start_s, end_s, seqs, preempted=preempted)
        step.block_tables = {
            self.ids[h]: list(table) for h, table in planned.block_tables.items() if h in self.ids
        }
        step.kv_blocks_used = len({b for table in step.block_tables.values() for b in table})
        if self.prefix_sharing:
            holders = step.block_holders()
            step.shared_blocks = {b: rids for b, rids in holders.items() if len(rids) > 1}
        self.steps.append(step)

    def _seq(self, planned: PlannedSeq, start_s: float, end_s: float) -> ScheduledSeq:
        rid = self.ids[planned.request_id]
        rec, computed = self.requests[rid], planned.num_computed
        if rid not in self.lanes:  # new, or requeued after a preemption: an admission
            self.lanes[rid] = min(set(range(len(self.lanes) + 1)) - set(self.lanes.values()))
            self.hits[rid] = computed
            if rec.admit_s is None:
                rec.admit_s, rec.num_cached_tokens = start_s, computed
        rec.slot = self.lanes[rid] if rec.slot is None else rec.slot
        if rec.first_token_s is None and computed + planned.num_tokens >= planned.num_prompt:
            rec.first_token_s = end_s
        rec.finish_s = end_s
        num_tokens = planned.num_prompt + planned.num_generated  # prompt and outputs so far
        prefill = computed < max(planned.num_prompt, num_tokens - 1)  # as Sequence.is_prefill
        return ScheduledSeq(
            request_id=rid,
            slot=self.lanes[rid],
            kind=PREFILL if prefill else DECODE,
            num_new_tokens=planned.num_tokens,
            num_cached_tokens=computed,
            num_prefix_cached_tokens=self.hits[rid],
        )

    def trace(self, name: str, record: ScheduleRecord) -> Trace:
        settings = record.settings
        num_lanes = 1 + max((s.slot for step in self.steps for s in step.seqs), default=-1)
        step_s = sum(s.duration_s for s in self.steps)
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
            "record_s": record.record_s,
            "record_cost_pct": 100 * record.record_s / step_s if step_s else None,
        }
        return Trace(
            engine=name,
            num_slots=max(settings.get("max_requests_per_batch") or 0, num_lanes),
            steps=self.steps,
            requests=[self.requests[rid] for rid in sorted(self.requests)],
            wall_s=max((s.end_s for s in self.steps), default=0.0),
            kv_mode="paged",
            info=info,
        )
