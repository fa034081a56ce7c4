"""A room's clients and browsers keep to the page's CPUs, off the engines' (``room_load``)."""

from __future__ import annotations

import os
import subprocess
import threading

import pytest

from tools.room.session import as_remote, clients_cpus

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux CPU sets and two CPUs or more",
)


@pytest.fixture
def page():
    """A stand-in for the page's process (a sleeping child), to set and read its CPU set."""
    proc = subprocess.Popen(["sleep", "30"])
    yield proc
    proc.kill()
    proc.wait()


def test_the_clients_get_the_pages_cpus_when_it_keeps_off_some(page):
    first = min(os.sched_getaffinity(0))
    os.sched_setaffinity(page.pid, {first})
    assert clients_cpus(page.pid) == {first}


def test_the_clients_are_not_kept_when_the_page_has_every_cpu(page):
    assert clients_cpus(page.pid) is None


def test_a_remote_client_and_the_threads_it_starts_keep_to_its_cpus():
    """Linux keeps the CPU set per thread: the client's thread and those it starts (gradio_client's,
    Chromium's) have it; the caller's thread keeps its own."""
    cpus = {min(os.sched_getaffinity(0))}
    before = os.sched_getaffinity(0)
    seen = {}

    def client():
        seen["client"] = os.sched_getaffinity(0)
        child = threading.Thread(target=lambda: seen.update(child=os.sched_getaffinity(0)))
        child.start()
        child.join()

    thread = threading.Thread(target=as_remote(client, cpus))
    thread.start()
    thread.join()
    assert seen == {"client": cpus, "child": cpus}
    assert os.sched_getaffinity(0) == before
