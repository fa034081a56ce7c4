"""Our schedule beside vLLM's, step by step: how many steps plan alike, and the first that does not.

A step's *plan* is which requests it runs and how many tokens each: ``{request id: tokens}``,
read from a ``Trace``'s steps (``StepRecord.seqs``), ours as our engine ran and vLLM's as its own
record says (``engine.peers.vllm_record``). Two schedules are compared index by index: step ``i``
of ours against step ``i`` of vLLM's. A difference early on (one request admitted a step later)
can shift every later step, so the first difference, and why, says more than the fraction::

    step        0              1              2
    ours     {0: 9, 1: 7}   {0: 1, 1: 1}   {0: 1, 1: 1, 2: 12}
    vLLM     {0: 9, 1: 7}   {0: 1, 1: 1}   {0: 1, 1: 1}          <- first difference: step 2,
                                                                    "vLLM does not run R2 (ours:
                                                                    12 tokens)"

Beside the plans, each side's tallies: admissions (a request's first step, and its first after a
preemption), preemptions, and prefix-cache hits at admission (requests and cached tokens).
Plain Python over traces; nothing here runs an engine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from engine.trace import StepRecord, Trace

Plan = dict[int, int]  # request id -> tokens scheduled in the step


@dataclass(frozen=True)
class ScheduleTally:
    """What one schedule did, counted over its steps."""

    num_steps: int
    num_admissions: int  # first steps of a request, and first steps after each preemption
    num_preemptions: int
    num_prefix_hits: int  # admissions that started from cached prefix blocks
    num_prefix_cached_tokens: int  # tokens those admissions found cached


def step_plans(trace: Trace) -> list[Plan]:
    """Each step's plan, in step order."""
    return [step_plan(step) for step in trace.steps]


def step_plan(step: StepRecord) -> Plan:
    """``{request id: tokens}`` of one step."""
    return {seq.request_id: seq.num_new_tokens for seq in step.seqs}


def tally(trace: Trace) -> ScheduleTally:
    """Admissions, preemptions and prefix-cache hits of ``trace``'s schedule.

    A request is admitted at the first step that runs it while it is not running: its first,
    and its first after each preemption (a running request that a step skips, for the token
    budget, stays running). Its prefix-cache hit is its ``num_prefix_cached_tokens`` then.
    """
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


def compare_schedules(ours: Trace, vllm: Trace) -> dict:
    """Our schedule against vLLM's, step by step.

    Returns ``{"num_steps_ours", "num_steps_vllm", "equal_step_fraction", "first_difference",
    "ours", "vllm"}``: the step counts; the fraction (0..1) of step indices, out of the longer
    schedule's, whose plans are equal (1.0 when both are empty); ``{"step": i, "reason": one
    line}`` for the first index whose plans differ, or None; and each side's ``ScheduleTally``
    as a dict.
    """
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
    """One line on how step ``index``'s plans differ, e.g. ``vLLM runs R3 (12 tokens), ours
    does not; vLLM preempts R4 here``."""
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


def _tokens(n: int) -> str:
    return f"{n} token{'s' * (n != 1)}"
