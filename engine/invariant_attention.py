"""Batch-invariant attention: each query row over exactly its own keys, in a fixed order.

A query at position ``p`` of a sequence attends over that sequence's keys ``0..p``. Here its result
is a function of those keys alone, whatever shares the step, however the prompt was chunked and
whether it is a decode or a recomputed prefill (``engine.invariant``):

    keys:    | block 0 (KEY_BLOCK) | block 1             | block 2 (past p: all masked) |
    row p:   | # # # # # # # # # # | # # # # p . . . . . | . . . . . . . . . . . . . .  |

1. scores of the row against each block: one matmul of fixed shape ``[G, D] @ [D, KEY_BLOCK]``
   per (row, key block), batched (G: the query heads sharing one key/value head);
2. keys after ``p`` (and the zero padding of the last block) are set to ``-inf``; the row's
   maximum over all blocks is exact;
3. ``exp`` elementwise, then per block a sum over exactly ``KEY_BLOCK`` values and a matmul of
   fixed shape ``[G, KEY_BLOCK] @ [KEY_BLOCK, D]`` with the block's values;
4. the blocks' sums and outputs are added one block after another, in block order: a block past
   ``p`` adds exact zeros, so how many blocks a step computes changes nothing.

Everything is computed in float32 (as SDPA does for half precision on CPU) and cast back.
Rows are processed in chunks of at most ``CHUNK_ELEMENTS`` scores, so a long prefill does not
allocate its whole ``[T, T]`` score matrix at once; chunks are independent rows.
"""

from __future__ import annotations

import torch

from engine.invariant import KEY_BLOCK

CHUNK_ELEMENTS = 2**22  # scores per chunk of query rows (16 MiB of float32)


def sequence_attention(query, keys, values, first_position: int, scaling: float) -> torch.Tensor:
    """Causal attention of one sequence's query rows at ``first_position, first_position + 1, ...``.

    Shapes:
        query: [H, n, D];  keys, values: [H_kv, T_kv, D] (T_kv > the last query's position)
        returns: [n, H, D] in the query's dtype
    """
    num_heads, num_rows, head_dim = query.shape
    num_kv_heads, kv_len = keys.shape[0], keys.shape[1]
    group = num_heads // num_kv_heads
    last = first_position + num_rows  # keys the last row may see
    assert last <= kv_len, "a query row has no key for its own position"
    num_blocks = -(-last // KEY_BLOCK)
    k = _blocks(keys[:, :last].float(), num_blocks)  # (H_kv, nb, KEY_BLOCK, D)
    v = _blocks(values[:, :last].float(), num_blocks)
    q = query.float().view(num_kv_heads, group, num_rows, head_dim).permute(2, 0, 1, 3)
    per_row = num_kv_heads * num_blocks * group * KEY_BLOCK
    step = max(1, CHUNK_ELEMENTS // per_row)
    out = [
        _rows(q[i : i + step], k, v, first_position + i, scaling) for i in range(0, num_rows, step)
    ]  # each (rows, H_kv, G, D)
    return torch.cat(out).reshape(num_rows, num_heads, head_dim).to(query.dtype)


def _blocks(x: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """[H_kv, n, D] -> [H_kv, num_blocks, KEY_BLOCK, D], zero-padded at the end."""
    pad = num_blocks * KEY_BLOCK - x.shape[1]
    if pad:
        x = torch.cat([x, x.new_zeros(x.shape[0], pad, x.shape[2])], dim=1)
    return x.view(x.shape[0], num_blocks, KEY_BLOCK, x.shape[2])


def _rows(q, k, v, first_position: int, scaling: float) -> torch.Tensor:
    """Rows ``first_position..`` of a chunk: q [n, H_kv, G, D] -> [n, H_kv, G, D] (float32)."""
    num_rows, num_blocks = q.shape[0], k.shape[1]
    scores = (q[:, :, None] * scaling) @ k.transpose(-1, -2)[None]  # (n, H_kv, nb, G, KEY_BLOCK)
    key_pos = torch.arange(num_blocks * KEY_BLOCK, device=q.device).view(num_blocks, KEY_BLOCK)
    row_pos = torch.arange(first_position, first_position + num_rows, device=q.device)
    hidden = key_pos[None] > row_pos[:, None, None]  # (n, nb, KEY_BLOCK)
    scores.masked_fill_(hidden[:, None, :, None, :], float("-inf"))
    peak = scores.amax(dim=(2, 4), keepdim=True)  # (n, H_kv, 1, G, 1): exact
    weights = torch.exp(scores - peak)  # (n, H_kv, nb, G, KEY_BLOCK); masked keys: exact 0
    sums = weights.sum(dim=-1)  # (n, H_kv, nb, G): each over exactly KEY_BLOCK values
    parts = weights @ v[None]  # (n, H_kv, nb, G, D): each [G, KEY_BLOCK] @ [KEY_BLOCK, D]
    total, acc = sums[:, :, 0], parts[:, :, 0]
    for b in range(1, num_blocks):  # in block order, one after another
        total = total + sums[:, :, b]
        acc = acc + parts[:, :, b]
    return acc / total[..., None]


def packed_attention(module, query, key, value, batch, scaling) -> torch.Tensor:
    """One layer of a packed step in batch-invariant mode: store the step's keys/values in the KV
    cache, then attend per sequence over its own keys (``sequence_attention``).

    Shapes:
        query: [1, H, T, D];  key, value: [1, H_kv, T, D]  ->  returns [1, T, H, D]
    """
    layer = module.layer_idx
    cache = batch.kv_cache
    cache.store_step(layer, key, value, batch)
    out = query.new_empty(query.shape[2], query.shape[1], query.shape[3])  # (T, H, D)
    start = 0
    for i, (cached, new) in enumerate(zip(batch.num_cached, batch.num_new, strict=True)):
        keys, values = cache.sequence_kv(layer, batch, i)  # (H_kv, >= cached + new, D)
        q = query[0, :, start : start + new]  # (H, new, D)
        out[start : start + new] = sequence_attention(q, keys, values, cached, scaling)
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
    if attention_mask is None:
        pads = [0] * batch_size
    else:
        assert attention_mask.dtype == torch.bool, "the invariant attention needs a bool mask"
        pads = (kv_len - attention_mask[:, 0, -1].sum(dim=-1)).tolist()  # (B,)
    out = query.new_zeros(batch_size, num_queries, query.shape[1], query.shape[3])
    for b, pad in enumerate(pads):
        first = kv_len - num_queries - pad  # real position of query row 0 (< 0: padding)
        skip = max(0, -first)
        if skip >= num_queries:
            continue
        q = query[b, :, skip:]  # (H, q - skip, D)
        keys, values = key[b, :, pad:], value[b, :, pad:]  # (H_kv, kv - pad, D)
        out[b, skip:] = sequence_attention(q, keys, values, first + skip, scaling)
    return out, None


def register() -> None:
    """Register ``padded_attention`` and its mask with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from engine.invariant import INVARIANT_ATTENTION

    AttentionInterface.register(INVARIANT_ATTENTION, padded_attention)
    AttentionMaskInterface.register(INVARIANT_ATTENTION, sdpa_mask)
