"""The C++ decode attention (``torch.ops.cbp_attention.decode``, ``csrc/decode_attention.cpp``):
SDPA's result over each slot's first ``kv_len`` keys, on strided key views, in float32 and
bfloat16; and the engines' decode steps through it (skipped where it does not build)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.kernels import decode_attention, gemv_build

needs_kernel = pytest.mark.skipif(
    not gemv_build.available(), reason=f"not built here: {gemv_build.unavailable_reason()}"
)
# (slots, key/value heads, query heads per key/value head, head size, keys): SmolLM2's 3 x 3 x 64,
# one query head each, a head size that is not a multiple of 16, a long sequence
SHAPES = [(3, 3, 3, 64, 200), (2, 1, 1, 64, 7), (4, 2, 5, 40, 33), (1, 3, 3, 64, 1500)]


def _reference(q, k, v, lens, scale):
    """SDPA in float64 with each slot's keys past ``lens`` masked (a slot with none: zeros)."""
    keep = torch.arange(k.shape[2])[None, :] < lens[:, None]  # (B, T)
    mask = torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, float("-inf"))
    out = F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=mask[:, None, None, :], scale=scale
    )
    return torch.where((lens > 0)[:, None, None, None], out, torch.zeros_like(out))


def _case(shape, dtype, seed=0):
    slots, heads, group, head, keys = shape
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(slots, heads, group, head, generator=gen).to(dtype)
    # keys and values as a slot cache holds them: [B, H_kv, P, D] with room past the keys given
    store = torch.randn(2, slots, heads, keys + 5, head, generator=gen).to(dtype)
    k, v = store[0, :, :, :keys], store[1, :, :, :keys]
    lens = torch.randint(1, keys + 1, (slots,), generator=gen)
    lens[0] = keys  # one slot at the full length
    return q, k, v, lens


@needs_kernel
@pytest.mark.parametrize("shape", SHAPES)
def test_float32_is_sdpa_over_each_slots_keys(shape):
    """float32: within float32 rounding of SDPA (in float64) over each slot's first kv_len keys,
    reading the keys and values as strided views of a larger cache."""
    q, k, v, lens = _case(shape, torch.float32)
    scale = shape[3] ** -0.5
    out = torch.ops.cbp_attention.decode(q, k, v, lens, scale)
    assert out.shape == q.shape and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), _reference(q, k, v, lens, scale), rtol=2e-5, atol=2e-6)


@needs_kernel
@pytest.mark.parametrize("shape", SHAPES[:3])
def test_bfloat16_is_the_float32_result_rounded(shape):
    """bfloat16 inputs: the float64 SDPA result on the same values, rounded once to bfloat16
    (within one bfloat16 step)."""
    q, k, v, lens = _case(shape, torch.bfloat16, seed=1)
    scale = shape[3] ** -0.5
    out = torch.ops.cbp_attention.decode(q, k, v, lens, scale)
    assert out.dtype == torch.bfloat16
    expected = _reference(q, k, v, lens, scale)
    torch.testing.assert_close(out.double(), expected, rtol=8e-3, atol=1e-3)


@needs_kernel
def test_a_slot_with_no_keys_gets_zeros_and_transposed_gathers_are_read():
    """A slot whose kv_len is 0 gets a zero row; keys gathered as a paged cache gathers them
    ([H_kv, B * T, D] viewed as [B, H_kv, T, D]: a transposed view) give SDPA's result."""
    slots, heads, group, head, keys = 3, 3, 3, 64, 20
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(slots, heads, group, head, generator=gen)
    picked = torch.randn(2, heads, slots * keys, head, generator=gen)
    k = picked[0].view(heads, slots, keys, head).transpose(0, 1)  # (B, H_kv, T, D)
    v = picked[1].view(heads, slots, keys, head).transpose(0, 1)
    lens = torch.tensor([keys, 0, 5])
    out = torch.ops.cbp_attention.decode(q, k, v, lens, 0.125)
    assert torch.equal(out[1], torch.zeros_like(out[1])), "no keys: a zero row"
    torch.testing.assert_close(out.double(), _reference(q, k, v, lens, 0.125), rtol=2e-5, atol=2e-6)


@needs_kernel
def test_bad_inputs_are_refused_with_their_reason():
    """A key count past the keys given, and mismatched shapes, raise with what is wrong."""
    q, k, v, lens = _case(SHAPES[1], torch.float32)
    with pytest.raises(RuntimeError, match="kv_lens must lie within"):
        torch.ops.cbp_attention.decode(q, k, v, lens + k.shape[2], 0.125)
    with pytest.raises(RuntimeError, match="must agree"):
        torch.ops.cbp_attention.decode(q, k[:, :, :, :32], v[:, :, :, :32], lens, 0.125)


def test_the_kernel_serves_cpu_float32_and_bfloat16_only_where_built(monkeypatch):
    """Decode steps use the kernel on the CPU in float32 and bfloat16 where it is built, and SDPA
    with ``CBP_GEMV=off``, in float16, or on another device."""
    cpu = torch.device("cpu")
    built = gemv_build.available()
    assert decode_attention.kernel_runs(cpu, torch.float32) is built
    assert decode_attention.kernel_runs(cpu, torch.bfloat16) is built
    assert not decode_attention.kernel_runs(cpu, torch.float16)
    assert not decode_attention.kernel_runs(torch.device("meta"), torch.float32)
    monkeypatch.setenv("CBP_GEMV", "off")
    assert not decode_attention.kernel_runs(cpu, torch.float32)
