"""Engine configuration: a small dataclass that validates itself."""

from __future__ import annotations

from dataclasses import dataclass

KV_MODES = ("slots", "concat")


@dataclass(frozen=True)
class EngineConfig:
    """How an engine runs.

    Attributes:
        num_slots: B, the number of sequences that run at once (static: rows per wave;
            continuous: ``max_num_seqs``).
        kv_mode: continuous engine's KV cache. ``"slots"`` preallocates ``[L, B, H_kv, P, D]``
            and writes each step's keys/values in place; ``"concat"`` is the article's teaching
            mode: per-sequence caches concatenated into one packed cache every step.
        max_seq_len: P, per-slot KV capacity in tokens; ``None`` sizes it from the workload.
        ignore_eos: generate every sequence to its cap (benchmarks only, as vLLM's ``ignore_eos``).

    Raises:
        ValueError: on a slot count below 1, an unknown KV mode or a non-positive max_seq_len.
    """

    num_slots: int = 3
    kv_mode: str = "slots"
    max_seq_len: int | None = None
    ignore_eos: bool = False

    def __post_init__(self):
        if not isinstance(self.num_slots, int) or self.num_slots < 1:
            raise ValueError(
                f"Slots must be a whole number of at least 1 (got {self.num_slots!r})."
            )
        if self.kv_mode not in KV_MODES:
            raise ValueError(
                f"Unknown KV mode {self.kv_mode!r}; choose one of {', '.join(KV_MODES)}."
            )
        if self.max_seq_len is not None and self.max_seq_len < 1:
            raise ValueError(f"max_seq_len must be positive (got {self.max_seq_len}).")
