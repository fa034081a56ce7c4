"""A local ``llama-server`` on a GGUF file, started and stopped from here.

``make llamacpp`` builds llama.cpp's server into ``.llamacpp`` (``CBP_LLAMACPP_DIR`` points
elsewhere). ``LlamaServer`` starts it on 127.0.0.1 and a free port (or a given one) with
``--parallel`` equal to the slot count and a context per slot sized to the longest request
(``--ctx-size`` is the whole KV cache, split evenly between the slots); waits for ``/health``;
and stops it with its process group, at the latest when this Python exits (``atexit``). Its log
is kept in a temporary file while it runs, and every error quotes its tail. Once healthy, its
``/props`` says what it runs with (``props``): its build, its slots (``total_slots``) and each
slot's context (``default_generation_settings.n_ctx``: llama.cpp rounds the context up to a
multiple of 256 tokens, so a slot may hold more than asked).

Threads are set as ours and vLLM's are: every CPU computes (``--threads`` and
``--threads-batch`` = the CPUs of ``cpus``), and the process starts with the starting thread's
affinity widened to those CPUs (``engine.peers.vllm_server.thread_on_cpus``), since a child
inherits it and the page's process keeps to fewer. ``--metrics`` publishes the gauges the
server chart reads; ``--alias`` names the served model after the loaded one, so the client
sends token ids both ways and checks outputs against the reference.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from engine import settings as env_settings
from engine.peers.endpoints import Endpoint, EndpointError, MissingBuild
from engine.peers.vllm_server import cpus_of, free_port, thread_on_cpus

LLAMACPP_DIR_ENV = "CBP_LLAMACPP_DIR"
REPO_ROOT = Path(__file__).resolve().parents[2]  # engine/llamacpp/server.py -> the repository
SERVER_BINARY = Path("build") / "bin" / "llama-server"
START_TIMEOUT_S = 300.0  # SmolLM2-135M loads in about a second; a busy machine takes longer
STOP_TIMEOUT_S = 10.0
POLL_S = 0.2
CTX_PER_SLOT = 2048  # tokens per slot when the requests are not known (vLLM's max_model_len)
BIND_FAILED = "couldn't bind HTTP server socket"  # llama-server's words for a port in use


def llamacpp_dir() -> Path:
    """The folder ``make llamacpp`` fills (``CBP_LLAMACPP_DIR``, else the repository's
    ``.llamacpp``)."""
    return Path(env_settings.value(LLAMACPP_DIR_ENV) or REPO_ROOT / ".llamacpp").expanduser()


def server_binary(binary: str | os.PathLike | None = None) -> Path:
    """The ``llama-server`` to start: ``binary``, else the one ``make llamacpp`` built.

    Raises:
        MissingBuild: no executable there, saying how to build it.
    """
    path = Path(binary) if binary is not None else llamacpp_dir() / SERVER_BINARY
    if not (path.is_file() and os.access(path, os.X_OK)):
        build = "build it with `make llamacpp` (cmake and a C++ compiler; minutes, once)."
        raise MissingBuild(
            f"llama.cpp's server {path} is missing; {build}", f"no llama-server here; {build}"
        )
    return path


@dataclass(frozen=True)
class LlamaSettings:
    """How the server runs; ``describe`` is what the bench reports."""

    model_path: str  # the GGUF file
    weights: str  # "f32" or "q4_1": what the file holds
    alias: str  # the served model's name (the loaded model's folder name)
    num_slots: int  # --parallel: = our slot count
    ctx_per_slot: int = CTX_PER_SLOT  # tokens one slot holds: its longest request
    cpus: str = f"0-{(os.cpu_count() or 1) - 1}"  # the CPUs it computes on, e.g. "0-1"

    @property
    def dtype(self) -> str:
        """The precision its outputs are compared in: "float32", its activations and logits on
        a CPU whichever weights it multiplies (its KV cache is llama.cpp's default, F16)."""
        return "float32"

    def args(self, port: int) -> list[str]:
        """The server's command-line flags."""
        threads = str(len(cpus_of(self.cpus)))
        args = ["--model", self.model_path, "--alias", self.alias]
        args += ["--host", "127.0.0.1", "--port", str(port), "--parallel", str(self.num_slots)]
        args += ["--ctx-size", str(self.num_slots * self.ctx_per_slot)]
        args += ["--threads", threads, "--threads-batch", threads, "--metrics", "--no-webui"]
        return args

    def describe(self) -> dict:
        return asdict(self)


def settings_for(
    model_path, weights: str, alias: str, num_slots: int, requests=None
) -> LlamaSettings:
    """Settings for ``num_slots`` slots, each sized to the longest of ``requests`` (prompt and
    output tokens; ``CTX_PER_SLOT`` when they are not given).

    Raises:
        ValueError: fewer than one slot.
    """
    if num_slots < 1:
        raise ValueError("llama.cpp needs at least 1 slot (--parallel).")
    lengths = [r.num_prompt_tokens + r.max_new_tokens for r in requests or []]
    ctx = max(lengths) if lengths else CTX_PER_SLOT
    return LlamaSettings(str(model_path), weights, alias, num_slots, ctx)


def published_props(props: dict) -> dict:
    """``{"total_slots": slots, "n_ctx": tokens per slot}`` from llama-server's ``/props``
    answer, each left out where missing or not a positive count."""
    n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
    found = {"total_slots": props.get("total_slots"), "n_ctx": n_ctx}
    return {k: v for k, v in found.items() if isinstance(v, int) and v > 0}


class LlamaServer:
    """One ``llama-server`` process. Use ``with LlamaServer(...) as server:`` or start/stop."""

    def __init__(self, settings: LlamaSettings, binary=None, port: int | None = None):
        """``binary``: the server to start (default: ``make llamacpp``'s); ``port``: where it
        listens (default: a free one). Raises ValueError: no such binary."""
        self.settings = settings
        self.binary = server_binary(binary)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.version: str | None = None  # llama.cpp's build, from /props
        self.props: dict = {}  # {"total_slots", "n_ctx"} from /props (``published_props``)
        self.start_s: float | None = None  # seconds start() took
        self.proc: subprocess.Popen | None = None
        self._log = None  # the server's stdout and stderr, from start() to stop()
        self.log_path: Path | None = None

    def endpoint(self, name: str) -> Endpoint:
        return Endpoint(name, self.url)

    def info(self) -> dict:
        """Version, URL, start time and what ``/props`` published, as the bench reports them."""
        return {
            "version": self.version,
            "url": self.url,
            "start_s": self.start_s,
            "props": dict(self.props),
        }

    def start(
        self, on_progress: Callable[[str], None] | None = None, timeout_s: float = START_TIMEOUT_S
    ) -> LlamaServer:
        """Start the server and wait until ``/health`` answers 200.

        Raises:
            EndpointError: it exited (the port in use, a bad file: with the log's tail) or was
                not healthy within ``timeout_s``; the process is stopped then.
        """
        t0 = time.perf_counter()
        command = [str(self.binary), *self.settings.args(self.port)]
        self._log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)
        self.log_path = Path(self._log.name)
        with thread_on_cpus(cpus_of(self.settings.cpus)):  # the child inherits it
            self.proc = subprocess.Popen(
                command, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
            )
        atexit.register(self.stop)
        try:
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
                if self.proc.poll() is not None:
                    raise EndpointError(self.exit_message("while starting"))
                if time.perf_counter() > deadline:
                    raise EndpointError(f"llama-server was not healthy in time:\n{self.log_tail()}")
                line = self.log_tail(1)
                if on_progress is not None and line and line != last:
                    on_progress(line)
                    last = line
                try:
                    if client.get("/health").status_code == 200:
                        props = client.get("/props").json() or {}
                        self.version, self.props = props.get("build_info"), published_props(props)
                        return
                except (httpx.HTTPError, ValueError):
                    pass
                time.sleep(POLL_S)

    def exit_message(self, when: str) -> str:
        """Why the server is gone, for a person: the port in use, or its exit code and log."""
        log = self.log_tail()
        if BIND_FAILED in log:
            return (
                f"llama-server could not listen on 127.0.0.1:{self.port}: the port is in use "
                f"by another program; pick another port or stop that one.\n{log}"
            )
        code = None if self.proc is None else self.proc.poll()
        return f"llama-server exited with code {code} {when}:\n{log}"

    def log_tail(self, num_lines: int = 20) -> str:
        """The last ``num_lines`` non-blank lines the server wrote."""
        try:
            text = self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return ""
        return "\n".join([ln for ln in text.splitlines() if ln.strip()][-num_lines:])

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM the server's process group, then SIGKILL it after ``timeout_s``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait(timeout=timeout_s)
        self._log.close()
        self.log_path.unlink(missing_ok=True)  # its tail is in any error already raised
        self.proc = None
        atexit.unregister(self.stop)

    def kill(self) -> None:
        """SIGKILL the server at once, as a crash would (tests of a server dying)."""
        if self.proc is not None:
            self._signal(signal.SIGKILL)
            self.proc.wait(timeout=STOP_TIMEOUT_S)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
