"""Serving: what a continuous engine decides and lays out at each step, in plain bookkeeping.

The ``scheduler`` and its policies (``planners``), the ``block_manager`` and its
``kv_cache_groups``, the KV caches
(``kv_cache``), the ``packed_batch`` and its ``masks``, the per-request ``sampler`` and
``run_control``. May import the root vocabulary and ``engine.workloads``.

Nothing is imported here: import the modules by name. ``__all__`` is the room's face;
``planners`` serves ``scheduler`` from inside.
"""

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
