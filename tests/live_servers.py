"""Real OpenAI-compatible servers for tests: ``transformers serve``, a local vLLM and a local
llama.cpp, on 127.0.0.1.

Tests of the server engines run against real servers, never a mock. ``transformers serve`` ships
with the transformers we pin (its extras: fastapi, uvicorn, pydantic and openai, all in the test
requirements) and serves the embedded model's safetensors folder. vLLM comes from ``.venv-vllm``
(``make vllm``); without it the vLLM tests are skipped, saying so. llama.cpp's ``llama-server``
comes from ``.llamacpp`` (``make llamacpp``); without it the llama.cpp tests are skipped, saying so.
"""

from __future__ import annotations

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

SERVE_START_TIMEOUT_S = 300  # transformers serve imports and loads the model: ~15 s idle


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TransformersServe:
    """``transformers serve <model_dir>`` on 127.0.0.1 in its own process group."""

    def __init__(self, model_dir: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="transformers-serve-", suffix=".log")
        code = "from transformers.cli.transformers import main; main()"
        self.command = [sys.executable, "-c", code, "serve", model_dir, "--host", "127.0.0.1"]
        self.command += ["--port", str(self.port), "--device", "cpu", "--dtype", "float32"]
        self.proc: subprocess.Popen | None = None

    def start(self) -> TransformersServe:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        self.proc = subprocess.Popen(
            self.command, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        deadline = time.monotonic() + SERVE_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"transformers serve exited {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        pytest.fail(f"transformers serve did not start in time:\n{self.tail()}")

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
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


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
