"""The engines' matmul kernels: same results as F.linear, installed only inside their block."""

import pytest
import torch
import torch.nn.functional as F
from tiny_model import tiny_runner
from torch import nn

from engine.kernels import gemv_build, kernel_plan, linear_kernel
from engine.kernels.linear_kernel import MAX_SKINNY_ROWS, onednn_linear, onednn_pack, skinny_linear

HAS_ONEDNN = torch.backends.mkldnn.is_available()


@pytest.mark.parametrize("num_rows", [0, 1, 2, 3, 17, MAX_SKINNY_ROWS, MAX_SKINNY_ROWS + 1])
@pytest.mark.parametrize("with_bias", [False, True])
def test_skinny_linear_equals_f_linear(num_rows, with_bias):
    """Any row count, 2-D or 3-D input, with or without bias: F.linear's result and shape."""
    gen = torch.Generator().manual_seed(num_rows)
    weight = torch.randn(96, 40, generator=gen)
    bias = torch.randn(96, generator=gen) if with_bias else None
    inputs = (torch.randn(num_rows, 40, generator=gen), torch.randn(1, num_rows, 40, generator=gen))
    for x in inputs:
        got, want = skinny_linear(x, weight, bias), F.linear(x, weight, bias)
        assert got.shape == want.shape and got.is_contiguous()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not HAS_ONEDNN, reason="this torch build has no oneDNN")
@pytest.mark.parametrize("num_rows", [0, 1, 3, 17, 600])
@pytest.mark.parametrize("with_bias", [False, True])
def test_onednn_linear_equals_f_linear(num_rows, with_bias):
    """Any row count, 2-D, 3-D or strided input, with or without bias: F.linear's result."""
    gen = torch.Generator().manual_seed(num_rows)
    weight = torch.randn(96, 40, generator=gen)
    bias = torch.randn(96, generator=gen) if with_bias else None
    packed = onednn_pack(weight)
    strided = torch.randn(num_rows, 80, generator=gen)[:, ::2]
    plain = torch.randn(num_rows, 40, generator=gen)
    batched = torch.randn(1, num_rows, 40, generator=gen)
    inputs = (plain, batched, strided)
    for x in inputs:
        got, want = onednn_linear(x, packed, bias), F.linear(x, weight, bias)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", linear_kernel.CANDIDATES)
@pytest.mark.parametrize("num_rows", [1, 3, 70])
def test_every_candidate_is_f_linear(name, num_rows):
    """Each bound candidate gives F.linear's result, and add() adds the residual."""
    if name.startswith("onednn") and not HAS_ONEDNN:
        pytest.skip("this torch build has no oneDNN")
    if name == "gemv" and not gemv_build.available():
        pytest.skip(f"gemv does not run here: {gemv_build.unavailable_reason()}")
    gen = torch.Generator().manual_seed(num_rows)
    weight, bias = torch.randn(48, 40, generator=gen), torch.randn(48, generator=gen)
    x, residual = torch.randn(num_rows, 40, generator=gen), torch.randn(num_rows, 48, generator=gen)
    bound = linear_kernel.bind(name, weight, bias)
    with torch.inference_mode():
        torch.testing.assert_close(bound(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
        want = residual + F.linear(x, weight, bias)
        torch.testing.assert_close(bound.add(x, residual), want, rtol=1e-5, atol=1e-5)
    packs = name.startswith("onednn") or name == "gemv"  # the kernels that keep packed copies
    assert (bound.extra_bytes > 0) == packs, bound.extra_bytes


@pytest.mark.skipif(not gemv_build.on_x86(), reason="oneDNN is used on x86 only")
def test_a_forced_onednn_packs_every_weight(monkeypatch):
    """CBP_ENGINE_KERNEL=onednn: the packed oneDNN kernel, copies at least the weights' size."""
    monkeypatch.setenv("CBP_ENGINE_KERNEL", "onednn")
    runner = tiny_runner()
    assert runner.engine_kernel_name == "onednn", "oneDNN refused the weights"
    weights = [m.weight for m in linear_kernel.linear_modules(runner.model)]
    assert runner.engine_kernel_bytes >= sum(w.numel() * w.element_size() for w in weights)


@pytest.mark.skipif(not gemv_build.on_x86(), reason="oneDNN is used on x86 only")
def test_packed_forward_goes_through_onednn_for_every_linear(monkeypatch):
    """A packed-batch forward calls the oneDNN matmul once per linear, lm_head included."""
    monkeypatch.setenv("CBP_ENGINE_KERNEL", "onednn")
    runner = tiny_runner()
    assert runner.engine_kernel_name == "onednn"  # packs (and tries) every weight, before the spy
    calls = []

    def spy(x, packed, bias=None):
        calls.append(packed)
        return onednn_linear(x, packed, bias)

    monkeypatch.setattr(linear_kernel, "onednn_linear", spy)
    with runner.engine_kernels():
        runner.model(input_ids=torch.tensor([[1, 2, 3]]))
    assert len(calls) == len(linear_kernel.linear_modules(runner.model)), len(calls)


def test_a_weight_onednn_refuses_means_skinny(monkeypatch):
    """When oneDNN cannot pack a weight, best_kernel falls back to skinny with no extra memory."""

    def refuse(weight):
        raise RuntimeError("no kernel for this weight")

    monkeypatch.setattr(linear_kernel, "onednn_pack", refuse)
    kernel = kernel_plan.best_kernel([nn.Linear(8, 4)])
    assert (kernel.name, kernel.extra_bytes) == ("skinny", 0)


def test_without_onednn_the_kernel_is_skinny(monkeypatch):
    """Where oneDNN is missing, best_kernel falls back to skinny_linear with no extra memory."""
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    layer = nn.Linear(8, 4)
    kernel = kernel_plan.best_kernel([layer])
    assert (kernel.name, kernel.extra_bytes) == ("skinny", 0)
    x = torch.randn(3, 8)
    torch.testing.assert_close(kernel.forward(layer, x), layer(x))


def test_a_host_can_forgo_the_packed_copies(monkeypatch):
    """CBP_ENGINE_KERNEL=skinny: the engines use MKL's kernel and no memory is added."""
    monkeypatch.setenv("CBP_ENGINE_KERNEL", "skinny")
    runner = tiny_runner()
    assert (runner.engine_kernel_name, runner.engine_kernel_bytes) == ("skinny", 0)


def test_a_bad_kernel_setting_is_named(monkeypatch):
    """A CBP_ENGINE_KERNEL value outside its choices is refused, naming the variable."""
    monkeypatch.setenv("CBP_ENGINE_KERNEL", "fast")
    with pytest.raises(ValueError, match="CBP_ENGINE_KERNEL='fast'"):
        tiny_runner()


def test_no_linears_means_no_kernel():
    """With nothing to route (the runner on CUDA or MPS), the kernel is "none" and adds nothing."""
    kernel = kernel_plan.best_kernel([])
    assert (kernel.name, kernel.extra_bytes) == ("none", 0)


@pytest.mark.skipif(not HAS_ONEDNN, reason="this torch build has no oneDNN")
def test_a_weight_changed_after_packing_is_caught():
    """Packed copies would go stale silently: a forward after an in-place weight change fails."""
    layer = nn.Linear(8, 4)
    kernel = kernel_plan.best_kernel([layer], "onednn")
    with torch.no_grad():
        layer.weight.mul_(2)
    with pytest.raises(AssertionError, match="changed after packing"):
        kernel.forward(layer, torch.randn(2, 8))


@pytest.mark.skipif(not HAS_ONEDNN, reason="this torch build has no oneDNN")
def test_an_installed_kernel_is_each_module_s_own_call_and_checks_its_weights():
    """Kernel.installed makes each module's forward its own PlannedLinear (no lookup per call),
    equal to F.linear; a weight changed after packing fails as the block opens."""
    layers = [nn.Linear(8, 4), nn.Linear(8, 6)]
    kernel = kernel_plan.kernel_for(layers, kernel_plan.RowPlan((1, 3), ("skinny", "onednn")))
    x = torch.randn(5, 8)
    with torch.inference_mode(), kernel.installed(layers):
        assert all(vars(m)["forward"] is kernel.modules.planned[m] for m in layers)
        torch.testing.assert_close(layers[1](x), F.linear(x, layers[1].weight, layers[1].bias))
    assert all("forward" not in vars(m) for m in layers), "the modules' own forward is back"
    with torch.no_grad():
        layers[0].weight.mul_(2)
    with pytest.raises(AssertionError, match="changed after packing"), kernel.installed(layers):
        pass
    assert all("forward" not in vars(m) for m in layers), "a refused block left a forward"


def test_installed_routes_then_restores(monkeypatch):
    """Inside the block a Linear computes with skinny_linear; after it, with its own forward."""
    layer = nn.Linear(8, 4)
    calls = []

    def spy(x, weight, bias=None):
        calls.append(x.shape)
        return skinny_linear(x, weight, bias)

    monkeypatch.setattr(linear_kernel, "skinny_linear", spy)
    with linear_kernel.installed([layer]):
        layer(torch.randn(3, 8))
    layer(torch.randn(3, 8))
    assert calls == [torch.Size([3, 8])], "exactly the call inside the block used the kernel"
    assert "forward" not in vars(layer), "the module's own forward is back"


def test_installed_restores_after_an_error():
    """An exception inside the block still leaves the modules as they were."""
    layer = nn.Linear(8, 4)
    with pytest.raises(RuntimeError), linear_kernel.installed([layer]):
        raise RuntimeError("boom")
    assert "forward" not in vars(layer)


def test_runner_installs_on_cpu_every_plain_linear():
    """On CPU the runner's engine kernel covers every nn.Linear of the model, lm_head included."""
    runner = tiny_runner()
    linears = [m for m in runner.model.modules() if isinstance(m, nn.Linear)]
    with runner.engine_kernels():
        assert all("forward" in vars(m) for m in linears)
    assert not any("forward" in vars(m) for m in linears)
    assert runner.model.lm_head in linears
