"""Which dtypes a device can run, checked before any weight is loaded (docs/precision.md).

bfloat16 on CUDA needs compute capability 8.0; everything else is probed by running a decoder
step's op kinds once on tiny tensors.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from engine.model.device import device_name

DTYPE_NAMES = ("float32", "bfloat16", "float16")


def check_dtype_supported(device: torch.device, dtype: torch.dtype) -> None:
    """Raises ValueError naming the dtype, the device and what to use instead."""
    reason = _unsupported(device.type, device.index, dtype)
    if reason:
        name = str(dtype).removeprefix("torch.")
        raise ValueError(
            f"{name} is not supported on {device_name(device)}: {reason}. "
            "Use float32 (or float16 on CUDA) instead."
        )


def supported_dtypes(device: torch.device) -> list[str]:
    return [
        name
        for name in DTYPE_NAMES
        if not _unsupported(device.type, device.index, getattr(torch, name))
    ]


@functools.cache
def _unsupported(device_type: str, index: int | None, dtype: torch.dtype) -> str:
    """Why the device cannot run ``dtype``, or "" (cached per device and dtype)."""
    if device_type == "cuda" and dtype == torch.bfloat16:
        device = torch.device(device_type, index)
        if not _cuda_bf16_native(device):
            major, minor = torch.cuda.get_device_capability(device)
            return f"compute capability {major}.{minor}, and bfloat16 needs 8.0 (Ampere) or newer"
    try:
        _probe(torch.device(device_type, index), dtype)
    except (RuntimeError, TypeError, NotImplementedError) as err:
        return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return ""


def _cuda_bf16_native(device: torch.device) -> bool:
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # older torch: no including_emulation argument
        return torch.cuda.get_device_capability(device)[0] >= 8


def _probe(device: torch.device, dtype: torch.dtype) -> None:
    x = torch.ones(2, 8, dtype=dtype, device=device)
    w = torch.ones(4, 8, dtype=dtype, device=device)
    y = F.linear(x, w)  # (2, 4)
    y = y * torch.rsqrt(y.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(dtype)
    q = torch.ones(1, 2, 3, 4, dtype=dtype, device=device)
    F.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.exp(y).argmax(dim=-1).tolist()
