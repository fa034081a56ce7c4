"""The linear kernel: a faster CPU matmul for the engines' linears, same sums as ``F.linear``.

The candidates (``CANDIDATES``: linear, skinny, onednn, onednn_f32, gemv) and their packed copies:
docs/engines.md#kernels.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import itertools
import sys
from collections.abc import Callable, Iterator, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels import gemv_build

MAX_SKINNY_ROWS = 64  # above this many rows plain F.linear is as fast as (W @ x.T).T
MAX_GEMV_ROWS = 16  # above this many rows gemv's passes (8 rows each) lose to any GEMM
TRIM_ELEMENTS = 1 << 23  # gather_packed hands freed copies to the OS each time it copies this many
GEMV_BLOCK = 16  # outputs per block of the gemv kernel's packed layout (csrc/gemv.cpp, kBlock)
CANDIDATES = ("linear", "skinny", "onednn", "onednn_f32", "gemv")
HALF_DTYPES = (torch.bfloat16, torch.float16)

LinearForward = Callable[[nn.Linear, torch.Tensor], torch.Tensor]


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """``F.linear`` as ``(weight @ x.T).T`` up to 64 rows.
    Shapes: x [..., K];  weight [N, K];  bias [N] or None  ->  [..., N]"""
    rows = x.reshape(-1, x.shape[-1])  # (M, K)
    num_rows = rows.shape[0]
    if num_rows > MAX_SKINNY_ROWS or num_rows == 0:
        return F.linear(x, weight, bias)
    if num_rows == 1:
        rows = torch.cat((rows, rows))  # (2, K): a real copy; an expanded view is slow again
    out = (weight @ rows.T).T[:num_rows].contiguous()  # (M, N)
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], weight.shape[0])


def skinny_forward(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return skinny_linear(x, module.weight, module.bias)


def onednn_pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [N, K] in oneDNN's blocked layout; RuntimeError where oneDNN cannot."""
    if not torch.backends.mkldnn.is_available():
        raise RuntimeError("this torch build has no oneDNN (mkldnn)")
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None):
    """``F.linear(x, W, bias)`` with ``packed = onednn_pack(W)``.
    Shapes: x [..., K];  packed [N, K];  bias [N] or None  ->  [..., N]"""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class BoundLinear:
    """``F.linear`` on one weight, the base of the other candidates; ``weight`` is None where a
    kernel keeps only a packed copy; ``add(x, residual)`` is ``residual + self(x)``.

    Shapes:
        weight: [N, K];  bias: [N] or None;  x: [..., K]  ->  [..., N]
    """

    packed: torch.Tensor | None = None

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.weight, self.bias = weight, bias

    @property
    def extra_bytes(self) -> int:
        return 0 if self.packed is None else torch.ops.mkldnn._nbytes(self.packed)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return residual + self(x)


class SkinnyLinear(BoundLinear):
    """``skinny_linear`` on one weight."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return skinny_linear(x, self.weight, self.bias)


class PackedLinear(BoundLinear):
    """oneDNN on a packed copy of one weight (not kept); RuntimeError where oneDNN refuses it."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__(None, bias)
        self.packed = onednn_pack(weight)
        with torch.inference_mode():
            onednn_linear(weight.new_zeros(1, weight.shape[1]), self.packed, bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return onednn_linear(x, self.packed, self.bias)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        op = torch.ops.mkldnn._linear_pointwise.binary
        return op(x, residual, self.packed, self.bias, "add")


class UpcastLinear(BoundLinear):
    """oneDNN on a float32 copy of a half-precision weight, for CPUs without a half kernel; one
    row runs ``F.linear`` on the half weight. Why: docs/engines.md#kernels.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__(weight, bias)  # the half weight, for single rows
        self.packed = onednn_pack(weight.detach().float())
        self.bias32 = None if bias is None else bias.detach().float()
        with torch.inference_mode():
            onednn_linear(weight.new_zeros(2, weight.shape[1]).float(), self.packed)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() == x.shape[-1]:  # one row
            return F.linear(x, self.weight, self.bias)
        return onednn_linear(x.float(), self.packed, self.bias32).to(x.dtype)


class GemvLinear(BoundLinear):
    """The gemv kernel (``torch.ops.cbp_gemv``) on a packed copy of one weight (``packed``: one
    made already); ``F.linear`` above ``MAX_GEMV_ROWS`` rows.

    Raises:
        RuntimeError: the kernel is not built here (the reason in the message), or it does not
            take this weight (not float32 or bfloat16).
        ValueError: ``packed`` does not have the weight's packed shape and dtype.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, packed=None):
        reason = gemv_build.unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        super().__init__(weight, bias)
        self.num_out = weight.shape[0]
        self.max_numel = MAX_GEMV_ROWS * weight.shape[1]  # of an input it takes
        if packed is None:
            with torch.inference_mode():
                packed = torch.ops.cbp_gemv.pack(weight.detach())
        elif packed.shape != gemv_packed_shape(weight) or packed.dtype != weight.dtype:
            raise ValueError("the packed copy given is not this weight's layout")
        self.packed = packed
        self.shares_packed = False  # True: another kernel's copy counts these bytes
        self._op = torch.ops.cbp_gemv.linear.default  # the overload: no resolution per call

    @property
    def extra_bytes(self) -> int:
        if self.shares_packed:
            return 0
        return self.packed.numel() * self.packed.element_size()

    def _rows(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        if x.dim() == 2 and (residual is None or residual.dim() == 2):  # no views to make
            return self._op(x, self.packed, self.num_out, residual)  # (M, N)
        rows = x.reshape(-1, x.shape[-1])  # (M, K)
        res = None if residual is None else residual.reshape(rows.shape[0], self.num_out)
        out = self._op(rows, self.packed, self.num_out, res)  # (M, N)
        return out.view(*x.shape[:-1], self.num_out)

    def takes(self, x: torch.Tensor) -> bool:
        return x.numel() <= self.max_numel and x.dtype == self.packed.dtype

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.takes(x):
            assert self.weight is not None, "a row count the plan gives another kernel"
            return F.linear(x, self.weight, self.bias)
        out = self._rows(x, None)
        return out if self.bias is None else out + self.bias

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        if self.bias is not None or not self.takes(x) or residual.dtype != x.dtype:
            return residual + self(x)
        return self._rows(x, residual.contiguous())


class SplitLinear(BoundLinear):
    """Stacked weights run as each one's own kernel (``parts``): [..., K] -> [..., sum N_i]."""

    def __init__(self, parts: list[BoundLinear]):
        super().__init__(None, None)
        self.parts = parts

    @property
    def extra_bytes(self) -> int:
        return 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([part(x) for part in self.parts], -1)


def gemv_packed_shape(weight: torch.Tensor) -> tuple[int, ...]:
    """The shape of ``weight``'s gemv copy (layout: docs/engines.md#kernels)."""
    num_out, width = weight.shape
    blocks = -(-num_out // GEMV_BLOCK)
    with torch.inference_mode():
        probe = torch.ops.cbp_gemv.pack(weight.new_zeros(1, 1))
    if probe.dim() == 4:  # bfloat16 by pairs of k
        return blocks, -(-width // 2), GEMV_BLOCK, 2
    return blocks, width, GEMV_BLOCK


def gather_packed(gemvs: list[GemvLinear]) -> None:
    """Move ``gemvs``' packed copies end to end into one allocation per dtype, in this (step)
    order; why: docs/engines.md#kernels."""
    for dtype in dict.fromkeys(g.packed.dtype for g in gemvs):
        group = [g for g in gemvs if g.packed.dtype == dtype]
        sizes = [g.packed.numel() for g in group]
        with torch.inference_mode():
            arena = torch.empty(sum(sizes), dtype=dtype)
            offsets = itertools.accumulate(sizes, initial=0)
            for g, size, start in zip(group, sizes, offsets, strict=False):
                view = arena[start : start + size].view(g.packed.shape)
                g.packed = view.copy_(g.packed)
                if start // TRIM_ELEMENTS != (start + size) // TRIM_ELEMENTS:
                    trim_heap()


def trim_heap() -> None:
    """glibc's ``malloc_trim(0)``; nothing under another C library."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache  # find_library runs ldconfig: once per process
def _malloc_trim():
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name and sys.platform.startswith("linux") else None
    return getattr(libc, "malloc_trim", None)


def joined_packed(gemvs: list[GemvLinear]) -> torch.Tensor | None:
    """The gemv copy of ``gemvs``' weights stacked along N, as a view over their own copies
    where those lie end to end, each N a multiple of 16; else None."""
    first = gemvs[0].packed
    end = first.storage_offset()
    for g in gemvs:
        packed = g.packed
        same = packed.shape[1:] == first.shape[1:] and packed.dtype == first.dtype
        same = same and packed.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        if not same or g.num_out % GEMV_BLOCK or packed.storage_offset() != end:
            return None
        if not packed.is_contiguous():
            return None
        end += packed.numel()
    blocks = sum(g.packed.shape[0] for g in gemvs)
    return first.as_strided((blocks, *first.shape[1:]), first.stride(), first.storage_offset())


_BINDERS = {
    "linear": BoundLinear,
    "skinny": SkinnyLinear,
    "onednn": PackedLinear,
    "onednn_f32": UpcastLinear,
    "gemv": GemvLinear,
}


def bind(name: str, weight: torch.Tensor, bias: torch.Tensor | None = None) -> BoundLinear:
    """The candidate ``name`` on ``weight`` [N, K]; RuntimeError where its kernel refuses it."""
    return _BINDERS[name](weight, bias)


def linear_modules(model: nn.Module) -> list[nn.Linear]:
    """Every plain ``nn.Linear`` of ``model`` (not subclasses such as quantized ones)."""
    return [m for m in model.modules() if type(m) is nn.Linear]


@contextlib.contextmanager
def installed(
    linears: list[nn.Linear],
    forward: LinearForward = skinny_forward,
    calls: Mapping[nn.Linear, Callable[[torch.Tensor], torch.Tensor]] | None = None,
) -> Iterator[None]:
    """Within the block, each of ``linears`` computes ``calls[module](x)``, else
    ``forward(module, x)``."""
    calls = calls or {}
    for module in linears:
        call = calls.get(module)
        module.forward = call if call is not None else functools.partial(forward, module)
    try:
        yield
    finally:
        for module in linears:
            del module.forward
