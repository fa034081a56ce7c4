"""Half-precision weights oneDNN refuses (bfloat16 on AVX2): float32 packed copies, same values."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels import kernel_plan, linear_kernel

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN"
)


def _refuse_half(monkeypatch):
    """oneDNN as on an AVX2-only CPU: float32 weights packed, half-precision ones refused."""
    pack = linear_kernel.onednn_pack

    def onednn_pack(weight):
        if weight.dtype != torch.float32:
            raise RuntimeError("bf16 path needs the cpu support avx512bw, avx512vl and avx512dq")
        return pack(weight)

    monkeypatch.setattr(linear_kernel, "onednn_pack", onednn_pack)


def _bf16_linears(seed: int) -> list[nn.Linear]:
    torch.manual_seed(seed)
    return [nn.Linear(64, n).to(torch.bfloat16) for n in (96, 32)]


def test_refused_bfloat16_gets_float32_copies(monkeypatch):
    """best_kernel picks onednn_f32, whose copies take twice the bfloat16 weights or more."""
    _refuse_half(monkeypatch)
    linears = _bf16_linears(0)
    kernel = kernel_plan.best_kernel(linears)
    assert kernel.name == "onednn_f32"
    assert kernel.extra_bytes >= sum(
        2 * m.weight.numel() * m.weight.element_size() for m in linears
    )


@pytest.mark.parametrize("num_rows", [2, 3, 17, 100])
def test_several_rows_sum_in_float32_and_round_once(monkeypatch, num_rows):
    """Rows >= 2: the float32 product of the bfloat16 values, rounded to bfloat16 once."""
    _refuse_half(monkeypatch)
    linears = _bf16_linears(num_rows)
    kernel = kernel_plan.best_kernel(linears)
    x = torch.randn(num_rows, 64).to(torch.bfloat16)
    with torch.inference_mode():
        for m in linears:
            got = kernel.forward(m, x)
            exact = F.linear(x.double(), m.weight.double(), m.bias.double())
            assert got.dtype == torch.bfloat16 and got.shape == (num_rows, m.out_features)
            # float32 sums differ from exact ones far below one bfloat16 step (2**-8 relative)
            torch.testing.assert_close(got.double(), exact, rtol=2**-8, atol=1e-3)


def test_one_row_is_the_half_precision_matmul(monkeypatch):
    """A single row goes through F.linear on the bfloat16 weight: its exact bits."""
    _refuse_half(monkeypatch)
    linears = _bf16_linears(1)
    kernel = kernel_plan.best_kernel(linears)
    x = torch.randn(1, 1, 64).to(torch.bfloat16)
    with torch.inference_mode():
        for m in linears:
            assert torch.equal(kernel.forward(m, x), F.linear(x, m.weight, m.bias))


def test_float32_weights_oneDNN_refuses_still_mean_skinny(monkeypatch):
    """The float32 copies are for half precision only: refused float32 weights get skinny."""
    monkeypatch.setattr(
        linear_kernel, "onednn_pack", lambda w: (_ for _ in ()).throw(RuntimeError())
    )
    kernel = kernel_plan.best_kernel([nn.Linear(8, 4)])
    assert (kernel.name, kernel.extra_bytes) == ("skinny", 0)
