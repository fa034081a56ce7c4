"""The static engine: waves of ``B`` in arrival order, padded to the longest prompt, run until every
row reached its cap or an EOS (finished rows still computed), the next wave waiting for the whole
one. Waves run through the packed forward pass (``wave``), or through ``model.generate``."""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections import deque
from collections.abc import Callable

import torch

from engine.batching.wave import WaveResult, run_wave
from engine.config import EngineConfig
from engine.model.model_runner import ModelRunner
from engine.sequence import Request, truncate_at_stop
from engine.serving.run_control import wait_until
from engine.serving.sampler import RequestSampler, WaveSampler
from engine.token_logits import LogitRecorder, LogitTrail
from engine.trace import DECODE, IDLE, PREFILL, ScheduledSeq, StepRecord, Trace, new_request_records


class _StepClock:
    """A ``StoppingCriteria``: records each step's end time; rows past their cap are done."""

    def __init__(self, t0: float, width: int, caps: list[int], on_step: Callable | None):
        self.t0, self.width, self.on_step = t0, width, on_step
        self.caps = torch.tensor(caps)
        self.end_times: list[float] = []

    def __call__(self, input_ids, scores, **kwargs) -> torch.Tensor:
        self.end_times.append(time.perf_counter() - self.t0)
        if self.on_step is not None:
            self.on_step(len(self.end_times))
        num_generated = input_ids.shape[1] - self.width
        return (num_generated >= self.caps).to(input_ids.device)  # (B,) bool


class StaticEngine:
    name = "static"

    def __init__(self, runner: ModelRunner, config: EngineConfig, engine_kernels: bool = True):
        """Waves run through ``wave`` except with ``engine_kernels=False`` (plain
        ``model.generate``) or ``config.batch_invariant``. Raises ValueError: batch-invariant mode
        without the engines' kernels, or for a model it does not support."""
        self.runner = runner
        self.engine_kernels = engine_kernels
        self.config = config
        self.packed = engine_kernels and not config.batch_invariant
        if config.batch_invariant:
            if not engine_kernels:
                raise ValueError("Batch-invariant mode needs the engines' kernels.")
            runner.require_batch_invariant()

    def run(
        self,
        requests: list[Request],
        on_step: Callable | None = None,
        on_wait: Callable[[Trace], None] | None = None,
    ) -> Trace:
        """``on_step(trace, None)`` after every step, ``on_wait(trace)`` every ``WAIT_SLICE_S``
        while a wave waits. Raises whatever they raise, at once."""
        trace = Trace(engine=self.name, num_slots=self.config.num_slots)
        trace.info["batch_invariant"] = self.config.batch_invariant
        trace.requests = new_request_records(requests)
        pending = deque(sorted(requests, key=lambda r: r.arrival_order))
        waiting = None if on_wait is None else functools.partial(on_wait, trace)
        self.runner.synchronize()
        t0 = time.perf_counter()
        wave_index = 0
        while pending:
            wave = self._next_wave(pending, t0, waiting)
            self._run_wave(trace, wave_index, wave, t0, on_step)
            wave_index += 1
        self.runner.synchronize()
        trace.wall_s = time.perf_counter() - t0
        return trace

    def _next_wave(
        self, pending: deque[Request], t0: float, on_wait: Callable[[], None] | None
    ) -> list[Request]:
        """Wait for the next wave and take it out of ``pending``: up to ``B`` oldest first, once
        ``B`` arrived, the oldest waited ``wave_timeout_s``, or all arrived."""
        b, timeout_s = self.config.num_slots, self.config.wave_timeout_s
        while True:
            now_s = time.perf_counter() - t0
            arrived = sum(1 for r in pending if r.arrival_s <= now_s)
            oldest_waited_s = now_s - pending[0].arrival_s
            if arrived and (
                arrived >= b or arrived == len(pending) or oldest_waited_s >= timeout_s
            ):
                return [pending.popleft() for _ in range(min(b, arrived))]
            wake_s = pending[arrived].arrival_s if arrived < len(pending) else math.inf
            if arrived:
                wake_s = min(wake_s, pending[0].arrival_s + timeout_s)
            wait_until(t0, wake_s, on_wait)

    def _run_wave(self, trace, wave_index, wave: list[Request], t0, on_step) -> None:
        wave_start_s = time.perf_counter() - t0
        width = max(r.num_prompt_tokens for r in wave)

        def tick(_num_steps):
            if on_step is not None:
                on_step(trace, None)

        if self.packed:
            result = run_wave(self.runner, wave, t0, tick)
        else:
            result = self._generate(wave, t0, tick)
        eos = self.runner.eos_token_ids
        outputs = [
            truncate_at_stop(tokens, r.max_new_tokens, eos)
            for r, tokens in zip(wave, result.token_ids, strict=True)
        ]
        end_times, calls = result.end_times, result.recorder.calls
        for row, (request, tokens) in enumerate(zip(wave, outputs, strict=True)):
            rec = trace.request(request.request_id)
            rec.slot, rec.admit_s = row, wave_start_s
            rec.first_token_s = end_times[0]
            rec.finish_s = end_times[len(tokens) - 1]
            rec.output_token_ids = tokens
            rec.output_text = self.runner.decode(tokens)
            rec.finish_reason = "eos" if tokens[-1] in self.runner.eos_token_ids else "length"
            rec.token_logits = LogitTrail(calls[k][row] for k in range(len(tokens)))
        self._record_steps(trace, wave_index, wave, outputs, width, wave_start_s, end_times)

    def _generate(self, wave, t0, tick) -> WaveResult:
        input_ids, attention_mask = self.runner.left_pad([list(r.prompt_token_ids) for r in wave])
        width = input_ids.shape[1]
        clock = _StepClock(t0, width, [r.max_new_tokens for r in wave], tick)
        samplers = [RequestSampler(r.sampling) if r.is_sampled else None for r in wave]
        processors = (
            [WaveSampler(samplers, width)] if any(s is not None for s in samplers) else None
        )
        recorder = LogitRecorder()
        kernels = (
            self.runner.engine_kernels(self.config.batch_invariant)
            if self.engine_kernels
            else contextlib.nullcontext()
        )
        with kernels, self.runner.recording(recorder):
            out = self.runner.generate(
                input_ids, attention_mask, max(r.max_new_tokens for r in wave), [clock], processors
            )
        return WaveResult(out[:, width:].tolist(), clock.end_times, recorder)

    @staticmethod
    def _record_steps(trace, wave_index, wave, outputs, width, wave_start_s, end_times) -> None:
        start_s = wave_start_s
        for k, end_s in enumerate(end_times):
            seqs = [
                _row_share(row, r, len(tokens), width, k)
                for row, (r, tokens) in enumerate(zip(wave, outputs, strict=True))
            ]
            trace.steps.append(StepRecord(len(trace.steps), start_s, end_s, seqs, wave=wave_index))
            start_s = end_s


def _row_share(row: int, request: Request, num_output: int, width: int, k: int) -> ScheduledSeq:
    """What ``row`` computed at step ``k`` of its wave (step 0 is the padded prefill)."""
    padding = width - request.num_prompt_tokens
    if k == 0:
        return ScheduledSeq(request.request_id, row, PREFILL, request.num_prompt_tokens, 0, padding)
    kind = DECODE if k < num_output else IDLE
    cached = request.num_prompt_tokens + k - 1
    return ScheduledSeq(request.request_id, row, kind, 1, cached, padding)
