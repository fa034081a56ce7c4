"""The memory account: a loaded model's bytes by part, counted from the tensors, not the OS.

``copies_to_release`` keeps several precisions of a model within the host's memory: the kernels'
copies go, largest first, when the next precision would not fit beside them.
"""

from __future__ import annotations

import gc
import resource
import sys
from pathlib import Path

from torch import nn

from engine.kernels.linear_kernel import trim_heap

_STATUS = Path("/proc/self/status")
MEMORY_SHARE = 0.8  # of the host's memory, what the precisions held may take together
_LIMITS = (  # a container's memory limit (cgroup v2, v1), as a Space sets it; else the host's
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)
_MEMINFO = Path("/proc/meminfo")


def weights_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def memory_account(runner) -> dict:
    """Bytes of ``runner``'s weights and its kernels' copies, a shared copy once (the bench
    JSON's ``memory``: docs/bench.md)."""
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


def host_memory_bytes() -> int | None:
    """The memory this process may use: the smallest of its cgroup's limit and the host's
    ``MemTotal``, in bytes; None where neither is known (not Linux)."""
    sizes = []
    for path in _LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # "max": no limit
            sizes.append(int(text))
    total = meminfo_bytes("MemTotal")
    sizes += [] if total is None else [total]
    return min(sizes, default=None)


def meminfo_bytes(name: str) -> int | None:
    """``/proc/meminfo``'s field ``name`` (e.g. ``"MemAvailable"``) in bytes; None where
    unknown (not Linux)."""
    try:
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith(f"{name}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def memory_bound_bytes() -> int | None:
    """``MEMORY_SHARE`` of ``host_memory_bytes``; None: unknown, no bound."""
    host = host_memory_bytes()
    return None if host is None else int(MEMORY_SHARE * host)


def copies_to_release(
    held_bytes: dict[str, int], copy_bytes: dict[str, int], incoming_bytes: int, bound_bytes: int
) -> list[str]:
    """The held precisions whose copies go, largest first, so that one of ``incoming_bytes``
    fits within ``bound_bytes``; ``held_bytes`` counts weights and copies."""
    total = sum(held_bytes.values()) + incoming_bytes
    released = []
    for name in sorted(copy_bytes, key=copy_bytes.__getitem__, reverse=True):
        if total <= bound_bytes or not copy_bytes[name]:
            break
        released.append(name)
        total -= copy_bytes[name]
    return released


def release_freed() -> None:
    """Collect garbage, then ``malloc_trim(0)`` (glibc), so scratch freed after kernel timing leaves
    the RSS."""
    gc.collect()
    trim_heap()


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.0f} MB"
