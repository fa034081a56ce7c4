"""transformers' own continuous batching (``ContinuousBatchingManager``), wrapped as an engine, with
its recording scheduler's steps as the trace's ``schedule`` (docs/engines.md)."""

from __future__ import annotations

import functools
import time
import warnings

from engine.config import EngineConfig
from engine.model.model_runner import ModelRunner
from engine.peers import transformers_scheduler
from engine.sequence import Request, truncate_at_stop
from engine.serving.sampler import HF_SAMPLING_PLACEHOLDERS, forked_rng, hf_request_kwargs
from engine.trace import Trace, new_request_records

NO_RECORD_NOTE = (
    "transformers did not build the recording scheduler it was asked for "
    f"(scheduler_type={transformers_scheduler.SCHEDULER_TYPE!r}): no own schedule recorded"
)
HF_POLL_S = 0.1  # how often on_wait is called while results are awaited
HF_STALL_S = 60.0  # no result for this long: transformers' manager is taken to have stopped
HF_PAGE_SIZE = 256  # ContinuousBatchingConfig's default page_size, in tokens
BATCH_INVARIANT_NOTE = (
    "batch-invariant mode does not apply to transformers' continuous batching: it runs its own "
    "kernels and batches, outside this project's control; its outputs are batch-dependent"
)


class HFContinuousEngine:
    name = "hf_continuous"

    def __init__(self, runner: ModelRunner, config: EngineConfig, block_sharing: bool = False):
        """Warns (``UserWarning``, ``BATCH_INVARIANT_NOTE``) when asked for batch invariance."""
        self.runner = runner
        self.config = config
        self.block_sharing = block_sharing
        if config.batch_invariant:
            warnings.warn(BATCH_INVARIANT_NOTE, UserWarning, stacklevel=2)

    def run(self, requests: list[Request], on_step=None, on_wait=None) -> Trace:
        """Run to completion; ``on_step`` is never called (no step hook), ``on_wait(trace)`` every
        ``HF_POLL_S``. Raises RuntimeError: no result for ``HF_STALL_S``: the manager stopped early;
        Exception: whatever ``on_wait`` raises (``RunStopped``): the manager is stopped."""
        info = {"block_sharing": self.block_sharing}
        if self.config.batch_invariant:  # asked for, not applied
            info |= {"batch_invariant": False, "batch_invariant_note": BATCH_INVARIANT_NOTE}
        trace = Trace(engine=self.name, num_slots=self.config.num_slots, info=info)
        trace.requests = new_request_records(requests)
        poll = None if on_wait is None else functools.partial(on_wait, trace)
        t0, outputs, record = self._generate(requests, poll)
        eos_ids = self.runner.eos_token_ids
        for request, out in zip(requests, outputs, strict=True):
            rec = trace.request(request.request_id)
            rec.comparable = not request.is_sampled
            rec.num_cached_tokens = None if self.block_sharing else 0
            tokens = truncate_at_stop(list(out.generated_tokens), request.max_new_tokens, eos_ids)
            stamps = out.timestamps or []
            rec.admit_s = 0.0
            rec.first_token_s = stamps[0] - t0 if stamps else None
            rec.finish_s = stamps[len(tokens) - 1] - t0 if len(stamps) >= len(tokens) else None
            rec.output_token_ids = tokens
            rec.output_text = self.runner.decode(tokens)
            rec.finish_reason = "eos" if tokens and tokens[-1] in eos_ids else "length"
        trace.wall_s = max((r.finish_s or 0.0) for r in trace.requests)
        if record is None:
            trace.warnings.append(NO_RECORD_NOTE)
        else:
            ids = {hf_request_id(i): r.request_id for i, r in enumerate(requests)}
            trace.schedule = transformers_scheduler.schedule_trace(record, trace.requests, ids, t0)
        return trace

    def _generate(self, requests: list[Request], on_poll):
        """``(t0, outputs, record)``: ``perf_counter`` at the first request, a ``GenerationOutput``
        per request, the ``ScheduleRecord`` (None without the recording scheduler). Warm-up runs
        before the clock; the global random state is restored."""
        model, sampled = self.runner.model, any(r.is_sampled for r in requests)
        vocab_size = model.config.get_text_config().vocab_size
        gen, cb = self._configs(requests, sampled)
        previous = model.config._attn_implementation
        try:
            with (
                forked_rng(self.runner.device, sampled),
                model.continuous_batching_context_manager(
                    generation_config=gen, continuous_batching_config=cb, block=True, timeout=30
                ) as manager,
            ):
                t0 = time.perf_counter()
                for i, request in enumerate(requests):
                    kwargs = hf_request_kwargs(request.sampling, vocab_size) if sampled else {}
                    manager.add_request(
                        list(request.prompt_token_ids),
                        request_id=hf_request_id(i),
                        max_new_tokens=request.max_new_tokens,
                        record_timestamps=True,
                        **kwargs,
                    )
                results = _hf_results(manager, len(requests), on_poll)
                processor = manager.batch_processor  # the loop's (stop() drops it)
        finally:
            model.set_attn_implementation(previous)
        outputs = [results[hf_request_id(i)] for i in range(len(requests))]
        return t0, outputs, _own_record(processor)

    def _configs(self, requests: list[Request], sampled: bool):
        """``GenerationConfig`` and ``ContinuousBatchingConfig``; transformers' prefix caching
        (``allow_block_sharing``, on by default there) is ``block_sharing``."""
        from transformers import ContinuousBatchingConfig, GenerationConfig

        gen = GenerationConfig(
            eos_token_id=sorted(self.runner.eos_token_ids),
            pad_token_id=self.runner.pad_token_id,
            max_new_tokens=max(r.max_new_tokens for r in requests),
            **(HF_SAMPLING_PLACEHOLDERS if sampled else {"do_sample": False}),
        )
        cb = ContinuousBatchingConfig(
            scheduler_type=transformers_scheduler.register(),
            max_requests_per_batch=self.config.num_slots,
            auto_switch_to_flash=False,
            allow_block_sharing=self.block_sharing,
            **_hf_sizes(requests, self.config.num_slots),
            **({"per_request_processors": True, "seed": 0} if sampled else {}),
        )
        return gen, cb


def hf_request_id(index: int) -> str:
    return f"r{index}"


def _own_record(processor):
    """The recording scheduler's ``ScheduleRecord`` (None without), read once its thread stopped."""
    record = getattr(getattr(processor, "scheduler", None), "record", None)
    if isinstance(record, transformers_scheduler.ScheduleRecord):
        record.settings["async_batching"] = bool(processor.use_async_batching)
        return record
    return None


def _hf_results(manager, num_requests: int, on_poll) -> dict:
    """Every request's finished ``GenerationOutput`` by request id. Raises RuntimeError: no result
    for ``HF_STALL_S``."""
    results = {}
    last_result_s = time.perf_counter()
    while len(results) < num_requests:
        out = manager.get_result(timeout=HF_POLL_S)
        if on_poll is not None:
            on_poll()
        if out is None:
            if time.perf_counter() - last_result_s > HF_STALL_S:
                raise RuntimeError("transformers' continuous batching stopped early")
            continue
        last_result_s = time.perf_counter()
        if out.is_finished():
            results[out.request_id] = out
    return results


def _hf_sizes(requests: list[Request], num_slots: int) -> dict[str, int]:
    """``num_blocks`` and ``max_batch_tokens`` like ours: room for every slot's longest sequence,
    and a step that prefills ``num_slots`` longest prompts. Left unset, transformers takes 60-90 %
    of free memory (``continuous_batching/cache.py``)."""
    longest = max(r.num_prompt_tokens + r.max_new_tokens for r in requests)
    prompt_lengths = sorted((r.num_prompt_tokens for r in requests), reverse=True)
    return {
        "num_blocks": num_slots * -(-longest // HF_PAGE_SIZE),
        "max_batch_tokens": sum(prompt_lengths[:num_slots]) + num_slots,
    }
