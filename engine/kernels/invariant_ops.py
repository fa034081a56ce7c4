"""Batch-invariant mode: a sequence's numerics do not depend on what else shares its step.

Fixed row tiles (``TILE_ROWS``), a RoPE table filled in fixed blocks (``ROPE_BLOCK``) and
``invariant_attention``; design and prior art: docs/precision.md.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch
from torch import nn

from engine.kernels.linear_kernel import LinearForward, linear_modules

TILE_ROWS = 8  # rows per kernel call of every linear, norm and MLP
KEY_BLOCK = 64  # keys per attention block
ROPE_BLOCK = 64  # positions per rotary-table block
INVARIANT_ATTENTION = "cbp_invariant"  # attention for model.generate (static engine)


def tiled_rows(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, tile_rows=TILE_ROWS):
    """``fn`` on fixed ``[tile_rows, d]`` tiles of ``x``'s rows (the last zero-padded).
    Shapes: x: [..., d]  ->  [..., d_out], where fn maps [tile_rows, d] -> [tile_rows, d_out]"""
    tile_rows = tile_rows or TILE_ROWS
    rows = x.reshape(-1, x.shape[-1])  # (N, d)
    num_rows = rows.shape[0]
    pad = -num_rows % tile_rows
    if pad:
        rows = torch.cat([rows, rows.new_zeros(pad, rows.shape[-1])])  # (N + pad, d)
    out = torch.cat([fn(tile) for tile in rows.split(tile_rows)])[:num_rows]  # (N, d_out)
    return out.view(*x.shape[:-1], out.shape[-1])


def tile_rows_for(device_type: str, dtype: torch.dtype, kernel_name: str) -> int:
    """1 for half precision on a CPU without a native kernel (torch's ``skinny`` loops cost per row,
    so padding a decode row to 8 would cost 8), else ``TILE_ROWS``."""
    if device_type == "cpu" and dtype != torch.float32 and kernel_name != "onednn":
        return 1
    return TILE_ROWS


def _tiled(forward: Callable, tile: int, module: nn.Module, x: torch.Tensor):
    return tiled_rows(functools.partial(forward, module), x, tile)


class RopeTable:
    """cos/sin of every position, computed by the rotary module in float32 once per block of
    ``ROPE_BLOCK`` positions, so a position's values never depend on the step's other positions."""

    def __init__(self, rotary: nn.Module):
        self.rotary = rotary
        self.original = type(rotary).forward
        # per layer type (None: the module takes none; Gemma 3's have their own frequencies):
        # per block, [ROPE_BLOCK, D] float32 cos and sin
        self._blocks: dict[str | None, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type=None):
        """``(cos, sin)``, each ``[B, T, D]`` in ``x``'s dtype, for ``position_ids`` ``[B, T]``."""
        needed = int(position_ids.max()) // ROPE_BLOCK + 1
        device = position_ids.device
        cos_blocks, sin_blocks = self._blocks.setdefault(layer_type, ([], []))
        extra = () if layer_type is None else (layer_type,)
        while len(cos_blocks) < needed:
            start = len(cos_blocks) * ROPE_BLOCK
            block = torch.arange(start, start + ROPE_BLOCK, device=device)[None]  # (1, ROPE_BLOCK)
            probe = torch.empty(0, device=device, dtype=torch.float32)
            cos, sin = self.original(self.rotary, probe, block, *extra)  # (1, ROPE_BLOCK, D) each
            cos_blocks.append(cos[0])
            sin_blocks.append(sin[0])
        cos_table = torch.cat(cos_blocks[:needed])  # (needed * ROPE_BLOCK, D)
        sin_table = torch.cat(sin_blocks[:needed])
        return cos_table[position_ids].to(x.dtype), sin_table[position_ids].to(x.dtype)


def _modules_ending(model: nn.Module, suffix: str) -> list[nn.Module]:
    return [m for m in model.modules() if type(m).__name__.endswith(suffix)]


def check_supported(model: nn.Module) -> None:
    """Raises ValueError: no RMSNorm, MLP or rotary embedding modules, or a dynamic RoPE."""
    name = type(model).__name__
    for suffix in ("RMSNorm", "MLP", "RotaryEmbedding"):
        if not _modules_ending(model, suffix):
            raise ValueError(
                f"Batch-invariant mode supports Llama-style models; {name} has no {suffix} "
                "module. Run it without batch-invariant mode."
            )
    for rotary in _modules_ending(model, "RotaryEmbedding"):
        rope_type = str(getattr(rotary, "rope_type", "default"))
        if "dynamic" in rope_type or "longrope" in rope_type:
            raise ValueError(
                f"Batch-invariant mode needs a static RoPE; {name} uses {rope_type!r}. "
                "Run it without batch-invariant mode."
            )


class InvariantKernels:
    """The mode's replacements for one model; ``installed()`` routes the model through them.
    ``linear_forward`` computes one tile of a linear. Raises ValueError (``check_supported``)."""

    def __init__(self, model: nn.Module, linear_forward: LinearForward, tile_rows=TILE_ROWS):
        check_supported(model)
        self.linear_forward = linear_forward
        self.tile_rows = tile_rows
        self.linears = linear_modules(model)
        self.tiled = _modules_ending(model, "RMSNorm") + _modules_ending(model, "MLP")
        self.ropes = [RopeTable(m) for m in _modules_ending(model, "RotaryEmbedding")]

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        patched = []
        try:
            routed = [(m, self.linear_forward) for m in self.linears]
            routed += [(m, type(m).forward) for m in self.tiled]  # the module's own, tiled
            for module, forward in routed:
                module.forward = functools.partial(_tiled, forward, self.tile_rows, module)
                patched.append(module)
            for table in self.ropes:
                table.rotary.forward = table.forward
                patched.append(table.rotary)
            yield
        finally:
            for module in patched:
                del module.forward
