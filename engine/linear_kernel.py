"""The linear kernel: a faster CPU matmul for the few-row activations of batched decode.

A decode step multiplies every weight matrix by only a few rows of activations (one per sequence),
so its time is the time to stream the weights from memory. On CPU, how the matmul is laid out
decides how close it gets to that. Measured with MKL in torch 2.13 on this project's 2-core
AVX-512 machine, for the 30 decoder layers of SmolLM2-135M (425 MB of float32 weights; best of 9,
random weights of the same shapes; ``python -m engine.kernel_bench`` times the model's own):

    rows M                      1      2      3      4      8     16     64
    F.linear(x, W)   ms      25.8   39.0   44.2   38.8   40.4   50.3  101.3
    (W @ x.T).T      ms      13.3*  11.2   15.1   13.1   26.0   35.4   82.4
    (* one row padded to two: a single row takes the slower matrix-vector path)

Both compute the same sums; only the kernel MKL picks differs, so results agree to float32
rounding (max |diff| 5e-5 on logits), and greedy outputs are checked against plain
``model.generate`` by the parity tests. ``installed(linears)`` routes ``nn.Linear`` modules
through ``skinny_linear`` for the length of a ``with`` block; the model itself is not changed, so
the reference and the floor still run plain ``model.generate``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

MAX_SKINNY_ROWS = 64  # above this many rows plain F.linear is as fast (see the table)


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


def linear_modules(model: nn.Module) -> list[nn.Linear]:
    """Every plain ``nn.Linear`` of ``model`` (subclasses, such as quantized ones, left out)."""
    return [m for m in model.modules() if type(m) is nn.Linear]


@contextlib.contextmanager
def installed(linears: list[nn.Linear]) -> Iterator[None]:
    """Within the block, each module in ``linears`` computes with ``skinny_linear``."""
    for module in linears:
        module.forward = functools.partial(_forward, module)
    try:
        yield
    finally:
        for module in linears:
            del module.forward


def _forward(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return skinny_linear(x, module.weight, module.bias)
