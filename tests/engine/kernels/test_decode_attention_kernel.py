"""The C++ decode attention (``torch.ops.cbp_attention.decode``, ``csrc/decode_attention.cpp``):
SDPA's result over each slot's first ``kv_len`` keys, on strided key views, in float32 and
bfloat16; a whole decode step's attention in one call (``decode_step``); and the engines' decode
steps through them (skipped where they do not build)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from tiny_model import make_requests, tiny_runner

from engine.batching.continuous import ContinuousEngine
from engine.config import EngineConfig
from engine.kernels import decode_attention, gemv_build
from engine.model.model_runner import ModelRunner

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


def _logits_per_step(runner, kv_mode: str, whole_step: bool | None, monkeypatch) -> list:
    """Every step's logits of an engine run whose decode splits have ``whole_step`` forced
    (None: as planned)."""
    if whole_step is not None:
        plan = decode_attention.plan_decode

        def forced(batch, dtype):
            split = plan(batch, dtype)
            return split if split is None else dataclasses.replace(split, whole_step=whole_step)

        monkeypatch.setattr(decode_attention, "plan_decode", forced)
    caught = []
    head = runner.model.get_output_embeddings()
    handle = head.register_forward_hook(lambda m, i, out: caught.append(out.detach().clone()))
    try:
        config = EngineConfig(4, kv_mode=kv_mode, ignore_eos=True)
        ContinuousEngine(runner, config).run(make_requests(WHOLE_STEP_SPECS))
    finally:
        handle.remove()
        monkeypatch.undo()
    return caught


# lengths far apart, more requests than slots: split steps (solo and shared calls), idle slots
WHOLE_STEP_SPECS = [("z" * 150, 20), ("a", 30), ("hello", 12), ("y" * 60, 8), ("q", 25)]


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_whole_decode_step_in_one_call_gives_the_separate_ops_bits(dtype, monkeypatch):
    """``decode_step`` (rotary, KV write and attention in one call) runs the slot cache's decode
    steps, and every step's logits are bitwise those of the rotary ops, the cache's write and the
    ``decode`` calls of the split; the paged cache keeps the separate calls."""
    runner = tiny_runner()
    if dtype == torch.bfloat16:
        runner.loaded.model.to(dtype)
        runner = ModelRunner(SimpleNamespace(**(vars(runner.loaded) | {"dtype": dtype})))
    planned = []
    plan = decode_attention.plan_decode
    monkeypatch.setattr(
        decode_attention, "plan_decode", lambda b, d: planned.append(plan(b, d)) or planned[-1]
    )
    got = _logits_per_step(runner, "slots", None, monkeypatch)
    assert any(s is not None and s.whole_step for s in planned), "decode steps ran whole"
    want = _logits_per_step(runner, "slots", False, monkeypatch)
    assert len(got) == len(want) > 20
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    paged = []
    monkeypatch.setattr(
        decode_attention, "plan_decode", lambda b, d: paged.append(plan(b, d)) or paged[-1]
    )
    _logits_per_step(runner, "paged", None, monkeypatch)
    assert not any(s is not None and s.whole_step for s in paged)


@needs_kernel
def test_a_whole_decode_step_refuses_what_it_cannot_serve():
    """Two tokens of one slot, a position past the cache, a qkv of the wrong width: refused."""
    heads, kv_heads, head = 4, 2, 16
    qkv = torch.randn(2, (heads + 2 * kv_heads) * head)
    cos = torch.randn(2, head)
    keys, values = torch.zeros(2, 3, kv_heads, 8, head).unbind(0)
    positions = torch.tensor([0, 1])
    call = torch.ops.cbp_attention.decode_step
    with pytest.raises(RuntimeError, match="one token per slot"):
        call(qkv, cos, cos, keys, values, torch.tensor([1, 1]), positions, heads, 0.25)
    with pytest.raises(RuntimeError, match="within the cache"):
        call(qkv, cos, cos, keys, values, torch.tensor([0, 1]), positions + 7, heads, 0.25)
    with pytest.raises(RuntimeError, match="qkv's width"):
        call(qkv[:, 1:], cos, cos, keys, values, torch.tensor([0, 1]), positions, heads, 0.25)
