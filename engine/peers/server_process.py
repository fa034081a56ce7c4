"""A local server process started and stopped from here: vLLM's and llama.cpp's alike.

One process group on 127.0.0.1, its log in a temporary file (quoted in every error), healthy at
``/health`` 200, stopped whole at the latest at exit, and by its reaper (``REAPER``) when this
process dies without exiting (SIGTERM, SIGKILL). ``start`` widens the starting thread's CPU
affinity to the server's, which the child inherits (docs/measurements.md).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from engine.peers.endpoints import EndpointError


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# The reaper of a process group, ``python -I -S -c REAPER OWNER GROUP GRACE_S`` (standard library
# only, in a session of its own): while its parent is OWNER it waits; once it is not (the owner
# died, however: atexit runs neither at SIGTERM nor at SIGKILL) it SIGTERMs GROUP and SIGKILLs
# what is left after GRACE_S seconds. It exits by itself once the group is gone.
REAPER = """
import os, signal, sys, time
owner, group, grace_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
def alive():
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
def send(sig):
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        pass
while alive() and os.getppid() == owner:
    time.sleep(0.25)
if alive():
    print(f"the owner {owner} is gone: ending process group {group}", flush=True)
    send(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while alive() and time.monotonic() < deadline:
        time.sleep(0.25)
    send(signal.SIGKILL)
"""


def reap_with_owner(group: int, grace_s: float, log=None) -> subprocess.Popen | None:
    """Start the ``REAPER`` of process group ``group`` for this process, its one line to ``log``
    (a file); None where the system has no process groups."""
    if not hasattr(os, "killpg"):
        return None
    command = [sys.executable, "-I", "-S", "-c", REAPER, str(os.getpid()), str(group), str(grace_s)]
    return subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
    )


# A starting server's log line -> the stage it names, the first pattern found winning, from the
# words of vLLM's and llama.cpp's own start logs. Lines that name no stage (banners, warnings,
# progress bars' tails) leave the stage as it was.
START_STAGES = (
    (re.compile(r"\bwarming up|warmup model|Capturing|graph captur", re.I), "warming up"),
    (re.compile(r"\bCompiling|compiled graph|Dynamo bytecode", re.I), "compiling"),
    (
        re.compile(
            r"load(ing)? (model|weights|safetensors)|checkpoint shards|load_tensors|"
            r"llama_model_load|model_loader|Starting to load model|Initializing model",
            re.I,
        ),
        "loading weights",
    ),
    (
        re.compile(r"Initializing a|non-default args|Resolved architecture|system_info", re.I),
        "setting up",
    ),
    (re.compile(r"KV cache|kv_cache|llama_context|KV self size", re.I), "sizing the KV cache"),
    (
        re.compile(
            r"Started server process|application startup|Uvicorn running|"
            r"Available routes|server is listening|HTTP server listening",
            re.I,
        ),
        "opening its API",
    ),
)


def start_stage(line: str) -> str | None:
    """The start stage a vLLM or llama.cpp log line names, for a person; None when none."""
    return next((stage for pattern, stage in START_STAGES if pattern.search(line)), None)


def cpus_of(bind: str) -> set[int]:
    """CPUs of a ``VLLM_CPU_OMP_THREADS_BIND`` list ("0-3", "0,2,5-7"). Raises ValueError: a bad
    part."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in bind.split(","))):
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            raise ValueError(f"{bind!r}: give CPU numbers and ranges, e.g. 0-3 or 0,2,5-7")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


@contextlib.contextmanager
def thread_on_cpus(cpus: set[int]):
    """Widen the calling thread's affinity to ``cpus`` inside the block, put back after; nothing off
    Linux or where the system refuses."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)  # 0: the calling thread, on Linux
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:
        yield
        return
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


class ServerProcess:
    NAME = "the server"  # as messages name it
    LOG_PREFIX = "server-"
    POLL_S = 0.5
    START_TIMEOUT_S = 300.0
    STOP_TIMEOUT_S = 30.0
    TAIL_LINES = 30  # of the log, quoted in errors

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.version: str | None = None
        self.start_s: float | None = None  # seconds start() took
        self.proc: subprocess.Popen | None = None
        self._reaper: subprocess.Popen | None = None  # ends the group if this process dies
        self._log = None  # the server's stdout and stderr, from start() to stop()
        self.log_path: Path | None = None

    # --- what a subclass says ---------------------------------------------------------------------

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str] | None:
        return None

    def cpus(self) -> set[int]:
        """The CPUs the server computes on (empty: the starting thread's)."""
        return set()

    def _on_healthy(self, client: httpx.Client) -> None:
        """Read what a healthy server publishes (its version, its settings)."""

    def _fatal(self) -> str | None:
        """Why the server will never be healthy, read from its log (None: no such line yet)."""
        return None

    def exit_message(self, when: str) -> str:
        code = None if self.proc is None else self.proc.poll()
        return f"{self.NAME} exited with code {code} {when}:\n{self.log_tail()}"

    def _cleanup(self) -> None:
        """After the process group is gone: remove what the server left (``stop``)."""

    # --- the process ------------------------------------------------------------------------------

    def start(
        self, on_progress: Callable[[str], None] | None = None, timeout_s: float | None = None
    ):
        """Start the server and wait until ``/health`` answers 200; returns ``self``. Raises
        EndpointError: it exited, its log said it never will be healthy, or it was not healthy
        within ``timeout_s`` (default ``START_TIMEOUT_S``); the group is stopped."""
        t0 = time.perf_counter()
        timeout_s = self.START_TIMEOUT_S if timeout_s is None else timeout_s
        command, env = self.command(), self.environment()
        self._log = tempfile.NamedTemporaryFile(prefix=self.LOG_PREFIX, suffix=".log", delete=False)
        self.log_path = Path(self._log.name)
        with thread_on_cpus(self.cpus()):  # the child inherits it
            self.proc = subprocess.Popen(
                command, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        atexit.register(self.stop)  # a Python that exits without stop() still stops the server
        try:
            self._reaper = reap_with_owner(self.proc.pid, self.STOP_TIMEOUT_S, self._log)
            self._wait_healthy(t0 + timeout_s, on_progress)
        except BaseException:
            self.stop()
            raise
        self.start_s = time.perf_counter() - t0
        return self

    def _wait_healthy(self, deadline: float, on_progress) -> None:
        last = None
        with httpx.Client(base_url=self.url, timeout=httpx.Timeout(2.0)) as client:
            while True:
                self._check_alive(deadline)
                line = self.log_tail(1)
                if on_progress is not None and line and line != last:
                    on_progress(line)
                    last = line
                try:
                    if client.get("/health").status_code == 200:
                        self._on_healthy(client)
                        return
                except (httpx.HTTPError, ValueError):
                    pass
                time.sleep(self.POLL_S)

    def _check_alive(self, deadline: float) -> None:
        if self.proc.poll() is not None:
            raise EndpointError(self.exit_message("while starting"))
        fatal = self._fatal()
        if fatal is not None:
            raise EndpointError(f"{fatal}:\n{self.log_tail()}")
        if time.perf_counter() > deadline:
            raise EndpointError(f"{self.NAME} was not healthy in time:\n{self.log_tail()}")

    def log_tail(self, num_lines: int | None = None) -> str:
        try:
            text = self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return ""
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return "\n".join(lines[-(num_lines or self.TAIL_LINES) :])

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float | None = None) -> None:
        """SIGTERM the process group, then SIGKILL what is left after ``timeout_s``."""
        if self.proc is None:
            return
        timeout_s = self.STOP_TIMEOUT_S if timeout_s is None else timeout_s
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait(timeout=timeout_s)
        self._signal(signal.SIGKILL)  # children that outlived the main process
        self._end_reaper()
        self._log.close()
        self.log_path.unlink(missing_ok=True)  # its tail is in any error already raised
        self._cleanup()
        self.proc = None
        atexit.unregister(self.stop)

    def _end_reaper(self) -> None:
        if self._reaper is not None:
            self._reaper.kill()
            self._reaper.wait(timeout=self.STOP_TIMEOUT_S)
            self._reaper = None

    def kill(self) -> None:
        """SIGKILL the whole server at once, as a crash would (tests)."""
        if self.proc is not None:
            self._signal(signal.SIGKILL)
            self.proc.wait(timeout=self.STOP_TIMEOUT_S)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
