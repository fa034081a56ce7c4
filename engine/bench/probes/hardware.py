"""Hardware probes for the bench: peak resident memory, and the time to read the weights once.

``PeakMemory`` reports the peak resident set size (RSS) since its last ``reset()``: on Linux it
resets the kernel's high-water mark (``VmHWM``) by writing ``5`` to ``/proc/self/clear_refs``
(``man 5 proc``), so each engine gets its own peak; elsewhere it falls back to ``ru_maxrss``, the
peak since the process started. ``weight_read_ms`` times one read of every parameter: decoding a
batch of a few sequences reads every weight once per step, so this is a decode step's floor.
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

import torch

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


class PeakMemory:
    """Peak resident memory of this process between ``reset()`` and ``peak_bytes()``."""

    def __init__(self, device: torch.device):
        self.device = device
        self.start_rss_bytes = _status_bytes("VmRSS")

    def reset(self) -> None:
        """Start a new measurement; the OS peak is kept where it cannot be reset."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        try:
            _CLEAR_REFS.write_text("5")
        except OSError:
            pass
        self.start_rss_bytes = _status_bytes("VmRSS")

    def peak_bytes(self) -> dict[str, int | None]:
        """Peak RSS, its rise over the RSS at ``reset()``, and peak CUDA memory (None off CUDA)."""
        peak = _status_bytes("VmHWM")
        if peak is None:  # not Linux: the peak since the process started
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            peak = peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, else kB
        start = self.start_rss_bytes
        cuda = None
        if self.device.type == "cuda":
            cuda = int(torch.cuda.max_memory_allocated(self.device))
        return {
            "peak_rss_bytes": peak,
            "peak_rss_added_bytes": None if start is None else max(0, peak - start),
            "peak_cuda_bytes": cuda,
        }


def _status_bytes(field: str) -> int | None:
    """A memory field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in bytes; None off Linux."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # the kernel reports kB
    except OSError:
        pass
    return None


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every parameter of ``model`` (tied weights counted once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def weight_read_ms(model: torch.nn.Module, synchronize, repeat: int = 5) -> float:
    """Best-of-``repeat`` milliseconds to read every parameter once (a ``sum`` of each tensor).

    ``synchronize()`` waits for queued device work (``ModelRunner.synchronize``).
    """
    params = list(model.parameters())
    best_s = float("inf")
    with torch.inference_mode():
        for _ in range(repeat):
            synchronize()
            t0 = time.perf_counter()
            for p in params:
                p.sum()
            synchronize()
            best_s = min(best_s, time.perf_counter() - t0)
    return 1000 * best_s
