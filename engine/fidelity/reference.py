"""The references each engine's outputs are compared against: per-request ``model.generate`` at
batch 1 (``ReferenceCache``), or the one-slot continuous engine in batch-invariant mode
(``SoloReference``). Both are prefix-stable, so the longest output answers smaller caps."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from engine.config import EngineConfig
from engine.fidelity import divergence
from engine.fidelity.divergence import Verdict
from engine.fidelity.reference_key import Identity, code_digest
from engine.fidelity.reference_store import (
    ReferenceStore,
    Stored,
    covers,
    entry_key,
    still_missing,
    wanted_references,
)
from engine.model.model_runner import ModelRunner
from engine.sequence import Request, truncate_at_stop
from engine.token_logits import (
    LogitRecorder,
    LogitTrail,
    TokenLogits,
    logit_and_abs_dot,
    row_digest,
)

MATCH = "match"
MISMATCH = "mismatch"
NOT_COMPARED = "not_compared"
NOT_COMPARED_TEXT = "sampled with another generator: not compared"

_ENGINE = Path(__file__).resolve().parents[1]  # engine/
# The sources plain generate's reference runs through (its identity's "code"); the solo reference
# runs through the engines, so its identity hashes every core module (engine/ less page, bench).
GENERATE_SOURCES = (
    "fidelity/reference.py",
    "model/model_runner.py",
    "serving/sampler.py",
    "token_logits.py",
)


class _Cache:
    """Per prompt and sampling settings: the longest output so far, its cap and its logits."""

    def __init__(self, runner: ModelRunner, store: ReferenceStore | None = None):
        self.runner = runner
        self.store = store  # None: in memory only
        # (prompt ids, sampling settings or None for greedy) -> the longest output so far
        self._outputs: dict[tuple, Stored] = {}

    def output(self, request: Request, on_step: Callable[[], None] | None = None) -> list[int]:
        """Reference output ids up to the cap or first EOS; ``on_step()`` after every token (what it
        raises ends the call)."""
        tokens, _ = self._hit(request, on_step)
        return tokens

    def token_logits(self, request: Request) -> Sequence[TokenLogits]:
        tokens, logits = self._hit(request, None)
        return logits if len(logits) == len(tokens) else logits[: len(tokens)]

    def outputs(self, requests: list[Request], on_step=None) -> dict[int, list[int]]:
        return {request.request_id: self.output(request, on_step) for request in requests}

    def verdicts(self, requests: list[Request], trace) -> dict[int, Verdict]:
        """✓ / ≈ / ✗ of every comparable request of ``trace``, by request id."""
        model = divergence.rounding_model(
            self.runner.dtype, self.runner.hidden_size, self.runner.device.type
        )
        found = {}
        for request in requests:
            record = trace.request(request.request_id)
            if not record.comparable:
                continue
            found[request.request_id] = divergence.judge(
                request.request_id,
                record.output_token_ids,
                self.output(request),
                self.token_logits(request),
                record.token_logits or None,
                model,
                functools.partial(self.logit_at, request),
                sampled=request.is_sampled,
            )
        return found

    def logit_at(self, request: Request, index: int, token_id: int) -> tuple[float, float] | None:
        """``(logit, abs_dot)`` of a token outside the recorded top at ``index``, from a re-run of
        the reference keeping that row; None when unknown or when the row's digest differs from the
        first run's (not the same pass)."""
        recorded = self.token_logits(request)
        if index >= len(recorded):
            return None
        kept = self._replay(request, index)
        if kept is None or row_digest(kept[1]) != recorded[index].digest:
            return None
        return logit_and_abs_dot(kept, token_id)

    def missing(self, requests: list[Request]) -> dict[tuple, int]:
        """The references ``outputs(requests)`` would compute, ``key -> cap``; computes nothing."""
        return self.still_missing(wanted_references(requests))

    def still_missing(self, wanted: dict[tuple, int]) -> dict[tuple, int]:
        """Those of ``wanted`` not held to their caps now. The store is read only once the identity
        is known (hashing the weights is left to the first reference pass)."""
        identity = self.__dict__.get("identity")  # the cached property, once computed
        store = self.store if identity is not None else None
        return still_missing(wanted, self._outputs, store, identity, self.runner.eos_token_ids)

    def _hit(self, request: Request, on_step) -> tuple[list[int], LogitTrail]:
        key = entry_key(request)
        hit = self._outputs.get(key)
        if hit is None and self.store is not None:
            hit = self.store.load(self.identity, key)
        if hit is None or not covers(hit, request.max_new_tokens, self.runner.eos_token_ids):
            tokens, logits = self._run(request, on_step)
            trail = logits if isinstance(logits, LogitTrail) else LogitTrail(logits)
            hit = Stored(tokens, request.max_new_tokens, trail)
            if self.store is not None:
                self.store.save(self.identity, key, hit)
        self._outputs[key] = hit
        tokens = truncate_at_stop(hit.tokens, request.max_new_tokens, self.runner.eos_token_ids)
        return tokens, hit.logits

    @functools.cached_property
    def identity(self) -> Identity:
        assert self.store is not None, "an identity is only needed with a store"
        return self.store.identity(self.runner, self._mode())

    def _mode(self) -> dict[str, Any]:
        raise NotImplementedError

    def _run(self, request: Request, on_step) -> tuple[list[int], Sequence[TokenLogits]]:
        raise NotImplementedError

    def _replay(self, request: Request, index: int):
        """``LogitRecorder.kept`` at output position ``index`` of a re-run; None: not offered."""
        return None


class ReferenceCache(_Cache):
    """Per-request plain ``model.generate`` (batch 1), with the run's own logits."""

    def _mode(self) -> dict[str, Any]:
        # Plain generate runs outside the engines' kernels: their matmul kernel does not apply.
        sources = [_ENGINE / name for name in GENERATE_SOURCES]
        return {"reference": "generate", "code": code_digest(sources)}

    def _run(self, request: Request, on_step) -> tuple[list[int], Sequence[TokenLogits]]:
        ids, mask = self.runner.left_pad([list(request.prompt_token_ids)])
        criteria = [_EveryStep(on_step)] if on_step is not None else None
        recorder = LogitRecorder()
        with self.runner.recording(recorder):
            out = self.runner.generate(
                ids, mask, request.max_new_tokens, criteria, sampling=_sampling(request)
            )
        return out[0, ids.shape[1] :].tolist(), [rows[0] for rows in recorder.calls]

    def _replay(self, request: Request, index: int):
        ids, mask = self.runner.left_pad([list(request.prompt_token_ids)])
        recorder = LogitRecorder(keep_call=index)
        with self.runner.recording(recorder):
            self.runner.generate(ids, mask, index + 1, None, sampling=_sampling(request))
        return recorder.kept


def _sampling(request: Request):
    return request.sampling if request.is_sampled else None


class SoloReference(_Cache):
    """Each request alone through the continuous engine with the batch-invariant kernels (one slot,
    no token budget, ``slots`` KV). Raises ValueError: a model the mode does not support."""

    def __init__(
        self,
        runner: ModelRunner,
        config: EngineConfig | None = None,
        store: ReferenceStore | None = None,
    ):
        super().__init__(runner, store)
        from engine.batching.continuous import ContinuousEngine

        base = config or EngineConfig()
        solo = EngineConfig(1, ignore_eos=base.ignore_eos, batch_invariant=True)
        self.engine = ContinuousEngine(runner, solo)

    def _mode(self) -> dict[str, Any]:
        # The batch-invariant kernels wrap the engines' matmul kernel (on a CPU) and size their
        # tiles by it, so its name is part of the key; so is every core module it runs through.
        skip = {"page", "bench"}
        sources = [
            p for p in sorted(_ENGINE.rglob("*.py")) if p.relative_to(_ENGINE).parts[0] not in skip
        ]
        return {
            "reference": "solo",
            "engine_kernel": self.runner.engine_kernel_name,
            "engine_config": dataclasses.asdict(self.engine.config),
            "code": code_digest(sources),
        }

    def _run(self, request: Request, on_step) -> tuple[list[int], Sequence[TokenLogits]]:
        alone = dataclasses.replace(request, request_id=0, arrival_s=0.0)  # a trace of one
        hook = None if on_step is None else (lambda trace, step: on_step())
        record = self.engine.run([alone], on_step=hook).request(0)
        return list(record.output_token_ids), record.token_logits


def reference_for(
    runner: ModelRunner, config: EngineConfig | None = None, store: ReferenceStore | None = None
) -> _Cache:
    """``SoloReference`` in batch-invariant mode, else ``ReferenceCache``."""
    if config is not None and config.batch_invariant:
        return SoloReference(runner, config, store)
    return ReferenceCache(runner, store)


class _EveryStep:
    """A ``StoppingCriteria`` that never stops generation, only calls ``callback()``."""

    def __init__(self, callback: Callable[[], None]):
        self.callback = callback

    def __call__(self, input_ids, scores, **kwargs) -> torch.Tensor:
        self.callback()
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)  # (B,)


def mismatches(
    outputs: dict[int, list[int]], reference: dict[int, list[int]], not_compared=()
) -> list[int]:
    skip = set(not_compared)
    return [rid for rid, ref in reference.items() if rid not in skip and outputs.get(rid) != ref]


def not_compared_ids(trace) -> list[int]:
    return [r.request_id for r in trace.requests if not r.comparable]


def comparison(record, reference: dict[int, list[int]] | None) -> str | None:
    """``MATCH``, ``MISMATCH`` or ``NOT_COMPARED`` for one record; None without its reference."""
    if not record.comparable:
        return NOT_COMPARED
    if reference is None or record.request_id not in reference:
        return None
    return MATCH if record.output_token_ids == reference[record.request_id] else MISMATCH
