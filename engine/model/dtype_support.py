"""Which dtypes a device can run, checked before any weight is loaded.

A dtype the device cannot run should fail at once, with the dtype and the device named, and not
halfway through a run (or after a model was replaced). Two checks, both cheap:

* **bfloat16 on CUDA** needs compute capability 8.0 (Ampere) or newer: older GPUs have no
  bfloat16 matmul units and torch either emulates it (slowly) or refuses it, kernel by kernel.
  ``torch.cuda.is_bf16_supported(including_emulation=False)`` says which.
* **Everything else** is probed: the few ops a decoder step needs (a linear, a norm's float32
  reduction, ``exp``, SDPA) run once on tiny tensors of that dtype on that device; where a torch
  build or device lacks a kernel for the dtype, the probe fails and names it. (On a CPU without
  AVX512-FP16 / AVX512-BF16 torch converts to float32 inside its kernels: correct but slower.)
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from engine.model.device import device_name

DTYPE_NAMES = ("float32", "bfloat16", "float16")


def check_dtype_supported(device: torch.device, dtype: torch.dtype) -> None:
    """Raise unless ``device`` can run ``dtype``.

    Raises:
        ValueError: naming the dtype and the device, and what to use instead.
    """
    reason = _unsupported(device.type, device.index, dtype)
    if reason:
        name = str(dtype).removeprefix("torch.")
        raise ValueError(
            f"{name} is not supported on {device_name(device)}: {reason}. "
            "Use float32 (or float16 on CUDA) instead."
        )


def supported_dtypes(device: torch.device) -> list[str]:
    """The names in ``DTYPE_NAMES`` that ``device`` can run."""
    return [
        name
        for name in DTYPE_NAMES
        if not _unsupported(device.type, device.index, getattr(torch, name))
    ]


@functools.cache
def _unsupported(device_type: str, index: int | None, dtype: torch.dtype) -> str:
    """Why the device cannot run ``dtype``, or "" when it can (cached per device and dtype)."""
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
    """A decoder step's op kinds, once, on tiny tensors."""
    x = torch.ones(2, 8, dtype=dtype, device=device)
    w = torch.ones(4, 8, dtype=dtype, device=device)
    y = F.linear(x, w)  # (2, 4)
    y = y * torch.rsqrt(y.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(dtype)
    q = torch.ones(1, 2, 3, 4, dtype=dtype, device=device)
    F.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.exp(y).argmax(dim=-1).tolist()
