"""The linear kernel: a faster CPU matmul for the engines' linears, same sums as ``F.linear``.

A decode step multiplies every weight matrix by only a few rows of activations (one per sequence),
so its time should be the time to stream the weights from memory. On CPU, which kernel does the
matmul decides how close it gets. Measured in torch 2.13 on this project's 2-core AMD EPYC
(AVX-512) machine, one pass over the 210 decoder-layer linears of SmolLM2-135M (425 MB of float32
weights), best of 5 (``python -m engine.bench.kernel_bench --rows 1,3,5,8,16,64,512 --repeat 5``):

    rows M                      1      3      5      8     16     64    512
    F.linear(x, W)  (MKL)  ms  26.3   48.3   30.4   34.5   41.9   88.0  520.3
    skinny_linear   (MKL)  ms  15.0*  18.3   22.5   31.3   38.3   86.4  519.0**
    oneDNN, packed W       ms  12.7   13.5   12.7   14.8   17.3   41.2  229.9
    (* one row padded to two: a single row takes MKL's slower matrix-vector path;
     ** above 64 rows skinny_linear is F.linear)

The engines use oneDNN (``torch.ops.mkldnn._linear_pointwise``, the op torch's inductor emits for
CPU linears) with each weight reordered once into oneDNN's blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``). The packed copies cost at least as much memory as
the weights themselves (``OneDNNLinears.packed_bytes``), and they are made once, on first use; they
assume the weights no longer change (``forward`` asserts it). oneDNN is used on x86 CPUs only,
where it was measured; elsewhere, or where oneDNN is missing or refuses a weight (float16 without
AVX512-FP16, say), the engines fall back to ``skinny_linear``, MKL called as ``(W @ x.T).T``.

Every kernel computes the same sums in another order, so results agree to float32 rounding (max
|diff| about 1e-6 per layer), and the parity tests check greedy outputs against plain
``model.generate``. ``installed(linears, forward)`` routes ``nn.Linear`` modules through a kernel
for the length of a ``with`` block; the model itself is not changed, so the reference and the
floor still run plain ``model.generate``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

MAX_SKINNY_ROWS = 64  # above this many rows plain F.linear is as fast as (W @ x.T).T

LinearForward = Callable[[nn.Linear, torch.Tensor], torch.Tensor]


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """``F.linear`` computed as ``(weight @ x.T).T`` when ``x`` has at most 64 rows.

    Shapes:
        x: [..., K];  weight: [N, K];  bias: [N] or None  ->  [..., N]
    """
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
    """A ``LinearForward`` through ``skinny_linear``."""
    return skinny_linear(x, module.weight, module.bias)


def onednn_pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [N, K] reordered into oneDNN's blocked layout (a ``torch._mkldnn`` tensor).

    Raises:
        RuntimeError: oneDNN is not available in this torch build, or refuses the weight.
    """
    if not torch.backends.mkldnn.is_available():
        raise RuntimeError("this torch build has no oneDNN (mkldnn)")
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None):
    """``F.linear(x, W, bias)`` with ``packed = onednn_pack(W)``.

    Shapes:
        x: [..., K];  packed: [N, K];  bias: [N] or None  ->  [..., N]
    """
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class OneDNNLinears:
    """oneDNN-packed copies of some ``nn.Linear`` weights, and the ``LinearForward`` using them.

    Each weight is packed and tried once on a one-row input, so a weight oneDNN cannot take fails
    here rather than inside an engine step.

    Raises:
        RuntimeError: oneDNN cannot pack or multiply one of these weights.
    """

    def __init__(self, linears: list[nn.Linear]):
        self.packed = {module: onednn_pack(module.weight) for module in linears}
        self._versions = {module: module.weight._version for module in linears}
        with torch.inference_mode():
            for module, packed in self.packed.items():
                onednn_linear(module.weight.new_zeros(1, module.in_features), packed, module.bias)

    @property
    def packed_bytes(self) -> int:
        """Memory the packed copies take: at least that of the weights, more where oneDNN pads."""
        return sum(torch.ops.mkldnn._nbytes(p) for p in self.packed.values())

    def forward(self, module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """A ``LinearForward``: ``module(x)`` through its packed weight."""
        assert module.weight._version == self._versions[module], "weight changed after packing"
        return onednn_linear(x, self.packed[module], module.bias)


class Kernel(NamedTuple):
    """The engines' kernel for a model: its name, its ``LinearForward``, the memory it adds."""

    name: str  # "onednn", "skinny", or "none" (no linears to route: CUDA, MPS)
    forward: LinearForward
    extra_bytes: int


SKINNY = Kernel("skinny", skinny_forward, 0)
KERNEL_CHOICES = ("auto", "skinny")  # CBP_ENGINE_KERNEL: a host may forgo the packed copies


def requested_kernel() -> str:
    """The host's ``CBP_ENGINE_KERNEL`` (default ``"auto"``).

    Raises:
        ValueError: a value other than ``auto`` or ``skinny``, named in the message.
    """
    choice = os.environ.get("CBP_ENGINE_KERNEL", "").strip().lower() or "auto"
    if choice not in KERNEL_CHOICES:
        raise ValueError(
            f"CBP_ENGINE_KERNEL={choice!r}: use 'auto' (the fastest kernel that works here) or "
            "'skinny' (MKL, without oneDNN's packed weight copies)"
        )
    return choice


def on_x86() -> bool:
    """Whether this CPU is x86-64, where oneDNN's kernel was measured (and is used)."""
    return platform.machine().lower() in ("x86_64", "amd64")


def best_kernel(linears: list[nn.Linear], choice: str = "auto") -> Kernel:
    """The fastest kernel that works here for ``linears``, or ``skinny`` if ``choice`` says so.

    ``"onednn"`` (packed copies, ``extra_bytes`` of them) on x86 where oneDNN takes every weight,
    else ``"skinny"`` (no extra memory); ``"none"`` for no linears.
    """
    if not linears:
        return Kernel("none", skinny_forward, 0)
    if choice == "skinny" or not on_x86():
        return SKINNY
    try:
        onednn = OneDNNLinears(linears)
    except RuntimeError:
        return SKINNY
    return Kernel("onednn", onednn.forward, onednn.packed_bytes)


def linear_modules(model: nn.Module) -> list[nn.Linear]:
    """Every plain ``nn.Linear`` of ``model`` (subclasses, such as quantized ones, left out)."""
    return [m for m in model.modules() if type(m) is nn.Linear]


@contextlib.contextmanager
def installed(linears: list[nn.Linear], forward: LinearForward = skinny_forward) -> Iterator[None]:
    """Within the block, each module in ``linears`` computes ``forward(module, x)``."""
    for module in linears:
        module.forward = functools.partial(forward, module)
    try:
        yield
    finally:
        for module in linears:
            del module.forward
