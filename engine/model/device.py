"""The device and the dtype: which one a run uses, how a name is parsed, and how both are shown. Bad
names raise ``ValueError`` listing the names that work."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

import torch

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}
_DEVICE_HINT = "use auto, cpu, cuda, cuda:N or mps"


def device_name(device: torch.device) -> str:
    """The device for people: "CPU", "MPS" or "CUDA (<GPU name>)" ("CUDA" where the name cannot be
    read, as on ZeroGPU outside a GPU call)."""
    if device.type != "cuda":
        return device.type.upper()
    try:
        return f"CUDA ({torch.cuda.get_device_name(device)})"
    except (RuntimeError, AssertionError, AttributeError):
        return "CUDA"


def describe_device(device: torch.device, dtype: torch.dtype) -> str:
    return f"{device_name(device)} · {str(dtype).removeprefix('torch.')}"


def detect_device(requested: str | None = None) -> torch.device:
    """The device to run on: "auto"/None picks CUDA, then MPS, then CPU. Raises ValueError: an
    unknown device, or one this machine does not have."""
    text = (requested or "auto").strip().lower()
    if text == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps") if _mps_available() else torch.device("cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise ValueError(f"Unknown device {requested!r}; {_DEVICE_HINT}.") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"Device {requested!r} asked for, but this machine has no CUDA GPU.")
        if device.index is not None and device.index >= count:
            raise ValueError(f"Device {requested!r} asked for, but only {count} CUDA GPU(s) exist.")
    elif device.type == "mps" and not _mps_available():
        raise ValueError(f"Device {requested!r} asked for, but MPS (Apple GPU) is not available.")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"Device {requested!r} is not supported; {_DEVICE_HINT}.")
    return device


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def default_dtype(device: torch.device) -> torch.dtype:
    """float16 on CUDA; float32 on MPS and CPU (float16 on MPS flips greedy ties)."""
    return torch.float16 if device.type == "cuda" else torch.float32


def parse_dtype(name: str | None, device: torch.device) -> torch.dtype:
    """The dtype named; "auto"/None is ``default_dtype(device)``. Raises ValueError: not auto,
    float32/fp32, float16/fp16 or bfloat16/bf16."""
    text = (name or "auto").strip().lower().removeprefix("torch.")
    if text == "auto":
        return default_dtype(device)
    if text not in _DTYPES:
        raise ValueError(f"Unknown dtype {name!r}; use auto, float32, float16 or bfloat16.")
    return _DTYPES[text]


@functools.cache
def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo, else
    ``platform.processor()``), part of per-host keys."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
