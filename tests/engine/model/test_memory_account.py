"""The memory account: each weight copy the kernels keep belongs to a chosen kernel, and a
module's weight is packed once per kernel (the fused layers share o and down)."""

import pytest
import torch
from tiny_model import make_requests, tiny_runner

from engine.batching.continuous import ContinuousEngine
from engine.config import EngineConfig
from engine.kernels import gemv_build, linear_kernel
from engine.kernels.kernel_plan import RowPlan
from engine.model.kernel_store import KernelChoice
from engine.model.memory_account import memory_account, memory_summary
from engine.model.model_runner import ModelRunner

HAS_ONEDNN = torch.backends.mkldnn.is_available()
PACKED = [n for n in ("gemv", "onednn") if n != "gemv" or gemv_build.available()]
PACKED = [n for n in PACKED if n != "onednn" or HAS_ONEDNN]
PLAN = RowPlan((1, 17)[: len(PACKED)], tuple(PACKED)) if PACKED else RowPlan.single("linear")


def _runner_after_a_continuous_run():
    """The tiny model's runner on ``PLAN`` (as if measured), its fused layers made by a run."""
    runner = tiny_runner()
    runner.__dict__["kernel_choice"] = KernelChoice(PLAN, "measured")
    ContinuousEngine(runner, EngineConfig(2)).run(make_requests([("hello", 6), ("a", 4)]))
    assert runner.fused_decoder is not None
    return runner


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def test_each_copy_kept_is_a_chosen_kernels_and_each_weight_is_packed_once_per_kernel():
    runner = _runner_after_a_continuous_run()
    fused, modules = runner.fused_decoder, runner.engine_kernel.modules
    planned = [*modules.planned.values(), *fused.planned]
    for p in planned:
        assert set(p.bytes_by_kernel()) <= {*PLAN.kernels, "stacked"}, p.kernel_names
    for layer in fused.layers:  # o and down: the engines' own, not packed again
        assert layer.o is modules.planned[layer.spec.o]
        assert layer.down is modules.planned[layer.spec.down]
    # per packed kernel: one copy of every linear (oneDNN's blocked layout pads it, 11 % here),
    # none for the stacked qkv and gate_up (their copies would be 63 % more)
    linears = sum(_nbytes(m.weight) for m in modules.planned)
    account = memory_account(runner)
    assert account["weights_bytes"] == sum(_nbytes(p) for p in runner.model.parameters())
    for name in PACKED:
        assert 0 < account["packed_bytes"][name] <= 1.2 * linears, name
    if "gemv" in PACKED:  # q, k, v, gate and up run on blocks of the stacked copies
        assert account["packed_bytes"]["gemv"] == linears
    assert account["packed_total_bytes"] == sum(account["packed_bytes"].values())
    assert account["packed_total_bytes"] == runner.engine_kernel_bytes


def test_the_account_counts_only_what_was_made_and_says_it_in_words():
    runner = tiny_runner()
    account = memory_account(runner)  # nothing made yet: no copies, nothing built here
    assert account["packed_total_bytes"] == 0 and "engine_kernel" not in runner.__dict__
    runner = _runner_after_a_continuous_run()
    account = memory_account(runner)
    words = memory_summary(account, 3 * 10**9)
    assert words.startswith("peak RSS 3.0 GB; weights ")
    assert all(name in words for name in PACKED)


def test_a_gemv_kernel_on_blocks_of_the_stacked_copy_gives_its_own_copys_bits():
    if "gemv" not in PACKED:
        return  # the kernel does not build here: nothing is shared
    runner = _runner_after_a_continuous_run()
    modules = runner.engine_kernel.modules.planned
    x = torch.randn(3, runner.model.config.hidden_size)
    for module in runner.fused_decoder.layers[0].spec.qkv:
        shared = modules[module].kernel_at(3)
        assert shared.shares_packed, "not a view into the stacked copy"
        own = linear_kernel.bind("gemv", module.weight.detach(), module.bias)
        assert torch.equal(shared(x), own(x))


@pytest.mark.real_model
@pytest.mark.parametrize("plan", [PLAN, RowPlan.single(PACKED[-1] if PACKED else "linear")])
def test_the_embedded_model_keeps_one_copy_per_weight_per_packed_kernel(embedded_model, plan):
    """SmolLM2-135M on a plan of two packed kernels (gemv+onednn, as measured on this project's
    EPYC) keeps two copies of its weights, on one packed kernel one: within 1.5x the weights."""
    runner = ModelRunner(embedded_model)
    runner.__dict__["kernel_choice"] = KernelChoice(plan, "measured")
    assert runner.fused_decoder is not None  # made with the engines' kernel, as a run makes it
    account = memory_account(runner)
    weights = account["weights_bytes"]
    for name in plan.kernels:
        assert account["packed_bytes"].get(name, 0) <= 1.02 * weights, name
    packed = [n for n in plan.kernels if n in ("gemv", "onednn")]
    assert account["packed_total_bytes"] <= 1.02 * len(packed) * weights
    if len(packed) == 1:
        assert account["packed_total_bytes"] <= 1.5 * weights


@pytest.mark.skipif(PACKED != ["gemv", "onednn"], reason="needs the gemv kernel and oneDNN")
def test_the_copy_bound_drops_copies_and_keeps_the_outputs(monkeypatch):
    """Under CBP_WEIGHT_COPIES_MAX=1.0, on a fixed timing table where gemv saves the most per
    token (as in test_copy_budget), the copies kept stay within the weights' bytes (every gemv
    copy fits), oneDNN's are the ones dropped, the account and the model line say so, and
    outputs equal the reference."""
    from engine.fidelity.reference import ReferenceCache
    from engine.kernels.kernel_timing import Timings

    monkeypatch.setenv("CBP_WEIGHT_COPIES_MAX", "1.0")
    times = {"linear": (10.0, 100.0), "skinny": (8.0, 120.0), "gemv": (4.0, None)}
    times["onednn"] = (6.0, 60.0)
    timings = Timings((1, 64), times, 7, 14, 100, 0.1, 1)
    runner = tiny_runner()
    runner.__dict__["kernel_choice"] = KernelChoice(PLAN, "measured", timings)
    requests = make_requests([("hello there", 6), ("a", 4), ("long " * 9, 3)])
    reference = ReferenceCache(runner).outputs(requests)
    trace = ContinuousEngine(runner, EngineConfig(2)).run(requests)
    assert {r.request_id: r.output_token_ids for r in trace.requests} == reference
    account = memory_account(runner)
    assert account["packed_total_bytes"] <= account["weights_bytes"], account
    dropped = account["copy_budget"]["dropped"]
    assert dropped and {d["kernel"] for d in dropped} == {"onednn"}, dropped
    assert "dropped onednn of" in memory_summary(account, None)
    assert "dropped onednn of" in runner.kernel_summary()
