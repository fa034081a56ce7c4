"""The local vLLM the peers' tests share: one eager server per session (each start costs minutes on
a small CPU), stopped when the session ends. Skipped without ``.venv-vllm`` (``needs_vllm``)."""

from __future__ import annotations

import pytest

NUM_SLOTS = 3


@pytest.fixture(scope="session")
def vllm(embedded_model):
    """``VllmEngine`` on the embedded model: 3 slots, eager, recording its schedule (default)."""
    from engine.peers.vllm_engine import VllmEngine

    engine = VllmEngine(embedded_model, NUM_SLOTS, enforce_eager=True).start()
    yield engine
    engine.close()
