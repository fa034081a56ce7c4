"""Requests and sequences: a *request* is what the user asked for (a prompt, its ``max_new_tokens``
cap, maybe sampling settings); a *sequence* is its state inside an engine."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams, samples


@dataclass(frozen=True)
class Request:
    """One user request, tokenized exactly as every engine and the reference feed it."""

    request_id: int
    prompt: str
    max_new_tokens: int
    prompt_token_ids: tuple[int, ...]
    arrival_s: float = 0.0
    sampling: SamplingParams | None = None

    @property
    def is_sampled(self) -> bool:
        return samples(self.sampling)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def arrival_order(self) -> tuple[float, int]:
        return self.arrival_s, self.request_id


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    """Engine-side state of one request. Invariant: ``num_cached_tokens <= num_tokens``; the
    uncached tokens are what the next step feeds."""

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
        return self.num_tokens - self.num_cached_tokens

    @property
    def is_prefill(self) -> bool:
        """True while tokens other than the newest are uncached: the prompt, or after a preemption
        the prompt and output, recomputed as one prefill."""
        return self.num_cached_tokens < max(self.request.num_prompt_tokens, self.num_tokens - 1)

    def preempt(self) -> None:
        """Drop the KV cache and wait again (vLLM's recompute preemption); the output is kept and
        prefilled with the prompt on readmission."""
        self.num_cached_tokens = 0
        self.num_prefix_cached_tokens = 0
        self.slot = None
        self.status = SequenceStatus.WAITING
        self.num_preemptions += 1

    def pending_token_ids(self, limit: int | None = None) -> list[int]:
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
        """Record one generated token; True if the sequence is now finished."""
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
