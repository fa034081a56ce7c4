"""Which references a store already holds, for a process that has their key but not the model.

A reference pass costs a ``model.generate`` per request not stored yet, and the page's queue
prices a run by it. The page's process holds no model when an engine process runs the runs: it
learns the key the references are stored under (``engine.fidelity.reference_key.Identity``) from
that process, and reads the store (``engine.fidelity.reference_store``) itself, here. The
references compute the same answer for themselves (``engine.fidelity.reference``) from
``wanted_references`` and ``covers``.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.fidelity.reference_key import Identity
from engine.fidelity.reference_store import ReferenceStore, Stored
from engine.sequence import Request


def entry_key(request: Request) -> tuple:
    """``(prompt ids, sampling settings or None for greedy)``: what a reference is kept by."""
    return request.prompt_token_ids, request.sampling if request.is_sampled else None


def wanted_references(requests: Iterable[Request]) -> dict[tuple, int]:
    """The references ``requests`` need, as ``entry_key -> cap`` (the largest cap asked)."""
    wanted = {}
    for request in requests:
        key = entry_key(request)
        wanted[key] = max(wanted.get(key, 0), request.max_new_tokens)
    return wanted


def covers(hit: Stored, cap: int, eos_token_ids: Iterable[int]) -> bool:
    """Whether ``hit`` answers a request with ``cap`` (references are prefix-stable: a larger
    cap, or an output that ended at an end-of-sequence id, answers it)."""
    eos = set(eos_token_ids)
    return hit.cap >= cap or any(t in eos for t in hit.tokens)


class StoredReferences:
    """The references ``store`` holds under ``identity`` (None: no store, nothing held)."""

    def __init__(
        self, store: ReferenceStore | None, identity: Identity | None, eos_token_ids: Iterable[int]
    ):
        self.store = store if identity is not None else None
        self.identity = identity
        self.eos_token_ids = tuple(eos_token_ids)
        self._read: dict[tuple, Stored] = {}  # entries read, by entry_key

    def missing(self, requests: list[Request]) -> dict[tuple, int]:
        """The references a reference pass over ``requests`` would compute, as
        ``entry_key -> cap`` (``engine.fidelity.reference`` ``missing``'s answer)."""
        return self.still_missing(wanted_references(requests))

    def still_missing(self, wanted: dict[tuple, int]) -> dict[tuple, int]:
        """Those of ``wanted`` (``missing``'s keys and caps) the store does not hold to their
        caps now."""
        found = {}
        for key, cap in wanted.items():
            hit = self._read.get(key)
            if (hit is None or not covers(hit, cap, self.eos_token_ids)) and self.store is not None:
                hit = self.store.load(self.identity, *key)
                if hit is not None:
                    self._read[key] = hit
            if hit is None or not covers(hit, cap, self.eos_token_ids):
                found[key] = cap
        return found
