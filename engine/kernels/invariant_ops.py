"""Batch-invariant mode: a sequence's numerics do not depend on what else shares its step.

In the normal mode a sequence's logits depend, in their last bits, on the step it ran in: a matmul
kernel picks its blocking (and so its summation order) from the number of rows, a decode step
attends over the longest slot's keys with the others masked, and a prefill chunk attends over a
key range that depends on how the prompt was chunked. In half precision that flips near-ties, and
a batched output differs from the solo one. This mode removes each dependence by construction:

* **Row-wise ops in fixed tiles.** Every ``nn.Linear``, every RMSNorm and every MLP block (its
  activation included) runs on tiles of exactly ``TILE_ROWS`` rows (the last tile zero-padded;
  1 row for emulated half precision on CPU, ``tile_rows_for``), one kernel call per tile, so a
  token row goes through the same kernel with the same shape whether it is alone, packed with
  others, part of a prefill chunk or a decode.
* **Rotary tables.** cos/sin of each position come from a table filled in fixed blocks of
  ``ROPE_BLOCK`` positions, not from a fresh vectorized ``cos`` over the step's positions.
* **Attention per query row over exactly its own keys** (``engine.kernels.invariant_attention``):
  keys in fixed blocks of ``KEY_BLOCK``, one fixed-shape matmul per (query row, key block), blocks
  past the row's position masked to exact zeros, and the blocks summed one after another in a fixed
  order.
* Embedding lookups, residual adds and the rotary products are elementwise and exact per element.

This is vLLM's batch invariance on GPUs (``VLLM_BATCH_INVARIANT=1``, vLLM #27433), after Thinking
Machines' "Defeating Nondeterminism in LLM Inference" (He et al., 2025), whose kernels do not run
on a CPU; here the kernels are torch's own, called with fixed shapes. The tests compare packed
and solo logits bitwise in float32 and bfloat16; on CUDA, ``make gpu-check`` reports it. The
reference in this mode is the continuous engine with one slot
(``engine.fidelity.reference.SoloReference``).

Supported models: Llama-style decoders (``*RMSNorm``, ``*MLP`` and ``*RotaryEmbedding`` modules,
static RoPE). Others raise ``ValueError`` when the mode is asked for.
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
    """``fn`` on fixed ``[tile_rows, d]`` tiles of ``x``'s rows (the last tile zero-padded).

    Shapes:
        x: [..., d]  ->  [..., d_out], where fn maps [tile_rows, d] -> [tile_rows, d_out]
    """
    tile_rows = tile_rows or TILE_ROWS
    rows = x.reshape(-1, x.shape[-1])  # (N, d)
    num_rows = rows.shape[0]
    pad = -num_rows % tile_rows
    if pad:
        rows = torch.cat([rows, rows.new_zeros(pad, rows.shape[-1])])  # (N + pad, d)
    out = torch.cat([fn(tile) for tile in rows.split(tile_rows)])[:num_rows]  # (N, d_out)
    return out.view(*x.shape[:-1], out.shape[-1])


def tile_rows_for(device_type: str, dtype: torch.dtype, kernel_name: str) -> int:
    """Rows per tile: 1 for half precision on a CPU without a native kernel for it (the engines'
    kernel fell back to ``skinny``, torch's reference loops, whose cost grows with every row, so
    padding a decode row to 8 would cost 8 rows), else ``TILE_ROWS``. Either is one fixed shape."""
    if device_type == "cpu" and dtype != torch.float32 and kernel_name != "onednn":
        return 1
    return TILE_ROWS


def _tiled(forward: Callable, tile: int, module: nn.Module, x: torch.Tensor):
    """``forward(module, x)`` on tiles of ``tile`` rows (``tiled_rows``)."""
    return tiled_rows(functools.partial(forward, module), x, tile)


class RopeTable:
    """cos/sin of every position, computed once per block of ``ROPE_BLOCK`` positions.

    Wraps a rotary embedding module's ``forward(x, position_ids) -> (cos, sin)``; each block is
    computed by the module itself on that block's positions, in float32, so a position's values
    never depend on which other positions a step holds.
    """

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
    """Refuse a model this mode does not cover.

    Raises:
        ValueError: no RMSNorm, MLP or rotary embedding modules, or a dynamic RoPE.
    """
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
    """The mode's replacements for one model: ``installed()`` routes the model through them.

    ``linear_forward`` computes one tile of a linear (the engines' kernel, or ``F.linear``);
    ``tile_rows`` is the tile (``tile_rows_for``).

    Raises:
        ValueError: the model is not supported (``check_supported``).
    """

    def __init__(self, model: nn.Module, linear_forward: LinearForward, tile_rows=TILE_ROWS):
        check_supported(model)
        self.linear_forward = linear_forward
        self.tile_rows = tile_rows
        self.linears = linear_modules(model)
        self.tiled = _modules_ending(model, "RMSNorm") + _modules_ending(model, "MLP")
        self.ropes = [RopeTable(m) for m in _modules_ending(model, "RotaryEmbedding")]

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Within the block, the model computes in batch-invariant mode."""
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
