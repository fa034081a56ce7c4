"""``app.py`` started by ``tools.app_server`` never outlives the process that started it: SIGTERM
that process (as ``timeout`` does to a test run) and ``app.py`` and its engine process end."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.owner_process import ends_with_owner, live_members, lives, owner_of

START_WITHIN_S = 300.0  # app.py loads the embedded model: ~25 s, minutes on a busy host
GONE_WITHIN_S = 20.0  # the reaper's SIGTERM, then app.py's own shutdown


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_app_py_ends_with_the_process_that_started_it():
    """A serving app.py (its process group: the page and its engine process) is gone within
    seconds of its starter's SIGTERM."""
    with owner_of("app", START_WITHIN_S) as (owner, app):
        assert lives(app), "app.py is not running"
        gone = ends_with_owner(
            owner, signal.SIGTERM, lambda: not lives(app) and not live_members(app), GONE_WITHIN_S
        )
        assert gone, f"app.py outlived its starter's SIGTERM: {app}, group {live_members(app)}"
