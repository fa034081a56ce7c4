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
import platform
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels.host_setting import read_choice

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


class UpcastOneDNNLinears:
    """float32 oneDNN copies of half-precision weights, for CPUs where oneDNN has no half kernel.

    oneDNN multiplies bfloat16 only with AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT; on an AVX2-only
    CPU it refuses the weights, and torch's own bfloat16 matmul is a slow generic loop for more
    than one row. Measured on this project's AVX2 EPYC, one pass over SmolLM2's 210 bfloat16
    decoder weights, 1 thread, CPU ms (2026-12-01, machine shared, so only ratios hold):

        rows M                          1      3      8     64
        F.linear (bfloat16)          27.5   71.2  177.2 1386.8
        skinny_linear (bfloat16)     54.5   78.1  185.3 1451.8
        oneDNN, float32 copies       57.8   55.8   69.6  256.3

    So: one row goes through ``F.linear`` on the half weight (a vectorized matrix-vector loop that
    streams half the bytes), more rows through oneDNN on float32 copies of the same values (exact:
    bfloat16 and float16 values are float32 values), the sums in float32 and the result rounded to
    the input's dtype, as a half-precision matmul with float32 accumulation does.

    Raises:
        RuntimeError: oneDNN cannot pack or multiply one of these weights.
    """

    def __init__(self, linears: list[nn.Linear]):
        self.packed = {module: onednn_pack(module.weight.float()) for module in linears}
        self.biases = {m: None if m.bias is None else m.bias.detach().float() for m in linears}
        self._versions = {module: module.weight._version for module in linears}
        with torch.inference_mode():
            for module, packed in self.packed.items():
                onednn_linear(module.weight.new_zeros(2, module.in_features).float(), packed)

    @property
    def packed_bytes(self) -> int:
        """Memory the float32 packed copies take (twice the half-precision weights, or more)."""
        return sum(torch.ops.mkldnn._nbytes(p) for p in self.packed.values())

    def forward(self, module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """A ``LinearForward``: ``module(x)``, its sums in float32, in ``x``'s dtype."""
        assert module.weight._version == self._versions[module], "weight changed after packing"
        if x.numel() == x.shape[-1]:  # one row
            return F.linear(x, module.weight, module.bias)
        out = onednn_linear(x.float(), self.packed[module], self.biases[module])
        return out.to(x.dtype)


class Kernel(NamedTuple):
    """The engines' kernel for a model: its name, its ``LinearForward``, the memory it adds."""

    name: str  # "onednn", "onednn_f32", "skinny", or "none" (no linears to route: CUDA, MPS)
    forward: LinearForward
    extra_bytes: int


SKINNY = Kernel("skinny", skinny_forward, 0)
KERNEL_CHOICES = {  # CBP_ENGINE_KERNEL: a host may forgo the packed copies
    "auto": "the fastest kernel that works here",
    "skinny": "MKL, without oneDNN's packed weight copies",
}


def requested_kernel() -> str:
    """The host's ``CBP_ENGINE_KERNEL`` (default ``"auto"``).

    Raises:
        ValueError: a value other than ``auto`` or ``skinny``, named in the message.
    """
    choice = read_choice("CBP_ENGINE_KERNEL", KERNEL_CHOICES)
    return choice


def on_x86() -> bool:
    """Whether this CPU is x86-64, where oneDNN's kernel was measured (and is used)."""
    return platform.machine().lower() in ("x86_64", "amd64")


def best_kernel(linears: list[nn.Linear], choice: str = "auto") -> Kernel:
    """The fastest kernel that works here for ``linears``, or ``skinny`` if ``choice`` says so.

    ``"onednn"`` (packed copies, ``extra_bytes`` of them) on x86 where oneDNN takes every weight;
    for half-precision weights oneDNN refuses (bfloat16 on an AVX2-only CPU), ``"onednn_f32"``
    (``UpcastOneDNNLinears``); else ``"skinny"`` (no extra memory); ``"none"`` for no linears.
    """
    if not linears:
        return Kernel("none", skinny_forward, 0)
    if choice == "skinny" or not on_x86():
        return SKINNY
    try:
        onednn = OneDNNLinears(linears)
    except RuntimeError:
        return _upcast_kernel(linears)
    return Kernel("onednn", onednn.forward, onednn.packed_bytes)


def _upcast_kernel(linears: list[nn.Linear]) -> Kernel:
    """``"onednn_f32"`` for half-precision weights oneDNN refused, where it takes float32 ones."""
    if linears[0].weight.dtype not in (torch.bfloat16, torch.float16):
        return SKINNY
    try:
        upcast = UpcastOneDNNLinears(linears)
    except RuntimeError:
        return SKINNY
    return Kernel("onednn_f32", upcast.forward, upcast.packed_bytes)


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
