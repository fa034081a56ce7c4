"""Hardware probes for the bench: peak resident memory, and the time to read the weights once.

Linux resets the peak (``VmHWM``) by writing ``5`` to ``/proc/self/clear_refs`` (``man 5
proc``); elsewhere ``ru_maxrss``, the peak since start.
"""

from __future__ import annotations

import dataclasses
import resource
import sys
import time
from pathlib import Path

import torch

from engine.batching.continuous import kv_pool_blocks
from engine.config import EngineConfig
from engine.model.memory_account import memory_account, weights_bytes

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


class PeakMemory:
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
        """Peak RSS, its rise since ``reset()``, and peak CUDA memory (None off CUDA)."""
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
    """A ``/proc/self/status`` field (``VmRSS``, ``VmHWM``) in bytes; None off Linux."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # the kernel reports kB
    except OSError:
        pass
    return None


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every parameter (tied weights once)."""
    return weights_bytes(model)


def memory_object(runner, config: EngineConfig, requests, peaks: dict[str, dict]) -> dict:
    """The bench JSON's ``memory``: ``memory_account``'s bytes, ``kv_pool_bytes`` (the pool
    ``config`` sizes for ``requests``) and ``peak_rss_bytes`` (the highest of ``peaks``)."""
    per_token = runner.kv_bytes_per_token()
    config = dataclasses.replace(config, kv_mode="paged")
    blocks = kv_pool_blocks(config, requests, per_token)
    rss = [p["peak_rss_bytes"] for p in peaks.values() if p.get("peak_rss_bytes") is not None]
    return memory_account(runner) | {
        "variants": {},
        "kv_pool_bytes": None if blocks is None else blocks * config.block_size * per_token,
        "peak_rss_bytes": max(rss, default=None),
    }


def weight_read_ms(model: torch.nn.Module, synchronize, repeat: int = 5) -> float:
    """Best-of-``repeat`` ms to read every parameter once (a ``sum`` each); ``synchronize``:
    waits for queued device work."""
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
