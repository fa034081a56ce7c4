"""The copy budget: which packed weight copies the engines keep, within a bound on their bytes.

Pure (no torch); the rule and its pricing: docs/engines.md#kernels.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

from engine.kernels.kernel_plan import RowPlan
from engine.kernels.kernel_timing import Timings, choose_plan

FREE_KERNELS = ("linear", "skinny")  # kernels that keep no copy


@dataclasses.dataclass(frozen=True)
class DroppedCopy:
    """A copy the bound left out; a step pays ``step_ms`` more at ``at_rows``, its worst."""

    group: str
    kernel: str
    nbytes: int
    step_ms: float
    at_rows: int


@dataclasses.dataclass(frozen=True)
class CopyBudget:
    """Each group's plan; ``cost_ms``: what all drops together cost a step, by row count."""

    plans: dict[str, RowPlan]
    dropped: tuple[DroppedCopy, ...]
    kept_bytes: int
    bound_bytes: int
    cost_ms: dict[int, float]

    def summary(self) -> str:
        """E.g. ``"dropped onednn of 12 groups (300 MB): up to +4.1 ms a step at 512 rows"``."""
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
        return {
            "summary": self.summary(),
            "bound_bytes": self.bound_bytes,
            "kept_bytes": self.kept_bytes,
            "cost_ms_by_rows": {str(r): round(ms, 3) for r, ms in self.cost_ms.items()},
            "dropped": [dataclasses.asdict(copy) for copy in self.dropped],
        }


@dataclasses.dataclass(frozen=True, eq=False)  # one per timing, told apart by identity
class Pricing:
    """A kernel timing that prices groups: ms per pass over ``timed_bytes`` at ``rows[i]``."""

    plan: RowPlan
    rows: tuple[int, ...]
    times_ms: Mapping[str, tuple[float | None, ...]]
    timed_bytes: int

    @classmethod
    def of(cls, plan: RowPlan, timings: Timings) -> Pricing:
        return cls(plan, tuple(timings.rows), dict(timings.times_ms), timings.timed_bytes)


class _Table:
    """ms per pass over the timed weights, by kernel and row count."""

    def __init__(self, rows, times_ms):
        self.rows, self.times_ms = tuple(rows), times_ms

    def at_or_below(self, num_rows: int) -> int | None:
        """Index of the largest measured row count <= ``num_rows`` (None: none)."""
        below = [i for i, r in enumerate(self.rows) if r <= num_rows]
        return max(below, key=self.rows.__getitem__) if below else None

    @functools.cache  # noqa: B019  (one table per budget, a few kept sets)
    def pass_ms(self, kept: frozenset) -> tuple[float | None, ...]:
        times = {n: ts for n, ts in self.times_ms.items() if n in kept or n in FREE_KERNELS}
        plan = choose_plan(self.rows, times)
        return tuple(times[plan.name_at(r)][i] for i, r in enumerate(self.rows))

    def plan(self, kept: frozenset) -> RowPlan:
        times = {n: ts for n, ts in self.times_ms.items() if n in kept or n in FREE_KERNELS}
        return choose_plan(self.rows, times)

    def extra_ms(self, kept: frozenset, better: frozenset) -> list[float]:
        """ms per pass ``kept`` costs over ``better`` per row count; never below 0 (why:
        docs/engines.md#kernels)."""
        pairs = zip(self.pass_ms(kept), self.pass_ms(better), strict=True)
        return [0.0 if a is None or b is None else max(a - b, 0.0) for a, b in pairs]

    def per_token_ms(self, kept: frozenset, better: frozenset) -> float:
        extra = self.extra_ms(kept, better)
        return sum(ms / r for ms, r in zip(extra, self.rows, strict=True)) / len(self.rows)


def keep_copies(
    weights_bytes: Mapping[str, int],
    copy_bytes: Mapping[str, Mapping[str, int]],
    pricing: Mapping[str, Pricing],
    bound_bytes: int,
) -> CopyBudget:
    """The copies to keep, greedily by time saved per byte, within ``bound_bytes``;
    ``copy_bytes[group][kernel]``: bytes of each packed kernel's copy of the group's weights."""
    tables = {p: _Table(p.rows, dict(p.times_ms)) for p in set(pricing.values())}
    table = {g: tables[pricing[g]] for g in copy_bytes}
    packed = {g: [k for k in pricing[g].plan.kernels if k not in FREE_KERNELS] for g in copy_bytes}
    total = sum(copy_bytes[g][k] for g in copy_bytes for k in packed[g])
    if total <= bound_bytes:
        rows = sorted({r for p in tables for r in p.rows})
        plans = {g: pricing[g].plan for g in copy_bytes}
        return CopyBudget(plans, (), total, bound_bytes, dict.fromkeys(rows, 0.0))
    kept = {g: frozenset() for g in copy_bytes}
    share = {g: weights_bytes[g] / max(pricing[g].timed_bytes, 1) for g in copy_bytes}
    used = 0
    while True:
        best, best_rate = None, 0.0
        for g in copy_bytes:
            for k in packed[g]:
                nbytes = copy_bytes[g][k]
                if k in kept[g] or used + nbytes > bound_bytes:
                    continue
                rate = share[g] * table[g].per_token_ms(kept[g], kept[g] | {k}) / nbytes
                if rate > best_rate:
                    best, best_rate = (g, k), rate
        if best is None:
            break
        g, k = best
        kept[g] = kept[g] | {k}
        used += copy_bytes[g][k]
    plans = {g: pricing[g].plan for g in copy_bytes if not packed[g]}  # nothing to drop
    return _budget(copy_bytes, packed, kept, share, table, used, bound_bytes, plans)


def _budget(copy_bytes, packed, kept, share, table, used, bound_bytes, plans) -> CopyBudget:
    """The ``CopyBudget`` of the greedy's ``kept`` sets; ``plans``: groups with nothing to drop."""
    dropped = []
    rows = sorted({r for t in table.values() for r in t.rows})
    cost = dict.fromkeys(rows, 0.0)
    for g in copy_bytes:
        if g in plans:
            continue
        extra = table[g].extra_ms(kept[g], frozenset(packed[g]))
        for r in rows:
            i = table[g].at_or_below(r)
            cost[r] += 0.0 if i is None else share[g] * extra[i]
        for k in packed[g]:
            if k in kept[g]:
                continue
            saved = [share[g] * ms for ms in table[g].extra_ms(kept[g], kept[g] | {k})]
            worst = max(range(len(saved)), key=saved.__getitem__)
            dropped.append(DroppedCopy(g, k, copy_bytes[g][k], saved[worst], table[g].rows[worst]))
    plans = {g: plans[g] if g in plans else table[g].plan(kept[g]) for g in copy_bytes}
    return CopyBudget(plans, tuple(dropped), used, bound_bytes, cost)
