"""Shared test setup: no network, and one real model load shared by every test that needs it.

The Hugging Face hub is never reachable from the test machines, so offline mode is switched on
before anything imports transformers or huggingface_hub (both read it at import time).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402  (after the environment is set on purpose)

from engine.loader import LoadedModel, load_model  # noqa: E402


@pytest.fixture(scope="session")
def embedded_model() -> LoadedModel:
    """The embedded SmolLM2 on CPU (or $CBP_TEST_DEVICE), loaded once per test session."""
    return load_model(device=os.environ.get("CBP_TEST_DEVICE", "cpu"))
