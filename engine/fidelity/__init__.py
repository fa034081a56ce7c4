"""Fidelity: outputs held against per-request ``model.generate``, token for token. Modules:
``reference``, ``reference_store``, ``reference_key``, ``divergence``; docs/architecture.md.

Nothing is imported here: import the modules by name.
"""

__all__ = [
    "reference",
    "reference_store",
    "reference_key",
    "divergence",
]
