"""Fidelity: outputs held against per-request ``model.generate``, token for token.

``reference`` runs and caches the per-request reference; ``reference_store`` keeps references on
disk, so a setup's reference is computed once per host, keyed by ``reference_key`` (everything
that can change one), and says which it holds to a process that has their key but not the model;
``divergence`` says where and why two runs part (near-ties in half precision). May import the
rooms below it, ``batching`` included.

Nothing is imported here: import the modules by name. ``__all__`` is the room's face.
"""

__all__ = [
    "reference",
    "reference_store",
    "reference_key",
    "divergence",
]
