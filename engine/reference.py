"""The reference: per-request ``model.generate`` at batch 1, the ground truth for parity.

A greedy request's reference is greedy ``generate``; a sampled one's (``engine.sampling``) is
``generate(do_sample=True, temperature, top_k, top_p)`` right after ``torch.manual_seed(seed)``,
which draws what the engines' per-request samplers draw (``engine.sampler``).

Both are prefix-stable: the output for cap ``c`` is the first ``c`` tokens of the output for any
larger cap (or the whole output, if it ended with EOS); a sampled one because its k-th draw never
depends on the cap. ``ReferenceCache`` keeps the longest output per prompt and sampling settings
and answers smaller caps from it, so repeated runs in the app cost nothing.

An engine that samples with a random stream of its own (transformers' manager) cannot be compared
token for token: its ``RequestRecord.comparable`` is False, and ``comparison`` says
``NOT_COMPARED`` ("sampled with another generator: not compared") instead of a mismatch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.model_runner import ModelRunner
from engine.sequence import Request, truncate_at_stop

MATCH = "match"
MISMATCH = "mismatch"
NOT_COMPARED = "not_compared"
NOT_COMPARED_TEXT = "sampled with another generator: not compared"


class ReferenceCache:
    """Per-request outputs of plain ``model.generate`` (batch 1), by prompt and sampling."""

    def __init__(self, runner: ModelRunner):
        self.runner = runner
        # (prompt ids, sampling settings or None for greedy) -> (tokens, cap)
        self._outputs: dict[tuple, tuple[list[int], int]] = {}

    def output(self, request: Request, on_step: Callable[[], None] | None = None) -> list[int]:
        """The reference output ids of one request, up to its cap or first EOS.

        ``on_step()`` is called after every generate step; an exception it raises ends the call.
        """
        sampling = request.sampling if request.is_sampled else None
        key = (request.prompt_token_ids, sampling)
        hit = self._outputs.get(key)
        if hit is None or not self._covers(hit, request.max_new_tokens):
            ids, mask = self.runner.left_pad([list(request.prompt_token_ids)])
            criteria = [_EveryStep(on_step)] if on_step is not None else None
            out = self.runner.generate(
                ids, mask, request.max_new_tokens, criteria, sampling=sampling
            )
            hit = (out[0, ids.shape[1] :].tolist(), request.max_new_tokens)
            self._outputs[key] = hit
        return truncate_at_stop(hit[0], request.max_new_tokens, self.runner.eos_token_ids)

    def outputs(
        self, requests: list[Request], on_request=None, on_step=None
    ) -> dict[int, list[int]]:
        """Reference output ids for every request, by request id.

        ``on_request(done, total)`` after each request; ``on_step()`` as in ``output``.
        """
        result = {}
        for i, request in enumerate(requests):
            result[request.request_id] = self.output(request, on_step)
            if on_request is not None:
                on_request(i + 1, len(requests))
        return result

    def _covers(self, hit: tuple[list[int], int], cap: int) -> bool:
        tokens, cached_cap = hit
        ended = any(t in self.runner.eos_token_ids for t in tokens)
        return cached_cap >= cap or ended


class _EveryStep:
    """A ``StoppingCriteria`` that never stops generation itself, only calls ``callback()``."""

    def __init__(self, callback: Callable[[], None]):
        self.callback = callback

    def __call__(self, input_ids, scores, **kwargs) -> torch.Tensor:
        self.callback()
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)  # (B,)


def mismatches(
    outputs: dict[int, list[int]], reference: dict[int, list[int]], not_compared=()
) -> list[int]:
    """Request ids whose output ids differ from the reference, leaving out ``not_compared``."""
    skip = set(not_compared)
    return [rid for rid, ref in reference.items() if rid not in skip and outputs.get(rid) != ref]


def not_compared_ids(trace) -> list[int]:
    """Request ids a trace's engine sampled with its own generator (``comparable`` False)."""
    return [r.request_id for r in trace.requests if not r.comparable]


def comparison(record, reference: dict[int, list[int]] | None) -> str | None:
    """``MATCH``, ``MISMATCH`` or ``NOT_COMPARED`` for one ``RequestRecord``; None without a
    reference (or none for this request)."""
    if not record.comparable:
        return NOT_COMPARED
    if reference is None or record.request_id not in reference:
        return None
    return MATCH if record.output_token_ids == reference[record.request_id] else MISMATCH


def first_divergence(output: list[int], reference: list[int]) -> int | None:
    """Index of the first differing token (or of the shorter end), None if equal."""
    for i, (a, b) in enumerate(zip(output, reference, strict=False)):
        if a != b:
            return i
    return None if len(output) == len(reference) else min(len(output), len(reference))


@dataclass
class Divergence:
    """Where an engine's output first left the reference, and how close the call was.

    For a sampled request the margin compares raw logits too; a sampled token need not be the
    argmax, so there it says how likely each token was, not whether it was a near-tie.
    """

    request_id: int
    token_index: int  # position in the output ids where the two first differ
    reference_token: int | None  # None: the reference ended here (EOS or cap)
    engine_token: int | None  # None: the engine's output ended here
    # Logit of the reference token minus that of the engine's token at this position, from a
    # plain forward over prompt + reference prefix. Near 0: a float32 near-tie that a different
    # summation order (batch shape, kernel) can flip; large: a real bug.
    logit_margin: float | None


def divergence(runner: ModelRunner, request: Request, output: list[int], reference: list[int]):
    """The first ``Divergence`` of ``output`` from ``reference``; None when they are equal."""
    index = first_divergence(output, reference)
    if index is None:
        return None
    ref_token = reference[index] if index < len(reference) else None
    engine_token = output[index] if index < len(output) else None
    margin = None
    if ref_token is not None and engine_token is not None:
        logits = runner.next_token_logits([*request.prompt_token_ids, *reference[:index]])
        margin = float(logits[ref_token] - logits[engine_token])
    return Divergence(request.request_id, index, ref_token, engine_token, margin)
