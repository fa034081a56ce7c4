"""The packed attention function, registered with transformers' ``AttentionInterface``.

The model is called with ``use_cache=False`` and a ``packed_batch`` keyword argument, which
transformers passes down to each layer's attention function together with the layer's post-RoPE
queries ``[1, H, T, D]`` and keys/values ``[1, H_kv, T, D]`` for the packed row (see
``transformers/modeling_utils.py: AttentionInterface`` and ``integrations/sdpa_attention.py``).
Here we store those keys/values in our own KV cache and attend per sequence:

* ``slots`` and ``paged`` modes: single-query sequences in one batched SDPA call over all slots'
  KV (``engine.kernels.decode_attention``'s shared call, as one split), and one causal SDPA call
  per multi-query (prefill) sequence over its own keys. The cache hands out those views:
  ``slot_view`` ``[B, H_kv, T_kv, D]`` and ``sequence_kv`` ``[H_kv, T_kv, D]`` (a slice in
  ``slots`` mode, a block-table gather in ``paged`` mode). This applies exactly
  ``engine.serving.masks.packed_step_mask``'s pattern.
* ``concat`` mode: the article's way: concatenate every cache and apply that mask literally.
* batch-invariant mode (any KV mode): per sequence over exactly its own keys
  (``engine.kernels.invariant_attention``).

A layer's sliding window (the call's ``sliding_window``) narrows every one of these masks
(``PackedBatch.windowed``); its score soft-capping (``softcap``, Gemma 2) runs
``decode_attention.sdpa``'s capped scores. Since the implementation name is unknown to
transformers' mask registry, the model builds no mask of its own for these calls.
"""

from __future__ import annotations

from engine.kernels import decode_attention, invariant_attention

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
    window, softcap = kwargs.get("sliding_window"), kwargs.get("softcap")
    batch = kwargs["packed_batch"]
    if batch.invariant:
        out = invariant_attention.packed_attention(
            module, query, key, value, batch, scaling, window, softcap
        )
        return out, None
    out = attend(module.layer_idx, query, key, value, batch.windowed(window), scaling, softcap)
    return out, None


def attend(layer: int, query, key, value, batch, scaling, softcap=None):
    """The keys and values into the KV cache, then each query over its own sequence's keys under
    ``batch``'s masks (a ``windowed`` batch for a sliding-window layer).

    Shapes:
        query: [1, H, T, D];  key, value: [1, H_kv, T, D]  ->  returns [1, T, H, D]
    """
    cache = batch.kv_cache
    if batch.packed_mask is not None:
        keys, values = cache.gather(layer, key, value, batch)
        out = decode_attention.sdpa(query, keys, values, batch.packed_mask, scaling, softcap)
        return out.transpose(1, 2)  # (1, T, H, D)
    cache.write(layer, key, value, batch)
    if batch.decode_mask is not None:
        split = decode_attention.one_call(batch)
        out = decode_attention.decode_attention(
            query, cache, layer, batch, split, scaling, softcap
        )[0]
    else:
        out = query.new_empty(query.shape[2], query.shape[1], query.shape[3])  # (T, H, D)
    for span in batch.prefills:
        _multi_query(query, cache, layer, batch, span, (scaling, softcap), out)
    return out[None]


def _multi_query(query, cache, layer, batch, span, scaling_softcap, out) -> None:
    """Causal attention of one sequence's chunk over its own cached prefix and itself."""
    a, b = span.token_start, span.token_end
    keys, values = cache.sequence_kv(layer, batch, span.index)  # (H_kv, kv_len, D)
    o = decode_attention.sdpa(
        query[:, :, a:b],  # (1, H, n, D)
        keys[None],
        values[None],
        span.mask,
        *scaling_softcap,
        is_causal=span.mask is None,
    )  # (1, H, n, D)
    out[a:b] = o[0].transpose(0, 1)  # (n, H, D)
