"""A local server never outlives the Python that started it: SIGTERM or SIGKILL its owner (as
``timeout``, a service manager or the OOM killer would) and the server's whole process group
ends within seconds, though ``atexit`` runs at neither."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.owner_process import ends_with_owner, live_members, owner_of

GONE_WITHIN_S = 5.0  # the reaper polls every 0.25 s; the stand-in ends at SIGTERM


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_server_ends_with_its_owner(sig):
    """A started server (two processes, in a session of its own) is gone a few seconds after its
    owner is killed by ``sig``."""
    with owner_of("server") as (owner, group):
        assert len(live_members(group)) == 2, "the stand-in server should be two processes"
        gone = ends_with_owner(owner, sig, lambda: not live_members(group), GONE_WITHIN_S)
        assert gone, f"the server outlived its owner's {sig.name}: pids {live_members(group)}"
