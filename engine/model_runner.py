"""The model runner: the only module that calls the model or touches the device.

It offers the three ways the engines use a loaded model:

* ``forward_packed``: one forward pass over a packed ``[1, T]`` row (continuous engine);
* ``generate``: plain ``model.generate`` on a left-padded batch (static engine and the reference);
* ``new_kv_cache``: KV storage for the continuous engine, sized from the model's config.

Decoding is greedy everywhere, with every end-of-sequence id of the model's generation config.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from engine import attention, fused_layers, linear_kernel
from engine.kv_cache import ConcatKVCache, PagedKVCache, SlotKVCache, kv_bytes_per_token
from engine.packed_batch import PackedBatch


class ModelRunner:
    """Wraps a ``engine.loader.LoadedModel``; see the module docstring.

    Raises:
        ValueError: ``CBP_ENGINE_KERNEL`` is set to something other than ``auto`` or ``skinny``.
    """

    def __init__(self, loaded):
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.device = loaded.device
        self.dtype = loaded.dtype
        self.eos_token_ids = frozenset(loaded.eos_token_ids)
        self.pad_token_id = _pad_token_id(self.tokenizer, loaded.eos_token_ids)
        # The engines' matmul kernel pays off on CPU only; CUDA and MPS keep their own matmuls.
        cpu = self.device.type == "cpu"
        self._linears = linear_kernel.linear_modules(self.model) if cpu else []
        self._kernel_choice = linear_kernel.requested_kernel()  # ValueError: a bad host setting
        self.use_fused_layers = True  # forward_packed through engine.fused_layers where it applies
        attention.register()

    def engine_kernels(self):
        """Context: the engines' matmul kernel (``engine.linear_kernel``) for the model's linears.

        Both engines run inside it; the reference and the floor run plain ``model.generate``.
        """
        return linear_kernel.installed(self._linears, self._kernel.forward)

    @property
    def engine_kernel_name(self) -> str:
        """The engines' matmul kernel here: ``"onednn"``, ``"skinny"``, or ``"none"`` (GPU)."""
        return self._kernel.name

    @property
    def engine_kernel_bytes(self) -> int:
        """Memory the engines' kernels add (oneDNN's packed weight copies, and the fused
        decoder's stacked copies once the continuous engine has made them), in bytes."""
        fused = self.__dict__.get("fused_decoder")
        return self._kernel.extra_bytes + (fused.extra_bytes if fused is not None else 0)

    @functools.cached_property
    def fused_decoder(self) -> fused_layers.FusedDecoder | None:
        """The continuous engine's fused layers (``engine.fused_layers``), made on first use;
        None where they do not apply (not a CPU, not a Llama-style model, no linear kernel)."""
        if not self._linears or fused_layers.unsupported_reason(self.model) is not None:
            return None
        try:
            return fused_layers.FusedDecoder(self.model, self._kernel.name)
        except RuntimeError:  # oneDNN refused a stacked weight: the model's own layers
            return None

    @functools.cached_property
    def _kernel(self) -> linear_kernel.Kernel:
        # Made on first use: oneDNN's packed copies double the weights' memory.
        return linear_kernel.best_kernel(self._linears, self._kernel_choice)

    # --- continuous engine -------------------------------------------------------------------
    def kv_shape(self) -> tuple[int, int, int]:
        """(L, H_kv, D): layers, key/value heads and head size of the model's KV cache."""
        cfg = self.model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return cfg.num_hidden_layers, cfg.num_key_value_heads, head_dim

    def kv_bytes_per_token(self) -> int:
        """Bytes of one token's keys and values across all layers, in the model's dtype."""
        return kv_bytes_per_token(*self.kv_shape(), self.dtype)

    def new_kv_cache(
        self, kv_mode: str, num_slots: int, max_seq_len: int, num_blocks=None, block_size=16
    ):
        """KV storage for ``num_slots`` sequences of up to ``max_seq_len`` tokens each.

        ``paged`` mode holds ``num_blocks`` blocks of ``block_size`` tokens instead.
        """
        layers, kv_heads, head_dim = self.kv_shape()
        if kv_mode == "concat":
            return ConcatKVCache(layers, kv_heads, head_dim, self.dtype)
        if kv_mode == "paged":
            return PagedKVCache(
                layers, kv_heads, head_dim, num_blocks, block_size, self.dtype, self.device
            )
        return SlotKVCache(
            layers, num_slots, kv_heads, head_dim, max_seq_len, self.dtype, self.device
        )

    def forward_packed(self, batch: PackedBatch) -> list[int]:
        """One forward pass over the packed row; the greedy next token of each sequence.

        Shapes:
            batch.input_ids: [1, T]  ->  logits [1, S, V]  ->  returns S token ids
        """
        with (
            torch.inference_mode(),
            self._attention(attention.PACKED_ATTENTION),
            self.engine_kernels(),
        ):
            fused = self.fused_decoder if self.use_fused_layers else None
            if fused is not None and not getattr(batch, "invariant", False):
                hidden = fused.hidden_states(batch)  # (1, S, d)
                logits = self.model.get_output_embeddings()(hidden)  # (1, S, V)
            else:
                logits = self.model(
                    input_ids=batch.input_ids,
                    position_ids=batch.position_ids,
                    use_cache=False,
                    logits_to_keep=batch.logits_indices,
                    packed_batch=batch,
                ).logits  # (1, S, V)
        return logits[0].argmax(dim=-1).tolist()

    @contextlib.contextmanager
    def _attention(self, name: str):
        config = self.model.config
        previous = config._attn_implementation
        config._attn_implementation = name
        try:
            yield
        finally:
            config._attn_implementation = previous

    # --- static engine and reference ---------------------------------------------------------
    def generate(self, input_ids, attention_mask, max_new_tokens: int, stopping_criteria=None):
        """Greedy ``model.generate`` on a left-padded batch.

        Shapes:
            input_ids, attention_mask: [B, W]  ->  returns [B, W + N], N <= max_new_tokens
        """
        from transformers import GenerationConfig, StoppingCriteriaList

        config = GenerationConfig(
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=sorted(self.eos_token_ids),
            pad_token_id=self.pad_token_id,
        )
        with torch.inference_mode():
            return self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device),
                generation_config=config,
                stopping_criteria=StoppingCriteriaList(stopping_criteria or []),
            )

    def left_pad(self, token_lists: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-pad prompts into ``input_ids`` and ``attention_mask``, both [B, W]."""
        width = max(len(t) for t in token_lists)
        ids = torch.full((len(token_lists), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(token_lists), width), dtype=torch.long)
        for row, tokens in enumerate(token_lists):
            ids[row, width - len(tokens) :] = torch.tensor(tokens, dtype=torch.long)
            mask[row, width - len(tokens) :] = 1
        return ids, mask

    # --- transformers' own continuous batching (a reference engine for the bench) -------------
    def hf_continuous_batch(
        self, prompts: list[list[int]], caps: list[int], num_slots: int, on_poll=None
    ):
        """Run prompts through transformers' ``ContinuousBatchingManager`` (greedy).

        Uses ``model.continuous_batching_context_manager`` with ``max_requests_per_batch`` =
        ``num_slots`` and ``add_request(..., max_new_tokens=cap)`` per request; warm-up happens
        before the clock starts. Returns ``(t0, outputs)``: ``perf_counter`` at the first request,
        and per prompt a ``GenerationOutput`` (``generated_tokens``, ``timestamps`` in
        ``perf_counter`` seconds).

        ``on_poll()`` is called every ``HF_POLL_S`` (0.1 s) while results are awaited; an exception
        it raises (``RunStopped``) stops the manager and propagates.

        Raises:
            RuntimeError: no result for ``HF_STALL_S`` (60 s): the manager stopped early.
        """
        import time

        from transformers import ContinuousBatchingConfig, GenerationConfig

        gen = GenerationConfig(
            do_sample=False,
            eos_token_id=sorted(self.eos_token_ids),
            pad_token_id=self.pad_token_id,
            max_new_tokens=max(caps),
        )
        cb = ContinuousBatchingConfig(
            max_requests_per_batch=num_slots,
            auto_switch_to_flash=False,
            **_hf_sizes(prompts, caps, num_slots),
        )
        previous = self.model.config._attn_implementation
        results = {}
        try:
            with self.model.continuous_batching_context_manager(
                generation_config=gen, continuous_batching_config=cb, block=True, timeout=30
            ) as manager:
                t0 = time.perf_counter()
                for i, (ids, cap) in enumerate(zip(prompts, caps, strict=True)):
                    manager.add_request(
                        ids, request_id=f"r{i}", max_new_tokens=cap, record_timestamps=True
                    )
                last_result_s = time.perf_counter()
                while len(results) < len(prompts):
                    out = manager.get_result(timeout=HF_POLL_S)
                    if on_poll is not None:
                        on_poll()
                    if out is None:
                        if time.perf_counter() - last_result_s > HF_STALL_S:
                            raise RuntimeError("transformers' continuous batching stopped early")
                        continue
                    last_result_s = time.perf_counter()
                    if out.is_finished():
                        results[out.request_id] = out
        finally:
            self.model.set_attn_implementation(previous)
        return t0, [results[f"r{i}"] for i in range(len(prompts))]

    def next_token_logits(self, token_ids: list[int]) -> torch.Tensor:
        """Logits for the token after ``token_ids``, from one plain forward pass (no cache).

        Shapes:
            token_ids: T ids  ->  returns [V] (float32)
        """
        ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)  # (1, T)
        with torch.inference_mode():
            logits = self.model(input_ids=ids, logits_to_keep=1).logits  # (1, 1, V)
        return logits[0, -1].float().cpu()

    # --- shared ------------------------------------------------------------------------------
    def decode(self, token_ids: list[int]) -> str:
        """Output ids -> text, special tokens (EOS) dropped."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def synchronize(self) -> None:
        """Wait for queued device work, so that timings are real."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        elif self.device.type == "mps":
            torch.mps.synchronize()


HF_POLL_S = 0.1  # how often hf_continuous_batch calls on_poll while it waits for results
HF_STALL_S = 60.0  # no result for this long: transformers' manager is taken to have stopped
HF_PAGE_SIZE = 256  # ContinuousBatchingConfig's default page_size, in tokens


def _hf_sizes(prompts: list[list[int]], caps: list[int], num_slots: int) -> dict[str, int]:
    """``num_blocks`` and ``max_batch_tokens`` for ``ContinuousBatchingConfig``, like ours.

    Left unset, transformers sizes its KV cache from free memory (60-90 % of it: 14 GB on a 24 GB
    CPU machine, even for a tiny model; ``continuous_batching/cache.py``). Instead: room for every
    slot's longest sequence, and one step can prefill ``num_slots`` of the longest prompts, as our
    engine does without a token budget.
    """
    longest = max(len(p) + c for p, c in zip(prompts, caps, strict=True))
    prompt_lengths = sorted((len(p) for p in prompts), reverse=True)
    return {
        "num_blocks": num_slots * -(-longest // HF_PAGE_SIZE),
        "max_batch_tokens": sum(prompt_lengths[:num_slots]) + num_slots,
    }


def _pad_token_id(tokenizer, eos_token_ids) -> int:
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    return int(sorted(eos_token_ids)[0])
