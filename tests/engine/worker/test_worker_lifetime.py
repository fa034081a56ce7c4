"""The engine process never outlives the page's process: SIGTERM or SIGKILL the page while the
engine process is busy (here: loading a model) and it ends within seconds, though its pipe is
not read until the load is done."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.owner_process import ends_with_owner, lives, owner_of, read_line

GONE_WITHIN_S = 5.0
LOAD_WITHIN_S = 120.0  # the engine process imports torch first


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_the_engine_process_ends_with_the_page(sig):
    """An engine process in a long model load is gone a few seconds after its page's process is
    killed by ``sig``."""
    with owner_of("engine process") as (owner, worker):
        assert read_line(owner, LOAD_WITHIN_S) == "loading", "the engine process did not load"
        gone = ends_with_owner(owner, sig, lambda: not lives(worker), GONE_WITHIN_S)
        assert gone, f"the engine process {worker} outlived the page's {sig.name}"
