"""The compiled step: the continuous engine's whole forward pass as one inductor graph.

A decode step of a small model on a CPU spends as much time between ops as in its matmuls. vLLM's
CPU build compiles the model once with the token count dynamic, lets inductor fuse the norms, the
SiLU-and-mul and the rotary embedding, and keeps attention as one opaque op
(``vllm/platforms/cpu.py: CpuPlatform.check_and_update_config``, ``vllm/compilation/backends.py``).
``CompiledStep`` does the same over the packed ``[1, T]`` row:

* ``StepModule`` is the decoder stack as plain tensor code, compiled by ``torch.compile``
  (inductor) into one graph over all the layers;
* each matmul is one op, ``cbp::layer_matmul`` (a residual added in the matmul's epilogue), on
  the fused layers' bound weights (``kernel_plan.PlannedLinear``), so compiling keeps the
  per-host kernel plan and adds no weight copy;
* attention is one op, ``cbp::packed_attention``: it reads the step's ``PackedBatch`` from a
  forward context set around the call (vLLM's ``vllm/forward_context.py: set_forward_context``
  and ``unified_attention``) and runs the eager fused layers' own ``fused_layers.attend``.

The token count ``T`` and the sequence count ``S`` are unbacked symbols
(``torch._dynamo.decorators.mark_unbacked``), so one graph serves a step of one token and of
hundreds; ``CompileStats`` counts the graphs built. Inductor's caches live under the cache folder
(``TORCHINDUCTOR_CACHE_DIR``), so a later start loads the first compile. Where the host cannot
compile (``compile_unavailable_reason``) or compiling fails, the runner keeps the eager fused
layers and says why. Batch-invariant steps never run here.

Shapes (the named dimensions of ``engine``): input_ids, positions [T]; logits_indices [S];
returns final-normed hidden states [S, d].
"""

from __future__ import annotations

import contextvars
import os
import shutil
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine import settings
from engine.kernels import decode_attention, fused_layers
from engine.serving.packed_batch import PackedBatch

# CBP_COMPILED_STEP; off by default: it is no faster than the eager fused layers on the CPUs
# measured (its matmuls are the same calls) and costs a compile at start (docs/measurements.md).
CHOICES = {
    "off": "the eager fused layers",
    "auto": "the compiled step where a C++ compiler and a CPU allow it",
}


@dataclass
class _Forward:
    """What the step's opaque ops need (set by ``CompiledStep.hidden_states``)."""

    batch: PackedBatch
    split: decode_attention.DecodeSplit | None
    decoder: fused_layers.FusedDecoder  # each layer's attention module and bound matmuls


_FORWARD: contextvars.ContextVar[_Forward] = contextvars.ContextVar("cbp_forward")
_LINEARS = ("qkv", "o", "gate_up", "down")  # which FusedLayer matmul an op's ``which`` names


def packed_attention_op(query, key, value, layer: int) -> torch.Tensor:
    """``cbp::packed_attention``: one layer's attention of the step in flight: keys and values
    into the KV cache, then each query over its own sequence's keys.

    Shapes:
        query: [T, H, D];  key, value: [T, H_kv, D]  ->  returns [T, H * D]
    """
    step = _FORWARD.get()
    attn = step.decoder.layers[layer].attn
    q = query.transpose(0, 1)[None]  # (1, H, T, D)
    k = key.transpose(0, 1)[None]  # (1, H_kv, T, D)
    v = value.transpose(0, 1)[None]  # (1, H_kv, T, D)
    out = fused_layers.attend(attn, q, k, v, step.batch, step.split)  # (1, T, H, D)
    return out.reshape(query.shape[0], -1).contiguous()


def layer_matmul_op(x, residual, layer: int, which: int, out_features: int) -> torch.Tensor:
    """``cbp::layer_matmul``: ``x @ W.T``, plus ``residual`` where given (in the matmul's
    epilogue where the kernel has one), through the engines' kernel plan for its row count
    (``engine.kernels.kernel_plan.PlannedLinear``).

    Shapes:
        x: [T, K];  residual: [T, out_features] or None  ->  returns [T, out_features]
    """
    linear = getattr(_FORWARD.get().decoder.layers[layer], _LINEARS[which])
    return linear(x) if residual is None else linear.add(x, residual)


def _define_ops() -> torch.library.Library:
    """Define the ``cbp`` ops with their kernels and fake (shape-only) kernels; the library
    handle must live as long as the ops. ``torch.library.Library`` rather than
    ``torch.library.custom_op``: the same schema and fake kernels, about 4 us less per call
    (some 150 calls a step)."""
    library = torch.library.Library("cbp", "DEF")
    ops = {
        "packed_attention(Tensor query, Tensor key, Tensor value, int layer) -> Tensor": (
            packed_attention_op,
            lambda query, key, value, layer: query.new_empty(
                query.shape[0], query.shape[1] * query.shape[2]
            ),
        ),
        "layer_matmul(Tensor x, Tensor? residual, int layer, int which, int out_features)"
        " -> Tensor": (
            layer_matmul_op,
            lambda x, residual, layer, which, out_features: x.new_empty(x.shape[0], out_features),
        ),
    }
    for schema, (kernel, fake) in ops.items():
        name = schema.split("(")[0]
        library.define(schema)
        library.impl(name, kernel, "CompositeExplicitAutograd")
        torch.library.register_fake(f"cbp::{name}", fake, lib=library)
    return library


_LIBRARY = _define_ops()


class StepModule(nn.Module):
    """The decoder stack of a Llama-style model as plain tensor code, for ``torch.compile``.

    Its matmuls and attention are opaque ops (``cbp::layer_matmul``, ``cbp::packed_attention``)
    over the fused decoder's bound weights; what inductor compiles and fuses is everything
    between them: the embedding, RMSNorm, rotary, SiLU-and-mul, the splits and views, and the
    final norm. Its tensors (embedding, norms, rotary frequencies) are the fused decoder's, held
    as buffers.

    Shapes:
        input_ids, positions: [T];  logits_indices: [S]  ->  hidden [S, d]
    """

    def __init__(self, decoder: fused_layers.FusedDecoder):
        super().__init__()
        self.num_heads = decoder.num_heads
        self.num_kv_heads = decoder.num_kv_heads
        self.head_dim = decoder.head_dim
        self.hidden = decoder.embed.weight.shape[1]
        self.intermediate = decoder.intermediate
        self.eps = decoder.eps
        self.rope_scaling = float(getattr(decoder.rotary, "attention_scaling", 1.0))
        self.num_layers = len(decoder.layers)
        self.register_buffer("embed", decoder.embed.weight.detach(), persistent=False)
        self.register_buffer("inv_freq", decoder.rotary.inv_freq.detach(), persistent=False)
        self.register_buffer("final_norm", decoder.final_norm.detach(), persistent=False)
        for i, layer in enumerate(decoder.layers):
            self.register_buffer(f"in_norm{i}", layer.input_norm, persistent=False)
            self.register_buffer(f"post_norm{i}", layer.post_norm, persistent=False)

    def forward(self, input_ids, positions, logits_indices) -> torch.Tensor:
        x = F.embedding(input_ids, self.embed)  # (T, d)
        cos, sin = self._rope(positions, x.dtype)  # (T, 1, D) each
        for i in range(self.num_layers):
            x = self._layer(i, x, cos, sin)
        return self._norm(x[logits_indices], self.final_norm)  # (S, d)

    def _layer(self, i: int, x, cos, sin) -> torch.Tensor:
        """One decoder layer. Shapes: x [T, d] -> [T, d]."""
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        num_tokens, width = x.shape[0], (heads + 2 * kv_heads) * head_dim
        h = self._norm(x, getattr(self, f"in_norm{i}"))
        qkv = torch.ops.cbp.layer_matmul(h, None, i, 0, width)  # (T, (H + 2 H_kv) D)
        q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1)
        q = _rotary(q.reshape(num_tokens, heads, head_dim), cos, sin)  # (T, H, D)
        k = _rotary(k.reshape(num_tokens, kv_heads, head_dim), cos, sin)  # (T, H_kv, D)
        v = v.reshape(num_tokens, kv_heads, head_dim)
        attn = torch.ops.cbp.packed_attention(q, k, v, i)  # (T, H D)
        x = torch.ops.cbp.layer_matmul(attn, x, i, 1, self.hidden)  # (T, d)
        h = self._norm(x, getattr(self, f"post_norm{i}"))
        gate_up = torch.ops.cbp.layer_matmul(h, None, i, 2, 2 * self.intermediate)  # (T, 2 I)
        gate, up = gate_up.split([self.intermediate, self.intermediate], -1)
        return torch.ops.cbp.layer_matmul(F.silu(gate) * up, x, i, 3, self.hidden)  # (T, d)

    def _rope(self, positions, dtype):
        """transformers' default rotary tables at ``positions``. Shapes: [T] -> 2 x [T, 1, D]."""
        freqs = positions[:, None].float() * self.inv_freq[None, :]  # (T, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (T, D)
        cos = (emb.cos() * self.rope_scaling).to(dtype)
        sin = (emb.sin() * self.rope_scaling).to(dtype)
        return cos[:, None], sin[:, None]

    def _norm(self, x, weight):
        """transformers' LlamaRMSNorm: normalize in float32, cast back, scale by the weight."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)


def _rotary(x, cos, sin):
    """``x * cos + rotate_half(x) * sin``. Shapes: x [T, heads, D]; cos, sin [T, 1, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def compile_unavailable_reason(device: torch.device) -> str | None:
    """Why this host cannot run the compiled step, or None when it can."""
    if device.type != "cpu":
        return f"the compiled step is built for CPUs; this model runs on {device.type}"
    compiler = settings.borrowed("CXX") or "c++"
    if shutil.which(compiler) is None and shutil.which("g++") is None:
        return "no C++ compiler on this host (inductor needs one)"
    return None


@dataclass
class CompileStats:
    """How the compiled step was built: graphs compiled, and seconds spent compiling."""

    num_graphs: int = 0
    compile_s: float = 0.0  # inductor's own time, every graph
    first_call_s: float = 0.0  # the first step: tracing, compiling (or loading) and running

    @property
    def recompiles(self) -> int:
        """Graphs compiled after the first: 0 when one graph serves every step."""
        return max(self.num_graphs - 1, 0)


class CompiledStep:
    """The compiled forward pass of one model (see the module docstring); built on first call.

    Raises (from ``hidden_states``):
        Exception: whatever dynamo or inductor raises while compiling; the runner catches it and
            keeps the eager step, saying why (``ModelRunner.drop_compiled_step``).
    """

    def __init__(self, decoder: fused_layers.FusedDecoder, cache_folder: str):
        self.module = StepModule(decoder).eval()
        self.decoder = decoder
        self.stats = CompileStats()
        self.cache_folder = cache_folder
        self._compiled = None

    def hidden_states(self, batch: PackedBatch) -> torch.Tensor:
        """Final-normed hidden states of each sequence's last token, for the output embedding
        (called eagerly, so that ``engine.token_logits``'s recorder sees every call).

        Shapes:
            batch.input_ids: [1, T]  ->  returns [1, S, d]
        """
        first = self._compiled is None
        split = decode_attention.plan_decode(batch, self.module.embed.dtype, whole=False)
        if split is None:
            batch = fused_layers.additive_decode_mask(batch, self.module.embed.dtype)
        ids, positions = batch.input_ids[0], batch.position_ids[0]  # (T,), (T,)
        if first:  # no guard on T or S: one graph for every step
            for tensor in (ids, positions, batch.logits_indices):
                torch._dynamo.decorators.mark_unbacked(tensor, 0)
            self._compiled = self._compile()
        start_s = time.perf_counter()
        token = _FORWARD.set(_Forward(batch, split, self.decoder))
        try:
            hidden = self._compiled(ids, positions, batch.logits_indices)  # (S, d)
        finally:
            _FORWARD.reset(token)
        if first:
            self.stats.first_call_s = time.perf_counter() - start_s
        return hidden[None]  # (1, S, d)

    def _compile(self):
        from torch._inductor.utils import clear_caches

        folder = os.path.join(self.cache_folder, "inductor")  # inductor's, for this process
        if settings.borrowed("TORCHINDUCTOR_CACHE_DIR") != folder:
            settings.set_borrowed("TORCHINDUCTOR_CACHE_DIR", folder)
            clear_caches()
        stats = self.stats

        def backend(graph, example_inputs):
            from torch._inductor.compile_fx import compile_fx

            start_s = time.perf_counter()
            compiled = compile_fx(graph, example_inputs)
            stats.num_graphs += 1
            stats.compile_s += time.perf_counter() - start_s
            return compiled

        return torch.compile(self.module, backend=backend, dynamic=False, fullgraph=True)
