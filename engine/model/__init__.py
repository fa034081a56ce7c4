"""The model: loading it, the device and dtype it runs in, and the runner that calls it; the map is
docs/architecture.md. Modules: ``model_runner``, ``kernel_choice``, ``kernel_store``,
``memory_account``, ``copy_budget``, ``loader``, ``text_decoder`` (a vision-language model's
text half), ``model_card``, ``device``, ``dtype_support``, ``allowlist``, ``openmp_env``.
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
