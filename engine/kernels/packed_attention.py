"""The packed attention function, registered with transformers' ``AttentionInterface``.

The model is called with ``use_cache=False`` and a ``packed_batch`` keyword argument, which
transformers passes down to each layer's attention function together with the layer's post-RoPE
queries ``[1, H, T, D]`` and keys/values ``[1, H_kv, T, D]`` for the packed row (see
``transformers/modeling_utils.py: AttentionInterface`` and ``integrations/sdpa_attention.py``).
Here we store those keys/values in our own KV cache and attend per sequence:

* ``slots`` and ``paged`` modes: single-query sequences in one batched SDPA call over all slots'
  KV (grouped-query heads folded into the query axis, so no K/V copy), and one causal SDPA call per
  multi-query (prefill) sequence. The cache hands out those views: ``slot_view`` ``[B, H_kv, T_kv,
  D]`` and ``sequence_view`` ``[1, H_kv, T_kv, D]`` (a slice in ``slots`` mode, a block-table
  gather in ``paged`` mode). This applies exactly ``engine.serving.masks.packed_step_mask``'s
  pattern.
* ``concat`` mode: the article's way: concatenate every cache and apply that mask literally.
* batch-invariant mode (any KV mode): per sequence over exactly its own keys
  (``engine.kernels.invariant_attention``).

Since the implementation name is unknown to transformers' mask registry, the model builds no mask of
its own for these calls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kernels import invariant_attention

PACKED_ATTENTION = "cbp_packed"


def register() -> None:
    """Register ``packed_attention`` under ``PACKED_ATTENTION``, and the batch-invariant attention
    of ``model.generate`` (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED_ATTENTION, packed_attention)
    invariant_attention.register()


def packed_attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs
):
    """Attention for one layer of a packed step.

    Shapes:
        query: [1, H, T, D];  key, value: [1, H_kv, T, D]
        returns: ([1, T, H, D], None)
    """
    batch = kwargs["packed_batch"]
    if batch.invariant:
        return invariant_attention.packed_attention(module, query, key, value, batch, scaling), None
    cache = batch.kv_cache
    if batch.packed_mask is not None:
        keys, values = cache.gather(module.layer_idx, key, value, batch)
        out = F.scaled_dot_product_attention(
            query, keys, values, attn_mask=batch.packed_mask, scale=scaling, enable_gqa=True
        )  # (1, H, T, D)
        return out.transpose(1, 2), None
    layer = module.layer_idx
    cache.write(layer, key, value, batch)
    if batch.all_slots_decode:
        return _all_slots_decode(query, cache, layer, batch, scaling), None
    out = torch.empty_like(query[0])  # (H, T, D)
    if batch.decode_mask is not None:
        _single_query(query, cache, layer, batch, scaling, out)
    for span in batch.prefills:
        _multi_query(query, cache, layer, batch, span, scaling, out)
    return out.transpose(0, 1)[None], None


def _all_slots_decode(query, cache, layer, batch, scaling) -> torch.Tensor:
    """The common step: every slot decodes one token, packed in slot order (token t = slot t).

    No gather and no scatter: the queries are viewed as [B, H_kv, G, D] and the output comes back
    already in [1, T, H, D] order.
    """
    keys, values = cache.slot_view(layer, batch, batch.decode_mask.shape[-1])  # (B, H_kv, T_kv, D)
    num_heads, num_kv_heads = query.shape[1], keys.shape[1]
    group, head_dim = num_heads // num_kv_heads, query.shape[-1]
    num_slots = keys.shape[0]
    q = query[0].view(num_kv_heads, group, num_slots, head_dim).permute(2, 0, 1, 3)
    o = F.scaled_dot_product_attention(
        q, keys, values, attn_mask=batch.decode_mask, scale=scaling
    )  # (B, H_kv, G, D)
    return o.reshape(1, num_slots, num_heads, head_dim)


def _single_query(query, cache, layer, batch, scaling, out) -> None:
    """One SDPA call for every sequence feeding one token; idle slots compute an ignored row."""
    keys, values = cache.slot_view(layer, batch, batch.decode_mask.shape[-1])  # (B, H_kv, T_kv, D)
    num_heads, num_kv_heads = query.shape[1], keys.shape[1]
    group = num_heads // num_kv_heads
    num_slots, head_dim = keys.shape[0], keys.shape[-1]
    rows, slots = batch.decode_rows, batch.decode_slots
    q = query[0][:, rows].view(num_kv_heads, group, len(rows), head_dim)  # (H_kv, G, S_d, D)
    q_slots = query.new_zeros(num_slots, num_kv_heads, group, head_dim)  # (B, H_kv, G, D)
    q_slots[slots] = q.permute(2, 0, 1, 3)
    o = F.scaled_dot_product_attention(
        q_slots, keys, values, attn_mask=batch.decode_mask, scale=scaling
    )  # (B, H_kv, G, D)
    out[:, rows] = o[slots].permute(1, 2, 0, 3).reshape(num_heads, len(rows), head_dim)


def _multi_query(query, cache, layer, batch, span, scaling, out) -> None:
    """Causal attention of one sequence's chunk over its own cached prefix and itself."""
    a, b = span.token_start, span.token_end
    kv_len = span.num_cached + (b - a)
    keys, values = cache.sequence_view(layer, batch, span.slot, kv_len)  # (1, H_kv, kv_len, D)
    o = F.scaled_dot_product_attention(
        query[:, :, a:b],  # (1, H, n, D)
        keys,
        values,
        attn_mask=span.mask,
        is_causal=span.mask is None,
        scale=scaling,
        enable_gqa=True,
    )  # (1, H, n, D)
    out[:, a:b] = o[0]
