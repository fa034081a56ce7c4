"""The continuous engine: iteration-level scheduling plus packed (ragged) batches.

Each step, nano-vllm style: admit into free slots, pack every running sequence's pending tokens into
one ``[1, T]`` row, run ONE forward pass (prefill fused with decode), append each sequence's greedy
token, and free the slots of finished sequences so the next requests are admitted on the same step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from engine.config import EngineConfig
from engine.model_runner import ModelRunner
from engine.packed_batch import build_packed_batch
from engine.scheduler import Scheduler
from engine.sequence import Request, Sequence
from engine.trace import DECODE, PREFILL, ScheduledSeq, StepRecord, Trace, new_request_records


class ContinuousEngine:
    """Runs requests through ``config.num_slots`` slots, one packed forward pass per step."""

    name = "continuous"

    def __init__(self, runner: ModelRunner, config: EngineConfig):
        self.runner = runner
        self.config = config

    def run(self, requests: list[Request], on_step: Callable | None = None) -> Trace:
        """Run to completion; ``on_step(trace, step)`` is called after every step."""
        trace = None
        for trace, step in self.generate(requests):
            if on_step is not None:
                on_step(trace, step)
        return trace if trace is not None else self._new_trace(requests, None)

    def generate(self, requests: list[Request]) -> Iterator[tuple[Trace, StepRecord]]:
        """Yield ``(trace, step)`` after every step; the trace fills in as the run goes."""
        cache = self.runner.new_kv_cache(
            self.config.kv_mode, self.config.num_slots, self._max_seq_len(requests)
        )
        trace = self._new_trace(requests, cache)
        eos = frozenset() if self.config.ignore_eos else self.runner.eos_token_ids
        cfg = self.config
        scheduler = Scheduler(
            requests, cfg.num_slots, eos, cfg.max_num_batched_tokens, cfg.scheduling_policy
        )
        self.runner.synchronize()
        t0 = time.perf_counter()
        while scheduler.has_work():
            if not scheduler.running:  # idle until the next request arrives
                _sleep_until(t0, scheduler.next_arrival_s())
                now_s = time.perf_counter() - t0
                self._record_admitted(trace, scheduler.admit(now_s), now_s)
                continue
            start_s = time.perf_counter() - t0
            seqs, num_new = scheduler.schedule()
            batch = build_packed_batch(
                seqs, num_new, cache, self.config.num_slots, self.runner.device
            )
            record = _step_record(len(trace.steps), start_s, batch)
            forward_start = time.perf_counter()
            next_tokens = self.runner.forward_packed(batch)
            record.forward_s = time.perf_counter() - forward_start
            finished = scheduler.postprocess(seqs, num_new, next_tokens)
            for seq in finished:
                cache.release(seq.request_id)
            record.end_s = time.perf_counter() - t0
            admitted = scheduler.admit(record.end_s)
            self._record_tokens(trace, seqs, finished, record.end_s)
            self._record_admitted(trace, admitted, record.end_s)
            trace.steps.append(record)
            trace.wall_s = record.end_s
            yield trace, record

    def _new_trace(self, requests: list[Request], cache) -> Trace:
        info = {}
        if cache is not None:
            info = {"kv_bytes_per_token": cache.bytes_per_token, "kv_bytes": cache.total_bytes}
        return Trace(
            engine=self.name,
            num_slots=self.config.num_slots,
            requests=new_request_records(requests),
            kv_mode=self.config.kv_mode,
            info=info,
        )

    def _max_seq_len(self, requests: list[Request]) -> int:
        if self.config.max_seq_len is not None:
            return self.config.max_seq_len
        return max((r.num_prompt_tokens + r.max_new_tokens for r in requests), default=1)

    @staticmethod
    def _record_admitted(trace: Trace, admitted: list[Sequence], now_s: float) -> None:
        for seq in admitted:
            rec = trace.request(seq.request_id)
            rec.slot, rec.admit_s = seq.slot, now_s

    def _record_tokens(self, trace: Trace, seqs: list[Sequence], finished, now_s: float) -> None:
        for seq in seqs:
            rec = trace.request(seq.request_id)
            if rec.first_token_s is None and seq.output_token_ids:
                rec.first_token_s = now_s
        for seq in finished:
            rec = trace.request(seq.request_id)
            rec.finish_s = now_s
            rec.output_token_ids = list(seq.output_token_ids)
            rec.output_text = self.runner.decode(seq.output_token_ids)
            rec.finish_reason = seq.finish_reason


def _sleep_until(t0: float, at_s: float | None) -> None:
    """Wait (really: the clock is wall time) until ``at_s`` seconds after ``t0``."""
    if at_s is not None:
        time.sleep(max(0.0, at_s - (time.perf_counter() - t0)))


def _step_record(index: int, start_s: float, batch) -> StepRecord:
    seqs = [
        ScheduledSeq(
            request_id=seq.request_id,
            slot=seq.slot,
            kind=PREFILL if cached < seq.request.num_prompt_tokens else DECODE,
            num_new_tokens=new,
            num_cached_tokens=cached,
        )
        for seq, cached, new in zip(batch.seqs, batch.num_cached, batch.num_new, strict=True)
    ]
    return StepRecord(index=index, start_s=start_s, end_s=start_s, seqs=seqs)
