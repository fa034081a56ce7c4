"""The packed batch: one step's model inputs and attention metadata, every sequence's pending tokens
in one ``[1, T]`` row, each at its own position::

    slots:      A (decode)   B (prefill, 3 tokens)   C (decode)
    input_ids:  [ a7 |        b0 b1 b2          |   c4 ]
    positions:  [ 7  |        0  1  2           |   4  ]
    logits at:  [ 0  ,                  3       ,   4  ]   (each sequence's last token)

Decodes are attended together in one call, prefills one call each (as vLLM's metadata splits)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from engine.sequence import Sequence
from engine.serving.masks import causal_window, packed_step_mask, query_layout


@dataclass
class PrefillSpan:
    """A multi-query sequence ``seqs[index]``, tokens ``[token_start, token_end)`` of the row;
    ``mask``: None from position 0 (plain causal), else ``[n, num_cached + n]``."""

    token_start: int
    token_end: int
    index: int  # its place in the batch's ``seqs``
    num_cached: int
    mask: torch.Tensor | None


@dataclass
class PackedBatch:
    """One step's inputs.

    Shapes:
        input_ids, position_ids: [1, T]
        slot_ids: [T]                  slot of each token (where its KV is written)
        logits_indices: [S]            last token of each sequence in the packed row
        decode_rows, decode_slots: [S_d]   single-query tokens and their slots
        decode_mask: [B, 1, 1, T_kv_d] keys each slot's decode query may see (>= 1 key per slot)
        packed_mask: [1, 1, T, T_kv]   only in the ``concat`` KV mode
        kv_block_rows: [B, max_blocks * block_size]   only in the ``paged`` KV mode
        kv_block_table: [B, M]         each slot's KV blocks (the slot cache: [B, 1], itself)
    """

    seqs: list[Sequence]
    num_slots: int
    num_cached: list[int]
    num_new: list[int]
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    slot_ids: torch.Tensor
    logits_indices: torch.Tensor
    decode_rows: torch.Tensor
    decode_slots: torch.Tensor
    decode_mask: torch.Tensor | None
    prefills: list[PrefillSpan]
    kv_cache: object  # an engine.serving.kv_cache cache; its prepare() fills the fields below
    packed_mask: torch.Tensor | None = None
    all_slots_decode: bool = False  # every slot feeds one token, packed in slot order
    kv_write_index: torch.Tensor | None = None  # storage rows of the new tokens' keys/values
    kv_block_rows: torch.Tensor | None = None  # paged: [B, max_blocks * block_size] storage rows
    kv_block_table: torch.Tensor | None = None  # slot and paged KV modes, for decode_step
    # paged, several KV cache groups: per group (kv_block_table, kv_block_rows, kv_write_index)
    kv_group_addressing: list | None = None
    invariant: bool = False  # batch-invariant mode: attend per sequence (invariant_ops)
    windows: dict = field(default_factory=dict, repr=False)  # window -> ``windowed``'s batch

    @property
    def max_kv_len(self) -> int:
        return max(c + n for c, n in zip(self.num_cached, self.num_new, strict=True))

    def windowed(self, window: int | None) -> PackedBatch:
        """This batch with every mask narrowed to a sliding ``window`` (itself where nothing reaches
        past it); the decode mask then bounds keys on both sides, so it is attended with the mask.
        """
        if window is None or self.max_kv_len <= window:
            return self
        if window not in self.windows:
            self.windows[window] = dataclasses.replace(
                self,
                decode_mask=self._windowed_decode_mask(window),
                prefills=[_windowed_span(s, window, self.input_ids.device) for s in self.prefills],
                packed_mask=None if self.packed_mask is None else self._windowed_packed(window),
                windows={},
            )
        return self.windows[window]

    def _windowed_decode_mask(self, window: int) -> torch.Tensor | None:
        mask = self.decode_mask
        if mask is None:
            return None
        keep = mask if mask.dtype == torch.bool else mask == 0  # additive: 0 where seen
        first = torch.zeros(self.num_slots, dtype=torch.long, device=keep.device)  # (B,)
        first[self.decode_slots] = self.position_ids[0, self.decode_rows] - window + 1
        keys = torch.arange(keep.shape[-1], device=keep.device)  # (T_kv,)
        return keep & (keys[None, :] >= first[:, None])[:, None, None, :]

    def _windowed_packed(self, window: int) -> torch.Tensor:
        mask = packed_step_mask(self.num_cached, self.num_new, window)
        return mask[None, None].to(self.packed_mask.device)


def build_packed_batch(
    seqs: list[Sequence], num_new: list[int], kv_cache, num_slots: int, device, invariant=False
) -> PackedBatch:
    """Pack the scheduled sequences, ``num_new[i]`` tokens each; ``KVCache.prepare`` fills the KV
    addressing."""
    num_cached = [s.num_cached_tokens for s in seqs]
    token_ids = [t for s, n in zip(seqs, num_new, strict=True) for t in s.pending_token_ids(n)]
    q_seq, q_pos = query_layout(num_cached, num_new)  # (T,), (T,)
    slots = torch.tensor([s.slot for s in seqs], dtype=torch.long)  # (S,)
    ends = torch.cumsum(torch.tensor(num_new), 0)  # (S,)
    single = [i for i, n in enumerate(num_new) if n == 1]
    decode_rows = (ends - 1)[single]  # (S_d,)
    batch = PackedBatch(
        seqs=seqs,
        num_slots=num_slots,
        num_cached=num_cached,
        num_new=num_new,
        input_ids=torch.tensor([token_ids], dtype=torch.long, device=device),
        position_ids=q_pos[None].to(device),
        slot_ids=slots[q_seq].to(device),
        logits_indices=(ends - 1).to(device),
        decode_rows=decode_rows.to(device),
        decode_slots=slots[single].to(device),
        decode_mask=_decode_mask(num_cached, single, slots, num_slots, device),
        prefills=_prefill_spans(num_cached, num_new, device),
        kv_cache=kv_cache,
        invariant=invariant,
    )
    batch.all_slots_decode = len(single) == len(seqs) == num_slots and all(
        s.slot == i for i, s in enumerate(seqs)
    )
    kv_cache.prepare(batch)
    return batch


def _decode_mask(num_cached, single, slots, num_slots, device) -> torch.Tensor | None:
    """[B, 1, 1, T_kv_d]: per slot, which keys its single query sees."""
    if not single:
        return None
    kv_len = torch.ones(num_slots, dtype=torch.long)  # idle slots see one (ignored) key
    kv_len[slots[single]] = torch.tensor([num_cached[i] + 1 for i in single])
    keys = torch.arange(int(kv_len.max()))  # (T_kv_d,)
    return (keys[None, :] < kv_len[:, None])[:, None, None, :].to(device)


def _windowed_span(span: PrefillSpan, window: int, device) -> PrefillSpan:
    n = span.token_end - span.token_start
    keys = torch.arange(span.num_cached + n, device=device)
    mask = causal_window(keys[span.num_cached :], keys, window)
    return dataclasses.replace(span, mask=mask)


def _prefill_spans(num_cached, num_new, device) -> list[PrefillSpan]:
    spans, start = [], 0
    for i, (cached, new) in enumerate(zip(num_cached, num_new, strict=True)):
        if new > 1:
            mask = None
            if cached:
                q = torch.arange(cached, cached + new)[:, None]  # (n, 1)
                mask = (torch.arange(cached + new)[None, :] <= q).to(device)  # (n, cached + n)
            spans.append(PrefillSpan(start, start + new, i, cached, mask))
        start += new
    return spans
