"""Decode attention that reads each slot's own keys, not every slot padded to the longest one.

A masked call still reads every masked key, so ``plan_decode`` gives the ``k`` longest sequences a
call each and the rest one shared call, ``k`` minimizing key rows plus ``CALL_COST_KEYS`` a call::

    kv lengths   slot 0: 300   slot 1: 40   slot 2: 35   slot 3: idle
    one call     4 x 300 = 1200 key rows read
    split        300 (slot 0 alone)  +  4 x 40 (the rest, padded to 40)  =  460

Calls go through the C++ ``torch.ops.cbp_attention`` where it runs, else SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.kernels import gemv_build
from engine.kernels.linear_kernel import MAX_GEMV_ROWS
from engine.serving.kv_cache import InPlaceKVCache
from engine.serving.packed_batch import PackedBatch

# One more SDPA call (dispatch, output copy) costs about as much as reading this many key rows of
# one slot (H_kv = 3, D = 64): ~15 us per call against ~0.1 us per key row on the 2-core CPU.
CALL_COST_KEYS = 128
# The most tokens a step with prefill chunks may have for ``decode_step`` to serve it: one query
# per token reads its keys alone, which flash attention's blocks beat on a long prompt; at this
# many rows the gemv kernel still serves the matmuls (``MAX_GEMV_ROWS``), so the whole step runs
# in one call (``engine.kernels.fused_layers.LayerStack``).
MAX_WHOLE_STEP_TOKENS = MAX_GEMV_ROWS
# What the C++ kernels hold in registers (csrc/decode_attention.cpp's kMaxGroup, and kMaxChunks
# 16-float chunks of a head): query heads per key/value head, and values per head.
MAX_GROUP = 16
MAX_HEAD_DIM = 256


@dataclass
class DecodeSplit:
    """How one step's attention is split into calls (the same in every layer); ``whole_step``:
    ``decode_step`` does all of it.

    Shapes:
        shared_rows, shared_slots: [S_sh]   tokens (and slots) of the shared call
        shared_mask: [B, 1, 1, width]        additive, for SDPA; None without a shared call
        shared_lens: [B]                     keys per slot in the shared call (0: left unattended)
        solo: (index, kv_len) per sequence that gets its own call (its token row is its index)
    """

    width: int  # keys of the shared call: the longest kv_len among its sequences (0: no call)
    all_slots: bool  # every slot decodes, token t = slot t: the shared call needs no scatter
    shared_rows: torch.Tensor
    shared_slots: torch.Tensor
    shared_mask: torch.Tensor | None
    solo: list[tuple[int, int]]
    kernel: bool = False  # calls go to torch.ops.cbp_attention.decode, not SDPA
    shared_lens: torch.Tensor | None = None
    whole_step: bool = False  # the kernel, an in-place cache: ``decode_step`` does the layer's all


def plan_decode(
    batch: PackedBatch, dtype: torch.dtype, whole: bool = True, fits: bool = True
) -> DecodeSplit | None:
    """The split for a decode-only step in the ``slots`` or ``paged`` KV mode, else None;
    ``whole``: a step ``decode_step`` serves (also one with prefill chunks, up to
    ``MAX_WHOLE_STEP_TOKENS`` tokens) is ``whole_step``; ``fits``: ``kernel_refusal`` is None
    (else SDPA serves)."""
    if batch.packed_mask is not None:
        return None
    kernel = fits and kernel_runs(batch.input_ids.device, dtype)
    short = batch.input_ids.shape[1] <= MAX_WHOLE_STEP_TOKENS
    if whole and kernel and isinstance(batch.kv_cache, InPlaceKVCache) and short:
        none = batch.slot_ids[:0]
        return DecodeSplit(0, False, none, none, None, [], kernel=True, whole_step=True)
    if batch.prefills or batch.decode_mask is None:
        return None
    kv_lens = [n + 1 for n in batch.num_cached]  # token i is sequence i's only query
    order = sorted(range(len(kv_lens)), key=lambda i: -kv_lens[i])
    num_solo = _best_num_solo([kv_lens[i] for i in order], batch.num_slots)
    solo = [(i, kv_lens[i]) for i in order[:num_solo]]
    shared = sorted(order[num_solo:])
    width = max((kv_lens[i] for i in shared), default=0)
    rows = torch.tensor(shared, dtype=torch.long)
    mask = lens = None
    if shared and kernel:
        lens = torch.zeros(batch.num_slots, dtype=torch.long)  # (B,)
        lens[[batch.seqs[i].slot for i in shared]] = torch.tensor([kv_lens[i] for i in shared])
    elif shared:
        keep = batch.decode_mask[..., :width]  # (B, 1, 1, width)
        mask = torch.zeros(keep.shape, dtype=dtype, device=keep.device)
        mask.masked_fill_(~keep, float("-inf"))  # what SDPA makes of a boolean mask
    return DecodeSplit(
        width=width,
        all_slots=batch.all_slots_decode,
        shared_rows=rows.to(batch.input_ids.device),
        shared_slots=batch.slot_ids[rows.to(batch.slot_ids.device)],
        shared_mask=mask,
        solo=solo,
        kernel=kernel,
        shared_lens=lens,
    )


def one_call(batch: PackedBatch) -> DecodeSplit:
    """Every single-query sequence in one call over all slots, under ``batch.decode_mask``."""
    return DecodeSplit(
        width=batch.decode_mask.shape[-1],
        all_slots=batch.all_slots_decode,
        shared_rows=batch.decode_rows,
        shared_slots=batch.decode_slots,
        shared_mask=batch.decode_mask,
        solo=[],
    )


def kernel_runs(device: torch.device, dtype: torch.dtype) -> bool:
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return False
    return gemv_build.available()


def kernel_refusal(num_heads: int, num_kv_heads: int, head_dim: int) -> str | None:
    """Why the C++ kernels cannot attend with these heads, or None where they can."""
    group = num_heads // num_kv_heads
    if num_heads % num_kv_heads or group > MAX_GROUP:
        return (
            f"{num_heads} query heads over {num_kv_heads} key/value heads: the C++ attention "
            f"takes up to {MAX_GROUP} per key/value head"
        )
    if head_dim > MAX_HEAD_DIM or head_dim % 2:
        return (
            f"a head of {head_dim} values: the C++ attention takes an even number up to "
            f"{MAX_HEAD_DIM}"
        )
    return None


def _attend(q, keys, values, lens, mask, scaling, kernel: bool, softcap=None) -> torch.Tensor:
    """Shapes: q [B, H_kv, G, D];  keys, values [B, H_kv, T_kv, D];  lens [B]  ->  as q."""
    if kernel:
        return torch.ops.cbp_attention.decode(q, keys, values, lens, scaling)
    return sdpa(q, keys, values, mask, scaling, softcap)


def sdpa(q, keys, values, mask, scaling, softcap=None, is_causal=False) -> torch.Tensor:
    """SDPA with grouped-query heads; ``softcap``: Gemma 2's ``softcap * tanh(s / softcap)``.

    Shapes:
        q: [..., H, n, D];  keys, values: [..., H_kv, m, D];  mask: bool or additive,
        broadcast to [..., H, n, m], or None  ->  returns [..., H, n, D]
    """
    if softcap is None:
        gqa = q.shape[-3] != keys.shape[-3]
        return F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, is_causal=is_causal, scale=scaling, enable_gqa=gqa
        )
    group = q.shape[-3] // keys.shape[-3]
    keys, values = (t.repeat_interleave(group, dim=-3) for t in (keys, values))
    scores = torch.tanh(torch.matmul(q, keys.transpose(-1, -2)) * scaling / softcap) * softcap
    if is_causal:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        scores = scores + mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, values)


def _best_num_solo(sorted_lens: list[int], num_slots: int) -> int:
    best_k, best_cost = 0, None
    for k in range(len(sorted_lens) + 1):
        shared = 0 if k == len(sorted_lens) else CALL_COST_KEYS + num_slots * sorted_lens[k]
        cost = k * CALL_COST_KEYS + sum(sorted_lens[:k]) + shared
        if best_cost is None or cost < best_cost:
            best_k, best_cost = k, cost
    return best_k


def decode_step(
    qkv,
    cos,
    signed_sin,
    layer: int,
    batch: PackedBatch,
    num_heads: int,
    scaling,
    window=None,
    softcap=None,
):
    """Rotary, KV write and attention of one layer in one call (as vLLM's
    ``v1/attention/backends/cpu_attn.py`` writes the cache inside its op).
    Shapes: qkv: [T, (H + 2 H_kv) D];  cos, signed_sin: [T, R], R <= D  ->  returns [T, H D]"""
    keys, values = batch.kv_cache.block_storage(layer)  # (H_kv, N, S, D) each
    positions = batch.position_ids[0]  # (T,)
    table = batch.kv_cache.layer_block_table(layer, batch)  # (B, M)
    return torch.ops.cbp_attention.decode_step(
        qkv, cos, signed_sin, keys, values, table, batch.slot_ids, positions, num_heads, scaling,
        window or 0, softcap or 0.0,
    )  # fmt: skip


def decode_attention(
    query, cache, layer: int, batch: PackedBatch, split: DecodeSplit, scaling, softcap=None
):
    """One layer's attention of a decode-only step, after its keys/values are written. Shapes:
    query: [1, H, T, D]  ->  returns [1, T, H, D]"""
    num_heads, num_tokens, head_dim = query.shape[1:]
    if split.all_slots and split.width:
        out = _shared_all_slots(query, cache, layer, batch, split, scaling, softcap)  # (T, H, D)
    else:
        out = query.new_empty(num_tokens, num_heads, head_dim)  # (T, H, D)
        if split.width:
            _shared_scattered(query, cache, layer, batch, split, (scaling, softcap), out)
    for row, kv_len in split.solo:
        keys, values = (t[None] for t in cache.sequence_kv(layer, batch, row))  # (1, H_kv, kv, D)
        q = query[0, :, row].view(1, keys.shape[1], -1, head_dim)  # (1, H_kv, G, D)
        lens = torch.tensor([kv_len]) if split.kernel else None
        o = _attend(q, keys, values, lens, None, scaling, split.kernel, softcap)
        out[row] = o.reshape(num_heads, head_dim)
    return out[None]


def _shared_all_slots(query, cache, layer, batch, split, scaling, softcap) -> torch.Tensor:
    keys, values = cache.slot_view(layer, batch, split.width)  # (B, H_kv, width, D)
    num_heads, num_slots, head_dim = query.shape[1:]
    num_kv_heads = keys.shape[1]
    q = query[0].view(num_kv_heads, num_heads // num_kv_heads, num_slots, head_dim)
    q = q.permute(2, 0, 1, 3)  # (B, H_kv, G, D)
    lens, mask = split.shared_lens, split.shared_mask
    o = _attend(q, keys, values, lens, mask, scaling, split.kernel, softcap)
    return o.reshape(num_slots, num_heads, head_dim)


def _shared_scattered(query, cache, layer, batch, split, scaling_softcap, out) -> None:
    keys, values = cache.slot_view(layer, batch, split.width)  # (B, H_kv, width, D)
    num_heads, head_dim = query.shape[1], query.shape[-1]
    num_slots, num_kv_heads = keys.shape[:2]
    rows, slots = split.shared_rows, split.shared_slots
    q = query[0][:, rows].view(num_kv_heads, num_heads // num_kv_heads, len(rows), head_dim)
    q_slots = query.new_zeros(num_slots, num_kv_heads, num_heads // num_kv_heads, head_dim)
    q_slots[slots] = q.permute(2, 0, 1, 3)  # (B, H_kv, G, D)
    scaling, softcap = scaling_softcap
    lens, mask = split.shared_lens, split.shared_mask
    o = _attend(q_slots, keys, values, lens, mask, scaling, split.kernel, softcap)
    out[rows] = o[slots].reshape(len(rows), num_heads, head_dim)
