"""ZeroGPU: on a Hugging Face Space with ZeroGPU hardware, a run holds a GPU only while it runs.

Such Spaces provide the ``spaces`` package, whose ``spaces.GPU(duration=seconds)`` decorator
attaches a GPU to each call of the function it wraps, for at most ``duration`` seconds. ``on_gpu``
applies it to the page's run handler when ``spaces`` is importable and returns the handler unchanged
otherwise (locally, on a CPU Space, on a GPU Space that is not ZeroGPU: ``spaces`` is absent or
``spaces.GPU`` does nothing there).

The duration is sized from the workload limits in force (``engine.workloads.workload.limits``), so a
Space owner who sets ``CBP_MAX_ROWS`` and ``CBP_MAX_NEW_TOKENS`` also sets how long a run may hold
the GPU: the worst case is every request run one after another by each of the three passes (static,
continuous, ``model.generate`` reference), ``GPU_STEP_S`` per token.
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
    """Seconds of GPU a run may need under ``workload_limits``, within ZeroGPU's 60 to 300 s.

    Raises:
        ValueError: a limit variable in the environment that is not a positive whole number.
    """
    lim = workload_limits or limits()
    worst_s = NUM_PASSES * lim.max_rows * lim.max_new_tokens * GPU_STEP_S
    return int(min(max(worst_s, MIN_DURATION_S), MAX_DURATION_S))


def run_concurrency() -> int | None:
    """How many Run handlers Gradio starts at once: every one elsewhere (None), since runs wait
    for the model in the page's own queue (``engine.page.run.run_queue``), which tells each its
    place; one on ZeroGPU, where a handler holds a GPU from its start, so runs wait in Gradio's
    queue instead, holding none."""
    return 1 if on_zerogpu() else None


def on_zerogpu() -> bool:
    """Whether the page runs on a ZeroGPU Space (``spaces`` imports): Run events then wait in
    Gradio's queue (``run_concurrency``), where Stop must cancel a waiting one
    (``engine.page.run.run_handle``); and the GPU is lent to the page's own process, so there is
    no engine process (``engine.page.run.engine_worker``)."""
    return _spaces() is not None


def _spaces():
    """The ``spaces`` module of a Hugging Face Space, or None."""
    try:
        return importlib.import_module("spaces")
    except ImportError:
        return None


def on_gpu(fn: Callable) -> Callable:
    """``fn`` wrapped with ``spaces.GPU(duration=gpu_duration_s())`` when ``spaces`` imports, else
    ``fn`` itself.

    Raises:
        ValueError: a limit variable in the environment that is not a positive whole number.
    """
    spaces = _spaces()
    return fn if spaces is None else spaces.GPU(duration=gpu_duration_s())(fn)
