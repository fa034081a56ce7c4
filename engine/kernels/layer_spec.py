"""What a decoder layer computes, read from the model's config and modules, not from its family.

As vLLM's shared layers take what differs as arguments; the parts read: docs/engines.md (Model
families). Anything else raises ``Unsupported`` and the runner keeps transformers' layers.
"""

from __future__ import annotations

import dataclasses
import inspect

import torch
from torch import nn


class Unsupported(ValueError):
    """The fused layers cannot run this model; the message says why, for people."""


@dataclasses.dataclass(frozen=True)
class Norm:
    """``normed(x) * weight``: in float32, cast after (``upcast``) or first (Llama's)."""

    weight: torch.Tensor  # (n,): ``1 + w`` already added for a Gemma-style norm
    eps: float
    upcast: bool


@dataclasses.dataclass
class LayerSpec:
    attn: nn.Module  # its attention module: layer_idx, scaling
    qkv: list[nn.Linear]  # [q, k, v] or [qkv]
    o: nn.Linear
    gate_up: list[nn.Linear]  # [gate, up] or [gate_up]
    down: nn.Linear
    act: object  # the MLP's activation (a module or function)
    silu: bool  # it computes SiLU, bit for bit (the C++ silu_mul and decode step serve it)
    gelu_tanh: bool  # it computes GELU's tanh form, bit for bit (Gemma's; the C++ step serves it)
    pre_attn: Norm | None
    post_attn: Norm | None
    pre_mlp: Norm | None
    post_mlp: Norm | None
    q_norm: Norm | None
    k_norm: Norm | None
    qk_norm_per_head: bool
    rope: bool  # False: a NoPE layer
    rope_type: str | None  # the rotary module's layer_type argument (Gemma 3), else None
    window: int | None
    softcap: float | None
    residual_multiplier: float


@dataclasses.dataclass
class DecoderSpec:
    embed: nn.Module
    embed_multiplier: float
    rotary: nn.Module
    layers: list[LayerSpec]
    final_norm: Norm
    num_heads: int
    num_kv_heads: int
    head_dim: int
    logits_divisor: float  # Granite's logits_scaling
    logit_softcap: float | None  # Gemma's final_logit_softcapping


def read_decoder(model: nn.Module) -> DecoderSpec:
    """The spec of ``model``'s decoder.

    Raises:
        Unsupported: a part the fused layers do not compute; the message says which.
    """
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    for part in ("embed_tokens", "rotary_emb", "norm"):
        if layers is None or not isinstance(getattr(inner, part, None), nn.Module):
            raise Unsupported(f"no model.model.{part if layers is not None else 'layers'}")
    config = model.config
    _check_rope(config)
    heads = config.num_attention_heads
    typed_rope = "layer_type" in inspect.signature(inner.rotary_emb.forward).parameters
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return DecoderSpec(
        embed=inner.embed_tokens,
        embed_multiplier=float(getattr(config, "embedding_multiplier", 1.0) or 1.0),
        rotary=inner.rotary_emb,
        layers=[_layer(layer, config, head_dim, typed_rope) for layer in layers],
        final_norm=_norm(inner.norm, "the final norm"),
        num_heads=heads,
        num_kv_heads=config.num_key_value_heads,
        head_dim=head_dim,
        logits_divisor=float(getattr(config, "logits_scaling", 1.0) or 1.0),
        logit_softcap=getattr(config, "final_logit_softcapping", None),
    )


def _check_rope(config) -> None:
    params = getattr(config, "rope_parameters", None) or {}
    kinds = [p for p in params.values() if isinstance(p, dict)] or [params]
    for rope in kinds:
        kind = str(rope.get("rope_type", "default"))
        if "dynamic" in kind or "longrope" in kind:
            raise Unsupported(f"RoPE type {kind!r} (its frequencies follow the sequence length)")


def _layer(layer: nn.Module, config, head_dim: int, typed_rope: bool) -> LayerSpec:
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None:
        raise Unsupported("a layer without self_attn and mlp")
    qkv = _linears(attn, ("q_proj", "k_proj", "v_proj"), "qkv_proj")
    gate_up = _linears(mlp, ("gate_proj", "up_proj"), "gate_up_proj")
    o, down = _linear(attn, "o_proj"), _linear(mlp, "down_proj")
    act = getattr(mlp, "act_fn", None) or getattr(mlp, "activation_fn", None)
    if act is None:
        raise Unsupported(f"{type(mlp).__name__} has no act_fn")
    pre_attn, post_attn, pre_mlp, post_mlp = _norm_places(layer)
    q_norm = _norm(attn.q_norm, "q_norm") if hasattr(attn, "q_norm") else None
    k_norm = _norm(attn.k_norm, "k_norm") if hasattr(attn, "k_norm") else None
    return LayerSpec(
        attn=attn,
        qkv=qkv,
        o=o,
        gate_up=gate_up,
        down=down,
        act=act,
        silu=_computes(act, torch.nn.functional.silu),
        gelu_tanh=_computes(act, lambda x: torch.nn.functional.gelu(x, approximate="tanh")),
        pre_attn=pre_attn,
        post_attn=post_attn,
        pre_mlp=pre_mlp,
        post_mlp=post_mlp,
        q_norm=q_norm,
        k_norm=k_norm,
        qk_norm_per_head=q_norm is not None and q_norm.weight.numel() == head_dim,
        rope=bool(getattr(attn, "use_rope", True)),
        rope_type=getattr(attn, "layer_type", None) if typed_rope else None,
        window=layer_window(attn, config),
        softcap=getattr(attn, "attn_logit_softcapping", None),
        residual_multiplier=float(getattr(layer, "residual_multiplier", 1.0)),
    )


_PLACES = {  # the norms a layer holds -> (pre_attn, post_attn, pre_mlp, post_mlp)
    ("input_layernorm", "post_attention_layernorm"): (
        "input_layernorm",
        None,
        "post_attention_layernorm",
        None,
    ),
    (
        "input_layernorm",
        "post_attention_layernorm",
        "post_feedforward_layernorm",
        "pre_feedforward_layernorm",
    ): (
        "input_layernorm",
        "post_attention_layernorm",
        "pre_feedforward_layernorm",
        "post_feedforward_layernorm",
    ),
    ("post_attention_layernorm", "post_feedforward_layernorm"): (
        None,
        "post_attention_layernorm",
        None,
        "post_feedforward_layernorm",
    ),
}


def _norm_places(layer: nn.Module):
    """(pre_attn, post_attn, pre_mlp, post_mlp): before each block (Llama), around each (Gemma)
    or after each (OLMo 2)."""
    held = tuple(sorted(n for n, _ in layer.named_children() if "norm" in n))
    places = _PLACES.get(held)
    if places is None:
        raise Unsupported(f"a layer's norms {list(held)} are in no placement the layers know")
    return [None if n is None else _norm(getattr(layer, n), n) for n in places]


def _norm(module: nn.Module, where: str) -> Norm:
    """Read an RMSNorm by running it: ``w`` or ``1 + w`` scale, before or after casting back."""
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or eps is None:
        raise Unsupported(f"{where} is not an RMSNorm with a weight ({type(module).__name__})")
    w = weight.detach()
    x = torch.randn(3, w.numel(), generator=torch.Generator().manual_seed(0)).to(w)
    with torch.no_grad():
        got = module(x)
    normed = torch.rms_norm(x.float(), (w.numel(),), None, float(eps))
    for offset in (0.0, 1.0):
        scale = w.float() + offset
        if torch.allclose(got.float(), normed * scale, rtol=2e-2, atol=2e-2):
            cast_first = normed.to(w.dtype) * scale.to(w.dtype)
            upcast = w.dtype != torch.float32 and not torch.equal(got, cast_first)
            return Norm(scale if upcast else scale.to(w.dtype), float(eps), upcast)
    raise Unsupported(f"{where} ({type(module).__name__}) computes neither w·x̂ nor (1 + w)·x̂")


def _linears(module: nn.Module, split: tuple[str, ...], fused: str) -> list[nn.Linear]:
    if hasattr(module, fused):
        return [_linear(module, fused)]
    return [_linear(module, name) for name in split]


def _linear(module: nn.Module, name: str) -> nn.Linear:
    found = getattr(module, name, None)
    if type(found) is not nn.Linear:
        raise Unsupported(f"{type(module).__name__}.{name} is not a plain nn.Linear")
    return found


def layer_window(attn: nn.Module, config) -> int | None:
    """The attention's own sliding window, else the config's (Mistral, Phi-3)."""
    if hasattr(attn, "sliding_window"):
        return attn.sliding_window
    return getattr(config, "sliding_window", None)


def _computes(act, reference) -> bool:
    """Whether ``act`` gives ``reference``'s bits on a probe, in float32 and bfloat16."""
    x = torch.linspace(-8.0, 8.0, 257)
    with torch.no_grad():
        return all(torch.equal(act(p), reference(p)) for p in (x, x.to(torch.bfloat16)))
