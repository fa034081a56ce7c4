"""Divergence verdicts: where an output left its reference, and whether rounding explains it.
``"match"`` (✓), ``"near-tie"`` (≈: both runs' margins within the rounding bound
``e_v = (u + gamma_d) A_v + u |z_v|``, after Higham, *Accuracy and Stability of Numerical
Algorithms*, §3.1) or ``"differs"`` (✗). Derivation and limits: docs/precision.md."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace

import torch

from engine.token_logits import TokenLogits, same_logits

MATCH, NEAR_TIE, DIFFERS = "match", "near-tie", "differs"
SYMBOLS = {MATCH: "✓", NEAR_TIE: "≈", DIFFERS: "✗"}
NUM_SHOWN = 5  # top logits the divergence view shows per run
ACCUMULATION_ROUNDOFF = 2.0**-24  # float32 accumulators in CPU and CUDA matmul kernels


def unit_roundoff(dtype: torch.dtype) -> float:
    """``u``: half the gap between 1 and the next number (2**-24, 2**-11, 2**-8)."""
    return torch.finfo(dtype).eps / 2


@dataclass(frozen=True)
class RoundingModel:
    """The rounding error model of one run's logits (docs/precision.md)."""

    unit_roundoff: float  # u of the dtype hidden states and logits are stored in
    hidden_size: int  # d
    reduced_precision_reduction: bool = False  # CUDA half matmul: split-K partials in the dtype

    def logit_error(self, abs_dot: float, logit: float) -> float:
        """``e_v``: how far one run's last stage can move a logit ``z_v`` (``A_v = abs_dot``)."""
        d_u = self.hidden_size * ACCUMULATION_ROUNDOFF
        gamma = d_u / (1 - d_u)
        extra = self.unit_roundoff if self.reduced_precision_reduction else 0.0
        return (self.unit_roundoff + gamma + extra) * abs_dot + self.unit_roundoff * abs(logit)


def rounding_model(dtype: torch.dtype, hidden_size: int, device_type: str = "cpu") -> RoundingModel:
    reduced = False
    if device_type == "cuda" and dtype in (torch.float16, torch.bfloat16):
        matmul = torch.backends.cuda.matmul
        flag = "fp16" if dtype == torch.float16 else "bf16"
        reduced = bool(getattr(matmul, f"allow_{flag}_reduced_precision_reduction", False))
    return RoundingModel(unit_roundoff(dtype), hidden_size, reduced)


def first_divergence(output: list[int], reference: list[int]) -> int | None:
    for i, (a, b) in enumerate(zip(output, reference, strict=False)):
        if a != b:
            return i
    return None if len(output) == len(reference) else min(len(output), len(reference))


_RECORDS = ("reference_logits", "engine_logits")  # a ``Verdict``'s logit records: JSON as ``*_run``


@dataclass(frozen=True)
class Verdict:
    request_id: int
    verdict: str  # MATCH | NEAR_TIE | DIFFERS
    token_index: int | None = None  # k: first differing output position; common prefix = [:k]
    reference_token: int | None = None  # None: the reference ended at k
    engine_token: int | None = None  # None: the engine's output ended at k
    reference_logits: TokenLogits | None = None  # the reference run's logits at k
    engine_logits: TokenLogits | None = None  # the engine run's logits at k (None: not recorded)
    logit_margin: float | None = None  # reference run: z_a - z_b (>= 0)
    engine_margin: float | None = None  # engine run: z'_b - z'_a (>= 0)
    rounding_bound: float | None = None  # e_a + e_b + e'_a + e'_b
    logits_equal: bool | None = None  # match only: both runs' logits bitwise equal everywhere
    reason: str = ""  # one line for people

    @property
    def symbol(self) -> str:
        return SYMBOLS[self.verdict]

    @property
    def label(self) -> str:
        """The outputs table's cell: "✓", "≈ near-tie at token 17" or "✗ differs at token 4"."""
        if self.verdict == MATCH:
            return self.symbol
        return f"{self.symbol} {self.verdict} at token {self.token_index}"

    def to_dict(self, decode: Callable[[list[int]], str] | None = None) -> dict:
        """JSON-ready fields; ``decode`` (ids -> text) adds each shown token's text."""

        def side(rec: TokenLogits | None) -> dict | None:
            if rec is None:
                return None
            top = [
                {"token_id": t, "logit": z, **({"text": decode([t])} if decode else {})}
                for t, z in zip(rec.token_ids[:NUM_SHOWN], rec.logits[:NUM_SHOWN], strict=True)
            ]
            return {
                "reference_token_logit": rec.logit_of(self.reference_token),  # None: ended
                "engine_token_logit": rec.logit_of(self.engine_token),
                "hidden_norm": rec.hidden_norm,
                "top": top,
            }

        kept = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _RECORDS}
        return kept | {
            "symbol": self.symbol,
            "label": self.label,
            "reference_run": side(self.reference_logits),
            "engine_run": side(self.engine_logits),
        }


def judge(
    request_id: int,
    output: list[int],
    reference: list[int],
    reference_logits: Sequence[TokenLogits] | None,
    engine_logits: Sequence[TokenLogits] | None,
    model: RoundingModel,
    reference_lookup: Callable[[int, int], tuple[float, float] | None] | None = None,
    sampled: bool = False,
) -> Verdict:
    """The ``Verdict`` of ``output`` against ``reference``.

    ``*_logits[i]``: the runs' records at output position i (None or short: not recorded).
    ``reference_lookup(k, token)``: ``(logit, abs_dot)`` of a token outside the reference's top at
    position k (None: unknown). A ``sampled`` request's split is "differs" (no near-tie test).
    """
    k = first_divergence(output, reference)
    if k is None:
        equal = same_logits(engine_logits, reference_logits)
        return Verdict(request_id, MATCH, logits_equal=equal, reason="same tokens")
    a = reference[k] if k < len(reference) else None
    b = output[k] if k < len(output) else None
    ref = reference_logits[k] if reference_logits and k < len(reference_logits) else None
    eng = engine_logits[k] if engine_logits and k < len(engine_logits) else None
    found = Verdict(request_id, DIFFERS, k, a, b, ref, eng)
    if a is None or b is None:
        return replace(found, reason="one output ended where the other went on")
    if sampled:
        return replace(found, reason="sampled tokens: the near-tie test is for greedy tokens only")
    if ref is None:
        return replace(found, reason="the reference's logits were not recorded")
    z_a, z_b, abs_b = ref.logit_of(a), ref.logit_of(b), ref.abs_dot_of(b)
    if z_b is None and reference_lookup is not None:
        z_b, abs_b = reference_lookup(k, b) or (None, None)
    if z_b is None:
        why = f"the engine's token is not in the reference's top {len(ref.token_ids)}"
        return replace(found, reason=why)
    margin = z_a - z_b
    bound = model.logit_error(ref.abs_dot_of(a), z_a) + model.logit_error(abs_b, z_b)
    if eng is None:  # no engine logits: the reference's errors count twice
        return _weigh(found, margin, None, 2 * bound)
    y_a, y_b = eng.logit_of(a), eng.logit_of(b)
    if y_a is None or y_b is None:
        whose = "reference's" if y_a is None else "engine's own"
        why = f"the {whose} token is not in the engine's top {len(eng.token_ids)}"
        return replace(found, logit_margin=margin, reason=why)
    bound += model.logit_error(eng.abs_dot_of(a), y_a) + model.logit_error(eng.abs_dot_of(b), y_b)
    return _weigh(found, margin, y_b - y_a, bound)


def _weigh(found: Verdict, margin: float, engine_margin: float | None, bound: float) -> Verdict:
    gap = margin + (engine_margin or 0.0)
    near = gap <= bound
    reason = (
        f"the two runs' margins add up to {gap:.4g} logits, "
        f"{'within' if near else 'beyond'} the rounding bound {bound:.4g}"
    )
    return replace(
        found,
        verdict=NEAR_TIE if near else DIFFERS,
        logit_margin=margin,
        engine_margin=engine_margin,
        rounding_bound=bound,
        reason=reason,
    )


def count(verdicts: list[Verdict]) -> dict[str, int]:
    return {
        f"num_{name.replace('-', '_')}": sum(1 for v in verdicts if v.verdict == name)
        for name in (MATCH, NEAR_TIE, DIFFERS)
    }


def judge_runs(runner, source, requests, traces: dict) -> dict[str, dict[int, dict]]:
    """Every engine's verdicts with the texts the divergence view shows (``Verdict.to_dict`` and, at
    a split, the token texts), so nothing after a run reads the model."""
    decode = runner.tokenizer.decode
    judged = {}
    for name, trace in traces.items():
        entries = {}
        for request_id, verdict in source.verdicts(requests, trace).items():
            entry = verdict.to_dict(decode)
            k = verdict.token_index
            if k is not None:
                output = trace.request(request_id).output_token_ids
                entry["prefix_text"] = decode(output[:k])
                entry["reference_token_text"] = _token_text(decode, verdict.reference_token)
                entry["engine_token_text"] = _token_text(decode, verdict.engine_token)
            entries[request_id] = entry
        judged[name] = entries
    return judged


def _token_text(decode: Callable[[list[int]], str], token_id: int | None) -> str:
    return "(the output ended here)" if token_id is None else repr(decode([token_id]))
