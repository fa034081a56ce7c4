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
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from engine.peers.endpoints import EndpointError
from engine.peers.server_process import ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[1]
SERVE_START_TIMEOUT_S = 300  # transformers serve imports and loads the model: ~15 s idle
VLLM_START_TIMEOUT_S = 900  # an eager vLLM starts in about 2 minutes on an idle 2-core CPU


class TestServer(ServerProcess):
    """The engine's ``ServerProcess`` for a test: a server that does not start fails the test
    with its log's tail."""

    def start(self, on_progress=None, timeout_s=None):
        try:
            return super().start(on_progress, timeout_s)
        except EndpointError as exc:
            pytest.fail(str(exc))

    def tail(self) -> str:
        return self.log_tail()


class TransformersServe(TestServer):
    """``transformers serve <model_dir>`` on 127.0.0.1 in its own process group."""

    NAME = "transformers serve"
    LOG_PREFIX = "transformers-serve-"
    START_TIMEOUT_S = SERVE_START_TIMEOUT_S

    def __init__(self, model_dir: str):
        super().__init__()
        self.model_dir = model_dir

    def command(self) -> list[str]:
        code = "from transformers.cli.transformers import main; main()"
        command = [sys.executable, "-c", code, "serve", self.model_dir, "--host", "127.0.0.1"]
        return command + ["--port", str(self.port), "--device", "cpu", "--dtype", "float32"]

    def environment(self) -> dict[str, str]:
        return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


class UserVllm(TestServer):
    """``python -m vllm.entrypoints.openai.api_server`` started as a user would: the recording
    scheduler named with ``--scheduler-cls``, this repository on ``PYTHONPATH`` and the record
    served at ``CBP_VLLM_RECORD_ADDRESS``; its own process group, stopped with it."""

    NAME = "vLLM"
    LOG_PREFIX = "user-vllm-"
    START_TIMEOUT_S = VLLM_START_TIMEOUT_S
    POLL_S = 1.0
    STOP_TIMEOUT_S = 60.0

    def __init__(self, model_dir: str):
        super().__init__()
        self.model_dir, self.api_port, self.record_port = model_dir, self.port, free_port()
        self.record_url = f"http://127.0.0.1:{self.record_port}"

    def command(self) -> list[str]:
        from engine.peers.vllm_server import vllm_python

        command = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server"]
        command += ["--model", self.model_dir, "--port", str(self.port), "--max-num-seqs", "3"]
        command += ["--scheduler-cls", "engine.peers.vllm_scheduler.RecordingScheduler"]
        # float32, as our engines run the embedded model: vLLM's "auto" runs a float32 model
        # in bfloat16, whose outputs differ from the float32 reference
        return command + ["--dtype", "float32", "--enforce-eager"]

    def environment(self) -> dict[str, str]:
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
            s = m.server_from_environment(cmd.get("port_offset", 0))
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
