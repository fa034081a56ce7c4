"""The CPUs split between the engines and the page: the setting, and a worker kept to its CPUs.

``cpu_split`` is read from ``CBP_ENGINE_CPUS`` against a given list of CPUs; the worker test
spawns an engine process on the tiny model, kept to one CPU, and asks it where it runs.
"""

from __future__ import annotations

import os

import pytest
import torch
from tiny_model import make_requests, tiny_worker_model

from engine.fidelity import reference_store
from engine.fidelity.reference import ReferenceCache
from engine.page.run.cpu_split import CpuSplit, cpu_split
from engine.page.run.shared_model import PageModel
from engine.serving.run_control import RunControl
from engine.worker.worker_process import ModelSpec, ProcessWorker

FOUR = (0, 1, 2, 3)
SPECS = [("hello world", 4), ("the quick brown fox", 3)]
TWO_CPUS = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs CPU affinity and two CPUs",
)


@pytest.mark.parametrize(
    ("value", "available", "engine", "page"),
    [
        ("", (0, 1), (1,), (0,)),  # auto by default: all but the first
        ("auto", FOUR, (1, 2, 3), (0,)),
        ("2", FOUR, (2, 3), (0, 1)),
        ("1", (0, 1), (1,), (0,)),
        (" AUTO ", (5, 3), (5,), (3,)),  # numbered as the system names them, sorted
    ],
)
def test_the_setting_splits_the_cpus(value, available, engine, page):
    """auto leaves the page the first CPU; a count gives the engines the last N."""
    split = cpu_split({"CBP_ENGINE_CPUS": value}, available)
    assert split == CpuSplit(engine=engine, page=page)


@pytest.mark.parametrize(("value", "available"), [("all", FOUR), ("auto", (0,)), ("", ())])
def test_no_split_when_asked_or_with_one_cpu(value, available):
    """all shares every CPU; one CPU (or none known) cannot be split."""
    assert cpu_split({"CBP_ENGINE_CPUS": value}, available) is None


@pytest.mark.parametrize(
    ("value", "available", "message"),
    [
        ("4", FOUR, r"'4': give auto, all or a number of CPUs from 1 to 3"),
        ("0", FOUR, r"'0': give auto, all or a number of CPUs from 1 to 3"),
        ("half", FOUR, r"'half': give auto, all or a number"),
        ("1", (0,), r"'1': give auto, all or a number of CPUs \(this host has one CPU\)"),
    ],
)
def test_a_bad_setting_is_refused_by_name(value, available, message):
    """A count that leaves the page no CPU, or a word, raises ValueError naming the variable."""
    with pytest.raises(ValueError, match="CBP_ENGINE_CPUS=" + message):
        cpu_split({"CBP_ENGINE_CPUS": value}, available)


def test_the_split_is_described_for_the_page():
    """The log line and the model line say which CPUs and how many threads."""
    split = CpuSplit(engine=(1, 2, 3), page=(0,))
    assert split.describe() == "engines on CPUs 1-3 (3 threads), the page on CPU 0"
    assert split.short() == "engines on 3 of 4 CPUs"
    assert CpuSplit(engine=(1,), page=(0,)).describe() == (
        "engines on CPU 1 (1 thread), the page on CPU 0"
    )


def where_i_run(_model, _watch):
    """A job (module level: the worker imports it by name): its CPUs and torch threads."""
    return sorted(os.sched_getaffinity(0)), torch.get_num_threads()


@TWO_CPUS
def test_a_worker_keeps_to_its_cpus_with_a_thread_each():
    """An engine process given the last CPU runs there with one torch thread; the page's own
    CPUs are left as they were."""
    last = max(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    worker = ProcessWorker(ModelSpec(model="tiny", load=tiny_worker_model), cpus=(last,))
    try:
        worker.start()
        cpus, threads = worker.run(where_i_run, (), RunControl(), lambda *a, **k: None)
        assert cpus == [last]
        assert threads == 1
        assert os.sched_getaffinity(worker.pid) == {last}
    finally:
        worker.close()
    assert os.sched_getaffinity(0) == before


def stored_tiny_shared(spec=None):
    """``tiny_worker_model`` with the host's reference store (``CBP_CACHE_DIR``), as a page has
    it."""
    shared = tiny_worker_model(spec)
    shared.reference = ReferenceCache(shared.runner, reference_store.open_store())
    return shared


def compute_references(model, specs, _watch):
    """A job: both kinds of reference of ``specs``, computed (and stored) in the worker."""
    requests = make_requests(specs)
    for batch_invariant in (False, True):
        model.reference_for(batch_invariant).outputs(requests)


@TWO_CPUS
def test_the_page_counts_the_references_its_engine_process_stored(tmp_path, monkeypatch):
    """The store's key holds the torch thread count, and the worker has fewer threads than the
    page: given the worker's keys (``PageModel.connect``: its ``model_facts``), the page finds
    what the worker stored, so its queue does not price a reference pass that will not run."""
    monkeypatch.setenv("CBP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CBP_REFERENCE_CACHE", "on")  # the suite keeps it off
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # the page's own, not the worker's
    last = max(os.sched_getaffinity(0))
    worker = ProcessWorker(ModelSpec(model="tiny", load=stored_tiny_shared), cpus=(last,))
    try:
        worker.start()
        page = PageModel.connect(worker)
        page.calibrate()
        worker.run(compute_references, (SPECS,), RunControl(), lambda *a, **k: None)
    finally:
        worker.close()
    requests = make_requests(SPECS)
    assert stored_tiny_shared().reference.missing(requests), "found under the page's own key"
    assert page.reference_for(False).missing(requests) == {}
    assert page.reference_for(True).missing(requests) == {}
    assert page.queue.measured, "the pace timed in the worker"
