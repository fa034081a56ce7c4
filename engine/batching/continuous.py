"""The continuous engine: iteration-level scheduling plus packed (ragged) batches. Each step,
nano-vllm style: one forward pass over every running sequence's pending tokens in one ``[1, T]``
row, then finished slots freed and new requests admitted for the next step."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from types import MappingProxyType

from engine.batching.wave import forward_recorded
from engine.config import EngineConfig
from engine.model.model_runner import ModelRunner
from engine.sequence import Request, Sequence
from engine.serving.block_manager import BlockManager, blocks_for
from engine.serving.kv_cache import KVCache
from engine.serving.kv_cache_groups import KVCacheGroups
from engine.serving.packed_batch import build_packed_batch
from engine.serving.run_control import wait_until
from engine.serving.sampler import RequestSampler, new_samplers
from engine.serving.scheduler import ScheduledStep, Scheduler
from engine.token_logits import LogitRecorder, TokenLogits
from engine.trace import DECODE, PREFILL, ScheduledSeq, StepRecord, Trace, new_request_records
from engine.workloads.workload import request_label


class ContinuousEngine:
    name = "continuous"

    def __init__(self, runner: ModelRunner, config: EngineConfig):
        """Raises ValueError: batch-invariant mode for a model it does not support."""
        self.runner = runner
        self.config = config
        if config.batch_invariant:
            runner.require_batch_invariant()

    def run(
        self,
        requests: list[Request],
        on_step: Callable | None = None,
        on_wait: Callable[[Trace], None] | None = None,
    ) -> Trace:
        """``generate`` to completion, ``on_step(trace, step)`` after every step; raises as it does,
        and whatever ``on_step`` raises."""
        trace = None
        for trace, step in self.generate(requests, on_wait):
            if on_step is not None:
                on_step(trace, step)
        return trace if trace is not None else self._new_trace(requests, None, None)

    def generate(
        self, requests: list[Request], on_wait: Callable[[Trace], None] | None = None
    ) -> Iterator[tuple[Trace, StepRecord]]:
        """Yield ``(trace, step)`` after every step; idle before an arrival, sleep in
        ``WAIT_SLICE_S`` slices calling ``on_wait(trace)``. Raises ValueError: paged KV too small
        for some request."""
        cfg = self.config
        scheduler = self._new_scheduler(requests)
        blocks = scheduler.block_manager  # the scheduler's, in paged mode; else None
        cache = self._new_kv_cache(requests, blocks)
        trace = self._new_trace(requests, cache, blocks)
        waiting = None if on_wait is None else functools.partial(on_wait, trace)
        invariant, recorder = cfg.batch_invariant, LogitRecorder()
        samplers = new_samplers(requests)  # kept across preemptions with their draw counts
        self.runner.synchronize()
        t0 = time.perf_counter()
        plan = ScheduledStep([], [])
        while scheduler.has_work():
            if not plan.seqs:  # idle until the next request arrives
                assert not scheduler.running, "sequences run, yet the step plans none"
                wake_s = scheduler.next_arrival_s()
                assert wake_s is not None, "nothing runs or waits, yet the scheduler has work"
                wait_until(t0, wake_s, waiting)
                now_s = time.perf_counter() - t0
                plan = scheduler.schedule(now_s)
                self._record_admitted(trace, plan.admitted, now_s)
                continue
            start_s = time.perf_counter() - t0
            batch = build_packed_batch(
                plan.seqs, plan.num_new, cache, cfg.num_slots, self.runner.device, invariant
            )
            record = _step_record(len(trace.steps), start_s, batch, plan, blocks)
            forward_start = time.perf_counter()
            recorder.skip_rows = _partial_chunks(plan)
            step_samplers = _step_samplers(plan, samplers)
            next_tokens = forward_recorded(self.runner, batch, step_samplers, recorder)
            record.forward_s = time.perf_counter() - forward_start
            _keep_logits(trace, plan, recorder.pop())
            finished = scheduler.postprocess(plan, next_tokens)
            for seq in finished:
                cache.release(seq.request_id)
            record.end_s = time.perf_counter() - t0
            self._record_tokens(trace, plan.seqs, finished, record.end_s)
            plan = scheduler.schedule(record.end_s)  # the next step, planned as this one ends
            self._record_admitted(trace, plan.admitted, record.end_s)
            trace.steps.append(record)
            trace.wall_s = record.end_s
            yield trace, record
        if blocks is not None:
            blocks.check_no_leaks()
            assert blocks.num_used_blocks == 0, f"{blocks.num_used_blocks} KV blocks still held"

    def num_kv_blocks(self, requests: list[Request]) -> int | None:
        """The paged pool's blocks for ``requests`` as ``run`` sizes it (None in other KV modes).
        Raises ValueError: a request alone needs more blocks than the budget."""
        groups = self.runner.kv_layer_groups()
        num_layers = sum(len(layers) for _, layers in groups)
        rows = max(len(layers) for _, layers in groups)  # layers of a block (a group's)
        block_bytes_per_token = self.runner.kv_bytes_per_token() * rows // num_layers
        return kv_pool_blocks(self.config, requests, block_bytes_per_token, len(groups))

    def _new_scheduler(self, requests: list[Request]) -> Scheduler:
        cfg = self.config
        eos = frozenset() if cfg.ignore_eos else self.runner.eos_token_ids
        windows = [window for window, _ in self.runner.kv_layer_groups()]
        return Scheduler(
            requests,
            cfg.num_slots,
            eos,
            cfg.max_num_batched_tokens,
            cfg.scheduling_policy,
            self.num_kv_blocks(requests),
            cfg.block_size,
            cfg.prefix_caching,
            self.runner.kv_window(),
            windows,
        )

    def _new_kv_cache(self, requests: list[Request], blocks: BlockManager | None) -> KVCache:
        cfg = self.config
        paged = ()
        if isinstance(blocks, KVCacheGroups):
            tables = [MappingProxyType(m.block_tables) for m in blocks.groups]
            layers = [ids for _, ids in self.runner.kv_layer_groups()]
            paged = (blocks.num_blocks, blocks.block_size, tables, layers)
        elif blocks is not None:
            paged = (blocks.num_blocks, blocks.block_size, MappingProxyType(blocks.block_tables))
        return self.runner.new_kv_cache(
            cfg.kv_mode, cfg.num_slots, max_seq_len(cfg, requests), *paged
        )

    def _new_trace(
        self, requests: list[Request], cache: KVCache | None, blocks: BlockManager | None
    ) -> Trace:
        info = {
            "token_budget": self.config.max_num_batched_tokens,
            "prefix_caching": self.config.prefix_caching,
            "batch_invariant": self.config.batch_invariant,
            "sliding_windows": self.runner.sliding_windows(),  # engine.serving.masks
        }
        if cache is not None:
            info |= {"kv_bytes_per_token": cache.bytes_per_token, "kv_bytes": cache.total_bytes}
        if blocks is not None:
            info |= {"kv_blocks": blocks.num_blocks, "block_size": blocks.block_size}
            if blocks.window is not None:  # blocks out of every layer's window are freed
                info["kv_window"] = blocks.window
            if isinstance(blocks, KVCacheGroups):  # group 0's tables are ``block_tables``
                groups = self.runner.kv_layer_groups()
                info["kv_groups"] = [{"window": w, "layers": ids} for w, ids in groups]
        return Trace(
            engine=self.name,
            num_slots=self.config.num_slots,
            requests=new_request_records(requests),
            kv_mode=self.config.kv_mode,
            info=info,
        )

    @staticmethod
    def _record_admitted(trace: Trace, admitted: list[Sequence], now_s: float) -> None:
        for seq in admitted:
            rec = trace.request(seq.request_id)
            rec.slot = seq.slot
            if rec.admit_s is None:  # queue time ends at the first admission, not a readmission
                rec.admit_s = now_s
                rec.num_cached_tokens = seq.num_prefix_cached_tokens

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
            rec.num_preemptions = seq.num_preemptions


def kv_pool_blocks(
    config: EngineConfig, requests: list[Request], kv_bytes_per_token: int, num_groups: int = 1
) -> int | None:
    """``paged`` mode: the pool's blocks for ``requests`` (None in other modes); needs no model.
    Raises ValueError: some request alone needs more blocks than the pool (preemption cannot help).
    """
    if config.kv_mode != "paged":
        return None
    block_size = config.block_size
    num_blocks = _num_blocks(config, requests, kv_bytes_per_token, num_groups)
    for r in requests:
        num_tokens = r.num_prompt_tokens + r.max_new_tokens - 1  # the last token is never cached
        if num_groups * blocks_for(num_tokens, block_size) > num_blocks:
            blocks = "1 block" if num_blocks == 1 else f"{num_blocks} blocks"
            tokens = num_blocks // num_groups * block_size
            raise ValueError(
                f"{request_label(r.request_id)} needs {num_tokens} tokens of KV cache, but the KV "
                f"budget holds {blocks} of {block_size} tokens ({tokens} tokens"
                f"{_per_group(num_groups)}). Raise the KV budget or lower its max_new_tokens."
            )
    return num_blocks


def _per_group(num_groups: int) -> str:
    """Words for a budget cut among ``num_groups`` KV cache groups ("" for one)."""
    return "" if num_groups == 1 else f" in each of {num_groups} KV cache groups"


def max_seq_len(config: EngineConfig, requests: list[Request]) -> int:
    if config.max_seq_len is not None:
        return config.max_seq_len
    return max((r.num_prompt_tokens + r.max_new_tokens for r in requests), default=1)


def _num_blocks(
    config: EngineConfig, requests: list[Request], kv_bytes_per_token: int, num_groups: int
) -> int:
    """Blocks in the budget, at most what every slot's longest sequence needs at once in every
    group; with prefix caching up to every request's blocks, as vLLM gives the cache all its memory.
    """
    enough = (
        num_groups * config.num_slots * blocks_for(max_seq_len(config, requests), config.block_size)
    )
    if config.kv_budget_mib is None:
        return enough
    if config.prefix_caching:
        every = sum(
            blocks_for(r.num_prompt_tokens + r.max_new_tokens, config.block_size) for r in requests
        )
        enough = max(enough, num_groups * every)
    block_bytes = kv_bytes_per_token * config.block_size
    return min(enough, int(config.kv_budget_mib * 2**20 // block_bytes))


def _keep_logits(trace: Trace, plan, rows: list[TokenLogits | None]) -> None:
    for seq, n, row in zip(plan.seqs, plan.num_new, rows, strict=True):
        if _feeds_last_token(seq, n):  # not a partial prefill chunk
            trace.request(seq.request_id).token_logits.append(row)


def _feeds_last_token(seq, n: int) -> bool:
    """Whether feeding ``n`` tokens reaches ``seq``'s last pending one (else a partial prefill
    chunk)."""
    return seq.num_cached_tokens + n == seq.num_tokens


def _partial_chunks(plan) -> frozenset[int]:
    return frozenset(
        row
        for row, (seq, n) in enumerate(zip(plan.seqs, plan.num_new, strict=True))
        if not _feeds_last_token(seq, n)
    )


def _step_samplers(plan, samplers: dict[int, RequestSampler]) -> list[RequestSampler | None]:
    return [
        samplers.get(seq.request_id) if _feeds_last_token(seq, n) else None
        for seq, n in zip(plan.seqs, plan.num_new, strict=True)
    ]


def _step_record(
    index: int, start_s: float, batch, plan, blocks: BlockManager | None
) -> StepRecord:
    seqs = [
        ScheduledSeq(
            request_id=seq.request_id,
            slot=seq.slot,
            kind=PREFILL if seq.is_prefill else DECODE,
            num_new_tokens=new,
            num_cached_tokens=cached,
            num_prefix_cached_tokens=seq.num_prefix_cached_tokens,
        )
        for seq, cached, new in zip(batch.seqs, batch.num_cached, batch.num_new, strict=True)
    ]
    record = StepRecord(index=index, start_s=start_s, end_s=start_s, seqs=seqs)
    record.preempted = [seq.request_id for seq in plan.preempted]
    if blocks is not None:
        record.kv_blocks_used = blocks.num_used_blocks
        record.block_tables = {rid: list(table) for rid, table in blocks.block_tables.items()}
        if any(w is not None for w in blocks.group_windows):
            record.window_freed_blocks = list(blocks.window_freed)
        if isinstance(blocks, KVCacheGroups):
            record.group_block_tables = [
                {rid: list(table) for rid, table in m.block_tables.items()} for m in blocks.groups
            ]
        if blocks.prefix_caching:
            record.shared_blocks = blocks.shared_blocks()
            record.cached_free_blocks = blocks.cached_free_blocks()
    return record
