"""A static wave through the continuous engine's packed forward pass: the same kernels, padding
waste and barrier as ``model.generate`` on the left-padded wave::

    step 0 (prefill)  each row's padding (a sequence of its own, never attended) and its prompt
    step k >= 1       every row feeds one token, a finished row too (its tokens dropped later)

    row 0  [pad pad p0 p1 | t1 | t2 | t3 (finished: computed, dropped) ]
    row 1  [ q0  q1 q2 q3 | u1 | u2 | u3 ]

Each row sees only its own tokens at positions 0, 1, ..., so it equals ``generate`` in float32."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.model.model_runner import ModelRunner
from engine.sequence import Request, Sequence
from engine.serving.packed_batch import build_packed_batch
from engine.serving.sampler import RequestSampler
from engine.token_logits import LogitRecorder


@dataclass
class _Padding:
    slot: int
    token_ids: list[int]
    num_cached_tokens: int = 0
    output_token_ids: list[int] = field(default_factory=list)

    def pending_token_ids(self, limit: int | None = None) -> list[int]:
        return self.token_ids[:limit]


@dataclass
class WaveResult:
    """Every row's generated tokens (past cap or EOS too, cut later), each step's end time (s after
    the run's start) and every step's logits rows."""

    token_ids: list[list[int]]
    end_times: list[float]
    recorder: LogitRecorder


def run_wave(
    runner: ModelRunner,
    wave: list[Request],
    t0: float,
    on_step: Callable[[int], None] | None = None,
) -> WaveResult:
    """Run ``wave`` until every row reached its cap or an EOS; ``on_step(num_steps)`` after each
    step. Raises whatever ``on_step`` raises."""
    width = max(r.num_prompt_tokens for r in wave)
    seqs = [Sequence(r, slot=row) for row, r in enumerate(wave)]
    pad_lens = [width - r.num_prompt_tokens for r in wave if r.num_prompt_tokens < width]
    pads = [_Padding(len(wave) + i, [runner.pad_token_id] * n) for i, n in enumerate(pad_lens)]
    num_slots = len(wave) + len(pads)
    max_len = width + max(r.max_new_tokens for r in wave)
    cache = runner.new_kv_cache("slots", num_slots, max_len)
    samplers = [RequestSampler(r.sampling) if r.is_sampled else None for r in wave]
    recorder, end_times = LogitRecorder(), []
    step = (seqs + pads, [r.num_prompt_tokens for r in wave] + [len(p.token_ids) for p in pads])
    while step is not None:
        batch = build_packed_batch(*step, cache, num_slots, runner.device)
        # a finished row's tokens and the padding's are dropped: their logits go unrecorded
        finished = [row for row, seq in enumerate(seqs) if _row_done(seq, runner.eos_token_ids)]
        recorder.skip_rows = frozenset(finished + list(range(len(wave), len(step[0]))))
        tokens = forward_recorded(runner, batch, samplers, recorder)  # the padding's: greedy
        for seq, token in zip(seqs, tokens, strict=False):  # the padding's token is dropped
            seq.num_cached_tokens = seq.num_tokens
            seq.output_token_ids.append(token)
        end_times.append(time.perf_counter() - t0)
        if on_step is not None:
            on_step(len(end_times))
        done = all(_row_done(seq, runner.eos_token_ids) for seq in seqs)
        step = None if done else (seqs, [1] * len(seqs))
    return WaveResult([s.output_token_ids for s in seqs], end_times, recorder)


def forward_recorded(
    runner: ModelRunner, batch, samplers: list[RequestSampler | None], recorder: LogitRecorder
) -> list[int]:
    """``runner.forward_packed`` with logits rows into ``recorder``; ``samplers[i]`` draws
    ``batch.seqs[i]``'s token (None or past the end: greedy)."""
    with runner.recording(recorder):
        if any(s is not None for s in samplers):
            return runner.forward_packed(batch, samplers)
        return runner.forward_packed(batch)


def _row_done(seq: Sequence, eos_token_ids: frozenset[int]) -> bool:
    outputs = seq.output_token_ids
    return len(outputs) >= seq.request.max_new_tokens or not eos_token_ids.isdisjoint(outputs)
