"""The packed attention function, registered with transformers' ``AttentionInterface``.

It stores each layer's keys/values in our KV cache and attends per sequence under the packed
batch's masks; the name is unknown to transformers' mask registry, so the model builds no mask.
"""

from __future__ import annotations

from engine.kernels import decode_attention, invariant_attention

PACKED_ATTENTION = "cbp_packed"


def register() -> None:
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
    """The keys and values into the KV cache, then each query over its own sequence's keys.
    Shapes: query: [1, H, T, D];  key, value: [1, H_kv, T, D]  ->  returns [1, T, H, D]"""
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
