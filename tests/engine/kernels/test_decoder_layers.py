"""The layer stack in one call (``torch.ops.cbp_step.decoder_layers``, ``csrc/decoder_layers.cpp``):
a decode step's every layer, bitwise the fused layers' Python loop, in float32 and bfloat16, with
the slot and the paged cache; used only where the gemv kernel serves the step's row count."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tiny_model import step_logits, tiny_runner

from engine.config import EngineConfig
from engine.kernels import fused_layers, gemv_build
from engine.kernels.kernel_plan import RowPlan
from engine.model.kernel_store import KernelChoice
from engine.model.model_runner import ModelRunner

needs_kernel = pytest.mark.skipif(
    not gemv_build.available(), reason=f"not built here: {gemv_build.unavailable_reason()}"
)
# lengths far apart and more requests than slots: decode steps of 1 to 4 rows, idle slots
SPECS = [("z" * 150, 20), ("a", 30), ("hello", 12), ("y" * 60, 8), ("q", 25)]


def _runner(plan: RowPlan, dtype: torch.dtype) -> ModelRunner:
    """The tiny runner in ``dtype``, as if its measurement had chosen ``plan``."""
    runner = tiny_runner()
    if dtype == torch.bfloat16:
        runner.loaded.model.to(dtype)
        runner = ModelRunner(SimpleNamespace(**(vars(runner.loaded) | {"dtype": dtype})))
    runner.__dict__["kernel_choice"] = KernelChoice(plan, "measured")
    return runner


def _logits_per_step(runner, kv_mode: str, stacked: bool) -> list[torch.Tensor]:
    """Every step's logits of an engine run, with the layer stack on or off."""
    decoder = runner.fused_decoder
    stack, decoder.stack = decoder.stack, decoder.stack if stacked else None
    try:
        config = EngineConfig(4, kv_mode=kv_mode, ignore_eos=True, block_size=4)
        return step_logits(runner, config, SPECS)
    finally:
        decoder.stack = stack


@needs_kernel
@pytest.mark.parametrize("kv_mode", ["slots", "paged"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_stack_gives_the_python_loops_bits(dtype, kv_mode):
    """Under a gemv plan every decode step runs in one call, and every step's logits (prefill
    steps included) are bitwise those of the fused layers' loop in Python."""
    runner = _runner(RowPlan.single("gemv"), dtype)
    stack = runner.fused_decoder.stack
    assert stack is not None
    got = _logits_per_step(runner, kv_mode, stacked=True)
    num_calls = stack.num_calls
    assert num_calls > 20, "decode steps ran through the stack"
    want = _logits_per_step(runner, kv_mode, stacked=False)
    assert stack.num_calls == num_calls  # the second run was the loop's alone
    assert len(got) == len(want) > 20
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


@needs_kernel
def test_the_stack_runs_only_the_row_counts_gemv_serves():
    """Under a plan giving gemv 1 and 2 rows and F.linear from 3, decode steps of 3 or 4 rows
    run the Python loop, and the logits stay those of the loop alone."""
    runner = _runner(RowPlan((1, 3), ("gemv", "linear")), torch.float32)
    stack = runner.fused_decoder.stack
    got = _logits_per_step(runner, "slots", stacked=True)
    assert 0 < stack.num_calls and stack.taken == {1: True, 2: True, 3: False, 4: False}
    want = _logits_per_step(runner, "slots", stacked=False)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_no_stack_without_gemv():
    """A plan without the gemv kernel leaves the layers to the Python loop."""
    runner = _runner(RowPlan.single("linear"), torch.float32)
    assert runner.fused_decoder is not None and runner.fused_decoder.stack is None


@needs_kernel
def test_the_op_refuses_lists_of_the_wrong_length():
    """Two norms a layer, four weights a layer, one key and one value cache a layer."""
    runner = _runner(RowPlan.single("gemv"), torch.float32)
    stack = runner.fused_decoder.stack
    x = torch.zeros(1, runner.model.config.hidden_size)
    rope = torch.zeros(1, 8)
    cache = torch.zeros(1, 1, 4, 8)
    with pytest.raises(RuntimeError, match="norms: 2 per layer"):
        torch.ops.cbp_step.decoder_layers(
            x, rope, rope, stack.norms[:1], stack.packed, stack.widths, [cache], [cache],
            torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long),
            torch.zeros(1, dtype=torch.long), 1, 1.0, 1e-5,
        )  # fmt: skip
    assert isinstance(stack, fused_layers.LayerStack)
