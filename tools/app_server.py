"""``app.py`` as a local server process: a free 127.0.0.1 port, offline, a wait until it serves.

``python -m tools.page_gap`` times the page through it, and the tests' server fixtures
(``tests/server_kit.py``) start their servers with it. Failures raise ``RuntimeError`` with the
end of the server's log, so that a caller can show why. ``app.py`` runs in a session of its own
whose reaper (``server_process.REAPER``) ends it when the starting process dies without stopping
it (SIGTERM, SIGKILL).
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from engine import settings
from engine.peers.server_process import free_port, reap_with_owner

REPO_ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 300  # ~3 s from the safetensors cache, ~25 s on a first run; minutes busy
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
LOG_TAIL_CHARS = 3000  # how much of the server's log a failure quotes
STOP_TIMEOUT_S = 15.0  # app.py stops its own servers at SIGTERM


class AppProcess(subprocess.Popen):
    """``app.py``'s process, and the reaper that ends its process group if this process dies
    first (``stop`` ends the reaper too)."""

    reaper: subprocess.Popen | None = None


def wait_until_serving(url: str, proc: subprocess.Popen, log_path: Path) -> None:
    """Poll ``url`` until it answers 200.

    Raises:
        RuntimeError: the server exited, or did not answer within ``START_TIMEOUT_S``; the
            message quotes the end of its log.
    """
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text()[-LOG_TAIL_CHARS:]
            raise RuntimeError(f"app.py exited with {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    tail = log_path.read_text()[-LOG_TAIL_CHARS:]
    raise RuntimeError(f"app.py did not answer {url} within {START_TIMEOUT_S} s:\n{tail}")


def start_app(log_path: Path, args: tuple[str, ...] = ()) -> tuple[AppProcess, str]:
    """``app.py --port P --host 127.0.0.1 [args]``, offline, its output in ``log_path``.

    Returns the process and the page's URL once it answers 200.

    Raises:
        RuntimeError: as ``wait_until_serving`` (the process is killed first).
    """
    port = free_port()
    command = [sys.executable, "app.py", "--port", str(port), "--host", "127.0.0.1", *args]
    with log_path.open("w") as log:  # the child keeps its own copy of the file
        proc = AppProcess(
            command,
            cwd=REPO_ROOT,
            env=settings.environment(OFFLINE),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C or ``timeout`` reaches this process, not app.py
        )
    url = f"http://127.0.0.1:{port}/"
    try:
        proc.reaper = reap_with_owner(proc.pid, STOP_TIMEOUT_S)
        wait_until_serving(url, proc, log_path)
    except BaseException:  # Ctrl-C included: it no longer reaches app.py
        stop(proc)
        raise
    return proc, url


def stop(proc: AppProcess, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Terminate the server, and kill it if it does not end within ``timeout_s``; then its
    reaper."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)
    if proc.reaper is not None:
        proc.reaper.kill()
        proc.reaper.wait(timeout=timeout_s)
