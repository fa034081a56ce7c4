"""The memory account: a loaded model's bytes by part, counted from the tensors, not the OS.

The engines' kernels add copies of the weights (packed kernels, the fused layers' stacked ones);
``memory_account`` counts what a runner has made so far, ``peak_rss_bytes`` what the OS saw.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import resource
import sys
from pathlib import Path

from torch import nn

_STATUS = Path("/proc/self/status")


def weights_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def memory_account(runner) -> dict:
    """Bytes of ``runner``'s weights and its kernels' copies: ``weights_bytes``, ``packed_bytes``
    (by kernel; ``"stacked"``), ``packed_total_bytes``, ``packed_by_part`` (``"modules"``,
    ``"fused"``), ``copy_budget`` (``CopyBudget.as_dict``: the copies the bound dropped; None
    without a measured plan); a shared copy counted once."""
    kernel = runner.__dict__.get("engine_kernel")
    fused = runner.__dict__.get("fused_decoder")
    budget = runner.__dict__.get("copy_budget")
    modules = [] if kernel is None or kernel.modules is None else kernel.modules.planned.values()
    own_fused = [] if fused is None else fused.own_planned
    parts = {"modules": _by_kernel(modules), "fused": _by_kernel(own_fused)}
    total: dict[str, int] = {}
    for by_kernel in parts.values():
        for name, nbytes in by_kernel.items():
            total[name] = total.get(name, 0) + nbytes
    return {
        "weights_bytes": weights_bytes(runner.model),
        "packed_bytes": total,
        "packed_total_bytes": sum(total.values()),
        "packed_by_part": parts,
        "copy_budget": None if budget is None else budget.as_dict(),
    }


def _by_kernel(planned) -> dict[str, int]:
    total: dict[str, int] = {}
    for p in planned:
        for name, nbytes in p.bytes_by_kernel().items():
            total[name] = total.get(name, 0) + nbytes
    return total


def peak_rss_bytes() -> int | None:
    """Peak resident set size in bytes (``VmHWM``, else ``ru_maxrss``); None where unknown."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # the kernel reports kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return (peak if sys.platform == "darwin" else peak * 1024) or None  # bytes on macOS, else kB


def memory_summary(account: dict, peak_rss: int | None) -> str:
    """One line, e.g. ``"peak RSS 1.9 GB; weights 538 MB, copies 1.2 GB (onednn 606 MB, ...)"``."""
    by_kernel = ", ".join(f"{n} {_size(b)}" for n, b in account["packed_bytes"].items())
    copies = _size(account["packed_total_bytes"]) + (f" ({by_kernel})" if by_kernel else "")
    peak = "peak RSS unknown" if peak_rss is None else f"peak RSS {_size(peak_rss)}"
    text = f"{peak}; weights {_size(account['weights_bytes'])}, kernels' copies {copies}"
    budget = account.get("copy_budget")
    return text if not budget or not budget["dropped"] else f"{text}; {budget['summary']}"


def release_freed() -> None:
    """Collect garbage, then ``malloc_trim(0)`` (glibc), so scratch freed after kernel timing leaves
    the RSS."""
    gc.collect()
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name and sys.platform.startswith("linux") else None
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.0f} MB"
