"""A file kept on disk for what its content depends on (its key): named by the key's digest, written
atomically, and read back as nothing, with a warning, when unreadable, corrupt or another key's."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
KEY_CHARS = 24  # hex digits of the key's digest in a file's name


def sha256_json(value) -> str:
    """SHA-256 of ``value`` as canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def key_path(folder: Path, key: dict[str, Any]) -> Path:
    """``folder / <digest of key>.json``."""
    return folder / f"{sha256_json(key)[:KEY_CHARS]}.json"


def read_keyed(
    path: Path,
    key: dict[str, Any],
    parse: Callable[[dict], T],
    what: str,
    then: str,
    log: logging.Logger,
) -> T | None:
    """``parse`` of ``path``'s document whose ``"key"`` is ``key``; None (no file), or None and a
    warning on ``log`` when unreadable, not JSON, another key's or refused by ``parse``."""
    name = what[:1].upper() + what[1:]
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as err:
        log.warning("%s %s is unreadable (%s); %s.", name, path, err, then)
        return None
    try:
        doc = json.loads(text)
        if doc["key"] != key:
            raise ValueError("it holds another key")
        return parse(doc)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        log.warning("%s %s is corrupt (%s); %s.", name, path, err, then)
        return None


def keep_keyed(path: Path, doc: dict[str, Any], what: str, log: logging.Logger) -> bool:
    """Write ``doc`` (JSON, its ``"key"`` in it) at ``path`` atomically; False and a warning on
    ``log`` naming ``what`` (e.g. "kernel choice") when it could not be."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(doc, indent=1))
        return True
    except OSError as err:
        log.warning("Could not keep the %s in %s: %s", what, path, err)
        return False


def write_atomically(path: Path, text: str) -> None:
    """``text`` at ``path``, whole or not at all (readers never see half a file). Raises OSError:
    the folder cannot be written."""
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
