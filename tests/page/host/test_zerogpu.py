"""ZeroGPU: the run handler is wrapped with spaces.GPU only when the spaces package imports."""

from __future__ import annotations

import sys
import types

from engine.page.host import zerogpu
from engine.workloads.workload import Limits


def _handler(x):
    return x + 1


def _fake_spaces(calls: list) -> types.ModuleType:
    """A stand-in for Hugging Face's ``spaces``: GPU(duration=...) records each call's duration."""
    module = types.ModuleType("spaces")

    def gpu(duration):
        def decorate(fn):
            def wrapped(*args, **kwargs):
                calls.append(duration)
                return fn(*args, **kwargs)

            wrapped.__wrapped__ = fn
            return wrapped

        return decorate

    module.GPU = gpu
    return module


def test_without_spaces_the_handler_is_unchanged(monkeypatch):
    """With no spaces package, on_gpu returns the very same function."""
    monkeypatch.setitem(sys.modules, "spaces", None)  # makes `import spaces` raise ImportError
    assert zerogpu.on_gpu(_handler) is _handler, "handler changed although spaces is absent"


def test_with_spaces_the_handler_gets_a_gpu_for_the_limits(monkeypatch):
    """With spaces present, calls go through spaces.GPU with the duration the env limits give."""
    calls = []
    monkeypatch.setitem(sys.modules, "spaces", _fake_spaces(calls))
    monkeypatch.setenv("CBP_MAX_ROWS", "8")
    monkeypatch.setenv("CBP_MAX_NEW_TOKENS", "256")
    wrapped = zerogpu.on_gpu(_handler)
    assert wrapped is not _handler, "spaces is importable but the handler was not wrapped"
    assert wrapped(1) == 2, "the wrapped handler does not return the handler's result"
    want = zerogpu.NUM_PASSES * 8 * 256 * zerogpu.GPU_STEP_S
    assert calls == [int(want)], f"spaces.GPU got duration {calls}, want {int(want)} s"


def test_duration_stays_within_zerogpu_bounds():
    """Tiny limits get at least 60 s and huge limits at most 300 s; between, it grows with them."""
    small = zerogpu.gpu_duration_s(Limits(max_rows=1, max_new_tokens=1, max_prompt_chars=10))
    huge = zerogpu.gpu_duration_s(Limits(max_rows=256, max_new_tokens=2048, max_prompt_chars=10))
    mid = [
        zerogpu.gpu_duration_s(Limits(max_rows=rows, max_new_tokens=256, max_prompt_chars=10))
        for rows in (5, 10, 15)
    ]
    assert small == zerogpu.MIN_DURATION_S and huge == zerogpu.MAX_DURATION_S, (small, huge)
    assert zerogpu.MIN_DURATION_S < mid[0] < mid[1] < mid[2] < zerogpu.MAX_DURATION_S, mid


def test_runs_queue_in_gradio_only_on_zerogpu(monkeypatch):
    """Off ZeroGPU every Run handler starts at once; on it they wait in Gradio's queue, one at a
    time (so Stop must cancel a waiting one)."""
    monkeypatch.setitem(sys.modules, "spaces", None)  # import spaces: ImportError
    assert zerogpu.run_concurrency() is None and not zerogpu.on_zerogpu()
    monkeypatch.setitem(sys.modules, "spaces", _fake_spaces([]))
    assert zerogpu.run_concurrency() == 1 and zerogpu.on_zerogpu()
