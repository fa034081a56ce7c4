"""Our schedule beside vLLM's, step by step: how many steps plan alike, and the first that does not.

A step's *plan* is ``{request id: tokens}``; one request admitted a step later shifts every later
step, so the first difference, and why, says more than the fraction::

    step        0              1              2
    ours     {0: 9, 1: 7}   {0: 1, 1: 1}   {0: 1, 1: 1, 2: 12}
    vLLM     {0: 9, 1: 7}   {0: 1, 1: 1}   {0: 1, 1: 1}          <- first difference: step 2
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

from engine.config import MAX_BLOCK_SIZE, EngineConfig
from engine.sequence import Request
from engine.trace import StepRecord, Trace

Plan = dict[int, int]  # request id -> tokens scheduled in the step
NULL_BLOCKS = 1  # vLLM's block 0, which no request holds
QUEUE_WAIT_S = 0.5  # a request reaches a quiet local server's scheduler within tens of ms


@dataclass(frozen=True)
class ScheduleTally:
    num_steps: int
    num_admissions: int  # first steps of a request, and first steps after each preemption
    num_preemptions: int
    num_prefix_hits: int  # admissions that started from cached prefix blocks
    num_prefix_cached_tokens: int  # tokens those admissions found cached


def step_plans(trace: Trace) -> list[Plan]:
    return [step_plan(step) for step in trace.steps]


def step_plan(step: StepRecord) -> Plan:
    return {seq.request_id: seq.num_new_tokens for seq in step.seqs}


def tally(trace: Trace) -> ScheduleTally:
    """Admissions (a step that runs a request not running), preemptions and prefix-cache hits."""
    running: set[int] = set()
    admissions = hits = cached = preemptions = 0
    for step in trace.steps:
        running -= set(step.preempted)
        preemptions += len(step.preempted)
        for seq in step.seqs:
            if seq.request_id in running:
                continue
            running.add(seq.request_id)
            admissions += 1
            hits += seq.num_prefix_cached_tokens > 0
            cached += seq.num_prefix_cached_tokens
    return ScheduleTally(len(trace.steps), admissions, preemptions, hits, cached)


def num_shared_prompt_blocks(requests: list[Request], block_size: int) -> int:
    """Full ``block_size``-token prompt blocks that the requests, in arrival order, could find
    cached from earlier prompts. A prefix cache serves the tokens before a prompt's last only, so a
    block counts only when its prompt goes on past it."""
    seen: set[tuple[int, ...]] = set()
    shared = 0
    for request in sorted(requests, key=lambda r: (r.arrival_s, r.request_id)):
        ids = request.prompt_token_ids
        num_servable = (len(ids) - 1) // block_size
        shared += sum(tuple(ids[: k * block_size]) in seen for k in range(1, num_servable + 1))
        seen.update(tuple(ids[: k * block_size]) for k in range(1, len(ids) // block_size + 1))
    return shared


def compare_schedules(ours: Trace, vllm: Trace) -> dict:
    """Our schedule against vLLM's: ``{"num_steps_ours", "num_steps_vllm", "equal_step_fraction"
    (0..1, of the longer schedule; 1.0 when both are empty), "first_difference" ({"step", "reason"}
    or None), "ours", "vllm" (each side's ``ScheduleTally``)}``."""
    a, b = step_plans(ours), step_plans(vllm)
    longest = max(len(a), len(b))
    num_equal = sum(x == y for x, y in zip(a, b, strict=False))
    first = next((i for i in range(longest) if i >= min(len(a), len(b)) or a[i] != b[i]), None)
    difference = None
    if first is not None:
        difference = {"step": first, "reason": difference_reason(ours, vllm, first)}
    return {
        "num_steps_ours": len(a),
        "num_steps_vllm": len(b),
        "equal_step_fraction": num_equal / longest if longest else 1.0,
        "first_difference": difference,
        "ours": asdict(tally(ours)),
        "vllm": asdict(tally(vllm)),
    }


def difference_reason(ours: Trace, vllm: Trace, index: int) -> str:
    """One line, e.g. ``vLLM runs R3 (12 tokens), ours does not; vLLM preempts R4 here``."""
    if index >= len(ours.steps) or index >= len(vllm.steps):
        longer, shorter = ("vLLM", ours) if index >= len(ours.steps) else ("ours", vllm)
        extra = max(len(ours.steps), len(vllm.steps)) - len(shorter.steps)
        return f"{longer} takes {extra} more step{'s' * (extra != 1)} (the other ends here)"
    a, b = step_plan(ours.steps[index]), step_plan(vllm.steps[index])
    clauses = []
    for rid in sorted(a.keys() | b.keys()):
        if rid not in b:
            clauses.append(f"vLLM does not run R{rid} (ours: {_tokens(a[rid])})")
        elif rid not in a:
            clauses.append(f"vLLM runs R{rid} ({_tokens(b[rid])}), ours does not")
        elif a[rid] != b[rid]:
            clauses.append(f"R{rid}: ours {_tokens(a[rid])}, vLLM {b[rid]}")
    for side, trace in (("ours", ours), ("vLLM", vllm)):
        preempted = trace.steps[index].preempted
        if preempted:
            clauses.append(f"{side} preempts {', '.join(f'R{r}' for r in preempted)} here")
    return "; ".join(clauses[:4])


def difference_causes(
    ours: Trace, vllm: Trace, run_dtype: str | None = None, served_dtype: str | None = None
) -> list[str]:
    return [
        *_arrival_causes(ours, vllm),
        *queue_causes(ours, vllm),
        *_slot_causes(ours, vllm),
        *_precision_causes(run_dtype, served_dtype),
        *_prefix_causes(ours, vllm),
    ]


def _arrival_causes(ours: Trace, vllm: Trace) -> list[str]:
    if "vllm" not in vllm.info:
        return []
    if any(r.arrival_s > 0 for r in ours.requests):
        return [
            "Arrivals: the client sends each request to vLLM at its arrival time, and vLLM "
            "schedules it from when it comes in, on its own clock (no step waits for it), while "
            "ours admits it at the end of the first step that ends after its arrival."
        ]
    late = [
        r.request_id for r in vllm.requests if vllm.steps and r.arrival_s > vllm.steps[0].start_s
    ]
    if not late:
        return []
    return [
        f"{_ids(late)} reached vLLM only after its first step began (each request comes over a "
        "connection of its own, and the first step waits for them a few seconds at most), while "
        "ours had every request queued before its step 0."
    ]


def first_step_wait_s(trace: Trace) -> float | None:
    """Seconds from the last arrival at or before the first step to that step's start; None without
    a step or an arrival before it."""
    if not trace.steps:
        return None
    start_s = trace.steps[0].start_s
    before = [r.arrival_s for r in trace.requests if r.arrival_s <= start_s]
    return start_s - max(before) if before else None


def queue_causes(ours: Trace, vllm: Trace) -> list[str]:
    """A sentence when vLLM's requests waited in its queue before its first step over
    ``QUEUE_WAIT_S`` longer than ours did; empty otherwise."""
    theirs, own = first_step_wait_s(vllm), first_step_wait_s(ours) or 0.0
    if theirs is None or theirs - own <= QUEUE_WAIT_S:
        return []
    why = "the server was busy, or the requests reached its scheduler late"
    limit_s = vllm.info.get("hold_limit_s")
    if limit_s and ours.requests and all(r.arrival_s == 0 for r in ours.requests):
        why += (
            f" (it holds a run's first step until all its requests are in, {limit_s:g} s at most)"
        )
    return [
        f"Queue: vLLM's first step began {theirs:.1f} s after the last request before it was "
        f"sent, ours {own:.2f} s after: the requests waited in vLLM's queue ({why}), so its "
        "times to first token include that wait."
    ]


def _slot_causes(ours: Trace, vllm: Trace) -> list[str]:
    if not vllm.num_slots or vllm.num_slots == ours.num_slots:
        return []
    return [f"Slots: vLLM runs up to {vllm.num_slots} sequences at once, ours {ours.num_slots}."]


def _precision_causes(run_dtype: str | None, served_dtype: str | None) -> list[str]:
    if not run_dtype or not served_dtype or run_dtype == served_dtype:
        return []
    return [
        f"Precision: vLLM computes in {served_dtype}, ours in {run_dtype}, so an output can end "
        "at another token and free its slot at another step."
    ]


def _prefix_causes(ours: Trace, vllm: Trace) -> list[str]:
    theirs, own = vllm.info.get("prefix_caching"), ours.info.get("prefix_caching")
    hits = tally(ours).num_prefix_hits, tally(vllm).num_prefix_hits
    if theirs is None or own is None or bool(theirs) == bool(own) or not any(hits):
        return []
    on = "vLLM caches prompt prefixes, ours does not"
    on = on if theirs else "ours caches prompt prefixes, vLLM does not"
    return [
        f"Prefix caching: {on}, and cached blocks were found ({hits[0]} of ours', "
        f"{hits[1]} of vLLM's admissions), so a prompt's prefill is shorter on that side."
    ]


def _ids(request_ids: list[int]) -> str:
    return ", ".join(f"R{r}" for r in request_ids[:4]) + (" …" if len(request_ids) > 4 else "")


def _tokens(n: int) -> str:
    return f"{n} token{'s' * (n != 1)}"


@dataclass(frozen=True)
class DeploymentSettings:
    """What a recording vLLM's ``start`` line says its schedule depends on."""

    max_num_seqs: int
    max_num_batched_tokens: int  # the token budget of one step
    block_size: int  # tokens per KV block
    num_kv_blocks: int  # blocks requests can hold: vLLM's ``num_blocks`` less its null block
    chunked_prefill: bool
    prefix_caching: bool
    async_scheduling: bool
    dtype: str | None = None  # the model's, as the server runs it; None in an older record

    @classmethod
    def from_start(cls, start: dict) -> DeploymentSettings:
        """Raises ValueError: a field is missing or of the wrong kind."""
        try:
            return cls(
                max_num_seqs=int(start["max_num_seqs"]),
                max_num_batched_tokens=int(start["max_num_batched_tokens"]),
                block_size=int(start["block_size"]),
                num_kv_blocks=int(start["num_blocks"]) - NULL_BLOCKS,
                chunked_prefill=bool(start["chunked_prefill"]),
                prefix_caching=bool(start["prefix_caching"]),
                async_scheduling=bool(start.get("async_scheduling", False)),
                dtype=str(start["dtype"]) if start.get("dtype") else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"the record's start line lacks the scheduler's settings ({exc!r}): is it a "
                "record of engine.peers.vllm_scheduler?"
            ) from None

    def describe(self) -> str:
        on = {True: "on", False: "off"}
        dtype = f", {self.dtype}" if self.dtype else ""
        return (
            f"max_num_seqs {self.max_num_seqs}, max_num_batched_tokens "
            f"{self.max_num_batched_tokens}, block size {self.block_size}, {self.num_kv_blocks} KV "
            f"blocks, chunked prefill {on[self.chunked_prefill]}, prefix caching "
            f"{on[self.prefix_caching]}{dtype}"
        )


def followed_config(
    settings: DeploymentSettings, config: EngineConfig, kv_bytes_per_token: int
) -> tuple[EngineConfig, list[str]]:
    """``config`` with the deployment's settings (docs/bench.md), and one line per setting ours
    cannot follow; ``kv_bytes_per_token`` turns its blocks into our KV budget."""
    notes = []
    if not settings.chunked_prefill:
        notes.append(
            "chunked prefill: the deployment's is off, ours chunks a prompt whenever the token "
            "budget binds"
        )
    if settings.async_scheduling:
        notes.append(
            "async scheduling: the deployment schedules a step before the previous one's tokens "
            "are back, ours after"
        )
    budget = max(settings.max_num_batched_tokens, settings.max_num_seqs)
    followed = dataclasses.replace(
        config, num_slots=settings.max_num_seqs, max_num_batched_tokens=budget
    )
    if config.kv_mode != "paged":
        notes.append(
            f"KV cache: ours keeps a cache per slot ({config.kv_mode}), the deployment pages "
            f"{settings.num_kv_blocks} blocks of {settings.block_size} tokens (continuous_paged "
            "follows them)"
        )
        if settings.prefix_caching:
            notes.append("prefix caching: the deployment's is on; ours needs the paged KV cache")
        return followed, notes
    block_size = settings.block_size
    if not 1 <= block_size <= MAX_BLOCK_SIZE:
        notes.append(
            f"block size: the deployment's {block_size}, ours {config.block_size} "
            f"(ours takes 1 to {MAX_BLOCK_SIZE} tokens)"
        )
        block_size = config.block_size
    block_bytes = kv_bytes_per_token * block_size
    kv_budget_mib = settings.num_kv_blocks * block_bytes / 2**20  # exact: 2**20 is a power of 2
    followed = dataclasses.replace(
        followed,
        block_size=block_size,
        kv_budget_mib=kv_budget_mib,
        prefix_caching=settings.prefix_caching,
    )
    return followed, notes
