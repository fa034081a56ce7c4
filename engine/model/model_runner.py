"""The model runner: the only module that calls the model or touches the device (``forward_packed``,
``generate``, ``new_kv_cache``); its kernels are ``RunnerKernels``'."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from engine import token_logits
from engine.kernels import layer_spec, packed_attention
from engine.model.kernel_choice import RunnerKernels
from engine.serving.kv_cache import (
    ConcatKVCache,
    KVCache,
    PagedKVCache,
    SlotKVCache,
    kv_bytes_per_token,
)
from engine.serving.packed_batch import PackedBatch
from engine.serving.sampler import forked_rng, generate_options


class ModelRunner(RunnerKernels):
    """Wraps a ``LoadedModel``. Raises ValueError: a bad kernel setting."""

    def __init__(self, loaded):
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.device = loaded.device
        self.dtype = loaded.dtype
        self.eos_token_ids = frozenset(loaded.eos_token_ids)
        self.pad_token_id = _pad_token_id(self.tokenizer, loaded.eos_token_ids)
        self.init_kernels()
        packed_attention.register()

    def recording(self, recorder: token_logits.LogitRecorder):
        return token_logits.recording(self.model, recorder)

    @property
    def hidden_size(self) -> int:
        """d: the width of the final hidden state the output embedding multiplies."""
        return int(self.model.get_output_embeddings().weight.shape[-1])

    # --- continuous engine -------------------------------------------------------------------
    def kv_shape(self) -> tuple[int, int, int]:
        cfg = self.model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return cfg.num_hidden_layers, cfg.num_key_value_heads, head_dim

    def sliding_windows(self) -> list[int]:
        """Distinct layer sliding windows in keys, smallest first ([]: all global)."""
        return sorted({w for w in self.layer_windows() if w is not None})

    def layer_windows(self) -> tuple[int | None, ...]:
        """Each decoder layer's sliding window in keys (None: global), in layer order."""
        layers = getattr(getattr(self.model, "model", None), "layers", None) or []
        attns = [getattr(la, "self_attn", None) for la in layers]
        config = self.model.config
        return tuple(layer_spec.layer_window(a, config) for a in attns if a is not None)

    def kv_window(self) -> int | None:
        """The window every layer shares, in keys (the paged cache frees blocks out of it); None
        when a layer is global or windows differ."""
        layers = getattr(getattr(self.model, "model", None), "layers", None) or []
        attns = [getattr(la, "self_attn", None) for la in layers]
        if not attns or None in attns:
            return None
        windows = {layer_spec.layer_window(a, self.model.config) for a in attns}
        return windows.pop() if len(windows) == 1 and None not in windows else None

    def kv_layer_groups(self) -> list[tuple[int | None, list[int]]]:
        """The paged KV cache's groups: (window in keys, None: global; layer indices), global
        first. One group when every layer shares a window (or has none); otherwise each type's
        layers cut into groups of the smallest type's count, so every group's block holds as
        many layers (vLLM's ``_get_kv_cache_groups_uniform_page_size``)."""
        layers = getattr(getattr(self.model, "model", None), "layers", None) or []
        attns = [getattr(la, "self_attn", None) for la in layers]
        num_layers = self.kv_shape()[0]
        if not attns or None in attns:
            return [(None, list(range(num_layers)))]
        by_type: dict[int | None, list[int]] = {}
        for i, attn in enumerate(attns):
            by_type.setdefault(layer_spec.layer_window(attn, self.model.config), []).append(i)
        if len(by_type) == 1:
            return [(next(iter(by_type)), list(range(num_layers)))]
        size = min(len(ids) for ids in by_type.values())
        types = sorted(by_type, key=lambda w: -1 if w is None else w)  # global first
        return [
            (w, by_type[w][i : i + size]) for w in types for i in range(0, len(by_type[w]), size)
        ]

    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(*self.kv_shape(), self.dtype)

    def new_kv_cache(
        self,
        kv_mode: str,
        num_slots: int,
        max_seq_len: int,
        num_blocks: int | None = None,
        block_size: int = 16,
        block_tables: Mapping[int, list[int]] | list | None = None,
        layer_groups: list[list[int]] | None = None,
    ) -> KVCache:
        """KV storage for ``num_slots`` sequences of up to ``max_seq_len`` tokens; ``paged``:
        ``num_blocks`` blocks of ``block_size`` tokens, read through the block manager's
        ``block_tables`` (with several ``layer_groups``, a list of tables, one per group)."""
        layers, kv_heads, head_dim = self.kv_shape()
        if kv_mode == "concat":
            return ConcatKVCache(layers, kv_heads, head_dim, self.dtype)
        if kv_mode == "paged":
            assert num_blocks is not None and block_tables is not None, "paged KV needs blocks"
            return PagedKVCache(
                layers,
                kv_heads,
                head_dim,
                num_blocks,
                block_size,
                block_tables,
                self.dtype,
                self.device,
                layer_groups,
            )
        return SlotKVCache(
            layers, num_slots, kv_heads, head_dim, max_seq_len, self.dtype, self.device
        )

    def forward_packed(self, batch: PackedBatch, samplers=None) -> list[int]:
        """One forward pass over the packed row; the next token of each sequence (argmax, or drawn
        by its ``samplers`` entry; pass one only where the token is kept, not for a partial prefill
        chunk). Shapes: batch.input_ids: [1, T]  ->  logits [1, S, V]  ->  returns S token ids"""
        # the fused layers call no linear of the model's but its output embedding
        fused = self.use_fused_layers and self.fused_decoder is not None
        with (
            torch.inference_mode(),
            self.engine_kernels(batch.invariant, head_only=fused),
            self._attention(packed_attention.PACKED_ATTENTION),
        ):
            logits = self._logits(batch)  # (1, S, V)
            # max's indices are argmax's (the first maximal value, NaN first), and on the CPU in
            # bfloat16 max runs vectorized where argmax does not (several times faster at V 49152)
            tokens = logits[0].max(dim=-1).indices.tolist()
            for i, sampler in enumerate(samplers or ()):
                if sampler is not None:
                    tokens[i] = sampler.sample(logits[0, i], len(batch.seqs[i].output_token_ids))
        return tokens

    def _logits(self, batch: PackedBatch) -> torch.Tensor:
        """Through the fused layers where they apply (not batch-invariant), else the model's own.
        Shapes: batch.input_ids: [1, T]  ->  returns [1, S, V]"""
        invariant = getattr(batch, "invariant", False)
        fused = self.fused_decoder if self.use_fused_layers else None
        if fused is not None and not invariant:
            self.decoder_layer_steps["fused"] += 1
            hidden = fused.hidden_states(batch)  # (1, S, d)
            return fused.logits(self.model.get_output_embeddings(), hidden)  # (1, S, V)
        self.decoder_layer_steps["transformers"] += 1
        return self.model(
            input_ids=batch.input_ids,
            position_ids=batch.position_ids,
            use_cache=False,
            logits_to_keep=batch.logits_indices,
            packed_batch=batch,
        ).logits  # (1, S, V)

    # --- static engine and reference ---------------------------------------------------------
    def generate(
        self,
        input_ids,
        attention_mask,
        max_new_tokens: int,
        stopping_criteria=None,
        logits_processor=None,
        sampling=None,
    ):
        """``model.generate`` on a left-padded batch: greedy, or sampled per ``sampling`` (batch 1)
        right after ``torch.manual_seed(seed)``, the global random state restored after. Shapes:
        input_ids, attention_mask: [B, W]  ->  returns [B, W + N], N <= max_new_tokens"""
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        sampled = sampling is not None and not sampling.is_greedy
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            eos_token_id=sorted(self.eos_token_ids),
            pad_token_id=self.pad_token_id,
            **(generate_options(sampling, self.model) if sampled else {"do_sample": False}),
        )
        with torch.inference_mode(), forked_rng(self.device, sampled):
            if sampled:
                torch.manual_seed(sampling.seed)
            return self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device),
                generation_config=config,
                stopping_criteria=StoppingCriteriaList(stopping_criteria or []),
                logits_processor=LogitsProcessorList(logits_processor or []),
            )

    def left_pad(self, token_lists: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """``input_ids`` and ``attention_mask``, both [B, W]."""
        width = max(len(t) for t in token_lists)
        ids = torch.full((len(token_lists), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(token_lists), width), dtype=torch.long)
        for row, tokens in enumerate(token_lists):
            ids[row, width - len(tokens) :] = torch.tensor(tokens, dtype=torch.long)
            mask[row, width - len(tokens) :] = 1
        return ids, mask

    # --- shared ------------------------------------------------------------------------------
    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        elif self.device.type == "mps":
            torch.mps.synchronize()


def _pad_token_id(tokenizer, eos_token_ids) -> int:
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    return int(sorted(eos_token_ids)[0])
