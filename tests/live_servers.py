"""Real OpenAI-compatible servers for tests: ``transformers serve``, a local vLLM and a local
llama.cpp, on 127.0.0.1.

Tests of the server engines run against real servers, never a mock. ``transformers serve`` ships
with the transformers we pin (its extras: fastapi, uvicorn, pydantic and openai, all in the test
requirements) and serves the embedded model's safetensors folder. vLLM comes from ``.venv-vllm``
(``make vllm``); without it the vLLM tests are skipped, saying so. ``UserVllm`` starts one as a
user would, serving its record over HTTP. ``RecordHelper`` serves record rings as the recording
scheduler does, in a process of vLLM's environment, without vLLM. llama.cpp's ``llama-server``
comes from ``.llamacpp`` (``make llamacpp``); without it the llama.cpp tests are skipped, saying so.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVE_START_TIMEOUT_S = 300  # transformers serve imports and loads the model: ~15 s idle
VLLM_START_TIMEOUT_S = 900  # an eager vLLM starts in about 2 minutes on an idle 2-core CPU


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """An OpenAI-compatible server started as its own process group on 127.0.0.1: ``start``
    waits for ``/health`` (failing the test with the log's tail if it exits or times out),
    ``stop`` sends SIGTERM and, after ``stop_wait_s``, SIGKILL. A subclass sets ``name``,
    ``start_timeout_s``, ``poll_s``, ``stop_wait_s``, ``url``, ``command`` and ``env()``."""

    name = "server"
    start_timeout_s = 300.0
    poll_s = 0.5
    stop_wait_s = 30.0

    def __init__(self, url: str, command: list[str], log_prefix: str):
        self.url, self.command = url, command
        self.log = tempfile.NamedTemporaryFile(prefix=log_prefix, suffix=".log")
        self.proc: subprocess.Popen | None = None

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def start(self):
        self.proc = subprocess.Popen(
            self.command,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=self.env(),
            start_new_session=True,
        )
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"{self.name} exited {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(self.poll_s)
        self.stop()
        pytest.fail(f"{self.name} did not start in time:\n{self.tail()}")

    def tail(self) -> str:
        return Path(self.log.name).read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        """SIGKILL the server's process group, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=self.stop_wait_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


class TransformersServe(ServerProcess):
    """``transformers serve <model_dir>`` on 127.0.0.1 in its own process group."""

    name = "transformers serve"
    start_timeout_s = SERVE_START_TIMEOUT_S

    def __init__(self, model_dir: str):
        self.port = free_port()
        code = "from transformers.cli.transformers import main; main()"
        command = [sys.executable, "-c", code, "serve", model_dir, "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--device", "cpu", "--dtype", "float32"]
        super().__init__(f"http://127.0.0.1:{self.port}", command, "transformers-serve-")

    def env(self) -> dict[str, str]:
        return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


class UserVllm(ServerProcess):
    """``python -m vllm.entrypoints.openai.api_server`` started as a user would: the recording
    scheduler named with ``--scheduler-cls``, this repository on ``PYTHONPATH`` and the record
    served at ``CBP_VLLM_RECORD_ADDRESS``; its own process group, stopped with it."""

    name = "vLLM"
    start_timeout_s = VLLM_START_TIMEOUT_S
    poll_s = 1.0
    stop_wait_s = 60.0

    def __init__(self, model_dir: str):
        from engine.peers.vllm_server import vllm_python

        self.api_port, self.record_port = free_port(), free_port()
        self.record_url = f"http://127.0.0.1:{self.record_port}"
        command = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server"]
        command += ["--model", model_dir, "--port", str(self.api_port), "--max-num-seqs", "3"]
        command += ["--scheduler-cls", "engine.peers.vllm_scheduler.RecordingScheduler"]
        # float32, as our engines run the embedded model: vLLM's "auto" runs a float32 model
        # in bfloat16, whose outputs differ from the float32 reference
        command += ["--dtype", "float32", "--enforce-eager"]
        super().__init__(f"http://127.0.0.1:{self.api_port}", command, "user-vllm-")

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CBP_VLLM_")}
        env |= {"PYTHONPATH": str(ROOT), "CBP_VLLM_RECORD_ADDRESS": f"127.0.0.1:{self.record_port}"}
        # on a CPU: a 1 GiB KV cache, every core computing (vLLM's defaults size the cache from
        # the machine's memory and keep a core for itself)
        env |= {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
        env |= {"VLLM_CPU_OMP_THREADS_BIND": f"0-{(os.cpu_count() or 1) - 1}"}
        return env


def _found(locate) -> bool:
    """Whether ``locate()`` finds what it looks for (it raises ValueError when it does not)."""
    try:
        locate()
    except ValueError:
        return False
    return True


def vllm_available() -> bool:
    """True when ``.venv-vllm`` (``make vllm``) or ``$CBP_VLLM_VENV`` holds a Python."""
    from engine.peers.vllm_server import vllm_python

    return _found(vllm_python)


NO_VLLM = "vLLM's environment .venv-vllm is missing: build it with `make vllm` (CI does)"
needs_vllm = pytest.mark.skipif(not vllm_available(), reason=NO_VLLM)


def llamacpp_available() -> bool:
    """True when ``make llamacpp`` built ``llama-server`` (or ``$CBP_LLAMACPP_DIR`` holds one)."""
    from engine.llamacpp.server import server_binary

    return _found(server_binary)


NO_LLAMACPP = "llama.cpp's llama-server is not built: build it with `make llamacpp` (CI does)"
needs_llamacpp = pytest.mark.skipif(not llamacpp_available(), reason=NO_LLAMACPP)


class FolderServers:
    """Servers one test folder shares, stopped after that folder's last test rather than at the
    end of the session (a folder without ``__init__.py`` has no package scope): the suite's later
    tests start servers of their own, and idle ones left beside them ran a 24 GiB machine out of
    memory. Its conftest keeps each server (``keep``) and calls ``after`` from its
    ``pytest_runtest_teardown`` hook; a server's ``close`` may then run twice (harmless here)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._open: list = []

    def keep(self, server):
        """``server`` (anything with ``close()``), closed after the folder's last test."""
        self._open.append(server)
        return server

    def after(self, item, nextitem) -> None:
        """A test here ended: close the servers if the next test is elsewhere (or none)."""
        if nextitem is None or self.folder not in Path(nextitem.path).parents:
            while self._open:
                self._open.pop().close()


# The record servers' helper: one JSON command a line on stdin, one JSON answer a line on stdout.
# It loads the scheduler's module by name, as vLLM does.
RECORD_HELPER = """
import importlib, json, os, sys
m = importlib.import_module("engine.peers.vllm_scheduler")
servers = {}
for text in sys.stdin:
    cmd = json.loads(text)
    try:
        if cmd["op"] == "serve":
            s = m.RecordServer(cmd["address"], cmd.get("token", ""), cmd.get("max_num_steps", 4096))
        elif cmd["op"] == "env":
            os.environ.update(cmd["env"])
            for name in cmd.get("unset", []):
                os.environ.pop(name, None)
            s = m.server_from_environment(1, cmd.get("port_offset", 0))
        elif cmd["op"] == "dp":  # the rank and size the scheduler finds in a config
            ns = __import__("types").SimpleNamespace
            rank, size = m._data_parallel(ns(parallel_config=ns(**cmd["parallel"])))
            out = {"rank": rank, "size": size}
        if cmd["op"] in ("serve", "env"):
            servers[getattr(s, "port", None)] = s
            out = s and {"port": s.port, "host": s.host, "max_num_steps": s.ring.max_num_steps}
        elif cmd["op"] == "lines":
            ring = servers[cmd["port"]].ring
            for line in cmd["lines"]:
                ring.set_start(line) if '"event":"start"' in line else ring.append(line)
            out = {}
        elif cmd["op"] == "close":
            servers.pop(cmd["port"]).close()
            out = {}
    except ValueError as exc:
        out = {"error": str(exc)}
    print(json.dumps(out), flush=True)
"""


class RecordHelper:
    """The record servers' helper process, in vLLM's environment: ``serve`` a ring, ``feed``
    it lines, ``close`` it; ``stop`` the process."""

    def __init__(self):
        from engine.peers.vllm_server import vllm_python

        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [str(vllm_python()), "-c", RECORD_HELPER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )

    def ask(self, **cmd) -> dict | None:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, "the helper process in vLLM's environment died"
        return json.loads(answer)

    def serve(self, address: str = "127.0.0.1:0", **kw) -> str:
        answer = self.ask(op="serve", address=address, **kw)
        assert "error" not in answer, answer["error"]
        return f"http://{answer['host']}:{answer['port']}"

    def feed(self, url: str, records: list) -> None:
        lines = [r if isinstance(r, str) else record_line(r) for r in records]
        self.ask(op="lines", port=httpx.URL(url).port, lines=lines)

    def close(self, url: str) -> None:
        self.ask(op="close", port=httpx.URL(url).port)

    def stop(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def record_line(record: dict) -> str:
    return json.dumps(record, separators=(",", ":"))
