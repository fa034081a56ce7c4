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

Batch-invariant mode (``EngineConfig.batch_invariant``) does not reach it: transformers' manager
runs its own kernels and batches, outside this project's control. Asking for it warns
(``BATCH_INVARIANT_NOTE``) and the trace's ``info`` says so, rather than ignoring it silently.
"""

from __future__ import annotations

import functools
import warnings

from engine.config import EngineConfig
from engine.model.model_runner import ModelRunner
from engine.peers import transformers_manager, transformers_scheduler
from engine.sequence import Request, truncate_at_stop
from engine.serving.sampler import hf_request_kwargs
from engine.trace import Trace, new_request_records

NO_RECORD_NOTE = (
    "transformers did not build the recording scheduler it was asked for "
    f"(scheduler_type={transformers_scheduler.SCHEDULER_TYPE!r}): no own schedule recorded"
)
BATCH_INVARIANT_NOTE = (
    "batch-invariant mode does not apply to transformers' continuous batching: it runs its own "
    "kernels and batches, outside this project's control; its outputs are batch-dependent"
)


class HFContinuousEngine:
    """Runs requests through ``engine.peers.transformers_manager.run_batch`` on the runner's
    model."""

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
        t0, outputs, record = transformers_manager.run_batch(
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
            ids = {
                transformers_manager.hf_request_id(i): r.request_id for i, r in enumerate(requests)
            }
            trace.schedule = transformers_scheduler.schedule_trace(record, trace.requests, ids, t0)
        return trace
