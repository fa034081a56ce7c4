"""How long a local server takes on this host, kept across restarts for the queue's estimates:
its start (else a prior for its kind) and its stage's seconds per step over ours. Files and key:
docs/servers.md#kept-timings.
"""

from __future__ import annotations

import logging
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine import cache_file
from engine.llamacpp.server import LlamaServer
from engine.model import loader
from engine.model.device import cpu_model
from engine.peers.server_process import ServerProcess
from engine.peers.vllm_server import VllmServer

FORMAT = 1  # bump when the key or the file's layout changes
FOLDER = "server-start"
STAGE_FOLDER = "server-stage"
# Starts before one was measured here, by (server, mode), as measured on a 2-core EPYC
# (docs/measurements.md, "Notes moved out of the code's docstrings"): vLLM compiled 90 to 124 s
# on a quiet host (166 to 210 s on a busy one), eager about 42 s; llama-server 1 to 2 s (its F32
# GGUF is converted as the page starts).
PRIOR_START_S = {
    ("vllm", "compiled"): 120.0,
    ("vllm", "eager"): 45.0,
    ("llamacpp", "f32"): 2.0,
    ("llamacpp", "q4_1"): 2.0,
}
UNKNOWN_START_S = 60.0  # a server kind with no prior
# A start past its expected length is told this share of that length still left, not zero.
OVERRUN_SHARE = 0.1

log = logging.getLogger(__name__)


def start_key(server: ServerProcess) -> dict[str, Any]:
    """What the start of ``server`` depends on, as JSON-ready fields (docs/servers.md#kept-timings);
    a server other than vLLM's or llama.cpp's is keyed by its class and CPUs alone."""
    settings = getattr(server, "settings", None)
    kind, mode, model, dtype = type(server).__name__, "", "", ""
    if isinstance(server, LlamaServer):
        kind, mode = "llamacpp", settings.weights
        model, dtype = Path(settings.model_path).name, settings.dtype
    elif isinstance(server, VllmServer):
        kind, mode = "vllm", "eager" if settings.enforce_eager else "compiled"
        model, dtype = settings.model_dir, settings.dtype
    return {
        "format": FORMAT,
        "cpu": cpu_model(),
        "machine": platform.machine(),
        "server": kind,
        "mode": mode,
        "model": model,
        "dtype": dtype,
        "threads": len(server.cpus()) or os.cpu_count() or 1,
    }


def expected_start_s(key: dict[str, Any]) -> float:
    """Seconds a start of ``key``'s server takes here: the last one kept, else its prior."""
    kept = read_start_s(start_path(key), key)
    if kept is not None:
        return kept
    return PRIOR_START_S.get((key["server"], key["mode"]), UNKNOWN_START_S)


def start_left_s(expected_s: float, started_s_ago: float) -> float:
    """What is left of a start expected to take ``expected_s``, ``started_s_ago`` into it: never
    under ``OVERRUN_SHARE`` of ``expected_s`` while it still runs."""
    return max(expected_s - started_s_ago, OVERRUN_SHARE * expected_s)


def start_path(key: dict[str, Any]) -> Path:
    return cache_file.key_path(loader.cache_dir() / FOLDER, key)


def read_start_s(path: Path, key: dict[str, Any]) -> float | None:
    """The start kept in ``path`` for ``key``; None: no file, or one that is unreadable, holds
    another key or no positive seconds (a warning says which)."""
    parse = _positive("start_s")
    return cache_file.read_keyed(path, key, parse, "server start", "using the prior", log)


def keep_start(key: dict[str, Any], start_s: float) -> bool:
    """Keep ``start_s`` for ``key`` atomically; False (and a warning) if it could not be."""
    doc = {"key": key, "start_s": float(start_s)}
    return cache_file.keep_keyed(start_path(key), doc, "server start", log)


def stage_path(key: dict[str, Any]) -> Path:
    return cache_file.key_path(loader.cache_dir() / STAGE_FOLDER, key)


def kept_step_ratio(key: dict[str, Any]) -> float | None:
    """The stage's ratio kept for ``key``; None: none, or a file that is unreadable, holds another
    key or no positive ratio (a warning says which)."""
    parse = _positive("step_ratio")
    return cache_file.read_keyed(
        stage_path(key), key, parse, "server stage", "using the prior", log
    )


def keep_step_ratio(key: dict[str, Any], ratio: float) -> bool:
    """Keep the stage's ``ratio`` for ``key`` atomically; False (and a warning) if not kept."""
    doc = {"key": key, "step_ratio": float(ratio)}
    return cache_file.keep_keyed(stage_path(key), doc, "server stage", log)


def _positive(field: str) -> Callable[[dict], float]:
    """A kept file's parser: its ``field`` as a number over 0 (ValueError else)."""

    def parse(doc: dict) -> float:
        value = float(doc[field])
        if not value > 0:
            raise ValueError(f"{field} {value}")
        return value

    return parse
