"""Kernels: the arithmetic a step runs through on the model's weights; the map is
docs/architecture.md. Modules: ``packed_attention``, ``decode_attention``, ``invariant_attention``,
``invariant_ops``, ``linear_kernel``, ``gemv_build``, ``kernel_plan``, ``kernel_timing``,
``cpu_share``, ``fused_layers``, ``layer_spec``.
"""

__all__ = [
    "packed_attention",
    "invariant_ops",
    "linear_kernel",
    "kernel_plan",
    "kernel_timing",
    "fused_layers",
    "layer_spec",
    "cpu_share",
]
