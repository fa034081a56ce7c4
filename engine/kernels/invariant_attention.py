"""Batch-invariant attention: each query row over exactly its own keys, in a fixed order::

    keys:    | block 0 (KEY_BLOCK) | block 1             | block 2 (past p: all masked) |
    row p:   | # # # # # # # # # # | # # # # p . . . . . | . . . . . . . . . . . . . .  |

Fixed-shape ``torch.bmm`` calls per query tile and key block on operands in one contiguous layout (a
transposed view takes another GEMM path), keys past ``p`` at ``-inf``, blocks added in order, all in
float32 (docs/precision.md).
"""

from __future__ import annotations

import torch

from engine.kernels.invariant_ops import KEY_BLOCK

QUERY_TILE = 8  # query rows per attention call (each with its G heads)


def sequence_attention(
    query, keys, values, first_position: int, scaling: float, window=None, softcap=None
) -> torch.Tensor:
    """Causal attention of one sequence's rows at ``first_position, first_position + 1, ...``
    (``window``, ``softcap`` as in ``packed_attention``).

    Shapes:
        query: [H, n, D];  keys, values: [H_kv, T_kv, D] (T_kv > the last query's position)
        returns: [n, H, D] in the query's dtype
    """
    num_heads, num_rows, head_dim = query.shape
    num_kv_heads = keys.shape[0]
    group = num_heads // num_kv_heads
    last = first_position + num_rows  # keys the last row may see
    assert last <= keys.shape[1], "a query row has no key for its own position"
    num_tiles = -(-num_rows // QUERY_TILE)
    q = query.float().new_zeros(num_kv_heads, group, num_tiles * QUERY_TILE, head_dim)
    q[:, :, :num_rows] = query.view(num_kv_heads, group, num_rows, head_dim)
    k, v = _blocks(keys, last), _blocks(values, last)  # (nb, H_kv, KEY_BLOCK, D)
    out = []
    for t in range(num_tiles):
        start = first_position + t * QUERY_TILE
        tile = q[:, :, t * QUERY_TILE : (t + 1) * QUERY_TILE]  # (H_kv, G, QUERY_TILE, D)
        seen = -(-min(start + QUERY_TILE, last) // KEY_BLOCK)  # blocks its real rows may see
        out.append(
            _tile(
                tile.reshape(num_kv_heads, -1, head_dim),
                k[:seen],
                v[:seen],
                start,
                (scaling, window, softcap),
            )
        )
    rows = torch.cat(out, dim=2)[:, :, :num_rows]  # (H_kv, G, n, D)
    return rows.reshape(num_heads, num_rows, head_dim).transpose(0, 1).to(query.dtype)


def _blocks(x: torch.Tensor, num_keys: int) -> torch.Tensor:
    """The first ``num_keys`` of [H_kv, T_kv, D] as a new contiguous float32 [nb, H_kv, KEY_BLOCK,
    D], zero-padded at the end."""
    num_blocks = -(-num_keys // KEY_BLOCK)
    out = x.new_zeros(x.shape[0], num_blocks * KEY_BLOCK, x.shape[2], dtype=torch.float32)
    out[:, :num_keys] = x[:, :num_keys]
    return out.view(x.shape[0], num_blocks, KEY_BLOCK, x.shape[2]).transpose(0, 1).contiguous()


def _tile(q, k, v, start: int, how: tuple) -> torch.Tensor:
    """One query tile over its key blocks; ``how``: (scaling, window, softcap).

    Shapes:
        q: [H_kv, G * QUERY_TILE, D];  k, v: [nb, H_kv, KEY_BLOCK, D]  ->  [H_kv, G, QUERY_TILE, D]
    """
    scaling, window, softcap = how
    num_blocks, num_kv_heads, _, head_dim = k.shape
    rows = q.shape[1]
    items = num_blocks * num_kv_heads
    q_items = (q * scaling)[None].expand(num_blocks, -1, -1, -1).reshape(items, rows, head_dim)
    k_items = k.view(items, KEY_BLOCK, head_dim).transpose(1, 2)  # (items, D, KEY_BLOCK)
    scores = torch.bmm(q_items.contiguous(), k_items)  # (items, G * QUERY_TILE, KEY_BLOCK)
    scores = scores.view(num_blocks, num_kv_heads, -1, QUERY_TILE, KEY_BLOCK)  # (.., G, QT, KB)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    key_pos = torch.arange(num_blocks * KEY_BLOCK, device=q.device).view(num_blocks, KEY_BLOCK)
    row_pos = torch.arange(start, start + QUERY_TILE, device=q.device)
    hidden = key_pos[:, None, :] > row_pos[None, :, None]  # (nb, QT, KB); every row sees key 0
    if window is not None:  # and every row its own key
        hidden |= key_pos[:, None, :] <= row_pos[None, :, None] - window
    scores.masked_fill_(hidden[:, None, None], float("-inf"))
    peak = scores.amax(dim=(0, 4), keepdim=True)  # (1, H_kv, G, QT, 1): exact
    weights = torch.exp(scores - peak)  # masked keys: exact 0
    sums = weights.sum(dim=-1)  # (nb, H_kv, G, QT): each over exactly KEY_BLOCK values
    w_items = weights.view(items, rows, KEY_BLOCK)
    parts = torch.bmm(w_items, v.view(items, KEY_BLOCK, head_dim))  # (items, G * QT, D)
    parts = parts.view(num_blocks, num_kv_heads, -1, QUERY_TILE, head_dim)
    total, acc = sums[0], parts[0]
    for b in range(1, num_blocks):  # in block order, one after another
        total = total + sums[b]
        acc = acc + parts[b]
    return acc / total[..., None]


def packed_attention(module, query, key, value, batch, scaling, window=None, softcap=None):
    """A packed step's layer: keys/values into the KV cache, then ``sequence_attention`` per
    sequence. Shapes: query: [1, H, T, D];  key, value: [1, H_kv, T, D]  ->  returns [1, T, H, D]"""
    layer = module.layer_idx
    cache = batch.kv_cache
    cache.write(layer, key, value, batch)
    out = query.new_empty(query.shape[2], query.shape[1], query.shape[3])  # (T, H, D)
    start = 0
    for i, (cached, new) in enumerate(zip(batch.num_cached, batch.num_new, strict=True)):
        keys, values = cache.sequence_kv(layer, batch, i)  # (H_kv, >= cached + new, D)
        q = query[0, :, start : start + new]  # (H, new, D)
        out[start : start + new] = sequence_attention(
            q, keys, values, cached, scaling, window, softcap
        )
        start += new
    return out[None]


def padded_attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs
):
    """A left-padded ``model.generate`` batch, registered as ``INVARIANT_ATTENTION``: row ``b``'s
    real queries attend over ``key[b, :, pad_b:]`` as a packed sequence does; padding queries get 0.

    Shapes:
        query: [B, H, q, D];  key, value: [B, H_kv, kv, D];  attention_mask: [B, 1, q, kv] bool
        or None (no padding);  returns ([B, q, H, D], None)
    """
    batch_size, _, num_queries, _ = query.shape
    kv_len = key.shape[2]
    window, softcap = kwargs.get("sliding_window"), kwargs.get("softcap")
    pads = _pads(attention_mask, batch_size, kv_len, window, kwargs.get("position_ids"))
    out = query.new_zeros(batch_size, num_queries, query.shape[1], query.shape[3])
    for b, pad in enumerate(pads):
        first = kv_len - num_queries - pad  # real position of query row 0 (< 0: padding)
        skip = max(0, -first)
        if skip >= num_queries:
            continue
        q = query[b, :, skip:]  # (H, q - skip, D)
        keys, values = (_from_position_zero(t[b], pad) for t in (key, value))
        out[b, skip:] = sequence_attention(q, keys, values, first + skip, scaling, window, softcap)
    return out, None


def _pads(attention_mask, batch_size: int, kv_len: int, window, position_ids) -> list[int]:
    """Each row's left padding (under a window, the keys before ``position_ids[b, -1]``; negative
    where the window's cache dropped keys)."""
    if window is not None and position_ids is not None:
        return (kv_len - 1 - position_ids[:, -1]).tolist()  # (B,)
    if attention_mask is None:
        return [0] * batch_size
    assert attention_mask.dtype == torch.bool, "the invariant attention needs a bool mask"
    return (kv_len - attention_mask[:, 0, -1].sum(dim=-1)).tolist()  # (B,)


def _from_position_zero(x: torch.Tensor, pad: int) -> torch.Tensor:
    """A row's [H_kv, kv, D] from position 0: padding dropped, or ``-pad`` dropped keys put back as
    zeros, so key blocks start where the packed path's do."""
    if pad >= 0:
        return x[:, pad:]
    return torch.cat((x.new_zeros(x.shape[0], -pad, x.shape[2]), x), dim=1)


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from engine.kernels.invariant_ops import INVARIANT_ATTENTION

    AttentionInterface.register(INVARIANT_ATTENTION, padded_attention)
    AttentionMaskInterface.register(INVARIANT_ATTENTION, sdpa_mask)
