"""The gemv kernel (``engine/kernels/csrc/gemv.cpp``): F.linear's sums for a few rows, its
reasons where it cannot run, and generate's tokens on the real model (skipped where it does not
build: another CPU, no compiler)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.batching.continuous import ContinuousEngine
from engine.batching.static import StaticEngine
from engine.config import EngineConfig
from engine.fidelity.reference import ReferenceCache
from engine.kernels import gemv_build, kernel_plan
from engine.kernels.linear_kernel import MAX_GEMV_ROWS, bind
from engine.model.model_runner import ModelRunner
from engine.workloads.workload import seed_specs, tokenize_requests

needs_gemv = pytest.mark.skipif(
    not gemv_build.available(), reason=f"gemv does not run here: {gemv_build.unavailable_reason()}"
)
# (N, K): a shape that is not a multiple of the 16-output block, and SmolLM2's own
SHAPES = [(37, 29), (960, 576), (576, 1536)]
ROWS = [1, 2, 3, 5, 8, 9, 16, 17]  # one pass, two passes (9 to 16), F.linear (17)


def _case(n: int, k: int, m: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(n * 1000 + k + m)
    weight = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
    x, residual = torch.randn(m, k, generator=gen), torch.randn(m, n, generator=gen)
    return weight, x.to(dtype), residual.to(dtype)


@needs_gemv
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("num_rows", ROWS)
def test_float32_is_f_linear_to_rounding(shape, num_rows):
    """float32: within float32 rounding of the float64 product, as F.linear is, with and without
    the residual; the shape of the output is F.linear's."""
    weight, x, residual = _case(*shape, num_rows, torch.float32)
    exact = x.double() @ weight.double().T
    bound = bind("gemv", weight)
    with torch.inference_mode():
        got, added = bound(x), bound.add(x, residual)
    assert got.shape == (num_rows, shape[0]) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(added.double(), exact + residual.double(), rtol=1e-5, atol=1e-5)


@needs_gemv
@pytest.mark.parametrize("num_rows", [1, 3, 8, 12])
def test_bfloat16_rounds_the_float32_sum_once_then_adds(num_rows):
    """bfloat16: the float32 sum rounded to nearest even (at most one bfloat16 step from
    rounding the float64 product: the float32 sums may lie on either side of a tie), then the
    residual added and rounded again, as a bfloat16 matmul then an add."""
    weight, x, residual = _case(960, 576, num_rows, torch.bfloat16)
    exact = (x.double() @ weight.double().T).to(torch.bfloat16)
    bound = bind("gemv", weight)
    with torch.inference_mode():
        got, added = bound(x), bound.add(x, residual)
    assert got.dtype == torch.bfloat16
    step = exact.double().abs().clamp_min(1e-30) * 2**-7  # one bfloat16 step at that size
    assert ((got.double() - exact.double()).abs() <= step).all()
    want = (got.float() + residual.float()).to(torch.bfloat16)  # the add after the rounding
    assert torch.equal(added, want)


@needs_gemv
def test_a_plan_with_another_kernel_above_gemvs_rows_drops_the_plain_weight():
    """Bound for a plan that gives more than ``MAX_GEMV_ROWS`` rows to oneDNN, gemv keeps no
    plain weight (a stacked copy made for it is freed) and that plan still computes F.linear at
    every row count; gemv at every row count keeps it, for F.linear above its rows."""
    weight, x, _ = _case(960, 576, MAX_GEMV_ROWS + 4, torch.float32)
    split = kernel_plan.RowPlan((1, MAX_GEMV_ROWS + 1), ("gemv", "onednn"))
    bound = kernel_plan.bind_plan(split, weight, None)
    assert bound["gemv"].weight is None, "oneDNN has the rows past gemv's: no plain copy kept"
    for m in (1, MAX_GEMV_ROWS, MAX_GEMV_ROWS + 4):
        out = bound[split.name_at(m)](x[:m])
        torch.testing.assert_close(out, F.linear(x[:m], weight), msg=f"{m} rows")
    alone = kernel_plan.bind_plan(kernel_plan.RowPlan.single("gemv"), weight, None)
    assert alone["gemv"].weight is weight, "gemv at every row count keeps the weight for F.linear"


@needs_gemv
def test_an_input_with_leading_dimensions_keeps_them():
    """[B, S, K] -> [B, S, N], as an nn.Linear's forward."""
    weight, x, _ = _case(48, 40, 6, torch.float32)
    with torch.inference_mode():
        got = bind("gemv", weight)(x.view(2, 3, 40))
    torch.testing.assert_close(got, F.linear(x, weight).view(2, 3, 48), rtol=1e-5, atol=1e-5)
    assert MAX_GEMV_ROWS >= 8


def test_off_says_so_and_the_named_kernel_falls_back(monkeypatch):
    """CBP_GEMV=off: the reason names it, binding refuses, and a plan that names gemv runs
    skinny instead (no extra memory)."""
    monkeypatch.setenv("CBP_GEMV", "off")
    assert gemv_build.unavailable_reason() == "CBP_GEMV=off"
    with pytest.raises(RuntimeError, match="CBP_GEMV=off"):
        bind("gemv", torch.randn(4, 4))
    linear = torch.nn.Linear(8, 4, bias=False)
    assert kernel_plan.best_kernel([linear], "gemv").plan.label == "skinny"


def test_a_bad_setting_is_refused_with_the_choices(monkeypatch):
    monkeypatch.setenv("CBP_GEMV", "yes")
    with pytest.raises(ValueError, match=r"CBP_GEMV='yes'.*'auto'.*'off'"):
        gemv_build.unavailable_reason()


def test_no_compiler_is_named(monkeypatch):
    """Where the C++ compiler is missing, the reason says so (checked before any build)."""
    monkeypatch.setattr(gemv_build.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(
        gemv_build.torch.cpu, "get_capabilities", lambda: dict.fromkeys(gemv_build.NEEDED_SETS, 1)
    )
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    assert "no C++ compiler" in gemv_build.host_reason()


def test_another_cpu_is_named(monkeypatch):
    monkeypatch.setattr(gemv_build.platform, "machine", lambda: "aarch64")
    assert "x86-64" in gemv_build.host_reason()
    monkeypatch.setattr(gemv_build.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(gemv_build.torch.cpu, "get_capabilities", lambda: {"avx512_f": True})
    assert "lacks avx512_bw, avx512_vl" in gemv_build.host_reason()


@pytest.fixture(scope="module")
def gemv_runner(embedded_model):
    """The embedded model with gemv at every row count up to 16 (F.linear above)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CBP_ENGINE_KERNEL", "gemv")
        runner = ModelRunner(embedded_model)
        if runner.engine_kernel.plan.label != "gemv":
            pytest.skip(f"gemv does not run here: {gemv_build.unavailable_reason()}")
        yield runner


@pytest.mark.real_model
def test_real_model_outputs_equal_generate(gemv_runner):
    """float32 on the article's six requests at their own caps: static and continuous give
    per-request generate's tokens with gemv's matmuls at every decode step (up to 3 rows; prompt
    chunks of more than 16 rows go through F.linear)."""
    runner = gemv_runner
    requests = tokenize_requests(
        seed_specs(), runner.tokenizer, chat_template=True, max_context=runner.loaded.max_context
    )
    reference = ReferenceCache(runner).outputs(requests)
    engines = {
        "static": StaticEngine(runner, EngineConfig(3)),
        "continuous": ContinuousEngine(runner, EngineConfig(3)),
    }
    for name, engine in engines.items():
        for r in engine.run(requests).requests:
            assert r.output_token_ids == reference[r.request_id], f"{name} R{r.request_id}"


def test_a_host_that_can_build_the_kernels_builds_them(monkeypatch):
    """Where the CPU, the compiler and ninja allow it, the build succeeds: a source that stops
    compiling fails here, instead of skipping every kernel test and running the engines
    without their kernels."""
    monkeypatch.setenv("CBP_GEMV", "auto")
    if gemv_build.host_reason() is not None:
        pytest.skip(f"this host cannot build the kernels: {gemv_build.host_reason()}")
    assert gemv_build.unavailable_reason() is None
    for op in ("cbp_gemv.linear", "cbp_attention.decode_step", "cbp_layer.rms_norm"):
        library, name = op.split(".")
        assert hasattr(getattr(torch.ops, library), name), op
