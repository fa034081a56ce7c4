"""Requests and sequences.

A *request* is what the user asked for: a prompt, its own ``max_new_tokens`` cap and, optionally,
its sampling settings (``engine.sampling_params``; none: greedy). A *sequence*
is that request's state inside an engine: its slot, how many of its tokens already sit in the KV
cache, and what it generated so far. Plain Python, no torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams, samples


@dataclass(frozen=True)
class Request:
    """One user request, already tokenized.

    ``prompt_token_ids`` is exactly what every engine and the reference feed to the model
    (chat template applied or not, identically for all of them).
    """

    request_id: int
    prompt: str
    max_new_tokens: int
    prompt_token_ids: tuple[int, ...]
    arrival_s: float = 0.0
    sampling: SamplingParams | None = None

    @property
    def is_sampled(self) -> bool:
        """True when the request samples (settings with a temperature above 0)."""
        return samples(self.sampling)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def arrival_order(self) -> tuple[float, int]:
        """First come, first served: by arrival time, ties by request id."""
        return self.arrival_s, self.request_id


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    """Engine-side state of one request.

    Invariant: ``num_cached_tokens <= num_tokens``; the tokens not yet cached are exactly the ones
    the next step must feed (the whole prompt at prefill, one token at decode).
    """

    request: Request
    # --- scheduling ---
    status: SequenceStatus = SequenceStatus.WAITING
    slot: int | None = None
    # --- KV cache ---
    num_cached_tokens: int = 0  # tokens whose keys/values are stored in the KV cache
    num_prefix_cached_tokens: int = 0  # of those, taken from the prefix cache at admission
    block_hashes: list[bytes] = field(default_factory=list)  # prefix cache: full blocks' chain
    # --- output ---
    output_token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "eos" | "length"
    num_preemptions: int = 0

    @property
    def request_id(self) -> int:
        return self.request.request_id

    @property
    def num_tokens(self) -> int:
        return self.request.num_prompt_tokens + len(self.output_token_ids)

    @property
    def num_pending_tokens(self) -> int:
        """Tokens the next step feeds: not yet in the KV cache."""
        return self.num_tokens - self.num_cached_tokens

    @property
    def is_prefill(self) -> bool:
        """True while tokens other than the newest are missing from the KV cache.

        That is the prompt, or after a preemption the prompt and the output so far, which are
        recomputed together as one prefill.
        """
        return self.num_cached_tokens < max(self.request.num_prompt_tokens, self.num_tokens - 1)

    def preempt(self) -> None:
        """Drop this sequence's KV cache and send it back to wait (recompute preemption, vLLM).

        Its output so far is kept and prefilled again with the prompt on readmission, so decoding
        goes on where it stopped (a sampled one too: ``engine.serving.sampler``).
        ``block_hashes`` stay valid: tokens are only ever appended.
        """
        self.num_cached_tokens = 0
        self.num_prefix_cached_tokens = 0
        self.slot = None
        self.status = SequenceStatus.WAITING
        self.num_preemptions += 1

    def pending_token_ids(self, limit: int | None = None) -> list[int]:
        """The first ``limit`` (default: all) tokens not yet cached; per sequence, not per token."""
        start = self.num_cached_tokens
        end = self.num_tokens if limit is None else min(self.num_tokens, start + limit)
        return self.token_ids(start, end)

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens ``[start, end)`` of the prompt followed by the output so far."""
        n_prompt = self.request.num_prompt_tokens
        if start >= n_prompt:
            return self.output_token_ids[start - n_prompt : end - n_prompt]
        prompt = list(self.request.prompt_token_ids[start : min(end, n_prompt)])
        return prompt + self.output_token_ids[: max(0, end - n_prompt)]

    def append_token(self, token_id: int, eos_token_ids: frozenset[int]) -> bool:
        """Record one generated token; return True if the sequence is now finished."""
        self.output_token_ids.append(token_id)
        if token_id in eos_token_ids:
            self.finish_reason = "eos"
        elif len(self.output_token_ids) >= self.request.max_new_tokens:
            self.finish_reason = "length"
        else:
            return False
        self.status = SequenceStatus.FINISHED
        return True


def truncate_at_stop(tokens: list[int], cap: int, eos_token_ids) -> list[int]:
    """An output as an engine delivers it: at most ``cap`` tokens, ending at its first EOS."""
    tokens = tokens[:cap]
    for i, token in enumerate(tokens):
        if token in eos_token_ids:
            return tokens[: i + 1]
    return tokens
