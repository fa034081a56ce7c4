"""The reference store: references kept on disk, so a setup's reference is computed once per host.
Layout and entries: docs/engines.md, "Core formats"."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from engine import settings
from engine.cache_file import sha256_json, write_atomically
from engine.fidelity.reference_key import Identity, identity_fields, request_fields, weights_digest
from engine.model import loader
from engine.sequence import Request
from engine.token_logits import DIGEST_BYTES, LogitTrail, TokenLogits

FORMAT = 2  # bump when an entry's layout or meaning changes (2: CRC-32 row digests)
MAX_BYTES = 256 * 2**20  # the references folder's bound; one 256-token output takes ~100 KB
SETTING = "CBP_REFERENCE_CACHE"
_CHOICES = {"on": "keep references on disk", "off": "compute them afresh"}

log = logging.getLogger(__name__)


class Stored(NamedTuple):
    tokens: list[int]  # output ids of that run (up to its cap or first EOS)
    cap: int  # the max_new_tokens it ran with
    logits: LogitTrail  # its logit record, one per output token


def open_store() -> ReferenceStore | None:
    """The store under ``cache_dir() / "references"``; None when ``CBP_REFERENCE_CACHE`` is off.
    Raises ValueError: a value other than ``on`` or ``off``."""
    if settings.choice(SETTING, _CHOICES) == "off":
        return None
    return ReferenceStore(loader.cache_dir() / "references")


class ReferenceStore:
    def __init__(self, folder: Path, max_bytes: int = MAX_BYTES):
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self._weights: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> hex

    def identity(self, runner, mode: dict[str, Any]) -> Identity:
        """The identity of ``runner``'s model in ``mode``; the weights are hashed once per model."""
        model = runner.model
        if model not in self._weights:
            self._weights[model] = weights_digest(model)
        fields = identity_fields(runner, mode, self._weights[model])
        fields = {"format": FORMAT, **fields}
        return Identity(fields, sha256_json(fields))

    def load(self, identity: Identity, key: tuple) -> Stored | None:
        """The stored output for ``key``, or None (none, or unreadable: a warning says why)."""
        path = self._path(identity, key)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as err:
            log.warning("Reference cache entry %s is unreadable (%s); recomputing.", path, err)
            return None
        try:
            stored = _decode(json.loads(text), identity, key)
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            log.warning("Reference cache entry %s is corrupt (%s); recomputing.", path, err)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: pruned last
        return stored

    def save(self, identity: Identity, key: tuple, stored: Stored) -> None:
        """Write ``key``'s entry atomically, then prune; a failure is a warning."""
        path = self._path(identity, key)
        entry = _encode(stored, identity, key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            described = path.parent / "identity.json"
            if not described.exists():
                write_atomically(described, json.dumps(identity.fields, indent=1))
            write_atomically(path, json.dumps(entry, separators=(",", ":")))
        except OSError as err:
            log.warning("Could not write the reference cache entry %s: %s", path, err)
            return
        self.prune()

    def prune(self) -> None:
        entries = []
        for path in self.folder.glob("*/*.json"):
            if path.name == "identity.json":
                continue
            try:
                stat = path.stat()
            except OSError:  # another process pruned it
                continue
            entries.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size

    def _path(self, identity: Identity, key: tuple) -> Path:
        request = sha256_json(request_fields(*key))
        return self.folder / identity.digest[:24] / f"{request[:32]}.json"


def entry_key(request: Request) -> tuple:
    """``(prompt ids, sampling settings or None)``: what a reference is kept by."""
    return request.prompt_token_ids, request.sampling if request.is_sampled else None


def wanted_references(requests: Iterable[Request]) -> dict[tuple, int]:
    wanted = {}
    for request in requests:
        key = entry_key(request)
        wanted[key] = max(wanted.get(key, 0), request.max_new_tokens)
    return wanted


def covers(hit: Stored, cap: int, eos_token_ids: Iterable[int]) -> bool:
    """A larger cap, or an output that ended at EOS, answers ``cap`` (prefix-stable)."""
    eos = set(eos_token_ids)
    return hit.cap >= cap or any(t in eos for t in hit.tokens)


def still_missing(
    wanted: dict[tuple, int],
    kept: dict[tuple, Stored],
    store: ReferenceStore | None,
    identity: Identity | None,
    eos_token_ids: Iterable[int],
) -> dict[tuple, int]:
    """Those of ``wanted`` that neither ``kept`` nor ``store`` holds to their caps; a store hit goes
    into ``kept``."""
    found = {}
    for key, cap in wanted.items():
        hit = kept.get(key)
        if (hit is None or not covers(hit, cap, eos_token_ids)) and store is not None:
            loaded = store.load(identity, key)
            if loaded is not None:
                kept[key] = hit = loaded
        if hit is None or not covers(hit, cap, eos_token_ids):
            found[key] = cap
    return found


class StoredReferences:
    """The references ``store`` holds under ``identity``, for a process without the model; answers
    as ``reference``'s classes do."""

    def __init__(
        self, store: ReferenceStore | None, identity: Identity | None, eos_token_ids: Iterable[int]
    ):
        self.store = store if identity is not None else None
        self.identity = identity
        self.eos_token_ids = tuple(eos_token_ids)
        self._read: dict[tuple, Stored] = {}  # entries read, by entry_key

    def missing(self, requests: list[Request]) -> dict[tuple, int]:
        return self.still_missing(wanted_references(requests))

    def still_missing(self, wanted: dict[tuple, int]) -> dict[tuple, int]:
        return still_missing(wanted, self._read, self.store, self.identity, self.eos_token_ids)


def _encode(stored: Stored, identity: Identity, key: tuple) -> dict[str, Any]:
    rows = list(stored.logits)
    return {
        "format": FORMAT,
        "identity": identity.digest,
        **request_fields(*key),
        "cap": stored.cap,
        "output_token_ids": list(stored.tokens),
        "token_logits": {
            "token_ids": [list(r.token_ids) for r in rows],
            "logits": [list(r.logits) for r in rows],
            "abs_dots": [list(r.abs_dots) for r in rows],
            "hidden_norms": [r.hidden_norm for r in rows],
            "digests": [r.digest for r in rows],
        },
    }


def _decode(entry: dict, identity: Identity, key: tuple) -> Stored:
    """Raises ValueError, TypeError, KeyError, AttributeError: not an entry this key wrote."""
    if entry["format"] != FORMAT or entry["identity"] != identity.digest:
        raise ValueError("written for another identity or format")
    want = request_fields(*key)
    if any(entry[name] != value for name, value in want.items()):
        raise ValueError("written for another request")
    columns = entry["token_logits"]
    k = len(columns["token_ids"][0]) if columns["token_ids"] else 0
    names = ("token_ids", "logits", "abs_dots", "hidden_norms", "digests")  # as ``_encode`` writes
    rows = zip(*(columns[name] for name in names), strict=True)
    trail = LogitTrail()
    for ids, logits, dots, norm, digest in rows:
        if not len(ids) == len(logits) == len(dots) == k:
            raise ValueError("logit rows of different lengths")
        floats = (tuple(map(float, logits)), tuple(map(float, dots)), float(norm))
        trail.append(TokenLogits(tuple(_ints(ids)), *floats, _digest(digest)))
    tokens, cap = _ints(entry["output_token_ids"]), entry["cap"]
    if not isinstance(cap, int) or cap < len(tokens) or len(trail) < len(tokens):
        raise ValueError("its cap, output and logit record do not agree")
    return Stored(tokens, cap, trail)


def _ints(values) -> list[int]:
    if not isinstance(values, list) or not all(type(v) is int for v in values):
        raise TypeError("expected a list of whole numbers")
    return values


def _digest(text) -> str:
    if len(bytes.fromhex(text)) != DIGEST_BYTES:
        raise ValueError("a logits digest of the wrong size")
    return text
