"""The C++ bfloat16 RMSNorm and SiLU-and-mul (``torch.ops.cbp_layer``, ``csrc/layer_ops.cpp``):
the bits of the torch ops they replace, and the fused layers' bfloat16 steps through them
(skipped where the kernels do not build)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from tiny_model import step_logits, tiny_runner

from engine.config import EngineConfig
from engine.kernels import fused_layers, gemv_build
from engine.model.model_runner import ModelRunner

needs_kernel = pytest.mark.skipif(
    not gemv_build.available(), reason=f"not built here: {gemv_build.unavailable_reason()}"
)
BF16 = torch.bfloat16
# (rows, width): a decode step's 1 and 3 rows and a prefill's 300 at SmolLM2's 576, a width that
# is not a multiple of 16
NORM_SHAPES = [(1, 576), (3, 576), (300, 576), (5, 40)]


def _torch_norm(x, weight, eps):
    """The fused layers' bfloat16 RMSNorm in torch ops (transformers' LlamaRMSNorm)."""
    return torch.rms_norm(x.float(), (x.shape[-1],), None, eps).to(BF16) * weight


@needs_kernel
@pytest.mark.parametrize("shape", NORM_SHAPES)
def test_rms_norm_gives_the_torch_ops_bits(shape):
    """Bitwise the torch ops' result, on rows of a wider tensor (a strided view)."""
    gen = torch.Generator().manual_seed(shape[0])
    wide = (torch.randn(shape[0], shape[1] + 7, generator=gen) * 3).to(BF16)
    x = wide[:, 3 : 3 + shape[1]]  # row stride shape[1] + 7
    weight = (torch.rand(shape[1], generator=gen) + 0.5).to(BF16)
    got = torch.ops.cbp_layer.rms_norm(x, weight, 1e-5)
    assert got.dtype == BF16 and got.shape == x.shape
    assert torch.equal(got, _torch_norm(x, weight, 1e-5))


@needs_kernel
@pytest.mark.parametrize("shape", [(1, 1536), (3, 1536), (200, 1536), (4, 40)])
def test_silu_mul_gives_the_torch_ops_bits(shape):
    """``silu(gate) * up`` over ``gate_up = [gate | up]``, bitwise, large gates included."""
    rows, width = shape
    gen = torch.Generator().manual_seed(width)
    gate_up = (torch.randn(rows, 2 * width, generator=gen) * 6).to(BF16)
    gate_up[0, :4] = torch.tensor([-100.0, -90.0, 90.0, 0.0]).to(BF16)  # exp's ends and zero
    want = F.silu(gate_up[:, :width]) * gate_up[:, width:]
    got = torch.ops.cbp_layer.silu_mul(gate_up)
    assert got.shape == (rows, width)
    assert torch.equal(got, want)


@needs_kernel
def test_the_ops_refuse_what_they_do_not_take():
    """float32 rows, a weight of another width, an odd gate_up: refused, saying which."""
    x = torch.randn(3, 64)
    with pytest.raises(RuntimeError, match="must be bfloat16"):
        torch.ops.cbp_layer.rms_norm(x, torch.ones(64), 1e-5)
    with pytest.raises(RuntimeError, match="weight"):
        torch.ops.cbp_layer.rms_norm(x.to(BF16), torch.ones(32, dtype=BF16), 1e-5)
    with pytest.raises(RuntimeError, match=r"\[T, 2 I\]"):
        torch.ops.cbp_layer.silu_mul(torch.randn(3, 63).to(BF16))


def _bf16_runner() -> ModelRunner:
    """The tiny runner's model in bfloat16."""
    runner = tiny_runner()
    loaded = vars(runner.loaded) | {"dtype": BF16, "device_label": "CPU · bfloat16"}
    loaded["model"] = runner.loaded.model.to(BF16)
    return ModelRunner(SimpleNamespace(**loaded))


def _logits(runner) -> list[torch.Tensor]:
    return step_logits(
        runner, EngineConfig(3, ignore_eos=True), [("z" * 90, 12), ("a", 20), ("hi", 9)]
    )


@needs_kernel
def test_bfloat16_fused_steps_through_the_ops_give_the_torch_ops_logits():
    """The fused layers in bfloat16 call the ops (float32 does not), and every step's logits
    are bitwise those of the same steps through torch's ops."""
    runner = _bf16_runner()
    decoder = runner.fused_decoder
    assert decoder is not None and decoder.layer_ops
    assert not fused_layers.layer_ops_run(torch.ones(3))  # float32 keeps torch's ops
    got = _logits(runner)
    decoder.layer_ops = False
    want = _logits(runner)
    assert len(got) == len(want) > 10
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
