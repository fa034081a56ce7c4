"""KV caches for the continuous engine, one per KV mode (docs/engines.md).

``SlotKVCache`` (``"slots"``) preallocates one region per slot and writes in place::

    keys[layer]  [B, H_kv, P, D]
    slot 0:  R0 R0 R0 R0 R0 .. .. ..      (R0 has 5 tokens cached)
    slot 1:  R4 R4 .. .. .. .. .. ..      (R4 took R1's slot; R1's stale entries are masked out)
    slot 2:  R2 R2 R2 R2 R2 R2 R2 ..

``PagedKVCache`` (``"paged"``) is vLLM's pool of blocks, read through the scheduler's block
tables. ``ConcatKVCache`` (``"concat"``, the article's) concatenates per-sequence tensors."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

import torch

from engine.serving.masks import packed_step_mask
from engine.serving.packed_batch import PackedBatch


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype) -> int:
    """Bytes one token's keys and values take across all layers."""
    return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


class KVCache(ABC):
    """Per step: ``prepare(batch)`` before the forward; per layer ``write`` and a read
    (``sequence_kv``, ``slot_view``, ``block_storage`` or the concat cache's ``gather``);
    ``release(request_id)`` per finished sequence."""

    bytes_per_token: int  # one token's keys and values across all layers

    @property
    @abstractmethod
    def total_bytes(self) -> int:
        """Bytes of keys and values the cache holds now (preallocated storage counts whole)."""

    @abstractmethod
    def prepare(self, batch: PackedBatch) -> None:
        """Fill the batch's KV addressing fields."""

    @abstractmethod
    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor, batch: PackedBatch):
        """Store the step's new keys/values [1, H_kv, T, D] of ``layer`` (packed order)."""

    @abstractmethod
    def sequence_kv(
        self, layer: int, batch: PackedBatch, index: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``batch.seqs[index]`` after ``write``: [H_kv, kv_len, D] each,
        cached first then new (kv_len = its cached + new tokens)."""

    @abstractmethod
    def release(self, request_id: int) -> None:
        """Forget a finished sequence's keys and values."""


class InPlaceKVCache(KVCache):
    """A ``KVCache`` whose preallocated ``keys`` and ``values`` are written in place and read as
    views: the slot and paged caches."""

    keys: torch.Tensor
    values: torch.Tensor

    @property
    def total_bytes(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()

    @abstractmethod
    def slot_view(
        self, layer: int, batch: PackedBatch, kv_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of every slot's first ``kv_len`` positions: [B, H_kv, kv_len, D]."""

    @abstractmethod
    def _slot_kv(self, layer: int, batch: PackedBatch, slot: int, kv_len: int):
        """One slot's first ``kv_len`` keys and values: [H_kv, kv_len, D] each."""

    def layer_block_table(self, layer: int, batch: PackedBatch) -> torch.Tensor:
        """The block table ``layer`` reads in ``block_storage``: [B, M] (several KV cache
        groups: its group's)."""
        return batch.kv_block_table

    @abstractmethod
    def block_storage(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A layer's whole storage as blocks, for a kernel that writes and reads it in place
        through ``batch.kv_block_table``: keys, values [H_kv, N, S, D] (N blocks of S positions)."""

    def sequence_kv(self, layer: int, batch: PackedBatch, index: int):
        kv_len = batch.num_cached[index] + batch.num_new[index]
        return self._slot_kv(layer, batch, batch.seqs[index].slot, kv_len)


class SlotKVCache(InPlaceKVCache):
    """Preallocated per-slot KV storage written in place.

    Shapes:
        keys, values: [L, B, H_kv, P, D]
    """

    def __init__(self, num_layers, num_slots, num_kv_heads, head_dim, max_seq_len, dtype, device):
        shape = (num_layers, num_slots, num_kv_heads, max_seq_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.max_seq_len = max_seq_len
        self.bytes_per_token = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype)
        self.block_table = torch.arange(num_slots, device=device)[:, None]  # (B, 1): a slot a block

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor, batch: PackedBatch):
        """Store the step's new keys/values ([1, H_kv, T, D]) at (slot, position) of each token."""
        head_dim = key.shape[-1]
        index = batch.kv_write_index  # (H_kv * T,)
        self.keys[layer].view(-1, head_dim).index_copy_(0, index, key[0].reshape(-1, head_dim))
        self.values[layer].view(-1, head_dim).index_copy_(0, index, value[0].reshape(-1, head_dim))

    def prepare(self, batch: PackedBatch) -> None:
        """The row of every new (head, token) in a layer's storage viewed as ``[B * H_kv * P, D]``,
        so ``write`` is one ``index_copy_``, cheaper than advanced-index assignment."""
        positions = batch.position_ids[0]  # (T,)
        slot_ids = batch.slot_ids  # (T,)
        assert int(positions.max()) < self.max_seq_len, "a sequence outgrew its slot's KV"
        num_kv_heads = self.keys.shape[2]
        heads = torch.arange(num_kv_heads, device=slot_ids.device)[:, None]  # (H_kv, 1)
        rows = (slot_ids[None, :] * num_kv_heads + heads) * self.max_seq_len + positions[None, :]
        batch.kv_write_index = rows.reshape(-1)  # (H_kv * T,), ordered head-major like key[0]
        batch.kv_block_table = self.block_table

    def slot_view(self, layer: int, batch: PackedBatch, kv_len: int):
        return self.keys[layer][:, :, :kv_len], self.values[layer][:, :, :kv_len]

    def block_storage(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A layer's storage with each slot one block of P positions: [H_kv, B, P, D] each."""
        return self.keys[layer].transpose(0, 1), self.values[layer].transpose(0, 1)

    def _slot_kv(self, layer: int, batch: PackedBatch, slot: int, kv_len: int):
        return self.keys[layer][slot, :, :kv_len], self.values[layer][slot, :, :kv_len]

    def release(self, request_id: int) -> None:
        """Nothing to free: the next occupant of the slot overwrites and masks stale entries."""


class PagedKVCache(InPlaceKVCache):
    """A pool of KV blocks shared by all sequences, addressed through block tables.

    Block ``b`` is rows ``[b * block_size, (b + 1) * block_size)`` of a layer's storage; the
    scheduler's ``block_tables`` are read only. ``prepare`` turns them into storage rows, a short
    table, an idle slot and a ``FREED`` entry padded with block 0, never attended::

        block_size 2;  R0's table [0, 1, 4] in slot 0;  R2's table [2] in slot 1
        kv_block_rows  slot 0:  0 1 | 2 3 | 8 9
                       slot 1:  4 5 | 0 1 | 0 1      (past its table: padding, never attended)

    With KV cache groups (``layer_groups``, one ``block_tables`` mapping per group) a layer reads
    its group's tables (all in ``batch.kv_group_addressing``).

    Shapes:
        keys, values: [L, H_kv, N * block_size, D]   (N = num_blocks; groups: [L_g, ...])
        per step (``prepare``): kv_block_table [B, max_blocks], each slot's block table, padded;
        kv_block_rows [B, max_blocks * block_size], the storage row of every position of every
        slot's sequence; kv_write_index [T], where each new token goes.
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_blocks: int,
        block_size: int,
        block_tables: Mapping[int, list[int]],
        dtype,
        device,
        layer_groups: list[list[int]] | None = None,
    ):
        self.block_size = block_size
        groups = layer_groups or [list(range(num_layers))]
        # read only: the scheduler's block manager owns them
        self.group_tables = list(block_tables) if layer_groups else [block_tables]
        self.block_tables = self.group_tables[0]
        # layer -> (its group, its row of the storage)
        self.layer_rows = {
            la: (g, row) for g, ids in enumerate(groups) for row, la in enumerate(ids)
        }
        num_rows = max(len(ids) for ids in groups)
        shape = (num_rows, num_kv_heads, num_blocks * block_size, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.bytes_per_token = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype)

    def prepare(self, batch: PackedBatch) -> None:
        """Storage rows of every slot's positions and new tokens, in every group."""
        addressing = [self._addressing(batch, tables) for tables in self.group_tables]
        batch.kv_block_table, batch.kv_block_rows, batch.kv_write_index = addressing[0]
        if len(addressing) > 1:
            batch.kv_group_addressing = addressing

    def _addressing(self, batch: PackedBatch, block_tables: Mapping[int, list[int]]):
        """One group's (kv_block_table, kv_block_rows, kv_write_index) for ``batch``."""
        block_size = self.block_size
        tables = [block_tables[s.request_id] for s in batch.seqs]
        for table, cached, new in zip(tables, batch.num_cached, batch.num_new, strict=True):
            assert len(table) * block_size >= cached + new, "a sequence has too few KV blocks"
        width = max(len(t) for t in tables)
        num_slots = batch.num_slots
        padded = torch.zeros(num_slots, width, dtype=torch.long)  # (B, max_blocks); idle: block 0
        for seq, table in zip(batch.seqs, tables, strict=True):
            padded[seq.slot, : len(table)] = torch.tensor(table).clamp_(min=0)  # FREED: 0
        device = batch.input_ids.device
        offsets = torch.arange(block_size)
        rows = (padded[:, :, None] * block_size + offsets).reshape(num_slots, -1)
        rows = rows.to(device)  # (B, max_blocks * block_size)
        positions = batch.position_ids[0]  # (T,)
        return padded.to(device), rows, rows[batch.slot_ids, positions]  # write index: (T,)

    def _layer(self, layer: int, batch: PackedBatch):
        """``layer``'s storage row and its group's (table, block rows, write index)."""
        group, row = self.layer_rows[layer]
        if batch.kv_group_addressing is None:
            return row, (batch.kv_block_table, batch.kv_block_rows, batch.kv_write_index)
        return row, batch.kv_group_addressing[group]

    def layer_block_table(self, layer: int, batch: PackedBatch) -> torch.Tensor:
        return self._layer(layer, batch)[1][0]

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor, batch: PackedBatch):
        """Store the step's new keys/values ([1, H_kv, T, D]) in their sequences' blocks."""
        row, (_, _, write_index) = self._layer(layer, batch)
        self.keys[row].index_copy_(1, write_index, key[0])
        self.values[row].index_copy_(1, write_index, value[0])

    def block_storage(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A layer's storage as its blocks: [H_kv, N, block_size, D] each."""
        row = self.layer_rows[layer][1]
        num_kv_heads, _, head_dim = self.keys.shape[1:]
        shape = (num_kv_heads, -1, self.block_size, head_dim)
        return self.keys[row].view(shape), self.values[row].view(shape)

    def slot_view(self, layer: int, batch: PackedBatch, kv_len: int):
        """Gather every slot's first ``kv_len`` positions: keys, values [B, H_kv, kv_len, D]."""
        row, (_, block_rows, _) = self._layer(layer, batch)
        rows = block_rows[:, :kv_len]  # (B, kv_len)
        return self._gather(self.keys[row], rows), self._gather(self.values[row], rows)

    def _slot_kv(self, layer: int, batch: PackedBatch, slot: int, kv_len: int):
        """Gather one slot's first ``kv_len`` positions: keys, values [H_kv, kv_len, D]."""
        row, (_, block_rows, _) = self._layer(layer, batch)
        rows = block_rows[slot, :kv_len]  # (kv_len,)
        return self.keys[row].index_select(1, rows), self.values[row].index_select(1, rows)

    @staticmethod
    def _gather(store: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """[H_kv, N * block_size, D] rows -> [B, H_kv, n, D] for ``rows`` [B, n]."""
        num_rows, n = rows.shape
        picked = store.index_select(1, rows.reshape(-1))  # (H_kv, B * n, D)
        return picked.view(store.shape[0], num_rows, n, store.shape[-1]).transpose(0, 1)

    def release(self, request_id: int) -> None:
        """Nothing here: the scheduler returns a sequence's blocks through the block manager."""


class ConcatKVCache(KVCache):
    """The article's per-sequence caches, concatenated into one packed cache every step.

    Shapes:
        per sequence and layer: keys, values [1, H_kv, n_cached, D]
        ``gather`` returns: keys, values [1, H_kv, T_kv, D] laid out as [cached | new]
    """

    def __init__(self, num_layers, num_kv_heads, head_dim, dtype):
        self.num_layers = num_layers
        self.bytes_per_token = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype)
        self._store: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def gather(self, layer: int, key: torch.Tensor, value: torch.Tensor, batch: PackedBatch):
        """Concatenate all cached KV plus this step's, then append the new KV per sequence."""
        ids = [s.request_id for s in batch.seqs]
        cached = [self._store[i][layer] for i, n in zip(ids, batch.num_cached, strict=True) if n]
        keys = torch.cat([k for k, _ in cached] + [key], dim=2)  # (1, H_kv, T_kv, D)
        values = torch.cat([v for _, v in cached] + [value], dim=2)
        self.write(layer, key, value, batch)
        return keys, values

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor, batch: PackedBatch):
        """Append each sequence's new keys/values ([1, H_kv, T, D] in packed order) to its own."""
        start = 0
        for seq, n in zip(batch.seqs, batch.num_new, strict=True):
            new_k, new_v = key[:, :, start : start + n], value[:, :, start : start + n]
            layers = self._store.setdefault(seq.request_id, [None] * self.num_layers)
            old = layers[layer]
            if old is None:
                layers[layer] = (new_k.clone(), new_v.clone())
            else:
                layers[layer] = (torch.cat([old[0], new_k], 2), torch.cat([old[1], new_v], 2))
            start += n

    def sequence_kv(self, layer: int, batch: PackedBatch, index: int):
        keys, values = self._store[batch.seqs[index].request_id][layer]
        return keys[0], values[0]

    def prepare(self, batch: PackedBatch) -> None:
        """The packed mask this mode applies literally (none in batch-invariant mode)."""
        if batch.invariant:
            return
        mask = packed_step_mask(batch.num_cached, batch.num_new)  # (T, T_kv)
        batch.packed_mask = mask[None, None].to(batch.input_ids.device)

    def release(self, request_id: int) -> None:
        self._store.pop(request_id, None)

    @property
    def total_bytes(self) -> int:
        return sum(
            2 * k.numel() * k.element_size() for layers in self._store.values() for k, _ in layers
        )
