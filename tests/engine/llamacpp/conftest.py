"""The llama.cpp servers the llama.cpp tests share: one ``llama-server`` per engine and session
(the F32 file is converted once, in about 30 s, and kept in the model cache), stopped after this
folder's last test (``FolderServers``). Skipped without ``make llamacpp``'s build
(``needs_llamacpp``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.workloads.workload import RequestSpec, tokenize_requests
from tests.live_servers import FolderServers

SHARED = FolderServers(Path(__file__).parent)

NUM_SLOTS = 2
# Two short greedy requests: quick on a 2-core CPU.
SPECS = [RequestSpec("The capital of France is", 12), RequestSpec("Water boils at", 16)]


def short_requests(loaded, specs=SPECS):
    """``specs`` tokenized for ``loaded`` (no chat template)."""
    context = loaded.max_context
    return tokenize_requests(specs, loaded.tokenizer, chat_template=False, max_context=context)


@pytest.fixture(scope="session")
def llamacpp(embedded_model):
    """The ``llamacpp`` engine (F32 GGUF) on the embedded model, 2 slots, started."""
    from engine.llamacpp.engines import LlamaCppEngine

    engine = LlamaCppEngine(embedded_model, NUM_SLOTS, requests=short_requests(embedded_model))
    engine.start()
    yield SHARED.keep(engine)
    engine.close()


@pytest.fixture(scope="session")
def llamacpp_q4(embedded_model):
    """The ``llamacpp_q4`` engine (the shipped Q4_1 GGUF), 2 slots, started."""
    from engine.llamacpp.engines import LlamaCppEngine

    requests = short_requests(embedded_model)
    engine = LlamaCppEngine(embedded_model, NUM_SLOTS, name="llamacpp_q4", requests=requests)
    engine.start()
    yield SHARED.keep(engine)
    engine.close()


def pytest_runtest_teardown(item, nextitem):
    """After this folder's last test, stop the shared llama.cpp servers."""
    SHARED.after(item, nextitem)
