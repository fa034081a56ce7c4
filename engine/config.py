"""Engine configuration: a small dataclass that validates itself against the knobs' ranges
(``engine.knobs``)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.knobs import KV_MODES, MAX_BLOCK_SIZE, POLICIES  # the knobs' ranges, declared there


@dataclass(frozen=True)
class EngineConfig:
    """How an engine runs; most fields are knobs (``engine.knobs`` has help). ``num_slots``: B;
    ``max_seq_len``: P (None: from the workload); ``max_num_batched_tokens``: the token budget, >=
    ``num_slots`` (None: no limit); ``kv_budget_mib``: MiB (None: room for every slot's longest
    sequence); ``wave_timeout_s``: how long the oldest arrival waits for a full static wave;
    ``ignore_eos``: generate every sequence to its cap (benchmarks, as vLLM's). Raises ValueError:
    naming every bad setting at once (``problems``)."""

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
