"""Fidelity: outputs held against per-request ``model.generate``, token for token.

``reference`` runs and caches the per-request reference; ``divergence`` says where and why two
runs part (near-ties in half precision). May import the rooms below it, ``batching`` included.

Nothing is imported here: import the modules by name. ``__all__`` is the room's face.
"""

__all__ = [
    "reference",
    "divergence",
]
