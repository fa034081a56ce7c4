"""Serving: what a continuous engine decides and lays out at each step, in plain bookkeeping:
``scheduler``, ``planners``, ``block_manager``, ``kv_cache``, ``kv_cache_groups``,
``packed_batch``, ``masks``, ``sampler``, ``run_control``. Import them by name."""

__all__ = [
    "scheduler",
    "block_manager",
    "kv_cache_groups",
    "kv_cache",
    "packed_batch",
    "masks",
    "sampler",
    "run_control",
]
