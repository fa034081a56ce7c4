"""Engine configuration: a small dataclass that validates itself against the knobs' ranges
(``engine.knobs``)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.knobs import KV_MODES, MAX_BLOCK_SIZE, POLICIES  # the knobs' ranges, declared there


@dataclass(frozen=True)
class EngineConfig:
    """How an engine runs.

    Attributes:
        num_slots: B, the number of sequences that run at once (static: rows per wave;
            continuous: ``max_num_seqs``).
        kv_mode: the continuous engine's KV cache, ``"slots"``, ``"paged"`` (vLLM's blocks) or
            ``"concat"`` (the article's); ``engine.serving.kv_cache`` describes each.
        max_seq_len: P, per-slot KV capacity in tokens; ``None`` sizes it from the workload.
        max_num_batched_tokens: the token budget, most tokens in one step (continuous engine);
            ``None`` means no limit. It must be at least ``num_slots`` so every decode fits.
        scheduling_policy: ``"decode_first"``, ``"prefill_first"`` or ``"vllm"``
            (``engine.serving.planners`` describes each).
        wave_timeout_s: static engine: how long the oldest arrived request waits for a full wave.
        ignore_eos: generate every sequence to its cap (benchmarks only, as vLLM's ``ignore_eos``).
        block_size: ``paged`` mode: tokens per KV block.
        kv_budget_mib: ``paged`` mode: KV memory in MiB (2**20 bytes), which sets the number of
            blocks; ``None`` gives every slot room for the workload's longest sequence.
        prefix_caching: ``paged`` mode only: share the KV blocks of prompt prefixes that were
            computed before (vLLM's automatic prefix caching; ``engine.serving.block_manager``).
        batch_invariant: batch-invariant mode (``engine.kernels.invariant_ops``): a sequence's
            logits do not depend on what else shares its step, bitwise. Static and continuous
            engines only; transformers' engine ignores it, with a warning.

    Raises:
        ValueError: naming every bad setting at once (``problems``): a slot count below 1, an
            unknown KV mode or policy, a token budget below the slot count, a non-positive
            max_seq_len, block size or KV budget, prefix caching without the paged KV mode, or a
            prefix_caching or batch_invariant that is not a bool.
    """

    num_slots: int = 3
    kv_mode: str = "slots"
    max_seq_len: int | None = None
    max_num_batched_tokens: int | None = None
    scheduling_policy: str = "decode_first"
    wave_timeout_s: float = 1.0
    ignore_eos: bool = False
    block_size: int = 16
    kv_budget_mib: float | None = None
    prefix_caching: bool = False
    batch_invariant: bool = False

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise ValueError(" ".join(problems))

    def problems(self) -> list[str]:
        """Every bad setting, one sentence each (none when all are good), so that a person sees
        them all at once instead of one per try."""
        problems = []
        slots_ok = isinstance(self.num_slots, int) and self.num_slots >= 1
        if not slots_ok:
            problems.append(f"Slots must be a whole number of at least 1 (got {self.num_slots!r}).")
        if self.kv_mode not in KV_MODES:
            problems.append(
                f"Unknown KV mode {self.kv_mode!r}; choose one of {', '.join(KV_MODES)}."
            )
        budget = self.max_num_batched_tokens
        if budget is not None and (
            not isinstance(budget, int) or (slots_ok and budget < self.num_slots)
        ):
            problems.append(
                f"The token budget ({budget}) must be a whole number, at least the slot count "
                f"({self.num_slots}), so that every decoding sequence fits in a step."
            )
        if self.scheduling_policy not in POLICIES:
            choices = ", ".join(POLICIES)
            problems.append(f"Unknown policy {self.scheduling_policy!r}; choose one of {choices}.")
        if self.wave_timeout_s < 0:
            problems.append(f"wave_timeout_s must be >= 0 (got {self.wave_timeout_s}).")
        if not isinstance(self.block_size, int) or not 1 <= self.block_size <= MAX_BLOCK_SIZE:
            problems.append(
                f"Block size must be a whole number of tokens from 1 to {MAX_BLOCK_SIZE} "
                f"(got {self.block_size!r})."
            )
        if self.kv_budget_mib is not None and not self.kv_budget_mib > 0:
            problems.append(f"The KV budget must be positive MiB (got {self.kv_budget_mib!r}).")
        if self.max_seq_len is not None and self.max_seq_len < 1:
            problems.append(f"max_seq_len must be positive (got {self.max_seq_len}).")
        for name in ("batch_invariant", "prefix_caching"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                problems.append(f"{name} must be True or False (got {value!r}).")
        if self.prefix_caching is True and self.kv_mode != "paged":
            problems.append(
                f"Prefix caching needs the paged KV cache (kv_mode 'paged'), where sequences can "
                f"share KV blocks; the {self.kv_mode!r} mode keeps one private cache per sequence."
            )
        return problems
