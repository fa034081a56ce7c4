"""Fused decoder layers: the continuous engine's forward pass without transformers' module tree.

A decode step of a small model multiplies each layer's weights by a few rows, so its floor is the
time to read the weights once; through transformers' modules each layer also runs about 60 small
torch ops and a dozen Python module calls, which on a small CPU cost as much again.
``FusedDecoder`` runs the same computation on the same weights with fewer ops per layer:

* **one matmul for q, k and v, one for gate and up**: the weights stacked once (``[Wq; Wk; Wv]``,
  ``[Wg; Wu]``) and bound to the engines' kernel plan (``engine.kernels.kernel_plan``); outputs
  split by views. No packed copy is kept twice: the stacked gemv kernel runs on the modules'
  gemv copies, which lie end to end in step order, and oneDNN's rows run the modules' own
  copies one by one (``_stacked``);
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

What a layer computes is read from the model's config and modules (``engine.kernels.layer_spec``):
biases, QK-norm, norms before, around or after each block, the MLP's activation, partial or no
RoPE, residual and embedding multipliers, soft-capping and each layer's sliding window. The C++
paths serve the layers they compute: ``decode_step`` any layer, its window, partial RoPE and
score soft-capping in the kernel; ``LayerStack`` every layer of a model whose activations it
computes and whose projections are the gemv kernel's (``LayerStack.refusal`` says why not).
In float32 each gives the same bits as transformers' modules
(``tests/engine/kernels/test_fused_layers.py``), and every family's outputs equal ``generate``
(``tests/engine/batching/test_families.py``). Only the engines use it
(``ModelRunner.forward_packed``), on CPU; for a model ``layer_spec`` cannot read
(``unsupported_reason``), or with ``CBP_FUSED_LAYERS=off``, the runner calls the model itself.
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
        """The layer's attention module: its layer_idx and scaling."""
        return self.spec.attn

    @property
    def linears(self) -> tuple[PlannedLinear, ...]:
        """Its four matmuls in the order a step runs them: qkv, o, gate_up, down."""
        return self.qkv, self.o, self.gate_up, self.down


def unsupported_reason(model: nn.Module) -> str | None:
    """Why ``FusedDecoder`` cannot run ``model``, or None when it can."""
    try:
        layer_spec.read_decoder(model)
    except layer_spec.Unsupported as why:
        return str(why)
    return None


class FusedDecoder:
    """The decoder stack of a model over a packed batch; see the module docstring.

    ``shared``: the engines' own ``PlannedLinear`` per module on the same ``kernel``
    (``kernel_plan.ModuleKernels.planned``); a layer's o and down run them rather than packing
    their weights a second time (float32 SmolLM2-135M: 145 MB per packed kernel), and the
    stacked qkv and gate_up gemv kernels run on their copies of q, k, v, gate and up
    (``_stacked``).

    Raises:
        ValueError: the model is not supported (``layer_spec.Unsupported``).
        RuntimeError: oneDNN cannot pack a stacked weight (``kernel`` ``"onednn"`` or
            ``"onednn_f32"``).
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
        """The rotated dims of each rotary type its layers use (``head_dim``: full RoPE)."""
        x = self.spec.embed.weight[:1].detach()  # (1, d)
        ropes = self._ropes(x, torch.zeros(1, 1, dtype=torch.long, device=x.device))
        return {kind: cos.shape[-1] for kind, (cos, _) in ropes.items()}

    @property
    def layers_step(self) -> str:
        """Where a decode step's layers run, for the bench JSON: ``"C++"`` (one call,
        ``LayerStack``) or ``"Python: <why>"`` (the fused loop)."""
        return "C++" if self.stack is not None else f"Python: {self.stack_refusal}"

    @property
    def planned(self) -> list[PlannedLinear]:
        """Each layer's matmuls (qkv, o, gate_up, down), shared ones included."""
        return [f for la in self.layers for f in la.linears]

    @property
    def extra_bytes(self) -> int:
        """Memory of the weight copies these layers alone hold (not the shared ones'), in
        bytes."""
        return sum(f.extra_bytes for f in self.own_planned)

    @property
    def own_planned(self) -> list[PlannedLinear]:
        """``planned`` less the shared ones (``shared_ids``: those counted elsewhere)."""
        return [f for f in self.planned if id(f) not in self.shared_ids]

    def hidden_states(self, batch: PackedBatch) -> torch.Tensor:
        """Final-normed hidden states of each sequence's last token, for the output embedding.

        Shapes:
            batch.input_ids: [1, T]  ->  returns [1, S, d]
        """
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
        """The output embedding's logits, then the model's own logit arithmetic (Granite's
        divisor, Gemma's final soft-capping). Shapes: hidden [1, S, d] -> [1, S, V]."""
        logits = head(hidden)
        if self.spec.logits_divisor != 1.0:
            logits = logits / self.spec.logits_divisor
        if self.spec.logit_softcap is not None:
            cap = self.spec.logit_softcap
            logits = torch.tanh(logits / cap) * cap
        return logits

    def _ropes(self, x: torch.Tensor, position_ids: torch.Tensor) -> dict:
        """Per rotary layer type (None: the model's one), (cos, signed_sin) [T, 1, R], R the
        rotated dims (``_rotary``'s folded sine), in the dtype the model's rotary module gives
        (x's, or float32: OLMo 2's); ``NOPE`` for layers without RoPE: 1 and 0 [T, 1, D], which
        ``decode_step``'s rotary leaves x's values through unchanged."""
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
        """``x + post(linear(y)) * multiplier``; plain ``x + linear(y)`` inside the matmul."""
        if post is None and multiplier == 1.0:
            return linear.add(y, x)
        y = linear(y)
        if post is not None:
            y = self._norm(y, post)
        return x + (y if multiplier == 1.0 else y * multiplier)

    def _attention(self, layer: FusedLayer, qkv, rope, batch: PackedBatch, split):
        """The layer's attention on its ``qkv`` [T, (H + 2 H_kv) D] -> [T, H D]: the whole of it
        in ``decode_step`` where that computes this layer, else rotary here and ``attend``."""
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
        """q and k of ``qkv`` through the layer's QK-norms: per head, or over all heads."""
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
        if spec.qk_norm_per_head:
            q = self._norm(q.reshape(-1, heads, head_dim), spec.q_norm).flatten(1)
            k = self._norm(k.reshape(-1, kv_heads, head_dim), spec.k_norm).flatten(1)
        else:
            q, k = self._norm(q, spec.q_norm), self._norm(k, spec.k_norm)
        return torch.cat((q, k, v), -1)

    def _norm(self, x: torch.Tensor, norm: Norm) -> torch.Tensor:
        """An RMSNorm as the model computes it (``layer_spec.Norm``): in float32, or cast back
        before scaling (Llama's), or scaled in float32 and cast after (Gemma's, OLMo 2's)."""
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
    """The decoder layers' weights and parts as ``torch.ops.cbp_step.decoder_layers`` takes them,
    for a decode step in one call. ``refusal`` says why a model's layers cannot run there, ``of``
    builds it where they can; ``takes(x)`` says whether the plan gives gemv ``x``'s row count.

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
        """Why the op cannot run ``layers``' decode steps (not built, heads its attention does
        not take, a part it does not compute, a projection not the gemv kernel's), or None where
        it can; ``rope_widths``: the rotated dims per rotary type (``FusedDecoder.rope_widths``),
        an even number (``decode_step``'s rotary); ``attention``:
        ``FusedDecoder.attention_refusal``."""
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
        """The stack for ``layers``, or None where there is a ``refusal``; ``layer_ops``:
        ``FusedDecoder.layer_ops``, whose choices of bfloat16 ops the step repeats."""
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
        """Whether every projection runs the gemv kernel on ``x`` [T, d] (its row count, in
        float32 or bfloat16: the op's norms are those of ``FusedDecoder._norm`` in these two)."""
        if x.dtype not in (torch.float32, torch.bfloat16):
            return False
        rows = x.shape[0]
        if rows not in self.taken:
            kernels = [f.kernel_at(rows) for f in self.linears]
            self.taken[rows] = all(isinstance(k, GemvLinear) and k.takes(x) for k in kernels)
        return self.taken[rows]

    def __call__(self, x, ropes: dict, batch: PackedBatch, num_heads: int) -> torch.Tensor:
        """Every layer on a decode step whose split is ``whole_step``; ``ropes``:
        ``FusedDecoder._ropes``' tables.

        Shapes:
            x: [T, d];  ropes: key -> (cos, signed_sin) [T, 1, R], R <= D  ->  returns [T, d]
        """
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
    """The layer's key into ``FusedDecoder._ropes``: its rotary type, or ``NOPE``."""
    return spec.rope_type if spec.rope else NOPE


def _norms(spec: LayerSpec) -> tuple[Norm | None, ...]:
    """The layer's six norms in the op's order: pre_attn, post_attn, pre_mlp, post_mlp, q, k."""
    return spec.pre_attn, spec.post_attn, spec.pre_mlp, spec.post_mlp, spec.q_norm, spec.k_norm


def _layer_args(spec: LayerSpec, layer_ops: bool) -> tuple[list[int], list[float]]:
    """The op's ``flags`` (norm bits: 1 << n for an upcast norm n, 64 for cbp_layer's norm;
    QK-norm per head; activation 0 SiLU, 1 GELU-tanh, 2 cbp_layer's SiLU-and-mul; window, 0
    for none) and ``numbers`` (the six norms' eps, the attention scale, the residual
    multiplier, the score soft cap, 0 for none) of one layer, as ``FusedDecoder._layer`` chooses
    them."""
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
    """Whether ``torch.ops.cbp_layer`` (built with the gemv kernel) serves a model whose weights
    are like ``weight``: bfloat16 on a CPU. float32 keeps torch's ops, whose bits are
    transformers' own; elsewhere (no compiler, ``CBP_GEMV=off``) torch's ops serve bfloat16 too.
    """
    if weight.dtype != torch.bfloat16 or weight.device.type != "cpu":
        return False
    return gemv_build.available()


def _fused_layer(spec: LayerSpec, kernel: str | RowPlan, shared: Mapping) -> FusedLayer:
    """The layer's matmuls on ``kernel``; o and down are ``shared``'s where it has them."""

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
    """``linears`` stacked on ``kernel``, each packed copy kept once where ``shared`` has their
    own kernels (float32 SmolLM2-135M: 279 MB per packed kernel): every kernel but gemv runs as
    the modules' own, one by one (``SplitLinear``: no stacked copy), on the modules' plan; and
    the stack's gemv kernel runs on the modules' gemv copies, which lie end to end
    (``linear_kernel.joined_packed``), the stack counting their bytes."""
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
    """One layer's attention on the packed row: its keys and values into the KV cache, then each
    query over its own sequence's keys (``decode_attention`` on a decode-only step's ``split``,
    else ``packed_attention.attend`` under ``batch``'s masks, a windowed batch's too).

    Shapes:
        query: [1, H, T, D];  key, value: [1, H_kv, T, D]  ->  returns [1, T, H, D]
    """
    if split is not None:
        batch.kv_cache.write(attn.layer_idx, key, value, batch)
        return decode_attention.decode_attention(
            query, batch.kv_cache, attn.layer_idx, batch, split, attn.scaling
        )
    return packed_attention.attend(attn.layer_idx, query, key, value, batch, attn.scaling, softcap)


def _rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin``, with ``rotate_half(x) * sin == flip(x) * signed_sin``.

    ``rotate_half(x) = cat(-x2, x1)`` and ``flip`` of the two halves is ``cat(x2, x1)``; negating
    ``sin``'s first half instead of ``x2`` is exact, so the bits are transformers' own.

    With R < D rotated dims (partial RoPE), the last D - R pass through. Tables in float32 for
    bfloat16 ``x`` (OLMo 2's rotary module does not cast them) rotate in float32 and cast back, as
    that family's ``apply_rotary_pos_emb`` does.

    Shapes:
        x: [T, heads, D];  cos, signed_sin: [T, 1, R]  ->  [T, heads, D]
    """
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
    """The batch with its boolean decode mask as SDPA's additive form (0 / -inf), made once.

    SDPA turns a boolean mask into exactly this on every call; here it happens once per step.
    """
    mask = batch.decode_mask
    if mask is None or mask.dtype != torch.bool:
        return batch
    additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return dataclasses.replace(batch, decode_mask=additive.masked_fill_(~mask, float("-inf")))
