"""The copy budget: which packed weight copies the engines keep, within a bound on their bytes.

Each packed kernel of a plan (oneDNN's layout, the gemv kernel's) holds one copy of every weight
it serves, so a plan of two packed kernels holds the weights three times. ``keep_copies`` keeps
the copies in order of the time they save per byte (greedy) while they fit the bound; a group
whose copy is dropped runs, at each row count, the fastest kernel it still has (``choose_plan``
over its kept kernels and the free ones, ``F.linear`` and ``skinny``).

A copy's worth comes from the kernel timing (``engine.kernels.kernel_timing``): ms per pass over
the timed linears at each row count, shared among linears by their weights' bytes (a pass streams
each weight once, so its time follows the bytes). Worth is time per token, averaged over the
measured row counts: a decode step of few rows pays each ms for few tokens, so a decode kernel's
copy ranks above a prefill kernel's that saves as many ms over 512 rows.

A group is the linears kept or dropped together (those the fused layers stack into one matmul
share a plan). Pure: no torch, no tensors; the runner (``engine.model.kernel_choice``) builds
the inputs from the model.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

from engine.kernels.kernel_plan import RowPlan
from engine.kernels.kernel_timing import choose_plan

FREE_KERNELS = ("linear", "skinny")  # kernels that keep no copy


@dataclasses.dataclass(frozen=True)
class DroppedCopy:
    """A copy the bound left out: its group, kernel and bytes, and what a step pays for it
    (``step_ms`` more at ``at_rows`` rows, the row count where it costs most)."""

    group: str
    kernel: str
    nbytes: int
    step_ms: float
    at_rows: int


@dataclasses.dataclass(frozen=True)
class CopyBudget:
    """Each group's plan (``plans``), the copies dropped, the bytes kept against the bound, and
    the ms a step pays at each measured row count for all drops together (``cost_ms``)."""

    plans: dict[str, RowPlan]
    dropped: tuple[DroppedCopy, ...]
    kept_bytes: int
    bound_bytes: int
    cost_ms: dict[int, float]

    def summary(self) -> str:
        """One line for people: ``"none dropped"`` or ``"dropped onednn of 12 groups (300 MB),
        up to +4.1 ms a step at 512 rows"``."""
        if not self.dropped:
            return "no weight copy dropped"
        by_kernel: dict[str, list[DroppedCopy]] = {}
        for copy in self.dropped:
            by_kernel.setdefault(copy.kernel, []).append(copy)
        parts = [
            f"{name} of {len(copies)} groups ({sum(c.nbytes for c in copies) / 1e6:.0f} MB)"
            for name, copies in by_kernel.items()
        ]
        rows, ms = max(self.cost_ms.items(), key=lambda item: item[1])
        return f"dropped {', '.join(parts)}: up to +{ms:.1f} ms a step at {rows} rows"

    def as_dict(self) -> dict:
        """JSON-ready: ``{"bound_bytes", "kept_bytes", "cost_ms_by_rows", "dropped": [...],
        "summary"}``."""
        return {
            "summary": self.summary(),
            "bound_bytes": self.bound_bytes,
            "kept_bytes": self.kept_bytes,
            "cost_ms_by_rows": {str(r): round(ms, 3) for r, ms in self.cost_ms.items()},
            "dropped": [dataclasses.asdict(copy) for copy in self.dropped],
        }


class _Table:
    """ms per pass over the timed weights, by kernel and row count."""

    def __init__(self, rows, times_ms):
        self.rows, self.times_ms = tuple(rows), times_ms

    @functools.cache  # noqa: B019  (one table per budget, a few kept sets)
    def pass_ms(self, kept: frozenset) -> tuple[float | None, ...]:
        """ms per pass at each row count of the plan over ``kept`` and the free kernels."""
        times = {n: ts for n, ts in self.times_ms.items() if n in kept or n in FREE_KERNELS}
        plan = choose_plan(self.rows, times)
        return tuple(times[plan.name_at(r)][i] for i, r in enumerate(self.rows))

    def plan(self, kept: frozenset) -> RowPlan:
        """The plan over ``kept`` and the free kernels."""
        times = {n: ts for n, ts in self.times_ms.items() if n in kept or n in FREE_KERNELS}
        return choose_plan(self.rows, times)

    def extra_ms(self, kept: frozenset, better: frozenset) -> list[float]:
        """ms per pass that ``kept`` costs over ``better`` at each row count (0 unmeasured)."""
        pairs = zip(self.pass_ms(kept), self.pass_ms(better), strict=True)
        return [0.0 if a is None or b is None else a - b for a, b in pairs]

    def per_token_ms(self, kept: frozenset, better: frozenset) -> float:
        """``extra_ms`` per token (one row each), averaged over the row counts."""
        extra = self.extra_ms(kept, better)
        return sum(ms / r for ms, r in zip(extra, self.rows, strict=True)) / len(self.rows)


def keep_copies(
    weights_bytes: Mapping[str, int],
    copy_bytes: Mapping[str, Mapping[str, int]],
    plan: RowPlan,
    rows: tuple[int, ...],
    times_ms: Mapping[str, tuple[float | None, ...]],
    timed_bytes: int,
    bound_bytes: int,
) -> CopyBudget:
    """The copies to keep, greedily by time saved per byte, within ``bound_bytes``.

    ``weights_bytes[group]``: the group's weights' bytes (its share of a pass's time);
    ``copy_bytes[group][kernel]``: the bytes of ``kernel``'s copy of the group's weights, for
    each packed kernel of ``plan``; ``rows``, ``times_ms``, ``timed_bytes``: the kernel timing
    (``Timings``), ms per pass over ``timed_bytes`` of weights. Where every copy fits, each group
    keeps ``plan`` as it is. Else, from no copies: the copy that saves the most time per token
    per byte (first in ``copy_bytes``' order on a tie) and still fits is kept, until none fits or
    saves time; each group's plan is then ``choose_plan`` over its kept and free kernels.
    """
    table = _Table(rows, dict(times_ms))
    packed = [k for k in plan.kernels if k not in FREE_KERNELS]
    total = sum(copy_bytes[g][k] for g in copy_bytes for k in packed)
    if total <= bound_bytes:
        no_cost = dict.fromkeys(rows, 0.0)
        return CopyBudget(dict.fromkeys(copy_bytes, plan), (), total, bound_bytes, no_cost)
    kept = {g: frozenset() for g in copy_bytes}
    share = {g: weights_bytes[g] / timed_bytes for g in copy_bytes}
    used = 0
    while True:
        best, best_rate = None, 0.0
        for g in copy_bytes:
            for k in packed:
                nbytes = copy_bytes[g][k]
                if k in kept[g] or used + nbytes > bound_bytes:
                    continue
                rate = share[g] * table.per_token_ms(kept[g], kept[g] | {k}) / nbytes
                if rate > best_rate:
                    best, best_rate = (g, k), rate
        if best is None:
            break
        g, k = best
        kept[g] = kept[g] | {k}
        used += copy_bytes[g][k]
    return _budget(copy_bytes, packed, kept, share, table, used, bound_bytes)


def _budget(copy_bytes, packed, kept, share, table: _Table, used, bound_bytes) -> CopyBudget:
    """The ``CopyBudget`` of the greedy's ``kept`` sets."""
    dropped = []
    cost = dict.fromkeys(table.rows, 0.0)
    for g in copy_bytes:
        every = frozenset(packed)
        for r, ms in zip(table.rows, table.extra_ms(kept[g], every), strict=True):
            cost[r] += share[g] * ms
        for k in packed:
            if k in kept[g]:
                continue
            extra = [share[g] * ms for ms in table.extra_ms(kept[g], kept[g] | {k})]
            worst = max(range(len(extra)), key=extra.__getitem__)
            dropped.append(DroppedCopy(g, k, copy_bytes[g][k], extra[worst], table.rows[worst]))
    plans = {g: table.plan(kept[g]) for g in copy_bytes}
    return CopyBudget(plans, tuple(dropped), used, bound_bytes, cost)
