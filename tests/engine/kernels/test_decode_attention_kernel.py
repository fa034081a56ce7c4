"""The C++ decode attention (``torch.ops.cbp_attention.decode``, ``csrc/decode_attention.cpp``):
SDPA's result over each slot's first ``kv_len`` keys, on strided key views, in float32 and
bfloat16; a whole decode step's attention in one call (``decode_step``); and the engines' decode
steps through them (skipped where they do not build)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from tiny_model import step_logits, tiny_runner

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


def _logits_per_step(runner, kv_mode: str, whole: bool, monkeypatch) -> list:
    """Every step's logits of an engine run, with decode steps planned ``whole`` or split."""
    plan = decode_attention.plan_decode
    monkeypatch.setattr(
        decode_attention, "plan_decode", lambda b, d, **kw: plan(b, d, whole=whole, **kw)
    )
    try:
        config = EngineConfig(4, kv_mode=kv_mode, ignore_eos=True, block_size=4)
        return step_logits(runner, config, WHOLE_STEP_SPECS)
    finally:
        monkeypatch.undo()


# lengths far apart, more requests than slots: split steps (solo and shared calls), idle slots
WHOLE_STEP_SPECS = [("z" * 150, 20), ("a", 30), ("hello", 12), ("y" * 60, 8), ("q", 25)]


@needs_kernel
@pytest.mark.parametrize("kv_mode", ["slots", "paged"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_whole_decode_step_in_one_call_gives_the_separate_ops_bits(dtype, kv_mode, monkeypatch):
    """``decode_step`` (rotary, KV write and attention in one call) runs the decode steps of the
    slot and the paged cache, and every step's logits are bitwise those of the rotary ops, the
    cache's write and the ``decode`` calls of the split."""
    runner = tiny_runner()
    if dtype == torch.bfloat16:
        runner.loaded.model.to(dtype)
        runner = ModelRunner(SimpleNamespace(**(vars(runner.loaded) | {"dtype": dtype})))
    planned = []
    plan = decode_attention.plan_decode

    def recorded(batch, dtype, whole=True, fits=True):
        planned.append(plan(batch, dtype, whole, fits))
        return planned[-1]

    monkeypatch.setattr(decode_attention, "plan_decode", recorded)
    got = _logits_per_step(runner, kv_mode, True, monkeypatch)
    assert sum(s is not None and s.whole_step for s in planned) > 20, "decode steps ran whole"
    want = _logits_per_step(runner, kv_mode, False, monkeypatch)
    assert len(got) == len(want) > 20
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def _step_inputs(dtype, seed=0):
    """A decode step of 3 tokens (slots 2, 0, 3 of 4) at positions 9, 0 and 5: qkv, cos, sin."""
    gen = torch.Generator().manual_seed(seed)
    heads, kv_heads, head = 6, 2, 32
    qkv = torch.randn(3, (heads + 2 * kv_heads) * head, generator=gen).to(dtype)
    cos, sin = torch.randn(2, 3, head, generator=gen).to(dtype).unbind(0)
    return qkv, cos, sin, torch.tensor([2, 0, 3]), torch.tensor([9, 0, 5]), heads


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_whole_decode_step_reads_blocks_as_a_slot_cache_reads_slots(dtype):
    """The same step over a slot cache [H_kv, B, P, D] and over blocks of 4 positions, scattered
    in a pool through a block table, writes the same keys and values and gives the same bits."""
    qkv, cos, sin, slots, positions, heads = _step_inputs(dtype)
    gen = torch.Generator().manual_seed(1)
    slot_k, slot_v = torch.randn(2, 2, 4, 12, 32, generator=gen).to(dtype).unbind(0)
    table = torch.randperm(4 * 3, generator=gen).view(4, 3) + 1  # block 0 stays unused
    pool_k, pool_v = torch.zeros(2, 2, 13, 4, 32, dtype=dtype).unbind(0)
    for slot in range(4):
        for j in range(3):
            pool_k[:, table[slot, j]] = slot_k[:, slot, 4 * j : 4 * j + 4]
            pool_v[:, table[slot, j]] = slot_v[:, slot, 4 * j : 4 * j + 4]
    call = torch.ops.cbp_attention.decode_step
    one_block_each = torch.arange(4)[:, None]
    want = call(qkv, cos, sin, slot_k, slot_v, one_block_each, slots, positions, heads, 0.3)
    got = call(qkv, cos, sin, pool_k, pool_v, table, slots, positions, heads, 0.3)
    assert torch.equal(got, want)
    for slot, pos in zip(slots.tolist(), positions.tolist(), strict=True):
        block, offset = table[slot, pos // 4], pos % 4
        assert torch.equal(pool_k[:, block, offset], slot_k[:, slot, pos])
        assert torch.equal(pool_v[:, block, offset], slot_v[:, slot, pos])
    assert pool_k[:, 0].count_nonzero() == 0, "a block outside the tables is not touched"


@needs_kernel
def test_a_whole_decode_step_refuses_what_it_cannot_serve():
    """Two tokens of one slot at one position, a position past the cache, a qkv of the wrong
    width, a block table naming a block outside the cache: refused."""
    heads, kv_heads, head = 4, 2, 16
    qkv = torch.randn(2, (heads + 2 * kv_heads) * head)
    cos = torch.randn(2, head)
    keys, values = torch.zeros(2, kv_heads, 3, 8, head).unbind(0)  # (H_kv, B, P, D) each
    table = torch.arange(3)[:, None]
    positions, slots = torch.tensor([0, 1]), torch.tensor([0, 1])
    call = torch.ops.cbp_attention.decode_step
    with pytest.raises(RuntimeError, match="one token per slot and position"):
        same = torch.tensor([1, 1])  # slot 1 at position 1, twice
        call(qkv, cos, cos, keys, values, table, same, same, heads, 0.25)
    with pytest.raises(RuntimeError, match="within the cache"):
        call(qkv, cos, cos, keys, values, table, slots, positions + 7, heads, 0.25)
    with pytest.raises(RuntimeError, match="qkv's width"):
        call(qkv[:, 1:], cos, cos, keys, values, table, slots, positions, heads, 0.25)
    with pytest.raises(RuntimeError, match="outside the cache"):
        call(qkv, cos, cos, keys, values, table + 1, slots, positions, heads, 0.25)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_prefill_chunk_in_one_step_is_its_tokens_one_step_each(dtype):
    """A step with a chunk of 5 tokens of slot 1 (positions 3 to 7, after 3 cached) beside a
    decode of slot 0 gives the bits, and leaves the cache, of 5 steps of one token each: every
    key is written before any query reads, so each chunk token sees the chunk's earlier keys."""
    gen = torch.Generator().manual_seed(3)
    heads, kv_heads, head = 6, 2, 32
    qkv = torch.randn(6, (heads + 2 * kv_heads) * head, generator=gen).to(dtype)
    cos, sin = torch.randn(2, 6, head, generator=gen).to(dtype).unbind(0)
    slots, positions = torch.tensor([0, 1, 1, 1, 1, 1]), torch.tensor([4, 3, 4, 5, 6, 7])
    cache = torch.randn(2, kv_heads, 2, 10, head, generator=gen).to(dtype)  # (2, H_kv, B, P, D)
    table = torch.arange(2)[:, None]
    call = torch.ops.cbp_attention.decode_step
    whole_k, whole_v = cache.clone().unbind(0)
    whole = call(qkv, cos, sin, whole_k, whole_v, table, slots, positions, heads, 0.2)
    one_k, one_v = cache.clone().unbind(0)
    one = torch.cat([
        call(qkv[t : t + 1], cos[t : t + 1], sin[t : t + 1], one_k, one_v, table,
             slots[t : t + 1], positions[t : t + 1], heads, 0.2)
        for t in range(6)
    ])  # fmt: skip
    assert torch.equal(whole, one)
    assert torch.equal(whole_k, one_k) and torch.equal(whole_v, one_v)
    assert not torch.equal(whole_k[:, 1, 3:8], cache[0][:, 1, 3:8]), "the chunk wrote its keys"


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rotated", "softcap"), [(16, 0.0), (32, 2.0), (16, 2.0)])
def test_a_whole_decode_step_caps_scores_and_rotates_the_first_dims(dtype, rotated, softcap):
    """Scores capped at ``softcap * tanh(s / softcap)`` before the softmax (Gemma 2), and with
    rotary tables of R < D dims only the first R of each head rotate (Phi-3's partial RoPE): the
    keys written are the fused layers' ``_rotary`` bitwise, the output within rounding of
    the capped attention in float64 over each token's keys (a sliding window of 6 for one)."""
    from engine.kernels.fused_layers import _rotary

    qkv, _, _, slots, positions, heads = _step_inputs(dtype)
    gen = torch.Generator().manual_seed(2)
    cos, sin = torch.randn(2, 3, rotated, generator=gen).to(dtype).unbind(0)
    cache = torch.randn(2, 2, 4, 12, 32, generator=gen).to(dtype)  # (2, H_kv, B, P, D)
    keys, values = cache.clone().unbind(0)
    table, scale = torch.arange(4)[:, None], 0.3
    call = torch.ops.cbp_attention.decode_step
    for window in (0, 6):
        got = call(qkv, cos, sin, keys, values, table, slots, positions, heads, scale, window,
                   softcap)  # fmt: skip
        qk = _rotary(qkv[:, : 8 * 32].view(3, 8, 32), cos[:, None], sin[:, None])  # (T, 8, D)
        for t, (slot, pos) in enumerate(zip(slots.tolist(), positions.tolist(), strict=True)):
            assert torch.equal(keys[:, slot, pos], qk[t, heads:])
            assert torch.equal(values[:, slot, pos], qkv[t, 8 * 32 :].view(2, 32))
            first = max(0, pos + 1 - window) if window else 0
            k = keys[:, slot, first : pos + 1].double().repeat_interleave(3, 0)  # (H, n, D)
            v = values[:, slot, first : pos + 1].double().repeat_interleave(3, 0)
            s = qk[t, :heads, None].double() @ k.transpose(1, 2) * scale  # (H, 1, n)
            s = torch.tanh(s / softcap) * softcap if softcap else s
            want = (torch.softmax(s, -1) @ v).reshape(-1)
            tol = 2e-5 if dtype == torch.float32 else 1e-2
            torch.testing.assert_close(got[t].double(), want, rtol=tol, atol=tol)


@needs_kernel
def test_float32_tables_rotate_bfloat16_in_float32_as_the_loop_does():
    """OLMo 2's rotary module gives float32 tables in a bfloat16 model: the step takes them and
    rotates in float32, rounding once, so the keys it writes are the fused layers' ``_rotary``
    bits, which tables cast to bfloat16 first would not give."""
    from engine.kernels.fused_layers import _rotary

    qkv, _, _, slots, positions, heads = _step_inputs(torch.bfloat16)
    cos, sin = torch.randn(2, 3, 32, generator=torch.Generator().manual_seed(2)).unbind(0)
    keys, values = torch.zeros(2, 2, 4, 12, 32, dtype=torch.bfloat16).unbind(0)
    table = torch.arange(4)[:, None]
    torch.ops.cbp_attention.decode_step(
        qkv, cos, sin, keys, values, table, slots, positions, heads, 0.3
    )
    qk = qkv[:, : 8 * 32].view(3, 8, 32)
    wide = _rotary(qk, cos[:, None], sin[:, None])  # (T, 8, D)
    narrow = _rotary(qk, cos[:, None].bfloat16(), sin[:, None].bfloat16())
    assert wide.dtype == torch.bfloat16 and not torch.equal(wide, narrow)
    for t, (slot, pos) in enumerate(zip(slots.tolist(), positions.tolist(), strict=True)):
        assert torch.equal(keys[:, slot, pos], wide[t, heads:])
