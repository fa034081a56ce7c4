"""Kernels: the arithmetic a step runs through on the model's weights.

The packed attention function (``packed_attention``) and its variants for decode
(``decode_attention``) and batch-invariant mode (``invariant_attention``), the engines' matmul
kernels (``linear_kernel``, with this project's C++ kernel built by ``gemv_build`` from
``csrc/gemv.cpp``), the plan of which runs at which row count (``kernel_plan``) and its
measurement on this host (``kernel_timing``, which asks ``cpu_share`` whether the machine was
quiet meanwhile), batch-invariant ops (``invariant_ops``), the fused decoder layers
(``fused_layers``) and what each layer computes (``layer_spec``), and the host settings that
pick among them (``host_setting``, read here and by the model's runner).
May import the root vocabulary, ``engine.workloads`` and ``engine.serving``.

Nothing is imported here: import the modules by name. ``__all__`` is the room's face;
``decode_attention``, ``invariant_attention``, ``gemv_build`` serve it from inside.
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
    "host_setting",
]
