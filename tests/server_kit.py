"""Starting ``app.py`` for tests: a free localhost port, offline, and a wait until it serves.

Used by the ``server_url`` fixtures (``tests/conftest.py`` per module, the browser tests' per
package) and by tests that start a server of their own.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SERVER_START_TIMEOUT_S = 300  # ~3 s from the safetensors cache, ~25 s on a first run; minutes busy


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_until_serving(url: str, proc: subprocess.Popen, log_path: Path) -> None:
    """Poll ``url`` until it answers 200; fail with the server's log if it dies or times out."""
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"app.py exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    pytest.fail(
        f"app.py did not answer {url} within {SERVER_START_TIMEOUT_S} s:\n"
        f"{log_path.read_text()[-3000:]}"
    )


def start_app_server(request, tmp_path_factory, args: tuple[str, ...] = ()) -> str:
    """``app.py [args]`` on a free localhost port, offline; terminated by ``request``'s finalizer.

    Returns the page's URL once it answers 200.
    """
    port = _free_port()
    log_path = tmp_path_factory.mktemp("server") / "app.log"
    log = log_path.open("w")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "app.py", "--port", str(port), "--host", "127.0.0.1", *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
        log.close()

    request.addfinalizer(stop)
    url = f"http://127.0.0.1:{port}/"
    _wait_until_serving(url, proc, log_path)
    return url
