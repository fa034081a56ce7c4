"""transformers' ``ContinuousBatchingManager`` driven for the model runner: configs, sizes, results.

The comparison engine ``engine.peers.transformers_engine`` calls ``run_batch`` with its
``engine.model.model_runner.ModelRunner``, whose model, device and stop ids it uses. It is apart
from the runner because transformers' own continuous batching needs its own configs, KV sizing and
result polling, none of which the project's engines use. The manager runs with the recording
scheduler of ``engine.peers.transformers_scheduler``, and ``run_batch`` hands back its record.
"""

from __future__ import annotations

import time

from engine.peers import transformers_scheduler
from engine.serving.sampler import HF_SAMPLING_PLACEHOLDERS, forked_rng

HF_POLL_S = 0.1  # how often run_batch calls on_poll while it waits for results
HF_STALL_S = 60.0  # no result for this long: transformers' manager is taken to have stopped
HF_PAGE_SIZE = 256  # ContinuousBatchingConfig's default page_size, in tokens


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
