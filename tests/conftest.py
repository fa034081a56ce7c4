"""Shared test setup: no network, one real model load, and an ``app.py`` server on a free port.

The Hugging Face hub is never reachable from the test machines, so offline mode is switched on
before anything imports transformers or huggingface_hub (both read it at import time).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# References stay in memory, so no test writes the user's cache (the store's tests switch it on)
os.environ.setdefault("CBP_REFERENCE_CACHE", "off")

import pytest  # noqa: E402  (after the environment is set on purpose)
from hypothesis import settings  # noqa: E402

# In CI (CI=true), property tests draw the same examples every run, so a verdict never depends on
# luck; elsewhere they keep exploring, and whatever they find becomes an @example.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

from server_kit import start_app_server  # noqa: E402
from tiny_model import tiny_runner  # noqa: E402

from engine.fidelity.reference import ReferenceCache  # noqa: E402
from engine.model.loader import LoadedModel, load_model  # noqa: E402
from engine.page.run.shared_model import PageModel, local_model  # noqa: E402
from engine.worker.worker_model import WorkerModel  # noqa: E402
from tests.live_servers import TransformersServe  # noqa: E402


@pytest.fixture()
def tiny_loaded(monkeypatch) -> LoadedModel:
    """A tiny random model, returned by every ``engine.model.loader.load_model`` call (CLI
    tests)."""
    loaded = tiny_runner().loaded
    monkeypatch.setattr("engine.model.loader.load_model", lambda *a, **k: loaded)
    return loaded


@pytest.fixture(scope="module")
def shared() -> PageModel:
    """A tiny-model ``PageModel`` on the engine thread per test module (a module may define its
    own instead)."""
    runner = tiny_runner()
    return local_model(WorkerModel(runner.loaded, runner, ReferenceCache(runner)))


@pytest.fixture(scope="session")
def embedded_model() -> LoadedModel:
    """The embedded SmolLM2 on CPU (or $CBP_TEST_DEVICE), loaded once per test session."""
    return load_model(device=os.environ.get("CBP_TEST_DEVICE", "cpu"))


@pytest.fixture(scope="module")
def server_url(request, tmp_path_factory) -> str:
    """``app.py`` on a free localhost port, offline; terminated when the module's tests end."""
    return start_app_server(request, tmp_path_factory)


@pytest.fixture(scope="module")
def serve(embedded_model) -> TransformersServe:
    """``transformers serve`` with the embedded model on 127.0.0.1, stopped when the module's
    tests end: the real OpenAI-compatible server of the endpoint tests."""
    server = TransformersServe(embedded_model.source).start()
    yield server
    server.stop()
