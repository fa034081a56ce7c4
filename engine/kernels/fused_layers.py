"""Fused decoder layers: the continuous engine's forward pass without transformers' module tree.

A decode step of a small model multiplies each layer's weights by a few rows, so its floor is the
time to read the weights once; through transformers' modules each layer also runs about 60 small
torch ops and a dozen Python module calls, which on a small CPU cost as much again.
``FusedDecoder`` runs the same computation on the same weights with fewer ops per layer:

* **one matmul for q, k and v, one for gate and up**: the weights stacked once (``[Wq; Wk; Wv]``,
  ``[Wg; Wu]``) and bound to the engines' kernel plan (``engine.kernels.kernel_plan``); outputs
  split by views;
* **the residual add inside the matmul** (``BoundLinear.add``, oneDNN's ``add`` post-op);
* **RMSNorm as one op** (``torch.rms_norm``; in bfloat16 where the C++ kernels build,
  ``torch.ops.cbp_layer.rms_norm``), **SiLU-and-mul as one op in bfloat16**
  (``torch.ops.cbp_layer.silu_mul``), **rotary as four** (``_rotary``), on q and k together;
* attention and the KV cache are ``engine.kernels.packed_attention``'s, with the decode mask made
  additive once per step; a decode-only step splits its attention by slot length
  (``engine.kernels.decode_attention``), and with an in-place cache and the C++ kernels runs each
  layer's rotary, KV write and attention as one call (``decode_attention.decode_step``);
* **the whole layer stack in one call** on such a step where the gemv kernel serves its row count
  (``LayerStack``: ``torch.ops.cbp_step.decoder_layers``), the same kernels in the same order
  called from C++, without Python and the dispatcher between some 1,700 small ops.

In float32 each of these gives the same bits as transformers' modules
(``tests/engine/kernels/test_fused_layers.py``). Only the engines use it
(``ModelRunner.forward_packed``). Supported: Llama-style decoders (q/k/v/o and gate/up/down
linears, RMSNorm, SiLU, default RoPE) on CPU (``unsupported_reason``); for anything else, or with
``CBP_FUSED_LAYERS=off``, the runner calls the model itself.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from engine.kernels import decode_attention, gemv_build, packed_attention
from engine.kernels.kernel_plan import PlannedLinear, RowPlan
from engine.kernels.linear_kernel import GemvLinear
from engine.serving.packed_batch import PackedBatch

CHOICES = {  # CBP_FUSED_LAYERS
    "auto": "the fused decoder layers where they apply",
    "off": "transformers' own layers",
}
_LAYER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass
class FusedLayer:
    """One decoder layer's stacked weights and norm weights."""

    attn: nn.Module  # the layer's attention module: packed_attention reads layer_idx from it
    input_norm: torch.Tensor  # (d,)
    post_norm: torch.Tensor  # (d,)
    qkv: PlannedLinear  # [Wq; Wk; Wv]
    o: PlannedLinear
    gate_up: PlannedLinear  # [Wg; Wu]
    down: PlannedLinear

    @property
    def linears(self) -> tuple[PlannedLinear, ...]:
        """Its four matmuls in the order a step runs them: qkv, o, gate_up, down."""
        return self.qkv, self.o, self.gate_up, self.down


def unsupported_reason(model: nn.Module) -> str | None:
    """Why ``FusedDecoder`` cannot run ``model``, or None when it can."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not hasattr(inner, "rotary_emb") or not hasattr(inner, "norm"):
        return "not a Llama-style decoder (model.model.layers, rotary_emb, norm)"
    config = model.config
    if config.rope_parameters.get("rope_type", "default") != "default":
        return f"RoPE type {config.rope_parameters['rope_type']!r}"
    if getattr(config, "hidden_act", None) != "silu":
        return f"activation {getattr(config, 'hidden_act', None)!r}"
    for layer in layers:
        parts = {name: getattr(layer.self_attn, name, None) for name in _LAYER_LINEARS[:4]}
        parts |= {name: getattr(layer.mlp, name, None) for name in _LAYER_LINEARS[4:]}
        if any(type(m) is not nn.Linear for m in parts.values()):
            return "a layer's projections are not plain nn.Linear"
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        if any(not type(n).__name__.endswith("RMSNorm") for n in norms):
            return "a layer's norms are not RMSNorm"
    return None


class FusedDecoder:
    """The decoder stack of a Llama-style model over a packed batch; see the module docstring.

    Raises:
        ValueError: the model is not supported (``unsupported_reason``).
        RuntimeError: oneDNN cannot pack a stacked weight (``kernel`` ``"onednn"`` or
            ``"onednn_f32"``).
    """

    def __init__(self, model: nn.Module, kernel: str | RowPlan):
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"fused decoder: {reason}")
        inner = model.model
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.final_norm = inner.norm.weight
        self.eps = float(inner.norm.variance_epsilon)
        config = model.config
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.intermediate = config.intermediate_size
        self.layers = [_fused_layer(layer, kernel) for layer in inner.layers]
        self.layer_ops = layer_ops_run(self.final_norm)  # cbp_layer's bfloat16 norm and SiLU
        self.stack = LayerStack.of(self.layers, self.eps)  # None: the loop in Python serves

    @property
    def extra_bytes(self) -> int:
        """Memory of the stacked weight copies, in bytes."""
        linears = [f for la in self.layers for f in la.linears]
        return sum(f.extra_bytes for f in linears)

    def hidden_states(self, batch: PackedBatch) -> torch.Tensor:
        """Final-normed hidden states of each sequence's last token, for the output embedding.

        Shapes:
            batch.input_ids: [1, T]  ->  returns [1, S, d]
        """
        x = self.embed(batch.input_ids[0])  # (T, d)
        cos, sin = self.rotary(x, batch.position_ids)  # (1, T, D) each
        half = self.head_dim // 2
        rope = (cos[0, :, None], torch.cat((-sin[0, :, :half], sin[0, :, half:]), -1)[:, None])
        split = decode_attention.plan_decode(batch, x.dtype)  # None: prefills, the packed path
        if split is None:
            batch = additive_decode_mask(batch, x.dtype)
        if split is not None and split.whole_step and self.stack and self.stack.takes(x):
            x = self.stack(x, rope[0][:, 0], rope[1][:, 0], batch, self.num_heads)  # (T, d)
        else:
            for layer in self.layers:
                x = self._layer(layer, x, rope, batch, split)
        last = x[batch.logits_indices]  # (S, d)
        return self._norm(last, self.final_norm)[None]  # (1, S, d)

    def _layer(self, layer: FusedLayer, x, rope, batch, split) -> torch.Tensor:
        """One decoder layer on the packed row. Shapes: x [T, d] -> [T, d]."""
        num_tokens, head_dim = x.shape[0], self.head_dim
        heads, kv_heads = self.num_heads, self.num_kv_heads
        qkv = layer.qkv(self._norm(x, layer.input_norm))  # (T, (H + 2 H_kv) D)
        if split is not None and split.whole_step:
            cos, signed_sin = rope[0][:, 0], rope[1][:, 0]  # (T, D) each
            index = layer.attn.layer_idx
            out = decode_attention.decode_step(
                qkv, cos, signed_sin, index, batch, heads, layer.attn.scaling
            )  # (T, H D)
            return self._mlp(layer, layer.o.add(out, x))
        qk = qkv[:, : (heads + kv_heads) * head_dim].view(num_tokens, heads + kv_heads, head_dim)
        qk = _rotary(qk, *rope)  # (T, H + H_kv, D)
        value = qkv[:, (heads + kv_heads) * head_dim :].view(num_tokens, kv_heads, head_dim)
        query = qk[:, :heads].transpose(0, 1)[None]  # (1, H, T, D)
        key = qk[:, heads:].transpose(0, 1)[None]  # (1, H_kv, T, D)
        value = value.transpose(0, 1)[None]  # (1, H_kv, T, D)
        out = attend(layer.attn, query, key, value, batch, split)  # (1, T, H, D)
        x = layer.o.add(out.reshape(num_tokens, heads * head_dim).contiguous(), x)
        return self._mlp(layer, x)

    def _mlp(self, layer: FusedLayer, x: torch.Tensor) -> torch.Tensor:
        """The layer's second half: norm, gate-up, SiLU-and-mul, down, residual.
        Shapes: x [T, d] -> [T, d]."""
        gate_up = layer.gate_up(self._norm(x, layer.post_norm))  # (T, 2 I)
        if self.layer_ops:
            return layer.down.add(torch.ops.cbp_layer.silu_mul(gate_up), x)  # (T, I) -> (T, d)
        act = F.silu(gate_up[:, : self.intermediate]) * gate_up[:, self.intermediate :]
        return layer.down.add(act, x)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """transformers' LlamaRMSNorm: normalize in float32, cast back, then scale by the weight."""
        if x.dtype == torch.float32:
            return torch.rms_norm(x, (x.shape[-1],), weight, self.eps)
        if self.layer_ops:
            return torch.ops.cbp_layer.rms_norm(x, weight, self.eps)
        return torch.rms_norm(x.float(), (x.shape[-1],), None, self.eps).to(x.dtype) * weight


@dataclasses.dataclass
class LayerStack:
    """The decoder layers' weights as ``torch.ops.cbp_step.decoder_layers`` takes them, for a
    decode step in one call. ``of`` builds it where every projection is the gemv kernel's
    without a bias; ``takes(x)`` says whether the plan gives gemv ``x``'s row count.

    Shapes:
        norms: 2 L weights [d];  packed: 4 L gemv layouts;  widths: qkv, o, gate_up, down's N
    """

    linears: list[PlannedLinear]  # 4 per layer: qkv, o, gate_up, down
    layer_indices: list[int]  # each layer's KV cache index (its attention's layer_idx)
    norms: list[torch.Tensor]
    packed: list[torch.Tensor]
    widths: list[int]
    scaling: float
    eps: float

    @classmethod
    def of(cls, layers: list[FusedLayer], eps: float) -> LayerStack | None:
        """The stack for ``layers``, or None where the op is not built or a projection is not
        the gemv kernel's (another plan, a bias) or the layers differ in scaling."""
        linears = [f for la in layers for f in la.linears]
        gemv = [next((b for b in f.bound if isinstance(b, GemvLinear)), None) for f in linears]
        scalings = {la.attn.scaling for la in layers}
        if not gemv_build.available() or len(scalings) != 1:
            return None
        if any(g is None or g.bias is not None for g in gemv):
            return None
        return cls(
            linears=linears,
            layer_indices=[la.attn.layer_idx for la in layers],
            norms=[w for la in layers for w in (la.input_norm, la.post_norm)],
            packed=[g.packed for g in gemv],
            widths=[g.num_out for g in gemv[:4]],
            scaling=scalings.pop(),
            eps=eps,
        )

    taken: dict[int, bool] = dataclasses.field(default_factory=dict)  # row count: gemv's?
    num_calls: int = 0  # decode steps it ran

    def takes(self, x: torch.Tensor) -> bool:
        """Whether every projection runs the gemv kernel on ``x`` [T, d] (its row count, in
        float32 or bfloat16: the op's norms are those of ``FusedDecoder._norm`` in these two)."""
        if x.dtype not in (torch.float32, torch.bfloat16):
            return False
        rows = x.shape[0]
        if rows not in self.taken:
            kernels = [f.kernel_at(rows) for f in self.linears]
            self.taken[rows] = all(isinstance(k, GemvLinear) and k.takes(x) for k in kernels)
        return self.taken[rows]

    def __call__(self, x, cos, signed_sin, batch: PackedBatch, num_heads: int) -> torch.Tensor:
        """Every layer on a decode step whose split is ``whole_step``.

        Shapes:
            x: [T, d];  cos, signed_sin: [T, D]  ->  returns [T, d]
        """
        self.num_calls += 1
        storage = [batch.kv_cache.block_storage(i) for i in self.layer_indices]
        return torch.ops.cbp_step.decoder_layers(
            x,
            cos,
            signed_sin,
            self.norms,
            self.packed,
            self.widths,
            [keys for keys, _ in storage],
            [values for _, values in storage],
            batch.kv_block_table,
            batch.slot_ids,
            batch.position_ids[0],
            num_heads,
            self.scaling,
            self.eps,
        )


def layer_ops_run(weight: torch.Tensor) -> bool:
    """Whether ``torch.ops.cbp_layer`` (built with the gemv kernel) serves a model whose weights
    are like ``weight``: bfloat16 on a CPU. float32 keeps torch's ops, whose bits are
    transformers' own; elsewhere (no compiler, ``CBP_GEMV=off``) torch's ops serve bfloat16 too.
    """
    if weight.dtype != torch.bfloat16 or weight.device.type != "cpu":
        return False
    return gemv_build.available()


def _fused_layer(layer: nn.Module, kernel: str | RowPlan) -> FusedLayer:
    attn, mlp = layer.self_attn, layer.mlp
    return FusedLayer(
        attn=attn,
        input_norm=layer.input_layernorm.weight.detach(),
        post_norm=layer.post_attention_layernorm.weight.detach(),
        qkv=PlannedLinear([attn.q_proj, attn.k_proj, attn.v_proj], kernel),
        o=PlannedLinear([attn.o_proj], kernel),
        gate_up=PlannedLinear([mlp.gate_proj, mlp.up_proj], kernel),
        down=PlannedLinear([mlp.down_proj], kernel),
    )


def attend(attn: nn.Module, query, key, value, batch: PackedBatch, split) -> torch.Tensor:
    """One layer's attention on the packed row: its keys and values into the KV cache, then each
    query over its own sequence's keys (``decode_attention`` on a decode-only step's ``split``,
    else ``packed_attention``). The compiled step's attention op runs it too.

    Shapes:
        query: [1, H, T, D];  key, value: [1, H_kv, T, D]  ->  returns [1, T, H, D]
    """
    if split is not None:
        batch.kv_cache.write(attn.layer_idx, key, value, batch)
        return decode_attention.decode_attention(
            query, batch.kv_cache, attn.layer_idx, batch, split, attn.scaling
        )
    out, _ = packed_attention.packed_attention(
        attn, query, key, value, None, scaling=attn.scaling, packed_batch=batch
    )
    return out


def _rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin``, with ``rotate_half(x) * sin == flip(x) * signed_sin``.

    ``rotate_half(x) = cat(-x2, x1)`` and ``flip`` of the two halves is ``cat(x2, x1)``; negating
    ``sin``'s first half instead of ``x2`` is exact, so the bits are transformers' own.

    Shapes:
        x: [T, heads, D];  cos, signed_sin: [T, 1, D]  ->  [T, heads, D]
    """
    num_tokens, heads, head_dim = x.shape
    swapped = (
        x.reshape(num_tokens, heads, 2, head_dim // 2).flip(2).view(num_tokens, heads, head_dim)
    )
    return x * cos + swapped * signed_sin


def additive_decode_mask(batch: PackedBatch, dtype: torch.dtype) -> PackedBatch:
    """The batch with its boolean decode mask as SDPA's additive form (0 / -inf), made once.

    SDPA turns a boolean mask into exactly this on every call; here it happens once per step.
    """
    mask = batch.decode_mask
    if mask is None or mask.dtype != torch.bool:
        return batch
    additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return dataclasses.replace(batch, decode_mask=additive.masked_fill_(~mask, float("-inf")))
