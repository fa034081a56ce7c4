"""Shared test setup: no network, one real model load, and an ``app.py`` server on a free port.

The Hugging Face hub is never reachable from the test machines, so offline mode is switched on
before anything imports transformers or huggingface_hub (both read it at import time).
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

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402  (after the environment is set on purpose)
from hypothesis import settings  # noqa: E402

# In CI (CI=true), property tests draw the same examples every run, so a verdict never depends on
# luck; elsewhere they keep exploring, and whatever they find becomes an @example.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

from tiny_model import tiny_runner  # noqa: E402

from engine.loader import LoadedModel, load_model  # noqa: E402
from engine.playground import SharedModel  # noqa: E402
from engine.reference import ReferenceCache  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
SERVER_START_TIMEOUT_S = 120  # ~3 s from the safetensors cache, ~25 s on a first run


@pytest.fixture()
def tiny_loaded(monkeypatch) -> LoadedModel:
    """A tiny random model, returned by every ``engine.loader.load_model`` call (CLI tests)."""
    loaded = tiny_runner().loaded
    monkeypatch.setattr("engine.loader.load_model", lambda *a, **k: loaded)
    return loaded


@pytest.fixture(scope="module")
def shared() -> SharedModel:
    """A tiny-model ``SharedModel`` per test module (a module may define its own instead)."""
    runner = tiny_runner()
    return SharedModel(runner.loaded, runner, ReferenceCache(runner))


@pytest.fixture(scope="session")
def embedded_model() -> LoadedModel:
    """The embedded SmolLM2 on CPU (or $CBP_TEST_DEVICE), loaded once per test session."""
    return load_model(device=os.environ.get("CBP_TEST_DEVICE", "cpu"))


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


@pytest.fixture(scope="module")
def server_url(request, tmp_path_factory) -> str:
    """``app.py`` on a free localhost port, offline; terminated when the module's tests end."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("server") / "app.log"
    log = log_path.open("w")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "app.py", "--port", str(port), "--host", "127.0.0.1"],
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
