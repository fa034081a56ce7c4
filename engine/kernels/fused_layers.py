"""Fused decoder layers: the continuous engine's forward pass without transformers' module tree.

Stacked projections, the residual add inside the matmul, one-op norms and the whole layer stack
in one C++ call. Design and limits: docs/engines.md#kernels.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import torch
from torch import nn

from engine.kernels import (
    decode_attention,
    gemv_build,
    layer_spec,
    linear_kernel,
    packed_attention,
)
from engine.kernels.kernel_plan import PlannedLinear, RowPlan
from engine.kernels.layer_spec import LayerSpec, Norm
from engine.kernels.linear_kernel import GemvLinear, SplitLinear
from engine.serving.packed_batch import PackedBatch

CHOICES = {  # CBP_FUSED_LAYERS
    "auto": "the fused decoder layers where they apply",
    "off": "transformers' own layers",
}


@dataclasses.dataclass
class FusedLayer:
    """One decoder layer: what it computes, and its stacked weights."""

    spec: LayerSpec
    qkv: PlannedLinear  # [Wq; Wk; Wv]
    o: PlannedLinear
    gate_up: PlannedLinear  # [Wg; Wu]
    down: PlannedLinear

    @property
    def attn(self) -> nn.Module:
        return self.spec.attn

    @property
    def linears(self) -> tuple[PlannedLinear, ...]:
        """In step order: qkv, o, gate_up, down."""
        return self.qkv, self.o, self.gate_up, self.down


def unsupported_reason(model: nn.Module) -> str | None:
    """Why ``FusedDecoder`` cannot run ``model``, or None when it can."""
    try:
        layer_spec.read_decoder(model)
    except layer_spec.Unsupported as why:
        return str(why)
    return None


class FusedDecoder:
    """The decoder stack over a packed batch; ``shared``: the engines' own ``PlannedLinear`` per
    module, whose packed copies o, down and the stacks reuse.

    Raises:
        ValueError: the model is not supported (``layer_spec.Unsupported``).
        RuntimeError: oneDNN cannot pack a stacked weight.
    """

    def __init__(self, model: nn.Module, kernel: str | RowPlan, shared: Mapping | None = None):
        self.spec = spec = layer_spec.read_decoder(model)
        self.shared_ids = {id(p) for p in (shared or {}).values()}
        self.num_heads, self.num_kv_heads = spec.num_heads, spec.num_kv_heads
        self.head_dim = spec.head_dim
        self.layers = [_fused_layer(layer, kernel, shared or {}) for layer in spec.layers]
        self.eps = spec.final_norm.eps
        self.layer_ops = layer_ops_run(spec.final_norm.weight)  # cbp_layer's bfloat16 ops
        # None: the C++ attention serves these heads (its limits: ``decode_attention``)
        self.attention_refusal = decode_attention.kernel_refusal(
            self.num_heads, self.num_kv_heads, self.head_dim
        )
        widths = self.rope_widths
        self.stack_refusal = LayerStack.refusal(self.layers, widths, self.attention_refusal)
        # None: the loop in Python serves, ``stack_refusal`` saying why
        self.stack = LayerStack.of(self.layers, self.stack_refusal, self.layer_ops)

    @property
    def rope_widths(self) -> dict:
        """Rotated dims per rotary type (``head_dim``: full RoPE)."""
        x = self.spec.embed.weight[:1].detach()  # (1, d)
        ropes = self._ropes(x, torch.zeros(1, 1, dtype=torch.long, device=x.device))
        return {kind: cos.shape[-1] for kind, (cos, _) in ropes.items()}

    @property
    def layers_step(self) -> str:
        """For the bench JSON: ``"C++"`` (``LayerStack``) or ``"Python: <why>"``."""
        return "C++" if self.stack is not None else f"Python: {self.stack_refusal}"

    @property
    def planned(self) -> list[PlannedLinear]:
        return [f for la in self.layers for f in la.linears]

    @property
    def extra_bytes(self) -> int:
        """Bytes of the weight copies only these layers hold."""
        return sum(f.extra_bytes for f in self.own_planned)

    @property
    def own_planned(self) -> list[PlannedLinear]:
        return [f for f in self.planned if id(f) not in self.shared_ids]

    def hidden_states(self, batch: PackedBatch) -> torch.Tensor:
        """Final-normed hidden states of each sequence's last token, for the output embedding.
        Shapes: batch.input_ids: [1, T]  ->  returns [1, S, d]"""
        x = self.spec.embed(batch.input_ids[0])  # (T, d)
        if self.spec.embed_multiplier != 1.0:
            x = x * self.spec.embed_multiplier
        ropes = self._ropes(x, batch.position_ids)
        fits = self.attention_refusal is None
        split = decode_attention.plan_decode(batch, x.dtype, fits=fits)  # None: the packed path
        if split is None:
            batch = additive_decode_mask(batch, x.dtype)
        if split is not None and split.whole_step and self.stack and self.stack.takes(x):
            x = self.stack(x, ropes, batch, self.num_heads)  # (T, d)
        else:
            for layer in self.layers:
                x = self._layer(layer, x, ropes[rope_key(layer.spec)], batch, split)
        last = x[batch.logits_indices]  # (S, d)
        return self._norm(last, self.spec.final_norm)[None]  # (1, S, d)

    def logits(self, head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """Logits with Granite's divisor, Gemma's soft-cap. Shapes: [1, S, d] -> [1, S, V]."""
        logits = head(hidden)
        if self.spec.logits_divisor != 1.0:
            logits = logits / self.spec.logits_divisor
        if self.spec.logit_softcap is not None:
            cap = self.spec.logit_softcap
            logits = torch.tanh(logits / cap) * cap
        return logits

    def _ropes(self, x: torch.Tensor, position_ids: torch.Tensor) -> dict:
        """Per rotary type (None: the model's one), (cos, signed_sin) [T, 1, R] in the rotary
        module's dtype; ``NOPE``: 1 and 0 [T, 1, D], which leave x unchanged."""
        ropes = {}
        if any(not la.spec.rope for la in self.layers):
            ones = x.new_ones(x.shape[0], 1, self.head_dim)
            ropes[NOPE] = (ones, torch.zeros_like(ones))
        for kind in {la.spec.rope_type for la in self.layers if la.spec.rope}:
            extra = () if kind is None else (kind,)
            cos, sin = self.spec.rotary(x, position_ids, *extra)  # (1, T, R) each
            half = cos.shape[-1] // 2
            signed = torch.cat((-sin[0, :, :half], sin[0, :, half:]), -1)
            ropes[kind] = (cos[0, :, None], signed[:, None])
        return ropes

    def _layer(self, layer: FusedLayer, x, rope, batch, split) -> torch.Tensor:
        """One decoder layer on the packed row. Shapes: x [T, d] -> [T, d]."""
        spec = layer.spec
        h = x if spec.pre_attn is None else self._norm(x, spec.pre_attn)
        qkv = layer.qkv(h)  # (T, (H + 2 H_kv) D)
        if spec.q_norm is not None:
            qkv = self._qk_norm(qkv, spec)
        out = self._attention(layer, qkv, rope, batch, split)  # (T, H D)
        x = self._residual(layer.o, out, x, spec.post_attn, spec.residual_multiplier)
        h = x if spec.pre_mlp is None else self._norm(x, spec.pre_mlp)
        gate_up = layer.gate_up(h)  # (T, 2 I)
        if self.layer_ops and spec.silu:
            act = torch.ops.cbp_layer.silu_mul(gate_up)  # (T, I)
        else:
            half = gate_up.shape[-1] // 2
            act = spec.act(gate_up[:, :half]) * gate_up[:, half:]  # (T, I)
        return self._residual(layer.down, act, x, spec.post_mlp, spec.residual_multiplier)

    def _residual(self, linear: PlannedLinear, y, x, post: Norm | None, multiplier: float):
        """``x + post(linear(y)) * multiplier``, inside the matmul when plain."""
        if post is None and multiplier == 1.0:
            return linear.add(y, x)
        y = linear(y)
        if post is not None:
            y = self._norm(y, post)
        return x + (y if multiplier == 1.0 else y * multiplier)

    def _attention(self, layer: FusedLayer, qkv, rope, batch: PackedBatch, split):
        """Shapes: qkv [T, (H + 2 H_kv) D] -> [T, H D]; ``decode_step`` on a whole step."""
        spec, attn = layer.spec, layer.attn
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        windowed = batch.windowed(spec.window)
        whole = split is not None and split.whole_step
        if whole:
            cos, signed_sin = rope[0][:, 0], rope[1][:, 0]  # (T, R) each
            return decode_attention.decode_step(
                qkv, cos, signed_sin, attn.layer_idx, batch, heads, attn.scaling, spec.window,
                spec.softcap,
            )  # fmt: skip
        num_tokens = qkv.shape[0]
        qk = qkv[:, : (heads + kv_heads) * head_dim].view(num_tokens, heads + kv_heads, head_dim)
        if spec.rope:
            qk = _rotary(qk, *rope)  # (T, H + H_kv, D)
        value = qkv[:, (heads + kv_heads) * head_dim :].view(num_tokens, kv_heads, head_dim)
        query = qk[:, :heads].transpose(0, 1)[None]  # (1, H, T, D)
        key = qk[:, heads:].transpose(0, 1)[None]  # (1, H_kv, T, D)
        value = value.transpose(0, 1)[None]  # (1, H_kv, T, D)
        exact = None if whole or windowed is not batch or spec.softcap is not None else split
        out = attend(attn, query, key, value, windowed, exact, spec.softcap)  # (1, T, H, D)
        return out.reshape(num_tokens, heads * head_dim).contiguous()

    def _qk_norm(self, qkv: torch.Tensor, spec: LayerSpec) -> torch.Tensor:
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
        if spec.qk_norm_per_head:
            q = self._norm(q.reshape(-1, heads, head_dim), spec.q_norm).flatten(1)
            k = self._norm(k.reshape(-1, kv_heads, head_dim), spec.k_norm).flatten(1)
        else:
            q, k = self._norm(q, spec.q_norm), self._norm(k, spec.k_norm)
        return torch.cat((q, k, v), -1)

    def _norm(self, x: torch.Tensor, norm: Norm) -> torch.Tensor:
        """RMSNorm cast back before scaling (Llama) or after (``upcast``: Gemma, OLMo 2)."""
        width = (x.shape[-1],)
        if x.dtype == torch.float32:
            return torch.rms_norm(x, width, norm.weight, norm.eps)
        if norm.upcast:
            return (torch.rms_norm(x.float(), width, None, norm.eps) * norm.weight).to(x.dtype)
        if self.layer_ops and x.dim() == 2:
            return torch.ops.cbp_layer.rms_norm(x, norm.weight, norm.eps)
        return torch.rms_norm(x.float(), width, None, norm.eps).to(x.dtype) * norm.weight


@dataclasses.dataclass
class LayerStack:
    """The layers' weights as ``torch.ops.cbp_step.decoder_layers`` takes them, for a decode step
    in one call.

    Shapes:
        norms: 6 L weights or None (``NORMS``' order);  biases: L, qkv's [N] or None;
        packed: 4 L gemv layouts;  widths: qkv, o, gate_up, down's N;
        flags: 4 L ints, numbers: 9 L floats (``_layer_args``)
    """

    linears: list[PlannedLinear]  # 4 per layer: qkv, o, gate_up, down
    layer_indices: list[int]  # each layer's KV cache index (its attention's layer_idx)
    rope_keys: list  # each layer's key into ``FusedDecoder._ropes`` (``rope_key``)
    norms: list[torch.Tensor | None]
    biases: list[torch.Tensor | None]
    packed: list[torch.Tensor]
    widths: list[int]
    flags: list[int]
    numbers: list[float]

    @staticmethod
    def refusal(layers: list[FusedLayer], rope_widths: dict, attention: str | None) -> str | None:
        """Why the op cannot run ``layers``' decode steps, or None where it can."""
        if not gemv_build.available():
            return f"the C++ step is not built: {gemv_build.unavailable_reason()}"
        if attention is not None:
            return attention
        for la in layers:
            spec = la.spec
            if spec.rope and rope_widths[spec.rope_type] % 2:
                return f"RoPE over an odd number of dims ({rope_widths[spec.rope_type]})"
            if not (spec.silu or spec.gelu_tanh):
                return f"the activation {type(spec.act).__name__}"
        linears = [f for la in layers for f in la.linears]
        gemv = [_gemv_of(f) for f in linears]
        if any(g is None for g in gemv):
            return "a projection not on the gemv kernel"
        if any(g.bias is not None for i, g in enumerate(gemv) if i % 4):
            return "a bias on o, gate_up or down"
        return None

    @classmethod
    def of(cls, layers: list[FusedLayer], refusal: str | None, layer_ops: bool):
        if refusal is not None:
            return None
        linears = [f for la in layers for f in la.linears]
        gemv = [_gemv_of(f) for f in linears]
        args = [_layer_args(la.spec, layer_ops) for la in layers]
        return cls(
            linears=linears,
            layer_indices=[la.attn.layer_idx for la in layers],
            rope_keys=[rope_key(la.spec) for la in layers],
            norms=[n if n is None else n.weight for la in layers for n in _norms(la.spec)],
            biases=[g.bias for g in gemv[::4]],
            packed=[g.packed for g in gemv],
            widths=[g.num_out for g in gemv[:4]],
            flags=[f for flags, _ in args for f in flags],
            numbers=[n for _, numbers in args for n in numbers],
        )

    taken: dict[int, bool] = dataclasses.field(default_factory=dict)  # row count: gemv's?
    num_calls: int = 0  # decode steps it ran

    def takes(self, x: torch.Tensor) -> bool:
        """Whether every projection runs gemv on ``x`` [T, d] (float32 or bfloat16 only)."""
        if x.dtype not in (torch.float32, torch.bfloat16):
            return False
        rows = x.shape[0]
        if rows not in self.taken:
            kernels = [f.kernel_at(rows) for f in self.linears]
            self.taken[rows] = all(isinstance(k, GemvLinear) and k.takes(x) for k in kernels)
        return self.taken[rows]

    def __call__(self, x, ropes: dict, batch: PackedBatch, num_heads: int) -> torch.Tensor:
        """Every layer on a ``whole_step`` decode step.
        Shapes: x: [T, d];  ropes: key -> (cos, signed_sin) [T, 1, R], R <= D  ->  returns [T, d]"""
        self.num_calls += 1
        storage = [batch.kv_cache.block_storage(i) for i in self.layer_indices]
        tables = {key: (cos[:, 0], sin[:, 0]) for key, (cos, sin) in ropes.items()}
        return torch.ops.cbp_step.decoder_layers(
            x,
            [tables[key][0] for key in self.rope_keys],
            [tables[key][1] for key in self.rope_keys],
            self.norms,
            self.biases,
            self.packed,
            self.widths,
            [keys for keys, _ in storage],
            [values for _, values in storage],
            [batch.kv_cache.layer_block_table(i, batch) for i in self.layer_indices],
            batch.slot_ids,
            batch.position_ids[0],
            num_heads,
            self.flags,
            self.numbers,
        )


NOPE = False  # the ``_ropes`` key of a layer without RoPE: cos 1 and sin 0, x unchanged


def rope_key(spec: LayerSpec):
    return spec.rope_type if spec.rope else NOPE


def _norms(spec: LayerSpec) -> tuple[Norm | None, ...]:
    return spec.pre_attn, spec.post_attn, spec.pre_mlp, spec.post_mlp, spec.q_norm, spec.k_norm


def _layer_args(spec: LayerSpec, layer_ops: bool) -> tuple[list[int], list[float]]:
    """One layer's ``flags`` and ``numbers``; layout: docs/engines.md#kernels."""
    norms = _norms(spec)
    bits = sum(1 << n for n, norm in enumerate(norms) if norm is not None and norm.upcast)
    bits |= (1 << len(norms)) if layer_ops else 0
    activation = (2 if layer_ops else 0) if spec.silu else 1
    flags = [bits, int(spec.qk_norm_per_head), activation, spec.window or 0]
    eps = [0.0 if n is None else n.eps for n in norms]
    numbers = [float(spec.attn.scaling), float(spec.residual_multiplier), float(spec.softcap or 0)]
    return flags, [*eps, *numbers]


def _gemv_of(linear: PlannedLinear) -> GemvLinear | None:
    return next((b for b in linear.bound if isinstance(b, GemvLinear)), None)


def layer_ops_run(weight: torch.Tensor) -> bool:
    """Whether ``torch.ops.cbp_layer`` serves weights like ``weight``: built, bfloat16, on CPU."""
    if weight.dtype != torch.bfloat16 or weight.device.type != "cpu":
        return False
    return gemv_build.available()


def _fused_layer(spec: LayerSpec, kernel: str | RowPlan, shared: Mapping) -> FusedLayer:

    def single(module: nn.Linear) -> PlannedLinear:
        return shared.get(module) or PlannedLinear([module], kernel)

    return FusedLayer(
        spec=spec,
        qkv=_stacked(spec.qkv, kernel, shared),
        o=single(spec.o),
        gate_up=_stacked(spec.gate_up, kernel, shared),
        down=single(spec.down),
    )


def _stacked(linears: list[nn.Linear], kernel: str | RowPlan, shared: Mapping) -> PlannedLinear:
    """``linears`` stacked on ``kernel``, reusing ``shared``'s packed copies (no second copy)."""
    own = [shared.get(m) for m in linears]
    if any(p is None for p in own) or any(p.plan != own[0].plan for p in own):
        return PlannedLinear(linears, kernel)
    plan = own[0].plan  # the modules' (the copy budget keeps a stack's copies together)
    by_name = [dict(zip(p.kernel_names, p.bound, strict=True)) for p in own]
    given = {n: SplitLinear([b[n] for b in by_name]) for n in by_name[0] if n != "gemv"}
    gemvs = [b.get("gemv") for b in by_name]
    span = None if None in gemvs else linear_kernel.joined_packed(gemvs)
    if span is not None:
        given["gemv"] = functools.partial(GemvLinear, packed=span)
    stacked = PlannedLinear(linears, plan, given)  # without ``span``: a gemv copy of its own
    for gemv in gemvs if span is not None else ():
        gemv.shares_packed = True
    return stacked


def attend(attn: nn.Module, query, key, value, batch: PackedBatch, split, softcap=None):
    """Keys and values into the KV cache, then each query over its own sequence's keys.
    Shapes: query: [1, H, T, D];  key, value: [1, H_kv, T, D]  ->  returns [1, T, H, D]"""
    if split is not None:
        batch.kv_cache.write(attn.layer_idx, key, value, batch)
        return decode_attention.decode_attention(
            query, batch.kv_cache, attn.layer_idx, batch, split, attn.scaling
        )
    return packed_attention.attend(attn.layer_idx, query, key, value, batch, attn.scaling, softcap)


def _rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + flip(x) * signed_sin`` (exact; docs/engines.md#kernels); the last D - R pass.
    Shapes: x: [T, heads, D];  cos, signed_sin: [T, 1, R]  ->  [T, heads, D]"""
    num_tokens, heads, head_dim = x.shape
    if cos.shape[-1] < head_dim:
        rotated = cos.shape[-1]
        return torch.cat((_rotary(x[..., :rotated], cos, signed_sin), x[..., rotated:]), -1)
    swapped = (
        x.reshape(num_tokens, heads, 2, head_dim // 2).flip(2).view(num_tokens, heads, head_dim)
    )
    out = x * cos + swapped * signed_sin  # in the tables' dtype where theirs is wider
    return out if out.dtype == x.dtype else out.to(x.dtype)


def additive_decode_mask(batch: PackedBatch, dtype: torch.dtype) -> PackedBatch:
    """The boolean decode mask as SDPA's additive form (0 / -inf), once per step."""
    mask = batch.decode_mask
    if mask is None or mask.dtype != torch.bool:
        return batch
    additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return dataclasses.replace(batch, decode_mask=additive.masked_fill_(~mask, float("-inf")))
