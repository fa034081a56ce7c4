"""Fidelity: outputs held against per-request ``model.generate``, token for token: ``reference``,
``reference_store``, ``reference_key``, ``divergence``. Import them by name."""

__all__ = [
    "reference",
    "reference_store",
    "reference_key",
    "divergence",
]
