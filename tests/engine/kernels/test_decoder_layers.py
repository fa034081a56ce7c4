"""The layer stack in one call (``torch.ops.cbp_step.decoder_layers``, ``csrc/decoder_layers.cpp``):
a decode step's every layer, bitwise the fused layers' Python loop, in float32 and bfloat16, with
the slot and the paged cache, for each family's layer (``family_models``) past its sliding
window; used only where the gemv kernel serves the step's row count."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from family_models import FAMILIES, PAST_WINDOW_SPECS, family_model, family_runner
from tiny_model import make_requests, runner_of, step_logits, tiny_runner

from engine.batching.continuous import ContinuousEngine
from engine.config import EngineConfig
from engine.fidelity.reference import ReferenceCache
from engine.kernels import fused_layers, gemv_build
from engine.kernels.kernel_plan import RowPlan
from engine.model.kernel_store import KernelChoice
from engine.model.model_runner import ModelRunner

needs_kernel = pytest.mark.skipif(
    not gemv_build.available(), reason=f"not built here: {gemv_build.unavailable_reason()}"
)
# lengths far apart and more requests than slots: decode steps of 1 to 4 rows, idle slots
SPECS = [("z" * 150, 20), ("a", 30), ("hello", 12), ("y" * 60, 8), ("q", 25)]


# every family's layers run in the C++ step: Gemma 2's score soft-capping and Phi-3's partial
# RoPE (``partial_rotary_factor`` 0.5: 8 of 16 head dims rotate) included
STACKED = sorted(FAMILIES)


def _runner(plan: RowPlan, dtype: torch.dtype, family: str | None = None) -> ModelRunner:
    """The tiny runner (or ``family``'s) in ``dtype``, as if its measurement had chosen ``plan``."""
    runner = tiny_runner() if family is None else family_runner(family)
    if dtype == torch.bfloat16:
        runner.loaded.model.to(dtype)
        runner = ModelRunner(SimpleNamespace(**(vars(runner.loaded) | {"dtype": dtype})))
    runner.__dict__["kernel_choice"] = KernelChoice(plan, "measured")
    return runner


def _logits_per_step(runner, kv_mode: str, stacked: bool, specs=SPECS) -> list[torch.Tensor]:
    """Every step's logits of an engine run, with the layer stack on or off."""
    decoder = runner.fused_decoder
    stack, decoder.stack = decoder.stack, decoder.stack if stacked else None
    try:
        config = EngineConfig(4, kv_mode=kv_mode, ignore_eos=True, block_size=4)
        return step_logits(runner, config, specs)
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
@pytest.mark.parametrize("family", STACKED)
@pytest.mark.parametrize("kv_mode", ["slots", "paged"])
def test_each_familys_step_runs_in_one_call_with_the_loops_bits(family, kv_mode):
    """Each family's decode steps run the C++ step (its biases, norms, QK-norm, GELU, windows,
    per-layer RoPE, NoPE layers, multipliers), past the sliding window: every step's logits are
    bitwise the Python loop's, and the outputs equal per-request generate."""
    runner = _runner(RowPlan.single("gemv"), torch.float32, family)
    decoder = runner.fused_decoder
    assert decoder.layers_step == "C++", f"{family}: {decoder.layers_step}"
    requests = make_requests(PAST_WINDOW_SPECS)
    trace = ContinuousEngine(runner, EngineConfig(3, kv_mode=kv_mode, block_size=4)).run(requests)
    assert decoder.stack.num_calls > 5  # its decode steps (Granite's reach EOS early)
    reference = ReferenceCache(runner).outputs(requests)
    for r in trace.requests:
        assert r.output_token_ids == reference[r.request_id], f"{family} R{r.request_id}"
    got = _logits_per_step(runner, kv_mode, stacked=True, specs=PAST_WINDOW_SPECS)
    want = _logits_per_step(runner, kv_mode, stacked=False, specs=PAST_WINDOW_SPECS)
    assert len(got) == len(want) > 20
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), family


@needs_kernel
@pytest.mark.parametrize("family", STACKED)
def test_each_familys_step_in_bfloat16_has_the_loops_bits(family):
    """In bfloat16 too, each family's C++ step gives the Python loop's bits."""
    runner = _runner(RowPlan.single("gemv"), torch.bfloat16, family)
    stack = runner.fused_decoder.stack
    assert stack is not None, runner.fused_decoder.layers_step
    got = _logits_per_step(runner, "paged", stacked=True, specs=PAST_WINDOW_SPECS)
    assert stack.num_calls > 20
    want = _logits_per_step(runner, "paged", stacked=False, specs=PAST_WINDOW_SPECS)
    assert len(got) == len(want) > 20
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), family


@needs_kernel
@pytest.mark.parametrize(
    ("act", "why"), [("gelu", "the activation GELUActivation"), ("relu", "the activation ReLU")]
)
def test_a_layer_with_a_part_the_step_lacks_runs_the_loop_and_says_why(act, why):
    """An MLP activation the step does not compute (exact GELU, ReLU) keeps the Python loop; the
    reason is given, and the outputs still equal generate."""
    runner = runner_of(family_model("llama", hidden_act=act), f"tiny-llama-{act}")
    runner.__dict__["kernel_choice"] = KernelChoice(RowPlan.single("gemv"), "measured")
    decoder = runner.fused_decoder
    assert decoder.stack is None
    assert decoder.layers_step == f"Python: {why}"
    requests = make_requests(PAST_WINDOW_SPECS[:3])
    trace = ContinuousEngine(runner, EngineConfig(3, block_size=4)).run(requests)
    reference = ReferenceCache(runner).outputs(requests)
    assert {r.request_id: r.output_token_ids for r in trace.requests} == reference


@needs_kernel
@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        (
            dict(num_attention_heads=34, hidden_size=68, head_dim=16),
            "34 query heads over 2 key/value heads: the C++ attention takes up to 16 per "
            "key/value head",
        ),
        (
            dict(head_dim=288),
            "a head of 288 values: the C++ attention takes an even number up to 256",
        ),
    ],
)
@pytest.mark.parametrize("kv_mode", ["slots", "paged"])
def test_heads_past_the_attention_kernels_limits_run_the_loop_and_say_why(overrides, why, kv_mode):
    """17 query heads per key/value head, or heads of 288 values, are more than the C++
    attention holds: refused before any step, the reason given, every decode step on SDPA, and
    the outputs still equal generate."""
    runner = runner_of(family_model("llama", **overrides), "tiny-llama-wide")
    runner.__dict__["kernel_choice"] = KernelChoice(RowPlan.single("gemv"), "measured")
    decoder = runner.fused_decoder
    assert decoder.stack is None
    assert decoder.layers_step == f"Python: {why}"
    requests = make_requests(PAST_WINDOW_SPECS[:3])
    config = EngineConfig(3, kv_mode=kv_mode, block_size=4)
    trace = ContinuousEngine(runner, config).run(requests)
    reference = ReferenceCache(runner).outputs(requests)
    assert {r.request_id: r.output_token_ids for r in trace.requests} == reference


@needs_kernel
def test_the_op_refuses_lists_of_the_wrong_length():
    """Six norms a layer, four weights a layer, one key and one value cache a layer."""
    runner = _runner(RowPlan.single("gemv"), torch.float32)
    stack = runner.fused_decoder.stack
    x = torch.zeros(1, runner.model.config.hidden_size)
    rope = [torch.zeros(1, 8)] * len(stack.layer_indices)
    caches = [torch.zeros(1, 1, 4, 8)] * len(stack.layer_indices)
    with pytest.raises(RuntimeError, match="norms: 6 per layer"):
        torch.ops.cbp_step.decoder_layers(
            x, rope, rope, stack.norms[:1], stack.biases, stack.packed, stack.widths, caches,
            caches, [torch.zeros(1, 1, dtype=torch.long)] * len(caches),
            torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), 1, stack.flags,
            stack.numbers,
        )  # fmt: skip
    assert isinstance(stack, fused_layers.LayerStack)


def test_without_a_compiler_gemma2_keeps_the_loop_and_says_why(monkeypatch):
    """A host that cannot build the kernels (a Space without a C++ compiler) runs Gemma 2's
    decode steps in the Python loop, says why in ``layers_step``, and its outputs equal generate."""
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    gemv_build._built.cache_clear()
    try:
        runner = family_runner("gemma2")
        decoder = runner.fused_decoder
        assert decoder.stack is None
        assert decoder.layers_step.startswith("Python: the C++ step is not built: no C++ compiler")
        requests = make_requests(PAST_WINDOW_SPECS[:3])
        trace = ContinuousEngine(runner, EngineConfig(3, block_size=4)).run(requests)
        reference = ReferenceCache(runner).outputs(requests)
        assert {r.request_id: r.output_token_ids for r in trace.requests} == reference
    finally:
        gemv_build._built.cache_clear()
