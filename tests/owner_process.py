"""Owners for lifetime tests: a Python that starts a child (a local server, the engine process,
``app.py``), says its pid, and waits to be killed; and readers of ``/proc`` that tell whether a
process or a process group still lives (a zombie does not).

``start_owner(kind)`` runs ``run_owner(kind)`` in a process of its own: the test kills that
process as a service manager or ``timeout`` would, and checks that the child went with it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine.peers.server_process import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 600  # how long an owner, a stand-in server or a stand-in load waits: longer than a test

# answers /health, with a child of its own, as vLLM's API server has its engine core
HEALTH_SERVER = f"""
import http.server, subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep({WAIT_S})"])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


class StandInServer(ServerProcess):
    """A real server process of two processes that answers ``/health``: what every local server
    shares, without vLLM's minutes of start."""

    NAME = "stand-in server"
    POLL_S = 0.05

    def command(self) -> list[str]:
        return [sys.executable, "-c", HEALTH_SERVER, str(self.port)]


def slow_load(spec) -> None:
    """A model load that takes longer than any test (in the engine process)."""
    print("loading", flush=True)
    time.sleep(WAIT_S)


def _child(kind: str) -> tuple[object, int]:
    """Start the child ``kind`` names: the object that holds it, and its pid (a server's: its
    process group)."""
    if kind == "server":
        server = StandInServer().start()
        return server, server.proc.pid
    if kind == "engine process":
        from engine.worker.worker_process import ModelSpec, ProcessWorker

        worker = ProcessWorker(ModelSpec(slow_load))
        worker.start()
        return worker, worker.pid
    if kind == "app":
        from tools import app_server

        log_path = Path(tempfile.mkdtemp(prefix="cbp-owner-")) / "app.log"
        proc, _ = app_server.start_app(log_path)
        return proc, proc.pid
    raise ValueError(f"no child kind {kind!r}")


def run_owner(kind: str) -> None:
    """Start the child, print its pid, and wait to be killed (holding the child's object)."""
    child, pid = _child(kind)
    print(pid, flush=True)
    time.sleep(WAIT_S)
    print(child)


def read_line(owner: subprocess.Popen, timeout_s: float) -> str:
    """The owner's next line of output; "" if none came within ``timeout_s`` seconds (its
    output is unbuffered here, so a line is never waiting in a buffer that ``select`` misses)."""
    if not select.select([owner.stdout], [], [], timeout_s)[0]:
        return ""
    return owner.stdout.readline().decode().strip()


def start_owner(kind: str, timeout_s: float = 120.0) -> tuple[subprocess.Popen, int]:
    """An owner process of ``kind`` and its child's pid, read from its first line. Raises
    RuntimeError: no pid within ``timeout_s`` seconds (the owner is killed)."""
    code = f"from tests.owner_process import run_owner; run_owner({kind!r})"
    command = [sys.executable, "-c", code]
    owner = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, bufsize=0)
    line = read_line(owner, timeout_s)
    if not line.isdigit():
        owner.kill()
        raise RuntimeError(f"the {kind} owner did not start its child (exit {owner.wait()})")
    return owner, int(line)


@contextlib.contextmanager
def owner_of(kind: str, timeout_s: float = 120.0):
    """``start_owner(kind, timeout_s)``'s owner and child pid; on leaving, the owner and whatever
    a failing test left of the child are killed."""
    owner, pid = start_owner(kind, timeout_s)
    try:
        yield owner, pid
    finally:
        owner.kill()
        owner.wait()
        kill_left(pid)


def ends_with_owner(owner: subprocess.Popen, sig: signal.Signals, gone, timeout_s: float) -> bool:
    """Kill ``owner`` with ``sig``: whether it exited and ``gone()`` then became true, each
    within ``timeout_s`` seconds."""
    os.kill(owner.pid, sig)
    owner.wait(timeout=timeout_s)
    return wait_until(gone, timeout_s)


def _stats() -> list[tuple[int, str, int]]:
    """(pid, state, process group) of every process in /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        state, _, group = text.rpartition(")")[2].split()[:3]
        found.append((int(entry.name), state, int(group)))
    return found


def live_members(group: int) -> list[int]:
    """The pids of process group ``group`` that are not zombies."""
    return [pid for pid, state, pgid in _stats() if pgid == group and state != "Z"]


def lives(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    return any(p == pid and state != "Z" for p, state, _ in _stats())


def wait_until(gone, timeout_s: float) -> bool:
    """Whether ``gone()`` became true within ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while not gone():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def kill_left(pid: int) -> None:
    """SIGKILL what a failing test left: process ``pid`` and the process group it leads."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
