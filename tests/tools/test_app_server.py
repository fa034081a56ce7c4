"""``app.py`` started by ``tools.app_server`` never outlives the process that started it: SIGTERM
that process (as ``timeout`` does to a test run) and ``app.py`` and its engine process end."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.owner_process import kill_left, live_members, lives, start_owner, wait_until

START_WITHIN_S = 300.0  # app.py loads the embedded model: ~25 s, minutes on a busy host
GONE_WITHIN_S = 20.0  # the reaper's SIGTERM, then app.py's own shutdown


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_app_py_ends_with_the_process_that_started_it():
    """A serving app.py (its process group: the page and its engine process) is gone within
    seconds of its starter's SIGTERM."""
    owner, app = start_owner("app", START_WITHIN_S)
    try:
        assert lives(app), "app.py is not running"
        os.kill(owner.pid, signal.SIGTERM)
        owner.wait(timeout=GONE_WITHIN_S)
        gone = wait_until(lambda: not lives(app) and not live_members(app), GONE_WITHIN_S)
        assert gone, f"app.py outlived its starter's SIGTERM: {app}, group {live_members(app)}"
    finally:
        owner.kill()
        owner.wait()
        kill_left(app)
