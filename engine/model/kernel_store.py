"""The kernel store: the engines' measured matmul choice kept on disk, so a host measures it once.

``engine.kernels.kernel_timing`` takes up to 5 s to time the candidate kernels. What it finds
holds for as long as nothing it depends on changes, so the choice is kept in the cache folder
(``engine.model.loader.cache_dir``: ``$CBP_CACHE_DIR``) as one small JSON file per key::

    <cache dir>/kernel-choice/<SHA-256 of the key, 24 hex>.json
    {"key": {...}, "choice": {"origin", "plan": [{"kernel", "from_rows", "to_rows"}],
                              "rows", "times_ms", ...}}

The key (``host_key``) is everything that can change which kernel is fastest: the CPU (model
name, machine, the instruction sets torch sees, the thread count), torch's version, the dtype,
the model (its name, where it was loaded from and its linears' shapes), and the candidates timed.
A file is written to a temporary file and renamed into place (``os.replace``), so no reader sees
half of one. A file that cannot be read, is not what this module writes, or holds another key
is logged as a warning and measured again (the new choice replaces it); a file that cannot be
written costs only the next start's measurement. A measurement the time budget cut short
(``Timings.complete`` false), or one taken while other work used the CPU (``Timings.quiet``
false: ``engine.kernels.cpu_share``), is used at this start and not kept.

A model with no ``source`` (built in memory, as the tests' tiny model) has nothing to key a file
by, and is not timed (``engine.model.kernel_choice``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.kernels.kernel_timing import KernelChoice, cpu_capabilities
from engine.model import loader
from engine.model.device import cpu_model

FORMAT = 1  # bump when the file's layout, or the timing behind a choice, changes
FOLDER = "kernel-choice"

log = logging.getLogger(__name__)


def host_key(
    model_name: str, source: str, dtype: torch.dtype, linears: list[nn.Linear], candidates
) -> dict[str, Any]:
    """What a kernel choice depends on (see the module docstring), as JSON-ready fields."""
    capabilities = cpu_capabilities()
    flags = sorted(name for name, value in capabilities.items() if value is True)
    shapes = Counter(tuple(m.weight.shape) for m in linears)
    return {
        "format": FORMAT,
        "cpu": capabilities.get("cpu_name") or cpu_model(),
        "machine": platform.machine(),
        "cpu_flags": flags or [torch.backends.cpu.get_cpu_capability()],
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "dtype": str(dtype).removeprefix("torch."),
        "model": model_name,
        "source": source,
        "linear_shapes": sorted([*shape, count] for shape, count in shapes.items()),
        "candidates": list(candidates),
    }


def choice_path(key: dict[str, Any]) -> Path:
    """The file that keeps the choice for ``key``."""
    text = json.dumps(key, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()[:24]
    return loader.cache_dir() / FOLDER / f"{digest}.json"


def stored_or_measured(
    key: dict[str, Any], measure: Callable[[], KernelChoice], remeasure: bool = False
) -> KernelChoice:
    """The choice kept for ``key``; else (no file, a bad one, ``remeasure``) ``measure()``'s,
    written for the next start."""
    path = choice_path(key)
    stored = None if remeasure else read_choice(path, key)
    if stored is not None:
        return stored
    choice = measure()
    if choice.timings is not None and not choice.timings.complete:
        log.warning(
            "Kernel timing was cut short by its time budget (machine busy?); the choice is "
            "used at this start and measured again at the next."
        )
        return choice
    if choice.timings is not None and not choice.timings.quiet:
        log.warning(
            "Other work used %.0f%% of the CPU while the kernels were timed; the choice is used "
            "at this start and measured again at the next.",
            100 * choice.timings.others_cpu_share,
        )
        return choice
    if write_choice(path, key, choice):
        choice = KernelChoice(choice.plan, choice.origin, choice.timings, str(path))
    return choice


def read_choice(path: Path, key: dict[str, Any]) -> KernelChoice | None:
    """The choice in ``path`` (origin ``"cached"``), or None: no file, or one that cannot be read,
    is not a choice or holds another key (a warning says which)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as err:
        log.warning("Kernel choice %s is unreadable (%s); measuring again.", path, err)
        return None
    try:
        doc = json.loads(text)
        if doc["key"] != key:
            raise ValueError("it holds another key")
        return KernelChoice.from_dict(doc["choice"], "cached", str(path))
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        log.warning("Kernel choice %s is corrupt (%s); measuring again.", path, err)
        return None


def write_choice(path: Path, key: dict[str, Any], choice: KernelChoice) -> bool:
    """Write ``choice`` for ``key`` at ``path`` atomically; False (and a warning) if it failed."""
    doc = {"key": key, "choice": {**choice.as_dict(), "origin": "measured", "file": None}}
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp", delete=False
        ) as handle:
            tmp = handle.name
            json.dump(doc, handle, indent=1)
        os.replace(tmp, path)
        return True
    except OSError as err:
        log.warning("Could not keep the kernel choice in %s: %s", path, err)
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        return False
