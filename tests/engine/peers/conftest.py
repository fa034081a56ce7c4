"""The local vLLM the peers' tests share: one eager server (each start costs minutes on a small
CPU), stopped after the last test of this folder, not at the end of the session: the page's tests
that follow start vLLMs of their own, and on a 24 GiB machine an idle one left beside them (3 GB)
helped the suite run out of memory. Skipped without ``.venv-vllm`` (``needs_vllm``).

It is started as the page starts it: from a thread kept to one CPU, as the page's process keeps to
the CPUs its engines leave it (``engine.page.run.cpu_split``), computing on the other CPUs with a
thread each, as the page's local vLLM computes on the engines' CPUs, so the tests see what the
page's vLLM would (a vLLM thread spinning on the client's CPU reads its streams late).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from tests.live_servers import FolderServers

NUM_SLOTS = 3
SHARED = FolderServers(Path(__file__).parent)


@pytest.fixture(scope="session")
def vllm(embedded_model):
    """``VllmEngine`` on the embedded model: 3 slots, eager, recording its schedule (default);
    stopped once the tests leave this folder (``FolderServers``)."""
    from engine.peers.vllm_engine import VllmEngine

    engine = VllmEngine(embedded_model, NUM_SLOTS, enforce_eager=True, cpus=engine_cpus())
    on_page_cpu(engine.start)
    yield SHARED.keep(engine)
    engine.close()


def pytest_runtest_teardown(item, nextitem):
    """After this folder's last test, stop the shared vLLM."""
    SHARED.after(item, nextitem)


def page_cpu() -> set[int] | None:
    """The one CPU the page's process keeps to on this machine (its first), or None where there
    is no split (one CPU, or no affinity)."""
    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        return None
    return {min(os.sched_getaffinity(0))}


def engine_cpus() -> str | None:
    """The CPUs besides ``page_cpu()`` as vLLM's ``--cpus`` list ("1"), or None (every CPU) where
    there is no split."""
    page = page_cpu()
    if page is None:
        return None
    return ",".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0) - page))


def on_page_cpu(work):
    """``work()`` in a thread kept to ``page_cpu()``, as the page runs it; its result (or error)."""
    result: dict = {}

    def target():
        cpus = page_cpu()
        if cpus is not None:
            os.sched_setaffinity(0, cpus)  # 0: this thread, on Linux
        try:
            result["value"] = work()
        except BaseException as exc:  # noqa: BLE001  (re-raised in the caller's thread)
            result["error"] = exc

    thread = threading.Thread(target=target, name="page-cpu")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]
