"""Batch-invariant attention: each query row over exactly its own keys, in a fixed order.

A query at position ``p`` of a sequence attends over that sequence's keys ``0..p``. Here its result
is a function of those keys alone, whatever shares the step, however the prompt was chunked and
whether it is a decode or a recomputed prefill (``engine.kernels.invariant_ops``):

    keys:    | block 0 (KEY_BLOCK) | block 1             | block 2 (past p: all masked) |
    row p:   | # # # # # # # # # # | # # # # p . . . . . | . . . . . . . . . . . . . .  |

1. query rows go in tiles of ``QUERY_TILE`` rows (the last zero-padded), with the G query heads
   that share a key/value head; a tile's scores against each key block are one ``torch.bmm`` of
   fixed per-item shape ``[G * QUERY_TILE, D] @ [D, KEY_BLOCK]`` on operands copied into the same
   contiguous layout every time (a transposed view in one call and a copy in another take
   different GEMM code paths, and round differently);
2. keys after each row's position (and the zero padding of the last block) are set to ``-inf``;
   a row's maximum over all blocks is exact;
3. ``exp`` elementwise, then per block a sum over exactly ``KEY_BLOCK`` values and a ``bmm`` of
   fixed shape ``[G * QUERY_TILE, KEY_BLOCK] @ [KEY_BLOCK, D]`` with the block's values;
4. the blocks' sums and outputs are added one block after another, in block order: a block past
   a row's position adds exact zeros, so how many blocks a tile computes changes nothing, nor
   does where in its tile a row sits (GEMM rows do not mix).

Everything is computed in float32 (as SDPA does for half precision on CPU) and cast back. A
prefill of n rows takes ``ceil(n / QUERY_TILE)`` tiles per layer; a decode row one tile.
"""

from __future__ import annotations

import torch

from engine.kernels.invariant_ops import KEY_BLOCK

QUERY_TILE = 8  # query rows per attention call (each with its G heads)


def sequence_attention(
    query, keys, values, first_position: int, scaling: float, window=None, softcap=None
) -> torch.Tensor:
    """Causal attention of one sequence's query rows at ``first_position, first_position + 1, ...``
    (``window``: each row sees its last ``window`` keys only; ``softcap``: scores capped at
    ``softcap * tanh(s / softcap)``, both as in ``engine.kernels.packed_attention``).

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
    """The first ``num_keys`` of [H_kv, T_kv, D] as a new contiguous float32
    [nb, H_kv, KEY_BLOCK, D], zero-padded at the end: the same layout whatever the input's, and
    its first blocks are a contiguous slice."""
    num_blocks = -(-num_keys // KEY_BLOCK)
    out = x.new_zeros(x.shape[0], num_blocks * KEY_BLOCK, x.shape[2], dtype=torch.float32)
    out[:, :num_keys] = x[:, :num_keys]
    return out.view(x.shape[0], num_blocks, KEY_BLOCK, x.shape[2]).transpose(0, 1).contiguous()


def _tile(q, k, v, start: int, how: tuple) -> torch.Tensor:
    """One query tile (rows ``start..start + QUERY_TILE - 1``, G heads each) over its key blocks.

    Every matmul is a ``torch.bmm`` of fixed per-item shape on contiguous operands laid out the
    same way each time ([G * QUERY_TILE, D] @ [D, KEY_BLOCK], then [G * QUERY_TILE, KEY_BLOCK] @
    [KEY_BLOCK, D]), batched over (key block, key/value head).

    ``how``: (scaling, window, softcap), as ``sequence_attention`` takes them.

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
    """One layer of a packed step in batch-invariant mode: store the step's keys/values in the KV
    cache, then attend per sequence over its own keys (``sequence_attention``).

    Shapes:
        query: [1, H, T, D];  key, value: [1, H_kv, T, D]  ->  returns [1, T, H, D]
    """
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
    """Attention of a left-padded ``model.generate`` batch in batch-invariant mode.

    Registered as ``INVARIANT_ATTENTION`` with transformers (with its SDPA mask). Row ``b`` has
    ``pad_b`` padding keys on the left; its real queries attend over ``key[b, :, pad_b:]`` exactly
    as a packed sequence does, and its padding queries get zeros.

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
    """Each row's left padding: the keys its last query does not see; under a sliding window
    (which hides more), the keys before its last query's position ``position_ids[b, -1]``,
    negative where a sliding-window cache dropped the first keys."""
    if window is not None and position_ids is not None:
        return (kv_len - 1 - position_ids[:, -1]).tolist()  # (B,)
    if attention_mask is None:
        return [0] * batch_size
    assert attention_mask.dtype == torch.bool, "the invariant attention needs a bool mask"
    return (kv_len - attention_mask[:, 0, -1].sum(dim=-1)).tolist()  # (B,)


def _from_position_zero(x: torch.Tensor, pad: int) -> torch.Tensor:
    """A row's keys (or values) [H_kv, kv, D] from position 0 on: its padding dropped, or, for
    ``pad < 0``, the ``-pad`` keys a sliding-window cache dropped put back as zeros (outside
    every query's window), so that key blocks start where the packed path's do."""
    if pad >= 0:
        return x[:, pad:]
    return torch.cat((x.new_zeros(x.shape[0], -pad, x.shape[2]), x), dim=1)


def register() -> None:
    """Register ``padded_attention`` and its mask with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from engine.kernels.invariant_ops import INVARIANT_ATTENTION

    AttentionInterface.register(INVARIANT_ATTENTION, padded_attention)
    AttentionMaskInterface.register(INVARIANT_ATTENTION, sdpa_mask)
