"""transformers' own continuous batching, wrapped as an engine for side-by-side runs.

What a transformers user would pick instead of this project's engine: ``ContinuousBatchingManager``
(``transformers/generation/continuous_batching/``) with the same requests, per-request caps and slot
limit (``max_requests_per_batch``), greedy. It exposes no slot schedule, so its trace has
per-request times (from its per-token timestamps) and no steps.

Sampled requests (``engine.sampling_params``) run with the same temperature, top-k and top-p through
the manager's per-request processors, but it draws every request from one random stream of its own;
their records are marked ``comparable=False`` ("sampled with another generator: not compared").
When some request samples, the greedy ones run with ``top_k=1``, which draws the argmax, so they are
still compared.

With ``block_sharing`` its prefix caching (``allow_block_sharing``) is on. transformers does not
say how many prompt tokens each request found cached, so the trace's ``num_cached_tokens`` is
None then (0 without sharing).

``run_batch`` drives the manager on the runner's model (its device and stop ids): its own configs,
KV sizing and result polling, none of which the project's engines use, with the recording
scheduler of ``engine.peers.transformers_scheduler``, whose record it hands back.

Batch-invariant mode (``EngineConfig.batch_invariant``) does not reach it: transformers' manager
runs its own kernels and batches, outside this project's control. Asking for it warns
(``BATCH_INVARIANT_NOTE``) and the trace's ``info`` says so, rather than ignoring it silently.
"""

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
HF_POLL_S = 0.1  # how often run_batch calls on_poll while it waits for results
HF_STALL_S = 60.0  # no result for this long: transformers' manager is taken to have stopped
HF_PAGE_SIZE = 256  # ContinuousBatchingConfig's default page_size, in tokens
BATCH_INVARIANT_NOTE = (
    "batch-invariant mode does not apply to transformers' continuous batching: it runs its own "
    "kernels and batches, outside this project's control; its outputs are batch-dependent"
)


class HFContinuousEngine:
    """Runs requests through ``run_batch`` on the runner's model."""

    name = "hf_continuous"

    def __init__(self, runner: ModelRunner, config: EngineConfig, block_sharing: bool = False):
        """Warns (``UserWarning``, ``BATCH_INVARIANT_NOTE``) when asked for batch invariance."""
        self.runner = runner
        self.config = config
        self.block_sharing = block_sharing
        if config.batch_invariant:
            warnings.warn(BATCH_INVARIANT_NOTE, UserWarning, stacklevel=2)

    def run(self, requests: list[Request], on_step=None, on_wait=None) -> Trace:
        """Run to completion. transformers' manager has no step hook, so ``on_step`` is never
        called; ``on_wait(trace)`` is called every 0.1 s while its results are awaited.

        Raises:
            Exception: whatever ``on_wait`` raises (``RunStopped``): the manager is stopped.
        """
        info = {"block_sharing": self.block_sharing}
        if self.config.batch_invariant:  # asked for, not applied
            info |= {"batch_invariant": False, "batch_invariant_note": BATCH_INVARIANT_NOTE}
        trace = Trace(engine=self.name, num_slots=self.config.num_slots, info=info)
        trace.requests = new_request_records(requests)
        prompts = [list(r.prompt_token_ids) for r in requests]
        caps = [r.max_new_tokens for r in requests]
        poll = None if on_wait is None else functools.partial(on_wait, trace)
        kwargs = None
        if any(r.is_sampled for r in requests):
            vocab_size = self.runner.model.config.get_text_config().vocab_size
            kwargs = [hf_request_kwargs(r.sampling, vocab_size) for r in requests]
        t0, outputs, record = run_batch(
            self.runner, prompts, caps, self.config.num_slots, poll, kwargs, self.block_sharing
        )
        for request, out in zip(requests, outputs, strict=True):
            rec = trace.request(request.request_id)
            rec.comparable = not request.is_sampled
            rec.num_cached_tokens = None if self.block_sharing else 0
            tokens = truncate_at_stop(
                list(out.generated_tokens), request.max_new_tokens, self.runner.eos_token_ids
            )
            stamps = out.timestamps or []
            rec.admit_s = 0.0
            rec.first_token_s = stamps[0] - t0 if stamps else None
            rec.finish_s = stamps[len(tokens) - 1] - t0 if len(stamps) >= len(tokens) else None
            rec.output_token_ids = tokens
            rec.output_text = self.runner.decode(tokens)
            rec.finish_reason = (
                "eos" if tokens and tokens[-1] in self.runner.eos_token_ids else "length"
            )
        trace.wall_s = max((r.finish_s or 0.0) for r in trace.requests)
        if record is None:
            trace.warnings.append(NO_RECORD_NOTE)
        else:
            ids = {hf_request_id(i): r.request_id for i, r in enumerate(requests)}
            trace.schedule = transformers_scheduler.schedule_trace(record, trace.requests, ids, t0)
        return trace


def run_batch(
    runner,
    prompts: list[list[int]],
    caps: list[int],
    num_slots: int,
    on_poll=None,
    sampling_kwargs: list[dict] | None = None,
    block_sharing: bool = False,
):
    """Run prompts through transformers' ``ContinuousBatchingManager`` (greedy by default).

    ``sampling_kwargs``: per prompt, the ``temperature``, ``top_k`` and ``top_p`` that
    ``add_request`` passes to the manager's per-request processors
    (``ContinuousBatchingConfig(per_request_processors=True)``), all sampled with its own
    generator (``seed=0``); the global random state is restored afterwards.

    Uses ``model.continuous_batching_context_manager`` with ``max_requests_per_batch`` =
    ``num_slots`` and ``add_request(..., max_new_tokens=cap)`` per request; warm-up happens
    before the clock starts. ``block_sharing`` sets ``ContinuousBatchingConfig``'s
    ``allow_block_sharing``, transformers' prefix caching (its default is on; off here unless
    asked, like our engines): a full page of ``HF_PAGE_SIZE`` prompt tokens is shared once a
    request computed it. Returns ``(t0, outputs, record)``: ``perf_counter`` at the first
    request, per prompt a ``GenerationOutput`` (``generated_tokens``, ``timestamps`` in
    ``perf_counter`` seconds; request id ``hf_request_id(index)``), and the manager's own schedule
    (``engine.peers.transformers_scheduler.ScheduleRecord``, read after its generation thread
    stopped; None if transformers did not build the recording scheduler it was asked for).

    ``on_poll()`` is called every ``HF_POLL_S`` (0.1 s) while results are awaited; an exception
    it raises (``RunStopped``) stops the manager and propagates.

    ``runner``: the ``engine.model.model_runner.ModelRunner`` whose model, device and stop ids it
    uses.

    Raises:
        RuntimeError: no result for ``HF_STALL_S`` (60 s): the manager stopped early.
    """
    gen, cb = _hf_configs(
        runner, prompts, caps, num_slots, sampled=bool(sampling_kwargs), block_sharing=block_sharing
    )
    per_request = sampling_kwargs or [{} for _ in prompts]
    previous = runner.model.config._attn_implementation
    try:
        with (
            forked_rng(runner.device, bool(sampling_kwargs)),
            runner.model.continuous_batching_context_manager(
                generation_config=gen, continuous_batching_config=cb, block=True, timeout=30
            ) as manager,
        ):
            t0 = time.perf_counter()
            for i, (ids, cap) in enumerate(zip(prompts, caps, strict=True)):
                kwargs = {"max_new_tokens": cap, "record_timestamps": True, **per_request[i]}
                manager.add_request(ids, request_id=hf_request_id(i), **kwargs)
            results = _hf_results(manager, len(prompts), on_poll)
            processor = manager.batch_processor  # the loop's (stop() drops it)
    finally:
        runner.model.set_attn_implementation(previous)
    return t0, [results[hf_request_id(i)] for i in range(len(prompts))], _own_record(processor)


def hf_request_id(index: int) -> str:
    """The request id ``run_batch`` gives the ``index``-th prompt in transformers' manager."""
    return f"r{index}"


def _own_record(processor):
    """The ``ScheduleRecord`` of the processor's scheduler, with ``settings["async_batching"]``
    added; None if its scheduler is not the recording one. Read once the generation thread has
    stopped (the context manager joined it), so its last step is closed."""
    record = getattr(getattr(processor, "scheduler", None), "record", None)
    if isinstance(record, transformers_scheduler.ScheduleRecord):
        record.settings["async_batching"] = bool(processor.use_async_batching)
        return record
    return None


def _hf_configs(runner, prompts, caps, num_slots: int, sampled: bool, block_sharing: bool):
    """transformers' ``GenerationConfig`` and ``ContinuousBatchingConfig`` for a batch."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    gen = GenerationConfig(
        eos_token_id=sorted(runner.eos_token_ids),
        pad_token_id=runner.pad_token_id,
        max_new_tokens=max(caps),
        **(HF_SAMPLING_PLACEHOLDERS if sampled else {"do_sample": False}),
    )
    cb = ContinuousBatchingConfig(
        scheduler_type=transformers_scheduler.register(),
        max_requests_per_batch=num_slots,
        auto_switch_to_flash=False,
        allow_block_sharing=block_sharing,
        **_hf_sizes(prompts, caps, num_slots),
        **({"per_request_processors": True, "seed": 0} if sampled else {}),
    )
    return gen, cb


def _hf_results(manager, num_requests: int, on_poll) -> dict:
    """Wait for every request's finished ``GenerationOutput`` (by request id), calling
    ``on_poll()`` every ``HF_POLL_S``.

    Raises:
        RuntimeError: no result for ``HF_STALL_S``: the manager stopped early.
    """
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


def _hf_sizes(prompts: list[list[int]], caps: list[int], num_slots: int) -> dict[str, int]:
    """``num_blocks`` and ``max_batch_tokens`` for ``ContinuousBatchingConfig``, like ours.

    Left unset, transformers sizes its KV cache from free memory (60-90 % of it: 14 GB on a 24 GB
    CPU machine, even for a tiny model; ``continuous_batching/cache.py``). Instead: room for every
    slot's longest sequence, and one step can prefill ``num_slots`` of the longest prompts, as our
    engine does without a token budget.
    """
    longest = max(len(p) + c for p, c in zip(prompts, caps, strict=True))
    prompt_lengths = sorted((len(p) for p in prompts), reverse=True)
    return {
        "num_blocks": num_slots * -(-longest // HF_PAGE_SIZE),
        "max_batch_tokens": sum(prompt_lengths[:num_slots]) + num_slots,
    }
