"""The kernel plan: which matmul kernel the engines run at which row count.

A ``RowPlan`` gives each range of row counts one candidate of ``linear_kernel``; a
``PlannedLinear`` runs it on one weight (or several stacked), picking per call by row count.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping
from typing import NamedTuple

import torch
from torch import nn

from engine.kernels import linear_kernel
from engine.kernels.linear_kernel import (
    HALF_DTYPES,
    MAX_GEMV_ROWS,
    BoundLinear,
    LinearForward,
    bind,
)


@dataclasses.dataclass(frozen=True)
class RowPlan:
    """Which kernel runs at each row count M (the rows of a linear's input: one per token the
    step computes), as ranges that start at ``starts``::

        starts   1          5          64
        names    linear     onednn     skinny
        M        1 .. 4     5 .. 63    64 and up

    Raises:
        ValueError: ``starts`` do not ascend from 1, or there is not one name per start.
    """

    starts: tuple[int, ...]
    names: tuple[str, ...]

    def __post_init__(self):
        starts, names = self.starts, self.names
        ascending = all(isinstance(s, int) and s >= 1 for s in starts) and all(
            a < b for a, b in zip(starts, starts[1:], strict=False)
        )
        if not (len(starts) == len(names) >= 1 and starts[0] == 1 and ascending):
            raise ValueError(
                f"a row plan needs starts ascending from 1 and one kernel name each "
                f"(got starts {starts!r}, names {names!r})"
            )

    @classmethod
    def single(cls, name: str) -> RowPlan:
        return cls((1,), (name,))

    def name_at(self, num_rows: int) -> str:
        """0 rows: the first range's."""
        return self.names[max(bisect.bisect_right(self.starts, num_rows) - 1, 0)]

    @property
    def kernels(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.names))

    @property
    def label(self) -> str:
        """E.g. ``"onednn"`` or ``"linear+onednn"``."""
        return "+".join(self.names)

    def ranges(self) -> list[tuple[int, int | None, str]]:
        """``(first M, last M or None: no end, kernel)`` per range."""
        ends = [s - 1 for s in self.starts[1:]] + [None]
        return list(zip(self.starts, ends, self.names, strict=True))

    def describe(self, up_to: int | None = None) -> str:
        """E.g. ``"linear 1-4 rows, onednn 5+ rows"``; ``up_to``: within 1 .. ``up_to`` rows."""
        if len(self.names) == 1 and up_to is None:
            return f"{self.names[0]} at every row count"
        parts = []
        for lo, hi, name in self.ranges():
            if up_to is not None and lo > up_to:
                break
            hi = up_to if hi is None or (up_to is not None and hi > up_to) else hi
            parts.append(f"{name} {lo}+ rows" if hi is None else f"{name} {lo}-{hi} rows")
        return ", ".join(parts)


class Kernel(NamedTuple):
    """The engines' kernel for a model; ``modules`` None where ``forward`` serves them all."""

    forward: LinearForward
    extra_bytes: int
    plan: RowPlan  # "none" (no linears to route: CUDA, MPS), else names from CANDIDATES
    modules: ModuleKernels | None = None

    @property
    def name(self) -> str:
        return self.plan.label

    def installed(self, linears: list[nn.Linear]):
        """Context: each of ``linears`` runs this kernel; AssertionError if a weight changed."""
        if self.modules is None:
            return linear_kernel.installed(linears, self.forward)
        return self.modules.installed(linears)


NO_KERNEL = Kernel(nn.Linear.forward, 0, RowPlan.single("none"))  # the device's own matmul
PLAIN_KERNEL = NO_KERNEL._replace(plan=RowPlan.single("linear"))  # the same, named for the plan
KERNEL_CHOICES = {  # CBP_ENGINE_KERNEL
    "auto": "the fastest per row count, measured at the first start and kept in the cache folder",
    "measure": "as auto, measured again at this start",
    "linear": "F.linear everywhere",
    "skinny": "MKL as (W @ x.T).T everywhere, without packed weight copies",
    "onednn": "oneDNN on packed weight copies everywhere",
    "onednn_f32": "oneDNN on float32 copies of half-precision weights everywhere",
    "gemv": "this project's C++ kernel up to 16 rows (F.linear above), where it builds",
}


def bind_plan(
    plan: RowPlan, weight: torch.Tensor, bias: torch.Tensor | None, given: Mapping | None = None
) -> dict:
    """Each kernel of ``plan`` bound to ``weight`` [N, K] by name (``given``'s where it has one).
    gemv drops the weight where the plan gives larger row counts to another kernel."""
    given = given or {}
    bound = {name: _bound(name, given.get(name), weight, bias) for name in plan.kernels}
    if "gemv" in bound and plan.name_at(MAX_GEMV_ROWS + 1) != "gemv":
        bound["gemv"].weight = None
    return bound


def _bound(name: str, given, weight: torch.Tensor, bias: torch.Tensor | None) -> BoundLinear:
    if given is None:
        return bind(name, weight, bias)
    return given if isinstance(given, BoundLinear) else given(weight, bias)


class PlannedLinear:
    """One or several stacked ``nn.Linear`` weights behind one matmul that runs the plan's kernel
    for its row count; ``kernel``: a plan or one kernel's name.

    Shapes:
        weights: [N_i, K] each  ->  stacked [N, K], N = sum N_i;  x: [..., K]  ->  [..., N]
    """

    def __init__(self, linears: list[nn.Linear], kernel: str | RowPlan, given=None):
        plan = RowPlan.single(kernel) if isinstance(kernel, str) else kernel
        self.plan = plan
        weight = _stack([m.weight.detach() for m in linears])  # (N, K)
        bias = None if linears[0].bias is None else _stack([m.bias.detach() for m in linears])
        self.stacked_bytes = weight.numel() * weight.element_size() if len(linears) > 1 else 0
        bound = bind_plan(plan, weight, bias, given)  # gemv keeps the stacked copy only if it must
        self.bound = list(bound.values())
        self.kernel_names = tuple(bound)  # one per ``bound``
        # by_rows[M]: the kernel at M rows, up to the last range's start (then the last's)
        self._by_rows = [bound[plan.name_at(m)] for m in range(plan.starts[-1] + 1)]
        self._last = len(self._by_rows) - 1

    @property
    def extra_bytes(self) -> int:
        """Bytes of packed and stacked copies beyond the model's weights."""
        packed = sum(b.extra_bytes for b in self.bound)
        plain = any(b.weight is not None for b in self.bound)  # a kernel keeps the stacked copy
        return packed + (self.stacked_bytes if plain else 0)

    def bytes_by_kernel(self) -> dict[str, int]:
        """``extra_bytes`` by kernel (the stacked copy as ``"stacked"``)."""
        by_kernel = {n: b.extra_bytes for n, b in zip(self.kernel_names, self.bound, strict=True)}
        by_kernel = {n: nbytes for n, nbytes in by_kernel.items() if nbytes}
        if self.stacked_bytes and any(b.weight is not None for b in self.bound):
            by_kernel["stacked"] = self.stacked_bytes
        return by_kernel

    def kernel_at(self, num_rows: int) -> BoundLinear:
        return self._by_rows[min(num_rows, self._last)]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # kernel_at inlined: this runs once per linear per step (docs/measurements.md)
        return self._by_rows[min(x.numel() // x.shape[-1], self._last)](x)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.kernel_at(x.numel() // x.shape[-1]).add(x, residual)


def _stack(tensors: list[torch.Tensor]) -> torch.Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


def kernel_for(
    linears: list[nn.Linear], plan: RowPlan, plans: Mapping[nn.Linear, RowPlan] | None = None
) -> Kernel:
    """``plan`` on ``linears`` (``plans[module]`` where given); RuntimeError: oneDNN refused."""
    if not linears:
        return NO_KERNEL
    modules = ModuleKernels(linears, plan, plans)
    extra_bytes = sum(p.extra_bytes for p in modules.planned.values())
    return Kernel(modules.forward, extra_bytes, plan, modules)


class ModuleKernels:
    """Each module's ``PlannedLinear``, and its weight's version when packed: a weight changed
    after packing fails an assert. The gemv copies lie end to end in the order of ``linears``."""

    def __init__(self, linears: list[nn.Linear], plan: RowPlan, plans: Mapping | None = None):
        plans = plans or {}
        self.planned = {m: PlannedLinear([m], plans.get(m, plan)) for m in linears}
        bound = [b for p in self.planned.values() for b in p.bound]
        linear_kernel.gather_packed([b for b in bound if isinstance(b, linear_kernel.GemvLinear)])
        packed = any(b.packed is not None for p in self.planned.values() for b in p.bound)
        self.versions = {m: (m.weight, m.weight._version) for m in linears} if packed else {}

    def forward(self, module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        if self.versions:
            weight, version = self.versions[module]
            assert weight._version == version, "weight changed after packing"
        return self.planned[module](x)

    def installed(self, linears: list[nn.Linear]):
        for module in linears:
            if module in self.versions:
                weight, version = self.versions[module]
                assert weight._version == version, "weight changed after packing"
        return linear_kernel.installed(linears, self.forward, self.planned)


_FALLBACKS = {  # a named kernel, then what stands in where oneDNN refuses the weights
    "linear": ("linear",),
    "skinny": ("skinny",),
    "onednn": ("onednn", "onednn_f32", "skinny"),
    "onednn_f32": ("onednn_f32", "skinny"),
    "gemv": ("gemv", "skinny"),
}


def best_kernel(linears: list[nn.Linear], choice: str = "onednn") -> Kernel:
    """The kernel ``choice`` at every row count, or the nearest that works here (``_FALLBACKS``:
    ``onednn_f32`` only for half-precision weights)."""
    half = bool(linears) and linears[0].weight.dtype in HALF_DTYPES
    for name in _FALLBACKS[choice]:
        if name == "onednn_f32" and choice == "onednn" and not half:
            continue  # the float32 copies are for half-precision weights oneDNN refused
        try:
            return kernel_for(linears, RowPlan.single(name))
        except RuntimeError:
            continue
    raise AssertionError("skinny never fails")  # pragma: no cover
