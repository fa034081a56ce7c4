"""The model: loading it, the device and dtype it runs in, and the runner that calls it.

``model_runner`` is the only module that calls the model; ``kernel_choice`` is its kernel half,
and ``kernel_store`` keeps the kernel choice measured on this host; ``memory_account``
counts the bytes of the weights and the kernels' copies, and ``copy_budget`` picks which copies
to keep within the host's bound.
Beside them: the ``loader`` (and ``text_decoder``, a vision-language model's text half), the
``model_card`` (a loaded model less its weights), the ``device``
and dtype checks (``dtype_support``), the model ``allowlist`` and OpenMP settings (``openmp_env``).
May import the rooms below it: ``workloads``, ``serving``, ``kernels``.

Nothing is imported here: import the modules by name. ``__all__`` is the room's face;
``kernel_choice`` and ``copy_budget`` serve it from inside; ``kernel_store`` is in the face for
the bench, which reports how a choice was made (``ORIGINS``).
"""

__all__ = [
    "loader",
    "model_card",
    "device",
    "dtype_support",
    "allowlist",
    "openmp_env",
    "model_runner",
    "kernel_store",
    "memory_account",
]
