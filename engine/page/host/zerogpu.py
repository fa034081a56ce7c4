"""ZeroGPU: on a Hugging Face Space with ZeroGPU hardware, a run holds a GPU only while it runs
(docs/hosting.md, "For Space owners").
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from engine.workloads.workload import Limits, limits

GPU_STEP_S = 0.02  # one forward pass of a small model on a ZeroGPU slice, seconds (generous)
NUM_PASSES = 3  # static, continuous, reference
MIN_DURATION_S = 60  # spaces.GPU's own default
MAX_DURATION_S = 300  # ZeroGPU refuses longer reservations


def gpu_duration_s(workload_limits: Limits | None = None) -> int:
    """Seconds of GPU for three passes of every request in turn, ``GPU_STEP_S`` per token, within
    60 to 300 s; ValueError for a limit variable that is not a positive whole number."""
    lim = workload_limits or limits()
    worst_s = NUM_PASSES * lim.max_rows * lim.max_new_tokens * GPU_STEP_S
    return int(min(max(worst_s, MIN_DURATION_S), MAX_DURATION_S))


def run_concurrency() -> int | None:
    """Run handlers at once: every one (None), or one on ZeroGPU, where a handler holds a GPU."""
    return 1 if on_zerogpu() else None


def on_zerogpu() -> bool:
    """Whether ``spaces`` imports (ZeroGPU: no engine process, Run waits in Gradio's queue)."""
    return _spaces() is not None


def _spaces():
    try:
        return importlib.import_module("spaces")
    except ImportError:
        return None


def on_gpu(fn: Callable) -> Callable:
    """``fn`` wrapped with ``spaces.GPU(duration=gpu_duration_s())`` where ``spaces`` imports."""
    spaces = _spaces()
    return fn if spaces is None else spaces.GPU(duration=gpu_duration_s())(fn)
