"""Attention masks: a packed step's block-diagonal causal mask, and a static wave's padded mask.

A packed step's keys are every sequence's cached keys, then this step's new tokens, in packed
order; a query sees a key of its own sequence not after it. A decoding A (2 cached, 1 new) and a
prefilling B (3 new)::

                 cached | new
    keys:        A0 A1  | A2 B0 B1 B2
    A p2  (q)     #  #  |  #  .  .  .
    B p0  (q)     .  .  |  .  #  .  .
    B p1  (q)     .  .  |  .  #  #  .
    B p2  (q)     .  .  |  .  #  #  #

A sliding window of ``W`` keys also hides ``k_pos <= q_pos - W`` (with ``W = 2`` B's last row
sees ``B1 B2`` only)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackedLayout:
    """Sequence index and position of one packed step's queries and keys.

    Shapes:
        q_seq, q_pos: [T]       sequence index (0..S-1, packed order) and position of each query
        k_seq, k_pos: [T_kv]    the same for each key, keys laid out as [cached | new]
    """

    q_seq: torch.Tensor
    q_pos: torch.Tensor
    k_seq: torch.Tensor
    k_pos: torch.Tensor

    @property
    def num_cached_keys(self) -> int:
        return int(self.k_seq.numel() - self.q_seq.numel())


def packed_layout(num_cached: list[int], num_new: list[int]) -> PackedLayout:
    """Per-token indices of a packed step; ``num_new[i] >= 1``. Raises ValueError: lists of
    different lengths, or a sequence that feeds no token."""
    if len(num_cached) != len(num_new):
        raise ValueError("num_cached and num_new must have one entry per sequence")
    if any(n < 1 for n in num_new):
        raise ValueError("every scheduled sequence must feed at least one token")
    q_seq, q_pos = query_layout(num_cached, num_new)
    cached = torch.tensor(num_cached, dtype=torch.long)  # (S,)
    seq_idx = torch.arange(len(num_new), dtype=torch.long)  # (S,)
    c_seq = torch.repeat_interleave(seq_idx, cached)  # (T_cached,)
    c_pos = _ranges(cached)  # (T_cached,)
    return PackedLayout(q_seq, q_pos, torch.cat([c_seq, q_seq]), torch.cat([c_pos, q_pos]))


def query_layout(num_cached: list[int], num_new: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence index and position of every query token, ``[T]`` each."""
    cached = torch.tensor(num_cached, dtype=torch.long)  # (S,)
    new = torch.tensor(num_new, dtype=torch.long)  # (S,)
    q_seq = torch.repeat_interleave(torch.arange(len(num_new), dtype=torch.long), new)  # (T,)
    q_pos = _ranges(new) + torch.repeat_interleave(cached, new)  # (T,)
    return q_seq, q_pos


def _ranges(lengths: torch.Tensor) -> torch.Tensor:
    """Concatenated ``arange(n)`` for each n in ``lengths``: [2, 3] -> [0, 1, 0, 1, 2]."""
    total = int(lengths.sum())
    starts = torch.cumsum(lengths, 0) - lengths
    return torch.arange(total, dtype=torch.long) - torch.repeat_interleave(starts, lengths)


def block_diagonal_causal_mask(layout: PackedLayout, window: int | None = None) -> torch.Tensor:
    """``[T, T_kv]``, True where a query may attend to a key."""
    same_seq = layout.q_seq[:, None] == layout.k_seq[None, :]  # (T, T_kv)
    return same_seq & causal_window(layout.q_pos, layout.k_pos, window)


def causal_window(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Key not after the query and, with ``window``, within its last ``window`` positions. Shapes:
    q_pos: [n];  k_pos: [m]  ->  returns [n, m] bool"""
    keep = k_pos[None, :] <= q_pos[:, None]  # (n, m)
    if window is not None:
        keep &= k_pos[None, :] > q_pos[:, None] - window
    return keep


def packed_step_mask(
    num_cached: list[int], num_new: list[int], window: int | None = None
) -> torch.Tensor:
    """The module's mask of one packed step. Shapes: returns: [T, T_kv] bool, T = sum(num_new), T_kv
    = sum(num_cached) + T"""
    return block_diagonal_causal_mask(packed_layout(num_cached, num_new), window)


def padded_wave_mask(num_padding: list[int], num_queries: int, num_keys: int) -> torch.Tensor:
    """The mask ``model.generate`` applies to a left-padded static wave at one step: a query sees
    every non-pad key not after it::

        row with 2 pads, prefill of width 5:   . . # . .
                                               . . # # .
                                               . . # # #   (first two rows are pad queries)

    Shapes: returns: [B, num_queries, num_keys] bool
    """
    pads = torch.tensor(num_padding, dtype=torch.long)[:, None, None]  # (B, 1, 1)
    k = torch.arange(num_keys)[None, None, :]  # (1, 1, T_kv)
    q = torch.arange(num_keys - num_queries, num_keys)[None, :, None]  # (1, T, 1)
    return (k >= pads) & (k <= q)
